"""tierkv as a vLLM KV connector (``KVConnectorBase_V1``): a disk tier under vLLM's paged KV
cache, shared by engine restarts and by the engines that open the same root.

Attach it with::

    --kv-transfer-config '{"kv_connector": "TierkvConnector",
      "kv_connector_module_path": "tierkv_g3.vllm_connector", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"root": "/mnt/nvme/kvcache",
                                    "capacity_bytes": 1099511627776}}'

One tierkv block is one vLLM block (``block_size`` tokens) of every attention layer of one
TP/PP rank, keyed by the blake3 chain hash of its tokens (:func:`tierkv_g3.chain_hashes`; a
request's LoRA, cache salt and multimodal hashes fold into the chain's root). Everything that
changes a block's bytes is hashed into the worker id, ``vllm.<model type>.b<block>.tp<r>of<n>.
<16 hex>``: the model's configuration and the identity of its weights (each weight file's name,
size and a hash of its first and last bytes; the revision), dtypes, quantization, block size, the KV layout and
per-layer spec, the ranks; not the model's path, so the same weights at another mount point
share the tier.

Both directions are asynchronous (``tierkv_g3.Transfers``, the Rust engine API): the engine's
step never waits on the disk.

- Scheduler side: ``get_num_new_matched_tokens`` asks ``lookup_prefix`` of rank 0's worker
  (a read-only ``shared`` store, answering from memory: a block once found costs no system
  call; a key its index does not hold is looked up in the tree, then remembered absent for
  ``negative_ttl``; the workers report the blocks they write and the ones a load did not find,
  which it looks at again: it sees what this engine stored at once, other engines within
  ``negative_ttl``, 1 s by default) for the prompt's
  full blocks, the last prompt token excluded (vLLM computes at least one token), and answers
  ``load_async=True``: the request waits in ``WAITING_FOR_REMOTE_KVS`` while others run.
- Worker side: ``register_kv_caches`` describes the KV tensors once (per layer, block 0's
  region and the stride to the next block, merged where adjacent) to a ``Transfers`` over the
  rank's store. ``start_load_kv`` submits the loads (``get_finished`` reports each request
  when its load completed, and ``get_block_ids_with_load_errors`` the blocks not read whole: a
  missing, corrupt or unreadable block is a miss vLLM recomputes; no forward runs over them).
  ``wait_for_save`` submits the blocks the step completed, prompt and output alike (so turn
  N+1 of a conversation hits through turn N's answer), and the blocks vLLM had in its own
  cache that the tier lacks; ``request_finished`` keeps a request's blocks until its saves
  have completed, and a preempted request's saves complete before its blocks are reused.
- Several KV cache groups (``SupportsHMA``: vLLM keeps its hybrid manager, e.g. for Gemma 3's
  sliding-window and full-attention layers): each group's blocks have their own chain (a root
  per group); a hit needs every block before its end in a full-attention group and the blocks
  a sliding window keeps before it, and loads only those; a failed load is a failed request
  (``failed_recving``), which vLLM recomputes.
- Failures are misses: nothing raises into vLLM. A store that cannot be opened makes every
  lookup a miss. Each failure is counted (``tierkv_stats()["failures"]``) and logged at most
  once per ``log_interval`` seconds per operation.

Extra config: ``root`` (required), any keyword argument of :class:`tierkv_g3.Store`
(``capacity_bytes``, ``capacity_files``, ``policy``, ``engine``, ``verify``, ...; ``sharing``
defaults to ``"shared"`` here, so several engines, or DP replicas, can use one root),
``threads`` (transfer threads per worker, default 2) and ``log_interval`` (seconds, default
10).
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import Store, Transfers, chain_hashes, engine_key
from . import worker_id as worker_id_of
from ._engines import STORE_OPTIONS, FailureLog, close_store, slug, store_options, weights_identity

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

# How many get_finished calls a finished request's id is kept for, waiting for the notice that
# its blocks wait for saves (the notice comes in the same step).
_SEEN_CALLS = 1024


def worker_id(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", tp: int, pp: int) -> str:
    """The tierkv worker id of TP rank `tp`, PP rank `pp`: the model's configuration and its
    weights' identity (not its path), revision, dtype and quantization, the KV cache's dtype,
    layout, block size and per-layer spec, the layer names and the parallel sizes are hashed
    into it (the scheduler and each worker compute it from the same config)."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    groups = [(list(g.layer_names), repr(g.kv_cache_spec)) for g in kv_cache_config.kv_cache_groups]
    hf = getattr(mc, "hf_config", None)
    try:
        skip = ("_name_or_path", "transformers_version")
        config = json.dumps(
            {k: v for k, v in hf.to_dict().items() if k not in skip}, sort_keys=True, default=str
        )
    except Exception:  # noqa: BLE001: a config that does not serialise: its repr
        config = repr(hf)
    revision = getattr(mc, "revision", None)
    ident = {
        "config": config,
        "weights": weights_identity(str(mc.model), revision),
        "revision": str(revision),
        "dtype": str(mc.dtype),
        "quantization": str(getattr(mc, "quantization", None)),
        "cache_dtype": str(cc.cache_dtype),
        "layout": str(getattr(cc, "kv_cache_layout", None)),
        "block_size": int(cc.block_size),
        "groups": groups,
        "tp": (tp, pc.tensor_parallel_size),
        "pp": (pp, pc.pipeline_parallel_size),
    }
    rank = f"tp{tp}of{pc.tensor_parallel_size}"
    if pc.pipeline_parallel_size > 1:
        rank += f"pp{pp}"
    kind = getattr(hf, "model_type", None) or "model"
    return worker_id_of(f"vllm.{slug(str(kind), 20)}.b{cc.block_size}.{rank}", ident)


def _group_windows(kv_cache_config: "KVCacheConfig", block_size: int) -> List[Optional[int]]:
    """Per KV cache group, how many tokens before the next one its attention keeps: a sliding
    window's ``sliding_window - 1`` (and the tokens vLLM retains below it), as vLLM's
    SlidingWindowManager frees the blocks before them; None for full attention (every
    block). Raises ValueError naming a group this connector cannot serve (another block
    size, or attention that frees blocks another way: chunked local, Mamba, ...)."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
    )

    out: List[Optional[int]] = []
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        kind = type(spec).__name__
        if int(getattr(spec, "block_size", block_size)) != block_size:
            raise ValueError(f"KV cache group {i} ({kind}): block size {spec.block_size}, not {block_size}")
        if type(spec) in (SlidingWindowSpec, SlidingWindowMLASpec):
            out.append(int(spec.sliding_window) - 1 + int(getattr(spec, "extra_retained_tokens", 0)))
        elif type(spec) in (FullAttentionSpec, MLAAttentionSpec):
            out.append(None)
        else:
            raise ValueError(
                f"KV cache group {i}: {kind} is not supported (full attention and sliding "
                "window are)"
            )
    if not out:
        raise ValueError("no KV cache group")
    return out


def _group_roots(parent: Optional[bytes], groups: int) -> List[Optional[bytes]]:
    """Per KV cache group, the root its request's chain hangs from: the request's own with
    one group (the keys of a one-group model), one derived per group with several (the same
    tokens, each group's own bytes)."""
    if groups == 1:
        return [parent]
    return [
        engine_key(b"vllm.group" + g.to_bytes(4, "little"), parent or b"") for g in range(groups)
    ]


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
    return engine_key(b"vllm.extras", json.dumps(extras, default=str).encode())


@dataclass
class _Job:
    """One request's blocks to load or save: their keys, the engine's block ids and (saves)
    the stored key the first hangs from, in one KV cache group (a load may span them all)."""

    req_id: str
    keys: List[str]
    block_ids: List[int]
    parent: Optional[str] = None
    seq: int = 0  # a save's number, for the workers' report of its completion


@dataclass
class TierkvConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, per step: the loads to start, the blocks to save (those the step's
    forward completes, and those vLLM holds that the tier lacks), the requests whose blocks
    wait for their saves (reported by get_finished once saved), and the preempted requests
    (their saves complete before their blocks are reused)."""

    loads: List[_Job] = field(default_factory=list)
    saves: List[_Job] = field(default_factory=list)
    finishing: List[str] = field(default_factory=list)
    preempted: List[str] = field(default_factory=list)
    # Saves (by number) of blocks that vLLM freed before they completed (a sliding window's
    # blocks leave it while the request runs) and allocates again in this step: they
    # complete before the step's forward writes those blocks.
    flush: List[int] = field(default_factory=list)


@dataclass
class TierkvWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, per step: the saves that completed (by number), each counted once
    per worker (summed over the TP/PP ranks), so the scheduler knows which requests still
    have saves in flight when they finish; and the keys whose presence changed under the
    scheduler's lookups (blocks written, blocks a load did not find whole), for it to look at
    again."""

    saved: Dict[int, int] = field(default_factory=dict)
    recheck: List[str] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, TierkvWorkerMetadata):
            for seq, n in other.saved.items():
                self.saved[seq] = self.saved.get(seq, 0) + n
            self.recheck.extend(other.recheck)
        return self


@dataclass
class _Req:
    """The scheduler's view of a live request: the request, per KV cache group the chain's
    root, the keys of its full blocks so far (prompt and output) and its block ids, and how
    many leading blocks are stored or being saved."""

    request: Any
    roots: List[Optional[bytes]]
    keys: List[List[str]] = field(default_factory=list)
    block_ids: List[List[int]] = field(default_factory=list)
    stored: int = 0  # leading blocks the tier holds or a save was submitted for
    saves: set = field(default_factory=set)  # numbers of its saves not yet completed
    matched_from: int = 0  # tokens vLLM had (block-aligned) at the last lookup


class TierkvConnector(KVConnectorBase_V1, SupportsHMA):
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
        unknown = set(extra) - set(STORE_OPTIONS) - {"root", "log_interval", "threads"}
        self.options: Dict[str, Any] = store_options(extra)
        self.options.setdefault("sharing", "shared")
        # vLLM's KV events: the workers' stores keep the event journal, and the scheduler side
        # turns it into BlockStored/BlockRemoved of medium STORAGE (_vllm_events).
        kv_events = getattr(vllm_config, "kv_events_config", None)
        self._kv_events = None
        if kv_events is not None and kv_events.enable_kv_cache_events:
            from ._vllm_events import StorageEvents

            self.options.setdefault("events", True)
            hash_bs = getattr(kv_cache_config, "hash_block_size", None) or vllm_config.cache_config.block_size
            self._kv_events = StorageEvents(int(vllm_config.cache_config.block_size), int(hash_bs))
        # The scheduler's lookups remember absent keys for the configured time (default 1 s).
        self._lookup_options = {k: self.options[k] for k in ("negative_ttl",) if k in self.options}
        self.log_interval = float(extra.get("log_interval", 10.0))
        self.threads = int(extra.get("threads", 2))
        self.failures = FailureLog(logger, "tierkv vLLM connector", self.log_interval)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.store: Optional[Store] = None
        self.worker: Optional[str] = None
        self._lock = threading.Lock()
        self._counts = {
            "lookups": 0, "hit_blocks": 0, "loaded_blocks": 0, "saved_blocks": 0,
            "present_blocks": 0, "not_admitted_blocks": 0, "failed_loads": 0,
        }
        # Per KV cache group, the tokens its attention keeps before a position (None: all).
        self._windows: List[Optional[int]] = [None]
        self._usable = self._check_config(kv_cache_config, unknown)
        # Scheduler side.
        self._reqs: Dict[str, _Req] = {}
        self._loads: Dict[str, _Job] = {}
        self._final_saves: List[_Job] = []
        self._finishing: List[str] = []
        self._seq = 0
        self._save_reqs: Dict[int, Tuple[str, int]] = {}  # save -> (request, reports so far)
        # Blocks of a sliding-window group with saves in flight (vLLM may free them before the
        # request ends), and each such save's blocks.
        self._pending: Dict[int, set] = {}
        self._pending_blocks: Dict[int, List[int]] = {}
        pc = vllm_config.parallel_config
        self._ranks = int(pc.tensor_parallel_size) * int(pc.pipeline_parallel_size)
        self._next_open = 0.0
        # Worker side.
        self._transfers: Optional[Transfers] = None
        self._block_bytes = 0
        self._inflight: Dict[int, _Job] = {}  # transfer id -> its job
        self._saving: Dict[str, int] = {}  # request -> saves in flight
        self._to_report: set = set()  # requests whose blocks wait for their saves
        # Requests vLLM said finished (get_finished), with the call that said so: kept until
        # reported, or for _SEEN_CALLS calls (a finished request without saves is never
        # reported: bounded, not kept forever).
        self._finished_seen: Dict[str, int] = {}
        self._calls = 0
        self._loaded: set = set()  # requests whose load completed, to report
        self._saved_seqs: List[int] = []  # saves completed, to tell the scheduler
        self._recheck: List[str] = []  # keys written or not found, to tell the scheduler
        self._invalid: set = set()
        self._failed_reqs: set = set()  # requests whose load failed (several KV cache groups)
        if role == KVConnectorRole.SCHEDULER and self._usable:
            self.worker = worker_id(vllm_config, kv_cache_config, 0, 0)
            self._recompute_failed_loads()
            # Opened now, while the engine starts (the workers made the tree when they
            # registered their KV caches): its sweep of the tree is not a request's wait.
            self._scheduler_store()
            if self._kv_events is not None:
                self._kv_events.follow(self.store)

    def _recompute_failed_loads(self) -> None:
        """A block that cannot be read is a miss: vLLM's kv_load_failure_policy must be
        "recompute" (its default, "fail", fails the request). Set it in the transfer config as
        README's line does; a config that says otherwise is rewritten here, with a warning."""
        cfg = self._kv_transfer_config
        if getattr(cfg, "kv_load_failure_policy", "recompute") != "recompute":
            logger.warning(
                "tierkv vLLM connector: kv_load_failure_policy %r -> 'recompute' (a block "
                "that cannot be read is a cache miss, recomputed); set it in "
                "--kv-transfer-config", cfg.kv_load_failure_policy,
            )
            cfg.kv_load_failure_policy = "recompute"

    def _check_config(self, kv_cache_config: "KVCacheConfig", unknown: set) -> bool:
        """Whether this connector can serve the engine; logged (never raised) when not."""
        problem = None
        if not self.root:
            problem = 'the extra config needs "root"'
        elif unknown:
            problem = f"unknown extra config keys {sorted(unknown)}"
        else:
            try:
                self._windows = _group_windows(kv_cache_config, self.block_size)
            except ValueError as e:
                problem = str(e)
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

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self._counts[name] += n

    def tierkv_stats(self) -> Dict[str, Any]:
        """This side's counters (lookups, hit, loaded, saved, present, not admitted blocks,
        failed loads), its failures per operation, the worker id, the transfers in flight and
        the store's own counters (`Store.stats()`)."""
        with self._lock:
            out: Dict[str, Any] = dict(self._counts)
            out["failures"] = self.failures.snapshot()
        out["worker"] = self.worker
        out["role"] = self.role.name.lower()
        out["groups"] = len(self._windows)
        out["in_flight"] = len(self._inflight)
        try:
            out["store"] = self.store.stats() if self.store is not None else None
        except Exception:  # noqa: BLE001
            out["store"] = None
        return out

    def shutdown(self) -> None:
        transfers, self._transfers = self._transfers, None
        if transfers is not None:
            try:
                self._settle(transfers.close())
            except Exception as e:  # noqa: BLE001
                self._fail("close", e)
        if self._kv_events is not None:
            self._kv_events.close()
        store, self.store = self.store, None
        close_store(store, self._fail)

    # -- scheduler side ----------------------------------------------------------------------

    def _scheduler_store(self) -> Optional[Store]:
        """Rank 0's worker, read-only and shared (no lock; lookups from memory, a key its index
        does not hold looked up in the tree once per `negative_ttl`; what the workers report
        written or not found is looked at again). Opened when the connector is built,
        retried at most once a second while it fails (the tree appears when a worker first
        opens it)."""
        if self.store is None and self._usable and time.monotonic() >= self._next_open:
            self._next_open = time.monotonic() + 1.0
            try:
                self.store = Store(
                    self.root, self.worker, read_only=True, sharing="shared",
                    stats_interval=None, **self._lookup_options,
                )
            except Exception as e:  # noqa: BLE001
                self._fail("open", e)
        return self.store

    def _track(self, request: "Request") -> Optional[_Req]:
        """The request's state, made on first sight."""
        st = self._reqs.get(request.request_id)
        if st is None:
            if request.prompt_token_ids is None or getattr(request, "prompt_embeds", None) is not None:
                return None
            groups = len(self._windows)
            st = _Req(
                request=request,
                roots=_group_roots(_root_parent(request), groups),
                keys=[[] for _ in range(groups)],
                block_ids=[[] for _ in range(groups)],
            )
            self._reqs[request.request_id] = st
        return st

    def _keys(self, st: _Req, blocks: int) -> List[List[str]]:
        """Per KV cache group, the keys of the request's first `blocks` full blocks (prompt and
        output tokens), extending the chains computed so far."""
        have = len(st.keys[0])
        if blocks > have:
            tokens = st.request.all_token_ids
            blocks = min(blocks, len(tokens) // self.block_size)
            if blocks > have:
                new = list(tokens[have * self.block_size : blocks * self.block_size])
                for g, keys in enumerate(st.keys):
                    parent = keys[-1] if keys else st.roots[g]
                    keys.extend(chain_hashes(new, self.block_size, parent))
        return [keys[:blocks] for keys in st.keys]

    def _kept(self, g: int, tokens: int) -> int:
        """The first block of group `g` that vLLM keeps once `tokens` are computed: 0 for full
        attention; for a sliding window, those before it are freed (null in its block table)."""
        keep = self._windows[g]
        return 0 if keep is None else max(tokens - keep, 0) // self.block_size

    def _lookup(self, store: Store, keys: List[List[str]], usable: int) -> Tuple[int, int]:
        """(the leading blocks stored in every group, the blocks a load can give, at most
        `usable`): full attention needs every block before the end of the hit, a sliding
        window the blocks it keeps there."""
        runs = [int(store.lookup_prefix(k)) for k in keys]
        stored = min(runs)
        windowed = [g for g, w in enumerate(self._windows) if w is not None]
        if not windowed:
            return stored, min(stored, usable)
        full = [runs[g] for g, w in enumerate(self._windows) if w is None]
        n = min(full + [usable, len(keys[0])])
        present = {g: store.lookup_many(keys[g][:n]) for g in windowed} if n > 0 else {}
        while n > 0 and not all(
            all(present[g][self._kept(g, n * self.block_size) : n]) for g in windowed
        ):
            n -= 1
        return stored, n

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> Tuple[Optional[int], bool]:
        """Tokens beyond `num_computed_tokens` whose blocks the store holds: the leading run
        of the prompt's full blocks (in a sliding-window group, the window before its end),
        the last prompt token left to compute. Loaded asynchronously (True): the request waits
        while other requests run."""
        try:
            st = self._track(request)
            store = self._scheduler_store()
            if st is None or store is None:
                return 0, False
            usable = (request.num_tokens - 1) // self.block_size
            have = num_computed_tokens // self.block_size
            # The tier's run over the blocks vLLM has and those it could load: what it lacks
            # of vLLM's own blocks is saved when the request is scheduled.
            stored, load_to = self._lookup(store, self._keys(st, max(usable, have)), usable)
            st.matched_from, st.stored = have * self.block_size, stored
            self._count("lookups", 1)
            self._count("hit_blocks", max(load_to - have, 0))
            n = max(load_to * self.block_size - num_computed_tokens, 0)
            return n, n > 0
        except Exception as e:  # noqa: BLE001: never raise into vLLM
            self._fail("lookup", e)
            return 0, False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        """Plans the load of the matched blocks into the ones vLLM just allocated (in a
        sliding-window group, those it keeps: the others are null)."""
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        try:
            ids = blocks.get_block_ids()
            if num_external_tokens > 0:
                first = st.matched_from // self.block_size
                last = (st.matched_from + num_external_tokens) // self.block_size
                keys: List[str] = []
                block_ids: List[int] = []
                for g, group_ids in enumerate(ids):
                    lo = max(first, self._kept(g, last * self.block_size))
                    keys += st.keys[g][lo:last]
                    block_ids += group_ids[lo:last]
                self._loads[request.request_id] = _Job(request.request_id, keys, block_ids)
                # Stored already: nothing to save up to the end of the load.
                st.stored = max(st.stored, last)
        except Exception as e:  # noqa: BLE001
            self._fail("plan_load", e)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """This step's loads (planned by update_state_after_alloc), saves (per scheduled
        request, the full blocks from the end of what the tier holds to the end of what this
        step computes), the requests whose blocks wait for their saves, the preempted ones,
        and the saves in flight of blocks vLLM allocates again."""
        meta = TierkvConnectorMetadata(loads=list(self._loads.values()), saves=self._final_saves)
        self._loads.clear()
        self._final_saves = []
        meta.finishing, self._finishing = self._finishing, []
        meta.preempted = list(getattr(scheduler_output, "preempted_req_ids", None) or ())
        allocated: List[int] = []
        try:
            for new in scheduler_output.scheduled_new_reqs:
                allocated.extend(b for ids in new.block_ids for b in ids)
                st = self._reqs.get(new.req_id)
                if st is not None:
                    st.block_ids = [list(ids) for ids in new.block_ids]
                    self._plan_save(meta, new.req_id, st, new.num_computed_tokens, scheduler_output)
            cached = scheduler_output.scheduled_cached_reqs
            for i, req_id in enumerate(cached.req_ids):
                new_ids = cached.new_block_ids[i]
                allocated.extend(b for ids in new_ids or () for b in ids)
                st = self._reqs.get(req_id)
                if st is None:
                    continue
                if req_id in cached.resumed_req_ids:
                    st.block_ids = [list(ids) for ids in new_ids] if new_ids else [[] for _ in st.keys]
                elif new_ids:
                    for g, ids in enumerate(new_ids):
                        st.block_ids[g].extend(ids)
                self._plan_save(meta, req_id, st, cached.num_computed_tokens[i], scheduler_output)
        except Exception as e:  # noqa: BLE001
            self._fail("plan_save", e)
        if self._pending:
            meta.flush = sorted({seq for b in allocated for seq in self._pending.get(b, ())})
        return meta

    def _plan_save(
        self, meta: TierkvConnectorMetadata, req_id: str, st: _Req, computed: int, out: Any
    ) -> None:
        """Adds the full blocks from the end of the request's stored run to the end of what
        this step computes (speculative tokens excluded): blocks vLLM had in its own cache or
        loaded are valid in its memory; blocks this step computes are written once it has."""
        n = out.num_scheduled_tokens.get(req_id, 0) - len(
            out.scheduled_spec_decode_tokens.get(req_id, ())
        )
        # Blocks from `computed` on are (re)computed now (after a failed load, vLLM goes back
        # to the first block it could not read; a preempted request starts again).
        st.stored = min(st.stored, computed // self.block_size)
        meta.saves.extend(self._save_upto(req_id, st, (computed + max(n, 0)) // self.block_size, computed))

    def _save_upto(self, req_id: str, st: _Req, last: int, computed: int) -> List[_Job]:
        """Numbered saves, one per KV cache group, of the request's full blocks from the end of
        its stored run to block `last` (those whose tokens and block ids are known; in a
        sliding-window group, those vLLM still keeps with `computed` tokens computed), each hung
        from the block before them and in flight until every worker reports it."""
        last = min([last] + [len(ids) for ids in st.block_ids])
        if last <= st.stored:
            return []
        keys = self._keys(st, last)
        last = min(last, len(keys[0]))
        if last <= st.stored:
            return []
        first, st.stored = st.stored, last
        jobs = []
        for g, group_keys in enumerate(keys):
            lo = max(first, self._kept(g, computed))
            if lo >= last:
                continue
            self._seq += 1
            st.saves.add(self._seq)
            self._save_reqs[self._seq] = (req_id, 0)
            job = _Job(
                req_id, group_keys[lo:last], st.block_ids[g][lo:last],
                group_keys[lo - 1] if lo else None, self._seq,
            )
            if self._kv_events is not None:
                self._kv_events.note_save(st.request, g, job.keys, lo)
            if self._windows[g] is not None:
                # vLLM frees a window's blocks while the request runs: until this save
                # completes, a step that allocates one of them waits for it.
                self._pending_blocks[self._seq] = job.block_ids
                for b in job.block_ids:
                    self._pending.setdefault(b, set()).add(self._seq)
            jobs.append(job)
        return jobs

    def _saved(self, seq: int) -> None:
        """A save every worker completed: its request's count, its blocks free to reuse."""
        req_id, _ = self._save_reqs.pop(seq, (None, 0))
        st = self._reqs.get(req_id) if req_id is not None else None
        if st is not None:
            st.saves.discard(seq)
        for b in self._pending_blocks.pop(seq, ()):
            seqs = self._pending.get(b)
            if seqs is not None:
                seqs.discard(seq)
                if not seqs:
                    del self._pending[b]

    def update_connector_output(self, connector_output: Any) -> None:
        """Books the saves the workers completed (each once every rank has)."""
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if not isinstance(meta, TierkvWorkerMetadata):
            return
        if meta.recheck and self.store is not None:
            try:
                self.store.recheck_many(sorted(set(meta.recheck)))
            except Exception as e:  # noqa: BLE001
                self._fail("lookup", e)
        for seq, n in meta.saved.items():
            req_id, seen = self._save_reqs.get(seq, (None, 0))
            if req_id is None:
                continue
            if seen + n < self._ranks:
                self._save_reqs[seq] = (req_id, seen + n)
            else:
                self._saved(seq)

    def take_events(self) -> Iterable[Any]:
        """vLLM's scheduler collects these each step and publishes them beside its own: the
        blocks this connector saved, BlockStored once a worker's store published them and
        BlockRemoved once any store of the worker removed them (docs/events.md). Only with
        vLLM's KV events on; the journal is read on a thread of its own."""
        ev = self._kv_events
        if ev is None:
            return ()
        try:
            if ev._tail is None:
                ev.follow(self._scheduler_store())
            return ev.take()
        except Exception as e:  # noqa: BLE001: never raise into vLLM's scheduler
            self._fail("events", e)
            return ()

    def request_finished(
        self, request: "Request", block_ids: List[int]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """One KV cache group's request_finished_all_groups."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: "Request", block_ids: Tuple[List[int], ...]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Forgets the request. Its full blocks not yet saved (the last ones an answer filled,
        whose tokens the last steps had not yet sampled) are saved in the next step; if any of
        its blocks were sent to be saved, vLLM keeps them until get_finished reports the
        request saved (True)."""
        st = self._reqs.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        if st is None:
            return False, None
        try:
            if len(block_ids) == len(st.block_ids):
                # vLLM's table now (a sliding window's freed blocks are null in it).
                st.block_ids = [list(ids) for ids in block_ids]
            computed = request.num_computed_tokens
            self._final_saves.extend(
                self._save_upto(request.request_id, st, computed // self.block_size, computed)
            )
        except Exception as e:  # noqa: BLE001
            self._fail("plan_save", e)
        if st.saves:
            # The workers report the request once its saves complete (the scheduler keeps
            # counting them: a window's blocks stay pending until then).
            self._finishing.append(request.request_id)
            return True, None
        return False, None

    # -- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Describes the KV tensors to a Transfers over this rank's worker."""
        if not self._usable:
            return
        try:
            memory, regions, blocks = _map_regions(kv_caches)
            tp, pp = _ranks()
            self.worker = worker_id(self._vllm_config, self._kv_cache_config, tp, pp)
            self.store = Store(self.root, self.worker, **self.options)
            self._transfers = Transfers(self.store, memory, regions, blocks, threads=self.threads)
            self._block_bytes = self._transfers.block_bytes
            self._keepalive = kv_caches
            logger.info(
                "tierkv vLLM connector: %s (worker %s), %d-byte blocks in %d regions, %d blocks",
                self.store.dir, self.worker, self._block_bytes, len(regions), blocks,
            )
        except Exception as e:  # noqa: BLE001: never raise into vLLM
            self._transfers = None
            self._fail("open", e)

    def _settle(self, done: List[Any]) -> None:
        """Books finished transfers: loads (their request to report, blocks not read whole as
        load errors), saves (their request's count in flight, the outcomes counted)."""
        for tid, kind, outcomes, errors in done:
            job = self._inflight.pop(tid, None)
            if job is None:
                continue
            for i, msg in errors[:1]:
                self._fail(kind, f"{job.req_id}: block {i}: {msg}")
            if kind == "load":
                ok = 0
                while ok < len(outcomes) and outcomes[ok] == "loaded":
                    ok += 1
                if ok < len(outcomes):
                    self._load_failed(job, ok)
                    self._recheck.extend(job.keys[ok:])
                    self._count("failed_loads", 1)
                    self._fail("load", f"{len(outcomes) - ok} of {len(outcomes)} blocks not read ({job.req_id})")
                self._count("loaded_blocks", ok)
                self._loaded.add(job.req_id)
            else:
                self._saved_seqs.append(job.seq)
                self._recheck.extend(k for k, o in zip(job.keys, outcomes) if o == "written")
                left = self._saving.get(job.req_id, 1) - 1
                if left > 0:
                    self._saving[job.req_id] = left
                else:
                    self._saving.pop(job.req_id, None)
                self._count("saved_blocks", outcomes.count("written"))
                self._count("present_blocks", outcomes.count("present"))
                self._count("not_admitted_blocks", outcomes.count("not_admitted"))

    def _submit(self, job: _Job, load: bool) -> None:
        t = self._transfers
        try:
            if t is None:
                raise RuntimeError("no store (the open failed)")
            if load:
                tid = t.submit_load(job.keys, job.block_ids)
            else:
                tid = t.submit_save(job.keys, job.block_ids, job.parent)
                self._saving[job.req_id] = self._saving.get(job.req_id, 0) + 1
            self._inflight[tid] = job
        except Exception as e:  # noqa: BLE001
            self._fail("load" if load else "save", e)
            if load:
                self._load_failed(job, 0)
                self._loaded.add(job.req_id)
            else:
                self._saved_seqs.append(job.seq)

    def _load_failed(self, job: _Job, ok: int) -> None:
        """A load whose blocks from `ok` on were not read whole: with one KV cache group, those
        blocks (vLLM recomputes from the first); with several (vLLM cannot map a block id to
        its request then), the request (vLLM recomputes all of it)."""
        if len(self._windows) > 1:
            self._failed_reqs.add(job.req_id)
        else:
            self._invalid.update(job.block_ids[ok:])

    def _wait_before_reuse(self, meta: TierkvConnectorMetadata) -> None:
        """Waits for the saves in flight whose blocks this step reuses: those of the preempted
        requests, and those numbered in `flush` (blocks a sliding window freed)."""
        t, req_ids, seqs = self._transfers, meta.preempted, set(meta.flush)
        while t is not None and any(
            j.req_id in req_ids or j.seq in seqs
            for j in self._inflight.values()
            if j.seq
        ):
            self._settle(t.wait(1.0))

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Before the step's forward: a preempted request's blocks are reused at once, and so
        are blocks a sliding window freed: their saves in flight complete first."""
        if isinstance(kv_connector_metadata, TierkvConnectorMetadata):
            self._wait_before_reuse(kv_connector_metadata)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Submits this step's loads; returns at once. A preempted request's saves complete
        first (in case handle_preemptions was not called)."""
        meta = self._connector_metadata
        if not isinstance(meta, TierkvConnectorMetadata):
            return
        self._wait_before_reuse(meta)
        for job in meta.loads:
            self._submit(job, load=True)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """No forward reads a block being loaded (its request waits): nothing to wait for."""
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Blocks are saved whole (all layers) after the forward, in wait_for_save."""
        return

    def wait_for_save(self) -> None:
        """Submits the saves of the blocks this step completed (and of those the tier lacks
        that vLLM holds); returns at once. Their requests' blocks stay vLLM's until saved."""
        meta = self._connector_metadata
        if not isinstance(meta, TierkvConnectorMetadata):
            return
        for job in meta.saves:
            self._submit(job, load=False)
        self._to_report.update(meta.finishing)

    def get_finished(self, finished_req_ids: set) -> Tuple[Optional[set], Optional[set]]:
        """The requests whose saves have all completed (among those whose blocks wait for
        them), and those whose load completed (a failed block is in
        get_block_ids_with_load_errors, called after this)."""
        t = self._transfers
        if t is not None:
            try:
                self._settle(t.drain())
            except Exception as e:  # noqa: BLE001
                self._fail("drain", e)
        self._calls += 1
        for r in finished_req_ids or ():
            self._finished_seen[r] = self._calls
        saved = {r for r in self._to_report if r in self._finished_seen and r not in self._saving}
        self._to_report -= saved
        for r in saved:
            del self._finished_seen[r]
        if self._calls % 64 == 0:
            old = self._calls - _SEEN_CALLS
            for r in [r for r, c in self._finished_seen.items() if c < old and r not in self._to_report]:
                del self._finished_seen[r]
        loaded, self._loaded = self._loaded, set()
        return (saved or None), (loaded or None)

    def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
        """get_finished's requests, and (several KV cache groups) the loads that failed."""
        saved, loaded = self.get_finished(finished_req_ids)
        failed, self._failed_reqs = self._failed_reqs, set()
        return KVConnectorTransferResults(
            finished_sending=set(saved or ()),
            finished_recving=set(loaded or ()),
            failed_recving=failed,
        )

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        """The saves completed since the last step, for the scheduler."""
        if not self._saved_seqs and not self._recheck:
            return None
        meta = TierkvWorkerMetadata(
            saved={seq: 1 for seq in self._saved_seqs}, recheck=self._recheck
        )
        self._saved_seqs, self._recheck = [], []
        return meta

    def get_block_ids_with_load_errors(self) -> set:
        """The blocks of the loads reported by get_finished that were not read whole (vLLM
        recomputes them); with several KV cache groups, failed loads are whole requests
        (get_transfer_results)."""
        out, self._invalid = self._invalid, set()
        return out


def _map_regions(kv_caches: Dict[str, torch.Tensor]) -> Tuple[Any, List[Tuple[int, int, int]], int]:
    """The KV tensors' one backing CPU buffer (a writable numpy view), per layer (in the
    model's order, aliases of one tensor once) the region of block 0 as (offset, length,
    stride to the next block), merged where adjacent, and the number of blocks."""
    spans, seen, storage, blocks = [], set(), None, None
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
        blocks = t.shape[0] if blocks is None else min(blocks, t.shape[0])
    if storage is None:
        raise ValueError("no KV tensors")
    merged: List[List[int]] = []
    for off, size, stride in spans:
        last = merged[-1] if merged else None
        if last is not None and last[0] + last[1] == off and last[2] == stride:
            last[1] += size
        else:
            merged.append([off, size, stride])
    memory = np.frombuffer(
        (ctypes.c_ubyte * storage.nbytes()).from_address(storage.data_ptr()), dtype=np.uint8
    )
    return memory, [(o, s, st) for o, s, st in merged], int(blocks)


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
