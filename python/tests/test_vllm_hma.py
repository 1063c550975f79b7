"""The vLLM connector under vLLM's hybrid KV cache manager (HMA), end to end on the CPU: a tiny
random Gemma 3 built here (python/tests/vllm_harness.py, `--window 64`: three sliding-window
layers and one full-attention layer, which vLLM keeps in four KV cache groups), one
long-lived engine per process as a server runs it.

The connector declares `SupportsHMA`, so vLLM keeps its hybrid manager on (without it vLLM
turns HMA off and runs every layer as full attention). Each group's blocks are their own
keys; a hit needs every full-attention block before its end and the window before its end in
every sliding-window group, and loads only those (vLLM keeps no other). A damaged block of
any group is a miss that vLLM recomputes, and no block computed over it is stored. Outputs
are the engine alone's, token for token. tools/test.sh runs this file in .venv-vllm/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import require_engine  # noqa: E402

require_engine("vllm", "vllm", "test_vllm_hma.py")

import tierkv_g3  # noqa: E402
from test_vllm_engine import (  # noqa: E402
    HARNESS,
    check_conversation_turns,
    generations,
    harness,
    serve,
    vllm_prompt,
)
from tierkv_g3.vllm_connector import _group_roots  # noqa: E402

BLOCK = 32
WINDOW = 64  # tokens: a hit loads the two blocks before its end in each sliding-window group
LAYERS = 4  # three sliding-window layers, then one full-attention layer: four KV cache groups
GROUPS = 4
FULL = 3  # the full-attention group
# Per block of one group (one layer): K and V x 1 KV head x tokens x head dim (64) x float32.
BLOCK_BYTES = 2 * BLOCK * 64 * 4


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemma")
    subprocess.run(
        [sys.executable, str(HARNESS), "model", str(d), "--layers", str(LAYERS),
         "--window", str(WINDOW)],
        check=True, timeout=300,
    )
    return d


def group_keys(tokens: list) -> list:
    """Per KV cache group, the chain hashes of `tokens`' full blocks (the connector's roots)."""
    full = tokens[: len(tokens) // BLOCK * BLOCK]
    return [tierkv_g3.chain_hashes(full, BLOCK, root) for root in _group_roots(None, GROUPS)]


def payloads(root: Path, worker: str, keys: list) -> list:
    bufs = [np.zeros(BLOCK_BYTES, np.uint8) for _ in keys]
    with tierkv_g3.Store(str(root), worker, read_only=True) as store:
        assert store.get_many_into(keys, bufs) == [BLOCK_BYTES] * len(keys)
    return [b.view(np.float32) for b in bufs]


def test_a_sliding_window_model_keeps_vllms_hybrid_cache_and_hits_the_tier(model, tmp_path):
    """One engine stores a 400-token prompt's 12 blocks in each of the 4 groups; after its own
    prefix cache is reset, the same prompt loads 384 tokens from the tier: the 12 blocks of
    the full-attention group and the 2 window blocks of each sliding-window group (18), with
    the engine alone's tokens; so does an engine restarted on the tree."""
    p = vllm_prompt(400, seed=5)
    gen = {"op": "generate", "tokens": p, "max_tokens": 16}
    ref = generations(serve(model, tmp_path / "ref", [gen], tmp_path, connector=False))[0]
    assert len(set(ref["tokens"])) > 4, ref["tokens"]
    root = tmp_path / "kv"
    r = serve(model, root, [gen, {"op": "reset"}, gen], tmp_path)
    first, second = generations(r)
    w, s = r["connector"]["worker"], r["connector"]["scheduler"]
    # vLLM kept its hybrid manager: the connector sees four groups, on both sides.
    assert w["groups"] == s["groups"] == GROUPS, (w["groups"], s["groups"])
    assert first["external_hits"] == 0 and first["tokens"] == ref["tokens"]
    assert second["external_hits"] == 384 and second["tokens"] == ref["tokens"], second
    assert w["failures"] == {} and w["saved_blocks"] == 12 * GROUPS
    assert w["loaded_blocks"] == 12 + (GROUPS - 1) * (WINDOW // BLOCK), w["loaded_blocks"]
    restarted = generations(serve(model, root, [gen], tmp_path))[0]
    assert restarted["external_hits"] == 384 and restarted["tokens"] == ref["tokens"]


@pytest.mark.parametrize("group,block", [(0, 5), (FULL, 3)], ids=["window", "full"])
def test_a_damaged_block_of_any_group_never_poisons_later_requests(model, tmp_path, group, block):
    """X's first 193 tokens store blocks 0-5 of every group; one block a load of X reads is
    then damaged (in a sliding-window group, one in the window before block 6; in the
    full-attention group, one before it). A fresh engine runs X (9 full blocks): vLLM
    recomputes the request, and its tokens, and those of X again once every block comes from
    the tier, are the engine alone's; every stored block of X, in every group, is what an
    engine that never met a damaged block stores."""
    x = vllm_prompt(300, seed=7)
    gen = {"op": "generate", "tokens": x, "max_tokens": 16}
    ref = generations(serve(model, tmp_path / "ref", [gen], tmp_path, connector=False))[0]
    root = tmp_path / "kv"
    serve(model, root, [{"op": "generate", "tokens": x[:193], "max_tokens": 1}], tmp_path)
    sys.path.insert(0, str(HARNESS.parent))
    import vllm_harness

    vllm_harness.damage(root, group_keys(x)[group][block], "flip")
    r = serve(model, root, [gen, {"op": "reset"}, gen], tmp_path)
    after_damage, again = generations(r)
    assert after_damage["tokens"] == ref["tokens"]
    assert again["tokens"] == ref["tokens"] and again["external_hits"] == 288, again
    w = r["connector"]["worker"]
    assert w["failed_loads"] == 1 and w["store"]["corrupt"] >= 1, w
    clean = serve(model, tmp_path / "clean", [gen], tmp_path)
    worker = clean["connector"]["worker"]["worker"]
    for g, keys in enumerate(group_keys(x)):
        got, want = payloads(root, worker, keys), payloads(tmp_path / "clean", worker, keys)
        deltas = [float(np.max(np.abs(a - b))) for a, b in zip(got, want)]
        assert max(deltas) < 1e-3, (g, deltas)


def test_every_turn_of_a_conversation_hits_through_the_last_answer(model, tmp_path):
    """In one engine, its prefix cache reset before each turn, turn N+1 loads through turn N's
    answer in every group (the window blocks the answer's last steps filled are stored when
    the request ends); an engine restarted on the tree hits every usable block of every turn;
    the outputs are the engine alone's (the Llama test's checks, on the hybrid model)."""
    check_conversation_turns(model, tmp_path)


def test_a_window_block_reused_while_its_save_is_stalled_is_stored_right(model, tmp_path):
    """Saves stalled for 3 s (the shared tree's ledger lock held by another holder, as a hung
    writer would), three 400-token prompts at once in a KV cache of 100 blocks: vLLM frees each
    request's window blocks as it moves on and allocates them again to the next request while
    their saves wait. The step that reuses one waits for its save first (the connector's
    flush), so every block stored (13 per group per prompt) is what an engine with room to
    spare stores, and the outputs are its own. Without the flush, 72 blocks were stored with
    the next request's bytes."""
    prompts = [vllm_prompt(400, seed=s) for s in (21, 22, 23)]
    batch = {"op": "batch", "prompts": prompts, "max_tokens": 40}
    stalled = [{"op": "hold_ledger", "seconds": 3}, batch] + [{"op": "reset"}] * 5
    f = tmp_path / "stalled.json"
    f.write_text(json.dumps(stalled))
    root = tmp_path / "kv"
    r = harness("serve", str(model), str(root), str(f), "--max-len", "512", "--blocks", "100")
    clean = serve(model, tmp_path / "clean", [batch], tmp_path)
    assert r["steps"][1]["tokens"] == clean["steps"][0]["tokens"]
    w = r["connector"]["worker"]
    assert w["failures"] == {} and w["saved_blocks"] == 3 * 13 * GROUPS, w
    worker = w["worker"]
    for p, out in zip(prompts, r["steps"][1]["tokens"]):
        # Prompt and answer: 440 tokens, 13 full blocks.
        for g, keys in enumerate(group_keys((p + out)[:416])):
            got, want = payloads(root, worker, keys), payloads(tmp_path / "clean", worker, keys)
            deltas = [float(np.max(np.abs(a - b))) for a, b in zip(got, want)]
            assert max(deltas) < 1e-3, (g, deltas)
