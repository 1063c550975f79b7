"""An engine-shaped prefix-cache loop over tierkv, driven by a request trace.

What an engine's KV connector does per request, in the order it does it:

    token ids -> chain hashes -> contains_prefix -> load the cached prefix into preallocated
    page buffers (get_many_into) -> "compute" the rest -> store it (offer_many after the
    prefix)

The trace (Mooncake's synthetic trace: one JSON object per request, `hash_ids` one per
512-token block, equal ids meaning an equal prefix) gives each block's tokens: block id `h`
is the 512 token ids `h * 512 .. h * 512 + 511`, so equal prefixes give equal chain hashes.
Each "computed" page carries its block id in its first 8 bytes, and every loaded page is
checked against it.

    python python/examples/prefix_cache.py                      # the shared trace, 4000 blocks
    python python/examples/prefix_cache.py --requests 500 --block-bytes 4096

Prints the hit ratio (cached blocks / all blocks requested) and the load bandwidth (bytes
loaded / time in get_many_into).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import tierkv_g3

REPO = Path(__file__).resolve().parents[2]
TRACES = [
    REPO.parent / "shared" / "traces" / "synthetic_trace.jsonl",
    REPO / "tests" / "data" / "mooncake_synthetic_trace.jsonl",
]
BLOCK_TOKENS = 512


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=next((t for t in TRACES if t.exists()), None))
    ap.add_argument("--requests", type=int, default=None, help="first N requests (all)")
    ap.add_argument("--block-bytes", type=int, default=64 << 10, help="bytes per KV block")
    ap.add_argument("--capacity-blocks", type=int, default=4000)
    ap.add_argument("--policy", default="arc")
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--root", type=Path, default=None, help="cache dir (default: a temp dir)")
    args = ap.parse_args()
    if args.trace is None:
        raise SystemExit("no trace found; pass --trace FILE")

    requests = [json.loads(line) for line in open(args.trace)][: args.requests]
    max_blocks = max(len(r["hash_ids"]) for r in requests)
    # The engine's page pool: preallocated once, one row per block of a request.
    pages = tierkv_g3.aligned_array((max_blocks, args.block_bytes))
    headers = pages[:, :8].view(np.int64)  # each page's block id, (max_blocks, 1)

    tmp = None if args.root else tempfile.TemporaryDirectory()
    root = args.root or Path(tmp.name)
    blocks = hits = loaded = 0
    load_s = store_s = 0.0
    started = time.perf_counter()
    with tierkv_g3.Store(
        root, "rank0", capacity_files=args.capacity_blocks, policy=args.policy,
        engine=args.engine, watermarks=(1.0, 1.0), stats_interval=None,
    ) as store:
        engine = store.engine
        for r in requests:
            ids = r["hash_ids"]
            tokens = (np.asarray(ids, np.int64)[:, None] * BLOCK_TOKENS
                      + np.arange(BLOCK_TOKENS)).ravel()
            keys = tierkv_g3.chain_hashes(tokens, BLOCK_TOKENS)
            n = store.contains_prefix(keys)
            if n:
                t = time.perf_counter()
                got = store.get_many_into(keys[:n], list(pages[:n]))
                load_s += time.perf_counter() - t
                # A block evicted or removed since contains_prefix is a miss: recompute from it.
                n = next((i for i, g in enumerate(got) if g is None), n)
                loaded += sum(got[:n])
                assert (headers[:n, 0] == ids[:n]).all(), "a loaded page is not its block"
            # "Compute" the rest of the prompt's KV into the following pages, then store it.
            headers[n : len(ids), 0] = ids[n:]
            t = time.perf_counter()
            store.offer_many(keys[n:], list(pages[n : len(ids)]),
                             parent=keys[n - 1] if n else None)
            store_s += time.perf_counter() - t
            blocks += len(ids)
            hits += n
        stats = store.stats()
    wall = time.perf_counter() - started
    if tmp:
        tmp.cleanup()

    gib = 1 << 30
    print(f"trace {args.trace.name}: {len(requests)} requests, {blocks} blocks of "
          f"{args.block_bytes} bytes, capacity {args.capacity_blocks} blocks, "
          f"policy {args.policy}, engine {engine}")
    print(f"hit ratio {hits / max(blocks, 1):.4f} ({hits} of {blocks} blocks loaded)")
    print(f"load: {loaded / gib:.3f} GiB in {load_s:.3f} s, "
          f"{loaded / gib / max(load_s, 1e-9):.2f} GiB/s; "
          f"store: {stats['bytes_written'] / gib:.3f} GiB in {store_s:.3f} s; "
          f"evictions {stats['evictions']}, wall {wall:.1f} s")


if __name__ == "__main__":
    main()
