"""Store.put_many_vectored / get_many_into_vectored: a block written from and read into
several buffers in place (an MHA page's K and V regions, which are not contiguous)."""

from __future__ import annotations

import numpy as np
import pytest

import tierkv_g3


def keys(n: int, seed: int = 0) -> list:
    return tierkv_g3.chain_hashes(list(range(seed, seed + 16 * n)), 16)


def test_parts_round_trip_through_parts_and_one_buffer(store):
    k = keys(3)
    rng = np.random.default_rng(1)
    parts = [[rng.integers(0, 256, n, np.uint8) for n in sizes] for sizes in ([7, 4093], [1], [0, 5, 4096])]
    store.put_many_vectored(k, parts)
    whole = [np.concatenate(p) for p in parts]
    # One buffer per block reads the concatenation.
    bufs = [np.zeros(w.size + 3, np.uint8) for w in whole]
    assert store.get_many_into(k, bufs) == [w.size for w in whole]
    for b, w in zip(bufs, whole):
        assert bytes(b[: w.size]) == w.tobytes()
    # Parts of other sizes than written (a K/V split at odd sizes) fill in order.
    outs = [[np.zeros(n, np.uint8) for n in sizes] for sizes in ([3, 4097], [1], [4000, 101])]
    assert store.get_many_into_vectored(k, outs) == [4100, 1, 4101]
    for o, w in zip(outs, whole):
        assert np.concatenate(o)[: w.size].tobytes() == w.tobytes()


def test_k_and_v_regions_of_one_pool_in_place(store):
    """Pages whose K and V halves lie in two far-apart regions of one pool, as SGLang's
    page_first host pool lays them out: written from and read into the pool itself."""
    pool = tierkv_g3.aligned_array((2, 4, 1000), np.float16)  # [K|V, page, bytes of a page]
    pool[...] = np.random.default_rng(2).standard_normal(pool.shape)
    k = keys(4, seed=7)
    store.put_many_vectored(k, [[pool[0, i], pool[1, i]] for i in range(4)])
    want = pool.copy()
    pool[...] = 0
    addr = pool.ctypes.data
    assert store.get_many_into_vectored(k, [(pool[0, i], pool[1, i]) for i in range(4)]) == [4000] * 4
    assert pool.ctypes.data == addr and np.array_equal(pool, want)


def test_a_miss_is_none_and_the_others_are_read(store):
    k = keys(3)
    store.put_many_vectored(k[:1], [[b"ab", b"cd"]])
    out = [[bytearray(2), bytearray(2)] for _ in range(3)]
    assert store.get_many_into_vectored([k[0], k[2]], out[:2]) == [4, None]
    assert bytes(out[0][0] + out[0][1]) == b"abcd"


def test_parts_too_small_raise_buffer_too_small(store):
    k = keys(2)
    store.put_many_vectored(k, [[b"x" * 10, b"y" * 10], [b"z"]])
    with pytest.raises(tierkv_g3.BufferTooSmallError) as e:
        store.get_many_into_vectored(k, [[bytearray(10), bytearray(9)], [bytearray(1)]])
    assert e.value.index == 0


def test_overlapping_and_read_only_parts_are_refused(store):
    k = keys(2)
    store.put_many_vectored(k, [[b"x" * 10], [b"y" * 10]])
    m = memoryview(bytearray(64))
    with pytest.raises(ValueError, match=r"parts\[0\]\[1\] and parts\[1\]\[0\] share memory"):
        store.get_many_into_vectored(k, [[m[0:5], m[5:12]], [m[10:20]]])
    with pytest.raises(TypeError, match="read-only"):
        store.get_many_into_vectored(k, [[b"0" * 10], [bytearray(10)]])
    # Adjacent parts of one pool are fine.
    assert store.get_many_into_vectored(k, [[m[0:5], m[5:10]], [m[10:20]]]) == [10, 10]


def test_parts_must_be_lists_of_buffers_one_per_key(store):
    k = keys(2)
    with pytest.raises(TypeError, match="list or tuple"):
        store.put_many_vectored(k, [np.zeros(4, np.uint8), [b"x"]])
    with pytest.raises(ValueError, match="one per key"):
        store.put_many_vectored(k, [[b"x"]])


def test_offer_many_vectored_hangs_a_chain_from_its_parent(store):
    k = keys(4)
    part = lambda i: [np.full(100, i, np.uint8), np.full(50, 100 + i, np.uint8)]  # noqa: E731
    store.offer_many_vectored(k[:2], [part(0), part(1)])
    # The rest of the chain after its cached prefix: stored, linked to k[1].
    store.offer_many_vectored(k[2:], [part(2), part(3)], parent=k[1])
    assert store.contains_prefix(k) == 4
    # Removing the parent removes what hangs from it: the chain relation was recorded.
    assert store.remove_many([k[1]]) == [True]
    assert store.contains_many(k) == [True, False, False, False]
    # A parent no longer stored: nothing is, no error, counted as not admitted.
    before = store.stats()["not_admitted"]
    store.offer_many_vectored(k[2:], [part(2), part(3)], parent=k[1])
    assert store.contains_many(k[2:]) == [False, False]
    assert store.stats()["not_admitted"] == before + 2
    # An offer does not rewrite a stored block: its bytes stay the first ones.
    store.offer_many_vectored(k[:1], [part(9)])
    out = [np.zeros(100, np.uint8), np.zeros(50, np.uint8)]
    assert store.get_many_into_vectored(k[:1], [out]) == [150]
    assert out[0][0] == 0 and out[1][0] == 100


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_regions_given_as_addresses_round_trip_in_a_pool_and_in_per_layer_buffers(store):
    """`put_many_regions` / `get_many_into_regions`: a page's regions named by address inside
    memory exported once (SGLang's get_page_buffer_meta gives addresses), one buffer or one
    per layer; the same bytes as the vectored calls, no Python object per region."""
    layers = [np.random.default_rng(i).integers(0, 256, (4, 1000), np.uint8) for i in range(3)]
    k = keys(4, seed=11)
    pages = [0, 2, 3, 1]
    addrs = [_addr(layers[l][p]) for p in pages for l in range(3)]
    sizes = [1000] * len(addrs)
    store.put_many_regions(k, layers, addrs, sizes)
    whole = [np.concatenate([layers[l][p] for l in range(3)]) for p in pages]
    bufs = [np.zeros(3000, np.uint8) for _ in k]
    assert store.get_many_into(k, bufs) == [3000] * 4
    assert all(b.tobytes() == w.tobytes() for b, w in zip(bufs, whole))
    # Read back into another pool, one buffer, pages in another order.
    pool = np.zeros((4, 3000), np.uint8)
    dst = [_addr(pool[p]) + 1000 * l for p in (3, 1, 0, 2) for l in range(3)]
    assert store.get_many_into_regions(k, pool, dst, sizes) == [3000] * 4
    for p, w in zip((3, 1, 0, 2), whole):
        assert pool[p].tobytes() == w.tobytes()


def test_regions_outside_the_memory_given_or_overlapping_are_refused(store):
    k = keys(2, seed=21)
    pool = np.zeros(4096, np.uint8)
    store.put_many(k, [b"a" * 100, b"b" * 100])
    base = _addr(pool)
    with pytest.raises(ValueError, match="region 1 .* not inside the memory given"):
        store.get_many_into_regions(k, pool, [base, base + 3997], [100, 100])  # 1 byte over
    with pytest.raises(ValueError, match="region 1 .* not inside"):
        store.put_many_regions(k, [pool], [base, base - 100], [100, 100])
    with pytest.raises(ValueError, match="share memory"):
        store.get_many_into_regions(k, pool, [base, base + 50], [100, 100])
    with pytest.raises(ValueError, match="3 regions for 2 keys"):
        store.get_many_into_regions(k, pool, [base, base + 100, base + 200], [100] * 3)
    with pytest.raises(TypeError):
        store.get_many_into_regions(k, b"\0" * 4096, [base, base + 100], [100, 100])
    assert not pool.any(), "nothing was read into the pool by a refused call"
    # A region that ends where the memory ends is inside it.
    assert store.get_many_into_regions(k, pool, [base, base + 3996], [100, 100]) == [100, 100]
    assert pool[3996:].tobytes() == b"b" * 100


def test_offer_many_regions_hangs_the_chain_from_its_parent(store):
    k = keys(3, seed=31)
    pool = np.arange(3000, dtype=np.uint16).view(np.uint8)
    addrs = [_addr(pool) + 2000 * i for i in range(3)]
    # A parent that is not stored: nothing is.
    store.offer_many_regions(k[1:], pool, addrs[1:], [2000, 2000], parent=k[0])
    assert store.contains_many(k) == [False, False, False]
    store.offer_many_regions(k[:1], pool, addrs[:1], [2000])
    store.offer_many_regions(k[1:], pool, addrs[1:], [2000, 2000], parent=k[0])
    out = [np.zeros(2000, np.uint8) for _ in k]
    assert store.get_many_into(k, out) == [2000] * 3
    assert b"".join(o.tobytes() for o in out) == pool.tobytes()
