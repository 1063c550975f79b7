"""The worker's event journal through the Python package (docs/events.md): every block stored and
removed, with its cause, in order; a store opened without `events` on a worker that has a
journal still writes to it; a reader behind asks again from `next`."""

from __future__ import annotations

import tierkv_g3


def _keys(n):
    return [bytes([i]) * 32 for i in range(1, n + 1)]


def test_events_tell_what_was_stored_and_removed_in_order(tmp_path):
    keys = _keys(3)
    with tierkv_g3.Store(tmp_path, "w", events=True, stats_interval=None) as s:
        s.put_many(keys, [b"x" * 4096] * 3)
        assert s.discard_many(keys[1:2]) == [True]
        events, nxt, missed, jid = s.events_since(0)
        assert (nxt, missed) == (4, 0) and jid != 0
        assert [(e[0], e[1], e[2], e[3]) for e in events] == [
            (0, "stored", "put", keys[0]),
            (1, "stored", "put", keys[1]),
            (2, "stored", "put", keys[2]),
            (3, "removed", "removed", keys[1]),
        ]
        assert all(e[5] > 0 and e[6] > 0 for e in events)
        assert s.events_since(4) == ([], 4, 0, jid)
        assert [e[0] for e in s.events_since(1, 2)[0]] == [1, 2]
    # Opened without events: the worker has a journal, so the store writes to it.
    with tierkv_g3.Store(tmp_path, "w", stats_interval=None) as s:
        assert s.clear() == 2
        events, nxt, _, same = s.events_since(4)
        assert same == jid and nxt == 6
        assert sorted(e[3] for e in events) == [keys[0], keys[2]]
        assert {e[2] for e in events} == {"removed"}


def test_without_events_there_is_no_journal(tmp_path):
    with tierkv_g3.Store(tmp_path, "w", stats_interval=None) as s:
        s.put_many(_keys(2), [b"y" * 100] * 2)
        assert s.events_since(0) == ([], 0, 0, 0)
    assert not (tmp_path / "v1" / "w" / "EVENTS").exists()


def test_an_event_tail_takes_what_another_store_appends_in_order(tmp_path):
    """`EventTail` (the vLLM backends' follower of the journal, a Rust thread): only what is
    appended after it started, in order, nothing missed; close() stops it, take() after it
    is empty."""
    import time

    keys = _keys(4)
    opts = dict(events=True, sharing="shared", stats_interval=None)
    with tierkv_g3.Store(tmp_path, "w", **opts) as writer, tierkv_g3.Store(tmp_path, "w", **opts) as reader:
        writer.put_many(keys[:1], [b"x" * 4096])
        tail = tierkv_g3.EventTail(reader, interval=0.01)
        writer.put_many(keys[1:], [b"y" * 4096] * 3)
        assert writer.discard_many(keys[2:3]) == [True]
        got, missed, deadline = [], False, time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            events, m = tail.take()
            got += events
            missed |= m
            time.sleep(0.005)
        assert got == [("stored", k) for k in keys[1:]] + [("removed", keys[2])]
        assert not missed
        tail.close()
        tail.close()
        assert tail.take() == ([], False)
