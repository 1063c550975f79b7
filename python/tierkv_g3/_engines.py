"""What the engine backends (tierkv_g3.sglang, tierkv_g3.lmcache, tierkv_g3.vllm*) share: the
Store options an engine's config may set, the identity of a model's weights, and the failure
log (a backend never raises into its engine: every failure is counted per operation and logged
at most once per interval)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Tuple

logger = logging.getLogger(__name__)

# The keyword arguments of tierkv_g3.Store an engine's extra config may carry.
STORE_OPTIONS = (
    "capacity_bytes",
    "capacity_files",
    "policy",
    "engine",
    "verify",
    "direct_io",
    "direct_puts_from",
    "sync_writes",
    "fd_cache",
    "max_block_size",
    "layout",
    "publish",
    "watermarks",
    "queue_depth",
    "stats_interval",
    "keep_temp_files",
    "reuse_evicted",
    "sharing",
    "negative_ttl",
    "events",
    "read_only",
)


def store_options(extra: Dict[str, Any]) -> Dict[str, Any]:
    """The Store keyword arguments in `extra` (JSON and YAML lists become the tuples
    `layout` and `watermarks` are)."""
    options = {k: extra[k] for k in STORE_OPTIONS if k in extra}
    for k in ("layout", "watermarks"):
        if isinstance(options.get(k), list):
            options[k] = tuple(options[k])
    return options


def slug(s: str, n: int) -> str:
    """`s` in the worker id's alphabet ([A-Za-z0-9_.-]), its last `n` characters."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", s.rstrip("/").split("/")[-1]).strip(".") or "model"
    return s[-n:]


def weights_identity(model: str, revision: Optional[str]) -> Any:
    """What identifies a model's weights without its path: for a local directory, each weight
    file's name, size and a hash of its first 64 KiB and last 1 MiB (two fine-tunes of one
    architecture share names, sizes and weight index, not their bytes); for a hub id, the id
    and its revision."""
    if not os.path.isdir(model):
        return ("hub", model, revision)
    files = []
    for name in sorted(os.listdir(model)):
        if not name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
            continue
        st = os.stat(os.path.join(model, name))
        digest = _file_digest(os.path.join(model, name), st.st_ino, st.st_size, st.st_mtime_ns)
        files.append((name, st.st_size, digest))
    return ("files", files, revision)


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, ino: int, size: int, mtime_ns: int) -> str:
    """A hash of a weight file's first 64 KiB and last 1 MiB, computed once per version of
    the file (its inode, size and modification time) in this process: a backend asks once
    per pool and per rank, and a large checkpoint has hundreds of files."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(64 << 10))
        f.seek(max(size - (1 << 20), 0))
        h.update(f.read(1 << 20))
    return h.hexdigest()


def close_store(store: Any, fail: Any) -> None:
    """Closes `store` (None: nothing to close); an error is `fail("close", err)`, never
    raised into the engine."""
    if store is None:
        return
    try:
        store.close()
    except Exception as e:  # noqa: BLE001
        fail("close", e)


class FailureLog:
    """Failures per operation: counted, and logged as warnings at most once per `interval`
    seconds per operation (an engine may call a failing backend thousands of times a
    second)."""

    def __init__(self, logger: logging.Logger, what: str, interval: float = 10.0):
        self.logger = logger
        self.what = what
        self.interval = interval
        self.counts: Dict[str, int] = {}
        self._last: Dict[str, float] = {}
        self._lock = threading.Lock()

    def fail(self, op: str, err: Any) -> None:
        # The log gets `err`'s text, not `err`: a kept record (pytest's, a handler's buffer)
        # must not keep the exception's frames alive, nor the buffers in them (the vLLM tier's
        # views of vLLM's primary region, whose mmap cannot close while one is exported).
        err = str(err)
        with self._lock:
            self.counts[op] = self.counts.get(op, 0) + 1
            now = time.monotonic()
            if now - self._last.get(op, -1e9) < self.interval:
                return
            self._last[op] = now
            count = self.counts[op]
        self.logger.warning("%s: %s failed (%d so far): %s", self.what, op, count, err)

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self.counts)


class Names:
    """Our key -> a block's name on the engine's side (its hash, ...), for the newest `limit`
    keys named: the oldest beyond it are forgotten."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._names: "OrderedDict[bytes, Any]" = OrderedDict()
        self._limit = limit

    def name(self, ours: bytes, name: Any) -> List[bytes]:
        """Names `ours` (the newest now); returns the keys forgotten to make room."""
        self._names[ours] = name
        self._names.move_to_end(ours)
        gone = []
        while len(self._names) > self._limit:
            gone.append(self._names.popitem(last=False)[0])
        return gone

    def get(self, ours: bytes) -> Optional[Any]:
        return self._names.get(ours)

    def pop(self, ours: bytes) -> None:
        self._names.pop(ours, None)


class ToldBlocks:
    """What a backend told its engine's KV event stream of the blocks it stored: each block's
    name on the engine's side (its hash, ...) by our key, and which are told stored. The
    oldest names beyond `limit` are forgotten (their removal is then not told). A name
    outlives the block's removal: a store planned before the removal was read may store the
    block again."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._names = Names(limit)
        self._told: set = set()

    def name(self, ours: bytes, name: Any) -> None:
        for gone in self._names.name(ours, name):
            self._told.discard(gone)

    def forget(self, ours: bytes) -> None:
        """A block not stored after all: its name goes, unless it is told stored."""
        if ours not in self._told:
            self._names.pop(ours)

    def tell_present(self, ours: bytes) -> Optional[Any]:
        """A block found stored: its name, if it is not told stored yet (it is now)."""
        name = self._names.get(ours)
        if ours in self._told or name is None:
            return None
        self._told.add(ours)
        return name

    def changes(self, events: Iterable[Tuple[str, bytes]]) -> List[Tuple[bool, Any]]:
        """The journal's `(kind, key)` events as what to tell, in order: `(removed, name)`
        for each named block told stored anew or told removed."""
        out = []
        for kind, ours in events:
            name = self._names.get(ours)
            if name is None:
                continue
            if kind == "stored" and ours not in self._told:
                self._told.add(ours)
                out.append((False, name))
            elif kind == "removed" and ours in self._told:
                self._told.discard(ours)
                out.append((True, name))
        return out

    def told(self) -> List[bytes]:
        """The keys told stored, sorted."""
        return sorted(self._told)

    def untell(self, gone: Iterable[bytes]) -> List[Any]:
        """Blocks told stored that are gone: their names, now told removed."""
        out = []
        for ours in gone:
            if ours in self._told:
                self._told.discard(ours)
                out.append(self._names.get(ours))
        return out
