"""README's vLLM connector line, checked by vLLM's own argument parser, and the connector's
worker id, which must name the weights and their KV, not where they are. Runs in .venv-vllm/ (no engine is started)."""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import require_engine  # noqa: E402

require_engine("vllm", "vllm", "test_vllm_config.py")

from tierkv_g3._engines import STORE_OPTIONS  # noqa: E402
from tierkv_g3.vllm_connector import worker_id  # noqa: E402

HARNESS = Path(__file__).with_name("vllm_harness.py")
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_connector_line() -> str:
    """README's --kv-transfer-config line for TierkvConnector."""
    lines = [
        line for line in README.read_text().splitlines()
        if line.startswith("--kv-transfer-config") and '"TierkvConnector"' in line
    ]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, str(HARNESS), "model", str(d)], check=True, timeout=300)
    return d


def test_readmes_connector_line_parses_with_vllms_own_parser(model):
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(model), *shlex.split(readme_connector_line())])
    engine_args = EngineArgs.from_cli_args(args)
    kv = engine_args.kv_transfer_config
    if not isinstance(kv, KVTransferConfig):
        kv = KVTransferConfig(**kv)
    assert kv.kv_connector == "TierkvConnector" and kv.kv_role == "kv_both"
    # A block that fails to load is recomputed, not a failed request.
    assert kv.kv_load_failure_policy == "recompute"
    extra = kv.kv_connector_extra_config
    assert extra["root"] and extra["capacity_bytes"] > 0, extra
    assert set(extra) <= set(STORE_OPTIONS) | {"root", "log_interval", "threads"}, extra
    module = importlib.import_module(kv.kv_connector_module_path)
    assert hasattr(module, kv.kv_connector)


def config(model: Path, dtype: str = "float32") -> tuple:
    """A vllm_config and kv_cache_config as the connector reads them, for the model in `model`
    (its real Hugging Face config)."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model)
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model), revision=None, dtype=dtype, quantization=None, hf_config=hf
        ),
        cache_config=SimpleNamespace(cache_dtype="auto", block_size=32, kv_cache_layout="NHD"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
    )
    groups = SimpleNamespace(
        kv_cache_groups=[SimpleNamespace(layer_names=["l0", "l1"], kv_cache_spec="FullAttention")]
    )
    return vllm_config, groups


def test_the_worker_id_names_the_weights_not_their_path(model, tmp_path):
    """The same weights at another path (another node's mount point, a moved model) share the
    tier; another checkpoint of the same architecture (a fine-tune), another dtype or another
    KV layout does not."""
    same = tmp_path / "elsewhere" / "mounted-model"
    shutil.copytree(model, same)
    # A fine-tune: the same files, config and sizes, other weights.
    other = tmp_path / "fine-tune"
    shutil.copytree(model, other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    save_file({k: v + 0.01 for k, v in weights.items()}, other / "model.safetensors", metadata={"format": "pt"})
    assert (other / "model.safetensors").stat().st_size == (model / "model.safetensors").stat().st_size
    base = worker_id(*config(model), 0, 0)
    assert re.fullmatch(r"vllm\.llama\.b32\.tp0of1\.[0-9a-f]{16}", base), base
    assert worker_id(*config(same), 0, 0) == base
    assert worker_id(*config(other), 0, 0) != base
    assert worker_id(*config(model, dtype="bfloat16"), 0, 0) != base
    vc, groups = config(model)
    vc.cache_config.kv_cache_layout = "HND"
    assert worker_id(vc, groups, 0, 0) != base


def test_a_worker_keeps_no_state_per_finished_request_for_ever():
    """vLLM tells the worker every finished request; those without saves are never reported
    back, so their ids must not pile up (a long-lived server finishes millions)."""
    from tierkv_g3 import vllm_connector as vc

    c = object.__new__(vc.TierkvConnector)  # the worker side's bookkeeping only, no engine
    c._transfers, c._finished_seen, c._calls = None, {}, 0
    c._to_report, c._saving, c._loaded, c._invalid = set(), {}, set(), set()
    for i in range(20 * vc._SEEN_CALLS):
        assert c.get_finished({f"r{i}"}) == (None, None)
    assert len(c._finished_seen) <= vc._SEEN_CALLS + 64, len(c._finished_seen)
    # One whose blocks wait for its saves is reported once none is in flight.
    c._to_report.add("s")
    c._saving["s"] = 1
    assert c.get_finished({"s"}) == (None, None)
    del c._saving["s"]
    assert c.get_finished(set()) == ({"s"}, None)
    assert "s" not in c._finished_seen and not c._to_report
