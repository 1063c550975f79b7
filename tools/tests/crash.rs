//! Crash safety: a writer killed with SIGKILL mid-put, again and again, never leaves a short or
//! corrupt file under a block's final name, and its temp files are swept when a store opens.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tierkv::{Lookup, Store, StoreConfig};

const BENCH: &str = env!("CARGO_BIN_EXE_tierkv-bench");

/// The bench, checking every byte it reads back (`--verify-data`): every test runs it so.
fn bench() -> std::process::Command {
    let mut c = std::process::Command::new(BENCH);
    c.arg("--verify-data");
    c
}

#[test]
fn sigkill_mid_put_never_exposes_a_torn_block_tmpfile() {
    sigkill_loop("tmpfile", &[]);
}

#[test]
fn sigkill_mid_put_never_exposes_a_torn_block_rename() {
    sigkill_loop("rename", &[]);
}

/// A full store that reuses every file it evicts (every put of the loop evicts one): a kill
/// between a victim's rename and its new block's publication leaves a temp file, never a
/// block name on a file of mixed bytes.
#[test]
fn sigkill_mid_put_never_exposes_a_torn_block_reusing_evicted_files() {
    sigkill_loop("rename", &["--capacity-blocks", "20", "--reuse-evicted"]);
}

/// Files named like blocks under `wdir`, valid or not (0 while it does not exist yet).
fn count_blocks(wdir: &std::path::Path) -> usize {
    if !wdir.exists() {
        return 0;
    }
    let t = oracle::read_tree(wdir);
    t.blocks.len() + t.bad_blocks.len() + t.misplaced.len()
}

fn sigkill_loop(publish: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng_state = 0x9E37_79B9_7F4A_7C15u64;
    let mut saw_temp = 0;
    for round in 0..10 {
        // Overwrite 40 blocks of 256 KiB in a loop until killed.
        let child = bench()
            .args([
                "--rw",
                "write",
                "--bs",
                "256KiB",
                "--nblocks",
                "40",
                "--loops",
                "1000000",
                "--batch",
                "4",
            ])
            .args(["--publish", publish])
            .args(extra)
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let child = &mut child.0;
        // Every round kills a writer that is writing: wait for its first block file, then a
        // random while longer.
        let wdir = dir.path().join("v1").join("0");
        let started = std::time::Instant::now();
        while count_blocks(&wdir) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "round {round}: the writer wrote no block in 60 s"
            );
            if let Some(status) = child.try_wait().unwrap() {
                panic!("round {round}: the writer exited ({status}) before writing");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        std::thread::sleep(Duration::from_millis(20 + rng_state % 120));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "round {round}: the writer finished before it was killed"
        );

        // Before any store sweeps: every file under a final name is whole and verifies.
        check_all_blocks(&wdir);
        saw_temp += temp_files_under(&wdir).len();
    }
    // A kill lands mid-put: with named temp files (rename), some round leaves one. (With
    // O_TMPFILE a temp name exists only while a replacing link is renamed, so none may be seen.)
    if publish == "rename" {
        assert!(
            saw_temp > 0,
            "{publish}: 10 kills mid-put left no temp file"
        );
    }
    // Opening a store sweeps what the last writer left; every block that hits verifies.
    let wdir = dir.path().join("v1").join("0");
    let left = temp_files_under(&wdir).len();
    let store = Store::open(dir.path(), worker("0"), StoreConfig::default()).unwrap();
    assert_eq!(store.stats().temp_swept as usize, left);
    assert!(temp_files_under(store.dir()).is_empty());
    let blocks = check_all_blocks(store.dir());
    assert!(blocks > 0);
    let mut hits = 0;
    let mut b = vec![0u8; 256 * 1024];
    for f in common::files_under(store.dir()) {
        if let Ok(h) = tierkv::BlockHash::from_hex(f.file_name().unwrap().to_str().unwrap()) {
            assert_eq!(
                store.get(&store.key(h), &mut b).unwrap(),
                Lookup::Hit(256 * 1024)
            );
            hits += 1;
        }
    }
    assert_eq!(hits, blocks);
    assert_eq!(store.stats().corrupt, 0);
    eprintln!(
        "{publish}: 10 kills: {saw_temp} temp files seen between kills, {left} swept at the end, {blocks} blocks verified"
    );
}
