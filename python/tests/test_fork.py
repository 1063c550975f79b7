"""Engines and their launchers fork. A store (or a Transfers over it)
closed or dropped in a forked child aborted the child ("panic in a destructor during
cleanup": joining a background thread that does not exist there) or raised
pyo3_runtime.PanicException, a BaseException that escapes every `except Exception`. Closing
in a child now leaves everything to the process that opened the store: its worker lock, its
ledger and stats file stay, and it goes on working."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tierkv_g3


def in_child(fn) -> int:
    """Runs `fn` in a forked child; its exit status (0: `fn` returned, 3: it raised anything,
    a BaseException included; a signal: its number, negated)."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            code = 0
        except BaseException as e:  # noqa: BLE001 - the test is that nothing escapes
            print(f"child raised {type(e).__name__}: {e}", flush=True)
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("sharing", ["exclusive", "shared"])
def test_a_store_closed_or_dropped_in_a_forked_child_leaves_the_parents_alone(tmp_path, sharing):
    keys = tierkv_g3.chain_hashes(list(range(64)), 16)
    store = tierkv_g3.Store(tmp_path, "w", sharing=sharing, capacity_files=100, stats_interval=0.05)
    store.put_many(keys[:2], [b"a" * 100, b"b" * 100])
    before = sorted(p.name for p in store.dir.iterdir())

    assert in_child(store.close) == 0
    assert in_child(lambda: store.__exit__(None, None, None)) == 0

    def drop():
        nonlocal store
        store = None
        import gc

        gc.collect()

    assert in_child(drop) == 0
    # The parent's store is whole: its lock still keeps another exclusive opener out, its
    # files (the stats file of a shared store included) are where they were, and it works.
    assert sorted(p.name for p in store.dir.iterdir()) == before
    with pytest.raises(tierkv_g3.WorkerBusyError):
        tierkv_g3.Store(tmp_path, "w")
    store.put_many(keys[2:4], [b"c" * 100, b"d" * 100])
    out = [bytearray(100) for _ in range(4)]
    assert store.get_many_into(keys[:4], out) == [100] * 4
    store.close()
    tierkv_g3.Store(tmp_path, "w").close()


def test_transfers_closed_in_a_forked_child_never_hang_or_abort(tmp_path):
    keys = tierkv_g3.chain_hashes(list(range(64)), 16)
    mem = np.zeros(4 * 64, np.uint8)
    store = tierkv_g3.Store(tmp_path, "w")
    t = tierkv_g3.Transfers(store, mem, [(0, 64, 64)], 4)
    t.submit_save(keys[:2], [0, 1])
    assert in_child(t.close) == 0
    assert in_child(store.close) == 0
    got = []
    for _ in range(100):
        got += t.wait(1.0)
        if got:
            break
    assert [g[2] for g in got] == [["written", "written"]]
    t.close()
    store.close()
