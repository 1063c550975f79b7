//! Several processes on one root: tierkv-bench replays that share a root and overlap, and a
//! second process refused a worker that another holds.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::*;
use tierkv::{Store, StoreConfig};

/// The bench binary.
const BENCH: &str = env!("CARGO_BIN_EXE_tierkv-bench");

/// The bench, checking every byte it reads back (`--verify-data`): every test runs it so.
fn bench() -> std::process::Command {
    let mut c = std::process::Command::new(BENCH);
    c.arg("--verify-data");
    c
}

#[test]
fn several_processes_share_a_root_safely() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let full = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/mooncake_synthetic_trace.jsonl"
    ))
    .unwrap();
    std::fs::write(
        &trace,
        full.lines().take(250).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let root = dir.path().join("root");
    // Three workers (ranks) in three processes, replaying at once: reads of every hit prefix
    // (verified on every read), puts and evictions under a bound of 300 blocks each.
    let children: Vec<_> = ["rank0", "rank1", "rank2"]
        .iter()
        .zip(["lru", "arc", "admit2"])
        .map(|(w, policy)| {
            bench()
                .args([
                    "--rw",
                    "replay",
                    "--bs",
                    "8k",
                    "--capacity-blocks",
                    "300",
                    "--verify",
                    "always",
                ])
                .args(["--worker", w, "--policy", policy, "--output-format", "json"])
                .arg("--trace")
                .arg(&trace)
                .arg("--dir")
                .arg(&root)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Every child was started before any is waited for.
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut spans = Vec::new();
    for (w, out) in ["rank0", "rank1", "rank2"].iter().zip(outs) {
        assert!(
            out.status.success(),
            "{w}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        spans.push((
            r["started_unix_ms"].as_u64().unwrap(),
            r["ended_unix_ms"].as_u64().unwrap(),
        ));
        assert_eq!(r["errors"], 0, "{w}");
        assert_eq!(r["verify_errors"], 0, "{w}");
        assert_eq!(
            r["read_misses"], 0,
            "{w}: a block present by the index failed to read"
        );
        assert_eq!(r["store"]["corrupt"], 0, "{w}");
        assert!(r["hits"].as_u64().unwrap() > 0, "{w}");
        // lru and arc evict; admit2 declines most blocks of this short trace instead.
        let churn = r["evictions"].as_u64().unwrap() + r["not_admitted"].as_u64().unwrap();
        assert!(churn > 0, "{w}");
        let wdir = root.join("v1").join(w);
        assert!(check_all_blocks(&wdir) <= 300, "{w}: bound held");
        assert!(temp_files_under(&wdir).is_empty());
    }
    // They ran at the same time: the last to start started before the first to end ended.
    let last_start = spans.iter().map(|s| s.0).max().unwrap();
    let first_end = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        last_start < first_end,
        "the three replays did not overlap: {spans:?}"
    );
}

#[test]
fn a_second_process_opening_the_same_worker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A writer that keeps the worker open until killed.
    let child = bench()
        .args([
            "--rw",
            "write",
            "--bs",
            "4k",
            "--nblocks",
            "8",
            "--loops",
            "100000000",
        ])
        .args(["--worker", "w"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    // Until its .lock names it.
    let lock = dir.path().join("v1/w/.lock");
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&lock).map_or(true, |s| !s.starts_with(&format!("pid={pid}\n"))) {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "the writer never locked"
        );
        assert!(child.0.try_wait().unwrap().is_none(), "the writer exited");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    match Store::open(dir.path(), worker("w"), StoreConfig::default()) {
        Err(tierkv::Error::WorkerBusy { holder, .. }) => {
            assert!(holder.contains(&pid.to_string()), "{holder}")
        }
        Ok(_) => panic!("a second opener of a held worker got a store"),
        Err(e) => panic!("a second opener of a held worker: {e}"),
    }
    // A second process too.
    let out = bench()
        .args([
            "--rw",
            "read",
            "--bs",
            "4k",
            "--nblocks",
            "8",
            "--worker",
            "w",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&pid.to_string()), "{err}");
    // Another worker of the same root opens while it is held.
    Store::open(dir.path(), worker("other"), StoreConfig::default()).unwrap();
    drop(child);
}
