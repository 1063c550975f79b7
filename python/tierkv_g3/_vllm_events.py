"""KV events of the tierkv vLLM connector (docs/events.md, docs/engines-vllm.md): vLLM's
`BlockStored` and `BlockRemoved` of medium STORAGE for the blocks the connector saved, keyed
by vLLM's own block hashes, as the worker's event journal tells them (stored once a worker's
store published the block; removed by any store of the worker, in any process or node).

The scheduler side knows each saved block's vLLM hash, parent, tokens and group when it plans
the save (`note_save`); the journal, followed on a thread of its own, says when it was
published and when it went (`take`, each step, on vLLM's scheduler thread, without I/O;
the journal is read by `EventTail`'s Rust thread)."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from vllm.distributed.kv_events import MEDIUM_STORAGE, BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from . import EventTail, kv_events
from ._engines import ToldBlocks

logger = logging.getLogger(__name__)


class StorageEvents:
    """What the connector tells vLLM's KV event stream of the blocks it saved."""

    def __init__(self, block_size: int, hash_block_size: int) -> None:
        self.block_size = block_size
        # vLLM hashes every `hash_block_size` tokens; a block is the last of its hashes.
        self.scale = max(block_size // max(hash_block_size, 1), 1)
        # Our key -> (vLLM hash, parent's, tokens, group, lora id, lora name).
        self._blocks = ToldBlocks()
        self._tail: Optional[EventTail] = None
        self.where: Optional[str] = None  # LOCAL or REMOTE, from the store's filesystem

    def follow(self, store: Any) -> None:
        """Starts following `store`'s journal from where it ends now (a journal made later is
        read from its start)."""
        if self._tail is None and store is not None:
            self.where = kv_events.locality(store.dir)
            self._tail = EventTail(store)

    def _hash(self, request: Any, block: int) -> Any:
        j = (block + 1) * self.scale - 1
        hashes = request.block_hashes
        return maybe_convert_block_hash(hashes[j]) if 0 <= j < len(hashes) else None

    def note_save(self, request: Any, group: int, keys: List[str], lo: int) -> None:
        """A save of `request`'s blocks `lo`.. (our hex `keys`) in KV cache group `group`."""
        tokens = request.all_token_ids
        lora = getattr(request, "lora_request", None)
        lora_id = getattr(lora, "lora_int_id", None)
        lora_name = getattr(lora, "lora_name", None)
        bs = self.block_size
        for i, key in enumerate(keys, start=lo):
            h = self._hash(request, i)
            if h is None:
                continue
            parent = self._hash(request, i - 1) if i > 0 else None
            block = (h, parent, list(tokens[i * bs : (i + 1) * bs]), group, lora_id, lora_name)
            self._blocks.name(bytes.fromhex(key), block)

    def take(self) -> List[KVCacheEvent]:
        """The events since the last call, in the journal's order."""
        if self._tail is None:
            return []
        events, missed = self._tail.take()
        out: List[KVCacheEvent] = []
        for removed, (h, parent, tokens, group, lora_id, lora_name) in self._blocks.changes(events):
            if removed:
                out.append(
                    BlockRemoved(
                        block_hashes=[h], medium=MEDIUM_STORAGE, group_idx=group,
                        locality=self.where, ownership=kv_events.OWNERSHIP,
                    )
                )
            else:
                out.append(
                    BlockStored(
                        block_hashes=[h], parent_block_hash=parent, token_ids=tokens,
                        block_size=self.block_size, lora_id=lora_id, medium=MEDIUM_STORAGE,
                        lora_name=lora_name, group_idx=group, locality=self.where,
                        ownership=kv_events.OWNERSHIP,
                    )
                )
        if missed:
            logger.warning(
                "tierkv vLLM connector: the event journal went round between two reads: "
                "some KV events were missed (a router resyncs from a listing of the tree)"
            )
        return out

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
