"""The store reads and writes the caller's memory in place, and refuses buffers it cannot."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import tierkv_g3

MiB = 1 << 20


def test_get_many_into_fills_the_callers_arrays_in_place(store):
    k = tierkv_g3.chain_hashes(list(range(16 * 8)), 16)
    store.put_many(k, [np.full(2 * MiB, i + 1, np.uint8) for i in range(8)])
    # Preallocated pages, as an engine's KV pool: one array, each block a row of it.
    pool = np.zeros((8, 2 * MiB), np.uint8)
    rows = list(pool)
    addresses = [r.__array_interface__["data"][0] for r in rows]
    base = pool.__array_interface__["data"][0]
    assert store.get_many_into(k, rows) == [2 * MiB] * 8
    # The same memory, now holding the blocks: nothing was allocated and copied back.
    assert [r.__array_interface__["data"][0] for r in rows] == addresses
    assert pool.__array_interface__["data"][0] == base
    assert all((pool[i] == i + 1).all() for i in range(8))
    # A memoryview of a bytearray is filled in place too.
    ba = bytearray(2 * MiB)
    assert store.get_many_into(k[3:4], [memoryview(ba)]) == [2 * MiB]
    assert ba[0] == 4 and ba[-1] == 4


def test_batches_allocate_no_python_copy_of_the_data(store):
    k = tierkv_g3.chain_hashes(list(range(16 * 16)), 16)
    blocks = [np.full(2 * MiB, i, np.uint8) for i in range(16)]  # 32 MiB
    out = [np.empty(2 * MiB, np.uint8) for _ in range(16)]
    tracemalloc.start()
    try:
        store.put_many(k, blocks)
        store.get_many_into(k, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 32 MiB moved each way; a copy through Python objects would show here.
    assert peak < 256 * 1024, peak
    assert all((o == i).all() for i, o in enumerate(out))


def test_read_only_buffers_are_refused_for_gets(store):
    k = tierkv_g3.chain_hashes(list(range(16)), 16)
    store.put_many(k, [b"abcd"])
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    for buf in [b"\0" * 4, memoryview(bytearray(4)).toreadonly(), ro]:
        with pytest.raises(TypeError, match=r"buffers\[0\]: .* is read-only"):
            store.get_many_into(k, [buf])
    assert (ro == 0).all()


def test_non_contiguous_buffers_are_refused(store):
    k = tierkv_g3.chain_hashes(list(range(32)), 16)
    a = np.zeros((4, 4096), np.uint8)
    for bad in [a[:, ::2], a.T[::2], a[::-1]]:
        with pytest.raises(ValueError, match=r"buffers\[1\]: ndarray is not contiguous"):
            store.get_many_into(k, [np.zeros(8), bad])
        with pytest.raises(ValueError, match="not contiguous"):
            store.put_many(k, [b"x", bad])
    assert store.contains_many(k) == [False, False], "nothing was written"


def test_destinations_sharing_memory_are_refused(store):
    k = tierkv_g3.chain_hashes(list(range(48)), 16)
    store.put_many(k, [b"x" * 10] * 3)
    pool = bytearray(100)
    m = memoryview(pool)
    with pytest.raises(ValueError, match=r"buffers\[0\] and buffers\[2\] share memory"):
        store.get_many_into(k, [m[0:20], m[40:60], m[10:30]])
    # Adjacent slices of one pool are fine (an engine's page pool).
    assert store.get_many_into(k, [m[0:20], m[20:40], m[40:60]]) == [10, 10, 10]


def test_aligned_array_starts_on_a_page_and_is_filled_in_place(store):
    k = tierkv_g3.chain_hashes(list(range(32)), 16)
    store.put_many(k, [np.arange(1024, dtype=np.float32), np.ones(1024, np.float32)])
    pool = tierkv_g3.aligned_array((2, 1024), np.float32)
    assert pool.ctypes.data % 4096 == 0 and pool.flags.c_contiguous and pool.flags.writeable
    assert pool.shape == (2, 1024) and pool.dtype == np.float32 and not pool.any()
    assert tierkv_g3.aligned_array(10, align=64).ctypes.data % 64 == 0
    assert store.get_many_into(k, list(pool)) == [4096, 4096]
    assert (pool[0] == np.arange(1024)).all() and (pool[1] == 1).all()
