"""tierkv as an L2 tier of LMCache's multiprocess mode (``lmcache server``).

LMCache's ``native_plugin`` L2 adapter imports ``module_path``, builds ``class_name`` with
``adapter_params`` as keyword arguments, and wraps the object in its
``NativeConnectorL2Adapter``::

    lmcache server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "tierkv_g3.lmcache_mp", "class_name": "LMCacheConnector",
        "adapter_params": {"root": "/mnt/nvme/kvcache", "worker": "lmcache",
                           "threads": 4, "capacity_bytes": 1099511627776}}'

(:func:`l2_adapter_json` writes that line.) ``adapter_params``: ``root`` (required),
``worker`` (the directory under ``<root>/v1/``; default ``"lmcache"``), ``threads`` (the
queue's I/O threads; default 4) and any keyword argument of :class:`tierkv_g3.Store`
(``capacity_bytes``, ``policy``, ``verify``, ``direct_io``, ``stats_interval``, ...).

The object is :class:`tierkv_g3.LMCacheConnector` (native): submissions return at once,
batches run on the store's own threads with the GIL free, LMCache's buffers are read and
filled in place, and every failure is a ``(id, False, message, None)`` completion, never an
exception. LMCache's keys (``model@rank@group@chunk_hash[@salt]``) are folded with blake3
into block hashes, so two models, ranks or salts never share a block. docs/engines-lmcache.md, MP mode
has the details.
"""

from __future__ import annotations

import json
from typing import Any

from ._tierkv import LMCacheConnector

__all__ = ["LMCacheConnector", "l2_adapter_json"]


def l2_adapter_json(root: str, **adapter_params: Any) -> str:
    """The ``--l2-adapter`` JSON of ``lmcache server`` for a tierkv store under ``root``;
    ``adapter_params`` are :class:`LMCacheConnector`'s keyword arguments (``worker``,
    ``threads``, and the store's options). LMCache's own keys of the adapter spec
    (``max_capacity_gb``, ``eviction``, ...) can be added to the parsed dict."""
    params = {"root": str(root), **adapter_params}
    return json.dumps({
        "type": "native_plugin",
        "module_path": __name__,
        "class_name": "LMCacheConnector",
        "adapter_params": params,
    })
