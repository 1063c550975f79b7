"""tierkv as an SGLang HiCache storage backend (the L3 tier under SGLang's host memory pool).

Attach it with SGLang's ``dynamic`` backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config
      '{"backend_name": "tierkv", "module_path": "tierkv_g3.sglang",
        "class_name": "TierkvHiCacheStorage", "interface_v1": 1,
        "hicache_storage_pass_prefix_keys": true,
        "root": "/mnt/nvme/kvcache", "capacity_bytes": 1099511627776}'

(without ``--enable-hierarchical-cache`` SGLang builds no HiCache and ignores the storage
flags; without ``"hicache_storage_pass_prefix_keys": true`` it passes no prefix keys, so each
backup starts a chain of its own)

SGLang builds the class as ``cls(storage_config, kwargs)`` and then calls
``register_mem_pool_host(pool)``; the store is opened there, once the pool's page size,
layout and dtype are known (they are part of the tierkv worker id). With ``"interface_v1":
1`` the controller uses the zero-copy ``batch_get_v1``/``batch_set_v1``: each page's regions
(two for MHA, K and V, which are not contiguous; one for MLA) are read and written in place
with ``Store.get_many_into_vectored``/``put_many_vectored``. Without it, the legacy flat-page
calls (``batch_get``/``batch_set``) are used.

Hybrid models (SGLang's ``HybridCacheController``: SWA, Mamba, indexer pools next to the KV
pool) use the v2 calls: ``register_mem_host_pool_v2`` opens one tierkv worker per pool name,
``batch_get_v2``/``batch_set_v2`` move each ``PoolTransfer``'s pages through its pool's page
regions, ``batch_exists_v2`` applies the hit policies (ALL_PAGES, TRAILING_PAGES; BLOCK_GROUPS
gives no verdict). docs/engines-sglang.md has the details.

SGLang's page keys (64 hex characters of a chained SHA-256) are the tierkv block hashes, used
as they are. A backend must never raise into SGLang's controller threads: every failure here
becomes False / None / 0, is counted (``tierkv_stats()["failures"]``) and is logged at most
once per ``log_interval`` seconds per operation.

Keys in the extra config (besides SGLang's own ``backend_name``, ``module_path``,
``class_name``, ``interface_v1``, its prefetch and prefix-key knobs, and the
``file_storage_path`` it injects for ``--file-storage-path``): ``root`` (required, or
``--file-storage-path``), and any keyword argument of
:class:`tierkv_g3.Store` (``capacity_bytes``, ``capacity_files``, ``policy``, ``engine``,
``verify``, ``direct_io``, ``sync_writes``, ``fd_cache``, ``layout``, ``publish``,
``watermarks``, ``queue_depth``, ``stats_interval``, ``reuse_evicted``, ``sharing``,
``negative_ttl``), and ``log_interval`` (seconds, default 10). ``sharing`` is ``"shared"``
unless given, so several servers of one model (replicas) can use one root; an MLA model's
ranks share one worker (``negative_ttl=0`` unless given).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from typing import Any, Dict, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from . import Store, kv_events
from . import worker_id as worker_id_of
from ._engines import STORE_OPTIONS, FailureLog, close_store, slug, store_options, weights_identity

logger = logging.getLogger(__name__)

# Keys of the extra config that are SGLang's, not the store's: the dynamic factory's, its
# prefetch and prefix-key knobs (a controller that does not pop them passes them on), and the
# `file_storage_path` SGLang injects when the server also has `--file-storage-path`.
_SGLANG_KEYS = (
    "backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
    "hicache_storage_pass_prefix_keys", "prefetch_threshold", "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token", "file_storage_path",
)


def worker_id(config: HiCacheStorageConfig, pool: Any, pool_name: Optional[str] = None) -> str:
    """The tierkv worker id of one SGLang rank's pages: everything that changes a page's bytes
    or which part of the model it holds (model, the checkpoint served (`_checkpoint`), page
    size, layout, dtype, per-token size, the byte order of a page outside page_first (the
    interface's), the TP/PP/CP/DP ranks; for an MLA model, whose ranks hold the same pages, no
    TP rank) is hashed into it, so two models or two shardings never share a block. At most 64
    characters: ``sgl.<model>.p<page>.<rank>.<16 hex>``."""
    sidecar = pool_name is not None and str(pool_name) != "kv"
    # An MLA model's sidecars are replicated as its KV pages are (SGLang's storage writer
    # rank writes them), except Mamba state, which is TP-sharded (every rank writes its own).
    mla = bool(config.is_mla_model) and str(pool_name) != "mamba"
    ident = {
        "model": config.model_name or "",
        "page_size": int(pool.page_size),
        "layout": str(pool.layout),
        "dtype": str(pool.dtype),
        "size_per_token": int(pool.get_size_per_token()),
        "pool": type(pool).__name__,
        "mla": mla,
        "pp": (config.pp_rank, config.pp_size),
        "cp": (config.attn_cp_rank, config.attn_cp_size),
        "dp": getattr(config, "dp_rank", 0),
        "dcp": (getattr(config, "dcp_rank", 0), getattr(config, "dcp_size", 1)),
        "tp": None if mla else (config.tp_rank, config.tp_size),
    }
    ident["checkpoint"] = _checkpoint()
    if sidecar:  # a v2 sidecar pool (SWA, Mamba, indexer, ...): its name is part of its id
        ident["pool_name"] = str(pool_name)
    if str(pool.layout) != "page_first":
        # The byte order of a stored page: SGLang's legacy calls store a page as K of every
        # layer, then V of every layer; the zero-copy v1 calls read its regions K0, V0, K1,
        # V1, ... (one layer's K and V at a time outside page_first). Same length, so only the
        # id can keep one interface from reading the other's pages scrambled.
        v1 = bool((config.extra_config or {}).get("interface_v1"))
        ident["page_order"] = "regions" if v1 else "flat"
    rank = "mla" if mla else f"tp{config.tp_rank}of{config.tp_size}"
    if config.pp_size > 1:
        rank += f"pp{config.pp_rank}"
    tail = f"{slug(str(pool_name), 12)}.p{pool.page_size}" if sidecar else f"p{pool.page_size}"
    tail = f"{tail}.{rank}"
    model = slug(config.model_name or "model", max(1, min(20, 42 - len(tail))))
    return worker_id_of(f"sgl.{model}.{tail}", ident)


def _checkpoint() -> Dict[str, Any]:
    """What identifies the weights this SGLang process serves, beyond the name it serves them
    under (two checkpoints behind one `--served-model-name` must not share pages): their
    identity (`weights_identity`: for a local directory, each weight file's size and a hash
    of its bytes; not its path), revision, dtype, quantization and checksum, from SGLang's
    published model config. Empty outside a process SGLang configured (a pool built alone)."""
    try:
        from sglang.srt.runtime_context import get_model

        m = get_model()
    except Exception as e:  # noqa: BLE001: nothing published in this process
        logger.debug(
            "tierkv: no SGLang model config published (%s): the served name identifies it", e
        )
        return {}
    return {
        "weights": weights_identity(str(m.model_path), m.revision),
        "revision": str(m.revision),
        "dtype": str(m.dtype),
        "quantization": str(m.quantization),
        "checksum": str(getattr(m, "model_checksum", None)),
    }


def _byte_view(t: Any) -> Any:
    """A contiguous tensor's bytes as a uint8 numpy array sharing its memory (bf16 and fp8,
    which numpy cannot hold, included)."""
    if isinstance(t, torch.Tensor):
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("pages must be contiguous CPU tensors")
        return t.reshape(-1).view(torch.uint8).numpy()
    return t


def _pool_memory(pool: Any) -> Optional[List[Any]]:
    """The host pool's memory as byte views of its `kv_buffer` (one tensor, or one per layer),
    made once per pool: the store's region calls take the pages' addresses inside it, with
    no Python object per region. None for a pool without one we can view (the ctypes path
    of `_regions` then)."""
    buf = getattr(pool, "kv_buffer", None)
    if buf is None:
        return None
    try:
        return [_byte_view(t) for t in (buf if isinstance(buf, (list, tuple)) else [buf])]
    except Exception:  # noqa: BLE001: not contiguous CPU tensors
        return None


def _regions(ptrs: List[int], sizes: List[int], n: int) -> List[List[Any]]:
    """Per key, its page's regions as writable buffers over the host pool's memory (no copy):
    `get_page_buffer_meta` gives the regions of `n` pages in page order. Only for a pool whose
    memory `_pool_memory` cannot view: a ctypes object per region."""
    if n == 0 or len(ptrs) % n or len(ptrs) != len(sizes):
        raise ValueError(f"{len(ptrs)} regions for {n} pages")
    r = len(ptrs) // n
    views = [(ctypes.c_ubyte * s).from_address(p) for p, s in zip(ptrs, sizes)]
    return [views[i * r : (i + 1) * r] for i in range(n)]


# Samples kept per metric between two get_stats calls: SGLang calls get_stats only with its
# storage metrics on, so without them nothing else empties the lists.
_METRIC_SAMPLES = 4096


def _new_metrics() -> Dict[str, Any]:
    """Per metric, its last `_METRIC_SAMPLES` samples."""
    names = ("prefetch_pgs", "backup_pgs", "prefetch_bw", "backup_bw")
    return {k: collections.deque(maxlen=_METRIC_SAMPLES) for k in names}


class TierkvHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage over a tierkv store: one tierkv worker per TP/PP/CP rank (one
    shared by all ranks of an MLA model, written by SGLang's storage writer rank, read by the
    others), under the ``root`` of the extra config."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        # `--file-storage-path` (which SGLang injects as file_storage_path) is the root when the
        # extra config names none.
        root = extra.get("root") or extra.get("file_storage_path")
        if not root:
            raise ValueError(
                'tierkv HiCache backend: the extra config needs "root" (or the server '
                "--file-storage-path)"
            )
        self.root = str(root)
        unknown = set(extra) - set(STORE_OPTIONS) - set(_SGLANG_KEYS) - {"root", "log_interval", "kv_events"}
        if unknown:
            raise ValueError(f"tierkv HiCache backend: unknown extra config keys {sorted(unknown)}")
        self.options = store_options(extra)
        # A KV event publisher of the pages on disk (docs/engines-sglang.md): SGLang's
        # storage backends have no event hook, so it publishes on a ZMQ socket of its own.
        self.kv_events_config = extra.get("kv_events")
        if self.kv_events_config is not None:
            kv_events.check_config(self.kv_events_config)
            self.options.setdefault("events", True)
        self.kv_events: Optional[kv_events.TreeEvents] = None
        self.log_interval = float(extra.get("log_interval", 10.0))
        self.failures = FailureLog(logger, "tierkv HiCache backend", self.log_interval)
        self.writer = bool(storage_config.is_storage_writer)
        self.mem_pool_host: Any = None
        self.worker: Optional[str] = None
        self.store: Optional[Store] = None
        self._lock = threading.Lock()
        # v2: the host pool and the store of each pool name ("kv": the anchor pool's).
        self.pools: Dict[str, Any] = {}
        self.pool_stores: Dict[str, Optional[Store]] = {}
        # id(pool) -> its memory for the region calls (`_pool_memory`), or None.
        self._memory: Dict[int, Optional[List[Any]]] = {}
        self._metrics = _new_metrics()

    # -- setup -------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Opens the store: the worker id needs the pool's geometry. A store that cannot be
        opened (root not writable, ...) is logged; every call then misses or fails."""
        super().register_mem_pool_host(mem_pool_host)
        try:
            self.worker = worker_id(self.config, mem_pool_host)
            self._open()
        except Exception as e:  # noqa: BLE001: never raise into SGLang
            self._fail("open", e)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's v2 pools (HybridCacheController): each pool name gets its own tierkv
        worker (the pool's geometry and name in its id), so pools never share a block. The
        "kv" pool is the anchor pool of `register_mem_pool_host`, and its store. A store that
        cannot be opened is logged; that pool then misses."""
        name = str(host_pool_name)
        super().register_mem_host_pool_v2(host_pool, name)
        self.pools[name] = host_pool
        if name == "kv":
            return
        old = self.pool_stores.pop(name, None)
        if old is not None:
            old.close()
        try:
            worker = worker_id(self.config, host_pool, name)
            self.pool_stores[name] = Store(self.root, worker, **self._options(self._shared(name)))
            logger.info("tierkv HiCache backend: pool %s in worker %s", name, worker)
        except Exception as e:  # noqa: BLE001: never raise into SGLang
            self._fail("open", e)

    def _open(self) -> None:
        self.store = Store(self.root, self.worker, **self._options(self._shared("kv")))
        logger.info("tierkv HiCache backend: %s (worker %s)", self.store.dir, self.worker)
        c = self.config
        # One publisher per data-parallel rank (its port offset by it), on its first TP/PP
        # rank: every TP rank stores the same pages (their hashes), and an MLA model's ranks
        # one worker.
        if self.kv_events_config is not None and c.tp_rank == 0 and c.pp_rank == 0:
            self.kv_events = kv_events.from_config(
                self.kv_events_config, self.root, self.worker, name=kv_events.sglang_hash,
                medium=kv_events.MEDIUM_DISK, block_size=int(self.mem_pool_host.page_size),
                rank=int(getattr(c, "dp_rank", 0) or 0),
            )

    def _shared(self, name: str) -> bool:
        """Whether all ranks share the pool's worker (an MLA model's pools but Mamba's: the
        same rule as `worker_id`)."""
        return bool(self.config.is_mla_model) and name != "mamba"

    def _options(self, shared: bool) -> Dict[str, Any]:
        """The Store options of a worker: those of the extra config, `sharing="shared"` unless
        given (several servers of one model on one root, as replicas run, open the same
        workers), and for a worker all ranks share `negative_ttl=0` unless given."""
        options = dict(self.options)
        options.setdefault("sharing", "shared")
        if shared:
            # All ranks of an MLA model open its one worker: SGLang's storage writer rank
            # writes, the others read, each a "shared" store (a key its index lacks is
            # looked up in the tree; a miss is remembered for negative_ttl, 0 by default
            # here, as ranks ask for pages the writer may have just stored).
            options.setdefault("sharing", "shared")
            options.setdefault("negative_ttl", 0.0)
        return options

    def close(self) -> None:
        events, self.kv_events = self.kv_events, None
        kv_events.close(events)
        stores, self.pool_stores = self.pool_stores, {}
        for store in stores.values():
            try:
                store.close()
            except Exception as e:  # noqa: BLE001
                self._fail("close", e)
        store, self.store = self.store, None
        close_store(store, self._fail)

    # -- failures ------------------------------------------------------------------------

    def _fail(self, op: str, err: Any) -> None:
        """Counts a failure of `op` and logs it, at most once per log_interval per op."""
        self.failures.fail(op, err)

    def _store(self) -> Store:
        store = self.store
        if store is None:
            raise RuntimeError("no store (not registered, or the open failed)")
        return store

    # -- zero-copy v1 ----------------------------------------------------------------------

    def batch_get_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> List[bool]:
        """Reads each page straight into its host pool regions; True per page read whole."""
        if not keys:
            return []
        try:
            t0 = time.perf_counter()
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            want = sum(sizes) // len(keys)
            got = self._get(self._store(), self.mem_pool_host, keys, ptrs, sizes)
            ok = [n == want for n in got]
            self._record("prefetch", sum(ok), sum(ok) * want, t0)
            return ok
        except Exception as e:  # noqa: BLE001
            self._fail("batch_get_v1", e)
            return [False] * len(keys)

    def batch_set_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> List[bool]:
        """Writes each page from its host pool regions (no copy); pages already stored (the
        leading run SGLang sends again) are not rewritten."""
        if not keys:
            return []
        if not self.writer:
            return [True] * len(keys)
        try:
            t0 = time.perf_counter()
            store = self._store()
            have = store.contains_prefix(keys)
            if have == len(keys):
                return [True] * len(keys)
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            # The chain hangs from the page before: the last stored one of this call, or the
            # last of the sequence's earlier pages (SGLang's prefix_keys). If that one is no
            # longer stored, nothing is: no lookup from the sequence start could reach it.
            prefix = getattr(extra_info, "prefix_keys", None) or []
            parent = keys[have - 1] if have else (prefix[-1] if prefix else None)
            r = len(ptrs) // len(keys)
            self._put(store, self.mem_pool_host, keys[have:], ptrs[have * r :], sizes[have * r :],
                      offer=True, parent=parent)
            self._record("backup", len(keys) - have, sum(sizes[have * r :]), t0)
            return self._stored_prefix(keys)
        except Exception as e:  # noqa: BLE001
            self._fail("batch_set_v1", e)
            return self._stored_prefix(keys)

    def _pool_memory(self, pool: Any) -> Optional[List[Any]]:
        key = id(pool)
        if key not in self._memory:
            self._memory[key] = _pool_memory(pool)
        return self._memory[key]

    def _outside(self, pool: Any, e: ValueError) -> None:
        """A region the pool's `kv_buffer` does not hold: this pool keeps its pages elsewhere,
        so it goes by the ctypes path from now on. Any other refusal is raised."""
        if "not inside the memory given" not in str(e):
            raise e
        logger.info("tierkv HiCache backend: %s; this pool's pages go through ctypes buffers", e)
        self._memory[id(pool)] = None

    def _get(self, store: Store, pool: Any, keys: List[str], ptrs: List[int], sizes: List[int]) -> List[Any]:
        """Reads each page into its regions (`get_page_buffer_meta`'s, in page order): named
        by address inside the pool's memory when it has one, else as ctypes buffers."""
        memory = self._pool_memory(pool)
        if memory is not None:
            try:
                return store.get_many_into_regions(keys, memory, ptrs, sizes)
            except ValueError as e:
                self._outside(pool, e)  # refused before any I/O
        return store.get_many_into_vectored(keys, _regions(ptrs, sizes, len(keys)))

    def _put(self, store: Store, pool: Any, keys: List[str], ptrs: List[int], sizes: List[int],
             offer: bool = False, parent: Optional[str] = None) -> None:
        """Writes each page from its regions, as `_get` reads them: `put_many` semantics, or
        with `offer`, `offer_many` under `parent` (None: the chain's root)."""
        if not keys:
            return
        memory = self._pool_memory(pool)
        if memory is not None:
            try:
                if offer:
                    store.offer_many_regions(keys, memory, ptrs, sizes, parent=parent)
                else:
                    store.put_many_regions(keys, memory, ptrs, sizes)
                return
            except ValueError as e:
                self._outside(pool, e)  # refused before any I/O
        parts = _regions(ptrs, sizes, len(keys))
        if offer:
            store.offer_many_vectored(keys, parts, parent=parent)
        else:
            store.put_many_vectored(keys, parts)

    def _stored_prefix(self, keys: List[str]) -> List[bool]:
        """True for the leading pages that are stored (a put that fails part way keeps its
        chain's stored blocks a prefix; an offer under a parent no longer stored stores
        nothing), False for the rest."""
        try:
            have = int(self._store().contains_prefix(keys))
        except Exception:  # noqa: BLE001
            have = 0
        return [True] * have + [False] * (len(keys) - have)

    # -- v2: several pools (PoolTransfer) ---------------------------------------------------

    def _pool(self, name: Any) -> tuple:
        """The host pool and store of a v2 pool name; raises for one not registered."""
        name = str(name)
        if name == "kv":
            return self.pools.get(name, self.mem_pool_host), self._store()
        store = self.pool_stores.get(name)
        if name not in self.pools or store is None:
            raise RuntimeError(f"pool {name!r} not registered (or its store did not open)")
        return self.pools[name], store

    def batch_exists_v2(
        self, keys: List[str], pool_transfers: Optional[List[Any]] = None, extra_info: Any = None
    ) -> Any:
        """The KV pool's stored prefix, cut by each sidecar pool's hit policy: ALL_PAGES,
        every page up to the cut is stored in that pool; TRAILING_PAGES, the last N pages
        before the cut (N = len(transfer.keys), at least 1); so a missing sidecar page
        shrinks the hit. `restorable_prefix_pages`: every prefix length all pools can
        serve (a TRAILING_PAGES pool leaves holes). BLOCK_GROUPS pools are not supported:
        they give no verdict and never gate the KV hit (SGLang's contract for them)."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransferResult

        try:
            kv = int(self._store().contains_prefix(keys)) if keys else 0
            hits: Dict[str, int] = {"kv": kv} if kv else {}
            restorable = set(range(1, kv + 1))
            for t in pool_transfers or []:
                if not restorable:
                    break
                if t.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                    continue
                name = str(t.name)
                have = self._pool(name)[1].contains_many(keys[:kv])
                if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                    n = max(1, len(t.keys or ()))
                    ok = {p for p in range(1, kv + 1) if all(have[max(0, p - n) : p])}
                else:
                    ok = set(range(1, (have.index(False) if False in have else kv) + 1))
                if ok:
                    hits[name] = max(ok)
                restorable &= ok
            pages = sorted(restorable)
            return PoolTransferResult(pages[-1] if pages else 0, hits, pages)
        except Exception as e:  # noqa: BLE001
            self._fail("batch_exists_v2", e)
            return PoolTransferResult(0, {}, [])

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        """Reads each transfer's pages straight into its pool's page regions; True per page
        read whole."""
        return {str(t.name): self._pool_io(t, extra_info, False) for t in transfers}

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        """Writes each transfer's pages from its pool's page regions (no copy); True per page
        stored."""
        return {str(t.name): self._pool_io(t, extra_info, True) for t in transfers}

    def _pool_io(self, t: Any, extra_info: Any, write: bool) -> List[bool]:
        """One PoolTransfer to or from its pool's store. The KV pool's pages go through the
        v1 calls (the chain under `prefix_keys`); a sidecar pool's pages are stored without
        a parent (a TRAILING_PAGES pool holds only the window before each cut, whose earlier
        pages it never stores)."""
        keys = list(t.keys or [])
        name = str(t.name)
        op = "batch_set_v2" if write else "batch_get_v2"
        if not keys:
            return []
        try:
            if name == "kv":
                f = self.batch_set_v1 if write else self.batch_get_v1
                return f(keys, t.host_indices, extra_info)
            pool, store = self._pool(name)
            if write and not self.writer and self._shared(name):
                return [True] * len(keys)  # the storage writer rank writes shared pools
            n = 0 if t.host_indices is None else int(t.host_indices.numel())
            if n != len(keys) * int(pool.page_size):
                raise ValueError(f"pool {name}: {n} host indices for {len(keys)} pages")
            t0 = time.perf_counter()
            ptrs, sizes = pool.get_page_buffer_meta(t.host_indices)
            want = sum(sizes) // len(keys)
            if write:
                try:
                    self._put(store, pool, keys, ptrs, sizes)
                except Exception as e:  # noqa: BLE001: some pages may have been stored
                    self._fail(op, e)
                ok = list(store.contains_many(keys))
            else:
                ok = [g == want for g in self._get(store, pool, keys, ptrs, sizes)]
            self._record("backup" if write else "prefetch", sum(ok), sum(ok) * want, t0)
            return ok
        except Exception as e:  # noqa: BLE001
            self._fail(op, e)
            return [False] * len(keys)

    # -- legacy flat pages ---------------------------------------------------------------

    def get(
        self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> List[Optional[torch.Tensor]]:
        """Reads each page into its flat target tensor (a fresh flat page of the host pool when
        none is given); None per page missed."""
        if not keys:
            return []
        try:
            if target_locations is None:
                target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
            bufs = [_byte_view(t) for t in target_locations]
            got = self._store().get_many_into(keys, bufs)
            return [t if n == b.nbytes else None for t, b, n in zip(target_locations, bufs, got)]
        except Exception as e:  # noqa: BLE001
            self._fail("batch_get", e)
            return [None] * len(keys)

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        """Writes flat pages (tensors from the host pool's `get_data_page`); True if all were."""
        if not keys:
            return True
        if not self.writer:
            return True
        try:
            if values is None or len(values) != len(keys):
                raise ValueError("one value per key")
            store = self._store()
            have = store.contains_prefix(keys)
            if have < len(keys):
                store.put_many(keys[have:], [_byte_view(v) for v in values[have:]])
            return True
        except Exception as e:  # noqa: BLE001
            self._fail("batch_set", e)
            return False

    # -- queries ---------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        try:
            return bool(self._store().contains_many([key])[0])
        except Exception as e:  # noqa: BLE001
            self._fail("exists", e)
            return False

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading keys are stored (SGLang's prefetch hit query)."""
        if not keys:
            return 0
        try:
            return int(self._store().contains_prefix(keys))
        except Exception as e:  # noqa: BLE001
            self._fail("batch_exists", e)
            return 0

    def clear(self) -> None:
        """Drops every page of this worker and of the v2 sidecar pools' workers (SGLang's
        flush of the storage tier, which it runs on every rank): `Store.clear()`, through the
        store and its namespace layer. The stores stay open and the directories stay, so the
        other ranks and replicas on the same workers keep working, and keep what is backed
        up after."""
        stores = list(self.pool_stores.items())
        if self.writer and self.store is not None:
            stores.append(("kv", self.store))
        for _name, store in stores:
            try:
                store.clear()
            except Exception as e:  # noqa: BLE001
                self._fail("clear", e)

    # -- statistics ------------------------------------------------------------------------

    def _record(self, kind: str, pages: int, nbytes: int, t0: float) -> None:
        dt = time.perf_counter() - t0
        with self._lock:
            self._metrics[f"{kind}_pgs"].append(pages)
            if dt > 0 and pages:
                self._metrics[f"{kind}_bw"].append(nbytes / dt / 1e9)

    def get_stats(self) -> Any:
        """SGLang's `StorageMetrics` (pages and GB/s per prefetch and backup since the last
        call), with the store's counters and this backend's failures as its `tierkv`
        attribute."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            with self._lock:
                m, self._metrics = self._metrics, _new_metrics()
            out = StorageMetrics(
                prefetch_pgs=list(m["prefetch_pgs"]),
                backup_pgs=list(m["backup_pgs"]),
                prefetch_bandwidth=list(m["prefetch_bw"]),
                backup_bandwidth=list(m["backup_bw"]),
            )
            out.tierkv = self.tierkv_stats()
            return out
        except Exception as e:  # noqa: BLE001
            self._fail("get_stats", e)
            return None

    def tierkv_stats(self) -> Dict[str, Any]:
        """The store's counters (`Store.stats()`), the worker id and the failures per call."""
        out: Dict[str, Any] = {"worker": self.worker, "failures": self.failures.snapshot()}
        try:
            out["store"] = self._store().stats()
        except Exception:  # noqa: BLE001
            out["store"] = None
        return out
