//! `tools/gen-trace.py` writes valid traces in the shared trace's format, the same bytes for the
//! same shape and seed (docs/eviction.md's figures depend on it), other bytes for another seed.

use std::process::Command;

fn generate(shape: &str, seed: u32) -> String {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/gen-trace.py"))
        .args([shape, "--seed", &seed.to_string(), "--requests", "300"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `hash_ids` of each request, checking that `input_length` is 512 tokens a block.
fn parse(trace: &str) -> Vec<Vec<u64>> {
    trace
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["hash_ids"].as_array().unwrap();
            assert_eq!(v["input_length"].as_u64().unwrap(), 512 * ids.len() as u64);
            ids.iter().map(|x| x.as_u64().unwrap()).collect()
        })
        .collect()
}

#[test]
fn generated_traces_are_valid_and_reproducible() {
    for shape in ["conversation", "agent", "documents", "scan", "chat"] {
        let a = generate(shape, 1);
        assert_eq!(a, generate(shape, 1), "{shape}: not reproducible");
        assert_ne!(a, generate(shape, 2), "{shape}: the seed changes nothing");
        let reqs = parse(&a);
        assert_eq!(reqs.len(), 300, "{shape}");
        // Equal ids are equal blocks of a chain: an id is always preceded by the same id.
        let mut parent = std::collections::HashMap::new();
        for r in &reqs {
            for (i, id) in r.iter().enumerate() {
                let p = i.checked_sub(1).map(|j| r[j]);
                assert_eq!(
                    *parent.entry(*id).or_insert(p),
                    p,
                    "{shape}: id {id} in two chains"
                );
            }
        }
    }
}

#[test]
fn conversations_extend_their_previous_turn() {
    let reqs = parse(&generate("conversation", 1));
    // Some request is a strict extension of an earlier one (a later turn).
    let extended = reqs.iter().enumerate().filter(|(i, r)| {
        reqs[..*i]
            .iter()
            .any(|e| e.len() < r.len() && r.starts_with(e))
    });
    assert!(extended.count() > 100);
}
