//! The end-to-end run with a tiny configuration (CI): request 1 in one process offloads its
//! KV blocks through the write-behind offloader; request 2 in another loads the shared
//! prefix with one `get_many`, rebuilds the KV cache, prefills the rest, and its logits and
//! 32-token greedy continuation match a run without the cache.

use std::process::Command;

/// Why the logits may differ at all: the cached run multiplies matrices of other shapes
/// (the rest of the prompt, not all of it), so f32 sums may be associated otherwise; the KV
/// bytes themselves round-trip exactly (the layout test checks it).
const TOLERANCE: f64 = 1e-4;

fn run(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_engine_e2e"))
        .args([
            "--model",
            "tiny",
            "--prompt-tokens",
            "100",
            "--shared-tokens",
            "70",
            "--output-format",
            "json",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check(v: &serde_json::Value) {
    assert_eq!(v["continuation_identical"], true, "{v:#}");
    assert_eq!(v["request2"]["first_token_identical"], true, "{v:#}");
    let diff = v["logits_max_abs_diff"].as_f64().unwrap();
    assert!(diff <= TOLERANCE, "logits differ by {diff}: {v:#}");
    // 70 shared tokens: 4 full blocks of 16.
    assert_eq!(v["cached_blocks"], 4, "{v:#}");
    assert_eq!(
        v["request2"]["store_hits"], 4,
        "loaded from the store: {v:#}"
    );
    assert_eq!(v["request1"]["blocks_offered"], 6, "{v:#}");
    assert_eq!(v["request1"]["blocks_written"], 6, "{v:#}");
    assert_eq!(v["request1"]["offload"]["written"], 6, "{v:#}");
    assert_eq!(
        v["request2"]["continuation"].as_array().unwrap().len(),
        32,
        "{v:#}"
    );
    for k in ["ttft_cold_ms", "ttft_cached_ms"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v:#}");
    }
}

#[test]
fn request_two_reuses_request_ones_prefix_from_tierkv() {
    let v = run(&[]);
    check(&v);
    assert_eq!(v["layout_version"], 1);
    assert_eq!(v["kv_bytes_per_token"], 2 * 2 * 2 * 16 * 4, "{v:#}");
}

#[test]
fn and_with_the_prefix_read_cold() {
    check(&run(&["--direct", "--invalidate"]));
}
