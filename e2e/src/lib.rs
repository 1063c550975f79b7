//! tierkv beneath a real transformer: candle's Llama 2 (`candle_transformers::models::llama2_c`,
//! RMSNorm, RoPE, grouped-query attention, SwiGLU) on the CPU with weights drawn from a fixed
//! seed, so nothing is downloaded and the KV tensors are real attention outputs.
//!
//! [`KvLayout`] is the block convention (docs/engine-api.md, "Block layout v1"): how the K and V
//! tensors of one block of tokens are laid out in a block's payload.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama2_c::{Cache, Config, Llama};

/// The error type of the example.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A model size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelSize {
    /// 2 layers, dim 64, 4 heads (2 KV heads), vocabulary 256: for the CI test.
    Tiny,
    /// 8 layers, dim 512, 8 heads (4 KV heads), vocabulary 32000: prefill is costly on a CPU.
    Small,
}

impl ModelSize {
    /// The configuration, with room for `max_tokens` positions.
    pub fn config(self, max_tokens: usize) -> Config {
        let (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size) = match self {
            ModelSize::Tiny => (64, 176, 2, 4, 2, 256),
            ModelSize::Small => (512, 1376, 8, 8, 4, 32000),
        };
        Config {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            seq_len: max_tokens,
            norm_eps: 1e-5,
        }
    }
}

/// SplitMix64: the example's only source of randomness (weights and prompts).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The model with weights drawn from `seed`: linear weights uniform in +-1/sqrt(fan_in),
/// embeddings uniform in +-1, norm weights 1 +- 0.1. Equal seeds give equal weights, in any
/// process.
pub fn build_model(cfg: &Config, seed: u64, dev: &Device) -> Result<Llama, BoxError> {
    let mut rng = Rng::new(seed);
    let mut ts: HashMap<String, Tensor> = HashMap::new();
    let mut put = |name: String, rows: usize, cols: usize, scale: f32, offset: f32| {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| offset + scale * rng.unit())
            .collect();
        let t = if cols == 1 {
            Tensor::from_vec(v, rows, dev)
        } else {
            Tensor::from_vec(v, (rows, cols), dev)
        };
        t.map(|t| ts.insert(name, t))
    };
    let head = cfg.dim / cfg.n_heads;
    let kv = head * cfg.n_kv_heads;
    let lin = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    put(
        "model.embed_tokens.weight".into(),
        cfg.vocab_size,
        cfg.dim,
        1.0,
        0.0,
    )?;
    put(
        "lm_head.weight".into(),
        cfg.vocab_size,
        cfg.dim,
        lin(cfg.dim),
        0.0,
    )?;
    put("model.norm.weight".into(), cfg.dim, 1, 0.1, 1.0)?;
    for i in 0..cfg.n_layers {
        let p = format!("model.layers.{i}");
        put(
            format!("{p}.self_attn.q_proj.weight"),
            cfg.dim,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.self_attn.k_proj.weight"),
            kv,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.self_attn.v_proj.weight"),
            kv,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.self_attn.o_proj.weight"),
            cfg.dim,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.mlp.gate_proj.weight"),
            cfg.hidden_dim,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.mlp.up_proj.weight"),
            cfg.hidden_dim,
            cfg.dim,
            lin(cfg.dim),
            0.0,
        )?;
        put(
            format!("{p}.mlp.down_proj.weight"),
            cfg.dim,
            cfg.hidden_dim,
            lin(cfg.hidden_dim),
            0.0,
        )?;
        put(format!("{p}.input_layernorm.weight"), cfg.dim, 1, 0.1, 1.0)?;
        put(
            format!("{p}.post_attention_layernorm.weight"),
            cfg.dim,
            1,
            0.1,
            1.0,
        )?;
    }
    let vb = VarBuilder::from_tensors(ts, DType::F32, dev);
    Ok(Llama::load(vb, cfg.clone())?)
}

/// A fresh KV cache for `cfg` (RoPE tables for `cfg.seq_len` positions).
pub fn new_cache(cfg: &Config, dev: &Device) -> Result<Cache, BoxError> {
    let vb = VarBuilder::from_tensors(HashMap::new(), DType::F32, dev);
    Ok(Cache::new(true, cfg, vb)?)
}

/// `n` token ids below `vocab`, from `seed`.
pub fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed ^ 0x70_6b_65_6e);
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Runs the model over `tokens` at positions `pos..`, extending `cache`; returns the logits
/// of the last position.
pub fn forward_last(
    model: &Llama,
    cache: &mut Cache,
    tokens: &[u32],
    pos: usize,
    dev: &Device,
) -> Result<Vec<f32>, BoxError> {
    let input = Tensor::new(tokens, dev)?.unsqueeze(0)?;
    let logits = model.forward(&input, pos, cache)?;
    let last = logits.squeeze(0)?.get(tokens.len() - 1)?;
    Ok(last.to_vec1::<f32>()?)
}

/// The index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding: `first` and the next `n - 1` tokens after position `pos`.
pub fn greedy(
    model: &Llama,
    cache: &mut Cache,
    first: u32,
    pos: usize,
    n: usize,
    dev: &Device,
) -> Result<Vec<u32>, BoxError> {
    let mut out = vec![first];
    let mut pos = pos;
    while out.len() < n {
        let logits = forward_last(model, cache, &out[out.len() - 1..], pos, dev)?;
        pos += 1;
        out.push(argmax(&logits));
    }
    Ok(out)
}

/// Magic of a KV block payload, layout version 1.
pub const KV_MAGIC: [u8; 8] = *b"TKVKV\0v1";
/// The layout version.
pub const KV_LAYOUT_VERSION: u32 = 1;
/// Bytes of the payload header.
pub const KV_HEADER_LEN: usize = 64;
/// The dtype code of little-endian f32 (the only one this example writes; 1 = f16 and
/// 2 = bf16 are reserved).
pub const DTYPE_F32: u32 = 0;

/// Block layout v1: the K and V tensors of one block of `block_tokens` tokens in one payload.
///
/// A 64-byte header (little-endian): magic `TKVKV\0v1`, u32 version (1), u32 dtype (0 = f32),
/// u32 layers, u32 block tokens, u32 KV heads, u32 head dim, u64 position of the block's
/// first token, zeros to 64 bytes. Then, layer-major: for each layer, K then V, each
/// token-major `[token][kv_head][head_dim]` (the order in which RoPE-rotated K and V leave the
/// projections, before any transpose). So one layer's K for a block is one contiguous run of
/// `block_tokens * kv_heads * head_dim` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KvLayout {
    /// Layers.
    pub layers: usize,
    /// Tokens per block.
    pub block_tokens: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl KvLayout {
    /// The layout of `cfg`'s KV in blocks of `block_tokens`.
    pub fn of(cfg: &Config, block_tokens: usize) -> Self {
        KvLayout {
            layers: cfg.n_layers,
            block_tokens,
            kv_heads: cfg.n_kv_heads,
            head_dim: cfg.dim / cfg.n_heads,
        }
    }

    /// Elements of one layer's K (or V) in one block.
    pub fn run(&self) -> usize {
        self.block_tokens * self.kv_heads * self.head_dim
    }

    /// KV bytes of one token (all layers, K and V).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers * self.kv_heads * self.head_dim * 4
    }

    /// Payload bytes of one block.
    pub fn block_bytes(&self) -> usize {
        KV_HEADER_LEN + self.block_tokens * self.bytes_per_token()
    }

    fn header(&self, first_token: usize) -> [u8; KV_HEADER_LEN] {
        let mut h = [0u8; KV_HEADER_LEN];
        h[..8].copy_from_slice(&KV_MAGIC);
        let fields = [
            KV_LAYOUT_VERSION,
            DTYPE_F32,
            self.layers as u32,
            self.block_tokens as u32,
            self.kv_heads as u32,
            self.head_dim as u32,
        ];
        for (i, f) in fields.iter().enumerate() {
            h[8 + 4 * i..12 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
        h[32..40].copy_from_slice(&(first_token as u64).to_le_bytes());
        h
    }

    /// Cuts a cache's KV (per layer, K and V of shape `[1, tokens, kv_heads, head_dim]`) into
    /// the payloads of its full blocks.
    pub fn encode(&self, kvs: &[(Tensor, Tensor)]) -> Result<Vec<Vec<u8>>, BoxError> {
        let flat: Vec<(Vec<f32>, Vec<f32>)> = kvs
            .iter()
            .map(|(k, v)| Ok((k.flatten_all()?.to_vec1()?, v.flatten_all()?.to_vec1()?)))
            .collect::<Result<_, candle_core::Error>>()?;
        let run = self.run();
        let blocks = flat.first().map_or(0, |(k, _)| k.len() / run);
        let mut out = Vec::with_capacity(blocks);
        for b in 0..blocks {
            let mut p = Vec::with_capacity(self.block_bytes());
            p.extend_from_slice(&self.header(b * self.block_tokens));
            for (k, v) in &flat {
                for x in k[b * run..(b + 1) * run]
                    .iter()
                    .chain(&v[b * run..(b + 1) * run])
                {
                    p.extend_from_slice(&x.to_le_bytes());
                }
            }
            out.push(p);
        }
        Ok(out)
    }

    /// Rebuilds per-layer K and V (`[1, blocks * block_tokens, kv_heads, head_dim]`) from
    /// consecutive blocks' payloads, checking each header.
    pub fn decode(
        &self,
        blocks: &[&[u8]],
        dev: &Device,
    ) -> Result<Vec<(Tensor, Tensor)>, BoxError> {
        let run = self.run();
        let mut ks: Vec<Vec<f32>> = vec![Vec::with_capacity(blocks.len() * run); self.layers];
        let mut vs = ks.clone();
        for (b, p) in blocks.iter().enumerate() {
            if p.len() != self.block_bytes()
                || p[..KV_HEADER_LEN] != self.header(b * self.block_tokens)
            {
                return Err(format!(
                    "block {b}: not a layout-v1 block of this model at this position ({} bytes)",
                    p.len()
                )
                .into());
            }
            let mut at = KV_HEADER_LEN;
            let mut take = |dst: &mut Vec<f32>| {
                dst.extend(
                    p[at..at + 4 * run]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
                at += 4 * run;
            };
            for l in 0..self.layers {
                take(&mut ks[l]);
                take(&mut vs[l]);
            }
        }
        let shape = (
            1,
            blocks.len() * self.block_tokens,
            self.kv_heads,
            self.head_dim,
        );
        ks.into_iter()
            .zip(vs)
            .map(|(k, v)| {
                Ok((
                    Tensor::from_vec(k, shape, dev)?,
                    Tensor::from_vec(v, shape, dev)?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_checks_headers() {
        let dev = Device::Cpu;
        let cfg = ModelSize::Tiny.config(64);
        let l = KvLayout::of(&cfg, 4);
        let mut rng = Rng::new(1);
        let kvs: Vec<(Tensor, Tensor)> = (0..l.layers)
            .map(|_| {
                let mut t = || {
                    let v: Vec<f32> = (0..10 * l.kv_heads * l.head_dim)
                        .map(|_| rng.unit())
                        .collect();
                    Tensor::from_vec(v, (1, 10, l.kv_heads, l.head_dim), &dev).unwrap()
                };
                (t(), t())
            })
            .collect();
        let blocks = l.encode(&kvs).unwrap();
        assert_eq!(blocks.len(), 2, "full blocks only");
        assert!(blocks.iter().all(|b| b.len() == l.block_bytes()));
        let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        let back = l.decode(&refs, &dev).unwrap();
        for ((k, v), (k2, v2)) in kvs.iter().zip(&back) {
            let want = |t: &Tensor| {
                t.narrow(1, 0, 8)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            assert_eq!(want(k), k2.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            assert_eq!(want(v), v2.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        }
        // Out of order: the second block's header names position 4, not 0.
        assert!(l.decode(&refs[1..], &dev).is_err());
    }
}
