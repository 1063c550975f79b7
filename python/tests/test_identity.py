"""Engine identity in one place: every backend folds its engine's keys with
`tierkv_g3.engine_key` (the Rust `BlockHash::of_engine_key`) and names its worker with
`tierkv_g3.worker_id` (the Rust `WorkerId::from_description`, over canonical JSON); the known
answers are those of Python's own blake3 and json, so the Rust and Python sides agree."""

from __future__ import annotations

import re
from pathlib import Path

import tierkv_g3

PACKAGE = Path(tierkv_g3.__file__).parent


def test_engine_key_is_the_rust_fold_with_its_known_answer():
    key = bytes(range(36))
    got = tierkv_g3.engine_key(b"vllm.tier", key)
    assert got.hex() == "f5d41f586dd49661937122d38a2298459ec4803b8b2a1eef9f785c4134e308f6"
    assert tierkv_g3.engine_key(b"ab", b"c") != tierkv_g3.engine_key(b"a", b"bc")


def test_a_store_knows_an_engine_key_as_it_knows_its_fold(tmp_path):
    """`Store.knows_engine_key` (the vLLM tier's one-call lookup) answers what
    `lookup_many([engine_key(...)], tree=False)` answers, before and after the block is put."""
    store = tierkv_g3.Store(str(tmp_path), "w0")
    ctx, key = b"vllm.tier", bytes(range(36))
    ours = tierkv_g3.engine_key(ctx, key)
    assert store.knows_engine_key(ctx, key) is False
    store.put_many([ours], [b"x" * 64])
    assert store.knows_engine_key(ctx, key) is True
    assert store.lookup_many([ours], tree=False) == [True]
    assert store.knows_engine_key(b"vllm.other", key) is False
    assert store.knows_engine_key(ctx, key[:-1]) is False


def test_worker_id_hashes_the_canonical_description_whatever_its_order():
    a = {"model": "org/tiny", "tp": (0, 1), "dtype": "float16", "nested": {"b": 2, "a": "x"}}
    b = {"nested": {"a": "x", "b": 2}, "dtype": "float16", "tp": [0, 1], "model": "org/tiny"}
    assert tierkv_g3.worker_id("vllm.tiny", a) == "vllm.tiny.e7aa3121b3550f97"
    assert tierkv_g3.worker_id("vllm.tiny", b) == "vllm.tiny.e7aa3121b3550f97"
    assert tierkv_g3.worker_id("vllm.tiny", {**a, "dtype": "bfloat16"}) != "vllm.tiny.e7aa3121b3550f97"
    assert re.fullmatch(r"m{47}\.[0-9a-f]{16}", tierkv_g3.worker_id("m" * 80, {}))


def test_no_backend_derives_keys_or_worker_ids_itself():
    """Before, lmcache.py folded keys with BLAKE2b, vllm.py with blake3 of a prefix, and three
    backends hashed `repr(sorted(...))` of engine objects with SHA-256 for worker ids."""
    own = re.compile(r"hashlib\.(sha\d+|blake2[bs]|md5)\(|\bblake3\(")
    offenders = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted(PACKAGE.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if own.search(line) and "_file_digest" not in line
    ]
    # The one hash left is of weight files' bytes (`_engines._file_digest`), not of keys.
    where = [(o.split(":")[0], o.split(": ", 1)[1]) for o in offenders]
    assert where == [("_engines.py", "h = hashlib.blake2b(digest_size=16)")], offenders
