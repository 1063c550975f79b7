"""Round trips through the Python API: sizes, dtypes, buffer kinds, keys, misses, the batch
calls and the store's life cycle."""

from __future__ import annotations

import numpy as np
import pytest

import tierkv_g3

SIZES = [0, 1, 7, 4095, 4096, 4097, 65536 + 3, 2 << 20, (3 << 20) + 1]
DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.float16, np.float32,
          np.float64, np.int64, np.uint64, np.complex64, np.bool_]


def keys(n, seed=0):
    return tierkv_g3.chain_hashes([seed * 1009 + t for t in range(16 * n)], 16)


@pytest.mark.parametrize("size", SIZES)
def test_sizes_round_trip(store, size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    k = keys(1, SIZES.index(size))
    store.put_many(k, [data])
    out = np.full(size + 100, 0xAA, np.uint8)
    assert store.get_many_into(k, [out]) == [size]
    assert np.array_equal(out[:size], data)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_round_trip(store, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 33)).astype(dtype)
    k = keys(1)
    store.put_many(k, [a])
    out = np.empty_like(a)
    assert store.get_many_into(k, [out]) == [a.nbytes]
    assert np.array_equal(out, a)
    assert out.tobytes() == a.tobytes()


def test_every_buffer_kind_puts_and_gets(store):
    payload = bytes(range(256)) * 33
    k = keys(5)
    arr = np.frombuffer(payload, np.uint8).reshape(33, 256)
    srcs = [payload, bytearray(payload), memoryview(payload), arr, np.asfortranarray(arr)]
    store.put_many(k, srcs)
    dsts = [bytearray(len(payload)), memoryview(bytearray(len(payload))),
            np.empty(len(payload), np.uint8), np.empty((33, 256), np.uint8),
            np.empty((256, 33), np.uint8, order="F")]
    assert store.get_many_into(k, dsts) == [len(payload)] * 5
    for i, d in enumerate(dsts[:4]):
        assert bytes(memoryview(d).cast("B")) == payload, i
    # A Fortran-ordered array is its bytes as they lie in memory.
    assert np.asfortranarray(arr).tobytes(order="A") == dsts[4].tobytes(order="A")


def test_dlpack_objects_are_viewed_through_numpy(store):
    class Tensor:  # a CPU tensor that exports only DLPack, as torch's does
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    src = np.arange(1024, dtype=np.float32)
    k = keys(1)
    store.put_many(k, [Tensor(src)])
    out = np.zeros(1024, np.float32)
    assert store.get_many_into(k, [Tensor(out)]) == [4096]
    assert np.array_equal(out, src)


def test_misses_are_none_never_exceptions(store):
    k = keys(3)
    store.put_many(k[:1], [b"a" * 10])
    bufs = [bytearray(10) for _ in range(3)]
    assert store.get_many_into(k, bufs) == [10, None, None]
    assert store.get_many_into([], []) == []
    store.path_of(k[0]).unlink()  # deleted behind the store's back: a miss
    assert store.get_many_into(k[:1], bufs[:1]) == [None]
    assert store.stats()["misses"] == 3


def test_keys_as_hex_strings_or_32_bytes(store):
    k = keys(2)
    store.put_many([bytes.fromhex(k[0]), k[1]], [b"x", b"y"])
    bufs = [bytearray(1), bytearray(1)]
    assert store.get_many_into([k[0], bytes.fromhex(k[1])], bufs) == [1, 1]
    assert bufs == [bytearray(b"x"), bytearray(b"y")]
    # The block's file is named by the hex key (the same tree as the Rust API's).
    assert store.path_of(k[0]).name == k[0]
    assert store.path_of(k[0]).is_file()
    assert str(store.path_of(k[0])).startswith(str(store.dir))


def test_chain_hashes():
    a = list(range(64))
    b = a.copy()
    b[40] = 9999
    ha, hb = tierkv_g3.chain_hashes(a, 16), tierkv_g3.chain_hashes(b, 16)
    assert len(ha) == 4 and all(len(h) == 64 and h == h.lower() for h in ha)
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert tierkv_g3.chain_hashes(a[:47], 16) == ha[:2]  # a partial block has no hash
    assert tierkv_g3.chain_hashes(a[32:], 16, parent=ha[1]) == ha[2:]
    assert tierkv_g3.chain_hashes(a[32:], 16, parent=bytes.fromhex(ha[1])) == ha[2:]
    assert tierkv_g3.chain_hashes(np.array(a, np.int64), 16) == ha
    with pytest.raises(ValueError):
        tierkv_g3.chain_hashes(a, 0)
    with pytest.raises(OverflowError):
        tierkv_g3.chain_hashes([-1], 1)


def test_prefix_contains_remove_touch(store):
    k = keys(4)
    store.put_many(k, [b"1", b"2", b"3", b"4"])
    other = keys(2, seed=7)
    assert store.contains_prefix(k) == 4
    assert store.contains_prefix(other + k) == 0
    assert store.contains_many([k[0], other[0], k[3]]) == [True, False, True]
    store.touch_many(k + other)
    # Removing a block removes the rest of its chain (the present set is prefix-closed).
    assert store.remove_many([k[2], other[0]]) == [True, False]
    assert store.contains_many(k) == [True, True, False, False]
    assert store.contains_prefix(k) == 2


def test_offer_many_stores_the_rest_after_a_cached_prefix(store):
    k = keys(4)
    store.put_many(k[:2], [b"a", b"b"])
    store.offer_many(k[2:], [b"c", b"d"], parent=k[1])
    assert store.contains_prefix(k) == 4
    # A continuation whose parent is gone is not stored (it could never be reached).
    store.remove_many([k[1]])
    store.offer_many(k[2:], [b"c", b"d"], parent=k[1])
    assert store.contains_many(k) == [True, False, False, False]
    assert store.stats()["not_admitted"] >= 2


def test_stats_is_a_dict_of_the_rust_counters(store):
    k = keys(2)
    store.put_many(k, [b"x" * 100, b"y" * 50])
    store.get_many_into(k, [bytearray(100), bytearray(100)])
    s = store.stats()
    assert (s["puts"], s["hits"], s["bytes_written"], s["bytes_read"]) == (2, 2, 150, 150)
    assert s["used_files"] == 2 and s["capacity_bytes"] is None
    assert s["get_latency"]["count"] == 1 and set(s["errors"]) >= {"no_space", "io"}


def test_close_reopen_and_context_manager(tmp_path):
    k = keys(3)
    with tierkv_g3.Store(tmp_path, "rank0", stats_interval=None) as s:
        s.put_many(k, [b"a", b"b", b"c"])
        assert not s.closed and s.worker == "rank0" and s.policy == "adaptive"
        assert s.engine in ("io_uring", "psync")
    assert s.closed and "closed" in repr(s)
    s.close()  # twice is fine
    with pytest.raises(tierkv_g3.ClosedError):
        s.get_many_into(k, [bytearray(1)] * 3)
    # The lock was released: the worker reopens at once, and its blocks survived.
    with tierkv_g3.Store(tmp_path, 0, engine="psync", capacity_bytes=1 << 30) as s2:
        assert s2.worker == "0" and s2.engine == "psync"
    with tierkv_g3.Store(tmp_path, "rank0", stats_interval=None) as s3:
        assert s3.contains_prefix(k) == 3
        assert s3.stats()["blocks_at_open"] == 3


def test_a_read_only_store_serves_a_tree_another_store_writes(open_store):
    writer = open_store()
    k = keys(2)
    writer.put_many(k, [b"ab", b"cd"])
    reader = open_store(read_only=True)
    assert reader.read_only
    bufs = [bytearray(2), bytearray(2)]
    assert reader.get_many_into(k, bufs) == [2, 2] and bufs[1] == bytearray(b"cd")


def test_a_bounded_store_evicts_and_stays_under_its_capacity(open_store):
    s = open_store(capacity_files=8, policy="lru", watermarks=(1.0, 1.0))
    for seed in range(5):
        s.put_many(keys(4, seed), [b"z" * 100] * 4)
    st = s.stats()
    assert st["used_files"] <= 8 and st["evictions"] >= 12 and st["capacity_files"] == 8
    assert s.contains_prefix(keys(4, 4)) == 4  # the newest chain stays


def test_a_full_store_reuses_evicted_files_unless_told_not_to(open_store):
    # Default: where the filesystem grants write leases (the test's tmp dir does), a put
    # that evicts writes into the evicted block's file.
    s = open_store(capacity_files=4)
    for seed in range(3):
        s.put_many(keys(4, seed), [b"r" * 100] * 4)
    st = s.stats()
    assert st["evictions"] == 8 and st["reused_files"] == 8, st
    s.close()
    t = open_store(worker="w1", capacity_files=4, watermarks=(1.0, 1.0), reuse_evicted=False)
    for seed in range(3):
        t.put_many(keys(4, seed), [b"u" * 100] * 4)
    st = t.stats()
    assert st["evictions"] == 8 and st["reused_files"] == 0, st


def test_wrong_arguments_are_type_and_value_errors(store):
    k = keys(2)
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        store.put_many(k, [b"x"])
    with pytest.raises(TypeError, match="wrap a single key"):
        store.contains_prefix(k[0])
    with pytest.raises(TypeError, match="not int"):
        store.contains_prefix([5])
    with pytest.raises(TypeError, match=r"buffers\[1\]: str does not export a buffer"):
        store.put_many(k, [b"x", "text"])
