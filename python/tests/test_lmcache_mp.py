"""tierkv_g3.LMCacheConnector driven by LMCache's REAL ``native_plugin`` L2 adapter
(lmcache 0.5.6: NativeConnectorL2Adapter, its demux thread and eventfds), built from the
``--l2-adapter`` JSON the way ``lmcache server`` parses it. Nothing is mocked. Needs lmcache
and torch (tools/engines-venv.sh's virtualenv); skipped, and the skip recorded, without them.
"""

from __future__ import annotations

import argparse
import json
import select
import shutil
import time
from pathlib import Path

import pytest

from conftest import skip_or_fail, tmpfs


@pytest.fixture(scope="module")
def lmc():
    """LMCache's modules (imported once), or a recorded skip."""
    try:
        import torch
        from lmcache.v1.distributed.api import ObjectKey
        from lmcache.v1.distributed.l2_adapters import config, factory
        from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj
    except ImportError as e:
        skip_or_fail(f"lmcache is not installed ({e}); tools/engines-venv.sh makes a venv")

    class L:
        pass

    L.torch, L.ObjectKey, L.config, L.factory = torch, ObjectKey, config, factory
    L.Meta, L.TensorMemoryObj = MemoryObjMetadata, TensorMemoryObj
    return L


def adapter_of(lmc, root, **params):
    """The L2 adapter `lmcache server --l2-adapter JSON` builds (the same two calls)."""
    from tierkv_g3.lmcache_mp import l2_adapter_json

    params.setdefault("stats_interval", None)
    line = l2_adapter_json(str(root), worker="lmc", threads=2, **params)
    parser = lmc.config.add_l2_adapters_args(argparse.ArgumentParser())
    cfg = lmc.config.parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", line]))
    (spec,) = cfg.adapters
    return lmc.factory.create_l2_adapter_from_registry(spec)


@pytest.fixture
def adapter(lmc, tmp_path):
    a = adapter_of(lmc, tmp_path)
    yield a
    a.close()


def test_readmes_l2_adapter_line_builds_through_lmcaches_own_parser(lmc, tmp_path):
    """README's `--l2-adapter` line, as pasted (its root moved here), parsed by the parser
    `lmcache server` uses and built by LMCache's registry: a tierkv store with the line's
    capacity (an unknown option would be refused), which stores and finds a chunk."""
    import re
    import shlex

    readme = Path(__file__).resolve().parents[2] / "README.md"
    [line] = [x for x in readme.read_text().splitlines() if x.startswith("--l2-adapter ")]
    arg = shlex.split(line)[1]
    assert json.loads(arg)["adapter_params"]["capacity_bytes"] > 0
    arg = re.sub(r'"root": "[^"]*"', json.dumps({"root": str(tmp_path)})[1:-1], arg)
    parser = lmc.config.add_l2_adapters_args(argparse.ArgumentParser())
    cfg = lmc.config.parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", arg]))
    (spec,) = cfg.adapters
    a = lmc.factory.create_l2_adapter_from_registry(spec)
    try:
        assert store(a, [okey(lmc, 0)], [obj(lmc, 4096, 0)]).is_successful()
        assert lookup(a, [okey(lmc, 0)]) == [True]
        assert str(tmp_path) in str(a._client.path_of(a_key_string(okey(lmc, 0))))
    finally:
        a.close()


def okey(lmc, i, model="org/model", rank=0, salt=""):
    return lmc.ObjectKey(chunk_hash=i.to_bytes(4, "little") * 8, model_name=model,
                         kv_rank=rank, cache_salt=salt)


def obj(lmc, n, seed=None):
    """A TensorMemoryObj of n bytes: zeros, or a pattern of `seed`."""
    t = lmc.torch.zeros(n, dtype=lmc.torch.uint8)
    if seed is not None:
        t = (lmc.torch.arange(n, dtype=lmc.torch.int64) * 7 + seed * 131) % 251
        t = t.to(lmc.torch.uint8)
    meta = lmc.Meta(shape=lmc.torch.Size([n]), dtype=lmc.torch.uint8, address=0,
                    phy_size=n, ref_count=1)
    return lmc.TensorMemoryObj(t, meta, None)


def wait_fd(fd, until, timeout=15.0):
    """Waits on an adapter eventfd (select) until `until()` returns something not None."""
    deadline = time.monotonic() + timeout
    while True:
        r = until()
        if r is not None:
            return r
        left = deadline - time.monotonic()
        assert left > 0, "timed out"
        select.select([fd], [], [], min(left, 0.05))


def store(a, keys, objs):
    tid = a.submit_store_task(keys, objs)
    got = {}

    def done():
        got.update(a.pop_completed_store_tasks())
        return got.get(tid)

    return wait_fd(a.get_store_event_fd(), done)


def lookup(a, keys):
    tid = a.submit_lookup_and_lock_task(keys, {})
    bm = wait_fd(a.get_lookup_and_lock_event_fd(), lambda: a.query_lookup_and_lock_result(tid))
    a.submit_unlock([k for i, k in enumerate(keys) if bm.test(i)])
    return [bm.test(i) for i in range(len(keys))]


def load(a, keys, objs):
    tid = a.submit_load_task(keys, objs)
    bm = wait_fd(a.get_load_event_fd(), lambda: a.query_load_result(tid))
    return [bm.test(i) for i in range(len(keys))]


def test_store_lookup_load_byte_exact(lmc, adapter):
    n = 64 * 1024 + 3
    keys = [okey(lmc, i) for i in range(6)]
    r = store(adapter, keys, [obj(lmc, n, i) for i in range(6)])
    assert r.is_successful() and r.bytes_transferred() == 6 * n
    assert lookup(adapter, keys + [okey(lmc, 99)]) == [True] * 6 + [False]
    outs = [obj(lmc, n) for _ in range(6)]
    assert load(adapter, keys, outs) == [True] * 6
    for i, o in enumerate(outs):
        assert lmc.torch.equal(o.raw_data, obj(lmc, n, i).raw_data)
    assert adapter.report_status()["is_healthy"]


def test_other_models_ranks_and_salts_miss(lmc, adapter):
    assert store(adapter, [okey(lmc, 0)], [obj(lmc, 100, 0)]).is_successful()
    others = [okey(lmc, 0, model="org/other"), okey(lmc, 0, rank=1), okey(lmc, 0, salt="u1")]
    assert lookup(adapter, [okey(lmc, 0)] + others) == [True, False, False, False]
    assert load(adapter, others, [obj(lmc, 100) for _ in others]) == [False] * 3


def test_many_tasks_in_flight(lmc, adapter):
    n, tasks, per = 8192, 48, 4
    keys = [[okey(lmc, t * per + j) for j in range(per)] for t in range(tasks)]
    # LMCache keeps a task's objects alive until it completes (the adapter passes raw
    # views of their memory); so does the test.
    srcs = [[obj(lmc, n, t * per + j) for j in range(per)] for t in range(tasks)]
    tids = [adapter.submit_store_task(keys[t], srcs[t]) for t in range(tasks)]
    results = {}

    def all_done():
        results.update(adapter.pop_completed_store_tasks())
        return True if set(tids) <= results.keys() else None

    wait_fd(adapter.get_store_event_fd(), all_done)
    assert all(results[t].is_successful() for t in tids)
    outs = [[obj(lmc, n) for _ in range(per)] for _ in range(tasks)]
    lids = [adapter.submit_load_task(keys[t], outs[t]) for t in range(tasks)]
    bms = {}

    def loaded():
        for t in lids:
            if t not in bms:
                bm = adapter.query_load_result(t)
                if bm is not None:
                    bms[t] = bm
        return True if len(bms) == tasks else None

    wait_fd(adapter.get_load_event_fd(), loaded)
    assert all(bms[t].test(j) for t in lids for j in range(per))
    for t in range(tasks):
        for j in range(per):
            assert lmc.torch.equal(outs[t][j].raw_data, obj(lmc, n, t * per + j).raw_data)


def test_lmcache_eviction_deletes_the_blocks(lmc, adapter):
    keys = [okey(lmc, i) for i in range(3)]
    for i, k in enumerate(keys):  # one task each: a task's keys are one chain
        assert store(adapter, [k], [obj(lmc, 4096, i)]).is_successful()
    assert adapter.get_usage().total_bytes_used == 3 * 4096
    adapter.delete(keys[:2])  # synchronous: waits for the completion
    assert lookup(adapter, keys) == [False, False, True]
    assert adapter.get_usage().total_bytes_used == 4096


def test_deleting_one_key_of_a_task_deletes_only_it(lmc, adapter):
    """A task's keys are stored as one chain, and LMCache's L2
    `delete(key)` of the first removed the task's later keys too, which the adapter's usage
    never heard of. Now only the keys named go, and the usage says so."""
    keys = [okey(lmc, i) for i in range(3)]
    assert store(adapter, keys, [obj(lmc, 4096, i) for i in range(3)]).is_successful()
    adapter.delete(keys[:1])
    assert lookup(adapter, keys) == [False, True, True]
    outs = [obj(lmc, 4096) for _ in keys[1:]]
    assert load(adapter, keys[1:], outs) == [True, True]
    assert lmc.torch.equal(outs[1].raw_data, obj(lmc, 4096, 2).raw_data)
    assert adapter.get_usage().total_bytes_used == 2 * 4096


def test_a_corrupt_block_is_not_loaded_and_nothing_raises(lmc, tmp_path):
    a = adapter_of(lmc, tmp_path, verify="on-open")
    try:
        assert store(a, [okey(lmc, 0), okey(lmc, 1)], [obj(lmc, 5000, 0), obj(lmc, 5000, 1)])
        path = a._client.path_of(a_key_string(okey(lmc, 1)))
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        outs = [obj(lmc, 5000), obj(lmc, 5000)]
        assert load(a, [okey(lmc, 0), okey(lmc, 1)], outs) == [True, False]
        assert lmc.torch.equal(outs[0].raw_data, obj(lmc, 5000, 0).raw_data)
        assert lookup(a, [okey(lmc, 1)]) == [False]
        assert a.report_status()["is_healthy"]
    finally:
        a.close()


def a_key_string(k):
    """The string the adapter passes for an ObjectKey (its own serializer)."""
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (
        _object_key_to_string,
    )

    return _object_key_to_string(k)


def test_a_missing_root_fails_stores_and_loads(lmc, tmp_path):
    root = tmp_path / "root"
    a = adapter_of(lmc, root)
    try:
        for _ in range(100):
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                break
        assert not root.exists()
        r = store(a, [okey(lmc, 0)], [obj(lmc, 100, 0)])
        assert not r.is_successful()
        assert load(a, [okey(lmc, 0)], [obj(lmc, 100)]) == [False]
        assert a.report_status()["is_healthy"]
    finally:
        a.close()


def test_a_full_disk_fails_the_store_and_the_adapter_goes_on(lmc):
    with tmpfs("1m") as mnt:
        a = adapter_of(lmc, mnt)
        try:
            assert not store(a, [okey(lmc, 0)], [obj(lmc, 2 << 20, 0)]).is_successful()
            assert lookup(a, [okey(lmc, 0)]) == [False]
            assert store(a, [okey(lmc, 1)], [obj(lmc, 1000, 1)]).is_successful()
            out = obj(lmc, 1000)
            assert load(a, [okey(lmc, 1)], [out]) == [True]
            assert lmc.torch.equal(out.raw_data, obj(lmc, 1000, 1).raw_data)
        finally:
            a.close()


def test_close_with_work_in_flight(lmc, tmp_path):
    a = adapter_of(lmc, tmp_path)
    n, count = 1 << 20, 24
    keys = [okey(lmc, i) for i in range(count)]
    srcs = [obj(lmc, n, i) for i in range(count)]  # alive until the tasks complete
    for i in range(count):
        a.submit_store_task([keys[i]], [srcs[i]])
    a.close()  # stops the demux thread, then the connector: every batch finishes first
    b = adapter_of(lmc, tmp_path)
    try:
        assert lookup(b, keys) == [True] * count
        outs = [obj(lmc, n) for _ in range(count)]
        assert load(b, keys, outs) == [True] * count
        assert all(lmc.torch.equal(outs[i].raw_data, obj(lmc, n, i).raw_data)
                   for i in range(count))
    finally:
        b.close()


def test_the_json_line_is_what_lmcache_parses(lmc, tmp_path):
    from tierkv_g3.lmcache_mp import l2_adapter_json

    d = json.loads(l2_adapter_json("/mnt/kv", capacity_bytes=1 << 40))
    assert d == {"type": "native_plugin", "module_path": "tierkv_g3.lmcache_mp",
                 "class_name": "LMCacheConnector",
                 "adapter_params": {"root": "/mnt/kv", "capacity_bytes": 1 << 40}}
    a = adapter_of(lmc, tmp_path)
    try:
        assert type(a).__name__ == "NativeConnectorL2Adapter"
        assert a.report_status() == {"is_healthy": True, "type": "LMCacheConnector"}
    finally:
        a.close()


def test_two_servers_on_one_root_share_it_by_default(lmc, tmp_path):
    """A second `lmcache server` of one model on one root had no disk
    tier (its store's open failed); with README's line both work, each loading what the
    other stored."""
    a, b = adapter_of(lmc, tmp_path), adapter_of(lmc, tmp_path)
    try:
        n = 4096
        keys_a = [okey(lmc, i) for i in range(3)]
        keys_b = [okey(lmc, 100 + i) for i in range(3)]
        assert store(a, keys_a, [obj(lmc, n, i) for i in range(3)]).is_successful()
        assert store(b, keys_b, [obj(lmc, n, 100 + i) for i in range(3)]).is_successful()
        assert lookup(b, keys_a) == [True] * 3 and lookup(a, keys_b) == [True] * 3
        outs = [obj(lmc, n) for _ in range(3)]
        assert load(b, keys_a, outs) == [True] * 3
        assert all(lmc.torch.equal(o.raw_data, obj(lmc, n, i).raw_data) for i, o in enumerate(outs))
    finally:
        a.close()
        b.close()
