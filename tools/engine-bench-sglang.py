#!/usr/bin/env python3
"""tierkv's SGLang HiCache backend against SGLang's own `HiCacheFile`, side by side, through
SGLang's code: a real CPU host pool (`MHATokenToKVPoolHost`, page-first, fp16), each backend
built by SGLang's `StorageBackendFactory` (`dynamic` for tierkv, `file` for HiCacheFile), and
the pages moved by `HiCacheController`'s own page functions (the zero-copy
`_page_set_zero_copy`/`_page_get_zero_copy` for tierkv, whose config sets `interface_v1`; the
flat-page `_generic_page_set`/`_generic_page_get` for HiCacheFile, which has no v1 calls), in
batches of SGLang's STORAGE_BATCH_SIZE.

Per page size and round (the backends alternate which goes first, each on a fresh directory
under --dir): set every page, then get them all back into other host pages twice, cold (after
`sync` and dropping the page cache, when run as root) and warm, checking every byte against
the pages written; `batch_exists` over all the keys (the prefetch hit query); a restart (a new
backend over the same directory: how many pages it still finds). Then a full disk: a tmpfs of
--full-mib MiB (root only), twice as many pages set as fit: what the backend returned, whether
anything raised, and whether the pages it reported stored read back.

Prints one table row per backend and page size, medians over the rounds, and the per-round
ratios tierkv / HiCacheFile with their median (the machine is noisy: docs/benchmarks.md).

usage: .venv-engines/bin/python tools/engine-bench-sglang.py --dir /var/tmp/sglbench
         [--page-mib 2 8] [--pages 32] [--rounds 3] [--full-mib 48]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, Callable, Dict, List

import torch

PAGE_TOKENS = 64
LAYERS = 16
HEAD_DIM = 64  # fp16: a page is PAGE_TOKENS * LAYERS * 2 (K, V) * heads * HEAD_DIM * 2 bytes


def heads_for(page_mib: int) -> int:
    per_head = PAGE_TOKENS * LAYERS * 2 * HEAD_DIM * 2
    return page_mib * (1 << 20) // per_head


def pools(page_mib: int, pages: int) -> Any:
    """SGLang's device pool on CPU and its host pool: 2 x `pages` host pages (one half written
    from, the other read into)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    kv = MHATokenToKVPool(
        pages * PAGE_TOKENS, PAGE_TOKENS, torch.float16, heads_for(page_mib), HEAD_DIM, LAYERS,
        "cpu", False, start_layer=0, end_layer=LAYERS - 1,
    )
    host = MHATokenToKVPoolHost(
        kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE_TOKENS, "page_first",
        pin_memory=False, device_capacity_tokens=kv.size, start_layer=0,
        end_layer=LAYERS - 1, write_back_staging=kv.hicache_write_back_staging,
    )
    return host


def keys_for(n: int, salt: str) -> List[str]:
    """Chained SHA-256 page keys in SGLang's format (64 hex characters)."""
    out, prev = [], salt.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(8, "little")).digest()
        out.append(prev.hex())
    return out


def make_backend(kind: str, root: str, host: Any) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if kind == "tierkv":
        extra = {"backend_name": "tierkv", "module_path": "tierkv_g3.sglang",
                 "class_name": "TierkvHiCacheStorage", "interface_v1": 1, "root": root}
        name = "dynamic"
    else:
        extra = {"file_storage_path": root}
        name = "file"
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench-llama", extra_config=extra,
    )
    backend = StorageBackendFactory.create_backend(name, config, host)
    backend.register_mem_pool_host(host)
    return backend


class Driver:
    """SGLang's controller page functions, bound to one backend and host pool (the attributes
    they read: storage_host_pool, storage_backend, page_size)."""

    def __init__(self, kind: str, backend: Any, host: Any) -> None:
        from sglang.srt.managers.cache_controller import HiCacheController
        from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE

        self.storage_host_pool, self.storage_backend, self.page_size = host, backend, PAGE_TOKENS
        self.batch = STORAGE_BATCH_SIZE
        zero = kind == "tierkv"
        self._set = HiCacheController._page_set_zero_copy if zero else HiCacheController._generic_page_set
        self._get = HiCacheController._page_get_zero_copy if zero else HiCacheController._generic_page_get
        self._op = types.SimpleNamespace(request_id="bench", is_terminated=lambda: False)

    def _batches(self, keys: List[str], first_page: int):
        for i in range(0, len(keys), self.batch):
            ks = keys[i : i + self.batch]
            start = (first_page + i) * PAGE_TOKENS
            yield ks, torch.arange(start, start + len(ks) * PAGE_TOKENS, dtype=torch.int64)

    def set(self, keys: List[str], first_page: int) -> bool:
        return all(self._set(self, ks, idx) for ks, idx in self._batches(keys, first_page))

    def get(self, keys: List[str], first_page: int) -> int:
        return sum(self._get(self, self._op, ks, idx) for ks, idx in self._batches(keys, first_page))


def same_pages(host: Any, src: int, dst: int, n: int) -> bool:
    """Every byte of host pages [dst, dst + n) equals pages [src, src + n) (SGLang's own
    `get_data_page` copies a page out, both regions; compared as bytes: random fp16 holds
    NaNs)."""
    return all(
        torch.equal(host.get_data_page((src + i) * PAGE_TOKENS, flat=True).view(torch.uint8),
                    host.get_data_page((dst + i) * PAGE_TOKENS, flat=True).view(torch.uint8))
        for i in range(n)
    )


def clear_pages(host: Any, first: int, n: int) -> None:
    zero = torch.zeros_like(host.get_data_page(0, flat=True))
    for i in range(n):
        host.set_from_flat_data_page((first + i) * PAGE_TOKENS, zero)


def drop_caches() -> bool:
    if os.geteuid() != 0:
        return False
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return True


def timed(fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def one_round(kind: str, host: Any, root: str, pages: int, salt: str) -> Dict[str, float]:
    """set, cold get, warm get, exists and restart of one backend on a fresh directory."""
    keys = keys_for(pages, salt)
    nbytes = host.get_size_per_token() * PAGE_TOKENS * pages
    backend = make_backend(kind, root, host)
    drv = Driver(kind, backend, host)
    ok, t_set = timed(lambda: drv.set(keys, 0))
    cold = drop_caches()
    times = []
    for _ in ("cold", "warm"):
        clear_pages(host, pages, pages)
        got, t = timed(lambda: drv.get(keys, pages))
        if not (ok and got == pages and same_pages(host, 0, pages, pages)):
            raise SystemExit(f"{kind}: set returned {ok}, got {got} of {pages}, or bytes differ")
        times.append(t)
    t_cold, t_warm = times
    reps = 20
    _, t_exists = timed(lambda: [backend.batch_exists(keys) for _ in range(reps)])
    if hasattr(backend, "close"):
        backend.close()
    again = make_backend(kind, root, host)
    found = again.batch_exists(keys)
    if hasattr(again, "close"):
        again.close()
    return {
        "set_gbs": nbytes / t_set / 1e9,
        "get_cold_gbs": nbytes / t_cold / 1e9 if cold else float("nan"),
        "get_warm_gbs": nbytes / t_warm / 1e9,
        "exists_us": t_exists / reps * 1e6,
        "restart_found": found / pages,
    }


def full_disk(kind: str, host: Any, mib: int, pages: int) -> str:
    """Sets twice as many pages as a tmpfs of `mib` MiB holds; what the backend says."""
    if os.geteuid() != 0:
        return "not run (needs root for a tmpfs)"
    mnt = tempfile.mkdtemp(prefix="sglfull-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "sglbench", mnt], check=True)
    try:
        per = host.get_size_per_token() * PAGE_TOKENS
        n = min(pages, max(2, 2 * (mib << 20) // per))
        keys = keys_for(n, f"full-{kind}")
        backend = make_backend(kind, mnt, host)
        drv = Driver(kind, backend, host)
        try:
            ok = drv.set(keys, 0)
            raised = "no exception"
        except Exception as e:  # noqa: BLE001: what the engine would see
            ok, raised = False, f"raised {type(e).__name__}"
        found = backend.batch_exists(keys)
        got = drv.get(keys[:found], pages) if found else 0
        readable = got == found and same_pages(host, 0, pages, found)
        return (f"{n} pages into {mib} MiB: set returned {ok}, {raised}, {found} pages a servable prefix (batch_exists), "
                f"{'all read back byte-exact' if readable else 'NOT all read back'}")
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--page-mib", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full-mib", type=int, default=48)
    a = ap.parse_args()
    kinds = ["tierkv", "file"]
    print(f"# {' '.join(sys.argv)}  (uname {os.uname().release}, {os.cpu_count()} cpus)")
    for mib in a.page_mib:
        host = pools(mib, a.pages)
        host.kv_buffer.view(torch.uint8).copy_(
            torch.randint(0, 256, host.kv_buffer.view(torch.uint8).shape, dtype=torch.uint8))
        rows: Dict[str, List[Dict[str, float]]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                root = os.path.join(a.dir, f"{kind}-{mib}m-{r}")
                shutil.rmtree(root, ignore_errors=True)
                rows[kind].append(one_round(kind, host, root, a.pages, f"{mib}-{r}"))
                shutil.rmtree(root, ignore_errors=True)
        report(mib, a.pages, rows)
        for kind in kinds:
            print(f"  full disk, {kind}: {full_disk(kind, host, a.full_mib, a.pages)}")


def report(mib: int, pages: int, rows: Dict[str, List[Dict[str, float]]]) -> None:
    cols = ["set_gbs", "get_cold_gbs", "get_warm_gbs", "exists_us", "restart_found"]
    print(f"\npage {mib} MiB, {pages} pages, {len(rows['tierkv'])} rounds (medians)")
    print("| backend | " + " | ".join(cols) + " |")
    for kind, rs in rows.items():
        print(f"| {kind} | " + " | ".join(f"{statistics.median(r[c] for r in rs):.3f}" for c in cols) + " |")
    for c in cols[:4]:
        ratios = [t[c] / f[c] for t, f in zip(rows["tierkv"], rows["file"])]
        print(f"  {c} tierkv/file per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
