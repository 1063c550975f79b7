//! README.md states each guarantee in one line, linking to docs/guarantees.md, which states it
//! in full with the tests that show it. Here: every test docs/guarantees.md (or README) names
//! exists (`file::test` is a `fn test` in `tests/file.rs` or `tools/tests/file.rs`,
//! `file::prefix_*` matches at least one test there, `python/tests/f.py::t` a `def t` there),
//! and README's guarantees and the page's sections are the same list, so a renamed test or a dropped guarantee fails here
//! instead of pointing at nothing.

use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).expect(rel)
}

/// docs/guarantees.md: every guarantee in full.
fn guarantees() -> String {
    read("docs/guarantees.md")
}

/// README's guarantees section.
fn readme_guarantees() -> String {
    let readme = read("README.md");
    let start = readme
        .find("## What it guarantees")
        .expect("a guarantees section");
    let rest = &readme[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i);
    rest[..end].to_string()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn readme_lists_every_guarantee_of_the_page_and_links_each() {
    let page = guarantees();
    let sections: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    assert!(sections.len() >= 15, "too few guarantees: {sections:?}");
    let readme = readme_guarantees();
    let links: Vec<String> = readme
        .split("](docs/guarantees.md#")
        .skip(1)
        .map(|s| s.split(')').next().unwrap_or("").to_string())
        .collect();
    let lines = readme.lines().filter(|l| l.starts_with("- ")).count();
    assert_eq!(lines, links.len(), "a README guarantee without its link");
    assert_eq!(
        links, sections,
        "README's guarantees and the page's sections differ"
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor("`tierkv-stat --repair` removes only what it judged bad"),
        "tierkv-stat---repair-removes-only-what-it-judged-bad"
    );
    assert_eq!(anchor("The engine's thread"), "the-engines-thread");
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for (file, name) in &refs {
        // The library's tests are in tests/, those that run the tools in tools/tests/.
        let src = ["tests", "tools/tests"]
            .iter()
            .find_map(|dir| std::fs::read_to_string(root.join(dir).join(format!("{file}.rs"))).ok())
            .unwrap_or_else(|| {
                panic!("docs/guarantees.md names {file}.rs, in neither tests/ nor tools/tests/")
            });
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
        "docs/guarantees.md names tests that do not exist: {missing:?}"
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

/// Every Python test README or docs/guarantees.md names (`python/tests/<file>.py::<test>`)
/// is a `def <test>` there.
#[test]
fn every_python_test_the_readme_names_exists() {
    let readme = read("README.md") + &guarantees();
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
