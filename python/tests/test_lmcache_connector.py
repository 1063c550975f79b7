"""tierkv_g3.LMCacheConnector on its own (no LMCache): the calls LMCache's native_plugin
adapter makes, their completions, and every failure as a completion, never an exception
(tests/test_lmcache_mp.py drives it through LMCache's own adapter)."""

from __future__ import annotations

import select
import shutil
import threading
import time

import numpy as np
import pytest

import tierkv_g3
from conftest import tmpfs
from tierkv_g3 import LMCacheConnector


def key(i: int, model: str = "org/model", rank: int = 0, salt: str = "") -> str:
    """An LMCache MP key string (native_connector_l2_adapter._object_key_to_string)."""
    k = f"{model}@{rank:08x}@0@{i:064x}"
    return f"{k}@{salt}" if salt else k


def payload(i: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + i * 131) % 251).astype(np.uint8)


@pytest.fixture
def conn(tmp_path):
    c = LMCacheConnector(str(tmp_path), "lmc", threads=2, stats_interval=None)
    yield c
    c.close()


def collect(c, ids, timeout=10.0):
    """Waits on the eventfd (poll) and drains until every id in `ids` completed; returns
    {id: (ok, err, bools)}. Fails on a completion seen twice or one never asked for."""
    want, got = set(ids), {}
    p = select.poll()
    p.register(c.event_fd(), select.POLLIN)
    deadline = time.monotonic() + timeout
    while want - got.keys():
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; missing {sorted(want - got.keys())}"
        p.poll(int(left * 1000) + 1)
        for fid, ok, err, bools in c.drain_completions():
            assert fid in want and fid not in got, (fid, want, got)
            got[fid] = (ok, err, bools)
    return got


def put(c, keys, bufs):
    (ok, err, bools), = collect(c, [c.submit_batch_set(keys, bufs)]).values()
    assert (ok, err, bools) == (True, "", None)


def test_roundtrip_byte_exact(conn):
    n = 3 * 4096 + 17
    keys = [key(i) for i in range(8)]
    put(conn, keys, [memoryview(payload(i, n)) for i in range(8)])
    (ok, err, found), = collect(conn, [conn.submit_batch_exists(keys + [key(99)])]).values()
    assert ok and err == "" and found == [True] * 8 + [False]
    out = [np.zeros(n, np.uint8) for _ in range(8)]
    (ok, err, loaded), = collect(conn, [conn.submit_batch_get(keys, out)]).values()
    assert (ok, err, loaded) == (True, "", [True] * 8)
    for i, o in enumerate(out):
        assert np.array_equal(o, payload(i, n))


def test_a_miss_is_false_and_the_hits_are_filled(conn):
    put(conn, [key(0)], [payload(0, 100)])
    out = [bytearray(100), bytearray(100)]
    (ok, err, loaded), = collect(conn, [conn.submit_batch_get([key(1), key(0)], out)]).values()
    assert loaded == [False, True] and not ok and "keys[0]: not stored" in err
    assert bytes(out[1]) == payload(0, 100).tobytes()


def test_a_block_of_another_length_than_its_buffer_is_not_loaded(conn):
    put(conn, [key(0)], [payload(0, 100)])
    (ok, err, loaded), = collect(conn, [conn.submit_batch_get([key(0)], [bytearray(200)])]).values()
    assert loaded == [False] and not ok and "100 bytes" in err and "200" in err
    (ok, err, loaded), = collect(conn, [conn.submit_batch_get([key(0)], [bytearray(50)])]).values()
    assert loaded == [False] and not ok and "keys[0]" in err


def test_delete_answers_per_key_and_the_blocks_are_gone(conn):
    put(conn, [key(0)], [b"a" * 10])
    put(conn, [key(1)], [b"b" * 10])
    (ok, err, gone), = collect(conn, [conn.submit_batch_delete([key(0), key(2)])]).values()
    assert (ok, err, gone) == (True, "", [True, False])
    (ok, _, found), = collect(conn, [conn.submit_batch_exists([key(0), key(1)])]).values()
    assert ok and found == [False, True]


def test_many_batches_in_flight(conn):
    n, batches, per = 4096, 64, 4
    sets = [conn.submit_batch_set([key(b * per + j) for j in range(per)],
                                  [payload(b * per + j, n) for j in range(per)])
            for b in range(batches)]
    assert len(set(sets)) == batches
    assert all(r == (True, "", None) for r in collect(conn, sets).values())
    out = np.zeros((batches * per, n), np.uint8)
    gets = [conn.submit_batch_get([key(b * per + j) for j in range(per)],
                                  [out[b * per + j] for j in range(per)])
            for b in range(batches)]
    assert all(r == (True, "", [True] * per) for r in collect(conn, gets).values())
    for i in range(batches * per):
        assert np.array_equal(out[i], payload(i, n))


def test_the_eventfd_wakes_select_and_drain_resets_it(conn):
    fd = conn.event_fd()
    assert select.select([fd], [], [], 0)[0] == []
    fid = conn.submit_batch_exists([key(0)])
    r, _, _ = select.select([fd], [], [], 5)
    assert r == [fd]
    assert conn.drain_completions() == [(fid, True, "", [False])]
    assert select.select([fd], [], [], 0)[0] == []
    assert conn.drain_completions() == []


def test_models_ranks_and_salts_never_share_a_block(conn):
    variants = [key(0), key(0, model="org/other"), key(0, rank=1), key(0, salt="u1")]
    hashes = {LMCacheConnector.key_hash(k) for k in variants}
    assert len(hashes) == len(variants)
    assert LMCacheConnector.key_hash(key(0)) == LMCacheConnector.key_hash(key(0).encode())
    assert conn.path_of(key(0)).name == LMCacheConnector.key_hash(key(0))
    put(conn, [key(0)], [b"model A"])
    (ok, _, found), = collect(conn, [conn.submit_batch_exists(variants)]).values()
    assert ok and found == [True, False, False, False]


@pytest.mark.parametrize("case", ["int key", "one str as keys", "read-only destination",
                                  "count mismatch", "shared memory", "not a buffer"])
def test_a_bad_submission_is_a_failed_completion(conn, case):
    b = bytearray(8)
    calls = {
        "int key": lambda: conn.submit_batch_exists([1]),
        "one str as keys": lambda: conn.submit_batch_exists(key(0)),
        "read-only destination": lambda: conn.submit_batch_get([key(0)], [b"12345678"]),
        "count mismatch": lambda: conn.submit_batch_set([key(0), key(1)], [b"x"]),
        "shared memory": lambda: conn.submit_batch_get([key(0), key(1)],
                                                      [memoryview(b)[:6], memoryview(b)[4:]]),
        "not a buffer": lambda: conn.submit_batch_set([key(0)], [object()]),
    }
    fid = calls[case]()
    (ok, err, bools), = collect(conn, [fid]).values()
    assert not ok and err and bools is None, err


def test_a_corrupt_block_is_a_failure_not_an_exception(tmp_path):
    with LMCacheConnector(str(tmp_path), "lmc", verify="on-open", stats_interval=None) as c:
        put(c, [key(0)], [payload(0, 5000)])
        p = c.path_of(key(0))
        data = bytearray(p.read_bytes())
        data[-1] ^= 0xFF
        p.write_bytes(bytes(data))
        (ok, err, loaded), = collect(c, [c.submit_batch_get([key(0)], [bytearray(5000)])]).values()
        assert not ok and loaded == [False] and err
        assert not p.exists()  # removed: the next lookup says so
        (ok, _, found), = collect(c, [c.submit_batch_exists([key(0)])]).values()
        assert ok and found == [False]


def test_a_missing_root_is_a_failure_with_its_path(tmp_path):
    root = tmp_path / "root"
    with LMCacheConnector(str(root), "lmc", stats_interval=None) as c:
        # Deleted (not renamed: the store works beneath its directory's descriptor, so a
        # moved tree still works); again while the store's background threads, still
        # starting, create files in it.
        for _ in range(100):
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                break
        assert not root.exists()
        (ok, err, bools), = collect(c, [c.submit_batch_set([key(0)], [b"x" * 100])]).values()
        assert not ok and bools is None and str(root) in err, err
        (ok, err, loaded), = collect(c, [c.submit_batch_get([key(0)], [bytearray(100)])]).values()
        assert loaded == [False] and not ok


def test_a_full_disk_is_a_failure_with_its_path():
    with tmpfs("1m") as mnt:
        with LMCacheConnector(mnt, "lmc", stats_interval=None) as c:
            big = np.zeros(2 << 20, np.uint8)
            (ok, err, bools), = collect(c, [c.submit_batch_set([key(0)], [big])]).values()
            assert not ok and bools is None and mnt in err, err
            assert "space" in err.lower(), err
            # The connector still works.
            put(c, [key(1)], [b"small"])
            (ok, _, loaded), = collect(c, [c.submit_batch_get([key(1)], [bytearray(5)])]).values()
            assert ok and loaded == [True]


def test_close_with_work_in_flight_finishes_it(tmp_path):
    c = LMCacheConnector(str(tmp_path), "lmc", threads=2, stats_interval=None)
    n, count = 1 << 20, 32
    bufs = [payload(i, n) for i in range(count)]
    sets = [c.submit_batch_set([key(i)], [bufs[i]]) for i in range(count)]
    c.close()
    # Every batch ran before close returned; its completion is still there to drain.
    done = {fid: (ok, err, bools) for fid, ok, err, bools in c.drain_completions()}
    assert done == {fid: (True, "", None) for fid in sets}
    # After close: no exception, a failed completion; the worker can be opened again.
    fid = c.submit_batch_exists([key(0)])
    fid2 = c.submit_batch_set([key(0)], [bytearray(8)])
    assert c.drain_completions() == [(fid, False, "the connector is closed", None),
                                     (fid2, False, "the connector is closed", None)]
    with pytest.raises(tierkv_g3.ClosedError):
        c.event_fd()
    c.close()
    with LMCacheConnector(str(tmp_path), "lmc", stats_interval=None) as c2:
        out = [np.zeros(n, np.uint8) for _ in range(count)]
        gets = [c2.submit_batch_get([key(i)], [out[i]]) for i in range(count)]
        c2.close()
        done = {fid: r for fid, *r in c2.drain_completions()}
        assert all(done[g] == [True, "", [True]] for g in gets)
        assert all(np.array_equal(out[i], bufs[i]) for i in range(count))


def test_calls_do_not_wait_for_the_disk_and_release_the_gil(tmp_path):
    # A Python thread keeps running while batches of 4 MiB blocks are written: submissions
    # return at once and the queue's threads never hold the GIL.
    with LMCacheConnector(str(tmp_path), "lmc", threads=2, stats_interval=None) as c:
        ticks, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        blocks = [payload(i, 4 << 20) for i in range(16)]
        t0 = time.monotonic()
        ids = [c.submit_batch_set([key(i)], [blocks[i]]) for i in range(16)]
        submit_s = time.monotonic() - t0
        before = ticks[0]
        collect(c, ids)
        stop.set()
        t.join()
        assert ticks[0] > before
        assert submit_s < 0.5, submit_s


def test_constructor_options_are_the_stores(tmp_path):
    with pytest.raises(tierkv_g3.ConfigError):
        LMCacheConnector(str(tmp_path), "lmc", policy="nonsense")
    with pytest.raises(TypeError):
        LMCacheConnector(str(tmp_path), "lmc", no_such_option=1)
    with LMCacheConnector(str(tmp_path), "lmc", capacity_bytes=1 << 20,
                          stats_interval=None) as c:
        assert c.worker == "lmc" and "lmc" in repr(c)
