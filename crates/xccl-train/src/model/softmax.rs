//! Fused scaled causal softmax for attention scores, with its backward.
//!
//! candle's differentiable form, `softmax(scale · scores + mask)`, is five passes over the
//! scores forward (scale, mask add, max, exp and sum, divide) and about as many backward,
//! each allocating a fresh tensor. Here the forward is one pass per row (the row's maximum,
//! then its exponentials and their sum, then the division, all in cache) and the backward
//! another, and the masked upper triangle is never read: only columns `0..=i` of row `i`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use crate::layers::ops::{exp, same_len, values};
use crate::layers::par;

/// `softmax(scale · scores)` over the last dimension of `scores` `[.., t, t]`, with the
/// causal mask: row `i` keeps columns `0..=i`, and the masked columns are exactly 0.
///
/// The same as candle's `softmax(scale · scores + mask)` with `mask` 0 on and below the
/// diagonal and a large negative number above; the backward is
/// `dx = scale · y · (g − Σ g·y)` (per row), and 0 above the diagonal.
pub fn causal_softmax(scores: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax { scale: scale as f32 })
}

/// The gradient of [`causal_softmax`]'s input from its output `y` and that output's
/// gradient `gy`: `scale · y · (gy − Σ gy·y)` per row, 0 above the diagonal.
pub fn causal_softmax_grad(y: &Tensor, gy: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    y.contiguous()?.apply_op2_no_bwd(&gy.contiguous()?, &CausalSoftmaxGrad { scale: scale as f32 })
}

/// The side `t` of the square `[.., t, t]` matrices of `l`.
fn side(name: &str, l: &Layout) -> candle_core::Result<usize> {
    match l.dims() {
        [.., r, c] if r == c && *c > 0 => Ok(*c),
        d => candle_core::bail!("{name}: expected scores [.., t, t] with t >= 1, got {d:?}"),
    }
}

struct CausalSoftmax {
    scale: f32,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(self.name(), s, l)?;
        let t = side(self.name(), l)?;
        let scale = self.scale;
        // Rows of t: row r is row r mod t of its matrix, with columns 0..=r mod t.
        let y = par::rows(x.len() / t, t, |rows, y| {
            for r in rows {
                let i = r % t;
                let xr = &x[r * t..r * t + i + 1];
                // The maximum of scale·x is scale·max(x) for scale > 0, scale·min(x) otherwise.
                let m = xr.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(scale * v));
                let start = y.len();
                y.extend(xr.iter().map(|&v| exp(scale * v - m)));
                let inv = 1.0 / y[start..].iter().sum::<f32>();
                y[start..].iter_mut().for_each(|y| *y *= inv);
                y.extend(std::iter::repeat_n(0.0, t - i - 1));
            }
        });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(causal_softmax_grad(y, grad, f64::from(self.scale))?))
    }
}

/// `(y, g) -> scale · y · (g − Σ g·y)` row by row over the causal columns, 0 above them.
struct CausalSoftmaxGrad {
    scale: f32,
}

impl CustomOp2 for CausalSoftmaxGrad {
    fn name(&self) -> &'static str {
        "causal-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (y, g) = (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?);
        let t = side(self.name(), l1)?;
        same_len(self.name(), y, g)?;
        let scale = self.scale;
        let dx = par::rows(y.len() / t, t, |rows, dx| {
            for r in rows {
                let n = r % t + 1;
                let (yr, gr) = (&y[r * t..r * t + n], &g[r * t..r * t + n]);
                let dot: f32 = yr.iter().zip(gr).map(|(&y, &g)| y * g).sum();
                dx.extend(yr.iter().zip(gr).map(|(&y, &g)| scale * y * (g - dot)));
                dx.extend(std::iter::repeat_n(0.0, t - n));
            }
        });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{D, Device, Var};

    use super::*;

    fn tensor(shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(f).collect::<Vec<_>>(), shape, &Device::Cpu).unwrap()
    }

    /// candle's differentiable form: `softmax(scale · x + mask)`.
    fn reference(x: &Tensor, scale: f64) -> Tensor {
        let t = x.dim(D::Minus1).unwrap();
        let mask = tensor(&[t, t], |i| if i % t > i / t { -1e9 } else { 0.0 });
        candle_nn::ops::softmax(&(x * scale).unwrap().broadcast_add(&mask).unwrap(), D::Minus1).unwrap()
    }

    /// Largest difference relative to the largest magnitude of `q`.
    fn rel_diff(p: &Tensor, q: &Tensor) -> f32 {
        let d = (p - q).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let m = q.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        d / m.max(f32::MIN_POSITIVE)
    }

    fn check(shape: &[usize], scale: f64) {
        let x = tensor(shape, |i| ((i * 37 + 11) % 23) as f32 * 0.4 - 4.0);
        let (a, b) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&x).unwrap());
        let ya = causal_softmax(a.as_tensor(), scale).unwrap();
        let yb = reference(b.as_tensor(), scale);
        assert!(rel_diff(&ya, &yb) < 1e-6, "forward: {}", rel_diff(&ya, &yb));
        // Above the diagonal: exactly 0.
        let t = shape[shape.len() - 1];
        let v = ya.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().enumerate().all(|(k, &y)| (k % t <= (k / t) % t) || y == 0.0));
        let w = tensor(ya.dims(), |i| (i % 7) as f32 - 3.0);
        let ga = (ya * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (yb * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (ga, gb) = (ga.get(a.as_tensor()).unwrap(), gb.get(b.as_tensor()).unwrap());
        assert!(rel_diff(ga, gb) < 1e-6, "gradient: {}", rel_diff(ga, gb));
    }

    #[test]
    fn matches_candles_differentiable_softmax() {
        check(&[2, 3, 7, 7], 0.125);
        check(&[5, 5], 1.0);
        check(&[1, 1, 1, 1], 0.3);
        check(&[4, 11, 11], -0.5);
    }

    #[test]
    fn rejects_non_square_scores() {
        assert!(causal_softmax(&tensor(&[2, 3, 4], |i| i as f32), 1.0).is_err());
    }
}
