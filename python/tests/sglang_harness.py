"""A real SGLang HiCache stack on CPU around the tierkv backend, for test_sglang.py (which also
runs this file as a script in a fresh process: `python sglang_harness.py write|read ...`).

What is real: SGLang's device KV pool (`MHATokenToKVPool`/`MLATokenToKVPool` on "cpu"), its
host pool (`MHATokenToKVPoolHost`/`MLATokenToKVPoolHost`, pin_memory=False), its token
allocator, its `HiCacheController` with its prefetch, io and backup threads, and its backend
factory (`dynamic`), which imports `tierkv_g3.sglang`. What is stood in: the scheduler (this file
drives the controller's queues as the radix cache does) and SGLang's process-wide parallel
context (one rank, no DP attention: two names patched in the controller's module), and a
one-process gloo group for `tp_group`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import types
from typing import Any, Dict, List, Optional

import torch

# SGLang JIT-compiles get_hash_str with torch's cpp_extension, which runs the ninja of the
# virtualenv: its bin/ must be on PATH.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

PAGE = 4  # tokens per page
LAYERS = 2
HEADS = 2
HEAD_DIM = 8
DEVICE_TOKENS = 64


def _parallel(tp_rank: int = 0, tp_size: int = 1) -> Any:
    return types.SimpleNamespace(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_dcp_size=1,
        attn_dcp_rank=0,
    )


def _init_dist() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
        dist.init_process_group("gloo", rank=0, world_size=1)


def host_pool(mla: bool = False, layout: str = "page_first", dtype: Any = torch.float16) -> Any:
    """A device pool on CPU and the host pool SGLang builds over it."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    if mla:
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        kv = MLATokenToKVPool(
            DEVICE_TOKENS, PAGE, dtype, 16, 8, LAYERS, "cpu", False, start_layer=0,
            end_layer=LAYERS - 1,
        )
        host = MLATokenToKVPoolHost(
            kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
            pin_memory=False, device_capacity_tokens=kv.size, start_layer=kv.start_layer,
            end_layer=kv.end_layer, target_layer_num=kv.layer_num,
            override_kv_cache_dim=kv.kv_cache_dim,
        )
    else:
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        kv = MHATokenToKVPool(
            DEVICE_TOKENS, PAGE, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False, start_layer=0,
            end_layer=LAYERS - 1,
        )
        host = MHATokenToKVPoolHost(
            kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
            pin_memory=False, device_capacity_tokens=kv.size, start_layer=kv.start_layer,
            end_layer=kv.end_layer, write_back_staging=kv.hicache_write_back_staging,
        )
    return kv, host


def extra_config(root: str, **more: Any) -> Dict[str, Any]:
    return {
        "backend_name": "tierkv",
        "module_path": "tierkv_g3.sglang",
        "class_name": "TierkvHiCacheStorage",
        "interface_v1": 1,
        "root": root,
        "log_interval": 0.0,
        **more,
    }


def controller(root: str, model: str = "tiny-llama", v1: bool = True, **more: Any) -> Any:
    """SGLang's HiCacheController over a CPU host pool, the tierkv backend attached through
    SGLang's own factory (`dynamic`), its storage threads running."""
    import sglang.srt.managers.cache_controller as cc
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    cc.get_parallel = _parallel
    cc.is_dp_attention_enabled = lambda: False
    _init_dist()
    import torch.distributed as dist

    kv, host = host_pool(**{k: more.pop(k) for k in ("mla", "layout", "dtype") if k in more})
    alloc = TokenToKVPoolAllocator(DEVICE_TOKENS, kv.dtype, "cpu", kv, False)
    extra = extra_config(root, **more)
    if not v1:
        extra.pop("interface_v1")
    return cc.HiCacheController(
        alloc, host, PAGE, dist.group.WORLD, threading.Event(), storage_backend="dynamic",
        model_name=model, storage_backend_extra_config=extra,
    )


def storage_config(root: str, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, **kw: Any) -> Any:
    """A `HiCacheStorageConfig` as the controller makes it, for one rank of several."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=kw.pop("model", "tiny-llama"),
        extra_config=extra_config(root, **kw),
    )


def backend(config: Any, host: Any) -> Any:
    """The backend as SGLang's factory builds and registers it (`dynamic`)."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    b = StorageBackendFactory.create_backend("dynamic", config, host)
    b.register_mem_pool_host(host)
    return b


def stop(ctrl: Any) -> None:
    ctrl._stop_storage_threads()
    if ctrl.storage_backend is not None:
        ctrl.storage_backend.close()


def hashes(tokens: List[int]) -> List[str]:
    """SGLang's own page keys (`get_hash_str`, its JIT-compiled SHA-256 chain)."""
    from sglang.srt.mem_cache.utils import get_hash_str

    return get_hash_str(tokens, None, page_size=PAGE)


def fill(host: Any, indices: torch.Tensor, seed: int) -> List[bytes]:
    """Random bytes into the host pool's pages at `indices`; each page's flat bytes."""
    g = torch.Generator().manual_seed(seed)
    buf = host.kv_buffer.view(torch.uint8)
    buf.copy_(torch.randint(0, 256, buf.shape, generator=g, dtype=torch.uint8))
    return page_bytes(host, indices)


def page_bytes(host: Any, indices: torch.Tensor) -> List[bytes]:
    return [
        host.get_data_page(int(indices[i]), flat=True).view(torch.uint8).numpy().tobytes()
        for i in range(0, len(indices), PAGE)
    ]


def backup(ctrl: Any, tokens: List[int], seed: int = 1) -> List[bytes]:
    """The write path: pages into the host pool, then `write_storage`, waited for."""
    host = ctrl.mem_pool_host
    indices = host.alloc(len(tokens))
    pages = fill(host, indices, seed)
    ctrl.write_storage(indices, tokens, hash_value=hashes(tokens))
    op = ctrl.ack_backup_queue.get(timeout=60)
    host.free(indices)
    assert op.completed_tokens == len(tokens), (op.completed_tokens, len(tokens))
    return pages


def prefetch(ctrl: Any, tokens: List[int]) -> List[bytes]:
    """The read path as the radix cache drives it: `prefetch` (the hit query on the prefetch
    thread), host pages for the hits, the transfer on the io thread; the pages restored."""
    host = ctrl.mem_pool_host
    op = ctrl.prefetch("req", tokens)
    op = ctrl.prefetch_hit_queue.get(timeout=60)
    if op.storage_hit_count == 0:
        return []
    host.kv_buffer.view(torch.uint8).zero_()
    op.host_indices = host.alloc(op.storage_hit_count)
    ctrl.prefetch_buffer.put(op)
    done = 0  # the scheduler's count: the last PrefetchAck's completed_tokens
    while True:
        ack = ctrl.ack_prefetch_queue.get(timeout=60)
        if ack.completed_tokens is not None:
            done = ack.completed_tokens
        if ack.completed_req:
            break
    got = page_bytes(host, op.host_indices[:done])
    host.free(op.host_indices)
    return got


def completed(ctrl: Any, tokens: List[int]) -> int:
    return len(prefetch(ctrl, tokens))


def main(argv: List[str]) -> None:
    """`write ROOT N OUT`: back up N pages, their bytes to OUT (hex json); `read ROOT N`: prefetch
    them, print the restored pages' bytes (hex json)."""
    cmd, root, n = argv[0], argv[1], int(argv[2])
    tokens = list(range(1000, 1000 + n * PAGE))
    ctrl = controller(root)
    if cmd == "write":
        pages = backup(ctrl, tokens)
        with open(argv[3], "w") as f:
            json.dump([p.hex() for p in pages], f)
    else:
        print(json.dumps([p.hex() for p in prefetch(ctrl, tokens)]))
    stop(ctrl)


if __name__ == "__main__":
    main(sys.argv[1:])
