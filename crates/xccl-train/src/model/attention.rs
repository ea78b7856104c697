//! Causal multi-head attention on fused q/k/v projections, forward and backward.
//!
//! Forward, per head: `y = softmax(q·kᵀ/√dh, causal)·v`. It keeps `q`, `k`, `v` and the
//! attention weights `a` (what Megatron-LM's core attention keeps without flash
//! attention); backward, from the output's gradient `gy`:
//!
//! ```text
//! ga = gy·vᵀ    gv = aᵀ·gy    gs = softmax'(a, ga)    gq = gs·k    gk = gsᵀ·q
//! ```
//!
//! and the three gradients are laid back out as the fused projection's output was.

use candle_core::Tensor;

use super::softmax::{causal_softmax, causal_softmax_grad};

/// What the forward keeps for the backward.
pub struct Saved {
    /// `[b, heads, t, dh]` each.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention weights `[b, heads, t, t]`.
    att: Tensor,
    scale: f64,
}

impl Saved {
    /// The tensors it holds.
    pub fn tensors(&self) -> [&Tensor; 4] {
        [&self.q, &self.k, &self.v, &self.att]
    }
}

/// Attention over `qkv` `[b, t, 3·d]` (q, k and v of `heads` heads side by side, each
/// `d / heads` features): the output `[b, t, d]` and what the backward needs. On tensors
/// that track gradients the output does too (candle's autograd: the reference form).
pub fn forward(qkv: &Tensor, heads: usize) -> candle_core::Result<(Tensor, Saved)> {
    let (b, t, three_d) = qkv.dims3()?;
    let d = three_d / 3;
    let dh = d / heads.max(1);
    // [b, t, 3, heads, dh] -> [3, b, heads, t, dh]
    let qkv = qkv.reshape((b, t, 3, heads, dh))?.permute((2, 0, 3, 1, 4))?;
    let q = qkv.get(0)?.contiguous()?;
    let k = qkv.get(1)?.contiguous()?;
    let v = qkv.get(2)?.contiguous()?;
    let scale = 1.0 / (dh as f64).sqrt();
    // Scale, causal mask and softmax in one pass (candle's fused softmax has no backward).
    let att = causal_softmax(&q.matmul(&k.t()?)?, scale)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
    Ok((y, Saved { q, k, v, att, scale }))
}

/// The gradient of the forward's `qkv` from that of its output `gy` `[b, t, d]`.
pub fn backward(s: Saved, gy: &Tensor) -> candle_core::Result<Tensor> {
    let (b, heads, t, dh) = s.q.dims4()?;
    let gy = gy.reshape((b, t, heads, dh))?.transpose(1, 2)?.contiguous()?;
    let ga = gy.matmul(&s.v.t()?)?;
    let gv = s.att.t()?.matmul(&gy)?;
    let gs = causal_softmax_grad(&s.att, &ga, s.scale)?;
    let gq = gs.matmul(&s.k)?;
    let gk = gs.t()?.matmul(&s.q)?;
    // [3, b, heads, t, dh] -> [b, t, 3, heads, dh], the forward's permutation undone.
    Tensor::stack(&[gq, gk, gv], 0)?.permute((1, 3, 0, 2, 4))?.contiguous()?.reshape((b, t, 3 * heads * dh))
}
