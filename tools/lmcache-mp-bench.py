#!/usr/bin/env python3
"""Store and load throughput through LMCache's own MP-mode L2 adapter (NativeConnectorL2Adapter,
lmcache 0.5.6), for tierkv (native_plugin: tierkv_g3.lmcache_mp) and LMCache's own C++
filesystem connector (fs_native), on the same directory tree and the same chunks.

usage: PYTHONPATH=python .venv-engines/bin/python tools/lmcache-mp-bench.py DIR
       [--chunks 256] [--chunk-mib 2 8] [--batch 16] [--threads 4] [--verify on-open]
       [--rounds 3] [--tierkv-option KEY=VALUE ...]   (e.g. direct_puts_from=none)

Each run stores --chunks chunks in tasks of --batch keys (all submitted at once, then waited
for through the adapter's store eventfd), then loads them back the same way into fresh
buffers, checks them byte for byte, and prints GiB/s. The files stay in the page cache: this
measures the adapters and the write/read paths, not the device. Per chunk size, --rounds
rounds with the two adapters alternating which goes first, each on a fresh directory; then
the medians and the per-round ratios tierkv / fs_native with their median.
"""

from __future__ import annotations

import argparse
import json
import select
import shutil
import sys
import time
from pathlib import Path
from statistics import median

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters import config, factory
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj


def adapter(spec: dict):
    parser = config.add_l2_adapters_args(argparse.ArgumentParser())
    cfg = config.parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter",
                                                                     json.dumps(spec)]))
    return factory.create_l2_adapter_from_registry(cfg.adapters[0])


def obj(n: int, seed: int | None) -> TensorMemoryObj:
    t = torch.empty(n, dtype=torch.uint8)
    if seed is not None:
        t.fill_(seed % 251)
        t[:8] = torch.tensor(list(seed.to_bytes(8, "little")), dtype=torch.uint8)
    meta = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.uint8, address=0,
                             phy_size=n, ref_count=1)
    return TensorMemoryObj(t, meta, None)


def wait(fd: int, done) -> None:
    while not done():
        select.select([fd], [], [], 0.01)


def run(name: str, spec: dict, chunks: int, n: int, batch: int) -> tuple[float, float]:
    a = adapter(spec)
    keys = [ObjectKey(chunk_hash=i.to_bytes(32, "little"), model_name="bench", kv_rank=0)
            for i in range(chunks)]
    src = [obj(n, i) for i in range(chunks)]
    groups = [range(s, min(s + batch, chunks)) for s in range(0, chunks, batch)]
    t0 = time.perf_counter()
    tids = {a.submit_store_task([keys[i] for i in g], [src[i] for i in g]) for g in groups}
    got: dict = {}

    def stored():
        got.update(a.pop_completed_store_tasks())
        return tids <= got.keys()

    wait(a.get_store_event_fd(), stored)
    t_store = time.perf_counter() - t0
    assert all(got[t].is_successful() for t in tids), "a store failed"
    dst = [obj(n, None) for _ in range(chunks)]
    t0 = time.perf_counter()
    lids = [a.submit_load_task([keys[i] for i in g], [dst[i] for i in g]) for g in groups]
    bms: dict = {}

    def loaded():
        for t in lids:
            if t not in bms and (bm := a.query_load_result(t)) is not None:
                bms[t] = bm
        return len(bms) == len(lids)

    wait(a.get_load_event_fd(), loaded)
    t_load = time.perf_counter() - t0
    ok = sum(bms[t].test(j) for t, g in zip(lids, groups) for j in range(len(g)))
    same = all(torch.equal(src[i].raw_data, dst[i].raw_data) for i in range(chunks))
    a.close()
    gib = chunks * n / 2**30
    print(f"{name:10s} store {gib / t_store:6.2f} GiB/s  load {gib / t_load:6.2f} GiB/s  "
          f"({chunks} x {n >> 20} MiB, tasks of {batch}; loaded {ok}/{chunks}, "
          f"byte-exact {same})", flush=True)
    if ok != chunks or not same:
        raise SystemExit(f"{name}: loaded {ok} of {chunks}, byte-exact {same}")
    return gib / t_store, gib / t_load


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("--chunks", type=int, default=256)
    p.add_argument("--chunk-mib", type=int, nargs="+", default=[2])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--verify", default="on-open", help="tierkv's verify mode")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tierkv-option", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    for mib in args.chunk_mib:
        sized(args, mib)
    return 0


def option(kv: str) -> tuple:
    """`KEY=VALUE` as a store option: an integer, `none` None, else the text."""
    k, v = kv.split("=", 1)
    return k, None if v.lower() == "none" else int(v) if v.isdigit() else v


def sized(args: argparse.Namespace, mib: int) -> None:
    n = mib << 20
    specs = {
        "tierkv": {"type": "native_plugin", "module_path": "tierkv_g3.lmcache_mp",
                   "class_name": "LMCacheConnector",
                   "adapter_params": {"root": str(args.dir / "tierkv"), "threads": args.threads,
                                      "verify": args.verify, "stats_interval": None,
                                      **dict(option(kv) for kv in args.tierkv_option)}},
        "fs_native": {"type": "fs_native", "base_path": str(args.dir / "fs_native"),
                      "num_workers": args.threads},
    }
    got: dict = {name: [] for name in specs}
    for r in range(args.rounds):
        for name in (list(specs) if r % 2 == 0 else list(reversed(specs))):
            shutil.rmtree(args.dir / name, ignore_errors=True)
            got[name].append(run(name, specs[name], args.chunks, n, args.batch))
            shutil.rmtree(args.dir / name, ignore_errors=True)
    print(f"| {mib} MiB | store GiB/s | load GiB/s |")
    for name, runs in got.items():
        print(f"| {name} | {median(s for s, _ in runs):.2f} | {median(l for _, l in runs):.2f} |")
    for i, what in ((0, "store"), (1, "load")):
        ratios = [a[i] / b[i] for a, b in zip(got["tierkv"], got["fs_native"])]
        print(f"{mib} MiB {what} tierkv / fs_native: median {median(ratios):.2f}x, rounds "
              + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    sys.exit(main())
