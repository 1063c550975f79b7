"""A router's view of vLLM's KV event stream, as a cache-aware router builds it (docs/events.md):
a pyzmq SUB on the engine's publisher that decodes vLLM's `KVEventBatch` (msgspec, tagged
events), detects a gap by the batch's sequence number and fills it from the engine's replay
socket (a DEALER: vLLM's ROUTER streams every buffered batch from the asked number on, then
an end marker), and keeps, per medium, the set of block hashes it was told are stored.
vLLM's `AllBlocksCleared` has no medium: it is scoped to the GPU cache it comes from."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Set, Union

import msgspec
import zmq

Hash = Union[int, bytes]


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: List[Hash]
    parent_block_hash: Optional[Hash]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[List[Any]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: List[Hash]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


class Subscriber:
    """Follows one engine's stream on a thread. `drop` (a set of sequence numbers) makes it
    ignore those batches as they arrive, as a subscriber that fell behind would: it then finds
    the gap at the next batch and replays it."""

    def __init__(
        self, endpoint: str, replay: str, topic: str = "", drop: Optional[Set[int]] = None,
        batch: Any = None,
    ):
        # `batch`: an engine's own batch class (SGLang's KVEventBatch), to decode with it.
        self._dec = msgspec.msgpack.Decoder(batch or KVEventBatch)
        ctx = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._sub.connect(endpoint)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._replay = ctx.socket(zmq.DEALER)
        self._replay.connect(replay)
        self._drop = set(drop or ())
        self.last = -1
        self.gaps = 0  # gaps found by sequence number
        self.replayed = 0  # batches recovered from the replay socket
        self.present: Dict[str, Set[Hash]] = {}  # medium -> hashes told stored, not removed
        self.stored: Dict[Hash, BlockStored] = {}  # every one-block STORAGE BlockStored, by hash
        self.stored_all: List[BlockStored] = []  # every BlockStored, in order
        self.removed = 0
        self.lock = threading.Lock()
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _apply(self, payload: bytes) -> None:
        with self.lock:
            for e in self._dec.decode(payload).events:
                kind = type(e).__name__
                if kind == "BlockStored":
                    self.stored_all.append(e)
                    for h in e.block_hashes:
                        self.present.setdefault(e.medium or "", set()).add(h)
                    if e.medium == "STORAGE" and len(e.block_hashes) == 1:
                        self.stored[e.block_hashes[0]] = e
                elif kind == "BlockRemoved":
                    self.removed += 1
                    for h in e.block_hashes:
                        self.present.setdefault(e.medium or "", set()).discard(h)
                else:
                    # vLLM's AllBlocksCleared (its prefix cache reset) carries no medium; it
                    # comes from the GPU block pool, and the tier's blocks stay on disk.
                    self.present.pop("GPU", None)
            self.received += 1

    def _fill(self, upto: int) -> None:
        """Replays the batches after `self.last` and before `upto`."""
        self._replay.send_multipart((b"", (self.last + 1).to_bytes(8, "big")))
        while self._replay.poll(5000):
            _, _, seq_b, payload = self._replay.recv_multipart()
            if not payload:
                break  # the end marker
            seq = int.from_bytes(seq_b, "big", signed=True)
            if self.last < seq < upto:
                self._apply(payload)
                self.replayed += 1
                self.last = seq

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sub.poll(100):
                continue
            _, seq_b, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_b, "big")
            if seq in self._drop:
                self._drop.discard(seq)
                continue
            if seq > self.last + 1:
                self.gaps += 1
                self._fill(seq)
            self._apply(payload)
            self.last = seq

    def storage(self, medium: str = "STORAGE") -> Set[Hash]:
        with self.lock:
            return set(self.present.get(medium, set()))

    def prefix(self, h: Hash) -> List[int]:
        """The tokens from the start of the chain to block `h`'s end, by its parents."""
        with self.lock:
            chain = []
            while h is not None:
                e = self.stored[h]
                chain.append(e.token_ids)
                h = e.parent_block_hash
        return [t for block in reversed(chain) for t in block]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sub.close(0)
        self._replay.close(0)
