"""tierkv as a vLLM secondary offloading tier (under the CPU primary tier of vLLM's
``TieringOffloadingSpec``).

Attach it with vLLM's offloading connector::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "TierkvSecondaryTier", "module_path": "tierkv_g3.vllm",
          "root": "/mnt/nvme/kvcache", "capacity_bytes": 1099511627776}]}}'

vLLM's ``SecondaryTierFactory`` builds the class with the primary tier's memoryview (one
contiguous row per chunk) and the tier's config keys as keyword arguments. Every call runs on
vLLM's scheduler thread and returns at once: stores and loads are batches of a
``tierkv_g3.Transfers`` over the primary rows (the Rust engine API: its own threads,
``n_read_threads + n_write_threads`` of them, read and write the rows in place), whose
completions come back through ``get_finished_jobs``; ``lookup`` answers HIT from the store's in-memory index without a system
call, and for a key the index lacks, MISS (``sharing="exclusive"``) or, for a shared store (the
default: data-parallel ranks and replicas open one worker), RETRY while a thread asks the tree
(vLLM's ``AsyncLookupManager``).

Keys: vLLM's 36-byte ``OffloadKey`` (a 32-byte block hash and a 4-byte KV-cache group) is
folded into tierkv's 32-byte key as ``engine_key(b"vllm.tier." + identity, key)`` (the Rust
``BlockHash::of_engine_key``), where the identity is the worker id ``tierkv_g3.worker_id``
derives from the model, dtype, tokens per hash, blocks per chunk, KV-cache groups,
parallel sizes (and rank, unless the layout is parallelism-agnostic), canonical layout and the
chunk's byte size (vLLM's own ``FileMapper`` fields, plus the size) and the checkpoint: the
weights' identity of a local directory, and the revision, config commit and quantization of the
vLLM config building the tier (``_checkpoint``): two models, revisions, checkpoints or layouts
never share a block, even on one worker. The worker id (default ``vllm.<model>.<16 hex of the
identity>``) gives each model its own directory and capacity under one root.

A failure never raises into vLLM: it is a MISS or a failed job, counted
(``tierkv_stats()["failures"]``) and logged at most once per ``log_interval`` seconds per
operation. A load that fails for some keys reports the others (``JobResult.successful_keys``);
a key whose load failed is a MISS until it is stored again.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Set, Tuple

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
)

from . import EventTail, Store, Transfers, engine_key, kv_events
from . import worker_id as worker_id_of
from ._engines import (
    STORE_OPTIONS,
    FailureLog,
    ToldBlocks,
    slug,
    store_options,
    weights_identity,
)

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = logging.getLogger(__name__)

_TAG = b"vllm.tier."
_TIER_KEYS = ("root", "worker", "n_read_threads", "n_write_threads", "log_interval", "locality")


def identity(offloading_spec: "OffloadingSpec", block_size_bytes: int) -> Dict[str, Any]:
    """What makes a chunk's bytes what they are: vLLM's FileMapper fields (model, dtype, tokens
    per hash, blocks per chunk, KV-cache groups, parallel sizes, the rank unless the layout is
    parallelism-agnostic, canonical/replicated layout) and the chunk's size in bytes."""
    fields = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    ).get_run_config()
    fields["chunk_bytes"] = int(block_size_bytes)
    fields["checkpoint"] = _checkpoint(str(offloading_spec.config.model.name))
    return fields


def _checkpoint(model: str) -> Any:
    """What identifies the weights beyond their name: the weights' identity
    (`weights_identity`: for a local directory, each weight file's size and a hash of its
    bytes, which tells two revisions or fine-tunes apart) and, from the vLLM config that is
    building this tier (`_building_config`), the revision, the commit its Hugging Face config
    came from and the quantization vLLM applies; without that config, the quantization a
    local directory's config.json declares. A hub id without that config (the tier built
    outside vLLM) is identified by its name alone, and a warning says so."""
    vc = _building_config(model)
    if vc is not None:
        mc = vc.model_config
        revision = getattr(mc, "revision", None)
        commit = getattr(getattr(mc, "hf_config", None), "_commit_hash", None)
        return {
            "weights": weights_identity(model, revision),
            "revision": str(revision),
            "commit": str(commit),
            "quantization": str(getattr(mc, "quantization", None)),
        }
    if not os.path.isdir(model):
        logger.warning(
            "tierkv vLLM tier: no vLLM config for %s in sight: its revision and quantization "
            "are not in the tier's identity, only its name", model,
        )
        return None
    quantization = None
    try:
        with open(os.path.join(model, "config.json")) as f:
            quantization = json.load(f).get("quantization_config")
    except (OSError, ValueError):
        pass
    return {"weights": weights_identity(model, None), "quantization": quantization}


def _building_config(model: str) -> Any:
    """The vLLM config of the engine building this tier, for `model`. vLLM's `OffloadingConfig`
    carries the model's name and KV dtype only; the tier is built (scheduler side, the only
    side that has one) inside `OffloadingConnector.__init__(vllm_config, ...)`, outside any
    `set_current_vllm_config` context, so the config is the nearest caller's `vllm_config`
    whose model is `model` (or the current one, where vLLM set it). None if neither is."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        current = get_current_vllm_config_or_none()
    except ImportError:
        current = None
    if _describes(current, model):
        return current
    frame = sys._getframe(1)
    while frame is not None:
        vc = frame.f_locals.get("vllm_config")
        if _describes(vc, model):
            return vc
        frame = frame.f_back
    return None


def _describes(vc: Any, model: str) -> bool:
    return str(getattr(getattr(vc, "model_config", None), "model", None)) == model


def fold_key(prefix: bytes, key: OffloadKey) -> bytes:
    """tierkv's 32-byte key for vLLM's 36-byte OffloadKey under an identity prefix: the one
    fold of engine keys (``tierkv_g3.engine_key``)."""
    return engine_key(prefix, bytes(key))


class _StoreLookup(AsyncLookupManager):
    """vLLM's async lookup (a thread, one batch per scheduler step) over Store.contains_many:
    for shared stores, whose lookups of keys the index lacks read the tree."""

    def __init__(self, tier: "TierkvSecondaryTier", tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: List[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier._contains(keys, "lookup")


class TierkvSecondaryTier(SecondaryTierManager):
    """A vLLM secondary tier over one tierkv store (one worker under ``root``): a capacity
    with eviction (``capacity_bytes``/``capacity_files``, ``policy``), an index rebuilt on
    restart, sharing across processes (``sharing="shared"``). Config keys: ``root``
    (required), ``worker``, ``n_read_threads`` (2), ``n_write_threads`` (2), ``log_interval``
    (10 s), ``locality``, ``backpressure`` (vLLM's) and any keyword of tierkv_g3.Store."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: "OffloadingSpec",
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Optional["BackpressureDetector"] = None,
        **config: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        unknown = set(config) - set(STORE_OPTIONS) - set(_TIER_KEYS)
        if unknown or not config.get("root"):
            raise ValueError(
                f"tierkv vLLM tier: needs 'root'; unknown keys {sorted(unknown)}"
            )
        self.root = str(config["root"])
        # Where the tier's blocks are (vLLM's events and load filters): as configured, else
        # REMOTE on a network or cluster filesystem, LOCAL on this node's disk.
        where = config.get("locality") or kv_events.locality(self.root)
        self.locality = Locality(where)
        self.failures = FailureLog(logger, "tierkv vLLM tier", config.get("log_interval", 10.0))
        self._flat = primary_kv_view.cast("B") if primary_kv_view.ndim != 1 else primary_kv_view
        ident = identity(offloading_spec, self.block_size_bytes)
        named = worker_id_of(f"vllm.{slug(str(ident['model_name']), 30)}", ident)
        self._prefix = _TAG + named.encode()
        self.worker = str(config.get("worker") or named)
        self.options = store_options(config)
        # Several engines (data-parallel ranks, replicas) open one worker: shared unless told.
        self.options.setdefault("sharing", "shared")
        threads = int(config.get("n_read_threads", 2)) + int(config.get("n_write_threads", 2))
        self._done: List[JobResult] = []
        # Transfer id -> (vLLM's job id, when submitted); its keys and kind are in
        # `_job_keys` and `_load_jobs`, kept until get_finished_jobs reports it.
        self._jobs: Dict[int, Tuple[int, float]] = {}
        self._transfers: Optional[Transfers] = None
        # Scheduler-thread state: keys being stored (lookup: RETRY), the keys of each job,
        # keys whose load failed (lookup: MISS until stored again).
        self._storing: Dict[OffloadKey, int] = {}
        self._job_keys: Dict[int, List[OffloadKey]] = {}
        self._load_jobs: Set[int] = set()
        self._bad: Set[OffloadKey] = set()
        # KV events (vLLM's --kv-events-config): stores and removals of the chunks this tier
        # stored, whichever process or node removed them, from the worker's event journal.
        self._events_on = bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        if self._events_on:
            self.options.setdefault("events", True)
        self._events: List[OffloadingEvent] = []
        # Our key -> vLLM's, for the chunks this tier stores, and those told stored.
        self._known = ToldBlocks()
        self._tail: Optional[EventTail] = None
        self.store: Optional[Store] = None
        try:
            self.store = Store(self.root, self.worker, **self.options)
            if self._events_on:
                self._tail = EventTail(self.store)
            bs = self.block_size_bytes
            self._transfers = Transfers(
                self.store, self._flat, [(0, bs, bs)], len(self._flat) // bs, threads=threads
            )
            logger.info("tierkv vLLM tier: %s (worker %s)", self.store.dir, self.worker)
        except Exception as e:  # noqa: BLE001: never raise into vLLM; every call misses
            self.failures.fail("open", e)
        shared = self.options.get("sharing") == "shared"
        self._async_lookup = _StoreLookup(self, tier_type) if shared else None

    # -- helpers -----------------------------------------------------------------------

    def _keys(self, keys: Iterable[OffloadKey]) -> List[bytes]:
        return [fold_key(self._prefix, k) for k in keys]

    def _contains(self, keys: List[OffloadKey], op: str, tree: bool = True) -> List[bool]:
        """Whether the store holds each key, from memory (`Store.lookup_many`); `tree=False`:
        what its index holds, without any system call (vLLM's scheduler thread)."""
        store = self.store
        if store is None:
            return [False] * len(keys)
        try:
            return [bool(b) for b in store.lookup_many(self._keys(keys), tree=tree)]
        except Exception as e:  # noqa: BLE001
            self.failures.fail(op, e)
            return [False] * len(keys)

    def _submit(self, job: TransferJob, load: bool) -> None:
        """Queues `job` on the transfers (rows named by its chunk ids) and returns; a job
        that cannot be queued is a failed job."""
        try:
            t = self._transfers
            if t is None:
                raise RuntimeError("no store (the open failed, or shut down)")
            keys = self._keys(self._job_keys[job.job_id])
            rows = [int(c) for c in job.chunk_ids]
            tid = t.submit_load(keys, rows) if load else t.submit_save(keys, rows)
            self._jobs[tid] = (job.job_id, time.perf_counter())
        except Exception as e:  # noqa: BLE001 (closed transfers, ...): a failed job
            self.failures.fail("load" if load else "store", e)
            self._done.append(JobResult(job_id=job.job_id, success=False))

    def _collect(self, done: List[Any]) -> None:
        """Turns finished transfers into vLLM's job results: a store succeeds unless a chunk
        failed (one not admitted under the capacity is a later miss, not a failure); a load
        reports the keys read whole."""
        now = time.perf_counter()
        for tid, kind, outcomes, errors in done:
            entry = self._jobs.pop(tid, None)
            if entry is None:
                continue
            job_id, t0 = entry
            keys = self._job_keys.get(job_id, [])
            load = job_id in self._load_jobs
            op = "load" if load else "store"
            for i, msg in errors[:1]:
                self.failures.fail(op, f"chunk {i}: {msg}")
            if not load:
                self._note_stored(keys, outcomes)
                ok = "failed" not in outcomes
                nbytes = len(keys) * self.block_size_bytes if ok else None
                self._done.append(
                    JobResult(job_id=job_id, success=ok, transfer_time=now - t0, transfer_bytes=nbytes)
                )
                continue
            read = [k for k, o in zip(keys, outcomes) if o == "loaded"]
            if len(read) < len(keys):
                self.failures.fail("load", f"{len(keys) - len(read)} of {len(keys)} chunks missed")
            self._done.append(
                JobResult(
                    job_id=job_id,
                    success=len(read) == len(keys),
                    successful_keys=tuple(read) if 0 < len(read) < len(keys) else None,
                    transfer_time=now - t0,
                    transfer_bytes=len(read) * self.block_size_bytes,
                )
            )

    # -- vLLM's interface ----------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.RETRY
        store = self.store
        if key in self._bad or store is None:
            return LookupResult.MISS
        try:
            # One call: the fold and the index's answer, no system call (the scheduler's
            # thread); a key the index lacks goes to the async lookup below when shared.
            if store.knows_engine_key(self._prefix, key):
                return LookupResult.HIT
        except Exception as e:  # noqa: BLE001
            self.failures.fail("lookup", e)
            return LookupResult.MISS
        if self._async_lookup is not None:
            # Shared: the tree may hold what this store does not know of; asked on a thread.
            found = self._async_lookup.lookup(key, req_context)
            if found is None:
                return LookupResult.RETRY
            return LookupResult.HIT if found else LookupResult.MISS
        return LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Queues the rows' chunks for writing, one chain (chunks already stored are only
        touched); returns at once."""
        keys = list(job_metadata.keys)
        self._job_keys[job_metadata.job_id] = keys
        if self._events_on:
            for ours, k in zip(self._keys(keys), keys):
                self._known.name(ours, k)
        for k in keys:
            self._storing[k] = self._storing.get(k, 0) + 1
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Queues the reads of the chunks into their primary rows; returns at once."""
        self._job_keys[job_metadata.job_id] = list(job_metadata.keys)
        self._load_jobs.add(job_metadata.job_id)
        self._submit(job_metadata, load=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        t = self._transfers
        if t is not None:
            try:
                self._collect(t.drain())
            except Exception as e:  # noqa: BLE001
                self.failures.fail("drain", e)
        results, self._done = self._done, []
        for result in results:
            self._finish(result)
        return results

    def _finish(self, result: JobResult) -> None:
        """Scheduler-thread bookkeeping of a finished job: stored keys leave `_storing` (and
        `_bad`, once stored); a load's failed keys become `_bad`."""
        keys = self._job_keys.pop(result.job_id, [])
        if result.job_id in self._load_jobs:
            self._load_jobs.discard(result.job_id)
            ok = set(keys) if result.success else set(result.successful_keys or ())
            failed = [k for k in keys if k not in ok]
            if len(self._bad) > 100_000:  # bounded: forgetting only costs a failed load
                self._bad.clear()
            self._bad.update(failed)
            if failed and self._async_lookup is not None:
                self._async_lookup.mark_miss(failed)
            return
        for k in keys:
            n = self._storing.pop(k, 0) - 1
            if n > 0:
                self._storing[k] = n
            if result.success:
                self._bad.discard(k)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        store = self.store
        if store is None or not keys:
            return
        try:
            store.touch_many(self._keys(keys))
        except Exception as e:  # noqa: BLE001
            self.failures.fail("touch", e)

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._async_lookup is not None:
            self._async_lookup.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._async_lookup is not None:
            self._async_lookup.flush()

    def drain_jobs(self) -> None:
        """Waits for every submitted job (their results are kept for get_finished_jobs)."""
        t = self._transfers
        try:
            while t is not None and self._jobs:
                self._collect(t.wait(1.0))
        except Exception as e:  # noqa: BLE001
            self.failures.fail("drain", e)

    def shutdown(self) -> None:
        try:
            transfers, self._transfers = self._transfers, None
            if transfers is not None:
                # Runs what is queued, stops the threads, releases the primary rows.
                self._collect(transfers.close())
            if self._async_lookup is not None:
                self._async_lookup.shutdown()
            if self._tail is not None:
                self._tail.close()
            store, self.store = self.store, None
            if store is not None:
                store.close()
            self._flat.release()  # vLLM's primary region closes its mmap after this
        except Exception as e:  # noqa: BLE001
            self.failures.fail("shutdown", e)

    # -- KV events -----------------------------------------------------------------------

    def _event(self, keys: List[OffloadKey], removed: bool) -> None:
        """Tells `keys` stored or removed: one event with the last one when it is of the same
        kind (the order of the keys is kept)."""
        if self._events and self._events[-1].removed == removed:
            self._events[-1].keys.extend(keys)
            return
        self._events.append(
            OffloadingEvent(
                keys=keys,
                medium=self.medium,
                removed=removed,
                locality=self.locality,
                ownership="tierkv",
                removal_expected=True,
            )
        )

    def _note_stored(self, keys: List[OffloadKey], outcomes: List[str]) -> None:
        """A finished store job: its chunks found present already are told stored (those it
        wrote are told from the journal, in its order); those it did not store are forgotten."""
        if not self._events_on:
            return
        present = []
        for ours, o in zip(self._keys(keys), outcomes):
            if o == "present":
                k = self._known.tell_present(ours)
                if k is not None:
                    present.append(k)
            elif o != "written":
                self._known.forget(ours)
        if present:
            self._event(present, removed=False)

    def _resync(self) -> None:
        """Events were missed: what was told stored and is no longer in the store's index is
        told removed (no system call: the index, on the scheduler thread)."""
        told = self._known.told()
        store = self.store
        if not told or store is None:
            return
        held = store.lookup_many(told, tree=False)
        removed = self._known.untell(k for k, h in zip(told, held) if not h)
        if removed:
            self._event(removed, removed=True)

    def take_events(self) -> Iterable[OffloadingEvent]:
        """vLLM's scheduler collects these each step: the chunks of this tier's stores that
        the worker's journal says were stored, then removed (evicted, removed, found corrupt
        or missing, by any process or node), in the journal's order, medium STORAGE. Only with
        vLLM's KV events on; nothing here reads the disk (the journal is followed on a thread
        of its own). Chunks this process never stored are not told: it cannot name them."""
        if self._tail is None:
            return ()
        events, missed = self._tail.take()
        for removed, k in self._known.changes(events):
            self._event([k], removed=removed)
        if missed:
            self._resync()
        out, self._events = self._events, []
        return out

    # -- statistics ----------------------------------------------------------------------

    def tierkv_stats(self) -> Dict[str, Any]:
        """The store's counters (`Store.stats()`), the worker id and the failures per call."""
        out: Dict[str, Any] = {"worker": self.worker, "failures": self.failures.snapshot()}
        try:
            out["store"] = self.store.stats() if self.store is not None else None
        except Exception:  # noqa: BLE001
            out["store"] = None
        return out
