//! Cross-entropy on logits split by vocabulary, fused: the full logits are never gathered.
//!
//! Rank `r` holds the logits of vocabulary entries `start .. start + n` for every row.
//! Per row, the loss `log Σ_v exp(l_v) − l_target` needs the maximum over all entries (for
//! a stable exponent), the sum of exponentials and the target's logit: one all-reduce of
//! the row maxima (max) and one of the partial sums and target logits together (sum), a
//! few numbers per row. The backward is local: `∂/∂l_v = softmax_v − [v = target]`, from
//! the `log Σ exp` kept by the forward. Columns past the real vocabulary (padding) take no
//! part: they get no probability and no gradient.
//!
//! With a group of one this is the ordinary fused cross-entropy (one pass forward, one
//! backward) instead of candle's log-softmax, gather and reductions.

use std::sync::{Mutex, PoisonError};

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use xccl::ReduceOp;

use super::Tp;
use crate::layers::ops::values;

/// `Σ mask · (−log softmax(logits)[target]) / norm` over the rows of `logits`
/// (`[rows, len, n]`, this rank's vocabulary entries `start .. start + n`, entries
/// `>= vocab` padding), with `targets` (`[rows, len]`, u32) and `mask` (`[rows, len]`,
/// f32). Every rank of the group gets the same scalar.
pub fn cross_entropy(
    tp: &Tp,
    logits: &Tensor,
    (start, vocab): (usize, usize),
    targets: &Tensor,
    mask: &Tensor,
    norm: f64,
) -> candle_core::Result<Tensor> {
    let n = logits.dim(candle_core::D::Minus1)?;
    let targets = targets.flatten_all()?.to_vec1::<u32>()?;
    let mask = mask.flatten_all()?.to_vec1::<f32>()?;
    if targets.len() * n != logits.elem_count() || mask.len() != targets.len() {
        candle_core::bail!(
            "cross-entropy: logits {:?} for {} targets and {} mask entries",
            logits.dims(),
            targets.len(),
            mask.len()
        );
    }
    if let Some(t) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("cross-entropy: target {t} outside the vocabulary of {vocab}");
    }
    let op = CrossEntropy {
        tp: tp.clone(),
        start,
        real: vocab.saturating_sub(start).min(n),
        targets,
        weights: mask.iter().map(|&m| (f64::from(m) / norm) as f32).collect(),
        lse: Mutex::new(Vec::new()),
    };
    logits.contiguous()?.apply_op1(op)
}

struct CrossEntropy {
    tp: Tp,
    start: usize,
    /// Columns of this rank that are real vocabulary entries (the rest is padding).
    real: usize,
    targets: Vec<u32>,
    /// mask / norm per row.
    weights: Vec<f32>,
    /// Per row, log Σ exp of the logits (kept for backward).
    lse: Mutex<Vec<f32>>,
}

impl CrossEntropy {
    fn local_target(&self, row: usize) -> Option<usize> {
        let t = self.targets[row] as usize;
        (t >= self.start && t < self.start + self.real).then(|| t - self.start)
    }
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "vocab-parallel-cross-entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(self.name(), s, l)?;
        let rows = self.targets.len();
        let n = x.len() / rows.max(1);
        let real = |row: usize| &x[row * n..row * n + self.real];
        let mut max: Vec<f32> =
            (0..rows).map(|r| real(r).iter().copied().fold(f32::NEG_INFINITY, f32::max)).collect();
        if let Some(c) = self.tp.comm() {
            c.all_reduce(&mut max, ReduceOp::Max).map_err(candle_core::Error::wrap)?;
        }
        // Sums of exponentials, then target logits (0 where another rank holds the target).
        let mut sums = vec![0.0f32; 2 * rows];
        for r in 0..rows {
            let m = max[r];
            sums[r] = real(r).iter().map(|&v| (v - m).exp()).sum();
            sums[rows + r] = self.local_target(r).map_or(0.0, |t| x[r * n + t]);
        }
        if let Some(c) = self.tp.comm() {
            c.all_reduce(&mut sums, ReduceOp::Sum).map_err(candle_core::Error::wrap)?;
        }
        let mut lse = Vec::with_capacity(rows);
        let mut total = 0.0f64;
        for r in 0..rows {
            let l = max[r] + sums[r].ln();
            lse.push(l);
            total += f64::from(self.weights[r]) * f64::from(l - sums[rows + r]);
        }
        *self.lse.lock().unwrap_or_else(PoisonError::into_inner) = lse;
        Ok((CpuStorage::F32(vec![total as f32]), Shape::from(())))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let g = grad.to_scalar::<f32>()?;
        let lse = self.lse.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let rows = self.targets.len();
        let values = x.flatten_all()?.to_vec1::<f32>()?;
        let n = values.len() / rows.max(1);
        let mut dx = vec![0.0f32; values.len()];
        for r in 0..rows {
            let w = g * self.weights[r];
            if w == 0.0 {
                continue;
            }
            let (row, out) = (&values[r * n..r * n + self.real], &mut dx[r * n..r * n + self.real]);
            for (o, &v) in out.iter_mut().zip(row) {
                *o = w * (v - lse[r]).exp();
            }
            if let Some(t) = self.local_target(r) {
                dx[r * n + t] -= w;
            }
        }
        Ok(Some(Tensor::from_vec(dx, x.dims(), x.device())?))
    }
}
