"""tierkv_g3.vllm against vLLM's real tiering offload stack on CPU: vLLM's
`TieringOffloadingSpec` and `TieringOffloadingManager` with its CPU primary tier, our tier built
by vLLM's `SecondaryTierFactory` from a `secondary_tiers` entry, vLLM's own `fs` tier beside
it where it helps (python/tests/vllm_tier_harness.py plays the scheduler and the GPU copies).
tools/test.sh runs this file in .venv-vllm/ (tools/engines-venv.sh vllm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import require_engine  # noqa: E402

require_engine("vllm.v1.kv_offload.tiering.manager", "vllm", "test_vllm_tier.py")

import ledger  # noqa: E402
import vllm_tier_harness as h  # noqa: E402
from conftest import tmpfs  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402

from tierkv_g3.vllm import TierkvSecondaryTier, fold_key  # noqa: E402

HIT, MISS = LookupResult.HIT, LookupResult.MISS
HARNESS = Path(__file__).with_name("vllm_tier_harness.py")


@pytest.fixture
def sched():
    """Makes Sched objects (h.make_spec's arguments); shuts their managers down after."""
    made = []

    def make(tiers, **kw):
        s = h.Sched(h.make_spec(tiers, **kw))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def exact(s: h.Sched, ids) -> bool:
    return all(np.array_equal(b, h.payload(i, s.chunk_bytes)) for i, b in zip(ids, s.read(ids)))


def test_factory_builds_our_tier_from_the_config(sched, tmp_path):
    s = sched([h.tierkv_tier(tmp_path, capacity_bytes=1 << 30)])
    tier = s.tier()
    assert isinstance(tier, TierkvSecondaryTier) and tier.tier_type == "TierkvSecondaryTier"
    assert tier.store is not None and Path(tier.store.dir).is_relative_to(tmp_path)
    assert tier.tierkv_stats()["store"]["capacity_bytes"] == 1 << 30


def test_chunks_cascaded_to_the_tier_are_promoted_back_byte_exact(sched, tmp_path):
    s = sched([h.tierkv_tier(tmp_path)])
    ids = list(range(12))
    assert len(s.store(ids)) == 12
    assert s.tier().tierkv_stats()["store"]["used_files"] == 12
    s.drop_primary()  # only the tier has them now
    res = s.lookup_all(ids + [99])
    assert h.hits(res) == ids and res[99] is MISS
    assert exact(s, ids)
    assert s.tier().tierkv_stats()["failures"] == {}


def test_lookup_is_retry_while_a_store_is_in_flight(sched, tmp_path):
    s = sched([h.tierkv_tier(tmp_path)])
    tier = s.tier()
    c = s.ctx()
    keys = [h.key(i) for i in range(4)]
    out = s.mgr.prepare_store(keys, c)
    for k, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
        s.primary[int(cid)] = h.payload(keys.index(k), s.chunk_bytes)
    s.mgr.complete_store(keys, c)  # submit_store: the job is queued, not yet reported
    assert tier.lookup(keys[0], c) is LookupResult.RETRY
    s.mgr.on_request_finished(c)
    s.settle()
    assert tier.lookup(keys[0], c) is HIT


def test_submit_calls_return_before_the_io(sched, tmp_path):
    """vLLM calls submit_store/submit_load on its scheduler thread. Another holder of the
    shared tree's ledger lock (a writer that does not let go, as a stalled filesystem would
    hold it) stalls the tier's one transfer thread in its write: submit_store returns, the
    chunks are not stored and their lookup RETRYs; a load queued behind it returns too and
    stays pending; once the lock is let go, both complete, byte-exact."""
    s = sched([h.tierkv_tier(tmp_path, n_read_threads=0, n_write_threads=1)])
    tier = s.tier()
    keys = [h.key(i) for i in range(3)]
    s.store([0])  # stored before the stall: the load below reads it
    s.drop_primary()
    with ledger.held(tier.store.dir):
        c = s.ctx()
        out = s.mgr.prepare_store(keys[1:], c)
        for k, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
            s.primary[int(cid)] = h.payload(keys.index(k), s.chunk_bytes)
        s.mgr.complete_store(keys[1:], c)  # submit_store, on this (the scheduler's) thread
        s.mgr.on_request_finished(c)
        load = s.ctx()
        assert s.mgr.lookup(keys[0], load) is LookupResult.HIT_PENDING  # promotion queued
        for _ in range(5):
            s.step()  # submit_load returned; the load waits behind the stalled write
            assert s.mgr.lookup(keys[0], load) is LookupResult.HIT_PENDING
            time.sleep(0.05)
        assert tier.lookup(keys[1], c) is LookupResult.RETRY
        assert tier.store.contains_many([fold_key(tier._prefix, k) for k in keys[1:]]) == [False] * 2
    s.mgr.on_request_finished(load)
    s.settle()
    s.drop_primary()
    assert s.lookup_all([0, 1, 2]) == {0: HIT, 1: HIT, 2: HIT} and exact(s, [0, 1, 2])


def test_the_capacity_holds_and_evicts_the_least_recently_used(sched, tmp_path):
    s = sched([h.tierkv_tier(tmp_path, policy="lru")], n_chunks=8)
    s.store([0])
    per_file = s.tier().tierkv_stats()["store"]["used_bytes"]
    cap = 6 * per_file
    s.close()
    s = sched([h.tierkv_tier(tmp_path / "b", policy="lru", capacity_bytes=cap)], n_chunks=8)
    for i in range(6):
        s.store([i])
    s.drop_primary()
    assert h.hits(s.lookup_all([0])) == [0]  # 0 read again: the most recently used
    s.drop_primary()
    for i in range(6, 10):
        s.store([i])
        st = s.tier().tierkv_stats()["store"]
        assert st["used_bytes"] <= cap, st
    s.drop_primary()
    got = h.hits(s.lookup_all(list(range(10))))
    assert got == [0, 5, 6, 7, 8, 9], got
    assert s.tier().tierkv_stats()["store"]["evictions"] == 4
    blocks = [f for f in Path(s.tier().store.dir).rglob("*") if len(f.name) == 64]
    assert len(blocks) == 6 and sum(f.stat().st_size for f in blocks) <= cap


def run_harness(mode: str, tiers, n: int):
    r = subprocess.run([sys.executable, str(HARNESS), mode, json.dumps(tiers), str(n)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_a_fresh_process_hits_what_another_stored(tmp_path):
    ours, fs = h.tierkv_tier(tmp_path / "tierkv"), h.fs_tier(tmp_path / "fs")
    run_harness("store", [ours, fs], 10)  # vLLM cascades every chunk to both tiers
    got, got_fs = run_harness("check", [ours, fs], 12)  # each alone, in a fresh process
    assert got["hits"] == list(range(10)) and got["exact"] == list(range(10)), got
    assert got["stats"]["store"]["blocks_at_open"] == 10  # the index rebuilt from the tree
    assert got_fs["hits"] == list(range(10)) and got_fs["exact"] == list(range(10)), got_fs


def test_two_processes_share_one_tier(sched, tmp_path):
    shared = h.tierkv_tier(tmp_path, sharing="shared", worker="vllm-shared", negative_ttl=0)
    writer = sched([shared])
    reader = sched([shared])
    assert reader.lookup_all([0, 1]) == {0: MISS, 1: MISS}
    writer.store([0, 1, 2])
    assert h.hits(reader.lookup_all([0, 1, 2, 3])) == [0, 1, 2]  # RETRY, then HIT
    assert exact(reader, [0, 1, 2])


def test_two_data_parallel_ranks_share_the_tier_by_default(sched, tmp_path):
    """Two data-parallel ranks (or replicas) of one model, each with the
    tier as README configures it (no `sharing`), open one worker. The second's open failed
    (`WorkerBusyError`, logged once) and it ran without a tier. Now both open it, shared; what
    one stores the other hits; a rank's own chunks are a HIT at once, from its index."""
    a, b = sched([h.tierkv_tier(tmp_path)]), sched([h.tierkv_tier(tmp_path)])
    assert a.tier().store is not None and b.tier().store is not None
    assert a.tier().worker == b.tier().worker
    a.store([0, 1, 2])
    assert a.lookup_all([0, 1, 2]) == {0: HIT, 1: HIT, 2: HIT}
    assert h.hits(b.lookup_all([0, 1, 2])) == [0, 1, 2]  # RETRY, then HIT
    assert exact(b, [0, 1, 2])
    assert a.tier().tierkv_stats()["failures"] == b.tier().tierkv_stats()["failures"] == {}


def test_two_models_never_share_a_chunk(sched, tmp_path):
    a = sched([h.tierkv_tier(tmp_path, worker="w")], model="org/model-a")
    b = sched([h.tierkv_tier(tmp_path / "b", worker="w")], model="org/model-b")
    assert fold_key(a.tier()._prefix, h.key(0)) != fold_key(b.tier()._prefix, h.key(0))
    assert fold_key(a.tier()._prefix, h.key(0)) != fold_key(a.tier()._prefix, h.key(0, 1))
    c = sched([h.tierkv_tier(tmp_path / "c")], dtype="bfloat16")
    assert len({a.tier().worker, c.tier().worker}) == 2
    a.store([0])
    a.close()
    a2 = sched([h.tierkv_tier(tmp_path, worker="w")], model="org/model-b")
    assert a2.lookup_all([0]) == {0: MISS}  # same root and worker, another model


def test_two_checkpoints_at_one_path_never_share_a_chunk(sched, tmp_path):
    """The tier's identity had the model's name and dtype, not
    its revision or quantization, so another checkpoint at the same path (a new revision
    downloaded over it, a fine-tune of equal sizes) hit the old one's KV. For a model in a
    local directory the identity now has the weights' identity and the declared quantization."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "model.safetensors").write_bytes(bytes(4096))
    a = sched([h.tierkv_tier(tmp_path / "kv")], model=str(model))
    a.store([0, 1])
    first = a.tier().worker
    a.close()
    again = sched([h.tierkv_tier(tmp_path / "kv")], model=str(model))
    assert h.hits(again.lookup_all([0, 1])) == [0, 1] and again.tier().worker == first
    again.close()
    (model / "model.safetensors").write_bytes(bytes([1]) * 4096)  # another revision's bytes
    b = sched([h.tierkv_tier(tmp_path / "kv")], model=str(model))
    assert b.lookup_all([0, 1]) == {0: MISS, 1: MISS}
    assert b.tier().worker != first
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}))
    c = sched([h.tierkv_tier(tmp_path / "kv2")], model=str(model))
    assert c.tier().worker != b.tier().worker


def test_two_revisions_of_one_hub_id_never_share_a_chunk(tmp_path):
    """A model named by its hub id: vLLM's OffloadingConfig gives the tier its name and KV
    dtype only, so two revisions (or the same weights quantized by vLLM) shared chunks. The tier
    now reads the revision, the config's commit and vLLM's quantization from the vllm_config
    of the vLLM scheduler building it (here vLLM's own OffloadingConnectorScheduler)."""
    made: list = []

    def build(revision: str, quantization=None, commit="c1") -> h.Sched:
        hf = SimpleNamespace(_commit_hash=commit)
        s = h.built_by_vllm(
            h.make_spec([h.tierkv_tier(tmp_path / "kv")], model="org/tiny"),
            model="org/tiny", revision=revision, quantization=quantization, hf_config=hf,
        )
        made.append(s)
        return s

    try:
        v1 = build("v1")
        v1.store([0, 1])
        first = v1.tier().worker
        v1.close()
        again = build("v1")
        assert again.tier().worker == first and h.hits(again.lookup_all([0, 1])) == [0, 1]
        again.close()
        others = [build("v2"), build("v1", quantization="fp8"), build("v1", commit="c2")]
        assert len({first, *(s.tier().worker for s in others)}) == 4
        for s in others:
            assert s.lookup_all([0, 1]) == {0: MISS, 1: MISS}
    finally:
        for s in made:
            s.close()


def test_a_full_disk_fails_the_store_job_without_an_exception(sched):
    with tmpfs("256k") as mnt:
        s = sched([h.tierkv_tier(mnt)])
        s.store(list(range(8)))  # 8 x 64 KiB on 256 KiB: some cannot be written
        st = s.tier().tierkv_stats()
        assert st["failures"].get("store", 0) >= 1, st
        s.drop_primary()
        got = h.hits(s.lookup_all(list(range(8))))
        assert len(got) < 8 and exact(s, got)
        s.close()


def test_a_corrupt_chunk_fails_its_load_alone(sched, tmp_path):
    cfg = h.tierkv_tier(tmp_path, worker="w")
    s = sched([cfg])
    s.store(list(range(4)))
    path = Path(s.tier().store.path_of(fold_key(s.tier()._prefix, h.key(2))))
    s.close()
    with open(path, "r+b") as f:  # a byte of the payload changed
        f.seek(-100, os.SEEK_END)
        b = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    s = sched([cfg])
    res = s.lookup_all([0, 1, 2, 3])  # 2 is promoted, fails, then is a miss
    assert h.hits(res) == [0, 1, 3] and res[2] is MISS, res
    assert exact(s, [0, 1, 3])
    assert s.tier().tierkv_stats()["failures"].get("load", 0) >= 1
    assert s.lookup_all([2]) == {2: MISS}


def test_a_missing_root_is_a_miss_never_an_exception(sched, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    s = sched([h.tierkv_tier(blocker / "kv")])  # cannot be made: under a regular file
    assert s.tier().store is None and s.tier().tierkv_stats()["failures"]["open"] == 1
    s.store([0, 1])
    assert s.tier().tierkv_stats()["failures"]["store"] >= 1
    s.drop_primary()
    assert s.lookup_all([0, 1]) == {0: MISS, 1: MISS}
    # A root deleted under a running tier: stores fail, chunks it had are misses.
    t = sched([h.tierkv_tier(tmp_path / "gone")])
    t.store([0, 1])
    t.drop_primary()
    while (tmp_path / "gone").exists():  # the store's background thread may write meanwhile
        shutil.rmtree(tmp_path / "gone", ignore_errors=True)
    t.store([5])
    t.drop_primary()
    assert t.lookup_all([0, 1, 5]) == {0: MISS, 1: MISS, 5: MISS}
    assert t.tier().tierkv_stats()["failures"]["store"] >= 1


def _drain_events(tier, told):
    """Collects the tier's KV events (the journal is followed on a thread of its own) until
    none has come for 0.3 s: `told` maps each OffloadKey to whether it was last told stored."""
    from vllm.v1.kv_offload.base import Locality, Medium

    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 0.3:
        for e in tier.take_events():
            quiet_since = time.monotonic()
            assert (e.medium, e.ownership, e.removal_expected) == (Medium.STORAGE, "tierkv", True)
            assert e.locality == Locality.LOCAL  # the test's tree is on this node's disk
            for k in e.keys:
                told[k] = not e.removed
        time.sleep(0.02)


def test_kv_events_tell_what_the_tier_stored_and_what_anyone_removed(sched, tmp_path):
    """With vLLM's KV events on, the tier's `take_events` yields STORAGE events for the chunks it
    stored and for their removal, whichever store of the worker removed them (its own
    evictions under the capacity, another process's removals), from the worker's event journal
    (docs/events.md): replayed, they are what the store holds of those chunks."""
    import tierkv_g3

    cfg = h.tierkv_tier(tmp_path, worker="vllm-events", capacity_files=6, negative_ttl=0)
    s = sched([cfg], events=True)
    tier = s.tier()
    told = {}
    for i in range(0, 12, 3):
        s.store([i, i + 1, i + 2])
        s.settle()
    _drain_events(tier, told)
    keys = [h.key(i) for i in range(12)]
    ours = {k: fold_key(tier._prefix, k) for k in keys}
    held = tier.store.lookup_many([ours[k] for k in keys], tree=True)
    present = {k for k, p in told.items() if p}
    assert present == {k for k, hd in zip(keys, held) if hd} and len(present) == 6, told
    assert set(told) == set(keys), "every chunk stored was told, then six removed"
    # Another process's store on the worker (shared, as the tier's) removes two of them.
    gone = sorted(present)[:2]
    other = tierkv_g3.Store(tier.root, tier.worker, sharing="shared", stats_interval=None)
    assert other.discard_many([ours[k] for k in gone]) == [True, True]
    other.close()
    _drain_events(tier, told)
    assert [told[k] for k in gone] == [False, False]
    assert {k for k, p in told.items() if p} == present - set(gone)


def test_without_kv_events_the_tier_tells_nothing_and_keeps_no_journal(sched, tmp_path):
    s = sched([h.tierkv_tier(tmp_path, worker="vllm-quiet")])
    s.store([0, 1])
    s.settle()
    assert list(s.tier().take_events()) == []
    assert not (Path(s.tier().store.dir) / "EVENTS").exists()
