#!/usr/bin/env python3
"""Python time per batch of 128 pages through the SGLang backend's zero-copy get (`batch_get_v1`):
the region path (pages named by address inside the host pool's memory) against the ctypes path
(a ctypes buffer per region), page_first and layer_first host pools of 32 layers, under
cProfile: the batch, the store's call, SGLang's `get_page_buffer_meta`, and the rest (ours).

usage: PYTHONPATH=python .venv-engines/bin/python tools/sglang-python-time.py"""

import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import sglang_harness as h  # noqa: E402

h.LAYERS = 32  # a real model's layer count: layer_first pools give one region per layer
h.DEVICE_TOKENS = 512  # a host pool of 1,024 tokens: 256 pages of 4
STORE_CALLS = (
    "<method 'get_many_into_regions' of 'tierkv_g3._tierkv.Store' objects>",
    "<method 'get_many_into_vectored' of 'tierkv_g3._tierkv.Store' objects>",
)

def run(layout: str, ctypes_path: bool, n: int = 128) -> None:
    kv, host = h.host_pool(layout=layout)
    root = tempfile.mkdtemp(dir="/var/tmp")
    b = h.backend(h.storage_config(root), host)
    idx = host.alloc(n * h.PAGE)
    keys = [f"{i:064x}" for i in range(n)]
    if ctypes_path:
        b._memory[id(host)] = None
    assert all(b.batch_set_v1(keys, idx))
    for _ in range(3):
        b.batch_get_v1(keys, idx)
    pr = cProfile.Profile()
    reps = 20
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(reps):
        assert all(b.batch_get_v1(keys, idx))
    pr.disable()
    total = (time.perf_counter() - t0) / reps
    st = pstats.Stats(pr)
    store_calls = sum(v[2] for k, v in st.stats.items() if k[2] in STORE_CALLS) / reps
    meta = sum(v[3] for k, v in st.stats.items() if k[2] == "get_page_buffer_meta") / reps
    regions = len(host.get_page_buffer_meta(idx)[0])
    print(f"{layout:12s} {'ctypes ' if ctypes_path else 'regions'}: {regions} regions, "
          f"batch {total * 1e3:.2f} ms, store call {store_calls * 1e3:.2f} ms, SGLang's "
          f"get_page_buffer_meta {meta * 1e3:.2f} ms, ours (the rest) "
          f"{(total - store_calls - meta) * 1e3:.3f} ms", flush=True)
    b.close()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    for layout in ("page_first", "layer_first"):
        for c in (True, False, True, False):  # interleaved
            run(layout, c)
