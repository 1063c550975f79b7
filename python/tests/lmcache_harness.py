"""A real LMCacheEngine on CPU around tierkv_g3.lmcache (or LMCache's own LocalDiskBackend), for
python/tests/test_lmcache.py: LMCache's config, metadata, builder, storage manager, CPU
allocator and token database, all real. The only stand-in is the GPU connector: a copying one
over a CPU tensor (the "GPU" KV of one request: [2, layers, tokens, heads x head_dim], the
layout LMCache's KV_2LTD chunks have).

Also a command line, for the restart test (a fresh process over the same directories), each
backend (tierkv: the plugin, loaded by config; disk: LocalDiskBackend) under ROOT/<backend>:
    lmcache_harness.py write ROOT N_CHUNKS     stores, waits for the writes, prints JSON
    lmcache_harness.py read ROOT N_CHUNKS      looks up and retrieves, prints JSON
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
logging.getLogger("lmcache").setLevel(logging.ERROR)

CHUNK = 16  # tokens per LMCache chunk
LAYERS, HEADS, HEAD_DIM = 4, 2, 32
DTYPE = torch.bfloat16
CHUNK_BYTES = 2 * LAYERS * CHUNK * HEADS * HEAD_DIM * 2  # 16 KiB


class CopyingConnector(GPUConnectorInterface):
    """The GPU connector's stand-in: copies chunks between LMCache's MemoryObjs and the
    request's KV tensor (kwargs["kvcaches"], [2, layers, tokens, heads x head_dim])."""

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        kwargs["kvcaches"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for m, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(m, s, e, **kwargs)

    def batched_to_gpu(
        self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any
    ) -> None:
        for m, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(m, s, e, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])


def plugin_config(root: str, **options: Any) -> Dict[str, Any]:
    """The extra_config lines that load tierkv_g3.lmcache as plugin "tierkv"
    (docs/engines-lmcache.md)."""
    extra = {
        "storage_plugin.tierkv.module_path": "tierkv_g3.lmcache",
        "storage_plugin.tierkv.class_name": "TierkvStoragePlugin",
        "storage_plugin.tierkv.root": root,
    }
    extra.update({f"storage_plugin.tierkv.{k}": v for k, v in options.items()})
    return extra


def config(backend: str, root: str, lmc: Optional[Dict[str, Any]] = None, **options: Any) -> Any:
    """LMCache's config: its CPU tier as the allocator only (local_cpu false: no hits from
    memory), and the plugin (`options` are its extra_config options) or LocalDiskBackend
    under `root`; `lmc`: more LMCache settings."""
    kw: Dict[str, Any] = dict(chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.05)
    kw.update(lmc or {})
    if backend == "tierkv":
        kw.update(storage_plugins=["tierkv"], extra_config=plugin_config(root, **options))
    elif backend == "disk":
        kw.update(local_disk=root, max_local_disk_size=0.05)
    else:
        raise ValueError(backend)
    return LMCacheEngineConfig.from_defaults(**kw)


def metadata(model: str = "tiny-llama", worker: int = 0, world: int = 1) -> LMCacheMetadata:
    return LMCacheMetadata(
        model_name=model,
        world_size=world,
        local_world_size=world,
        worker_id=worker,
        local_worker_id=worker,
        kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
        chunk_size=CHUNK,
    )


_made = 0


def engine(cfg: Any, meta: Optional[LMCacheMetadata] = None) -> LMCacheEngine:
    """A fresh LMCacheEngine (its own instance id), post-initialised: its storage manager
    built its backends from `cfg`."""
    global _made
    _made += 1
    e = LMCacheEngineBuilder.get_or_create(
        f"tierkv-test-{os.getpid()}-{_made}",
        cfg,
        meta or metadata(),
        CopyingConnector(),
        lambda t, r: None,
        lambda o, r: o,
    )
    e.post_init()
    return e


def destroy(e: LMCacheEngine) -> None:
    for k, v in list(LMCacheEngineBuilder._instances.items()):
        if v is e:
            LMCacheEngineBuilder.destroy(k)


def plugin(e: LMCacheEngine) -> Any:
    """The engine's tierkv plugin (as LMCache's storage manager holds it)."""
    return e.storage_manager.storage_backends["tierkv"]


def tokens(n_chunks: int, base: int = 1000) -> List[int]:
    return list(range(base, base + n_chunks * CHUNK))


def kv(n_tokens: int, seed: int = 7) -> torch.Tensor:
    """A request's KV, random but reproducible in another process."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, LAYERS, n_tokens, HEADS * HEAD_DIM, generator=g).to(DTYPE)


def wait_written(e: LMCacheEngine, timeout: float = 30.0) -> None:
    """Until no backend has a put in flight (LMCache's exists_in_put_tasks)."""
    deadline = time.monotonic() + timeout
    for name, b in e.storage_manager.storage_backends.items():
        if name == "LocalCPUBackend":
            continue
        while _tierkv_pending(b) or _disk_busy(b):
            assert time.monotonic() < deadline, f"{name}: writes still in flight"
            time.sleep(0.01)


def _tierkv_pending(b: Any) -> bool:
    """Whether our plugin's offloader has chunks queued or being written."""
    stats = getattr(b, "tierkv_stats", None)
    return bool(stats is not None and stats()["pending"])


def _disk_busy(b: Any) -> bool:
    worker = getattr(b, "disk_worker", None)
    return bool(worker is not None and worker.put_tasks)


def store(e: LMCacheEngine, toks: List[int], kvt: torch.Tensor) -> None:
    e.store(torch.tensor(toks), kvcaches=kvt)
    wait_written(e)


def retrieve(e: LMCacheEngine, toks: List[int]) -> tuple:
    """(tokens retrieved, the KV tensor the connector filled; zeros where nothing was)."""
    out = torch.zeros(2, LAYERS, len(toks), HEADS * HEAD_DIM, dtype=DTYPE)
    mask = e.retrieve(torch.tensor(toks), kvcaches=out, req_id="r")
    return int(mask.sum()), out


def prefetch(e: LMCacheEngine, toks: List[int], timeout: float = 30.0) -> int:
    """LMCache's async loading (`enable_async_loading`), as vLLM's scheduler drives it: the
    lookup and prefetch of request "r" (what `retrieve` then takes), the tokens it found.
    LMCache answers the scheduler through its lookup server once every chunk is read; the
    server's transport (ZMQ to vLLM's scheduler) is stood in for by a queue."""
    import queue
    import types

    answers: "queue.Queue" = queue.Queue()
    e.storage_manager.async_lookup_server = types.SimpleNamespace(
        send_response_to_scheduler=lambda lookup_id, n: answers.put((lookup_id, n))
    )
    e.async_lookup_and_prefetch("r", torch.tensor(toks))
    lookup_id, n = answers.get(timeout=timeout)
    assert lookup_id == "r"
    return int(n)


def run(cmd: str, backend: str, root: str, n: int) -> Dict[str, Any]:
    e = engine(config(backend, root))
    toks, kvt = tokens(n), kv(n * CHUNK)
    if cmd == "write":
        store(e, toks, kvt)
        out: Dict[str, Any] = {"lookup": e.lookup(torch.tensor(toks))}
    else:
        hit = e.lookup(torch.tensor(toks))
        got, back = retrieve(e, toks)
        exact = bool(torch.equal(back[:, :, :got], kvt[:, :, :got]))
        out = {"lookup": hit, "retrieved": got, "exact": exact}
    destroy(e)
    return out


def main(argv: List[str]) -> None:
    """write|read ROOT N_CHUNKS: each backend under ROOT/<backend>, one after the other."""
    cmd, root, n = argv[0], argv[1], int(argv[2])
    out = {b: run(cmd, b, os.path.join(root, b), n) for b in ("tierkv", "disk")}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
