"""tierkv_g3.sglang's HiCache v2 interface against the real SGLang on CPU.

What is real: SGLang's host pools (an `MHATokenToKVPoolHost` as the "kv" anchor, a second
MHA host pool as the TRAILING_PAGES sidecar `PoolName.SWA`, an `MLATokenToKVPoolHost` as
the ALL_PAGES sidecar `PoolName.INDEXER`), its backend factory (`dynamic`), its
`PoolTransfer`, `PoolTransferResult`, `HiCacheStorageExtraInfo`, `count_pool_hits` and the
hybrid controller's `_trailing_chain_groups`. test_through_sglangs_hybrid_cache_controller
runs SGLang's `HybridCacheController` itself (KV + SWA pools, its threads; the scheduler and
the parallel context stood in as in sglang_harness.py); the other tests call the backend as
it does: `register_mem_pool_host`, then `register_mem_host_pool_v2` per pool and
`on_host_pools_registered`; the KV pages by `batch_set_v1`/`batch_get_v1`, the sidecars by
`batch_set_v2`/`batch_get_v2` grouped by `_trailing_chain_groups`; the hit query by
`batch_exists_v2(keys, pool_transfers, extra_info)`. Run by tools/test.sh in .venv-engines/
as test_sglang.py is."""

from __future__ import annotations

import threading

import pytest

from conftest import fill_filesystem, require_engine  # noqa: E402

require_engine("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller", "sglang",
               "test_sglang_v2.py")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    count_pool_hits,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    _trailing_chain_groups,
)

import sglang_harness as h  # noqa: E402

N = 6  # pages of the request
SWA_WINDOW = 2  # the TRAILING_PAGES sidecar holds the last 2 pages before a cut


def keys(base: int = 1000) -> list:
    return h.hashes(list(range(base, base + N * h.PAGE)))


class Rank:
    """One rank's backend and its three real host pools, registered as SGLang's hybrid
    controller registers them."""

    def __init__(self, root, **cfg):
        _, self.kv = h.host_pool()
        _, self.swa = h.host_pool()
        _, self.idx = h.host_pool(mla=True, dtype=torch.bfloat16)
        self.b = h.backend(h.storage_config(str(root), **cfg), self.kv)
        for name, pool in ((PoolName.KV, self.kv), (PoolName.SWA, self.swa),
                           (PoolName.INDEXER, self.idx)):
            self.b.register_mem_host_pool_v2(pool, name)
        self.b.on_host_pools_registered()
        self.kv_i = self.kv.alloc(N * h.PAGE)
        self.idx_i = self.idx.alloc(N * h.PAGE)
        self.swa_i = self.swa.alloc(SWA_WINDOW * h.PAGE)

    def transfers(self, ks, cut=N, swa=True, idx=True):
        """The sidecar transfers of a request whose hit ends at page `cut`."""
        out = []
        if idx:
            out.append(PoolTransfer(name=PoolName.INDEXER, host_indices=self.idx_i[: cut * h.PAGE],
                                    keys=ks[:cut], hit_policy=PoolHitPolicy.ALL_PAGES))
        if swa:
            w = ks[max(0, cut - SWA_WINDOW) : cut]
            out.append(PoolTransfer(name=PoolName.SWA, host_indices=self.swa_i[: len(w) * h.PAGE],
                                    keys=w, hit_policy=PoolHitPolicy.TRAILING_PAGES))
        return out

    def backup(self, ks, cut=N, seed=1, **which):
        """The hybrid controller's `_page_backup`: sidecars by batch_set_v2 (one call per
        tail length, `_trailing_chain_groups`), the KV pages by batch_set_v1."""
        pages = {
            "kv": h.fill(self.kv, self.kv_i, seed),
            "indexer": h.fill(self.idx, self.idx_i, seed + 1),
            "swa": h.fill(self.swa, self.swa_i, seed + 2),
        }
        results = {}
        for extra, ts in _trailing_chain_groups([], ks[:cut], self.transfers(ks, cut, **which)):
            results.update(self.b.batch_set_v2(ts, extra_info=extra))
        kv_ok = self.b.batch_set_v1(ks[:cut], self.kv_i[: cut * h.PAGE],
                                    HiCacheStorageExtraInfo(prefix_keys=[]))
        return pages, count_pool_hits(results), kv_ok

    def restore(self, ks, cut=N, **which):
        """The prefetch io: KV by batch_get_v1, sidecars by batch_get_v2; each pool's pages."""
        for pool in (self.kv, self.idx, self.swa):
            pool.kv_buffer.view(torch.uint8).zero_()
        kv_ok = self.b.batch_get_v1(ks[:cut], self.kv_i[: cut * h.PAGE])
        res = {}
        for extra, ts in _trailing_chain_groups([], ks[:cut], self.transfers(ks, cut, **which)):
            res.update(self.b.batch_get_v2(ts, extra_info=extra))
        got = {
            "kv": h.page_bytes(self.kv, self.kv_i[: cut * h.PAGE]),
            "indexer": h.page_bytes(self.idx, self.idx_i[: cut * h.PAGE]),
            "swa": h.page_bytes(self.swa, self.swa_i),
        }
        return kv_ok, res, got

    def exists(self, ks, **which):
        return self.b.batch_exists_v2(ks, self.transfers(ks, **which),
                                      HiCacheStorageExtraInfo(prefix_keys=None))


def test_each_pool_round_trips_byte_exact_in_its_own_worker(tmp_path):
    r = Rank(tmp_path)
    ks = keys()
    pages, hits, kv_ok = r.backup(ks)
    assert kv_ok == [True] * N and hits == {"indexer": N, "swa": SWA_WINDOW}
    # One worker per pool, the pool's name in the sidecars' ids.
    names = sorted(p.name for p in (tmp_path / "v1").iterdir())
    assert len(names) == 3 and sum(".indexer." in n for n in names) == 1
    assert sum(".swa." in n for n in names) == 1
    res = r.exists(ks)
    assert res.kv_hit_pages == N and res.extra_pool_hit_pages == {"kv": N, "indexer": N, "swa": N}
    kv_ok, got_ok, got = r.restore(ks)
    assert kv_ok == [True] * N and got_ok == {"indexer": [True] * N, "swa": [True] * SWA_WINDOW}
    assert got["kv"] == pages["kv"] and got["indexer"] == pages["indexer"]
    assert got["swa"] == pages["swa"]
    # The pools hold different bytes under the same keys.
    assert pages["kv"] != pages["swa"][:1] + pages["kv"][1:]
    assert r.b.tierkv_stats()["failures"] == {}
    # SGLang's flush of the storage tier empties every pool's worker.
    r.b.clear()
    assert r.exists(ks).kv_hit_pages == 0
    assert r.b.pool_stores["swa"].contains_many(ks[-2:]) == [False, False]
    assert r.b.pool_stores["indexer"].contains_many(ks) == [False] * N
    r.b.close()


def test_a_missing_sidecar_page_shrinks_the_hit_per_policy(tmp_path):
    r = Rank(tmp_path)
    ks = keys()
    r.backup(ks)  # SWA window ending at page 6 (pages 5, 6)
    r.backup(ks, cut=3, idx=False)  # and the window ending at page 3 (pages 2, 3)
    res = r.exists(ks)
    # TRAILING_PAGES: only prefixes whose last 2 pages are in the SWA pool are restorable
    # (2 is not: page 1 was never in it).
    assert res.kv_hit_pages == N and res.restorable_prefix_pages == [3, 6]
    idx_store, swa_store = r.b.pool_stores["indexer"], r.b.pool_stores["swa"]
    # ALL_PAGES: indexer page 5 gone (page 6 still there) -> prefixes up to 4 only; of
    # those, SWA serves 3. (A removal takes the chain's later pages with it: page 6 is
    # stored again on its own.)
    assert idx_store.remove_many([ks[4]]) == [True]
    six = PoolTransfer(name=PoolName.INDEXER, host_indices=r.idx_i[5 * h.PAGE :], keys=ks[5:])
    assert r.b.batch_set_v2([six]) == {"indexer": [True]}
    assert idx_store.contains_many(ks) == [True] * 4 + [False, True]
    res = r.exists(ks)
    assert res.kv_hit_pages == 3 and res.restorable_prefix_pages == [3]
    # Each pool's own boundary.
    assert res.extra_pool_hit_pages == {"kv": N, "indexer": 4, "swa": N}
    # SWA page 2 gone: the window ending at 3 is broken.
    assert swa_store.remove_many([ks[1]]) == [True]
    res = r.exists(ks)
    assert res.kv_hit_pages == 0 and res.restorable_prefix_pages == []
    # The KV pool alone (no sidecar transfers) still has its 6 pages.
    assert r.b.batch_exists_v2(ks, []).kv_hit_pages == N
    # BLOCK_GROUPS is not supported: no verdict, it never gates the KV hit.
    bg = PoolTransfer(name=PoolName.INDEXER, keys=ks, hit_policy=PoolHitPolicy.BLOCK_GROUPS,
                      block_pages=2, group_pages=2)
    res = r.b.batch_exists_v2(ks, [bg])
    assert res.kv_hit_pages == N and "indexer" not in res.extra_pool_hit_pages
    # A missing KV page cuts every pool.
    assert r.b.store.remove_many([ks[2]]) == [True]
    assert r.b.batch_exists_v2(ks, r.transfers(ks, swa=False)).kv_hit_pages == 2
    assert r.b.tierkv_stats()["failures"] == {}
    r.b.close()


def test_pool_names_are_part_of_the_worker_id():
    """Pools of one geometry never share a worker; names alike in their last characters
    (the readable part of the id) differ in its digest; the KV pool's id is v1's."""
    from tierkv_g3.sglang import worker_id

    _, pool = h.host_pool()
    cfg = h.storage_config("/x")
    ids = {worker_id(cfg, pool, n) for n in PoolName}
    assert len(ids) == len(PoolName) and all(len(i) <= 64 for i in ids)
    assert worker_id(cfg, pool, PoolName.KV) == worker_id(cfg, pool)
    c1 = worker_id(cfg, pool, PoolName.DEEPSEEK_V4_C1_INDEXER_SCALE).split(".")
    c2 = worker_id(cfg, pool, PoolName.DEEPSEEK_V4_C2_INDEXER_SCALE).split(".")
    assert c1[2] == c2[2] and c1 != c2


def test_an_mla_models_sidecars_are_shared_by_its_ranks_but_mamba(tmp_path):
    """An MLA model's indexer pages are replicated like its KV pages: rank 0 (SGLang's
    storage writer) writes them, rank 1 finds them; Mamba state is per rank."""
    r0 = Rank(tmp_path, tp_rank=0, tp_size=2, mla=True)
    r1 = Rank(tmp_path, tp_rank=1, tp_size=2, mla=True)
    assert r0.b.pool_stores["indexer"].worker == r1.b.pool_stores["indexer"].worker
    assert r0.b.pool_stores["swa"].worker.split(".")[-2] == "mla"
    ks = keys()
    _, hits, _ = r1.backup(ks)  # not the writer: nothing stored, all reported done
    assert hits == {"indexer": N, "swa": SWA_WINDOW} and r0.exists(ks).kv_hit_pages == 0
    assert r0.b.pool_stores["indexer"].contains_many(ks) == [False] * N
    pages, hits, _ = r0.backup(ks)
    assert hits == {"indexer": N, "swa": SWA_WINDOW}
    assert r1.exists(ks).kv_hit_pages == N
    _, ok, got = r1.restore(ks)
    assert ok == {"indexer": [True] * N, "swa": [True] * SWA_WINDOW}
    assert got["indexer"] == pages["indexer"] and got["swa"] == pages["swa"]
    from tierkv_g3.sglang import worker_id

    cfg = [h.storage_config("/x", tp_rank=r, tp_size=2, mla=True) for r in (0, 1)]
    assert worker_id(cfg[0], r0.idx, PoolName.MAMBA) != worker_id(cfg[1], r0.idx, PoolName.MAMBA)
    r0.b.close()
    r1.b.close()


def test_clear_on_every_rank_of_an_mla_model_keeps_every_rank_working(tmp_path):
    """SGLang's `/clear_hicache_storage_backend` runs `clear()` on every
    rank. At TP=2 with MLA (one worker for both ranks), rank 0 removed the directory and
    reopened it, rank 1 kept a descriptor of the removed one and saw 0 of 6 pages from then
    on; rank 1's clear also removed the sidecar directories rank 0 had just reopened, and
    every later batch_set_v2 failed with ENOENT: the disk tier dead until a restart. Now
    clear() empties the workers through the store and nothing else: after both ranks clear,
    nothing old is found, and what rank 0 backs up next, rank 1 finds and restores."""
    r0 = Rank(tmp_path, tp_rank=0, tp_size=2, mla=True)
    r1 = Rank(tmp_path, tp_rank=1, tp_size=2, mla=True)
    ks, later = keys(), keys(base=9000)
    r0.backup(ks)
    assert r1.exists(ks).kv_hit_pages == N
    r0.b.clear()
    r1.b.clear()
    assert r0.exists(ks).kv_hit_pages == 0 and r1.exists(ks).kv_hit_pages == 0
    pages, hits, kv_ok = r0.backup(later, seed=7)
    assert kv_ok == [True] * N and hits == {"indexer": N, "swa": SWA_WINDOW}
    assert r1.exists(later).kv_hit_pages == N
    kv_ok, ok, got = r1.restore(later)
    assert kv_ok == [True] * N and ok == {"indexer": [True] * N, "swa": [True] * SWA_WINDOW}
    assert got == pages
    for r in (r0, r1):
        assert r.b.tierkv_stats()["failures"] == {}
        r.b.close()


def test_a_fresh_backend_over_the_same_root_keeps_the_hits(tmp_path):
    r = Rank(tmp_path)
    ks = keys()
    pages, _, _ = r.backup(ks)
    r.b.close()
    r2 = Rank(tmp_path)
    res = r2.exists(ks)
    assert res.kv_hit_pages == N and res.extra_pool_hit_pages == {"kv": N, "indexer": N, "swa": N}
    kv_ok, ok, got = r2.restore(ks)
    assert kv_ok == [True] * N and ok == {"indexer": [True] * N, "swa": [True] * SWA_WINDOW}
    assert got == pages
    # Another TP rank's sidecars are not this rank's.
    r3 = Rank(tmp_path, tp_rank=1, tp_size=2)
    assert r3.exists(ks).kv_hit_pages == 0
    r2.b.close()
    r3.b.close()


def test_a_corrupt_sidecar_block_is_a_miss(tmp_path):
    r = Rank(tmp_path)
    ks = keys()
    pages, _, _ = r.backup(ks)
    path = r.b.pool_stores["indexer"].path_of(ks[3])
    r.b.close()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    r2 = Rank(tmp_path)  # a fresh store verifies each file on its first read
    kv_ok, ok, got = r2.restore(ks)
    assert kv_ok == [True] * N and ok["swa"] == [True] * SWA_WINDOW
    assert ok["indexer"] == [True, True, True, False, True, True]
    assert count_pool_hits(ok)["indexer"] == 3 and got["kv"] == pages["kv"]
    r2.b.close()


def test_a_missing_root_or_unregistered_pool_is_false_never_an_exception(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    r = Rank(tmp_path / "file" / "kv")
    assert r.b.store is None and r.b.pool_stores == {}
    ks = keys()
    _, hits, kv_ok = r.backup(ks)
    assert kv_ok == [False] * N and hits == {"indexer": 0, "swa": 0}
    res = r.exists(ks)
    assert res.kv_hit_pages == 0 and res.extra_pool_hit_pages == {}
    _, ok, _ = r.restore(ks)
    assert ok == {"indexer": [False] * N, "swa": [False] * SWA_WINDOW}
    f = r.b.tierkv_stats()["failures"]
    assert f["open"] == 3 and f["batch_set_v2"] >= 1 and f["batch_get_v2"] >= 1
    # A pool name never registered, and host indices of the wrong length: False, counted.
    r2 = Rank(tmp_path / "ok")
    t = PoolTransfer(name=PoolName.MAMBA, host_indices=r2.swa_i, keys=ks[:2])
    assert r2.b.batch_set_v2([t]) == {"mamba": [False, False]}
    bad = PoolTransfer(name=PoolName.INDEXER, host_indices=r2.idx_i[: 4 * h.PAGE], keys=ks[:2])
    assert r2.b.batch_set_v2([bad]) == {"indexer": [False, False]}
    assert r2.b.pool_stores["indexer"].contains_many(ks[:2]) == [False, False]
    r2.backup(ks)
    bad = PoolTransfer(name=PoolName.SWA, host_indices=r2.swa_i[:3], keys=ks[:2])
    assert r2.b.batch_get_v2([bad]) == {"swa": [False, False]}
    assert r2.b.tierkv_stats()["failures"] == {"batch_set_v2": 2, "batch_get_v2": 1}
    r2.b.close()


def test_a_full_disk_fails_the_sidecar_backup_without_an_exception(tiny_tmpfs):
    r = Rank(tiny_tmpfs / "kv")
    ks = keys()
    fill_filesystem(tiny_tmpfs / "filler")
    _, hits, kv_ok = r.backup(ks)
    assert hits["indexer"] < N and kv_ok != [True] * N
    assert r.b.tierkv_stats()["failures"].get("batch_set_v2", 0) >= 1
    assert r.exists(ks).kv_hit_pages < N
    r.b.close()


def hybrid_controller(root):
    """SGLang's real HybridCacheController on CPU: a HostPoolGroup of the KV host pool (the
    anchor) and an SWA host pool, the backend attached by its factory (`dynamic`), which
    registers both pools through register_mem_host_pool_v2; its storage threads running.
    The parallel context is stood in as in sglang_harness.controller."""
    import sglang.srt.managers.cache_controller as cc
    import sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller as hc
    import torch.distributed as dist
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry

    for m in (cc, hc):
        m.get_parallel = h._parallel
        m.is_dp_attention_enabled = lambda: False
    h._init_dist()
    kv, host = h.host_pool()
    swa_dev, swa = h.host_pool()
    group = HostPoolGroup([
        PoolEntry(PoolName.KV, host, kv, lambda i: i, is_primary_index_anchor=True),
        PoolEntry(PoolName.SWA, swa, swa_dev, lambda i: i),
    ])
    alloc = TokenToKVPoolAllocator(h.DEVICE_TOKENS, kv.dtype, "cpu", kv, False)
    return hc.HybridCacheController(
        alloc, group, h.PAGE, dist.group.WORLD, threading.Event(), storage_backend="dynamic",
        model_name="tiny-hybrid", storage_backend_extra_config=h.extra_config(str(root)),
    ), host, swa


def swa_transfer(ks, host_indices=None):
    return PoolTransfer(name=PoolName.SWA, host_indices=host_indices, keys=ks[-SWA_WINDOW:],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def hybrid_prefetch(ctrl, host, swa, toks, ks):
    """The read path as the hybrid radix cache drives it: the hit query (batch_exists_v2 on
    the prefetch thread), host pages for the KV hit and the SWA window, the KV transfer
    (batch_get_v1) and then the SWA one (batch_get_v2) on the io thread."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    ctrl.prefetch(CacheRequestHandle("req", 0), toks, extra_pools=[swa_transfer(ks)])
    op = ctrl.prefetch_hit_queue.get(timeout=60)
    if op.storage_hit_count == 0:
        return op, None
    host.kv_buffer.view(torch.uint8).zero_()
    swa.kv_buffer.view(torch.uint8).zero_()
    op.host_indices = host.alloc(op.storage_hit_count)
    op.pool_transfers[0].host_indices = swa.alloc(SWA_WINDOW * h.PAGE)
    ctrl.prefetch_buffer.put(op)
    acks = []
    while not acks or not acks[-1].completed_req:
        acks.append(ctrl.ack_prefetch_queue.get(timeout=60))
    got = {
        "kv": h.page_bytes(host, op.host_indices),
        "swa": h.page_bytes(swa, op.pool_transfers[0].host_indices),
        "pool_hits": [a.pool_hits for a in acks if a.pool_hits],
    }
    host.free(op.host_indices)
    swa.free(op.pool_transfers[0].host_indices)
    return op, got


def test_through_sglangs_hybrid_cache_controller(tmp_path):
    """Backup (batch_set_v1 + batch_set_v2 on the backup thread), the hit query and the
    restore, byte-exact per pool, all driven by SGLang's HybridCacheController; then a
    fresh controller over the same root hits; then a missing SWA page cuts the hit."""
    toks = list(range(1000, 1000 + N * h.PAGE))
    ks = h.hashes(toks)
    ctrl, host, swa = hybrid_controller(tmp_path)
    try:
        b = ctrl.storage_backend
        assert sorted(b.pools) == ["kv", "swa"] and list(b.pool_stores) == ["swa"]
        idx, sidx = host.alloc(N * h.PAGE), swa.alloc(SWA_WINDOW * h.PAGE)
        pages, spages = h.fill(host, idx, 1), h.fill(swa, sidx, 2)
        ctrl.write_storage(idx, toks, hash_value=ks, extra_pools=[swa_transfer(ks, sidx)])
        op = ctrl.ack_backup_queue.get(timeout=60)
        assert op.completed_tokens == N * h.PAGE
        assert op.pool_storage_result.extra_pool_hit_pages == {"swa": SWA_WINDOW}
        host.free(idx)
        swa.free(sidx)
    finally:
        h.stop(ctrl)
    ctrl, host, swa = hybrid_controller(tmp_path)  # restart: a fresh backend, same root
    try:
        b = ctrl.storage_backend
        op, got = hybrid_prefetch(ctrl, host, swa, toks, ks)
        assert op.storage_hit_count == N * h.PAGE
        assert op.pool_storage_result.restorable_prefix_pages == [N]
        assert got["kv"] == pages and got["swa"] == spages
        assert got["pool_hits"][0]["swa"] == SWA_WINDOW
        # The SWA window's first page gone: no prefix has its window, the hit is 0.
        assert b.pool_stores["swa"].remove_many([ks[-2]]) == [True]
        op, got = hybrid_prefetch(ctrl, host, swa, toks, ks)
        assert op.storage_hit_count == 0 and b.batch_exists(ks) == N
        assert b.tierkv_stats()["failures"] == {}
        assert ctrl.backup_thread.is_alive() and ctrl.prefetch_thread.is_alive()
    finally:
        h.stop(ctrl)
