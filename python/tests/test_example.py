"""The engine-shaped example (python/examples/prefix_cache.py) runs on the trace and checks
every page it loads (its own assertion); the loop's hits come back after a restart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

EXAMPLE = REPO / "python" / "examples" / "prefix_cache.py"
TRACE = REPO / "tests" / "data" / "mooncake_synthetic_trace.jsonl"


def run(*args):
    r = subprocess.run([sys.executable, str(EXAMPLE), "--trace", str(TRACE), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def ratio(out):
    return float(re.search(r"hit ratio (\d\.\d+)", out).group(1))


def test_prefix_cache_example_hits_and_reports_bandwidth(tmp_path):
    out = run("--requests", "300", "--block-bytes", "4096", "--root", str(tmp_path),
              "--capacity-blocks", "100000")
    assert "300 requests" in out and re.search(r"load: .* GiB/s", out), out
    first = ratio(out)
    assert first > 0.0
    # The same requests again on the same tree (reopened): every block is a hit now.
    again = run("--requests", "300", "--block-bytes", "4096", "--root", str(tmp_path),
                "--capacity-blocks", "100000")
    assert ratio(again) == 1.0, again
