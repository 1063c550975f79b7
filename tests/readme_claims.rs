//! Every test that README.md's guarantees name exists: `file::test` is a `fn test` in
//! `tests/file.rs`, and `file::prefix_*` matches at least one test there. A guarantee whose
//! test was renamed or deleted fails here instead of pointing at nothing.

use std::path::Path;

fn guarantees() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let start = readme
        .find("## What it guarantees")
        .expect("a guarantees section");
    let rest = &readme[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i);
    rest[..end].to_string()
}

/// The `file::name` references in backticks.
fn references(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for span in text.split('`').skip(1).step_by(2) {
        let Some((file, name)) = span.split_once("::") else {
            continue;
        };
        let ident = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '*')
        };
        if ident(file) && ident(name) && !file.contains('*') {
            out.push((file.to_string(), name.to_string()));
        }
    }
    out
}

#[test]
fn every_test_the_guarantees_name_exists() {
    let refs = references(&guarantees());
    assert!(refs.len() >= 20, "too few references found: {refs:?}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut missing = Vec::new();
    for (file, name) in &refs {
        let src = std::fs::read_to_string(dir.join(format!("{file}.rs")))
            .unwrap_or_else(|_| panic!("README names tests/{file}.rs, which does not exist"));
        let found = match name.strip_suffix('*') {
            Some(prefix) => src.contains(&format!("fn {prefix}")),
            None => src.contains(&format!("fn {name}()")) || src.contains(&format!("fn {name}(")),
        };
        if !found {
            missing.push(format!("{file}::{name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "README names tests that do not exist: {missing:?}"
    );
}

#[test]
fn the_reference_parser_finds_what_it_should() {
    let r = references("a `x::y_z` b `not a ref` c `hostile::item01_*` d `Store::open`");
    assert_eq!(
        r,
        vec![
            ("x".to_string(), "y_z".to_string()),
            ("hostile".to_string(), "item01_*".to_string())
        ]
    );
}

/// Every Python test README names (`python/tests/<file>.py::<test>`) is a `def <test>` there.
#[test]
fn every_python_test_the_readme_names_exists() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let refs: Vec<(&str, &str)> = readme
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| span.strip_prefix("python/tests/")?.split_once(".py::"))
        .collect();
    assert!(refs.len() >= 5, "too few Python references found: {refs:?}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests");
    let missing: Vec<String> = refs
        .iter()
        .filter(|(file, name)| {
            let src =
                std::fs::read_to_string(dir.join(format!("{file}.py"))).unwrap_or_else(|_| {
                    panic!("README names python/tests/{file}.py, which does not exist")
                });
            !src.contains(&format!("def {name}("))
        })
        .map(|(file, name)| format!("{file}::{name}"))
        .collect();
    assert!(
        missing.is_empty(),
        "README names Python tests that do not exist: {missing:?}"
    );
}
