"""The GIL is released during I/O: another Python thread runs while a batch is in progress,
and batches of several threads overlap; the asyncio methods never block the event loop.

No timing assertion: with the switch interval set far beyond the test's length, a thread
that holds the GIL keeps it until it blocks, so any progress of another thread *during* a
call proves the call released the GIL (a call that kept it would leave the counter
unchanged, every time). Speed-up figures are in docs/python.md (benchmark)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

import tierkv_g3

MiB = 1 << 20
N = 16  # blocks of 2 MiB per batch: tens of milliseconds of copying


@contextmanager
def gil_held_until_blocking():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


@pytest.fixture
def filled(store):
    k = tierkv_g3.chain_hashes(list(range(16 * N)), 16)
    store.put_many(k, [np.full(2 * MiB, i, np.uint8) for i in range(N)])
    return store, k, [np.empty(2 * MiB, np.uint8) for _ in range(N)]


def progress_during(call, tries=100):
    """Runs `call` up to `tries` times while a ticker thread counts; returns how far the
    ticker got during the first call in which it moved (0: it never did)."""
    count = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.0001)  # releases the GIL between ticks

    with gil_held_until_blocking():
        t = threading.Thread(target=tick)
        t.start()
        try:
            for _ in range(tries):
                before = count[0]
                call()
                moved = count[0] - before
                if moved:
                    return moved
            return 0
        finally:
            stop.set()
            t.join()


def test_get_many_into_releases_the_gil(filled):
    store, k, bufs = filled
    assert progress_during(lambda: store.get_many_into(k, bufs)) > 0


def test_put_many_releases_the_gil(filled):
    store, k, bufs = filled
    assert progress_during(lambda: store.put_many(k, bufs)) > 0


def test_the_probe_sees_a_call_that_keeps_the_gil():
    # The same probe around a C call that holds the GIL throughout: no progress, ever.
    big = list(range(2_000_000))
    assert progress_during(lambda: sorted(big, reverse=True), tries=5) == 0


def test_gets_of_several_threads_overlap(filled):
    store, k, _ = filled
    intervals = []
    lock = threading.Lock()

    def worker():
        bufs = [np.empty(2 * MiB, np.uint8) for _ in range(N)]
        for _ in range(5):
            t0 = time.perf_counter()
            assert store.get_many_into(k, bufs) == [2 * MiB] * N
            t1 = time.perf_counter()
            with lock:
                intervals.append((t0, t1, threading.get_ident()))

    with gil_held_until_blocking():
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    overlaps = sum(
        1
        for a in intervals
        for b in intervals
        if a[2] < b[2] and a[0] < b[1] and b[0] < a[1]
    )
    assert len(intervals) == 20
    assert overlaps > 0, "no two threads' gets were ever in progress at once"


def test_async_get_never_blocks_the_event_loop(filled):
    store, k, bufs = filled

    async def main():
        ticks = 0
        stop = False

        async def heartbeat():
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        hb = asyncio.ensure_future(heartbeat())
        moved = 0
        for _ in range(100):
            before = ticks
            r = await store.get_many_into_async(k, bufs)
            assert r == [2 * MiB] * N
            moved = ticks - before
            if moved:
                break
        await store.put_many_async(k[:1], bufs[:1])
        assert await store.contains_prefix_async(k) == N
        await store.offer_many_async(k[1:2], bufs[1:2], parent=k[0])
        stop = True
        await hb
        return moved

    # An await that ran the batch on the loop's thread would let no heartbeat in.
    assert asyncio.run(main()) > 0
    assert all((b == i).all() for i, b in enumerate(bufs))
