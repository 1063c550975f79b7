#!/usr/bin/env python3
"""Our vLLM secondary tier (tierkv_g3.vllm) against vLLM's built-in `fs` tier, each alone
under vLLM's real TieringOffloadingManager (python/tests/vllm_tier_harness.py), on the same
disk: store throughput (complete_store of a batch to its cascade reported), load throughput
(lookups of stored chunks to all promoted, after reset_cache empties the primary tier) and the
scheduler thread's cost of one lookup call, per chunk size.

usage: .venv-vllm/bin/python tools/vllm-tier-bench.py [--dir DIR] [--sizes-mib 2,8]
       [--chunks 48] [--batch 8] [--rounds 3]

The `fs` tier uses O_DIRECT where the filesystem allows it (vLLM's default); ours is run
buffered (the default) and with direct_io=True. Figures: medians of the rounds (the tiers
alternate which goes first), then per-round ratios against `fs` (for the lookup call, of the
times: below 1 is cheaper). Loads after a store are warm for buffered tiers (the page cache
holds what was just written); "load cold" loads again after dropping the page cache (root)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import numpy as np  # noqa: E402
import vllm_tier_harness as h  # noqa: E402


def timed_store(s: h.Sched, ids: List[int], batch: int) -> float:
    """Seconds from complete_store to every cascade reported, summed over batches (the
    primary rows are filled before the clock starts: that is the GPU's copy)."""
    total = 0.0
    for b in range(0, len(ids), batch):
        c = s.ctx()
        keys = [h.key(i) for i in ids[b : b + batch]]
        out = s.mgr.prepare_store(keys, c)
        assert out is not None and len(out.keys_to_store) == len(keys)
        for cid in out.store_spec.chunk_ids:
            s.primary[int(cid)] = np.random.randint(0, 255, s.chunk_bytes, np.uint8)
        t0 = time.perf_counter()
        s.mgr.complete_store(list(out.keys_to_store), c)
        s.mgr.on_request_finished(c)
        s.settle()
        total += time.perf_counter() - t0
    return total


def timed_load(s: h.Sched, ids: List[int]) -> float:
    """Seconds from the first lookup to every chunk promoted (HIT) into an empty primary."""
    s.drop_primary()
    t0 = time.perf_counter()
    res = s.lookup_all(ids)
    dt = time.perf_counter() - t0
    assert h.hits(res) == sorted(ids), res
    return dt


def lookup_cost(s: h.Sched, ids: List[int]) -> float:
    """Microseconds of one tier.lookup call on the scheduler thread (mean over `ids`)."""
    tier = s.tier()
    c = s.ctx()
    t0 = time.perf_counter()
    for i in ids:
        tier.lookup(h.key(i), c)
    dt = time.perf_counter() - t0
    s.mgr.on_request_finished(c)
    return dt / len(ids) * 1e6


def drop_caches() -> None:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def one_round(tier: Dict[str, Any], size: int, n: int, batch: int) -> Dict[str, float]:
    s = h.Sched(h.make_spec([tier], chunk_bytes=size, n_chunks=n))
    try:
        ids = list(range(n))
        st = timed_store(s, ids, batch)
        ld = timed_load(s, ids)
        # Again from a dropped page cache (root only; otherwise the warm figure again).
        drop_caches()
        cold = timed_load(s, ids)
        s.drop_primary()
        lk = lookup_cost(s, ids)
        return {"store": n * size / st / 2**30, "load": n * size / ld / 2**30,
                "cold": n * size / cold / 2**30, "lookup": lk}
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--sizes-mib", default="2,8")
    ap.add_argument("--chunks", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vllm-tier-bench-", dir=a.dir))
    kinds = {
        "tierkv": lambda r: h.tierkv_tier(r),
        "tierkv direct_io": lambda r: h.tierkv_tier(r, direct_io=True),
        "vLLM fs (O_DIRECT)": lambda r: h.fs_tier(r),
    }
    print(f"{a.chunks} chunks per round, stores in batches of {a.batch}, medians of "
          f"{a.rounds} rounds, under {base}")
    print("| chunk | tier | store GiB/s | load GiB/s | load cold GiB/s | lookup call, us |")
    print("|---|---|---:|---:|---:|---:|")
    try:
        for mib in [int(x) for x in a.sizes_mib.split(",")]:
            rows: Dict[str, List[Dict[str, float]]] = {k: [] for k in kinds}
            for r in range(a.rounds):  # interleaved: each round runs every tier once
                for name, make in list(kinds.items())[:: 1 if r % 2 == 0 else -1]:
                    root = base / f"{name.split()[0]}-{mib}-{r}-{len(rows[name])}"
                    rows[name].append(one_round(make(root), mib << 20, a.chunks, a.batch))
                    shutil.rmtree(root, ignore_errors=True)
            for name, rs in rows.items():
                med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                print(f"| {mib} MiB | {name} | {med['store']:.2f} | {med['load']:.2f} | "
                      f"{med['cold']:.2f} | {med['lookup']:.1f} |")
            fs = rows["vLLM fs (O_DIRECT)"]
            for name in ("tierkv", "tierkv direct_io"):
                cells = []
                for k in ("store", "load", "cold", "lookup"):
                    q = [x[k] / y[k] for x, y in zip(rows[name], fs)]
                    cells.append(f"{statistics.median(q):.2f}x ("
                                 + ", ".join(f"{v:.2f}" for v in q) + ")")
                print(f"| {mib} MiB | {name} / fs (rounds) | " + " | ".join(cells) + " |",
                      flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
