"""The stall the engine-API tests put a store's writer in: the usage ledger's lock of a shared
worker held by another open file, as a writer hung on the tree would hold it. Every put waits
in its reservation meanwhile (for at most the store's ledger wait, 10 s); reads go on."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def held(worker_dir: str) -> Iterator[str]:
    """Holds the ledger lock of the worker directory `worker_dir` (a store's `dir`) while
    inside; yields the ledger's path."""
    path = os.path.join(worker_dir, "USAGE")
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
