"""tierkv as an LMCache storage plugin (non-MP mode: a backend inside each LMCacheEngine).

LMCache loads it from its config (YAML, or the ``LMCACHE_*`` environment)::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    storage_plugins: ["tierkv"]
    extra_config:
      storage_plugin.tierkv.module_path: tierkv_g3.lmcache
      storage_plugin.tierkv.class_name: TierkvStoragePlugin
      storage_plugin.tierkv.root: /mnt/nvme/kvcache
      storage_plugin.tierkv.capacity_bytes: 1099511627776

Options are ``storage_plugin.<name>.<option>`` (``<name>`` is the name in
``storage_plugins``): ``root`` (required), any keyword argument of :class:`tierkv_g3.Store`
(``capacity_bytes``, ``policy``, ``verify``, ...), ``max_pending_bytes`` (bytes of chunks
queued for writing at most, default half of LMCache's CPU pool, ``max_local_cpu_size``: the
queued objects hold that memory; past it chunks are dropped and counted, never waited for),
``put_threads`` (accepted for older configs; the offloader writes on one thread of its own)
and ``log_interval`` (seconds, default 10).

**Blocks.** One tierkv block per LMCache chunk: a 4 KiB self-describing prefix (magic, the
chunk's key string, shapes, dtypes, memory format, byte count, cached positions) and the
chunk's bytes, written with ``put_many_vectored`` straight from the ``MemoryObj`` (no copy).
A get allocates the ``MemoryObj`` from LMCache's own CPU allocator (``LocalCPUBackend``) at
the full-chunk geometry and reads the block into [prefix, the object's bytes] in place; a
shorter chunk (the unfull last chunk of a request) is moved into an object of its own shape.

**Keys.** The tierkv worker id is ``lmc.<model>.w<worker>of<world>.<16 hex>``, the hex a
digest of model name, world size, worker id, KV dtype and shape, chunk size, MLA and the
engine's memory format (``tierkv_g3.worker_id``); the 64-hex block key is
``tierkv_g3.engine_key(b"lmcache", <LMCache's whole key string>)`` (model, world size, worker
id, chunk hash, dtype, tags, layer), so two models, two shardings or two dtypes never share a
block.

**Never an exception into LMCache**: every failure (no store, a full disk, an I/O error, a
foreign or corrupt block) is a miss / False / 0, counted (``tierkv_stats()["failures"]``) and
logged at most once per ``log_interval`` per operation. Puts go to tierkv's write-behind
``Offloader`` (the Rust engine API; no Python thread or queue here):
``batched_submit_put_task`` offers the chunks and returns at once, the offloader's own
thread writes them and, once each is written or dropped, releases its ``MemoryObj``;
``exists_in_put_tasks`` is true until the block is written; ``close`` writes what is queued.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from . import Offloader, Store, engine_key, kv_events
from . import worker_id as _worker_id
from ._engines import STORE_OPTIONS, FailureLog, Names, close_store, slug, store_options

logger = logging.getLogger(__name__)

PREFIX = 4096
MAGIC = b"TKVLMC\x00\x01"
_HEAD = struct.Struct("<8sI")
_KEY_CONTEXT = b"lmcache"

Geometry = Tuple[Tuple[torch.Size, ...], Tuple[torch.dtype, ...], MemoryFormat]


def block_key(key: CacheEngineKey) -> str:
    """The tierkv key of an LMCache key: 64 hex characters of ``engine_key`` (the Rust
    ``BlockHash::of_engine_key``) over LMCache's key string (model, world size, worker id, chunk
    hash, dtype, tags; a layer key's layer)."""
    return engine_key(_KEY_CONTEXT, key.to_string().encode()).hex()


def engine_format(config: Any, metadata: Any) -> MemoryFormat:
    """The memory format LMCacheEngine allocates chunks in (its constructor's rule)."""
    if metadata.use_mla:
        return MemoryFormat.KV_MLA_FMT
    if config.use_layerwise:
        return MemoryFormat.KV_2TD if config.enable_blending else MemoryFormat.KV_T2D
    return MemoryFormat.KV_2LTD


def worker_id(config: Any, metadata: Any) -> str:
    """The tierkv worker of one LMCache worker: ``lmc.<model>.w<worker>of<world>.<digest>``,
    the digest over everything that changes a chunk's bytes or which part of the model it
    holds. At most 64 characters."""
    ident = {
        "model": metadata.model_name,
        "world_size": metadata.world_size,
        "worker_id": metadata.worker_id,
        "kv_dtype": str(metadata.kv_dtype),
        "kv_shape": [int(d) for d in metadata.kv_shape],
        "chunk_size": int(config.chunk_size),
        "mla": bool(metadata.use_mla),
        "fmt": engine_format(config, metadata).name,
    }
    w = f"w{metadata.worker_id}of{metadata.world_size}"
    return _worker_id(f"lmc.{slug(metadata.model_name or 'model', 20)}.{w}", ident)


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return d


def geometry(obj: MemoryObj) -> Geometry:
    m = obj.metadata
    shapes = tuple(m.shapes) if m.shapes else (m.shape,)
    dtypes = tuple(m.dtypes) if m.dtypes else (m.dtype,)
    return tuple(torch.Size(s) for s in shapes), dtypes, m.fmt


def nbytes_of(geom: Geometry) -> int:
    return sum(s.numel() * d.itemsize for s, d in zip(geom[0], geom[1]))


def encode_prefix(key: CacheEngineKey, obj: MemoryObj, nbytes: int) -> bytes:
    """The 4 KiB prefix of a chunk's block: magic, length, JSON metadata, zeros."""
    shapes, dtypes, fmt = geometry(obj)
    pos = obj.metadata.cached_positions
    meta = {
        "key": key.to_string(),
        "shapes": [list(s) for s in shapes],
        "dtypes": [str(d) for d in dtypes],
        "fmt": fmt.name,
        "nbytes": nbytes,
        "cached_positions": None
        if pos is None
        else {"dtype": str(pos.dtype), "values": pos.tolist()},
    }
    body = json.dumps(meta, separators=(",", ":")).encode()
    if _HEAD.size + len(body) > PREFIX:
        raise ValueError(f"chunk metadata of {len(body)} bytes does not fit the prefix")
    return (_HEAD.pack(MAGIC, len(body)) + body).ljust(PREFIX, b"\0")


def decode_prefix(prefix: Any, key: CacheEngineKey) -> Tuple[Geometry, int, Optional[torch.Tensor]]:
    """Geometry, byte count and cached positions from a block's prefix; ValueError for a
    block that is not this key's chunk (a foreign file, a damaged prefix)."""
    magic, n = _HEAD.unpack_from(prefix, 0)
    if magic != MAGIC or n > PREFIX - _HEAD.size:
        raise ValueError("not a tierkv LMCache block (magic)")
    meta = json.loads(bytes(prefix[_HEAD.size : _HEAD.size + n]))
    if meta["key"] != key.to_string():
        raise ValueError(f"the block holds {meta['key']!r}, not this key")
    geom = (
        tuple(torch.Size(s) for s in meta["shapes"]),
        tuple(_dtype(d) for d in meta["dtypes"]),
        MemoryFormat[meta["fmt"]],
    )
    pos = meta.get("cached_positions")
    positions = None if pos is None else torch.tensor(pos["values"], dtype=_dtype(pos["dtype"]))
    return geom, int(meta["nbytes"]), positions


# The plugin's own options (besides any keyword argument of tierkv_g3.Store).
_PLUGIN_KEYS = {
    "module_path", "class_name", "root", "log_interval", "max_pending_bytes", "put_threads",
    "kv_events",
}


def _json_or_dict(value: Any) -> Any:
    """A config value given as JSON text (LMCache's environment config) or as an object."""
    if isinstance(value, str):
        return json.loads(value)
    return value


def plugin_options(extra: Dict[str, Any], cls: type) -> Tuple[str, Dict[str, Any]]:
    """This plugin's name and options: the ``storage_plugin.<name>.*`` keys of the plugin
    whose module_path and class_name are this class's."""
    mod, name = cls.__module__, cls.__name__
    for k, v in extra.items():
        if k.startswith("storage_plugin.") and k.endswith(".class_name") and v == name:
            plugin = k[len("storage_plugin.") : -len(".class_name")]
            prefix = f"storage_plugin.{plugin}."
            if extra.get(prefix + "module_path") == mod:
                return plugin, {
                    k2[len(prefix) :]: v2 for k2, v2 in extra.items() if k2.startswith(prefix)
                }
    raise ValueError(f"no storage_plugin.<name>.class_name {name} in extra_config")


class TierkvStoragePlugin(StoragePluginInterface):
    """An LMCache storage plugin over one tierkv worker under ``root``."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
    ):
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        self.name, opts = plugin_options(dict(config.extra_config or {}), type(self))
        unknown = set(opts) - set(STORE_OPTIONS) - _PLUGIN_KEYS
        if unknown:
            # A misspelt option (capacity_byte) would leave the store unbounded, silently.
            raise ValueError(
                "tierkv LMCache plugin: unknown option(s) "
                + ", ".join(f"storage_plugin.{self.name}.{k}" for k in sorted(unknown))
            )
        if not opts.get("root"):
            raise ValueError(f"extra_config needs storage_plugin.{self.name}.root")
        self.root = str(opts["root"])
        self.options = store_options(opts)
        # Several `lmcache server`s or engines of one model on one root open the same worker.
        self.options.setdefault("sharing", "shared")
        self.failures = FailureLog(
            logger, f"tierkv LMCache plugin {self.name}", float(opts.get("log_interval", 10))
        )
        cpu_pool = float(getattr(config, "max_local_cpu_size", 1.0)) * 2**30
        self.max_pending_bytes = int(opts.get("max_pending_bytes", cpu_pool / 2))
        self.worker = worker_id(config, metadata)
        self.fmt = engine_format(config, metadata)
        self._dropped = 0
        self._failed_writes = 0  # the offloader's failed writes already counted as failures
        self.store: Optional[Store] = None
        self._offloader: Optional[Offloader] = None
        # A KV event publisher of the chunks on disk (docs/engines-lmcache.md): a plugin
        # cannot reach LMCache's own event list, so it publishes on a ZMQ socket of its own.
        events_config = _json_or_dict(opts.get("kv_events"))
        if events_config is not None:
            kv_events.check_config(events_config)
            self.options.setdefault("events", True)
        self.kv_events: Optional[kv_events.TreeEvents] = None
        # Our key -> LMCache's chunk hash, of the chunks this engine offered (the newest
        # 2**20): the names its events tell them by.
        self._chunk_names = Names()
        try:
            self.store = Store(self.root, self.worker, **self.options)
            # Every rank stores the same chunk hashes: the first rank publishes.
            if events_config is not None and int(getattr(metadata, "worker_id", 0) or 0) == 0:
                self.kv_events = kv_events.from_config(
                    events_config, self.root, self.worker, name=self._chunk_names.get,
                    medium=kv_events.MEDIUM_STORAGE, block_size=int(config.chunk_size),
                )
            # The bound is of chunk bytes; each chunk's payload also carries its prefix.
            chunks = max(1, self.max_pending_bytes // max(1, nbytes_of(self._full_geometry())))
            self._offloader = Offloader(
                self.store, max_bytes=self.max_pending_bytes + chunks * PREFIX
            )
            logger.info("tierkv LMCache plugin %s: %s", self.name, self.store.dir)
        except Exception as e:  # noqa: BLE001: never raise into LMCache
            self.failures.fail("open", e)

    def __str__(self) -> str:
        return f"TierkvStoragePlugin({self.name})"

    def _store(self) -> Store:
        store = self.store
        if store is None:
            raise RuntimeError("no store (the open failed, or closed)")
        return store

    # -- lookups ---------------------------------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.batched_contains([key], pin) == 1

    def batched_contains(self, keys: List[CacheEngineKey], pin: bool = False) -> int:
        """How many leading keys are stored (LMCache's prefix lookup). With `pin`, those
        blocks are pinned (`Store.pin_many`): this store does not evict them until LMCache
        unpins them (`lookup_unpin` after the retrieve), so what the lookup found is still
        there when it is read; only the keys pinned count."""
        if not keys:
            return 0
        try:
            store = self._store()
            hkeys = [block_key(k) for k in keys]
            n = int(store.contains_prefix(hkeys))
            if pin and n:
                pinned = store.pin_many(hkeys[:n])
                held = pinned.index(False) if False in pinned else n
                # A block gone in between ends the prefix: the pins after it are released.
                store.unpin_many([h for h, p in zip(hkeys[held:n], pinned[held:]) if p])
                n = held
            return n
        except Exception as e:  # noqa: BLE001
            self.failures.fail("contains", e)
            return 0

    async def batched_async_contains(
        self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False
    ) -> int:
        return self.batched_contains(keys, pin)

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        off = self._offloader
        try:
            return off is not None and off.is_queued(block_key(key))
        except Exception as e:  # noqa: BLE001
            self.failures.fail("exists_in_put_tasks", e)
            return False

    def pin(self, key: CacheEngineKey) -> bool:
        return self.batched_contains([key], pin=True) == 1

    def unpin(self, key: CacheEngineKey) -> bool:
        """Releases one pin of `key` (`pin`, or a lookup with `pin=True`)."""
        try:
            self._store().unpin_many([block_key(key)])
            return True
        except Exception as e:  # noqa: BLE001
            self.failures.fail("unpin", e)
            return False

    def touch_cache(self) -> None:
        return None

    # -- puts ------------------------------------------------------------------------------

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: List[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Optional[Callable[[CacheEngineKey], None]] = None,
    ) -> None:
        """Offers the chunks ([prefix, the object's bytes], one chain, root first) to the
        offloader and returns: each object is referenced (ref_count_up) until its block is
        written or dropped. Chunks already queued or stored are not written again; past
        ``max_pending_bytes`` queued the rest of the batch is dropped (counted), never
        waited for."""
        try:
            off = self._offloader
            if off is None:
                raise RuntimeError("no store (the open failed, or closed)")
            hkeys, parts, releases = [], [], []
            for key, obj in zip(keys, objs):
                data = obj.byte_array
                parts.append([encode_prefix(key, obj, len(data)), data])
                hkeys.append(block_key(key))
                if self.kv_events is not None:
                    self._chunk_names.name(bytes.fromhex(hkeys[-1]), key.chunk_hash)
                obj.ref_count_up()
                releases.append(self._release(obj, key, hkeys[-1], on_complete_callback))
            got = off.offer(hkeys, parts, releases=releases)
            self._dropped += int(got["dropped"])
        except Exception as e:  # noqa: BLE001
            self.failures.fail("put", e)
        self._offloader_stats()
        return None

    def _offloader_stats(self) -> Dict[str, Any]:
        """The offloader's counters; the writes it saw fail since the last look are counted
        (and logged) as put failures."""
        off = self._offloader
        try:
            stats = off.stats() if off is not None else {}
        except Exception:  # noqa: BLE001 (closed meanwhile)
            return {}
        failed = int(stats.get("failed", 0))
        if failed > self._failed_writes:
            self.failures.fail(
                "put", f"{failed - self._failed_writes} chunk writes failed (the store's errors "
                "are in its log)"
            )
            self._failed_writes = failed
        return stats

    def _release(
        self,
        obj: MemoryObj,
        key: CacheEngineKey,
        hkey: str,
        on_complete: Optional[Callable[[CacheEngineKey], None]],
    ) -> Callable[[], None]:
        """What the offloader's thread calls once `obj`'s chunk is written or dropped: the
        object released, and LMCache's callback told of a chunk that is stored."""

        def release() -> None:
            obj.ref_count_down()
            if on_complete is None:
                return
            try:
                store = self.store
                if store is not None and store.contains_many([hkey])[0]:
                    on_complete(key)
            except Exception as e:  # noqa: BLE001
                self.failures.fail("on_complete_callback", e)

        return release

    # -- gets ------------------------------------------------------------------------------

    def _full_geometry(self) -> Geometry:
        shapes = tuple(self.metadata.get_shapes())
        dtypes = tuple(self.metadata.get_dtypes())
        return shapes, dtypes, self.fmt

    def _allocate(self, geom: Geometry) -> Optional[MemoryObj]:
        return self.local_cpu_backend.allocate(
            list(geom[0]), list(geom[1]), geom[2], eviction=True, busy_loop=False
        )

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """Reads each chunk in place into a MemoryObj of LMCache's CPU allocator; None per
        chunk missed (absent, evicted, corrupt, foreign, no memory)."""
        if not keys:
            return []
        objs: List[Optional[MemoryObj]] = []
        try:
            store = self._store()
            full = self._full_geometry()
            prefixes = [bytearray(PREFIX) for _ in keys]
            for _ in keys:
                objs.append(self._allocate(full))
            idx = [i for i, o in enumerate(objs) if o is not None]
            if len(idx) < len(keys):
                self.failures.fail("allocate", f"{len(keys) - len(idx)} chunks found no memory")
            parts = [[prefixes[i], objs[i].byte_array] for i in idx]  # type: ignore[union-attr]
            got = self._read(store, [keys[i] for i in idx], parts)
            lengths: List[Optional[int]] = [None] * len(keys)
            for i, n in zip(idx, got):
                lengths[i] = n
            return [self._finish(k, o, p, n) for k, o, p, n in zip(keys, objs, prefixes, lengths)]
        except Exception as e:  # noqa: BLE001
            self.failures.fail("get", e)
            for o in objs:
                if o is not None:
                    o.ref_count_down()
            return [None] * len(keys)

    def _read(
        self, store: Store, keys: List[CacheEngineKey], parts: List[List[Any]]
    ) -> List[Optional[int]]:
        """The batch read; a batch the store refuses (a block larger than a full chunk: not
        this engine's) is read key by key, each refused key a miss."""
        hkeys = [block_key(k) for k in keys]
        try:
            return list(store.get_many_into_vectored(hkeys, parts))
        except Exception as e:  # noqa: BLE001
            self.failures.fail("get", e)
        out: List[Optional[int]] = []
        for h, p in zip(hkeys, parts):
            try:
                out.append(store.get_many_into_vectored([h], [p])[0])
            except Exception:  # noqa: BLE001
                out.append(None)
        return out

    def _finish(
        self, key: CacheEngineKey, obj: Optional[MemoryObj], prefix: bytearray, n: Optional[int]
    ) -> Optional[MemoryObj]:
        """The MemoryObj of one chunk read into `obj` (`n` bytes, None: a miss), checked
        against its prefix; a chunk shorter than `obj` is moved into an object of its own
        shape."""
        if obj is None:
            return None
        if n is None:
            obj.ref_count_down()
            return None
        try:
            geom, nbytes, positions = decode_prefix(prefix, key)
            if n != PREFIX + nbytes or nbytes > nbytes_of(geom) or nbytes > obj.get_size():
                raise ValueError(f"block of {n} bytes, its prefix says {nbytes}")
            if geom != geometry(obj):
                exact = self._allocate(geom)
                if exact is None:
                    raise RuntimeError("no memory for an unfull chunk")
                exact.byte_array.cast("B")[:nbytes] = obj.byte_array.cast("B")[:nbytes]
                obj.ref_count_down()
                obj = exact
            if nbytes < obj.get_size():
                obj.set_used_size(nbytes)
            obj.metadata.cached_positions = positions
            return obj
        except Exception as e:  # noqa: BLE001
            self.failures.fail("get", e)
            obj.ref_count_down()
            return None

    def get_non_blocking(
        self, key: CacheEngineKey, location: Optional[str] = None
    ) -> Optional[Future]:
        """A future of the chunk (None when it is not stored): read off the caller's thread on
        LMCache's event loop (its default executor; the plugin keeps no thread of its own),
        or at once into a finished future where LMCache gave no running loop."""
        try:
            if not self.contains(key):
                return None
            loop = self.loop
            if loop is not None and loop.is_running():
                read = asyncio.to_thread(self.get_blocking, key)
                return asyncio.run_coroutine_threadsafe(read, loop)
            done: Future = Future()
            done.set_result(self.get_blocking(key))
            return done
        except Exception as e:  # noqa: BLE001
            self.failures.fail("get", e)
            return None

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: List[CacheEngineKey], transfer_spec: Any = None
    ) -> List[MemoryObj]:
        """The leading run of chunks read (LMCache's async prefetch), on a thread."""
        objs = await asyncio.to_thread(self.batched_get_blocking, list(keys))
        out: List[MemoryObj] = []
        for o in objs:
            if o is None:
                break
            out.append(o)
        for o in objs[len(out) :]:
            if o is not None:
                o.ref_count_down()
        return out

    # -- the rest ----------------------------------------------------------------------------

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        try:
            # Only this chunk: the chunks stored after it in its batch are other objects.
            return bool(self._store().discard_many([block_key(key)])[0])
        except Exception as e:  # noqa: BLE001
            self.failures.fail("remove", e)
            return False

    def clear(self) -> int:
        """LMCache's `clear` of its storage backends: every chunk of this worker removed
        (`Store.clear()`, through the store: the directory stays, so replicas sharing it keep
        working); the tokens they held, counted as whole chunks."""
        try:
            return int(self._store().clear()) * int(getattr(self.config, "chunk_size", 0) or 0)
        except Exception as e:  # noqa: BLE001
            self.failures.fail("clear", e)
            return 0

    def get_allocator_backend(self) -> Any:
        return self.local_cpu_backend

    def close(self) -> None:
        """Writes the queued puts, then closes the store (and the event publisher)."""
        off, self._offloader = self._offloader, None
        try:
            if off is not None:
                off.close()
        except Exception as e:  # noqa: BLE001
            self.failures.fail("close", e)
        events, self.kv_events = self.kv_events, None
        store, self.store = self.store, None
        close_store(store, self.failures.fail)
        kv_events.close(events)

    def tierkv_stats(self) -> Dict[str, Any]:
        """The worker id, failures per operation, chunks dropped (queue full), chunks queued,
        and the store's counters (`Store.stats()`)."""
        pending = int(self._offloader_stats().get("in_flight_blocks", 0))
        out: Dict[str, Any] = {
            "worker": self.worker,
            "failures": self.failures.snapshot(),
            "dropped": self._dropped,
            "pending": pending,
        }
        try:
            out["store"] = self._store().stats()
        except Exception:  # noqa: BLE001
            out["store"] = None
        return out
