"""KV events of a tierkv tree for cache-aware routers, in vLLM's event schema (SGLang's is the
same on the wire), published over ZMQ by a process of its own or from inside an engine's
backend (docs/events.md, "Publishing a tree's events").

Every block stored in and removed from the tree's workers, by any process or node, as the
workers' event journals tell it: ``BlockStored`` and ``BlockRemoved`` of one medium (``STORAGE``,
vLLM's name; ``DISK`` for SGLang), with ``locality`` ``LOCAL`` for a tree on this node's disk
and ``REMOTE`` for one on a network or cluster filesystem (the shared tree every node mounting
it reads), ``ownership`` ``tierkv``. It starts with the blocks the tree holds (read from the
tree), then follows the journals; where a journal went round faster than it was read, or was
made again, it lists the tree once more and tells the difference.

The wire is vLLM's ``ZmqEventPublisher``'s: a PUB socket sends ``[topic, seq (8 bytes, big
endian), msgpack batch]``, the batch ``[ts, [event, ...]]`` with each event a map tagged by
``"type"``; a ROUTER replay socket answers ``[b"", start seq]`` with every batch still buffered
from it on, then ``[b"", b"", seq -1, b""]``.

Run it beside any engine::

    python -m tierkv_g3.kv_events /mnt/nvme/kvcache --endpoint 'tcp://*:5557' \\
        --replay-endpoint 'tcp://*:5558' --hashes tierkv

Needs pyzmq and msgspec (``pip install 'tierkv_g3[events]'``; vLLM and SGLang have both).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set

from . import _tierkv

logger = logging.getLogger(__name__)

MEDIUM_STORAGE = "STORAGE"  # vLLM's name of a disk tier's medium
MEDIUM_DISK = "DISK"  # SGLang's
OWNERSHIP = "tierkv"

# How a block's key (our 32 bytes) is named to the router.
Namer = Callable[[bytes], Any]


def tierkv_hash(key: bytes) -> bytes:
    """The block's tierkv key, as it is (vLLM's schema takes a hash as bytes or an int)."""
    return key


def sglang_hash(key: bytes) -> int:
    """SGLang's event hash of a page whose key is its page hash (the tierkv SGLang backend
    stores pages under SGLang's page hashes): the first 64 bits as a signed integer, as
    SGLang's ``hash_str_to_int64`` reads the hex."""
    return int.from_bytes(key[:8], "big", signed=True)


HASHES: Dict[str, Namer] = {"tierkv": tierkv_hash, "sglang": sglang_hash}


def locality(root: Any) -> str:
    """``REMOTE`` if the tree at `root` is on a network or cluster filesystem (every node
    mounting it reads its blocks), else ``LOCAL`` (this node's disk). A root not made yet is
    where its nearest existing parent is."""
    path = os.path.abspath(str(root))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    _kind, network = _tierkv.filesystem(path)
    return "REMOTE" if network else "LOCAL"


def stored(hashes: Sequence[Any], medium: str, block_size: int, where: Optional[str]) -> dict:
    """vLLM's ``BlockStored`` of blocks whose tokens and parents the tree does not know."""
    event = {
        "type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
        "token_ids": [], "block_size": block_size, "lora_id": None, "medium": medium,
        "lora_name": None, "ownership": OWNERSHIP,
    }
    if where is not None:
        event["locality"] = where
    return event


def removed(hashes: Sequence[Any], medium: str, where: Optional[str]) -> dict:
    """vLLM's ``BlockRemoved``."""
    event = {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium,
             "ownership": OWNERSHIP}
    if where is not None:
        event["locality"] = where
    return event


def _binds(endpoint: str) -> bool:
    """vLLM's rule: an endpoint with a wildcard host or of ipc/inproc is bound, else
    connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqPublisher:
    """Publishes event batches as vLLM's ``ZmqEventPublisher`` does, from a thread of its
    own (the sockets are touched by that thread only): `publish` queues a batch and returns.
    Keeps the last `buffer_steps` batches for the replay socket."""

    def __init__(
        self, endpoint: str = "tcp://*:5557", replay_endpoint: Optional[str] = None,
        topic: str = "", buffer_steps: int = 10_000, hwm: int = 100_000,
    ) -> None:
        import msgspec
        import zmq

        self._encode = msgspec.msgpack.Encoder().encode
        self._topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        (self._pub.bind if _binds(endpoint) else self._pub.connect)(endpoint)
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._zmq = zmq
        self._buffer: deque = deque(maxlen=buffer_steps)
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="tierkv-kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: List[dict]) -> None:
        """Queues one batch (nothing if `events` is empty)."""
        if events:
            self._queue.put(self._encode([time.time(), events]))

    def _run(self) -> None:
        poller = self._zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, self._zmq.POLLIN)
        while True:
            try:
                payload = self._queue.get(timeout=0.01)
            except queue.Empty:
                payload = b""
            if payload is None:
                break
            if payload:
                seq = self._seq.to_bytes(8, "big")
                self._pub.send_multipart((self._topic, seq, payload))
                self._buffer.append((self._seq, payload))
                self._seq += 1
            if self._replay is not None and dict(poller.poll(0)):
                self._serve_replay()
        self._pub.close(linger=1000)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("tierkv kv events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        end = (-1).to_bytes(8, "big", signed=True)
        self._replay.send_multipart((client, b"", b"", end, b""))

    def close(self) -> None:
        """Sends what is queued, then closes the sockets."""
        self._queue.put(None)
        self._thread.join(timeout=10)


class _Worker:
    """Where one worker's journal was read to, and the blocks told stored (our key -> the
    name they were told by, which their removal is told by)."""

    def __init__(self) -> None:
        self.next = 0
        self.journal = 0
        self.told: Dict[bytes, Any] = {}


class TreeEvents:
    """Tells `publisher` every block stored in and removed from the workers of the tree at
    `root` (`workers`, or every worker, new ones found every `rescan` seconds), following
    their journals from a thread of its own every `interval` seconds. Blocks are named by
    `name` (a block it names None is not told). Memory: the keys told stored and their names,
    per worker."""

    def __init__(
        self, root: Any, publisher: Any, *, workers: Optional[Iterable[str]] = None,
        name: Namer = tierkv_hash, medium: str = MEDIUM_STORAGE, block_size: int = 0,
        where: Optional[str] = None, interval: float = 0.05, rescan: float = 5.0,
        batch: int = 1024,
    ) -> None:
        self.root = str(root)
        self.publisher = publisher
        self._only = None if workers is None else list(workers)
        self.name = name
        self.medium = medium
        self.block_size = block_size
        self.where = locality(self.root) if where is None else where
        self.interval = interval
        self.rescan = rescan
        self.batch = batch
        self.workers: Dict[str, _Worker] = {}
        self.resyncs = 0  # lists of the tree after a gap in a journal
        self._listed_at = 0.0
        self._logged_at = -60.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierkv-tree-events", daemon=True)
        self._thread.start()

    def _tell(self, events: List[dict]) -> None:
        for i in range(0, len(events), self.batch):
            self.publisher.publish(events[i : i + self.batch])

    def _stored(self, w: _Worker, key: bytes, out: List[dict]) -> None:
        """Tells `key` stored, if it has a name and is not told stored yet."""
        if key in w.told:
            return
        h = self.name(key)
        if h is not None:
            w.told[key] = h
            out.append(stored([h], self.medium, self.block_size, self.where))

    def _removed(self, w: _Worker, key: bytes, out: List[dict]) -> None:
        """Tells `key` removed, if it was told stored."""
        h = w.told.pop(key, None)
        if h is not None:
            out.append(removed([h], self.medium, self.where))

    def _sync(self, worker: str, w: _Worker) -> List[dict]:
        """Lists the worker's tree (after noting where its journal ends, so nothing between
        is lost) and tells what differs from what was told."""
        end = _tierkv.journal_end(self.root, worker)
        present = set(_tierkv.tree_blocks(self.root, worker))
        w.next, w.journal = end
        out: List[dict] = []
        for key in sorted(set(w.told) - present):
            self._removed(w, key, out)
        for key in sorted(present):
            self._stored(w, key, out)
        return out

    def _follow(self, worker: str, w: _Worker) -> List[dict]:
        """What the worker's journal says since the last read."""
        events, nxt, missed, jid = _tierkv.journal_since(self.root, worker, w.next, 4096)
        if missed or w.journal not in (0, jid):
            self.resyncs += 1
            logger.warning("tierkv kv events: worker %s: %d events missed; listing its tree",
                           worker, missed)
            return self._sync(worker, w)
        w.next, w.journal = nxt, jid
        out: List[dict] = []
        for _seq, kind, _cause, key, _node, _pid, _ms in events:
            if kind == "stored":
                self._stored(w, key, out)
            else:
                self._removed(w, key, out)
        return out

    def step(self) -> int:
        """One round: new workers listed, every worker's journal read; the events told. A
        worker that fails (its directory unreadable, its journal broken) is logged and tried
        again at the next round; what it read is left unread until then."""
        out: List[dict] = []
        now = time.monotonic()
        if now - self._listed_at >= self.rescan:
            self._listed_at = now
            names = self._only if self._only is not None else self._attempt("", _tierkv.workers, self.root)
            for worker in names or ():
                if worker not in self.workers:
                    w = _Worker()
                    told = self._attempt(worker, self._sync, worker, w)
                    if told is not None:
                        out += told
                        self.workers[worker] = w
            if self._only is None and names is not None:
                # A worker directory removed (with `rm -r`): its blocks are gone.
                for worker in set(self.workers) - set(names):
                    w = self.workers.pop(worker)
                    for key in sorted(w.told):
                        self._removed(w, key, out)
        for worker, w in self.workers.items():
            out += self._attempt(worker, self._follow, worker, w) or []
        self._tell(out)
        return len(out)

    def _attempt(self, worker: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, or None after logging its failure (at most once a minute)."""
        try:
            return call(*args)
        except Exception as e:  # noqa: BLE001: a tree not made yet, a worker unreadable
            now = time.monotonic()
            if now - self._logged_at >= 60.0:
                self._logged_at = now
                logger.warning("tierkv kv events: %s %s: %s", self.root, worker, e)
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.step():
                continue
            self._stop.wait(self.interval)

    def told(self) -> Set[Any]:
        """The names of the blocks told stored (for tests and checks; not thread safe)."""
        return {h for w in list(self.workers.values()) for h in list(w.told.values())}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def publish(root: Any, *, endpoint: str = "tcp://*:5557", replay_endpoint: Optional[str] = None,
            topic: str = "", hashes: str = "tierkv", **options: Any) -> TreeEvents:
    """Starts publishing the tree's events on `endpoint` (``TreeEvents``'s `options`);
    ``close()`` the result, then its ``publisher``."""
    publisher = ZmqPublisher(endpoint, replay_endpoint, topic)
    return TreeEvents(root, publisher, name=HASHES[hashes], **options)


# The keys of an engine backend's "kv_events" config.
CONFIG_KEYS = ("endpoint", "replay_endpoint", "topic", "buffer_steps", "hwm", "locality", "interval")


def offset_port(endpoint: Optional[str], offset: int) -> Optional[str]:
    """A tcp endpoint's port plus `offset` (as vLLM and SGLang give each data-parallel rank a
    port of its own); any other endpoint gets ``-<offset>`` appended."""
    if not endpoint or offset == 0:
        return endpoint
    head, sep, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and sep and port.isdigit():
        return f"{head}:{int(port) + offset}"
    return f"{endpoint}-{offset}"


def check_config(config: Any) -> None:
    """A ValueError naming what is wrong with a ``kv_events`` config."""
    if not isinstance(config, dict):
        raise ValueError(f'kv_events: an object, e.g. {{"endpoint": "tcp://*:5557"}}, not {config!r}')
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        raise ValueError(f"kv_events: unknown keys {sorted(unknown)} (known: {list(CONFIG_KEYS)})")
    if config.get("locality") not in (None, "LOCAL", "REMOTE"):
        raise ValueError(f"kv_events: locality is LOCAL or REMOTE, not {config['locality']!r}")


def from_config(config: Dict[str, Any], root: Any, worker: str, *, name: Namer, medium: str,
                block_size: int, rank: int = 0) -> TreeEvents:
    """A backend's publisher of `worker`'s events, from its ``kv_events`` config
    (`CONFIG_KEYS`; ports offset by `rank`). A key it does not know is a ValueError."""
    check_config(config)
    publisher = ZmqPublisher(
        offset_port(config.get("endpoint", "tcp://*:5557"), rank),
        offset_port(config.get("replay_endpoint"), rank), config.get("topic", ""),
        int(config.get("buffer_steps", 10_000)), int(config.get("hwm", 100_000)),
    )
    return TreeEvents(root, publisher, workers=[worker], name=name, medium=medium,
                      block_size=block_size, where=config.get("locality"),
                      interval=float(config.get("interval", 0.05)))


def close(events: Optional[TreeEvents]) -> None:
    """Stops `events` and closes its publisher (nothing if None)."""
    if events is not None:
        events.close()
        events.publisher.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tierkv_g3.kv_events", description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the cache root (the directory that holds v1/)")
    p.add_argument("--worker", action="append", help="only this worker (repeatable); default every worker")
    p.add_argument("--endpoint", default="tcp://*:5557", help="the PUB socket (bound if wildcard/ipc, else connected)")
    p.add_argument("--replay-endpoint", default=None, help="the ROUTER replay socket, bound")
    p.add_argument("--topic", default="")
    p.add_argument("--hashes", choices=sorted(HASHES), default="tierkv",
                   help="tierkv: the 32-byte keys; sglang: SGLang's event hash of the page hash")
    p.add_argument("--medium", default=MEDIUM_STORAGE)
    p.add_argument("--block-size", type=int, default=0, help="tokens per block, as told (0: unknown)")
    p.add_argument("--locality", choices=["LOCAL", "REMOTE"], default=None,
                   help="default: REMOTE on a network or cluster filesystem, else LOCAL")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between journal reads")
    p.add_argument("--rescan", type=float, default=5.0, help="seconds between looks for new workers")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    events = publish(a.root, endpoint=a.endpoint, replay_endpoint=a.replay_endpoint, topic=a.topic,
                     hashes=a.hashes, workers=a.worker, medium=a.medium,
                     block_size=a.block_size, where=a.locality, interval=a.interval,
                     rescan=a.rescan)
    logger.info("tierkv kv events: %s (%s) on %s", a.root, events.where, a.endpoint)
    while not done.wait(1.0):
        pass
    close(events)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
