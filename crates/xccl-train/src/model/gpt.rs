//! A small GPT-style decoder: token + position embedding, pre-norm attention and MLP
//! layers, and an output head that is tied to the token embedding or has its own weight.
//!
//! Blocks: `embed`, `h00` … `hNN` (one per layer), `head` (final norm and output).

use candle_core::{D, Module, Tensor};

use super::ModelConfig;
use super::block::{Block, Init, LayerNorm, Linear, expect_ids};
use super::ops::gelu;
use crate::error::{Error, Result};
use crate::params::Param;

/// Standard deviation of initial weights (GPT-2's).
const STD: f32 = 0.02;

/// Builds the blocks of a GPT for `cfg`.
pub fn build(cfg: &ModelConfig, init: &mut Init) -> Result<Vec<Box<dyn Block>>> {
    if cfg.heads == 0 || !cfg.width.is_multiple_of(cfg.heads) {
        return Err(Error::config(format!(
            "--width {} must be a multiple of --heads {} (each head gets width / heads features)",
            cfg.width, cfg.heads
        )));
    }
    let embed = Embed::new(cfg, init)?;
    let tok = embed.tok.clone();
    let mut blocks: Vec<Box<dyn Block>> = vec![Box::new(embed)];
    // Residual projections are scaled down with depth, as in GPT-2.
    let residual_std = STD / (2.0 * cfg.layers as f32).sqrt();
    for l in 0..cfg.layers {
        blocks.push(Box::new(Layer::new(cfg, init, l, residual_std)?));
    }
    blocks.push(Box::new(Head::new(cfg, init, cfg.tied.then_some(tok))?));
    Ok(blocks)
}

/// Token and position embeddings: ids `[rows, len]` to `[rows, len, width]`.
struct Embed {
    tok: Param,
    pos: Tensor,
    params: Vec<Param>,
    context: usize,
}

impl Embed {
    fn new(cfg: &ModelConfig, init: &mut Init) -> Result<Embed> {
        let tok = init.normal("embed.tok".into(), &[cfg.vocab, cfg.width], STD)?;
        let pos = init.normal("embed.pos".into(), &[cfg.context, cfg.width], STD)?;
        Ok(Embed {
            tok: tok.clone(),
            pos: pos.tensor().clone(),
            params: vec![tok, pos],
            context: cfg.context,
        })
    }
}

impl Block for Embed {
    fn name(&self) -> &str {
        "embed"
    }

    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = expect_ids("embed", ids, self.context)?;
        let width = self.tok.tensor().dim(1)?;
        let tok = self.tok.tensor().index_select(&ids.flatten_all()?, 0)?.reshape((b, t, width))?;
        tok.broadcast_add(&self.pos.narrow(0, 0, t)?)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }
}

/// One pre-norm decoder layer: `x + attn(ln1(x))`, then `h + mlp(ln2(h))`.
struct Layer {
    name: String,
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    out: Linear,
    heads: usize,
    /// `[context, context]`: 0 on and below the diagonal, a large negative number above.
    causal: Tensor,
    params: Vec<Param>,
}

impl Layer {
    fn new(cfg: &ModelConfig, init: &mut Init, index: usize, residual_std: f32) -> Result<Layer> {
        let name = format!("h{index:02}");
        let d = cfg.width;
        let mut params = Vec::new();
        let ln1 = init.layer_norm(&mut params, &format!("{name}.ln1"), d)?;
        let qkv = init.linear(&mut params, &format!("{name}.attn.qkv"), d, 3 * d, STD)?;
        let proj = init.linear(&mut params, &format!("{name}.attn.proj"), d, d, residual_std)?;
        let ln2 = init.layer_norm(&mut params, &format!("{name}.ln2"), d)?;
        let fc = init.linear(&mut params, &format!("{name}.mlp.fc"), d, 4 * d, STD)?;
        let out = init.linear(&mut params, &format!("{name}.mlp.out"), 4 * d, d, residual_std)?;
        let n = cfg.context;
        let mask: Vec<f32> = (0..n * n).map(|i| if i % n > i / n { -1e9 } else { 0.0 }).collect();
        let causal = Tensor::from_vec(mask, (n, n), &candle_core::Device::Cpu)?;
        Ok(Layer { name, ln1, qkv, proj, ln2, fc, out, heads: cfg.heads, causal, params })
    }

    fn attention(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let dh = d / self.heads;
        // [b, t, 3d] -> [3, b, heads, t, dh]
        let qkv = self.qkv.forward(x)?.reshape((b, t, 3, self.heads, dh))?.permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?;
        let mask = self.causal.narrow(0, 0, t)?.narrow(1, 0, t)?;
        // The differentiable softmax: candle's fused softmax_last_dim has no backward.
        let att = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        self.proj.forward(&y)
    }
}

impl Block for Layer {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = (x + self.attention(&self.ln1.forward(x)?)?)?;
        let m = self.out.forward(&gelu(&self.fc.forward(&self.ln2.forward(&h)?)?)?)?;
        h + m
    }

    fn params(&self) -> &[Param] {
        &self.params
    }
}

/// Final layer norm and output projection to the vocabulary: `[rows, len, width]` to
/// logits `[rows, len, vocab]`.
struct Head {
    norm: LayerNorm,
    /// Weight `[vocab, width]`: the token embedding when tied, else the head's own.
    out: Linear,
    params: Vec<Param>,
    shared: Vec<Param>,
}

impl Head {
    fn new(cfg: &ModelConfig, init: &mut Init, tied: Option<Param>) -> Result<Head> {
        let mut params = Vec::new();
        let norm = init.layer_norm(&mut params, "head.norm", cfg.width)?;
        let (weight, shared) = match tied {
            Some(tok) => (tok.tensor().clone(), vec![tok]),
            None => {
                let w = init.normal("head.out.weight".into(), &[cfg.vocab, cfg.width], STD)?;
                let t = w.tensor().clone();
                params.push(w);
                (t, Vec::new())
            }
        };
        Ok(Head { norm, out: Linear::new(weight, None), params, shared })
    }
}

impl Block for Head {
    fn name(&self) -> &str {
        "head"
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.norm.forward(x)?)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn shared(&self) -> &[Param] {
        &self.shared
    }
}
