//! A multi-layer perceptron language model (Bengio et al. style): at every position the
//! embeddings of the last `context` tokens (zero before the start) are concatenated and go
//! through `layers` hidden layers of `width` units (GELU) to the logits of the next token.
//!
//! Blocks: `embed` (embedding and the causal window), `h00` … `hNN`, `head`. The hidden
//! layers and the head write their backward out; the window's comes from candle's autograd
//! (the [`Block`] default), so both kinds meet in every run.

use candle_core::{Module, Tensor};

use super::ModelConfig;
use super::block::{Block, Deferred, Init, Linear, Saved, expect_ids, saved_as};
use crate::error::{Error, Result};
use crate::layers::ops::{gelu, gelu_grad};
use crate::params::Param;

/// Embedding features per token: a quarter of the hidden width (at least 4).
pub fn embed_width(cfg: &ModelConfig) -> usize {
    (cfg.width / 4).max(4)
}

/// Builds the blocks of an MLP for `cfg`, handing each to `emit` in order.
pub fn build(
    cfg: &ModelConfig,
    init: &mut Init,
    emit: &mut dyn FnMut(Box<dyn Block>) -> Result<()>,
) -> Result<()> {
    if cfg.tied {
        return Err(Error::config("--tied applies to --model gpt only (the MLP's head reads hidden units)"));
    }
    if cfg.layers == 0 {
        return Err(Error::config("--model mlp needs --layers >= 1"));
    }
    let e = embed_width(cfg);
    let tok = init.normal("embed.tok".into(), &[cfg.vocab, e], 1.0)?;
    emit(Box::new(Window { tok: tok.clone(), params: vec![tok], context: cfg.context }))?;
    let mut inputs = cfg.context * e;
    for l in 0..cfg.layers {
        let name = format!("h{l:02}");
        let mut params = Vec::new();
        let std = (1.0 / inputs as f32).sqrt();
        let linear = init.linear(&mut params, &format!("{name}.fc"), inputs, cfg.width, std)?;
        emit(Box::new(Hidden { name, linear, params }))?;
        inputs = cfg.width;
    }
    let mut params = Vec::new();
    let linear = init.linear(&mut params, "head.out", inputs, cfg.vocab, (1.0 / inputs as f32).sqrt())?;
    emit(Box::new(Output { linear, params }))
}

/// Ids `[rows, len]` to `[rows, len, context * embed]`: position `t` holds the embeddings of
/// tokens `t - context + 1 ..= t`, oldest first.
struct Window {
    tok: Param,
    params: Vec<Param>,
    context: usize,
}

impl Block for Window {
    fn name(&self) -> &str {
        "embed"
    }

    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = expect_ids("embed", ids, self.context)?;
        let tok = self.tok.tensor();
        let e = tok.dim(1)?;
        let emb = tok.index_select(&ids.flatten_all()?, 0)?.reshape((b, t, e))?;
        let n = self.context;
        let padded = if n > 1 {
            Tensor::cat(&[&Tensor::zeros((b, n - 1, e), emb.dtype(), emb.device())?, &emb], 1)?
        } else {
            emb
        };
        let views = (0..n).map(|j| padded.narrow(1, j, t)).collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&views, 2)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }
}

/// One hidden layer: `gelu(x W^T + b)`.
struct Hidden {
    name: String,
    linear: Linear,
    params: Vec<Param>,
}

impl Block for Hidden {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        gelu(&self.linear.forward(x)?)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn forward_saved(&self, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        let f = self.linear.apply(x)?;
        Ok((gelu(&f)?, Saved::new((x.clone(), f.clone()), &[x, &f])))
    }

    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        let (x, f): (Tensor, Tensor) = saved_as(self, saved)?;
        let mut d = Deferred::new();
        let gx = self.linear.backward_input(&gelu_grad(&f, grad)?, move || Ok(x), &mut d)?;
        Ok((Some(gx), d))
    }
}

/// The output layer: logits of the next token.
struct Output {
    linear: Linear,
    params: Vec<Param>,
}

impl Block for Output {
    fn name(&self) -> &str {
        "head"
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.linear.forward(x)
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn forward_saved(&self, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        Ok((self.linear.apply(x)?, Saved::new(x.clone(), &[x])))
    }

    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        let x: Tensor = saved_as(self, saved)?;
        let mut d = Deferred::new();
        let gx = self.linear.backward_input(grad, move || Ok(x), &mut d)?;
        Ok((Some(gx), d))
    }
}
