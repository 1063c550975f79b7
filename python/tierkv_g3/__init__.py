"""tierkv: the disk tier ("G3") of an LLM inference engine's KV cache.

Each KV block is one file under ``<root>/v1/<worker>/``, named by the blake3 chain hash of its
tokens, so a later request with the same prefix loads it from disk instead of recomputing it.

Keys are chain hashes: a ``str`` of 64 lower-case hex characters (what :func:`chain_hashes`
returns, the block's file name, and the spelling of SGLang HiCache's hash strings) or 32
``bytes``. One :class:`Store` serves one worker (a tensor-parallel rank); workers share a root.

>>> import numpy as np, tierkv_g3
>>> with tierkv_g3.Store("/tmp/kv", "rank0") as store:                    # doctest: +SKIP
...     keys = tierkv_g3.chain_hashes(list(range(64)), 16)                 # 4 blocks
...     store.put_many(keys, [np.full(4096, i, np.uint8) for i in range(4)])
...     pages = np.empty((4, 4096), np.uint8)                           # preallocated
...     store.get_many_into(keys, list(pages))                          # filled in place
[4096, 4096, 4096, 4096]

Errors are exceptions under :class:`tierkv_g3.Error` (``NoSpaceError``, ``InvalidKeyError``,
``CorruptError``, ...) with the ``path`` they concern; a miss is never an exception.
docs/python.md in the repository has the whole API, its guarantees and their tests.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, List, Optional, Sequence

from . import _tierkv
from ._tierkv import (
    BufferTooSmallError,
    ClosedError,
    ConfigError,
    CorruptError,
    Error,
    EventTail,
    InvalidKeyError,
    IoError,
    LayoutMismatchError,
    Offloader,
    LMCacheConnector,
    NoSpaceError,
    ReadOnlyError,
    TooLargeError,
    TooManyOpenFilesError,
    Transfers,
    UnsupportedError,
    WorkerBusyError,
    chain_hashes,
    engine_key,
)

__all__ = [
    "Store",
    "LMCacheConnector",
    "Transfers",
    "Offloader",
    "EventTail",
    "chain_hashes",
    "engine_key",
    "worker_id",
    "aligned_array",
    "Error",
    "InvalidKeyError",
    "TooLargeError",
    "BufferTooSmallError",
    "NoSpaceError",
    "TooManyOpenFilesError",
    "CorruptError",
    "ReadOnlyError",
    "LayoutMismatchError",
    "WorkerBusyError",
    "UnsupportedError",
    "ConfigError",
    "IoError",
    "ClosedError",
]

__version__ = "0.1.0"


def worker_id(prefix: str, description: Any) -> str:
    """The worker id ``<prefix>.<16 hex>`` of an engine configuration: the hex a blake3 of
    ``description`` as canonical JSON (keys sorted, no whitespace; values JSON cannot hold are
    written as their ``str``), derived in Rust (``WorkerId::from_description``), the one
    derivation every backend uses. ``prefix`` is the readable part, cut to 47 characters."""
    import json

    return _tierkv._worker_id(prefix, json.dumps(description, default=str))


def aligned_array(shape: Any, dtype: Any = "uint8", align: int = 4096) -> Any:
    """A zero-filled numpy array whose data starts on an `align`-byte boundary (default a
    page): the buffers to give get_many_into. The kernel's copy from the page cache into a
    buffer that starts off a 64-byte line ran about 5x slower on the machine of
    docs/python.md, and a plain ``numpy.empty`` of 2 MiB may start 16 bytes past a page."""
    import numpy as np

    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.zeros(count * dt.itemsize + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + count * dt.itemsize].view(dt).reshape(shape)


class Store(_tierkv.Store):
    """One worker's block store under a root directory.

    ``Store(root, worker, *, capacity_bytes=None, ...)``: every option left out is the Rust
    ``StoreConfig::default()``'s (the defaults are decided once, there; those named below).

    - ``root``: the cache directory (shared by all workers); ``worker``: this worker's id
      (``[A-Za-z0-9_.-]``, 1 to 64 characters; an int TP rank is accepted as its digits).
    - ``capacity_bytes`` / ``capacity_files``: bound the worker's block files (on-disk bytes,
      headers included; file count); None: unbounded. Full stores evict with ``policy``
      (``"adaptive"``, the default, ``"arc"``, ``"lru"``, ``"admit2"``), cutting chains
      from the tail.
    - ``engine``: ``"psync"`` (the default), ``"auto"`` (io_uring where the kernel allows
      it, else psync), ``"io_uring"``; ``queue_depth``: I/Os in flight per calling thread (io_uring).
    - ``read_only``: serve reads of a tree another store writes (no lock, writes refused).
    - ``verify``: checksums on reads: ``"on-open"`` (first read of each opened file),
      ``"after-reboot"`` (first read of each opened file written before this boot),
      ``"always"``, ``"never"``. ``direct_io``: O_DIRECT. ``sync_writes``: fdatasync each block.
    - ``direct_puts_from``: puts of blocks of at least this many bytes (default 2 MiB) write
      with O_DIRECT (reads stay buffered; None: never, unless ``direct_io``); buffered where
      the filesystem refuses O_DIRECT.
    - ``fd_cache``: open-file cache size (None: a quarter of the open-file limit, at most
      4096; 0: none). ``max_block_size``: largest block (default 256 MiB).
    - ``layout``: ``(depth, fanout)`` of the shard tree (None: the tree's, else ``(2, 256)``).
    - ``publish``: ``"rename"`` or ``"tmpfile"``.
    - ``reuse_evicted``: a put that evicts writes its block into the evicted block's file
      (where the filesystem grants write leases: ext4, XFS, tmpfs; evictions are then made
      by the puts, exactly at the bound). False: evicted files are unlinked and a background
      thread evicts from ``watermarks`` ``(high, low)``, fractions of the capacity (default
      ``(0.95, 0.90)``).
    - ``sharing``: ``"exclusive"`` (one store per worker directory, the default) or
      ``"shared"`` (many stores, in several processes or nodes, on one worker directory: a
      key the index lacks is looked up in the tree, and a miss is remembered for
      ``negative_ttl`` seconds, default 1; docs/shared.md).
    - ``events``: keep the worker's event journal (every block stored and removed, by any
      store of any process or node, in one order; ``events_since``; docs/events.md). Once a
      worker has one, every store of it writes to it.
    - ``stats_interval``: seconds between writes of the live counters (``tierkv-stat
      --live``; default 1), None: never. ``keep_temp_files``: leave a crashed store's temp files.

    Opening takes the worker's lock: one store per worker directory at a time (another
    raises :class:`WorkerBusyError`). Use it as a context manager or call :meth:`close`.

    All methods are thread-safe and release the GIL during I/O, so threads issuing batches
    run in parallel. Keys are ``str`` (64 lower-case hex) or 32 ``bytes``; buffers are any
    objects exporting a contiguous buffer, used in place (zero-copy).
    """

    async def get_many_into_async(
        self, keys: Sequence[Any], buffers: Sequence[Any]
    ) -> List[Optional[int]]:
        """:meth:`get_many_into` on a thread (``asyncio.to_thread``): the event loop keeps
        running while the batch reads. Do not touch the buffers until it returns; cancelling
        the await does not stop the batch (the thread finishes it)."""
        return await asyncio.to_thread(self.get_many_into, keys, buffers)

    async def put_many_async(self, keys: Sequence[Any], buffers: Sequence[Any]) -> None:
        """:meth:`put_many` on a thread; see :meth:`get_many_into_async`."""
        await asyncio.to_thread(self.put_many, keys, buffers)

    async def offer_many_async(
        self, keys: Sequence[Any], buffers: Sequence[Any], parent: Any = None
    ) -> None:
        """:meth:`offer_many` on a thread; see :meth:`get_many_into_async`."""
        await asyncio.to_thread(self.offer_many, keys, buffers, parent)

    async def contains_prefix_async(self, keys: Iterable[Any]) -> int:
        """:meth:`contains_prefix` on a thread."""
        return await asyncio.to_thread(self.contains_prefix, keys)

