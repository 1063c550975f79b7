"""The standalone KV event publisher across two nodes of a GlusterFS volume (tools/dfs.sh; run
by tools/test.sh with TIERKV_DFS_N1/N2/SH and TIERKV_BENCH_BIN set): a router subscribed to
the publisher beside node 1 is told, as BlockRemoved, every block node 2 evicts, within 3
seconds of the eviction's time in the journal; once both nodes are quiet its index is the
tree, and every event says REMOTE (a tree every node mounting the volume reads)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

from conftest import skip_or_fail
from tierkv_g3 import _tierkv

sys.path.insert(0, os.path.dirname(__file__))
from kv_events_subscriber import KVEventBatch  # noqa: E402

BOUND_MS = 3000


def _dfs():
    env = [os.environ.get(k) for k in ("TIERKV_DFS_N1", "TIERKV_DFS_N2", "TIERKV_DFS_SH", "TIERKV_BENCH_BIN")]
    if not all(env):
        if os.environ.get("TIERKV_REQUIRE_DFS"):
            raise AssertionError("TIERKV_REQUIRE_DFS is set, and TIERKV_DFS_N1/N2/SH or TIERKV_BENCH_BIN is not")
        skip_or_fail("no distributed filesystem (tools/test.sh sets TIERKV_DFS_* after tools/dfs.sh up)")
    return env


class Router(threading.Thread):
    """A SUB on the publisher: when each BlockRemoved/BlockStored was received, by hash."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, "")
        self.dec = msgspec.msgpack.Decoder(KVEventBatch)
        self.present, self.removed_at, self.localities = set(), {}, set()
        self.seqs = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if not self.sub.poll(50):
                continue
            _, seq, payload = self.sub.recv_multipart()
            now = time.time() * 1000
            self.seqs.append(int.from_bytes(seq, "big"))
            for e in self.dec.decode(payload).events:
                self.localities.add(e.locality)
                for h in e.block_hashes:
                    if type(e).__name__ == "BlockStored":
                        self.present.add(h)
                    else:
                        self.present.discard(h)
                        self.removed_at.setdefault(h, []).append(now)


def _writer(sh, bench, node, tree, offset, start):
    """tierkv-bench on `node`: 100 blocks of 16 KiB from key `offset` into worker 0 (holds 20)."""
    return subprocess.Popen(
        [sh, "exec", node, bench, "--dir", str(tree), "--sharing", "shared", "--progress", "never",
         "--layout-depth", "1", "--output-format", "json", "--rw", "write", "--bs", "16k",
         "--nblocks", "100", "--key-offset", offset, "--batch", "4", "--capacity-blocks", "20",
         "--events", "--no-layout", start],
        stdout=subprocess.PIPE,
    )


def test_node_1s_router_is_told_what_node_2_evicted_within_3_seconds(tmp_path):
    n1, n2, sh, bench = _dfs()
    name = f"kv-events.{os.getpid()}"
    tree1, tree2 = Path(n1) / name, Path(n2) / name
    shutil.rmtree(tree1, ignore_errors=True)
    tree1.mkdir()
    sock = tmp_path / "ev"
    pub = subprocess.Popen(
        [sys.executable, "-m", "tierkv_g3.kv_events", str(tree1), "--endpoint", f"ipc://{sock}.pub",
         "--interval", "0.05", "--rescan", "0.2"],
        stderr=subprocess.PIPE,
    )
    router = Router(f"ipc://{sock}.pub")
    router.start()
    try:
        time.sleep(1.0)
        start = f"--start-at-ms={int(time.time() * 1000) + 3000}"
        # Node 2's keys after node 1's: each evicts the other's blocks as well as its own.
        nodes = [_writer(sh, bench, "n1", tree1, "0", start), _writer(sh, bench, "n2", tree2, "100000", start)]
        for c in nodes:
            out, _ = c.communicate(timeout=300)
            assert c.returncode == 0 and json.loads(out)["errors"] == 0
        tree = set(_tierkv.tree_blocks(str(tree1), "0"))
        deadline = time.monotonic() + 20
        while router.present != tree and time.monotonic() < deadline:
            time.sleep(0.1)
        assert router.present == tree, (len(router.present), len(tree))
        assert router.seqs == list(range(len(router.seqs))), "no batch lost"
        assert router.localities == {"REMOTE"}
        # Each of node 2's removals, from its time in the journal to the router.
        events, _, missed, _ = _tierkv.journal_since(str(tree1), "0", 0, 1 << 20)
        assert missed == 0
        nodes_seen = {e[4] for e in events}
        assert len(nodes_seen) == 2
        node_2 = next(e[4] for e in events if e[4] != events[0][4])
        journal = [(e[3], e[6]) for e in events if e[1] == "removed" and e[4] == node_2]
        delays = []
        for h, at_ms in journal:
            told = [r for r in router.removed_at.get(h, []) if r >= at_ms - 5]
            assert told, f"node 2's removal of {h.hex()} was not told"
            delays.append(told[0] - at_ms)
        assert len(delays) > 10, len(delays)
        delays.sort()
        print(f"node 2's {len(delays)} removals reached node 1's router in at most "
              f"{delays[-1]:.0f} ms (median {delays[len(delays) // 2]:.0f} ms)")
        assert delays[-1] <= BOUND_MS, delays[-5:]
    finally:
        router.stop.set()
        router.join(timeout=5)
        pub.terminate()
        pub.communicate(timeout=20)
        shutil.rmtree(tree1, ignore_errors=True)
