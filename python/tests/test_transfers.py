"""tierkv_g3.Transfers, the engine API for Python engines: a paged KV memory described once,
loads and saves of whole batches by block index, one outcome per block, the memory kept
alive until close()."""

from __future__ import annotations

import os
import select

import numpy as np
import pytest

import tierkv_g3

BLOCKS, K, V = 8, 96, 64


def pool():
    """A KV memory shaped as an engine's: all blocks' K regions, then all blocks' V regions."""
    mem = np.zeros(BLOCKS * (K + V), np.uint8)
    regions = [(0, K, K), (BLOCKS * K, V, V)]
    return mem, regions


def block(mem, b):
    return np.concatenate([mem[b * K : (b + 1) * K], mem[BLOCKS * K + b * V :][:V]])


def fill(mem, b, seed):
    mem[b * K : (b + 1) * K] = (np.arange(K) + seed) % 256
    mem[BLOCKS * K + b * V :][:V] = (np.arange(V) * 3 + seed) % 256


def wait_for(t, tid):
    for _ in range(100):
        for done in t.wait(10.0):
            if done[0] == tid:
                return done
    raise AssertionError(f"transfer {tid} never completed")


def test_saves_and_loads_move_whole_blocks_with_one_outcome_per_block(tmp_path):
    keys = tierkv_g3.chain_hashes(list(range(16)), 4)
    mem, regions = pool()
    for b in range(3):
        fill(mem, b, 10 * b + 1)
    want = [block(mem, b).copy() for b in range(3)]
    with tierkv_g3.Store(tmp_path, "w") as store, tierkv_g3.Transfers(store, mem, regions, BLOCKS) as t:
        assert (t.blocks, t.block_bytes) == (BLOCKS, K + V)
        tid = t.submit_save(keys[:3], [0, 1, 2])
        assert wait_for(t, tid) == (tid, "save", ["written"] * 3, [])
        tid = t.submit_save(keys[:3], [0, 1, 2])
        assert wait_for(t, tid)[2] == ["present"] * 3
        # Hung from a key that is not stored: nothing stored.
        tid = t.submit_save(keys[3:4], [3], parent=tierkv_g3.chain_hashes(list(range(99, 103)), 4)[0])
        assert wait_for(t, tid)[2] == ["not_admitted"]
        tid = t.submit_load(keys, [4, 5, 6, 7])
        assert wait_for(t, tid)[1:3] == ("load", ["loaded", "loaded", "loaded", "missing"])
        assert store.stats()["puts"] == 3
    for i, w in enumerate(want):
        assert (block(mem, 4 + i) == w).all()
    assert not block(mem, 7).any()


def test_a_batch_naming_a_block_twice_or_outside_fails_whole_with_its_reason(tmp_path):
    keys = tierkv_g3.chain_hashes(list(range(8)), 4)
    mem, regions = pool()
    with tierkv_g3.Store(tmp_path, "w") as store, tierkv_g3.Transfers(store, mem, regions, BLOCKS) as t:
        twice = t.submit_save(keys, [1, 1])
        outside = t.submit_load(keys, [0, BLOCKS])
        done = {d[0]: d for d in t.wait(10.0) + t.wait(10.0)}
        assert done[twice][2] == ["failed", "failed"] and "twice" in done[twice][3][0][1]
        assert done[outside][2] == ["failed", "failed"] and "outside" in done[outside][3][0][1]


def test_the_eventfd_wakes_a_poller_and_close_finishes_what_was_submitted(tmp_path):
    keys = tierkv_g3.chain_hashes(list(range(8)), 4)
    mem, regions = pool()
    fill(mem, 0, 5)
    fill(mem, 1, 6)
    store = tierkv_g3.Store(tmp_path, "w")
    t = tierkv_g3.Transfers(store, mem, regions, BLOCKS)
    fd = t.event_fd()
    tid = t.submit_save(keys, [0, 1])
    assert select.select([fd], [], [], 10.0)[0] == [fd]
    assert [d[0] for d in t.drain()] == [tid]
    tid = t.submit_save(keys, [0, 1])
    left = t.close()  # runs what was submitted; what was not collected comes back
    assert [d[0] for d in left] == [tid]
    with pytest.raises(tierkv_g3.ClosedError):
        t.submit_load(keys, [2, 3])
    assert t.close() == []
    store.close()


def test_a_memory_whose_blocks_would_overlap_or_pass_its_end_is_refused(tmp_path):
    mem, _ = pool()
    with tierkv_g3.Store(tmp_path, "w") as store:
        for regions, why in (([(0, 100, 50)], "shorter"), ([(0, K, K), (K, V, V)], "overlap")):
            with pytest.raises(ValueError, match=why):
                tierkv_g3.Transfers(store, mem, regions, BLOCKS)
        with pytest.raises(ValueError, match="passes the end"):
            tierkv_g3.Transfers(store, mem, [(0, K, K)], BLOCKS * 2)
        with pytest.raises(TypeError):
            tierkv_g3.Transfers(store, bytes(len(mem)), [(0, K, K)], BLOCKS)
    assert os.path.isdir(tmp_path)
