"""vLLM's real tiering offload stack on CPU, without an engine: a `TieringOffloadingSpec` built
from an `OffloadingConfig` (what vLLM's OffloadingConnector builds from its config), its
`TieringOffloadingManager` with the CPU primary tier (a /dev/shm region) and the secondary
tiers of the config, built by vLLM's `SecondaryTierFactory`. The scheduler's part is played
here: the calls the OffloadingConnector's scheduler side makes (on_new_request, prepare_store,
complete_store, lookup, on_schedule_end, prepare_load, complete_load, on_request_finished),
and the GPU's part is a copy into or out of the primary tier's memoryview. Used by
test_vllm_tier.py and tools/vllm-tier-bench.py; run as a script it stores or checks chunks
in a fresh process (the restart test)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

TIERKV = {"type": "TierkvSecondaryTier", "module_path": "tierkv_g3.vllm"}
IDLE = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def tierkv_tier(root: str, **kw: Any) -> Dict[str, Any]:
    """The secondary_tiers entry of our tier (as a user writes it in --kv-transfer-config)."""
    return {**TIERKV, "root": str(root), "stats_interval": None, **kw}


def fs_tier(root: str) -> Dict[str, Any]:
    """vLLM's built-in `fs` tier."""
    return {"type": "fs", "root_dir": str(root), "n_read_threads": 2, "n_write_threads": 2}


def make_spec(
    tiers: List[Dict[str, Any]],
    chunk_bytes: int = 64 << 10,
    n_chunks: int = 32,
    model: str = "test/tiny-llama",
    dtype: str = "float16",
    events: bool = False,
) -> TieringOffloadingSpec:
    """The spec vLLM builds for `--kv-transfer-config` with these secondary tiers: one
    KV-cache group, 16 tokens per block, one block per chunk, one worker; the primary tier
    holds `n_chunks` chunks of `chunk_bytes` (a multiple of the page size)."""
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes,
        enable_kv_cache_events=events,
        extra_config={"cpu_bytes_to_use": chunk_bytes * n_chunks, "secondary_tiers": tiers},
        engine_id=f"tierkv-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return TieringOffloadingSpec(config)


def built_by_vllm(spec: TieringOffloadingSpec, **model_config: Any) -> "Sched":
    """A Sched whose manager (and so our tier) vLLM's own `OffloadingConnectorScheduler`
    built, as in a server: inside its `__init__`, with a `vllm_config` whose model config has
    `model_config`'s fields (model, revision, quantization, hf_config) beside the spec's."""
    from types import SimpleNamespace

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(**model_config),
        cache_config=SimpleNamespace(prefix_cache_retention_interval=None, enable_prefix_caching=True),
        parallel_config=SimpleNamespace(world_size=1, decode_context_parallel_size=1),
        speculative_config=None,
    )
    group = spec.config.groups[0]
    attention = FullAttentionSpec(
        block_size=group.tokens_per_block, num_kv_heads=1, head_size=64, dtype=torch.float16
    )
    groups = SimpleNamespace(kv_cache_groups=[KVCacheGroupSpec(list(group.layer_names), attention)])
    OffloadingConnectorScheduler(spec, vllm_config, groups)
    return Sched(spec)


def key(i: int, group: int = 0) -> bytes:
    """vLLM's OffloadKey of chunk i: a 32-byte block hash and a group index."""
    return make_offload_key(i.to_bytes(8, "little") * 4, group)


def payload(i: int, nbytes: int) -> np.ndarray:
    """Chunk i's bytes: distinct per chunk and per position."""
    j = np.arange(nbytes, dtype=np.int64)
    return ((j * 7 + i * 131 + (j >> 12) * 13) % 251).astype(np.uint8)


class Sched:
    """Plays vLLM's scheduler (OffloadingConnector's scheduler side) against a manager."""

    def __init__(self, spec: TieringOffloadingSpec):
        self.spec = spec
        self.mgr = spec.get_manager()
        view = self.mgr.primary_tier.get_kv_memoryview()
        self.primary = np.asarray(view).view(np.uint8).reshape(view.shape[0], -1)
        self.chunk_bytes = view.strides[0]
        self.n = 0

    def tier(self, i: int = 0) -> Any:
        return self.mgr.secondary_tiers[i]

    def ctx(self) -> ReqContext:
        self.n += 1
        c = ReqContext(req_id=f"req-{self.n}")
        self.mgr.on_new_request(c)
        return c

    def step(self) -> None:
        self.mgr.on_schedule_end(IDLE)

    def settle(self, timeout: float = 30.0) -> None:
        """Steps until no transfer is in flight."""
        deadline = time.monotonic() + timeout
        while self.mgr.has_pending_work():
            assert time.monotonic() < deadline, "transfers did not finish"
            self.step()
            time.sleep(0.002)
        self.step()

    def store(self, ids: List[int], data: Optional[List[np.ndarray]] = None) -> List[bytes]:
        """One request offloads chunks `ids` (GPU -> primary, then vLLM cascades them to every
        secondary tier); returns the keys it stored in the primary tier."""
        c = self.ctx()
        keys = [key(i) for i in ids]
        out = self.mgr.prepare_store(keys, c)
        assert out is not None, "the primary tier is full"
        stored = set(out.keys_to_store)
        for k, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
            i = ids[keys.index(k)]
            self.primary[int(cid)] = data[ids.index(i)] if data else payload(i, self.chunk_bytes)
        if stored:
            self.mgr.complete_store(list(out.keys_to_store), c)
        self.mgr.on_request_finished(c)
        self.settle()
        return list(stored)

    def drop_primary(self) -> None:
        """vLLM's reset_cache (reset_prefix_cache, sleep): drains the tiers, empties the
        primary tier; the secondary tiers keep their chunks."""
        self.mgr.reset_cache()

    def lookup_all(self, ids: List[int], timeout: float = 30.0) -> Dict[int, LookupResult]:
        """One request looks chunks up until each is HIT or MISS (a secondary hit starts a
        promotion: HIT_PENDING, then HIT once loaded; RETRY: asked again next step)."""
        c = self.ctx()
        final: Dict[int, LookupResult] = {}
        deadline = time.monotonic() + timeout
        while len(final) < len(ids):
            assert time.monotonic() < deadline, f"lookups did not settle: {final}"
            for i in ids:
                if i in final:
                    continue
                r = self.mgr.lookup(key(i), c)
                if r in (LookupResult.HIT, LookupResult.MISS):
                    final[i] = r
            self.step()
            time.sleep(0.002)
        self.mgr.on_request_finished(c)
        return final

    def read(self, ids: List[int]) -> List[np.ndarray]:
        """Chunks (HIT in the primary tier) as the GPU load reads them."""
        c = self.ctx()
        keys = [key(i) for i in ids]
        spec = self.mgr.prepare_load(keys, c)
        out = [self.primary[int(cid)].copy() for cid in spec.chunk_ids]
        self.mgr.complete_load(keys, c)
        self.mgr.on_request_finished(c)
        return out

    def close(self) -> None:
        if self.mgr is not None:
            del self.primary  # the primary region's mmap cannot close under an export
            self.mgr.shutdown()
            self.mgr = None


def hits(results: Dict[int, LookupResult]) -> List[int]:
    return sorted(i for i, r in results.items() if r is LookupResult.HIT)


def check(tier: Dict[str, Any], n: int) -> Dict[str, Any]:
    """Chunks 0..n-1 looked up and promoted through a manager with this one tier."""
    s = Sched(make_spec([tier]))
    got = hits(s.lookup_all(list(range(n))))
    exact = [i for i, b in zip(got, s.read(got)) if np.array_equal(b, payload(i, s.chunk_bytes))]
    t = s.tier()
    out = {"hits": got, "exact": exact, "stats": getattr(t, "tierkv_stats", dict)()}
    s.close()
    return out


def main() -> None:
    """`store` chunks 0..n-1 through a fresh manager with these tiers, or `check` them
    through a fresh manager per tier (the restart test)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["store", "check"])
    ap.add_argument("tiers", help="JSON list of secondary tier configs")
    ap.add_argument("n", type=int)
    a = ap.parse_args()
    tiers = json.loads(a.tiers)
    if a.mode == "check":
        json.dump([check(t, a.n) for t in tiers], sys.stdout, default=str)
        return
    s = Sched(make_spec(tiers))
    s.store(list(range(a.n)))
    s.close()
    json.dump({"stored": a.n}, sys.stdout)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main()
