"""The standalone KV event publisher (`python -m tierkv_g3.kv_events`, docs/events.md): a router
subscribed to it over ZMQ, in vLLM's schema, ends with the tree's contents after stores of two
processes put, evict, remove and find blocks gone, while it drops batches and replays them; a
publisher started late tells what the tree holds; a journal made again is resynced from the
tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import tierkv_g3
from tierkv_g3 import _tierkv, kv_events

sys.path.insert(0, os.path.dirname(__file__))
from kv_events_subscriber import Subscriber  # noqa: E402

BLOCK = b"k" * 4096


def _keys(tag: int, n: int):
    return [bytes([tag, i // 256, i % 256]) + bytes(29) for i in range(n)]


def _tree(root):
    return {k for w in _tierkv.workers(str(root)) for k in _tierkv.tree_blocks(str(root), w)}


def _store(root, worker="w", **kw):
    kw.setdefault("capacity_files", 24)
    return tierkv_g3.Store(root, worker, events=True, sharing="shared", stats_interval=None, **kw)


def _publisher(root, sock, *extra):
    cmd = [sys.executable, "-m", "tierkv_g3.kv_events", str(root), "--endpoint", f"ipc://{sock}.pub",
           "--replay-endpoint", f"ipc://{sock}.replay", "--interval", "0.02", *extra]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE)


def _stop(proc):
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()


def _until(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


OTHER = """
import sys, tierkv_g3
root, n = sys.argv[1], int(sys.argv[2])
with tierkv_g3.Store(root, "w", events=True, sharing="shared", capacity_files=24, stats_interval=None) as s:
    for i in range(0, n, 4):
        s.put_many([bytes([9, 0, j]) + bytes(29) for j in range(i, i + 4)], [b"o" * 4096] * 4)
"""


def test_a_router_subscribed_to_the_publisher_ends_with_the_tree(tmp_path):
    root, sock = tmp_path / "root", tmp_path / "kv"
    with _store(root, "w2", capacity_files=None) as s2:
        early = _keys(1, 8)
        s2.put_many(early, [BLOCK] * len(early))  # before the publisher: told from the tree
    # The router subscribes first; it may still miss the publisher's first batches (a PUB
    # socket drops what it sends before a subscriber is connected): the first batch it gets
    # then shows the gap, and it replays from 0.
    sub = Subscriber(f"ipc://{sock}.pub", f"ipc://{sock}.replay", drop={1, 2})
    pub = _publisher(root, sock)
    try:
        time.sleep(0.5)
        with _store(root) as s, _store(root, "w2", capacity_files=None) as s2:
            for i in range(0, 40, 4):
                s.put_many(_keys(2, 40)[i : i + 4], [BLOCK] * 4)
            s2.put_many(_keys(3, 5), [BLOCK] * 5)
            # A second process puts into the same worker; its evictions are of our blocks too.
            subprocess.run([sys.executable, "-c", OTHER, str(root), "40"], check=True, timeout=120)
            assert s2.discard_many(_keys(3, 2)) == [True, True]
            # A block removed by hand, then found gone by a read.
            mine = [k for k in _tierkv.tree_blocks(str(root), "w") if k[0] == 9]
            os.unlink(s.path_of(mine[0]))
            assert s.get_many_into([mine[0]], [bytearray(len(BLOCK))]) == [None]
            # A router finds a gap at the batch after it: one more block, after all else.
            time.sleep(0.5)
            s2.put_many(_keys(4, 1), [BLOCK])
        tree = _tree(root)
        assert mine[0] not in tree and len(tree) > 3
        assert _until(lambda: sub.storage() == tree), (len(sub.storage()), len(tree))
        assert sub.gaps >= 1 and sub.replayed >= 2, (sub.gaps, sub.replayed)
        assert sub.removed > 0
        # Every event says where the blocks are: this test's tree is on this node's disk.
        assert {e.locality for e in sub.stored_all} == {"LOCAL"}
        assert {e.ownership for e in sub.stored_all} == {"tierkv"}
    finally:
        sub.close()
        _stop(pub)


def test_a_journal_made_again_is_resynced_from_the_tree(tmp_path):
    told = []

    class Collect:
        def publish(self, events):
            told.extend(events)

    with _store(tmp_path) as s:
        s.put_many(_keys(1, 6), [BLOCK] * 6)
    # The listing is the block files, by their names (the layout's, docs/layout.md).
    names = {p.name for p in (tmp_path / "v1").rglob("*") if len(p.name) == 64}
    assert {k.hex() for k in _tree(tmp_path)} == names == {k.hex() for k in _keys(1, 6)}
    tree = kv_events.TreeEvents(tmp_path, Collect(), interval=0.02, rescan=0.0)
    try:
        assert _until(lambda: len(told) == 6)
        assert {e["type"] for e in told} == {"BlockStored"}
        # The journal is removed and the tree changed without it: a new journal (another id)
        # makes the publisher list the tree and tell the difference.
        os.unlink(tmp_path / "v1" / "w" / "EVENTS")
        with tierkv_g3.Store(tmp_path, "w", stats_interval=None) as s:
            s.discard_many(_keys(1, 2))
        with _store(tmp_path) as s:
            s.put_many(_keys(2, 1), [BLOCK])
        assert _until(lambda: tree.told() == _tree(tmp_path)), tree.told()
        assert tree.resyncs == 1
        gone = [e["block_hashes"][0] for e in told if e["type"] == "BlockRemoved"]
        assert sorted(gone) == sorted(_keys(1, 2))
    finally:
        tree.close()


def test_sglang_hashes_are_sglangs_event_hashes_of_the_page_hash():
    page = bytes(range(32))
    # SGLang's hash_str_to_int64: the first 16 hex characters as a signed int64.
    as_sglang = int(page.hex()[:16], 16)
    as_sglang -= (1 << 64) if as_sglang >= 1 << 63 else 0
    assert kv_events.sglang_hash(page) == as_sglang
    high = b"\xff" * 32
    assert kv_events.sglang_hash(high) == -1


def test_locality_is_local_on_this_nodes_disk(tmp_path):
    kind, network = _tierkv.filesystem(str(tmp_path))
    assert not network and kind
    assert kv_events.locality(tmp_path) == "LOCAL"
    with pytest.raises(tierkv_g3.IoError, match="nowhere"):
        _tierkv.filesystem(str(tmp_path / "nowhere"))


def test_a_worker_removed_whole_is_told_removed_and_a_broken_one_does_not_stop_the_rest(tmp_path):
    told = []

    class Collect:
        def publish(self, events):
            told.extend(events)

    for w in ("a", "b"):
        with _store(tmp_path, w) as s:
            s.put_many(_keys(ord(w), 3), [BLOCK] * 3)
    tree = kv_events.TreeEvents(tmp_path, Collect(), interval=0.02, rescan=0.0)
    try:
        assert _until(lambda: len(told) == 6)
        # Worker b's journal unreadable (a directory where the file was): a follows on.
        events_b = tmp_path / "v1" / "b" / "EVENTS"
        os.unlink(events_b)
        os.mkdir(events_b)
        with _store(tmp_path, "a") as s:
            s.discard_many(_keys(ord("a"), 1))
        assert _until(lambda: sum(e["type"] == "BlockRemoved" for e in told) == 1)
        os.rmdir(events_b)
        import shutil

        shutil.rmtree(tmp_path / "v1" / "a")
        assert _until(lambda: tree.told() == set(_keys(ord("b"), 3))), tree.told()
        assert sum(e["type"] == "BlockRemoved" for e in told) == 3
    finally:
        tree.close()
