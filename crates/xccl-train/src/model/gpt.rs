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
//!
//! Every block writes its backward out ([`Block::forward_saved`], [`Block::backward_input`]):
//! each layer keeps its input (a column-parallel layer under sequence parallelism only this
//! rank's positions), the attention its q, k, v and weights, the MLP its pre-activation and
//! activation; no block keeps a parameter.

use candle_core::{Module, Tensor};

use super::ModelConfig;
use super::attention;
use super::block::{Block, Deferred, Holds, Init, LayerNorm, Saved, expect_ids, saved_as};
use crate::error::{Error, Result};
use crate::layers::ops::{gelu, gelu_grad};
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
        let (first, len) = self.positions(&tok)?;
        tok.broadcast_add(&self.pos.tensor().narrow(0, first, len)?)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn forward_saved(&self, ids: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        expect_ids("embed", ids, self.context)?;
        let tok = self.tok.apply(ids)?;
        let (first, len) = self.positions(&tok)?;
        let y = tok.broadcast_add(&self.pos.tensor().detach().narrow(0, first, len)?)?;
        Ok((y, Saved::new(ids.clone(), &[ids])))
    }

    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        let ids: Tensor = saved_as(self, saved)?;
        let mut deferred = Deferred::new();
        self.tok.backward(ids, grad, &mut deferred)?;
        let (first, len) = self.positions(grad)?;
        let (pos, context, grad) = (self.pos.clone(), self.context, grad.clone());
        deferred.push(move || {
            let g = grad.sum(0)?.pad_with_zeros(0, first, context - first - len)?;
            Ok(vec![(pos, g)])
        });
        Ok((None, deferred))
    }
}

impl Embed {
    /// The positions `first .. first + len` an output `[rows, len, width]` of this rank
    /// holds (under sequence parallelism its part of the sequence).
    fn positions(&self, y: &Tensor) -> candle_core::Result<(usize, usize)> {
        let len = y.dim(1)?;
        let first = if self.tp.sp() { self.tp.rank() * len } else { 0 };
        if first + len > self.context {
            candle_core::bail!(
                "embed: positions {first}..{} beyond the context {}",
                first + len,
                self.context
            );
        }
        Ok((first, len))
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
        // [b, t, 3·d/tp]: the whole sequence, this rank's heads.
        let (y, _) = attention::forward(&self.qkv.forward(x)?, self.heads)?;
        self.proj.forward(&y)
    }
}

/// What a [`Layer`]'s forward keeps: the input of each of its layers.
struct LayerSaved {
    /// The block's input (`ln1`'s).
    x: Tensor,
    /// `qkv`'s input (`ln1`'s output; under sequence parallelism this rank's positions).
    a: Tensor,
    att: attention::Saved,
    /// `proj`'s input (the attention's output).
    y: Tensor,
    /// `ln2`'s input (after the first residual).
    h: Tensor,
    /// `fc`'s input (`ln2`'s output; under sequence parallelism this rank's positions).
    c: Tensor,
    /// GELU's input (`fc`'s output).
    f: Tensor,
    /// `out`'s input (GELU's output).
    g: Tensor,
}

impl Holds for LayerSaved {
    fn tensors(&self) -> Vec<&Tensor> {
        let mut all = vec![&self.x, &self.a, &self.y, &self.h, &self.c, &self.f, &self.g];
        all.extend(self.att.tensors());
        all
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

    fn forward_saved(&self, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        let a = self.ln1.apply(x)?;
        let (y, att) = attention::forward(&self.qkv.apply(&a)?, self.heads)?;
        let h = (x + self.proj.apply(&y)?)?;
        let c = self.ln2.apply(&h)?;
        let f = self.fc.apply(&c)?;
        let g = gelu(&f)?;
        let out = (&h + self.out.apply(&g)?)?;
        Ok((out, Saved::of(LayerSaved { x: x.clone(), a, att, y, h, c, f, g })))
    }

    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        let s: LayerSaved = saved_as(self, saved)?;
        let mut d = Deferred::new();
        // The MLP branch, then the residual's gradient joins it.
        let gg = self.out.backward_input(s.g, grad, &mut d)?;
        let gc = self.fc.backward_input(s.c, &gelu_grad(&s.f, &gg)?, &mut d)?;
        let gh = (grad + self.ln2.backward_input(s.h, &gc, &mut d)?)?;
        // The attention branch, likewise.
        let gy = self.proj.backward_input(s.y, &gh, &mut d)?;
        let ga = self.qkv.backward_input(s.a, &attention::backward(s.att, &gy)?, &mut d)?;
        let gx = (gh + self.ln1.backward_input(s.x, &ga, &mut d)?)?;
        Ok((Some(gx), d))
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

    fn forward_saved(&self, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        let c = self.norm.apply(x)?;
        let saved = Saved::new((x.clone(), c.clone()), &[x, &c]);
        Ok((self.out.apply(&c)?, saved))
    }

    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        let (x, c): (Tensor, Tensor) = saved_as(self, saved)?;
        let mut d = Deferred::new();
        let gc = self.out.backward_input(c, grad, &mut d)?;
        Ok((Some(self.norm.backward_input(x, &gc, &mut d)?), d))
    }
}
