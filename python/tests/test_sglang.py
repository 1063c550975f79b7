"""tierkv_g3.sglang against the real SGLang on CPU: SGLang's host pools, its
HiCacheController with its threads and its backend factory (`dynamic`) around the backend
(python/tests/sglang_harness.py builds them). tools/test.sh runs this file in .venv-engines/
(tools/engines-venv.sh sglang installs sglang 0.5.23, lmcache 0.5.6 and their torch there)."""

from __future__ import annotations

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

require_engine("sglang.srt.managers.cache_controller", "sglang", "test_sglang.py")

import torch  # noqa: E402

import sglang_harness as h  # noqa: E402
from tierkv_g3.sglang import worker_id  # noqa: E402

HARNESS = Path(__file__).with_name("sglang_harness.py")


def tokens(n_pages: int, base: int = 1000) -> list:
    return list(range(base, base + n_pages * h.PAGE))


@pytest.fixture
def controllers():
    """Makes controllers (h.controller's arguments); stops their threads and closes their
    stores after the test."""
    made = []

    def make(root, **kw):
        c = h.controller(str(root), **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        h.stop(c)


def threads_alive(ctrl) -> bool:
    return ctrl.backup_thread.is_alive() and ctrl.prefetch_thread.is_alive() and (
        ctrl.prefetch_io_aux_thread.is_alive()
    )


def run_harness(*args: str) -> str:
    # Its own gloo port: a test of this process that made a process group set MASTER_PORT.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run(
        [sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_pages_written_by_one_controller_are_restored_by_another_process(tmp_path):
    """SGLang's backup thread writes 6 pages (zero-copy v1, K and V regions); a second
    controller in a fresh process finds them (batch_exists on its prefetch thread) and its
    io thread restores them byte-exact into its own host pool."""
    root = tmp_path / "kv"
    run_harness("write", str(root), "6", str(tmp_path / "pages.json"))
    written = json.loads((tmp_path / "pages.json").read_text())
    restored = json.loads(run_harness("read", str(root), "6"))
    assert len(written) == 6 and restored == written
    # Keys are SGLang's own get_hash_str chain, the file names of the blocks.
    workers = list((root / "v1").iterdir())
    assert len(workers) == 1 and workers[0].name.startswith("sgl.tiny-llama.p4.tp0of1.")
    names = {p.name for p in workers[0].rglob("*") if p.is_file() and len(p.name) == 64}
    assert names == set(h.hashes(tokens(6)))


def test_zero_copy_and_legacy_interfaces_round_trip(tmp_path, controllers):
    for v1 in (True, False):
        ctrl = controllers(tmp_path / f"kv{v1}", v1=v1)
        assert ctrl.page_set_func.__name__ == ("_page_set_zero_copy" if v1 else "_generic_page_set")
        pages = h.backup(ctrl, tokens(5))
        assert h.prefetch(ctrl, tokens(5)) == pages
        # A longer request: its first 5 pages hit, the rest miss.
        assert h.prefetch(ctrl, tokens(8)) == pages
        b = ctrl.storage_backend
        assert b.batch_exists(h.hashes(tokens(8))) == 5
        assert b.exists(h.hashes(tokens(5))[4]) and not b.exists(h.hashes(tokens(8))[5])
        stats = b.get_stats()
        assert sum(stats.backup_pgs) == (5 if v1 else 0) and stats.tierkv["failures"] == {}
        b.clear()
        assert b.batch_exists(h.hashes(tokens(5))) == 0 and h.prefetch(ctrl, tokens(5)) == []
        assert threads_alive(ctrl)


def test_pages_go_by_address_in_the_pool_and_by_ctypes_where_it_cannot_hold_them(tmp_path, controllers):
    """The zero-copy calls name each page's regions by address inside the host pool's
    `kv_buffer` (no Python object per region). A pool whose regions that memory does not
    hold (here a stand-in memory holding none of them) goes through ctypes buffers from the
    first refusal on: the same pages, no failure."""
    ctrl = controllers(tmp_path / "kv")
    b = ctrl.storage_backend
    pages = h.backup(ctrl, tokens(3))
    assert b._memory[id(b.mem_pool_host)] is not None
    b._memory[id(b.mem_pool_host)] = [torch.zeros(4096, dtype=torch.uint8).numpy()]
    assert h.prefetch(ctrl, tokens(3)) == pages
    assert b._memory[id(b.mem_pool_host)] is None
    other = h.backup(ctrl, tokens(2, base=5000), seed=2)
    assert h.prefetch(ctrl, tokens(2, base=5000)) == other
    assert b.get_stats().tierkv["failures"] == {}


DISK_CALLS = (
    "batch_get_v1", "batch_set_v1", "batch_exists", "batch_get", "batch_set", "get", "set",
    "exists",
)


def test_the_schedulers_thread_never_reaches_the_disk(tmp_path, controllers):
    """SGLang's scheduler (this thread, driving the controller as the radix cache does) only
    queues backups and prefetches; every call that reaches the backend's disk (writes, hit
    queries, reads) runs on the controller's own storage threads: the backend's half of
    README's "the engine's thread never waits on the disk" for SGLang."""
    ctrl = controllers(tmp_path / "kv")
    b = ctrl.storage_backend
    calls: list = []
    for name in DISK_CALLS:
        def recorded(*a, _name=name, _f=getattr(b, name), **kw):
            calls.append((_name, threading.get_ident()))
            return _f(*a, **kw)

        setattr(b, name, recorded)
    pages = h.backup(ctrl, tokens(5))
    assert h.prefetch(ctrl, tokens(8)) == pages
    assert {"batch_set_v1", "batch_exists", "batch_get_v1"} <= {n for n, _ in calls}, calls
    assert threading.get_ident() not in {t for _, t in calls}


def test_two_tp_ranks_keep_their_own_pages(tmp_path):
    """The same keys on two TP ranks (each holding half the heads) are two blocks, in two
    workers under one root."""
    keys = h.hashes(tokens(3))
    ranks = []
    for r in range(2):
        _, host = h.host_pool()
        b = h.backend(h.storage_config(str(tmp_path), tp_rank=r, tp_size=2), host)
        idx = host.alloc(len(keys) * h.PAGE)
        ranks.append((b, host, idx, h.fill(host, idx, seed=10 + r)))
        assert b.batch_set_v1(keys, idx) == [True] * 3
    assert ranks[0][0].worker != ranks[1][0].worker
    for b, host, idx, pages in ranks:
        host.kv_buffer.zero_()
        assert b.batch_get_v1(keys, idx) == [True] * 3
        assert h.page_bytes(host, idx) == pages
        b.close()
    assert ranks[0][3] != ranks[1][3]


def test_an_mla_model_has_one_worker_written_by_rank_0_read_by_all(tmp_path):
    keys = h.hashes(tokens(4))
    _, host0 = h.host_pool(mla=True, dtype=torch.bfloat16)
    _, host1 = h.host_pool(mla=True, dtype=torch.bfloat16)
    b0 = h.backend(h.storage_config(str(tmp_path), 0, 2, mla=True), host0)
    b1 = h.backend(h.storage_config(str(tmp_path), 1, 2, mla=True), host1)
    assert b0.worker == b1.worker and b0.worker.startswith("sgl.tiny-llama.p4.mla.")
    idx0 = host0.alloc(16)
    ptrs, _ = host0.get_page_buffer_meta(idx0)
    assert len(ptrs) == 4  # one region per MLA page
    pages = h.fill(host0, idx0, seed=3)
    h.fill(host1, host1.alloc(16), seed=4)  # rank 1's own pages are never written
    assert b1.batch_set_v1(keys, idx0) == [True] * 4 and b1.batch_exists(keys) == 0
    assert b0.batch_set_v1(keys, idx0) == [True] * 4
    assert b1.batch_exists(keys) == 4
    idx1 = host1.alloc(16)
    host1.kv_buffer.zero_()
    assert b1.batch_get_v1(keys, idx1) == [True] * 4
    assert h.page_bytes(host1, idx1) == pages
    b0.close()
    b1.close()


def test_models_layouts_and_dtypes_never_share_a_worker():
    def wid(model="m", layout="page_first", dtype=torch.float16, mla=False, **cfg):
        _, host = h.host_pool(mla=mla, layout=layout, dtype=dtype)
        return worker_id(h.storage_config("/x", mla=mla, model=model, **cfg), host)

    base = wid()
    others = [
        wid(model="other"),
        wid(layout="layer_first"),
        wid(dtype=torch.bfloat16),
        wid(tp_rank=1, tp_size=2),
        wid(mla=True),
    ]
    assert len({base, *others}) == 6
    long = wid(model="org/" + "a very long model name!" * 5)
    assert len(long) <= 64 and all(c.isalnum() or c in "_.-" for c in long)


def test_a_full_disk_fails_the_backup_without_an_exception(tiny_tmpfs, controllers):
    ctrl = controllers(tiny_tmpfs / "kv")
    h.backup(ctrl, tokens(2))
    # Fill the filesystem: nothing left to evict that would make room.
    fill_filesystem(tiny_tmpfs / "filler")
    with pytest.raises(AssertionError):
        h.backup(ctrl, tokens(6, base=5000))  # its completed_tokens fall short
    b = ctrl.storage_backend
    assert b.tierkv_stats()["failures"].get("batch_set_v1", 0) >= 1
    assert threads_alive(ctrl)
    # ENOSPC evicts older blocks and retries once: a leading run may have been stored.
    assert b.batch_exists(h.hashes(tokens(6, base=5000))) < 6
    assert len(h.prefetch(ctrl, tokens(6, base=5000))) < 6 and threads_alive(ctrl)


def test_a_corrupt_block_is_a_miss(tmp_path, controllers):
    root = tmp_path / "kv"
    ctrl = controllers(root)
    pages = h.backup(ctrl, tokens(4))
    path = ctrl.storage_backend.store.path_of(h.hashes(tokens(4))[2])
    h.stop(ctrl)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    ctrl2 = controllers(root)  # a fresh store verifies each file on its first read
    assert h.prefetch(ctrl2, tokens(4)) == pages[:2]
    assert threads_alive(ctrl2)


def test_a_missing_root_is_a_miss_never_an_exception(tmp_path, controllers):
    # A root that cannot be made (under a regular file): the attach succeeds, all misses.
    (tmp_path / "file").write_bytes(b"")
    ctrl = controllers(tmp_path / "file" / "kv")
    b = ctrl.storage_backend
    assert b.store is None and b.tierkv_stats()["failures"] == {"open": 1}
    with pytest.raises(AssertionError):
        h.backup(ctrl, tokens(2))
    assert h.prefetch(ctrl, tokens(2)) == []
    assert b.batch_get(h.hashes(tokens(2))) == [None, None]
    assert threads_alive(ctrl)
    # A root removed under a running store: writes fail or miss, reads miss.
    root = tmp_path / "gone"
    ctrl2 = controllers(root)
    h.backup(ctrl2, tokens(2))
    # Moved away at once (the store's threads may be writing its counters file: an rmtree
    # can race them), then removed.
    root.rename(tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved", ignore_errors=True)
    assert h.prefetch(ctrl2, tokens(2)) == []
    try:
        h.backup(ctrl2, tokens(3, base=7000))
    except AssertionError:
        pass
    assert threads_alive(ctrl2)


def test_a_backup_hangs_from_the_sequences_earlier_pages(tmp_path):
    """batch_set_v1 offers its pages under the page before them (SGLang's prefix_keys): the
    chain is recorded across calls, and pages whose earlier page is no longer stored are not
    stored (no lookup from the sequence start could reach them) and are reported False."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

    keys = h.hashes(tokens(6))
    _, host = h.host_pool()
    b = h.backend(h.storage_config(str(tmp_path)), host)
    idx = host.alloc(len(keys) * h.PAGE)
    h.fill(host, idx, seed=3)
    first, rest = keys[:3], keys[3:]
    half = idx[: 3 * h.PAGE], idx[3 * h.PAGE :]
    assert b.batch_set_v1(first, half[0]) == [True] * 3
    after = HiCacheStorageExtraInfo(prefix_keys=first)
    assert b.batch_set_v1(rest, half[1], after) == [True] * 3
    assert b.batch_exists(keys) == 6
    # The chain crosses the two calls: removing page 2 removes pages 3-5 with it.
    assert b.store.remove_many([keys[2]]) == [True]
    assert b.store.contains_many(keys) == [True, True, False, False, False, False]
    # Page 2 gone: the later pages are not stored again, and say so.
    assert b.batch_set_v1(rest, half[1], after) == [False] * 3
    assert b.store.contains_many(rest) == [False] * 3
    assert b.tierkv_stats()["failures"] == {}
    b.close()


def test_readmes_line_turns_the_tier_on_through_sglangs_own_parser(tmp_path):
    """README's SGLang line, as pasted (with --file-storage-path beside
    it, which SGLang injects into the extra config), parsed by SGLang's own
    `prepare_server_args`: HiCache on, our backend named, prefix keys passed; the backend
    built by SGLang's factory from what was parsed stores and restores a page."""
    import shlex

    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.server_args import prepare_server_args

    readme = Path(__file__).resolve().parents[2] / "README.md"
    [line] = [x for x in readme.read_text().splitlines() if "--hicache-storage-backend dynamic" in x]
    sys.path.insert(0, str(Path(__file__).parent))
    import vllm_harness

    model = tmp_path / "model"
    vllm_harness.make_model(model, 2, 128, 2, 1)
    args = prepare_server_args(
        ["--model-path", str(model), *shlex.split(line), "--file-storage-path", str(tmp_path / "f")]
    )
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    extra, _, _, _, pass_prefix_keys = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config
    )
    assert pass_prefix_keys is True
    # As SGLang's radix cache does with --file-storage-path; the README's root, moved here.
    extra = dict(extra, file_storage_path=args.file_storage_path)
    assert extra["root"] == "/mnt/nvme/kvcache" and extra["capacity_bytes"] > 0
    extra["root"] = str(tmp_path / "kv")
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="tiny-llama", extra_config=extra,
    )
    _, host = h.host_pool()
    b = h.backend(config, host)
    assert type(b).__name__ == "TierkvHiCacheStorage" and b.store is not None
    assert str(b.store.dir).startswith(str(tmp_path / "kv"))
    keys = h.hashes(tokens(4))
    idx = host.alloc(16)
    pages = h.fill(host, idx, seed=9)
    assert b.batch_set_v1(keys, idx) == [True] * 4
    out = host.alloc(16)
    assert b.batch_get_v1(keys, out) == [True] * 4 and h.page_bytes(host, out) == pages
    b.close()
    # --file-storage-path alone is the root.
    del extra["root"]
    config.extra_config = extra
    b = h.backend(config, host)
    assert str(b.store.dir).startswith(str(tmp_path / "f"))
    b.close()


def test_the_backends_metrics_stay_bounded_without_get_stats(tmp_path):
    """SGLang calls get_stats only with its storage metrics on; the
    samples of every get and set must not pile up meanwhile."""
    import tierkv_g3.sglang as sg

    _, host = h.host_pool()
    b = h.backend(h.storage_config(str(tmp_path)), host)
    keys = h.hashes(tokens(1))
    idx = host.alloc(4)
    h.fill(host, idx, seed=1)
    assert b.batch_set_v1(keys, idx) == [True]
    for _ in range(sg._METRIC_SAMPLES + 500):
        assert b.batch_get_v1(keys, idx) == [True]
    stats = b.get_stats()
    # The latest samples, one page each; the backup's one sample is kept.
    assert stats.prefetch_pgs == [1] * sg._METRIC_SAMPLES and stats.backup_pgs == [1]
    assert b.get_stats().prefetch_pgs == []
    b.close()


@pytest.mark.parametrize("first_v1", [False, True])
def test_switching_the_interface_never_serves_scrambled_pages(tmp_path, controllers, first_v1):
    """A layer_first host pool backs up pages through one interface
    (legacy: K of every layer, then V; v1: K0, V0, K1, V1, ...) and the server restarts with
    the other on the same root: every page restored is byte-exact, never scrambled (here: the
    other interface's pages are another worker's, so a miss)."""
    toks = tokens(6)
    a = controllers(tmp_path / "kv", v1=first_v1, layout="layer_first")
    pages = h.backup(a, toks)
    assert h.prefetch(a, toks) == pages  # the same interface reads them back
    worker_a = a.storage_backend.worker
    h.stop(a)  # the server restarts
    b = controllers(tmp_path / "kv", v1=not first_v1, layout="layer_first")
    got = h.prefetch(b, toks)
    assert got == pages[: len(got)], "a page restored with another byte order"
    assert b.storage_backend.store is not None and b.storage_backend.worker != worker_a


def test_two_checkpoints_under_one_served_name_never_share_pages(tmp_path, controllers):
    """Two checkpoints served under one `--served-model-name` (a
    fine-tune: the same architecture, files and sizes, other weights) shared a worker id, and
    the second restored the first's KV. Each server's backend is built inside the model
    config SGLang publishes in its scheduler (`create_context`, as `publish` does): the
    fine-tune restores nothing of the base's; the same weights at another path restore all."""
    import shutil

    from safetensors.torch import load_file, save_file
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import prepare_server_args

    sys.path.insert(0, str(Path(__file__).parent))
    import vllm_harness

    base = tmp_path / "base"
    vllm_harness.make_model(base, 2, 128, 2, 1)
    moved, tuned = tmp_path / "elsewhere" / "base", tmp_path / "tuned"
    shutil.copytree(base, moved)
    shutil.copytree(base, tuned)
    w = load_file(tuned / "model.safetensors")
    save_file({k: v + 0.01 for k, v in w.items()}, tuned / "model.safetensors", metadata={"format": "pt"})

    def server(model):
        args = prepare_server_args(
            ["--model-path", str(model), "--served-model-name", "svc", "--device", "cpu"]
        )
        with use_context(create_context(args, role="scheduler")):
            return controllers(tmp_path / "kv", model="svc")

    toks = tokens(6)
    a = server(base)
    pages = h.backup(a, toks)
    h.stop(a)
    tuned_server = server(tuned)
    assert h.prefetch(tuned_server, toks) == [], "a fine-tune restored the base's pages"
    assert tuned_server.storage_backend.worker != a.storage_backend.worker
    h.stop(tuned_server)
    assert h.prefetch(server(moved), toks) == pages


def test_two_servers_of_one_model_share_a_root_by_default(tmp_path, controllers):
    """A second server (a replica) of one model on one root had no
    disk tier (its store's open failed: the worker was the first's). With the documented
    config both work: what one backs up, the other restores."""
    toks = tokens(5)
    a = controllers(tmp_path / "kv")
    b = controllers(tmp_path / "kv")
    assert a.storage_backend.store is not None and b.storage_backend.store is not None
    pages = h.backup(a, toks)
    assert h.prefetch(b, toks) == pages
    more = tokens(3, base=5000)
    pages_b = h.backup(b, more)
    assert h.prefetch(a, more) == pages_b


def test_a_router_subscribed_to_the_kv_events_ends_with_the_pages_on_disk(tmp_path, controllers):
    """SGLang's storage backends have no event hook: the backend's `kv_events` publisher tells
    a router, in SGLang's own schema (decoded here with SGLang's classes) and under SGLang's
    own event hashes of the pages, every page stored on and removed from disk: by this
    server, by a replica on the same root, by capacity eviction, and found gone by a read.
    A router that drops batches replays them."""
    from sglang.srt.disaggregation.kv_events import KVEventBatch
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    from kv_events_subscriber import Subscriber
    from tierkv_g3 import _tierkv

    root, sock = tmp_path / "kv", tmp_path / "ev"
    events = {"endpoint": f"ipc://{sock}.pub", "replay_endpoint": f"ipc://{sock}.replay"}
    router = Subscriber(events["endpoint"], events["replay_endpoint"], batch=KVEventBatch)
    lossy = Subscriber(events["endpoint"], events["replay_endpoint"], batch=KVEventBatch, drop={1, 2})
    try:
        a = controllers(root, kv_events=events, capacity_files=12)
        b = controllers(root, capacity_files=12)  # a replica on the root, no publisher of its own
        worker = a.storage_backend.worker
        # Apart in time, so that they go out in batches of their own.
        h.backup(a, tokens(6))
        time.sleep(0.3)
        h.backup(b, tokens(8, base=5000))  # evicts pages of a's
        time.sleep(0.3)
        h.backup(a, tokens(4, base=9000), seed=2)
        time.sleep(0.3)
        gone = h.hashes(tokens(4, base=9000))[1]
        os.unlink(a.storage_backend.store.path_of(gone))
        assert len(h.prefetch(a, tokens(4, base=9000))) == 1  # found gone: the chain stops
        time.sleep(0.3)
        h.backup(b, tokens(1, base=12000), seed=3)  # a last batch: a router finds gaps at it
        tree = {hash_str_to_int64(k.hex()) for k in _tierkv.tree_blocks(str(root), worker)}
        assert hash_str_to_int64(gone) not in tree and len(tree) > 4

        def converged():
            return router.storage("DISK") == tree and lossy.storage("DISK") == tree

        deadline = time.monotonic() + 30
        while not converged() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert router.storage("DISK") == tree, (len(router.storage("DISK")), len(tree))
        assert lossy.storage("DISK") == tree and lossy.gaps >= 1 and lossy.replayed >= 2
        assert router.removed > 0
        assert {(e.medium, e.block_size) for e in router.stored_all} == {("DISK", h.PAGE)}
    finally:
        router.close()
        lossy.close()


def test_an_unknown_kv_events_key_fails_the_backends_start(tmp_path):
    with pytest.raises(ValueError, match="endpont"):
        h.backend(h.storage_config(str(tmp_path), kv_events={"endpont": "tcp://*:5560"}), None)
