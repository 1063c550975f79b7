//! First contact: the checks a newcomer's first commands rely on.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `tools/has-libclang.sh` on `listing` (as `ldconfig -p` prints it); true when the
/// script says libclang is present (exit 0).
fn has_libclang(listing: &str) -> bool {
    let mut child = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tools/has-libclang.sh"
        ))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(listing.as_bytes())
        .unwrap();
    let status = child.wait().unwrap();
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("has-libclang.sh exited {other:?}"),
    }
}

const HEAD: &str = "1234 libs found in cache `/etc/ld.so.cache'\n\
    \tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n";

#[test]
fn libclang_cpp_alone_is_not_libclang() {
    let listing = format!(
        "{HEAD}\tlibclang-cpp.so.14 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-cpp.so.14\n"
    );
    assert!(
        !has_libclang(&listing),
        "libclang-cpp is not what clang-sys loads"
    );
}

#[test]
fn libclang_is_found_by_either_name() {
    for lib in [
        "libclang-14.so.1",
        "libclang.so.1",
        "libclang-18.so",
        "libclang.so",
    ] {
        let listing = format!(
            "{HEAD}\tlibclang-cpp.so.14 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-cpp.so.14\n\
             \t{lib} (libc6,x86-64) => /lib/x86_64-linux-gnu/{lib}\n"
        );
        assert!(has_libclang(&listing), "{lib}");
    }
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{rel}")).unwrap()
}

/// README's library example is examples/readme.rs (which tools/test.sh runs), word for word.
#[test]
fn readme_shows_the_example_that_runs() {
    let example = read("examples/readme.rs");
    let body = example
        .split_once("    // README begin\n")
        .and_then(|(_, rest)| rest.split_once("    // README end\n"))
        .map(|(body, _)| body)
        .expect("README begin/end markers in examples/readme.rs");
    let dedented: String = body
        .lines()
        .flat_map(|l| [l.strip_prefix("    ").unwrap_or(l), "\n"])
        .collect();
    let readme = read("README.md");
    let shown = readme
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(code, _)| code)
        .expect("a rust block in README.md");
    assert_eq!(
        shown, dedented,
        "README's example differs from examples/readme.rs"
    );
    assert!(read("tools/test.sh").contains("cargo run -q --example readme"));
}

/// README's first screen: the commands run and install the tools (no feature flag), and name
/// both tools.
#[test]
fn readme_first_screen_names_the_tools_and_how_to_build_them() {
    let readme = read("README.md");
    let first: Vec<&str> = readme.lines().take(15).collect();
    let first = first.join("\n");
    assert!(
        first.contains("cargo run --release --bin tierkv-bench "),
        "{first}"
    );
    assert!(first.contains("./tools/test.sh"), "{first}");
    assert!(first.contains("`tierkv-bench`"), "{first}");
    assert!(first.contains("`tierkv-stat"), "{first}");
    assert!(first.contains("cargo install --path tools"), "{first}");
    // No command in the README or the docs still asks for the old `tools` feature.
    for doc in [
        "README.md",
        "docs/benchmarks.md",
        "docs/stat.md",
        "docs/engine-api.md",
    ] {
        assert!(!read(doc).contains("--features tools"), "{doc}");
    }
}

/// The tools are a crate of their own (tools/Cargo.toml), so the library's dependencies stay
/// lean: none of the tools' (clap, hdrhistogram, indicatif, ...) is the library's.
#[test]
fn the_library_does_not_depend_on_the_tools_crates() {
    let manifest = read("Cargo.toml");
    let deps = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("Cargo.toml has [dependencies]");
    for tool_dep in [
        "clap",
        "hdrhistogram",
        "indicatif",
        "ctrlc",
        "tracing-subscriber",
    ] {
        assert!(
            !deps.lines().any(|l| l.starts_with(&format!("{tool_dep} "))),
            "the library depends on {tool_dep}"
        );
    }
    let tools = read("tools/Cargo.toml");
    assert!(
        tools.contains("name = \"tierkv-bench\""),
        "tools/Cargo.toml"
    );
    assert!(tools.contains("name = \"tierkv-stat\""), "tools/Cargo.toml");
}

/// A library user gets the library: no default features.
#[test]
fn the_library_has_no_default_features() {
    let manifest = read("Cargo.toml");
    assert!(
        manifest.contains("\ndefault = []\n"),
        "Cargo.toml's default features"
    );
}

/// The scripts find the binaries where cargo puts them (CARGO_TARGET_DIR honoured), through
/// tools/bench-common.sh's `target_dir`, and none hard-codes `target/`.
#[test]
fn scripts_honour_cargo_target_dir() {
    let custom = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .args(["-c", ". tools/bench-common.sh && target_dir"])
        .current_dir(ROOT)
        .env("CARGO_TARGET_DIR", custom.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        custom.path().to_str().unwrap()
    );
    for e in std::fs::read_dir(format!("{ROOT}/tools")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "sh" || x == "py") {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(
                !text.contains("target/release"),
                "{} hard-codes target/",
                p.display()
            );
            // The scripts' statistics live in tools/benchstats.py (unit-tested), not in
            // inline snippets that each script writes its own way.
            assert!(
                !text.contains("python3 -c") && !text.contains("python3 - <<"),
                "{} has an inline Python snippet: use tools/benchstats.py",
                p.display()
            );
        }
    }
}
