"""Fixtures of the Python package's tests (run by tools/test.sh, so by CI)."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import tierkv_g3

REPO = Path(__file__).resolve().parents[2]


def interop_len(i: int) -> int:
    """Bytes of block i of examples/interop.rs."""
    return 1000 + i * 4097


def interop_payload(i: int) -> np.ndarray:
    """Block i of examples/interop.rs: byte j is (i * 131 + j * 7) % 256."""
    j = np.arange(interop_len(i), dtype=np.int64)
    return ((i * 131 + j * 7) % 256).astype(np.uint8)


def skip_or_fail(reason: str) -> None:
    """Skips the running test, recorded in target/test-skips.txt (tools/test.sh prints the
    list: no skip goes unseen); fails instead where CI requires privileged tests."""
    if os.environ.get("TIERKV_REQUIRE_PRIVILEGED_TESTS"):
        pytest.fail(f"required by TIERKV_REQUIRE_PRIVILEGED_TESTS: {reason}")
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    line = f"SKIPPED {test} (pytest): {reason}"
    (REPO / "target").mkdir(exist_ok=True)
    with open(REPO / "target" / "test-skips.txt", "a") as f:
        f.write(line + "\n")
    pytest.skip(reason)


def require_engine(module: str, venv: str, test: str) -> None:
    """Imports the engine `module` a test file runs against. Where it is missing the file is
    skipped, the skip recorded in target/test-skips.txt, except where CI requires the engine
    suites (TIERKV_REQUIRE_ENGINES, set by tools/test.sh in CI): there it fails."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        reason = (f"{module} is not importable here ({e}): run `tools/engines-venv.sh "
                  f"{venv}` and use its virtualenv's python -m pytest python/tests/{test}")
        if os.environ.get("TIERKV_REQUIRE_ENGINES"):
            pytest.fail(f"required by TIERKV_REQUIRE_ENGINES: {reason}", pytrace=False)
        (REPO / "target").mkdir(exist_ok=True)
        with open(REPO / "target" / "test-skips.txt", "a") as f:
            f.write(f"SKIPPED python/tests/{test} (pytest): {reason}\n")
        pytest.skip(reason, allow_module_level=True)


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[str]:
    """A tmpfs of `size` (mount's `size=`, e.g. "1m") mounted on a fresh directory for a full
    disk, unmounted and removed after; skipped (failed where CI requires privileged tests)
    when it cannot be mounted (not root)."""
    mnt = tempfile.mkdtemp(prefix="tierkv-tmpfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tierkv-test", mnt],
                       capture_output=True)
    if r.returncode != 0:
        os.rmdir(mnt)
        skip_or_fail(f"cannot mount a {size} tmpfs (needs root) for a full disk")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def fill_filesystem(path: Path) -> None:
    """Writes zeros into a new file at `path` until its filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def tiny_tmpfs() -> Iterator[Path]:
    """A 256 KiB tmpfs (see `tmpfs`)."""
    with tmpfs("256k") as mnt:
        yield Path(mnt)


@pytest.fixture
def open_store(tmp_path):
    """Opens stores under one root (no STATS.json writer), closed at the end of the test."""
    opened = []

    def open_(worker="rank0", root=None, **kw):
        kw.setdefault("stats_interval", None)
        s = tierkv_g3.Store(root or tmp_path, worker, **kw)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store):
    return open_store()


@pytest.fixture(scope="session")
def interop() -> Path:
    """The examples/interop.rs binary, built here if tools/test.sh did not name it."""
    if os.environ.get("TIERKV_INTEROP_BIN"):
        return Path(os.environ["TIERKV_INTEROP_BIN"])
    subprocess.run(["cargo", "build", "-q", "--example", "interop"], cwd=REPO, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "examples" / "interop"
