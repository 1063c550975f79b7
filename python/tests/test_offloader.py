"""tierkv_g3.Offloader, the write-behind offloader's Python face (src/offload): an offer
returns at once while the writer is stalled in the disk, each block's parts are written as
one payload straight from the caller's buffers, and each block's release is called once,
after its block is written or dropped (the engine's notice that the buffers may be reused).

The writer is stalled for real: the shared tree's usage-ledger lock is held by another open
file (as a hung writer on the tree would hold it), so every put waits in its reservation."""

from __future__ import annotations

import threading
import time

import ledger
import numpy as np

import tierkv_g3

LEN = 8192


def payload(i: int) -> np.ndarray:
    return (np.arange(LEN, dtype=np.uint32) * (i + 7)).astype(np.uint8)


class Releases:
    """Release callables that record when (and on which thread) each block was let go, and
    whether the store held the block then."""

    def __init__(self, store, keys):
        self.store, self.keys, self.calls = store, keys, []
        self.lock = threading.Lock()

    def of(self, i):
        def release():
            held = self.store.contains_many([self.keys[i]])[0]
            with self.lock:
                self.calls.append((i, held, threading.get_ident()))

        return release


def test_an_offer_returns_while_the_disk_is_stalled_and_releases_after_the_write(tmp_path):
    with tierkv_g3.Store(str(tmp_path), "w", sharing="shared", stats_interval=None) as store:
        off = tierkv_g3.Offloader(store)
        keys = tierkv_g3.chain_hashes(list(range(3 * 16)), 16)
        rel = Releases(store, keys)
        data = [payload(i) for i in range(3)]
        with ledger.held(store.dir):
            t0 = time.monotonic()
            got = off.offer(
                keys, [[d[:100], d[100:]] for d in data], releases=[rel.of(i) for i in range(3)]
            )
            assert time.monotonic() - t0 < 1.0  # the ledger wait is 10 s
            assert got == {"queued": 3, "deduped": 0, "dropped": 0}
            time.sleep(0.3)
            assert all(off.is_queued(k) for k in keys)
            assert store.contains_many(keys) == [False] * 3 and rel.calls == []
        off.flush()
        # Each block released once, from the writer's thread, after it was stored whole.
        assert sorted((i, held) for i, held, _ in rel.calls) == [(0, True), (1, True), (2, True)]
        assert {t for _, _, t in rel.calls} != {threading.get_ident()}
        bufs = [np.zeros(LEN, np.uint8) for _ in keys]
        assert store.get_many_into(keys, bufs) == [LEN] * 3
        assert all((b == d).all() for b, d in zip(bufs, data))
        off.close()


def test_a_full_queue_drops_the_newest_and_releases_them_at_once(tmp_path):
    with tierkv_g3.Store(str(tmp_path), "w", sharing="shared", stats_interval=None) as store:
        off = tierkv_g3.Offloader(store, max_bytes=2 * LEN)
        keys = tierkv_g3.chain_hashes(list(range(4 * 16)), 16)
        rel = Releases(store, keys)
        with ledger.held(store.dir):
            got = off.offer(keys, [[payload(i)] for i in range(4)], releases=[rel.of(i) for i in range(4)])
            assert got == {"queued": 2, "deduped": 0, "dropped": 2}
            # The dropped two are let go now, while the queued two wait for the disk.
            assert sorted(i for i, _, _ in rel.calls) == [2, 3]
        off.flush()
        assert sorted(i for i, _, _ in rel.calls) == [0, 1, 2, 3]
        assert store.contains_many(keys) == [True, True, False, False]
        # Offered again: the stored ones are not written twice, the rest are.
        again = off.offer(keys, [[payload(i)] for i in range(4)])
        assert again == {"queued": 2, "deduped": 2, "dropped": 0}
        off.flush()
        st = off.stats()
        assert (st["written"], st["dropped_full"], st["deduped_present"]) == (4, 2, 2), st
        off.close()
        assert store.contains_many(keys) == [True] * 4


def test_close_writes_what_is_queued_and_a_closed_offloader_refuses(tmp_path):
    with tierkv_g3.Store(str(tmp_path), "w", stats_interval=None) as store:
        off = tierkv_g3.Offloader(store)
        keys = tierkv_g3.chain_hashes(list(range(2 * 16)), 16)
        off.offer(keys, [[payload(i)] for i in range(2)])
        off.close()
        assert store.contains_many(keys) == [True, True]
        try:
            off.offer(keys, [[payload(0)], [payload(1)]])
        except tierkv_g3.ClosedError:
            pass
        else:
            raise AssertionError("a closed offloader took an offer")
