"""tierkv_g3.lmcache against the real LMCache on CPU: LMCacheEngine's store, lookup
and retrieve through the plugin LMCache loads from its config (storage_plugins +
extra_config), beside LMCache's own LocalDiskBackend. python/tests/lmcache_harness.py builds
the engine; its GPU connector is a copying stand-in (no GPU here), the rest is LMCache's own.
tools/test.sh runs this file in .venv-engines/ (tools/engines-venv.sh lmcache)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import fill_filesystem, require_engine  # noqa: E402

require_engine("lmcache.v1.cache_engine", "lmcache", "test_lmcache.py")

import torch  # noqa: E402

import ledger  # noqa: E402
import lmcache_harness as h  # noqa: E402
from tierkv_g3 import Store  # noqa: E402
from tierkv_g3.lmcache import PREFIX, TierkvStoragePlugin, block_key, worker_id  # noqa: E402

HARNESS = Path(__file__).with_name("lmcache_harness.py")


@pytest.fixture
def engines():
    """Makes engines (h.config's arguments); destroys them (closing their backends) after."""
    made = []

    def make(backend, root, meta=None, **kw):
        e = h.engine(h.config(backend, str(root), **kw), meta)
        made.append(e)
        return e

    yield make
    for e in made:
        h.destroy(e)


def keys_of(e, toks):
    return [k for _, _, k in e.token_database.process_tokens(tokens=torch.tensor(toks))]


def block_files(root):
    return {p.name for p in Path(root).rglob("*") if p.is_file() and len(p.name) == 64}


def test_store_lookup_retrieve_through_the_plugin_loaded_by_config(tmp_path, engines):
    """LMCache builds the plugin from its config; a request's 4 chunks are stored (one block
    each, named by the folded key), looked up and retrieved byte-exact, from the plugin
    (LMCache's CPU tier holds nothing: local_cpu false); a longer request hits its prefix."""
    e = engines("tierkv", tmp_path / "kv")
    backends = e.storage_manager.storage_backends
    assert list(backends) == ["LocalCPUBackend", "tierkv"]
    plugin = h.plugin(e)
    assert isinstance(plugin, TierkvStoragePlugin) and plugin.store is not None
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    h.store(e, toks, kv)
    assert block_files(tmp_path / "kv") == {block_key(k) for k in keys_of(e, toks)}
    assert backends["LocalCPUBackend"].get_keys() == []
    assert e.lookup(torch.tensor(toks)) == 4 * h.CHUNK
    got, back = h.retrieve(e, toks)
    assert got == 4 * h.CHUNK and torch.equal(back, kv)
    longer = toks + h.tokens(2, base=9000)
    assert e.lookup(torch.tensor(longer)) == 4 * h.CHUNK
    got, back = h.retrieve(e, longer)
    assert got == 4 * h.CHUNK and torch.equal(back[:, :, :got], kv)
    # Gets allocate from LMCache's own CPU allocator, and read into the object in place.
    obj = plugin.get_blocking(keys_of(e, toks)[1])
    assert obj.parent() is backends["LocalCPUBackend"].memory_allocator
    assert torch.equal(obj.tensor, kv[:, :, h.CHUNK : 2 * h.CHUNK])
    obj.ref_count_down()
    assert plugin.tierkv_stats()["failures"] == {}


def test_an_unfull_last_chunk_round_trips(tmp_path, engines):
    """save_unfull_chunk: the last chunk (8 of 16 tokens) has its own shape, kept in the
    block's prefix; it comes back in an object of that shape."""
    e = engines("tierkv", tmp_path / "kv", lmc={"save_unfull_chunk": True})
    toks, kv = h.tokens(3)[: 2 * h.CHUNK + 8], h.kv(2 * h.CHUNK + 8)
    h.store(e, toks, kv)
    assert e.lookup(torch.tensor(toks)) == len(toks)
    got, back = h.retrieve(e, toks)
    assert got == len(toks) and torch.equal(back, kv)
    obj = h.plugin(e).get_blocking(keys_of(e, toks)[2])
    assert obj.get_shape()[2] == 8 and torch.equal(obj.tensor, kv[:, :, 2 * h.CHUNK :])
    obj.ref_count_down()


def test_puts_past_the_queue_bound_are_dropped_not_waited_for(tmp_path, engines):
    """max_pending_bytes of 2 chunks, a request of 4 stored at once: 2 are queued, 2 dropped
    (counted), store returns; the lookup finds the 2 written, retrieved byte-exact."""
    e = engines("tierkv", tmp_path / "kv", max_pending_bytes=2 * h.CHUNK_BYTES)
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    h.store(e, toks, kv)
    stats = h.plugin(e).tierkv_stats()
    assert stats["dropped"] == 2 and stats["pending"] == 0 and stats["failures"] == {}
    assert e.lookup(torch.tensor(toks)) == 2 * h.CHUNK
    got, back = h.retrieve(e, toks)
    assert got == 2 * h.CHUNK and torch.equal(back[:, :, :got], kv[:, :, :got])


def test_a_store_returns_while_the_disk_is_stalled(tmp_path, engines):
    """LMCache's store hands the chunks to the plugin's offloader and returns while its
    writer is stalled (the shared tree's ledger lock held by another open file, as a hung
    writer would hold it): nothing written yet, every chunk in LMCache's put tasks; once the
    lock is let go all 4 are written and retrieved byte-exact, and each MemoryObj released."""
    e = engines("tierkv", tmp_path / "kv")
    plug = h.plugin(e)
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    with ledger.held(plug.store.dir):
        t0 = time.monotonic()
        e.store(torch.tensor(toks), kvcaches=kv)
        assert time.monotonic() - t0 < 5.0  # the ledger wait is 10 s
        time.sleep(0.3)
        keys = keys_of(e, toks)
        assert all(plug.exists_in_put_tasks(k) for k in keys)
        assert block_files(tmp_path / "kv") == set()
        assert plug.tierkv_stats()["pending"] == 4
    h.wait_written(e)
    assert len(block_files(tmp_path / "kv")) == 4 and plug.tierkv_stats()["failures"] == {}
    got, back = h.retrieve(e, toks)
    assert got == len(toks) and torch.equal(back, kv)


def test_get_non_blocking_gives_the_chunk_with_and_without_an_event_loop(tmp_path, engines):
    """LMCache's single-chunk non-blocking get: a future of the stored chunk, byte-exact, read
    on a running event loop's executor or, without one, at once; None for a chunk not
    stored; never an exception."""
    e = engines("tierkv", tmp_path / "kv")
    plug = h.plugin(e)
    toks, kv = h.tokens(2), h.kv(2 * h.CHUNK)
    h.store(e, toks, kv)
    keys = keys_of(e, toks)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        for plug.loop in (None, loop):
            fut = plug.get_non_blocking(keys[1])
            obj = fut.result(timeout=30)
            assert torch.equal(obj.tensor, kv[:, :, h.CHUNK :]), plug.loop
            obj.ref_count_down()
        assert plug.get_non_blocking(keys_of(e, h.tokens(1, base=9000))[0]) is None
        assert plug.tierkv_stats()["failures"] == {}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=5)


def reads_by_thread(plugin) -> list:
    """Patches `plugin`'s blocking reads (every read of a chunk goes through
    `batched_get_blocking`) to record the thread of each call; the list of those threads."""
    readers: list = []
    read = plugin.batched_get_blocking

    def recorded(keys):
        readers.append(threading.get_ident())
        return read(keys)

    plugin.batched_get_blocking = recorded
    return readers


def test_with_async_loading_the_engines_retrieve_reads_no_disk(tmp_path, engines):
    """README's LMCache config turns on LMCache's async loading: the chunks are read on
    LMCache's event loop during the lookup (`async_lookup_and_prefetch`, which vLLM's scheduler
    waits on before it schedules the request), and the engine's `retrieve`, which vLLM's
    worker runs in its step, takes them from memory, byte-exact: no read of the plugin runs on
    the engine's thread. Without async loading, `retrieve` reads on the engine's thread (the
    second half: what the README's line avoids)."""
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    e = engines("tierkv", tmp_path / "kv", lmc={"enable_async_loading": True})
    h.store(e, toks, kv)
    readers = reads_by_thread(h.plugin(e))
    assert h.prefetch(e, toks) == len(toks)
    assert readers and threading.get_ident() not in readers
    got, back = h.retrieve(e, toks)
    assert got == len(toks) and torch.equal(back, kv)
    assert threading.get_ident() not in readers

    blocking = engines("tierkv", tmp_path / "kv")
    readers = reads_by_thread(h.plugin(blocking))
    got, back = h.retrieve(blocking, toks)
    assert got == len(toks) and torch.equal(back, kv) and readers == [threading.get_ident()]


def run_harness(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_restart_keeps_the_hits_local_disk_backend_loses(tmp_path):
    """Each backend alone, same request, a process that stores and one after it (a restart):
    both store all 4 chunks; after the restart the plugin still hits and retrieves them
    byte-exact, LMCache's LocalDiskBackend (an index in memory only) finds none."""
    full = 4 * h.CHUNK
    assert run_harness("write", str(tmp_path), "4") == {
        "tierkv": {"lookup": full},
        "disk": {"lookup": full},
    }
    after = run_harness("read", str(tmp_path), "4")
    assert after["tierkv"] == {"lookup": full, "retrieved": full, "exact": True}
    assert after["disk"]["lookup"] == 0 and after["disk"]["retrieved"] == 0
    assert len(list((tmp_path / "disk").iterdir())) == 4  # its files are still there


def test_models_shardings_and_dtypes_never_share_a_block(tmp_path, engines):
    """Same root, same tokens: another model, another TP rank or another world size is
    another worker and other block keys; none sees the first one's chunks."""
    root = tmp_path / "kv"
    a = engines("tierkv", root)
    toks = h.tokens(2)
    h.store(a, toks, h.kv(2 * h.CHUNK))
    others = [h.metadata(model="other-model"), h.metadata(worker=1, world=2)]
    workers = {h.plugin(a).worker}
    for meta in others:
        b = engines("tierkv", root, meta=meta)
        assert b.lookup(torch.tensor(toks)) == 0
        workers.add(h.plugin(b).worker)
        assert not set(map(block_key, keys_of(b, toks))) & set(map(block_key, keys_of(a, toks)))
    assert len(workers) == 3 and all(len(w) <= 64 for w in workers)
    cfg = h.config("tierkv", str(root))
    meta = h.metadata()
    meta.kv_dtype = torch.float16
    assert worker_id(cfg, meta) not in workers
    long = h.metadata(model="org/" + "a-very-long-model-name" * 5)
    assert len(worker_id(cfg, long)) <= 64 and worker_id(cfg, long).startswith("lmc.")


def test_a_full_disk_fails_the_puts_without_an_exception(tiny_tmpfs, engines):
    """A 256 KiB tmpfs, filled: LMCache's stores return, the puts fail (counted), lookups
    find only what was written, retrieves of it are byte-exact; the engine goes on."""
    e = engines("tierkv", tiny_tmpfs / "kv")
    h.store(e, h.tokens(2), h.kv(2 * h.CHUNK))
    fill_filesystem(tiny_tmpfs / "filler")
    toks, kv = h.tokens(8, base=5000), h.kv(8 * h.CHUNK, seed=9)
    h.store(e, toks, kv)
    assert h.plugin(e).tierkv_stats()["failures"].get("put", 0) >= 1
    hit = e.lookup(torch.tensor(toks))
    assert hit < len(toks)
    got, back = h.retrieve(e, toks)
    assert got == hit and torch.equal(back[:, :, :got], kv[:, :, :got])
    os.unlink(tiny_tmpfs / "filler")  # room again: the same engine stores and hits
    h.store(e, toks, kv)
    assert e.lookup(torch.tensor(toks)) == len(toks)


def test_a_corrupt_block_is_a_miss(tmp_path, engines):
    """A byte flipped in a block's file (found with the store's layout, path_of): a fresh
    engine's retrieve stops before that chunk, byte-exact up to it, no exception. A block
    that is not this key's chunk (a foreign payload under its name) is a miss too."""
    root = tmp_path / "kv"
    e = engines("tierkv", root)
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    h.store(e, toks, kv)
    keys = keys_of(e, toks)
    path = h.plugin(e).store.path_of(block_key(keys[2]))
    worker = h.plugin(e).worker
    h.destroy(e)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    e2 = engines("tierkv", root)
    got, back = h.retrieve(e2, toks)
    assert got == 2 * h.CHUNK and torch.equal(back[:, :, :got], kv[:, :, :got])
    h.destroy(e2)
    with Store(root, worker, stats_interval=None) as s:  # a foreign block under key 1
        s.put_many([block_key(keys[1])], [bytes(PREFIX + h.CHUNK_BYTES)])
    e3 = engines("tierkv", root)
    got, back = h.retrieve(e3, toks)
    assert got == h.CHUNK and torch.equal(back[:, :, :got], kv[:, :, :got])
    assert h.plugin(e3).tierkv_stats()["failures"].get("get", 0) >= 1


def test_a_missing_root_is_a_miss_never_an_exception(tmp_path, engines):
    """A root that cannot be made (under a regular file): LMCache loads the plugin, every
    store, lookup and retrieve runs and misses; a root removed under a running engine: what
    is retrieved is exact, no exception."""
    (tmp_path / "file").write_bytes(b"")
    e = engines("tierkv", tmp_path / "file" / "kv")
    plugin = h.plugin(e)
    assert plugin.store is None and plugin.tierkv_stats()["failures"]["open"] == 1
    toks, kv = h.tokens(2), h.kv(2 * h.CHUNK)
    h.store(e, toks, kv)
    assert e.lookup(torch.tensor(toks)) == 0 and h.retrieve(e, toks)[0] == 0
    assert plugin.tierkv_stats()["failures"]["put"] >= 1
    root = tmp_path / "gone"
    e2 = engines("tierkv", root)
    h.store(e2, toks, kv)
    os.rename(root, tmp_path / "moved")  # gone, at once (its stats writer keeps writing)
    shutil.rmtree(tmp_path / "moved", ignore_errors=True)
    # Files the store holds open still read (their bytes exist until closed): exact or none.
    got, back = h.retrieve(e2, toks)
    assert got in (0, 2 * h.CHUNK) and torch.equal(back[:, :, :got], kv[:, :, :got])
    # A new put fails (counted), or lands in the directory the store holds open if the
    # removal left it (its stats writer races rmtree): either way exact or none, no raise.
    toks2 = h.tokens(2, base=7000)
    h.store(e2, toks2, kv)
    got, back = h.retrieve(e2, toks2)
    assert got in (0, 2 * h.CHUNK) and torch.equal(back[:, :, :got], kv[:, :, :got])


def test_a_misspelt_option_is_refused_at_start_naming_it(tmp_path, engines, caplog):
    """`capacity_byte` for `capacity_bytes` left the store unbounded
    without a word; the plugin now refuses an option it does not know, by its full name
    (LMCache logs the refusal and runs without the backend)."""
    e = engines("tierkv", tmp_path / "kv", capacity_byte=1 << 20)
    assert "tierkv" not in e.storage_manager.storage_backends
    assert "unknown option(s) storage_plugin.tierkv.capacity_byte" in caplog.text
    assert not (tmp_path / "kv").exists()
    e = engines("tierkv", tmp_path / "kv2", capacity_bytes=1 << 20)
    assert h.plugin(e).store is not None


def test_two_engines_of_one_model_share_a_root_by_default(tmp_path, engines):
    """A second engine (another `lmcache server`, a replica) on one root
    had no disk tier; with the documented config both work, each hitting what the other
    stored."""
    e1 = engines("tierkv", tmp_path / "kv")
    e2 = engines("tierkv", tmp_path / "kv")
    assert h.plugin(e1).store is not None and h.plugin(e2).store is not None
    toks, kv = h.tokens(2), h.kv(2 * h.CHUNK)
    h.store(e1, toks, kv)  # waits until written
    got, back = h.retrieve(e2, toks)
    assert got == 2 * h.CHUNK and torch.equal(back[:, :, :got], kv[:, :, :got])


def test_a_pinned_lookup_keeps_its_chunks_until_unpinned(tmp_path, engines):
    """LMCache pins what a lookup found until it retrieves it
    (`lookup(pin=True)`, then `lookup_unpin`). The plugin only touched the blocks: one evicted
    in between was missing at the retrieve (under vLLM's default `kv_load_failure_policy` a
    failed request). Now the chunks stay while pinned, and go once unpinned."""
    e = engines("tierkv", tmp_path / "kv", capacity_files=4, policy="lru")
    a, kv_a = h.tokens(4), h.kv(4 * h.CHUNK)
    h.store(e, a, kv_a)
    assert e.lookup(torch.tensor(a), lookup_id="a", pin=True) == 4 * h.CHUNK
    for base in (5000, 9000):  # two more requests that fill the capacity twice over
        h.store(e, h.tokens(4, base=base), h.kv(4 * h.CHUNK, seed=base))
    got, back = h.retrieve(e, a)
    assert got == 4 * h.CHUNK and torch.equal(back, kv_a)
    e.lookup_unpin("a")
    h.store(e, h.tokens(4, base=13000), h.kv(4 * h.CHUNK, seed=3))
    assert e.lookup(torch.tensor(a)) == 0, "unpinned, the oldest chunks make room"
    assert h.plugin(e).tierkv_stats()["failures"] == {}


def test_removing_one_chunk_removes_only_it(tmp_path, engines):
    """A batch is stored as one chain, and LMCache's `remove(key)` of
    one chunk removed the chunks stored after it too (other objects to LMCache, which its
    accounting never heard of). Now only the chunk named goes."""
    e = engines("tierkv", tmp_path / "kv")
    toks, kv = h.tokens(4), h.kv(4 * h.CHUNK)
    h.store(e, toks, kv)
    plugin, ks = h.plugin(e), keys_of(e, toks)
    assert plugin.remove(ks[1])
    assert block_files(tmp_path / "kv") == {block_key(k) for k in ks} - {block_key(ks[1])}
    for i in (0, 2, 3):
        obj = plugin.get_blocking(ks[i])
        assert obj is not None and torch.equal(obj.tensor, kv[:, :, i * h.CHUNK : (i + 1) * h.CHUNK])
        obj.ref_count_down()
    assert e.lookup(torch.tensor(toks)) == h.CHUNK  # LMCache's prefix stops at the gap


def test_readmes_config_lines_load_through_lmcaches_own_config_loader(tmp_path, engines):
    """README's three config-file lines, as pasted (the root moved here), in a YAML file that
    LMCache's own loader reads (`LMCacheEngineConfig.from_file`): the engine it configures
    loads our plugin with the line's capacity, and stores and retrieves a request."""
    import re

    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text().splitlines()
    keys = ("enable_async_loading:", "storage_plugins:", "extra_config:")
    lines = [x for x in text if x.startswith(keys)]
    assert len(lines) == 3 and '"storage_plugin.tierkv.capacity_bytes"' in lines[2]
    lines[2] = re.sub(r'"(storage_plugin\.tierkv\.root)": "[^"]*"', rf'"\1": "{tmp_path / "kv"}"', lines[2])
    path = tmp_path / "lmcache.yaml"
    path.write_text("\n".join([f"chunk_size: {h.CHUNK}", "local_cpu: false", "max_local_cpu_size: 0.05", *lines]) + "\n")
    from lmcache.v1.config import LMCacheEngineConfig

    e = h.engine(LMCacheEngineConfig.from_file(str(path)))
    try:
        plugin = h.plugin(e)
        assert isinstance(plugin, TierkvStoragePlugin) and plugin.store is not None
        assert plugin.tierkv_stats()["store"]["capacity_bytes"] == 1099511627776
        assert e.async_loading  # loads are read during the lookup, not in the engine's step
        toks, kv = h.tokens(2), h.kv(2 * h.CHUNK)
        h.store(e, toks, kv)
        assert h.prefetch(e, toks) == 2 * h.CHUNK
        got, back = h.retrieve(e, toks)
        assert got == 2 * h.CHUNK and torch.equal(back, kv)
    finally:
        h.destroy(e)


def test_clear_empties_the_worker_and_a_replica_keeps_working(tmp_path, engines):
    """LMCache's `clear()` (its storage manager clears every backend that has a `clear`) reaches
    the plugin: every chunk of the worker goes, through the store, and a second engine on the
    same root (a replica) keeps storing and finding what is stored after. Before, LMCache
    logged that the backend does not support clear, and every chunk stayed."""
    a = engines("tierkv", tmp_path / "kv")
    b = engines("tierkv", tmp_path / "kv")
    toks, kv = h.tokens(3), h.kv(3 * h.CHUNK)
    h.store(a, toks, kv)
    assert b.lookup(torch.tensor(toks)) == 3 * h.CHUNK
    assert a.clear() == 3 * h.CHUNK
    assert block_files(tmp_path / "kv") == set()
    assert a.lookup(torch.tensor(toks)) == 0 and b.lookup(torch.tensor(toks)) == 0
    later, kv2 = h.tokens(2, base=7000), h.kv(2 * h.CHUNK, seed=9)
    h.store(b, later, kv2)
    assert a.lookup(torch.tensor(later)) == 2 * h.CHUNK
    got, back = h.retrieve(a, later)
    assert got == 2 * h.CHUNK and torch.equal(back, kv2)
    for e in (a, b):
        assert h.plugin(e).tierkv_stats()["failures"] == {}


def test_a_router_subscribed_to_the_kv_events_ends_with_the_chunks_on_disk(tmp_path, engines):
    """A plugin cannot reach LMCache's own event list: its `kv_events` publisher tells a
    router, in vLLM's schema and under LMCache's chunk hashes (what LMCache's own stored
    events carry), every chunk this engine stored and its removal by anyone: a replica's
    evictions, a remove, a chunk found gone by a lookup. A router that drops batches
    replays them."""
    from kv_events_subscriber import Subscriber
    from tierkv_g3 import _tierkv

    root, sock = tmp_path / "kv", tmp_path / "ev"
    events = {"endpoint": f"ipc://{sock}.pub", "replay_endpoint": f"ipc://{sock}.replay"}
    router = Subscriber(events["endpoint"], events["replay_endpoint"])
    lossy = Subscriber(events["endpoint"], events["replay_endpoint"], drop={1})
    try:
        e1 = engines("tierkv", root, kv_events=events, capacity_files=10)
        e2 = engines("tierkv", root, capacity_files=10)  # a replica, no publisher of its own
        worker = h.plugin(e1).worker
        stored = {}
        for i, (e, base) in enumerate([(e1, 1000), (e1, 3000), (e2, 5000), (e1, 7000)]):
            toks = h.tokens(4, base=base)
            h.store(e, toks, h.kv(4 * h.CHUNK))
            if e is e1:
                stored.update({bytes.fromhex(block_key(k)): k.chunk_hash for k in keys_of(e, toks)})
            time.sleep(0.3)  # batches of their own
        first = keys_of(e1, h.tokens(4, base=7000))
        assert h.plugin(e1).remove(first[3])
        os.unlink(h.plugin(e1).store.path_of(block_key(first[2])))
        assert e1.lookup(torch.tensor(h.tokens(4, base=7000))) == 2 * h.CHUNK  # found gone
        time.sleep(0.3)
        h.store(e1, h.tokens(1, base=9000), h.kv(h.CHUNK))  # a last batch: gaps show at it
        stored.update({bytes.fromhex(block_key(k)): k.chunk_hash for k in keys_of(e1, h.tokens(1, base=9000))})
        on_disk = set(_tierkv.tree_blocks(str(root), worker))
        tree = {stored[k] for k in on_disk if k in stored}
        assert 3 <= len(tree) < len(stored) and len(on_disk) > len(tree)  # e2's are not told

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (router.storage() == tree == lossy.storage()):
            time.sleep(0.05)
        assert router.storage() == tree, (len(router.storage()), len(tree))
        assert lossy.storage() == tree and lossy.gaps >= 1 and lossy.replayed >= 1
        assert router.removed > 0
        assert {(e.ownership, e.locality, e.block_size) for e in router.stored_all} == {
            ("tierkv", "LOCAL", h.CHUNK)
        }
    finally:
        router.close()
        lossy.close()
