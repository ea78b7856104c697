//! A small GPT-style decoder: token + position embedding, pre-norm attention and MLP
//! layers, and an output head that is tied to the token embedding or has its own weight.
//!
//! Blocks: `embed`, `h00` … `hNN` (one per layer), `head` (final norm and output).
//!
//! Built for a tensor-parallel group ([`Tp`]) the layers are Megatron's: the token
//! embedding and the output head split by vocabulary, attention heads split over the
//! group (q/k/v column-parallel, output projection row-parallel), the MLP column- then
//! row-parallel: one all-reduce forward and one backward per attention and per MLP. With
//! sequence parallelism the norms and residuals work on `len / tp` positions per rank.

use candle_core::{Module, Tensor};

use super::ModelConfig;
use super::block::{Block, Init, LayerNorm, expect_ids};
use super::softmax::causal_softmax;
use crate::error::{Error, Result};
use crate::layers::ops::gelu;
use crate::params::Param;
use crate::tp::{ColumnParallelLinear, RowParallelLinear, Tp, VocabParallelEmbedding};

/// Standard deviation of initial weights (GPT-2's).
const STD: f32 = 0.02;

/// Builds the blocks of a GPT for `cfg`, this rank's part of them for group `tp`, handing
/// each to `emit` in order as soon as it is built.
pub fn build(
    cfg: &ModelConfig,
    init: &mut Init,
    tp: &Tp,
    emit: &mut dyn FnMut(Box<dyn Block>) -> Result<()>,
) -> Result<()> {
    if cfg.heads == 0 || !cfg.width.is_multiple_of(cfg.heads) {
        return Err(Error::config(format!(
            "--width {} must be a multiple of --heads {} (each head gets width / heads features)",
            cfg.width, cfg.heads
        )));
    }
    Tp::check_sizes(tp.size(), false, cfg.heads, 0)?;
    let embed = Embed::new(cfg, init, tp)?;
    let tok = embed.tok.table().clone();
    emit(Box::new(embed))?;
    // Residual projections are scaled down with depth, as in GPT-2.
    let residual_std = STD / (2.0 * cfg.layers as f32).sqrt();
    for l in 0..cfg.layers {
        emit(Box::new(Layer::new(cfg, init, l, residual_std, tp)?))?;
    }
    emit(Box::new(Head::new(cfg, init, cfg.tied.then_some(tok), tp)?))
}

/// Token and position embeddings: ids `[rows, len]` to `[rows, len, width]` (with sequence
/// parallelism, this rank's `[rows, len / tp, width]`).
struct Embed {
    tok: VocabParallelEmbedding,
    pos: Param,
    params: Vec<Param>,
    context: usize,
    tp: Tp,
}

impl Embed {
    fn new(cfg: &ModelConfig, init: &mut Init, tp: &Tp) -> Result<Embed> {
        let mut params = Vec::new();
        let tok =
            VocabParallelEmbedding::new(init, &mut params, "embed.tok", (cfg.vocab, cfg.width), STD, tp)?;
        let pos = init.normal("embed.pos".into(), &[cfg.context, cfg.width], STD)?;
        params.push(pos.clone());
        Ok(Embed { tok, pos, params, context: cfg.context, tp: tp.clone() })
    }
}

impl Block for Embed {
    fn name(&self) -> &str {
        "embed"
    }

    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        expect_ids("embed", ids, self.context)?;
        let tok = self.tok.forward(ids)?;
        // Under sequence parallelism this rank holds positions first .. first + len.
        let len = tok.dim(1)?;
        let first = if self.tp.sp() { self.tp.rank() * len } else { 0 };
        tok.broadcast_add(&self.pos.tensor().narrow(0, first, len)?)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }
}

/// One pre-norm decoder layer: `x + attn(ln1(x))`, then `h + mlp(ln2(h))`.
struct Layer {
    name: String,
    ln1: LayerNorm,
    qkv: ColumnParallelLinear,
    proj: RowParallelLinear,
    ln2: LayerNorm,
    fc: ColumnParallelLinear,
    out: RowParallelLinear,
    /// Heads on this rank.
    heads: usize,
    params: Vec<Param>,
}

impl Layer {
    fn new(cfg: &ModelConfig, init: &mut Init, index: usize, residual_std: f32, tp: &Tp) -> Result<Layer> {
        let name = format!("h{index:02}");
        let d = cfg.width;
        let mut params = Vec::new();
        let p = &mut params;
        let ln1 = init.layer_norm(p, &format!("{name}.ln1"), d)?;
        // q, k and v are three groups of `heads` heads: each rank takes its heads of each.
        let qkv =
            ColumnParallelLinear::new(init, p, &format!("{name}.attn.qkv"), (d, 3 * d), STD, true, 3, tp)?;
        let proj = RowParallelLinear::new(init, p, &format!("{name}.attn.proj"), (d, d), residual_std, tp)?;
        let ln2 = init.layer_norm(p, &format!("{name}.ln2"), d)?;
        let fc = ColumnParallelLinear::new(init, p, &format!("{name}.mlp.fc"), (d, 4 * d), STD, true, 1, tp)?;
        let out = RowParallelLinear::new(init, p, &format!("{name}.mlp.out"), (4 * d, d), residual_std, tp)?;
        let heads = cfg.heads / tp.size();
        Ok(Layer { name, ln1, qkv, proj, ln2, fc, out, heads, params })
    }

    fn attention(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // [b, t, 3·d/tp] (the whole sequence, this rank's heads) -> [3, b, heads, t, dh]
        let qkv = self.qkv.forward(x)?;
        let (b, t, three_d) = qkv.dims3()?;
        let d = three_d / 3;
        let dh = d / self.heads;
        let qkv = qkv.reshape((b, t, 3, self.heads, dh))?.permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        // Scale, causal mask and softmax in one pass (candle's fused softmax has no backward).
        let att = causal_softmax(&q.matmul(&k.t()?)?, 1.0 / (dh as f64).sqrt())?;
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
/// logits `[rows, len, vocab]`; with tensor parallelism this rank's `vocab / tp` (padded)
/// columns, which the loss uses as they are.
struct Head {
    norm: LayerNorm,
    /// Weight `[vocab / tp, width]`: the token embedding's rows when tied, else the head's own.
    out: ColumnParallelLinear,
    params: Vec<Param>,
    shared: Vec<Param>,
}

impl Head {
    fn new(cfg: &ModelConfig, init: &mut Init, tied: Option<Param>, tp: &Tp) -> Result<Head> {
        let mut params = Vec::new();
        let norm = init.layer_norm(&mut params, "head.norm", cfg.width)?;
        let (out, shared) = match tied {
            Some(tok) => (ColumnParallelLinear::on_weight(tok.clone(), tp), vec![tok]),
            None => {
                let shape = (cfg.width, cfg.vocab);
                (
                    ColumnParallelLinear::new(init, &mut params, "head.out", shape, STD, false, 1, tp)?,
                    Vec::new(),
                )
            }
        };
        Ok(Head { norm, out, params, shared })
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
