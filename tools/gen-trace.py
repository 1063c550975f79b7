#!/usr/bin/env python3
"""Generates prefix-chain workload traces in the format of tests/data/mooncake_synthetic_trace.jsonl:
one JSON object per request, {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}, one hash id per 512-token block, equal ids meaning equal blocks (a chain's
prefix). Deterministic for a given shape and seed.

usage: tools/gen-trace.py SHAPE [--seed N] [--requests N] > trace.jsonl
       tools/gen-trace.py --list   (the shapes, one a line)
shapes (docs/eviction.md says why each is plausible):
  conversation  multi-turn chats: each turn extends the previous request of its conversation;
                most conversations end after a few turns, a heavy tail runs long
  chat          chat serving at scale: many conversations in flight, most of them short, each
                turn adding a long new part, so most blocks are seen once
  agent         tool/agent calls: a handful of long system prompts (Zipf), each followed by a
                long one-off suffix
  documents     a Zipf mix of shared document prefixes, each followed by a short question
  scan          a hot working set of chains, with long scans of fresh blocks mixed in
"""
import argparse
import json
import random
import sys

BLOCK_TOKENS = 512


class Ids:
    """Fresh block ids."""

    def __init__(self):
        self.next = 0

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def zipf_index(rng, n, s):
    """An index in 0..n drawn with probability proportional to 1/(i+1)^s."""
    # Inverse transform over the (small) table, cached per (n, s).
    key = (n, s)
    table = zipf_index.tables.get(key)
    if table is None:
        weights = [1.0 / (i + 1) ** s for i in range(n)]
        total = sum(weights)
        acc, table = 0.0, []
        for w in weights:
            acc += w / total
            table.append(acc)
        zipf_index.tables[key] = table
    u = rng.random()
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if table[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo


zipf_index.tables = {}


def conversation(rng, ids, requests):
    """Up to 64 conversations in flight; a finished one is replaced by a new one."""
    live = []
    out = []
    while len(out) < requests:
        while len(live) < 64:
            # Turns: geometric (mean about 3) for most, a Pareto tail for one in ten.
            if rng.random() < 0.1:
                turns = min(200, int(rng.paretovariate(1.2) * 8))
            else:
                turns = 1 + int(rng.expovariate(1 / 2.0))
            system = ids.take(rng.randint(1, 4))
            live.append({"ids": system, "left": max(1, turns)})
        c = live[rng.randrange(len(live))]
        # The user's message and the previous answer: 1-6 new blocks.
        c["ids"] = c["ids"] + ids.take(rng.randint(1, 6))
        out.append(list(c["ids"]))
        c["left"] -= 1
        if c["left"] == 0:
            live.remove(c)
    return out


def chat(rng, ids, requests):
    """Chat serving at scale: 400 conversations in flight behind 3 shared system prompts; half
    end after their first turn, the rest after a geometric number (mean 4) of turns, one in
    ten Pareto-long; each turn adds 2-24 new blocks (a pasted document, the previous answer),
    so most blocks are seen once and the reused ones are the prefixes of live chats."""
    systems = [ids.take(rng.randint(2, 6)) for _ in range(3)]
    live = []
    out = []
    while len(out) < requests:
        while len(live) < 400:
            u = rng.random()
            if u < 0.5:
                turns = 1
            elif u < 0.9:
                turns = 1 + int(rng.expovariate(1 / 4.0))
            else:
                turns = min(300, int(rng.paretovariate(1.1) * 10))
            live.append({"ids": list(systems[rng.randrange(3)]), "left": max(1, turns)})
        c = live[rng.randrange(len(live))]
        c["ids"] = c["ids"] + ids.take(rng.randint(2, 24))
        out.append(list(c["ids"]))
        c["left"] -= 1
        if c["left"] == 0:
            live.remove(c)
    return out


def agent(rng, ids, requests):
    """Eight system prompts of 20-60 blocks, chosen by Zipf(1.1); a fresh suffix of 10-80."""
    prompts = [ids.take(rng.randint(20, 60)) for _ in range(8)]
    out = []
    for _ in range(requests):
        p = prompts[zipf_index(rng, len(prompts), 1.1)]
        out.append(p + ids.take(rng.randint(10, 80)))
    return out


def documents(rng, ids, requests):
    """5,000 documents of 5-120 blocks with Zipf(0.9) popularity; a question of 1-3 blocks."""
    docs = [ids.take(rng.randint(5, 120)) for _ in range(5000)]
    out = []
    for _ in range(requests):
        d = docs[zipf_index(rng, len(docs), 0.9)]
        out.append(d + ids.take(rng.randint(1, 3)))
    return out


def scan(rng, ids, requests):
    """300 hot chains of 4-20 blocks (uniform); one request in 25 is a scan of 300-1,500
    fresh blocks."""
    hot = [ids.take(rng.randint(4, 20)) for _ in range(300)]
    out = []
    for _ in range(requests):
        if rng.random() < 0.04:
            out.append(ids.take(rng.randint(300, 1500)))
        else:
            out.append(list(hot[rng.randrange(len(hot))]))
    return out


def multiturn(rng, ids, requests):
    """Multi-turn sessions and one-shot prompts behind one shared system prompt, most blocks
    seen once: half the requests are one-shot (the system prompt and 4-60 fresh blocks), half
    the next turn of one of 400 open sessions, picked with Pareto(0.8) weights (a few sessions
    run fast, tool loops; most come back slowly, people), each turn adding 1-6 blocks and a
    session closing after a geometric number of turns (mean 9). At small capacities admission
    decides (the one-shot tails flush the sessions under LRU), at large ones recency."""
    system = ids.take(4)
    live = []
    out = []
    while len(out) < requests:
        if rng.random() < 0.5:
            out.append(system + ids.take(rng.randint(4, 60)))
            continue
        while len(live) < 400:
            live.append({"ids": list(system), "left": 1 + int(rng.expovariate(1 / 8.0)),
                         "w": rng.paretovariate(0.8)})
        c = rng.choices(live, weights=[x["w"] for x in live])[0]
        c["ids"] = c["ids"] + ids.take(rng.randint(1, 6))
        out.append(list(c["ids"]))
        c["left"] -= 1
        if c["left"] == 0:
            live.remove(c)
    return out


def tenants(rng, ids, requests):
    """Long shared prefixes and one-shot tails: 60 tenants' system prompts of 10-120 blocks
    with Zipf(1.0) popularity; three requests in four are one-shot (the prompt and a fresh
    tail of 5-60 blocks), one in four the next turn of one of the tenant's 20 open sessions,
    each turn adding 2-12 blocks and a session closing after 8 turns."""
    prompts = [ids.take(rng.randint(10, 120)) for _ in range(60)]
    sessions = [[] for _ in prompts]
    out = []
    for _ in range(requests):
        t = zipf_index(rng, len(prompts), 1.0)
        if rng.random() < 0.75:
            out.append(prompts[t] + ids.take(rng.randint(5, 60)))
            continue
        open_ = sessions[t]
        if len(open_) < 20:
            open_.append({"ids": list(prompts[t]), "turns": 0})
        c = open_[rng.randrange(len(open_))]
        c["ids"] = c["ids"] + ids.take(rng.randint(2, 12))
        c["turns"] += 1
        out.append(list(c["ids"]))
        if c["turns"] == 8:
            open_.remove(c)
    return out


def loop(rng, ids, requests):
    """Adversarial for recency: 50 chains of 20 blocks (1,000 blocks) asked in a fixed cyclic
    order, so a cache smaller than the loop gets no hit under LRU; one request in ten is one
    of 10 hot chains instead."""
    ring = [ids.take(20) for _ in range(50)]
    hot = [ids.take(20) for _ in range(10)]
    out = []
    k = 0
    for _ in range(requests):
        if rng.random() < 0.1:
            out.append(list(hot[rng.randrange(len(hot))]))
        else:
            out.append(list(ring[k % len(ring)]))
            k += 1
    return out


def phases(rng, ids, requests):
    """A workload that changes its nature: alternating phases of a tenth of the trace each,
    chat-like (recency wins: every turn's prefix comes back soon) and scan-like (a hot set
    with long one-off scans: admission wins), so a policy must follow the change."""
    chats = [[] for _ in range(50)]
    hot = [ids.take(rng.randint(4, 16)) for _ in range(100)]
    out = []
    phase_len = max(1, requests // 10)
    for n in range(requests):
        if (n // phase_len) % 2 == 0:
            c = rng.randrange(len(chats))
            if not chats[c] or len(chats[c]) > 60:
                chats[c] = ids.take(2)
            chats[c] = chats[c] + ids.take(rng.randint(1, 4))
            out.append(list(chats[c]))
        elif rng.random() < 0.06:
            out.append(ids.take(rng.randint(200, 1200)))
        else:
            out.append(list(hot[rng.randrange(len(hot))]))
    return out


SHAPES = {
    "conversation": conversation,
    "agent": agent,
    "chat": chat,
    "documents": documents,
    "scan": scan,
    "multiturn": multiturn,
    "tenants": tenants,
    "loop": loop,
    "phases": phases,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if sys.argv[1:] == ["--list"]:
        print("\n".join(sorted(SHAPES)))
        return
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000)
    a = ap.parse_args()
    rng = random.Random(f"{a.shape}:{a.seed}")
    reqs = SHAPES[a.shape](rng, Ids(), a.requests)
    t = 0
    w = sys.stdout
    for r in reqs:
        t += int(rng.expovariate(1 / 50.0))
        w.write(
            json.dumps(
                {
                    "timestamp": t,
                    "input_length": len(r) * BLOCK_TOKENS,
                    "output_length": rng.randint(16, 512),
                    "hash_ids": r,
                }
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
