"""One tree, two languages: a store written by Rust (examples/interop.rs) is read by Python
and the reverse, with the same hashes; chain_hashes is the Rust BlockHash::chain_all_from."""

from __future__ import annotations

import random
import subprocess

import numpy as np

import tierkv_g3
from conftest import interop_len, interop_payload

N = 6


def tokens(n):
    return list(range(16 * n))


def run(interop, *args, **kw):
    return subprocess.run([str(interop), *map(str, args)], capture_output=True, text=True, **kw)


def test_rust_writes_python_reads(interop, tmp_path):
    r = run(interop, "write", tmp_path, "rank0", N)
    assert r.returncode == 0, r.stderr
    rust_hashes = r.stdout.split()
    assert rust_hashes == tierkv_g3.chain_hashes(tokens(N), 16)
    with tierkv_g3.Store(tmp_path, "rank0", stats_interval=None) as s:
        assert s.stats()["blocks_at_open"] == N
        assert s.contains_prefix(rust_hashes) == N
        bufs = [np.zeros(interop_len(N), np.uint8) for _ in range(N)]
        assert s.get_many_into(rust_hashes, bufs) == [interop_len(i) for i in range(N)]
        for i, b in enumerate(bufs):
            assert np.array_equal(b[: interop_len(i)], interop_payload(i)), i


def test_python_writes_rust_reads(interop, tmp_path):
    with tierkv_g3.Store(tmp_path, "rank0", stats_interval=None) as s:
        keys = tierkv_g3.chain_hashes(tokens(N), 16)
        s.put_many(keys, [interop_payload(i) for i in range(N)])
    r = run(interop, "read", tmp_path, "rank0", N)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == keys
    # And the check can fail: a block with other bytes is refused by the Rust reader.
    with tierkv_g3.Store(tmp_path, "rank0", stats_interval=None) as s:
        s.put_many(keys[:1], [interop_payload(1)[: interop_len(0)]])
    r = run(interop, "read", tmp_path, "rank0", N)
    assert r.returncode == 1 and "block 0" in r.stderr


def test_chain_hashes_equal_the_rust_helper(interop):
    rng = random.Random(17)
    cases = []
    for _ in range(300):
        n = rng.choice([1, 2, 3, 16, 64, 512])
        toks = [rng.randrange(0, 1 << 32) for _ in range(rng.randrange(0, 3 * n + 5))]
        parent = rng.choice([None, bytes(rng.randrange(256) for _ in range(32)).hex()])
        cases.append((n, parent, toks))
    cases.append((1, None, [0, 1, 2**32 - 1]))
    lines = "".join(f"{n} {p or '-'} {' '.join(map(str, t))}\n" for n, p, t in cases)
    r = run(interop, "hash", input=lines)
    assert r.returncode == 0, r.stderr
    rust = [line.split() for line in r.stdout.splitlines()]
    assert len(rust) == len(cases)
    for (n, p, t), want in zip(cases, rust):
        assert tierkv_g3.chain_hashes(t, n, parent=p) == want, (n, p, t[:8])
