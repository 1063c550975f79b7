//! `engine_e2e`: two requests through a real transformer with tierkv beneath it.
//!
//! Request 1 (one process) prefills a prompt of `--prompt-tokens` tokens, cuts every layer's K
//! and V into blocks of `--block-tokens` (layout v1, docs/engine-api.md), keys them by the chain
//! hash of their tokens and offers them through the write-behind [`Offloader`]. Request 2 (a
//! second process, a fresh engine instance) shares the first `--shared-tokens` tokens: it asks
//! `contains_prefix`, loads the cached blocks with one `get_many`, rebuilds the KV cache and
//! prefills only the rest; its next-token logits and 32-token greedy continuation are
//! compared with a run of the same request without the cache.
//!
//! `cargo run --release -p engine_e2e -- --prompt-tokens 1024 --shared-tokens 768 --output-format json`

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use candle_core::Device;
use candle_transformers::models::llama2_c::{Config, Llama};
use clap::Parser;
use engine_e2e::{
    BoxError, KV_LAYOUT_VERSION, KvLayout, ModelSize, argmax, build_model, forward_last, greedy,
    new_cache, tokens,
};
use serde_json::{Value, json};
use tierkv::{BlockHash, Lookup, Store, StoreConfig, StoreStats, WorkerId};
use tierkv::{OfferOutcome, OffloadConfig, Offloader, OnClose};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// Both requests, each in a process of its own; prints the comparison.
    All,
    /// Request 1: prefill and offload (a child of `all`).
    First,
    /// Request 2: load the prefix, prefill the rest, compare (a child of `all`).
    Second,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    Normal,
    Json,
}

/// Two requests through candle's Llama 2 (random weights from a fixed seed) with tierkv
/// beneath it.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Tokens of each request's prompt.
    #[arg(long, default_value_t = 256)]
    prompt_tokens: usize,
    /// Leading tokens request 2 shares with request 1.
    #[arg(long, default_value_t = 192)]
    shared_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// Tokens of greedy continuation compared.
    #[arg(long, default_value_t = 32)]
    continuation: usize,
    /// Model size.
    #[arg(long, value_enum, default_value_t = ModelSize::Tiny)]
    model: ModelSize,
    /// Seed of the weights and the prompts.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Cache root (default: a temp dir, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Request 2 reads with O_DIRECT (the prefix cold, not from the page cache).
    #[arg(long)]
    direct: bool,
    /// Before request 2, drop the block files from the page cache (posix_fadvise DONTNEED).
    #[arg(long)]
    invalidate: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Normal)]
    output_format: OutputFormat,
    /// Which part to run (`all` runs the two others as child processes).
    #[arg(long, value_enum, default_value_t = Role::All)]
    role: Role,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("engine_e2e: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    if args.block_tokens == 0 || args.shared_tokens > args.prompt_tokens || args.prompt_tokens < 2 {
        return Err(
            "need --block-tokens > 0, 2 <= --prompt-tokens, --shared-tokens <= --prompt-tokens"
                .into(),
        );
    }
    match args.role {
        Role::First => print_json(&first(args)?),
        Role::Second => print_json(&second(args)?),
        Role::All => all(args),
    }
}

fn print_json(v: &Value) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(v)?)?;
    Ok(())
}

/// The two prompts: a shared prefix, then a suffix of each request's own.
fn prompts(args: &Args, vocab: usize) -> (Vec<u32>, Vec<u32>) {
    let shared = tokens(args.seed, args.shared_tokens, vocab);
    let rest = args.prompt_tokens - args.shared_tokens;
    let mut r1 = shared.clone();
    r1.extend(tokens(args.seed + 1, rest, vocab));
    let mut r2 = shared;
    r2.extend(tokens(args.seed + 2, rest, vocab));
    (r1, r2)
}

fn worker() -> WorkerId {
    WorkerId::new("rank0").expect("a valid worker id")
}

fn max_tokens(args: &Args) -> usize {
    args.prompt_tokens + args.continuation + 1
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Request 1: prefill, cut the KV into blocks, offer them; wait for the writes (close).
fn first(args: &Args) -> Result<Value, BoxError> {
    let dev = Device::Cpu;
    let cfg = args.model.config(max_tokens(args));
    let model = build_model(&cfg, args.seed, &dev)?;
    let layout = KvLayout::of(&cfg, args.block_tokens);
    let (r1, _) = prompts(args, cfg.vocab_size);
    let dir = args.dir.as_ref().ok_or("--role first needs --dir")?;
    let store = Store::open(dir, worker(), StoreConfig::default())?;
    let offload = Offloader::new(store.clone(), OffloadConfig::default())?;

    let mut cache = new_cache(&cfg, &dev)?;
    let t = Instant::now();
    let logits = forward_last(&model, &mut cache, &r1, 0, &dev)?;
    let first_token = argmax(&logits);
    let ttft_ms = ms(t);

    // Every layer's K and V, cut into full blocks, keyed by the chain hash of their tokens.
    let kvs: Vec<_> = cache
        .kvs
        .iter()
        .map(|kv| kv.clone().ok_or("a layer without KV"))
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    let payloads = layout.encode(&kvs)?;
    let encode_ms = ms(t);
    let keys: Vec<_> = BlockHash::chain_all(&r1, args.block_tokens)
        .into_iter()
        .map(|h| store.key(h))
        .collect();
    let items: Vec<_> = keys.iter().cloned().zip(payloads).collect();
    let t = Instant::now();
    let done = offload.offer_tracked(None, items);
    let offer_us = t.elapsed().as_secs_f64() * 1e6;
    let outcomes = done.wait();
    let written = outcomes.iter().filter(|o| o.is_written()).count();
    for o in &outcomes {
        if let OfferOutcome::Failed(e) = o {
            return Err(format!("offload failed: {e}").into());
        }
    }
    let stats = offload.close(OnClose::Write);
    Ok(json!({
        "ttft_ms": ttft_ms,
        "first_token": first_token,
        "encode_ms": encode_ms,
        "offer_us": offer_us,
        "blocks_offered": keys.len(),
        "blocks_written": written,
        "offload": stats,
    }))
}

/// Drops `dir`'s files from the page cache.
fn invalidate(dir: &Path) -> Result<(), BoxError> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else if e.file_type()?.is_file() {
                let f = std::fs::File::open(e.path())?;
                rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
            }
        }
    }
    Ok(())
}

/// Request 2: a run without the cache (the reference), then one with the cached prefix.
fn second(args: &Args) -> Result<Value, BoxError> {
    let dev = Device::Cpu;
    let cfg = args.model.config(max_tokens(args));
    let model = build_model(&cfg, args.seed, &dev)?;
    let layout = KvLayout::of(&cfg, args.block_tokens);
    let (_, r2) = prompts(args, cfg.vocab_size);
    let dir = args.dir.as_ref().ok_or("--role second needs --dir")?;
    let engine = Engine {
        args,
        cfg: &cfg,
        model: &model,
        dev: &dev,
    };
    engine.warm_up()?;
    let cold = engine.cold(&r2)?;

    if args.invalidate {
        invalidate(&dir.join("v1"))?;
    }
    let store = Store::open(
        dir,
        worker(),
        StoreConfig::default().with_direct_io(args.direct),
    )?;
    let before = store.stats();
    let cached = engine.cached(&store, &layout, &r2)?;
    let after = store.stats();
    Ok(compare(&cold, &cached, &before, &after))
}

/// Request 2's engine: the model, its configuration and device, and the options.
struct Engine<'a> {
    args: &'a Args,
    cfg: &'a Config,
    model: &'a Llama,
    dev: &'a Device,
}

/// A run of request 2: its next-token logits, its first token and continuation, and its
/// time to the first token.
struct RunOf2 {
    logits: Vec<f32>,
    first: u32,
    continuation: Vec<u32>,
    ttft_ms: f64,
}

/// Request 2 with the cache: the run, what came from tierkv and the time of each step.
struct CachedRun {
    run: RunOf2,
    /// Blocks of the prefix loaded.
    loaded: usize,
    /// Tokens of the prefix loaded.
    pos: usize,
    load_ms: f64,
    rebuild_ms: f64,
    prefill_rest_ms: f64,
}

impl Engine<'_> {
    /// Warms the model's code paths (allocations, thread pool) on a short unrelated prompt.
    fn warm_up(&self) -> Result<(), BoxError> {
        let (args, cfg) = (self.args, self.cfg);
        let mut warm = new_cache(cfg, self.dev)?;
        forward_last(
            self.model,
            &mut warm,
            &tokens(args.seed + 9, 16, cfg.vocab_size),
            0,
            self.dev,
        )?;
        drop(warm);
        Ok(())
    }

    /// The reference: the whole prompt `r2`, no cache.
    fn cold(&self, r2: &[u32]) -> Result<RunOf2, BoxError> {
        let (model, dev) = (self.model, self.dev);
        let mut cache = new_cache(self.cfg, dev)?;
        let t = Instant::now();
        let logits = forward_last(model, &mut cache, r2, 0, dev)?;
        let first = argmax(&logits);
        let ttft_ms = ms(t);
        let continuation = greedy(
            model,
            &mut cache,
            first,
            r2.len(),
            self.args.continuation,
            dev,
        )?;
        drop(cache);
        Ok(RunOf2 {
            logits,
            first,
            continuation,
            ttft_ms,
        })
    }

    /// With the cache: the prefix from tierkv, the rest prefilled.
    fn cached(&self, store: &Store, layout: &KvLayout, r2: &[u32]) -> Result<CachedRun, BoxError> {
        let (model, dev, block_tokens) = (self.model, self.dev, self.args.block_tokens);
        let t = Instant::now();
        let (bufs, loaded) = load_prefix(store, layout, r2, block_tokens)?;
        let load_ms = ms(t);
        let t2 = Instant::now();
        let mut cache = new_cache(self.cfg, dev)?;
        if loaded > 0 {
            let refs: Vec<&[u8]> = bufs[..loaded].iter().map(Vec::as_slice).collect();
            for (slot, kv) in cache.kvs.iter_mut().zip(layout.decode(&refs, dev)?) {
                *slot = Some(kv);
            }
        }
        let rebuild_ms = ms(t2);
        let pos = loaded * block_tokens;
        let t3 = Instant::now();
        let logits = forward_last(model, &mut cache, &r2[pos..], pos, dev)?;
        let first = argmax(&logits);
        let prefill_rest_ms = ms(t3);
        let ttft_ms = ms(t);
        let continuation = greedy(
            model,
            &mut cache,
            first,
            r2.len(),
            self.args.continuation,
            dev,
        )?;
        Ok(CachedRun {
            run: RunOf2 {
                logits,
                first,
                continuation,
                ttft_ms,
            },
            loaded,
            pos,
            load_ms,
            rebuild_ms,
            prefill_rest_ms,
        })
    }
}

/// Loads the longest cached prefix of the prompt `r2` with one `get_many`: the block buffers
/// and how many of them hold a block.
fn load_prefix(
    store: &Store,
    layout: &KvLayout,
    r2: &[u32],
    block_tokens: usize,
) -> Result<(Vec<Vec<u8>>, usize), BoxError> {
    let keys: Vec<_> = BlockHash::chain_all(r2, block_tokens)
        .into_iter()
        .map(|h| store.key(h))
        .collect();
    // At least the last token is computed: its logits are the first token's.
    let usable = (r2.len() - 1) / block_tokens;
    let n = store.contains_prefix(&keys[..usable.min(keys.len())])?;
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; layout.block_bytes()]; n];
    let mut loaded = 0;
    for r in store.get_many(&keys[..n], &mut bufs) {
        match r? {
            Lookup::Hit(len) if len == layout.block_bytes() => loaded += 1,
            // A miss since contains_prefix (evicted, corrupt): the prefix ends there.
            _ => break,
        }
    }
    Ok((bufs, loaded))
}

/// Request 2's report: the cached run against the reference, and the store's work between
/// its counters `before` and `after`.
fn compare(cold: &RunOf2, cached: &CachedRun, before: &StoreStats, after: &StoreStats) -> Value {
    let c = &cached.run;
    let max_diff = cold
        .logits
        .iter()
        .zip(&c.logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let max_abs = cold.logits.iter().map(|a| a.abs()).fold(0.0f32, f32::max);
    json!({
        "continuation_identical": cold.continuation == c.continuation,
        "first_token_identical": cold.first == c.first,
        "logits_max_abs_diff": max_diff,
        "logits_max_abs": max_abs,
        "cached_blocks": cached.loaded,
        "cached_tokens": cached.pos,
        "ttft_cold_ms": cold.ttft_ms,
        "ttft_cached_ms": c.ttft_ms,
        "load_ms": cached.load_ms,
        "rebuild_ms": cached.rebuild_ms,
        "prefill_rest_ms": cached.prefill_rest_ms,
        "store_hits": after.hits - before.hits,
        "store_bytes_read": after.bytes_read - before.bytes_read,
        "continuation": c.continuation,
    })
}

/// Runs request 1, then request 2, each in a child process of its own, and merges what they
/// print.
fn all(args: &Args) -> Result<(), BoxError> {
    let temp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let child = |role: &str| -> Result<Value, BoxError> {
        let exe = std::env::current_exe()?;
        let mut c = Command::new(exe);
        c.args(["--role", role])
            .args(["--prompt-tokens", &args.prompt_tokens.to_string()])
            .args(["--shared-tokens", &args.shared_tokens.to_string()])
            .args(["--block-tokens", &args.block_tokens.to_string()])
            .args(["--continuation", &args.continuation.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(["--model", &format!("{:?}", args.model).to_lowercase()])
            .arg("--dir")
            .arg(&dir);
        if args.direct {
            c.arg("--direct");
        }
        if args.invalidate {
            c.arg("--invalidate");
        }
        let out = c.output()?;
        if !out.status.success() {
            return Err(format!(
                "{role} request failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let r1 = child("first")?;
    let r2 = child("second")?;
    let cfg = args.model.config(max_tokens(args));
    let layout = KvLayout::of(&cfg, args.block_tokens);
    let doc = json!({
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "shared_tokens": args.shared_tokens,
        "block_tokens": args.block_tokens,
        "layout_version": KV_LAYOUT_VERSION,
        "layout": layout,
        "kv_bytes_per_token": layout.bytes_per_token(),
        "block_bytes": layout.block_bytes(),
        "direct": args.direct,
        "invalidate": args.invalidate,
        "continuation_identical": r2["continuation_identical"],
        "logits_max_abs_diff": r2["logits_max_abs_diff"],
        "cached_blocks": r2["cached_blocks"],
        "ttft_cold_ms": r2["ttft_cold_ms"],
        "ttft_cached_ms": r2["ttft_cached_ms"],
        "request1": r1,
        "request2": r2,
    });
    match args.output_format {
        OutputFormat::Json => print_json(&doc)?,
        OutputFormat::Normal => {
            println!(
                "engine_e2e: model {:?}, prompt {} tokens, shared {}, blocks of {} ({} bytes, {} KV bytes per token)",
                args.model,
                args.prompt_tokens,
                args.shared_tokens,
                args.block_tokens,
                layout.block_bytes(),
                layout.bytes_per_token()
            );
            println!(
                "  request 1: prefill {:.1} ms, {} blocks offered, {} written",
                r1["ttft_ms"].as_f64().unwrap_or(0.0),
                r1["blocks_offered"],
                r1["blocks_written"]
            );
            println!(
                "  request 2: {} cached blocks; TTFT cold {:.1} ms, cached {:.1} ms (load {:.2} ms, rebuild {:.2} ms, prefill of the rest {:.1} ms)",
                r2["cached_blocks"],
                r2["ttft_cold_ms"].as_f64().unwrap_or(0.0),
                r2["ttft_cached_ms"].as_f64().unwrap_or(0.0),
                r2["load_ms"].as_f64().unwrap_or(0.0),
                r2["rebuild_ms"].as_f64().unwrap_or(0.0),
                r2["prefill_rest_ms"].as_f64().unwrap_or(0.0)
            );
            println!(
                "  continuation identical: {}; logits max abs diff {:e}",
                r2["continuation_identical"],
                r2["logits_max_abs_diff"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    Ok(())
}
