#!/usr/bin/env python3
"""tierkv's LMCache plugin beside LMCache's own LocalDiskBackend, through LMCacheEngine on CPU
(the engines virtualenv: tools/engines-venv.sh lmcache): set and get throughput of one request
of N chunks, same disk, same engine settings, rounds interleaved.

Each chunk is Llama-3.1-8B's geometry (32 layers, 8 KV heads of 128, bf16: 128 KiB per token),
so 16-token chunks are 2 MiB and 64-token chunks 8 MiB. set: `LMCacheEngine.store` until the
backend has written every chunk (its put tasks drained). get: `LMCacheEngine.retrieve` of the
whole request into the (CPU) "GPU" tensor, by the same engine (LocalDiskBackend's index is in
memory only, so a restart would find nothing; the engine's CPU pool is then equally warm for
both: fresh memory is slow to touch on this VM); `--cold` drops the page cache before each
get (root). Each get is checked whole and byte-exact.

usage: PYTHONPATH=python:python/tests .venv-engines/bin/python tools/lmcache-bench.py
           --dir /mnt/nvme/bench [--chunk-mib 2 8] [--mib 256] [--rounds 3] [--cold]
           [--tierkv-option KEY=VALUE ...]   (e.g. verify=never, put_threads=4)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

import torch  # noqa: E402

import lmcache_harness as h  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 32, 8, 128
TOKEN_BYTES = 2 * LAYERS * HEADS * HEAD_DIM * 2


class Connector(h.CopyingConnector):
    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])


OPTIONS: Dict[str, Any] = {}  # --tierkv-option KEY=VALUE: the plugin's extra_config options


def engine(backend: str, root: Path, chunk: int, total_mib: int) -> Any:
    gib = total_mib / 1024 * 2.5 + 0.1  # the plugin queues up to half of it
    kw: Dict[str, Any] = dict(chunk_size=chunk, local_cpu=False, max_local_cpu_size=gib)
    if backend == "tierkv":
        kw.update(storage_plugins=["tierkv"], extra_config=h.plugin_config(str(root), **OPTIONS))
    else:
        kw.update(local_disk=str(root), max_local_disk_size=gib * 2)
    meta = LMCacheMetadata(
        model_name="bench-llama-8b",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, chunk, HEADS, HEAD_DIM),
        chunk_size=chunk,
    )
    h._made += 1
    e = h.LMCacheEngineBuilder.get_or_create(
        f"bench-{os.getpid()}-{h._made}",
        LMCacheEngineConfig.from_defaults(**kw),
        meta,
        Connector(),
        lambda t, r: None,
        lambda o, r: o,
    )
    e.post_init()
    return e


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def one_round(backend: str, root: Path, chunk: int, n_tokens: int, cold: bool) -> Dict[str, float]:
    """GiB/s of the set and of the get of one request (n_tokens), fresh directory."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    toks = list(range(1, n_tokens + 1))
    kv = torch.randn(2, LAYERS, n_tokens, HEADS * HEAD_DIM).to(torch.bfloat16)
    gib = n_tokens * TOKEN_BYTES / 2**30
    e = engine(backend, root, chunk, n_tokens * TOKEN_BYTES >> 20)
    t0 = time.perf_counter()
    e.store(torch.tensor(toks), kvcaches=kv)
    h.wait_written(e, timeout=600)
    t_set = time.perf_counter() - t0
    if cold:
        drop_caches()
    out = torch.zeros_like(kv)
    t0 = time.perf_counter()
    mask = e.retrieve(torch.tensor(toks), kvcaches=out, req_id="bench")
    t_get = time.perf_counter() - t0
    ok = int(mask.sum()) == n_tokens and torch.equal(out, kv)
    h.destroy(e)
    shutil.rmtree(root, ignore_errors=True)
    if not ok:
        raise SystemExit(f"{backend}: the get was not the whole request, byte-exact")
    return {"set": gib / t_set, "get": gib / t_get}


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--chunk-mib", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--mib", type=int, default=256, help="bytes of the request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--tierkv-option", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    for kv in a.tierkv_option:
        k, v = kv.split("=", 1)
        OPTIONS[k] = int(v) if v.isdigit() else v
    print(f"| chunk | backend | set GiB/s (median of {a.rounds}) | get GiB/s |")
    print("|---|---|---:|---:|")
    for mib in a.chunk_mib:
        chunk = (mib << 20) // TOKEN_BYTES
        n_tokens = max(1, a.mib // mib) * chunk
        res: Dict[str, List[Dict[str, float]]] = {"tierkv": [], "disk": []}
        for r in range(a.rounds):
            # The backends alternate which goes first (this VM's later runs can be faster).
            for backend in list(res) if r % 2 == 0 else list(reversed(res)):
                res[backend].append(one_round(backend, a.dir / backend, chunk, n_tokens, a.cold))
        for backend, rs in res.items():
            s = statistics.median(r["set"] for r in rs)
            g = statistics.median(r["get"] for r in rs)
            name = "tierkv plugin" if backend == "tierkv" else "LocalDiskBackend"
            print(f"| {mib} MiB | {name} | {s:.2f} | {g:.2f} |", flush=True)
        cells = []
        for what in ("set", "get"):
            ratios = [t[what] / d[what] for t, d in zip(res["tierkv"], res["disk"])]
            cells.append(f"{statistics.median(ratios):.2f}x ("
                         + ", ".join(f"{x:.2f}" for x in ratios) + ")")
        print(f"| {mib} MiB | ratio (rounds) | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
