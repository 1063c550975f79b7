"""tierkv as a vLLM KV connector (``KVConnectorBase_V1``): a disk tier under vLLM's paged KV
cache, shared by engine restarts and by the engines that open the same root.

Attach it with::

    --kv-transfer-config '{"kv_connector": "TierkvConnector",
      "kv_connector_module_path": "tierkv_g3.vllm_connector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"root": "/mnt/nvme/kvcache",
                                    "capacity_bytes": 1099511627776}}'

One tierkv block is one vLLM block (``block_size`` tokens) of every attention layer of one
TP/PP rank, keyed by the blake3 chain hash of its tokens (:func:`tierkv_g3.chain_hashes`; a
request's LoRA, cache salt and multimodal hashes fold into the chain's root). Everything that
changes a block's bytes (model, revision, dtypes, block size, the KV layout, the ranks) is
hashed into the worker id, ``vllm.<model>.b<block>.tp<r>of<n>.<16 hex>``, so two models or two
shardings never share a block.

- Scheduler side: ``get_num_new_matched_tokens`` asks ``contains_prefix`` of rank 0's worker
  (a read-only ``shared`` store: it sees the workers' puts at once) for the prompt's full
  blocks, the last prompt token excluded (vLLM computes at least one token); the hit is loaded
  synchronously in the step that schedules the request.
- Worker side: ``register_kv_caches`` maps each block's regions in the engine's KV tensors
  (one contiguous region per layer per block in the CPU layout, merged when adjacent);
  ``start_load_kv`` reads the matched blocks straight into them
  (``get_many_into_vectored``), ``wait_for_save`` writes the blocks the step completed from
  them (``put_many_vectored``): no copy on either side. Only prompt blocks are stored.
- Failures are misses: nothing raises into vLLM. A store that cannot be opened makes every
  lookup a miss; a block that cannot be read (deleted, corrupt: its checksum) is reported to
  vLLM as a load error (``get_block_ids_with_load_errors``), and vLLM recomputes it (the
  connector sets ``kv_load_failure_policy`` to ``"recompute"``: vLLM's default, ``"fail"``,
  would fail the request). Each failure is counted (``tierkv_stats()["failures"]``) and
  logged at most once per ``log_interval`` seconds per operation.

Extra config: ``root`` (required), any keyword argument of :class:`tierkv_g3.Store`
(``capacity_bytes``, ``capacity_files``, ``policy``, ``engine``, ``verify``, ...; ``sharing``
defaults to ``"shared"`` here, so several engines, or DP replicas, can use one root), and
``log_interval`` (seconds, default 10).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import Store, chain_hashes
from ._engines import STORE_OPTIONS, FailureLog, close_store, store_options

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)



def _slug(s: str, n: int) -> str:
    """`s` in the worker id's alphabet ([A-Za-z0-9_.-]), its last `n` characters."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", s.rstrip("/").split("/")[-1]).strip(".") or "model"
    return s[-n:]


def worker_id(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", tp: int, pp: int) -> str:
    """The tierkv worker id of TP rank `tp`, PP rank `pp`: the model, its revision and dtype,
    the KV cache's dtype, block size and per-layer spec, the layer names and the parallel
    sizes are hashed into it (the scheduler and each worker compute it from the same config)."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    groups = [(list(g.layer_names), repr(g.kv_cache_spec)) for g in kv_cache_config.kv_cache_groups]
    ident = {
        "model": str(mc.model),
        "revision": str(getattr(mc, "revision", None)),
        "dtype": str(mc.dtype),
        "quantization": str(getattr(mc, "quantization", None)),
        "cache_dtype": str(cc.cache_dtype),
        "block_size": int(cc.block_size),
        "groups": groups,
        "tp": (tp, pc.tensor_parallel_size),
        "pp": (pp, pc.pipeline_parallel_size),
    }
    digest = hashlib.sha256(repr(sorted(ident.items())).encode()).hexdigest()[:16]
    rank = f"tp{tp}of{pc.tensor_parallel_size}"
    if pc.pipeline_parallel_size > 1:
        rank += f"pp{pp}"
    return f"vllm.{_slug(str(mc.model), 20)}.b{cc.block_size}.{rank}.{digest}"


def _root_parent(request: "Request") -> Optional[bytes]:
    """The chain's parent of a request's first block: None for plain text requests; a hash of
    the LoRA adapter, cache salt and multimodal inputs otherwise (they change the KV)."""
    extras = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        extras.append(("lora", getattr(lora, "lora_name", None), getattr(lora, "lora_path", None)))
    if getattr(request, "cache_salt", None):
        extras.append(("salt", request.cache_salt))
    for f in getattr(request, "mm_features", None) or []:
        extras.append(("mm", getattr(f, "identifier", None), repr(getattr(f, "mm_position", None))))
    if not extras:
        return None
    return hashlib.blake2b(repr(extras).encode(), digest_size=32).digest()


@dataclass
class _Job:
    """One request's blocks to load or save this step: their keys and the engine's block ids."""

    req_id: str
    keys: List[str]
    block_ids: List[int]


@dataclass
class TierkvConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, per step: the blocks to load before the forward and the blocks
    the forward completes, to save after it."""

    loads: List[_Job] = field(default_factory=list)
    saves: List[_Job] = field(default_factory=list)


@dataclass
class _Req:
    """The scheduler's view of a live request: its prompt blocks' keys and its block ids."""

    keys: List[str]
    prompt_tokens: int
    block_ids: List[int] = field(default_factory=list)
    matched_from: int = 0  # tokens vLLM had (block-aligned) at the last lookup
    hit_blocks: int = 0  # leading prompt blocks the store held at the last lookup


class TierkvConnector(KVConnectorBase_V1):
    """vLLM KV connector over a tierkv store (see the module's docstring)."""

    _cache_hit_source = CacheHitSource.DISK

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig",
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.root = str(extra.get("root") or "")
        unknown = set(extra) - set(STORE_OPTIONS) - {"root", "log_interval"}
        self.options: Dict[str, Any] = store_options(extra)
        self.options.setdefault("sharing", "shared")
        self.log_interval = float(extra.get("log_interval", 10.0))
        self.failures = FailureLog(logger, "tierkv vLLM connector", self.log_interval)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.store: Optional[Store] = None
        self.worker: Optional[str] = None
        self._lock = threading.Lock()
        self._counts = {"lookups": 0, "hit_blocks": 0, "loaded_blocks": 0, "saved_blocks": 0}
        self._usable = self._check_config(kv_cache_config, unknown)
        # Scheduler side.
        self._reqs: Dict[str, _Req] = {}
        self._loads: Dict[str, _Job] = {}
        self._next_open = 0.0
        # Worker side.
        self._regions: List[Tuple[int, int]] = []  # (offset in the backing buffer, bytes)
        self._block_stride: List[int] = []
        self._buf: Any = None
        self._block_bytes = 0
        self._invalid: set = set()
        if role == KVConnectorRole.SCHEDULER and self._usable:
            self.worker = worker_id(vllm_config, kv_cache_config, 0, 0)
            self._recompute_failed_loads()

    def _recompute_failed_loads(self) -> None:
        """Sets vLLM's kv_load_failure_policy to "recompute" (its default, "fail", fails the
        request): a block evicted after the lookup, deleted or corrupt is a cache miss. The
        scheduler reads the policy right after it builds this connector."""
        cfg = self._kv_transfer_config
        if getattr(cfg, "kv_load_failure_policy", "recompute") != "recompute":
            logger.warning(
                "tierkv vLLM connector: kv_load_failure_policy %r -> 'recompute' (a block "
                "that cannot be read is a cache miss, recomputed)", cfg.kv_load_failure_policy,
            )
            cfg.kv_load_failure_policy = "recompute"

    def _check_config(self, kv_cache_config: "KVCacheConfig", unknown: set) -> bool:
        """Whether this connector can serve the engine; logged (never raised) when not."""
        problem = None
        if not self.root:
            problem = 'the extra config needs "root"'
        elif unknown:
            problem = f"unknown extra config keys {sorted(unknown)}"
        elif len(kv_cache_config.kv_cache_groups) != 1:
            problem = "one KV cache group (full attention) is supported"
        if problem is not None:
            self._fail("config", problem)
            return False
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        """A best-effort cache: a dropped save is a future miss."""
        return False

    # -- failures and counters -------------------------------------------------------------

    def _fail(self, op: str, err: Any) -> None:
        """Counts a failure of `op` and logs it, at most once per log_interval per op."""
        self.failures.fail(op, err)

    def tierkv_stats(self) -> Dict[str, Any]:
        """This side's counters (lookups, hit, loaded and saved blocks), its failures per
        operation, the worker id and the store's own counters (`Store.stats()`)."""
        with self._lock:
            out: Dict[str, Any] = dict(self._counts)
            out["failures"] = self.failures.snapshot()
        out["worker"] = self.worker
        out["role"] = self.role.name.lower()
        try:
            out["store"] = self.store.stats() if self.store is not None else None
        except Exception:  # noqa: BLE001
            out["store"] = None
        return out

    def shutdown(self) -> None:
        store, self.store = self.store, None
        close_store(store, self._fail)

    # -- scheduler side ----------------------------------------------------------------------

    def _scheduler_store(self) -> Optional[Store]:
        """Rank 0's worker, read-only and shared (no lock; a block a worker publishes is a hit
        at once). Opened on first use, retried at most once a second while it fails (the
        tree appears when a worker first opens it)."""
        if self.store is None and self._usable and time.monotonic() >= self._next_open:
            self._next_open = time.monotonic() + 1.0
            try:
                self.store = Store(
                    self.root, self.worker, read_only=True, sharing="shared", negative_ttl=0.0,
                    stats_interval=None,
                )
            except Exception as e:  # noqa: BLE001
                self._fail("open", e)
        return self.store

    def _track(self, request: "Request") -> Optional[_Req]:
        """The request's state, made on first sight: the keys of its prompt's full blocks."""
        st = self._reqs.get(request.request_id)
        if st is None:
            tokens = request.prompt_token_ids
            if tokens is None or getattr(request, "prompt_embeds", None) is not None:
                return None
            n = len(tokens) // self.block_size * self.block_size
            keys = chain_hashes(list(tokens[:n]), self.block_size, _root_parent(request))
            st = _Req(keys=keys, prompt_tokens=len(tokens))
            self._reqs[request.request_id] = st
        return st

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> Tuple[Optional[int], bool]:
        """Tokens beyond `num_computed_tokens` whose blocks the store holds: the leading run
        of the prompt's full blocks, the last prompt token left to compute. Loaded
        synchronously (False)."""
        try:
            st = self._track(request)
            store = self._scheduler_store()
            if st is None or store is None:
                return 0, False
            usable = (st.prompt_tokens - 1) // self.block_size
            have = num_computed_tokens // self.block_size
            hit = int(store.contains_prefix(st.keys[:usable])) if usable > have else 0
            st.matched_from, st.hit_blocks = have * self.block_size, hit
            with self._lock:
                self._counts["lookups"] += 1
                self._counts["hit_blocks"] += max(hit - have, 0)
            return max(hit * self.block_size - num_computed_tokens, 0), False
        except Exception as e:  # noqa: BLE001: never raise into vLLM
            self._fail("lookup", e)
            return 0, False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        """Plans the load of the matched blocks into the ones vLLM just allocated."""
        if num_external_tokens <= 0:
            return
        try:
            st = self._reqs[request.request_id]
            first = st.matched_from // self.block_size
            last = (st.matched_from + num_external_tokens) // self.block_size
            ids = blocks.get_block_ids()[0]
            self._loads[request.request_id] = _Job(
                request.request_id, st.keys[first:last], list(ids[first:last])
            )
        except Exception as e:  # noqa: BLE001
            self._fail("plan_load", e)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """This step's loads (planned by update_state_after_alloc) and saves: per scheduled
        request, the prompt blocks this step's forward completes."""
        meta = TierkvConnectorMetadata(loads=list(self._loads.values()))
        self._loads.clear()
        try:
            for new in scheduler_output.scheduled_new_reqs:
                st = self._reqs.get(new.req_id)
                if st is not None:
                    st.block_ids = list(new.block_ids[0])
                    self._plan_save(meta, new.req_id, st, new.num_computed_tokens, scheduler_output)
            cached = scheduler_output.scheduled_cached_reqs
            for i, req_id in enumerate(cached.req_ids):
                st = self._reqs.get(req_id)
                if st is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if req_id in cached.resumed_req_ids:
                    st.block_ids = list(new_ids[0]) if new_ids else []
                elif new_ids:
                    st.block_ids.extend(new_ids[0])
                self._plan_save(meta, req_id, st, cached.num_computed_tokens[i], scheduler_output)
        except Exception as e:  # noqa: BLE001
            self._fail("plan_save", e)
        return meta

    def _plan_save(
        self, meta: TierkvConnectorMetadata, req_id: str, st: _Req, computed: int, out: Any
    ) -> None:
        """Adds the prompt blocks that become full in this step (from `computed` tokens to
        `computed` plus the scheduled ones, speculative tokens excluded)."""
        n = out.num_scheduled_tokens.get(req_id, 0) - len(
            out.scheduled_spec_decode_tokens.get(req_id, ())
        )
        first = computed // self.block_size
        last = min((computed + max(n, 0)) // self.block_size, len(st.keys), len(st.block_ids))
        if last > first:
            meta.saves.append(_Job(req_id, st.keys[first:last], st.block_ids[first:last]))

    def request_finished(
        self, request: "Request", block_ids: List[int]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Forgets the request: its saves ran in the steps that computed its blocks."""
        self._reqs.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        return False, None

    # -- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Maps each block's regions in the KV tensors and opens this rank's worker."""
        if not self._usable:
            return
        try:
            self._map_regions(kv_caches)
            tp, pp = _ranks()
            self.worker = worker_id(self._vllm_config, self._kv_cache_config, tp, pp)
            self.store = Store(self.root, self.worker, **self.options)
            logger.info(
                "tierkv vLLM connector: %s (worker %s), %d-byte blocks in %d regions",
                self.store.dir, self.worker, self._block_bytes, len(self._regions),
            )
        except Exception as e:  # noqa: BLE001: never raise into vLLM
            self.store = None
            self._fail("open", e)

    def _map_regions(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Per layer (in the model's order, aliases of one tensor once), the region of block 0
        and the stride to the next block, as offsets into the layers' one backing CPU buffer;
        regions adjacent in memory are merged. Each block's region must be contiguous."""
        spans, seen, storage = [], set(), None
        for name, t in kv_caches.items():
            if t.device.type != "cpu":
                raise ValueError(f"{name}: KV on {t.device}, this connector reads CPU memory")
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            if storage is None:
                storage = t.untyped_storage()
            elif t.untyped_storage().data_ptr() != storage.data_ptr():
                raise ValueError("the KV tensors do not share one backing buffer")
            if not t[0].is_contiguous():
                raise ValueError(f"{name}: a block's KV is not contiguous ({t.stride()})")
            off = t.data_ptr() - storage.data_ptr()
            spans.append([off, t[0].numel() * t.element_size(), t.stride(0) * t.element_size()])
        merged: List[List[int]] = []
        for off, size, stride in spans:
            last = merged[-1] if merged else None
            if last is not None and last[0] + last[1] == off and last[2] == stride:
                last[1] += size
            else:
                merged.append([off, size, stride])
        self._regions = [(o, s) for o, s, _ in merged]
        self._block_stride = [st for _, _, st in merged]
        self._block_bytes = sum(s for _, s in self._regions)
        nbytes = storage.nbytes()
        self._buf = np.frombuffer(
            (ctypes.c_ubyte * nbytes).from_address(storage.data_ptr()), dtype=np.uint8
        )
        self._keepalive = kv_caches

    def _parts(self, block_id: int) -> List[Any]:
        """Block `block_id`'s regions: writable numpy views of the engine's KV memory."""
        return [
            self._buf[o + block_id * st : o + block_id * st + s]
            for (o, s), st in zip(self._regions, self._block_stride)
        ]

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Reads this step's matched blocks into their KV blocks before the forward; a block
        not read whole (missing, corrupt, an error) is a load error vLLM recomputes."""
        meta = self._connector_metadata
        if not isinstance(meta, TierkvConnectorMetadata) or not meta.loads:
            return
        for job in meta.loads:
            try:
                if self.store is None:
                    raise RuntimeError("no store (the open failed)")
                got = self.store.get_many_into_vectored(
                    job.keys, [self._parts(b) for b in job.block_ids]
                )
            except Exception as e:  # noqa: BLE001
                self._fail("load", e)
                got = [None] * len(job.keys)
            ok = 0
            while ok < len(got) and got[ok] == self._block_bytes:
                ok += 1
            if ok < len(got):
                self._invalid.update(job.block_ids[ok:])
                self._fail("load", f"{len(got) - ok} of {len(got)} blocks not read ({job.req_id})")
            with self._lock:
                self._counts["loaded_blocks"] += ok

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are whole (all layers) before the forward: nothing to wait for."""
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Blocks are saved whole (all layers) after the forward, in wait_for_save."""
        return

    def wait_for_save(self) -> None:
        """Writes the blocks this step's forward completed, from the KV memory in place; the
        leading run the store holds already is not rewritten."""
        meta = self._connector_metadata
        if not isinstance(meta, TierkvConnectorMetadata) or self.store is None:
            return
        for job in meta.saves:
            try:
                have = int(self.store.contains_prefix(job.keys))
                if have < len(job.keys):
                    # Hung from the last stored block: the store records the chain, so it
                    # never keeps a block whose prefix it evicted.
                    self.store.offer_many_vectored(
                        job.keys[have:], [self._parts(b) for b in job.block_ids[have:]],
                        parent=job.keys[have - 1] if have else None,
                    )
                with self._lock:
                    self._counts["saved_blocks"] += len(job.keys) - have
            except Exception as e:  # noqa: BLE001
                self._fail("save", e)

    def get_block_ids_with_load_errors(self) -> set:
        """The blocks of this step's loads that were not read (vLLM recomputes them)."""
        out, self._invalid = self._invalid, set()
        return out


def _ranks() -> Tuple[int, int]:
    """This worker's TP and PP ranks (0, 0 outside a distributed group)."""
    try:
        from vllm.distributed.parallel_state import (
            get_pipeline_model_parallel_rank,
            get_tensor_model_parallel_rank,
        )

        return get_tensor_model_parallel_rank(), get_pipeline_model_parallel_rank()
    except Exception:  # noqa: BLE001
        return 0, 0
