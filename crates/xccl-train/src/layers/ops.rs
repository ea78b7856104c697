//! Fused CPU kernels, each with its backward: GELU, layer normalisation and bias addition.
//!
//! candle has the differentiable forms of all three, built from small tensor operations,
//! and on the CPU they dominated a training step. A profile of the default model showed
//! candle's `gelu` backward (a chain of about fifteen operations with two `powf` and a
//! `tanh` over the whole activation) and the gradient reductions of broadcast parameters
//! (bias and layer-norm weights: candle sums over leading dimensions with a division per
//! element) at over 60% of the step. Here each forward is one pass over the data, and each
//! backward one pass per gradient; rows are the last dimension, everything before it is
//! flattened. Each runs on the rank's threads ([`par`]).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};

use multiversion::multiversion;

use super::par;

/// √(2/π).
const K0: f32 = 0.797_884_6;
/// GELU's cubic coefficient.
const K1: f32 = 0.044_715;
/// Layer normalisation's ε.
const EPS: f32 = 1e-5;

/// `gelu(x)`, tanh approximation (GPT-2's, PyTorch's `approximate="tanh"`).
pub fn gelu(x: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(Gelu)
}

/// Layer normalisation of `x` over its last dimension, scaled by `weight` and shifted by
/// `bias` (both as long as that dimension), ε = 1e-5.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op3(weight, bias, LayerNorm)
}

/// `x + bias`, `bias` added to every row (last dimension) of `x`.
pub fn bias_add(x: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op2(bias, BiasAdd)
}

/// `gy · gelu'(x)`: the gradient of [`gelu`]'s input from that of its output.
pub fn gelu_grad(x: &Tensor, gy: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op2_no_bwd(&gy.contiguous()?, &GeluGrad)
}

/// The gradient of [`layer_norm`]'s input `x` from that of its output `gy`, with its
/// `weight`.
pub fn layer_norm_grad_input(x: &Tensor, weight: &Tensor, gy: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op3_no_bwd(&weight.contiguous()?, &gy.contiguous()?, &LayerNormGradInput)
}

/// The gradients of [`layer_norm`]'s weight and bias (`Σ gy·x̂` and `Σ gy` over the rows)
/// from its input `x` and the gradient of its output `gy`.
pub fn layer_norm_grad_params(x: &Tensor, gy: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let gwb = x.contiguous()?.apply_op2_no_bwd(&gy.contiguous()?, &LayerNormGradParams)?;
    Ok((gwb.get(0)?, gwb.get(1)?))
}

/// `Σ_rows g` over every dimension but the last: the gradient of a bias added to each row.
pub fn column_sum(g: &Tensor) -> candle_core::Result<Tensor> {
    g.contiguous()?.apply_op1_no_bwd(&ColumnSum)
}

/// The contiguous f32 values of a storage (every fused kernel's input check).
pub(crate) fn values<'a>(name: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((start, end))) => Ok(&v[start..end]),
        _ => candle_core::bail!("{name} takes contiguous f32 tensors on the CPU"),
    }
}

/// `f` of the contiguous f32 values of `t` (made contiguous first if it is not).
pub(crate) fn with_values<R>(
    name: &str,
    t: &Tensor,
    f: impl FnOnce(&[f32]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(s) = &*storage else {
        candle_core::bail!("{name} takes tensors on the CPU");
    };
    f(values(name, s, layout)?)
}

/// The row length (last dimension) of `l`, checked against a parameter of length `len`.
fn row_len(name: &str, l: &Layout, len: Option<usize>) -> candle_core::Result<usize> {
    let c = l.dims().last().copied().unwrap_or(1);
    match len {
        Some(n) if n != c => candle_core::bail!("{name}: rows of {c} features, parameter of {n}"),
        _ if c == 0 => candle_core::bail!("{name}: rows of no features"),
        _ => Ok(c),
    }
}

/// Checks that inputs and gradients have as many elements.
pub(crate) fn same_len(name: &str, x: &[f32], g: &[f32]) -> candle_core::Result<()> {
    if x.len() != g.len() {
        candle_core::bail!("{name}: {} inputs for {} gradients", x.len(), g.len());
    }
    Ok(())
}

fn f32s(v: Vec<f32>, shape: &Shape) -> (CpuStorage, Shape) {
    (CpuStorage::F32(v), shape.clone())
}

/// Appends `gelu(x)` for each of `x` to `out` (compiled also for AVX2 + FMA and AVX-512,
/// the one this CPU has chosen at run time: the exponentials are most of its time).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma"))]
fn gelu_rows(x: &[f32], out: &mut Vec<f32>) {
    push_map(out, x, |x| x * half_one_plus_tanh(x));
}

/// Appends `g · gelu'(x)` for each pair of `x` and `g` to `out` (as [`gelu_rows`]):
/// d/dx x·s(x) = s + x·s' with s = (1 + tanh u)/2, s' = 2·s·(1 − s)·du/dx.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma"))]
fn gelu_grad_rows(x: &[f32], g: &[f32], out: &mut Vec<f32>) {
    push_map2(out, x, g, |x, g| {
        let s = half_one_plus_tanh(x);
        g * (s + 2.0 * x * s * (1.0 - s) * K0 * (1.0 + 3.0 * K1 * x * x))
    });
}

/// Appends `f(a)` for each of `a` to `out`, written straight into its spare capacity in
/// one loop over slices (which the compiler vectorises in each target's clone).
#[inline(always)]
fn push_map(out: &mut Vec<f32>, a: &[f32], f: impl Fn(f32) -> f32) {
    out.reserve(a.len());
    let start = out.len();
    for (o, &v) in out.spare_capacity_mut()[..a.len()].iter_mut().zip(a) {
        o.write(f(v));
    }
    // SAFETY: the loop wrote each of the a.len() elements after the first `start`, and
    // `reserve` made room for them.
    unsafe { out.set_len(start + a.len()) };
}

/// Appends `f(a, b)` for each pair of `a` and `b` (of equal length) to `out`, as
/// [`push_map`].
#[inline(always)]
fn push_map2(out: &mut Vec<f32>, a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    let n = a.len().min(b.len());
    out.reserve(n);
    let start = out.len();
    for (o, (&x, &y)) in out.spare_capacity_mut()[..n].iter_mut().zip(a.iter().zip(b)) {
        o.write(f(x, y));
    }
    // SAFETY: the loop wrote each of the n elements after the first `start`, and
    // `reserve` made room for them.
    unsafe { out.set_len(start + n) };
}

/// `(1 + tanh(u)) / 2` with `u = √(2/π)·(x + 0.044715·x³)`, computed as the logistic
/// function of `2u`: one `exp` (libm's `tanhf` is several times slower), exact at both ends.
#[inline(always)]
fn half_one_plus_tanh(x: f32) -> f32 {
    1.0 / (1.0 + exp(-2.0 * K0 * (x + K1 * x * x * x)))
}

/// `eˣ` to within 2 ulp of libm's `expf` over the range where it is a normal number, in
/// straight-line arithmetic that the compiler vectorises (libm's is a call per element):
/// `eˣ = 2ⁿ·eʳ` with `n` the integer nearest `x·log₂e`, `r = x − n·ln 2` (in two parts, so
/// the reduction is exact to f32) and `eʳ` Cephes' degree-7 polynomial on |r| ≤ ln 2 / 2.
/// Below −87.3 it returns e⁻⁸⁷·³ (about 1.2·10⁻³⁸, not a subnormal), above 88 e⁸⁸ (about
/// 1.7·10³⁸, short of infinity): the kernels that use it divide by `1 + eˣ` or normalise
/// by a sum, where both ends are exact to f32.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer in f32 arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = p * r * r + r + 1.0;
    // 2ⁿ built from its exponent bits; n lies in [-126, 127], a normal power of two. t's
    // bits are those of 1.5·2²³ plus n (its unit in the last place is 1), so n + 127 comes
    // from integer arithmetic on them (a float-to-integer conversion would not vectorise:
    // Rust's `as` saturates).
    er * f32::from_bits(t.to_bits().wrapping_add(127u32.wrapping_sub(ROUND.to_bits())) << 23)
}

struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu-tanh"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(self.name(), s, l)?;
        let y = par::rows(x.len(), 1, |r, out| gelu_rows(&x[r], out));
        Ok(f32s(y, l.shape()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(gelu_grad(x, grad)?))
    }
}

/// `(x, g) -> g · gelu'(x)`.
struct GeluGrad;

impl CustomOp2 for GeluGrad {
    fn name(&self) -> &'static str {
        "gelu-tanh-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, g) = (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?);
        same_len(self.name(), x, g)?;
        let out = par::rows(x.len(), 1, |r, out| gelu_grad_rows(&x[r.clone()], &g[r], out));
        Ok(f32s(out, l1.shape()))
    }
}

/// Mean and 1/√(var + ε) of a row.
fn moments(row: &[f32]) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row, row, row, |v, _, _| v) / n;
    let var = lane_sum(row, row, row, |v, _, _| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + EPS).sqrt())
}

/// Lanes of [`lane_sum`]: independent partial sums, enough for the compiler to keep them
/// in vector registers (a single running sum is a chain of dependent additions).
const LANES: usize = 8;

/// `Σ f(a[i], b[i], c[i])` over the shortest of the three, in [`LANES`] interleaved
/// partial sums added in a fixed order at the end: vectorisable, and the same bits on
/// every run and thread count.
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut acc = [0.0f32; LANES];
    let chunks = a.chunks_exact(LANES).zip(b.chunks_exact(LANES)).zip(c.chunks_exact(LANES));
    for ((ca, cb), cc) in chunks {
        for (((s, &x), &y), &z) in acc.iter_mut().zip(ca).zip(cb).zip(cc) {
            *s += f(x, y, z);
        }
    }
    let full = n - n % LANES;
    let tail: f32 = (full..n).map(|i| f(a[i], b[i], c[i])).sum();
    let [s0, s1, s2, s3, s4, s5, s6, s7] = acc;
    ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)) + tail
}

struct LayerNorm;

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, b) =
            (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?, values(self.name(), s3, l3)?);
        let c = row_len(self.name(), l1, Some(w.len()))?;
        row_len(self.name(), l1, Some(b.len()))?;
        let y = par::rows(x.len() / c, c, |r, y| {
            for row in x[r.start * c..r.end * c].chunks_exact(c) {
                let (mean, rstd) = moments(row);
                y.extend(row.iter().zip(w).zip(b).map(|((&v, &w), &b)| (v - mean) * rstd * w + b));
            }
        });
        Ok(f32s(y, l1.shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let gx = layer_norm_grad_input(x, w, grad)?;
        let (gw, gb) = layer_norm_grad_params(x, grad)?;
        Ok((Some(gx), Some(gw), Some(gb)))
    }
}

/// `(x, w, g) -> dx = rstd · (ĝ - mean(ĝ) - x̂ · mean(ĝ·x̂))` with `ĝ = g·w`, row by row.
struct LayerNormGradInput;

impl CustomOp3 for LayerNormGradInput {
    fn name(&self) -> &'static str {
        "layer-norm-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w, g) =
            (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?, values(self.name(), s3, l3)?);
        let c = row_len(self.name(), l1, Some(w.len()))?;
        same_len(self.name(), x, g)?;
        let dx = par::rows(x.len() / c, c, |r, dx| {
            let span = r.start * c..r.end * c;
            for (row, grow) in x[span.clone()].chunks_exact(c).zip(g[span].chunks_exact(c)) {
                let (mean, rstd) = moments(row);
                let sum_g = lane_sum(grow, w, w, |g, w, _| g * w);
                let sum_gx = lane_sum(row, grow, w, |v, g, w| g * w * (v - mean) * rstd);
                let n = c as f32;
                let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
                dx.extend(
                    row.iter()
                        .zip(grow)
                        .zip(w)
                        .map(|((&v, &g), &w)| rstd * (g * w - mean_g - (v - mean) * rstd * mean_gx)),
                );
            }
        });
        Ok(f32s(dx, l1.shape()))
    }
}

/// `(x, g) -> [Σ_rows g·x̂, Σ_rows g]`, shape `[2, features]`.
struct LayerNormGradParams;

impl CustomOp2 for LayerNormGradParams {
    fn name(&self) -> &'static str {
        "layer-norm-grad-params"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, g) = (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?);
        let c = row_len(self.name(), l1, None)?;
        same_len(self.name(), x, g)?;
        let out = par::sum_rows(x.len() / c, c, 2 * c, |r, acc| {
            let (gw, gb) = acc.split_at_mut(c);
            let span = r.start * c..r.end * c;
            for (row, grow) in x[span.clone()].chunks_exact(c).zip(g[span].chunks_exact(c)) {
                let (mean, rstd) = moments(row);
                for (((gw, gb), &v), &g) in gw.iter_mut().zip(gb.iter_mut()).zip(row).zip(grow) {
                    *gw += g * (v - mean) * rstd;
                    *gb += g;
                }
            }
        });
        Ok(f32s(out, &Shape::from((2, c))))
    }
}

struct BiasAdd;

impl CustomOp2 for BiasAdd {
    fn name(&self) -> &'static str {
        "bias-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, b) = (values(self.name(), s1, l1)?, values(self.name(), s2, l2)?);
        let c = row_len(self.name(), l1, Some(b.len()))?;
        let y = par::rows(x.len() / c, c, |r, y| {
            for row in x[r.start * c..r.end * c].chunks_exact(c) {
                y.extend(row.iter().zip(b).map(|(&v, &b)| v + b));
            }
        });
        Ok(f32s(y, l1.shape()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(grad.clone()), Some(column_sum(grad)?)))
    }
}

/// `g -> Σ_rows g`, shape `[features]`.
struct ColumnSum;

impl CustomOp1 for ColumnSum {
    fn name(&self) -> &'static str {
        "column-sum"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let g = values(self.name(), s, l)?;
        let c = row_len(self.name(), l, None)?;
        let out = par::sum_rows(g.len() / c, c, c, |r, acc| {
            for row in g[r.start * c..r.end * c].chunks_exact(c) {
                acc.iter_mut().zip(row).for_each(|(a, &v)| *a += v);
            }
        });
        Ok(f32s(out, &Shape::from(c)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    fn tensor(n: usize, shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
        Tensor::from_vec((0..n).map(f).collect::<Vec<_>>(), shape, &Device::Cpu).unwrap()
    }

    fn var(t: &Tensor) -> Var {
        Var::from_tensor(&t.detach()).unwrap()
    }

    fn close(p: &Tensor, q: &Tensor) {
        let d = (p - q).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(d < 2e-5, "max difference {d}");
    }

    /// Forward and every input gradient of `ours` and `reference` (candle's differentiable
    /// forms) on the same inputs, weighted by a fixed tensor so gradients are not trivial.
    fn compare(
        inputs: &[Tensor],
        ours: impl Fn(&[Tensor]) -> Tensor,
        reference: impl Fn(&[Tensor]) -> Tensor,
    ) {
        let a: Vec<Var> = inputs.iter().map(var).collect();
        let b: Vec<Var> = inputs.iter().map(var).collect();
        let ya = ours(&a.iter().map(|v| v.as_tensor().clone()).collect::<Vec<_>>());
        let yb = reference(&b.iter().map(|v| v.as_tensor().clone()).collect::<Vec<_>>());
        close(&ya, &yb);
        let w = tensor(ya.elem_count(), ya.dims(), |i| (i % 7) as f32 - 3.0);
        let ga = (ya * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (yb * &w).unwrap().sum_all().unwrap().backward().unwrap();
        for (va, vb) in a.iter().zip(&b) {
            close(ga.get(va.as_tensor()).unwrap(), gb.get(vb.as_tensor()).unwrap());
        }
    }

    /// The vectorised `exp` against libm's over the whole range it serves, within 2 ulp,
    /// and at its clamps.
    #[test]
    fn exp_is_within_two_ulp_of_libms() {
        let mut worst = 0.0f32;
        for i in 0..=2_000_000 {
            let x = -87.0 + 175.0 * i as f32 / 2_000_000.0;
            let x = x.min(88.0);
            let (got, want) = (exp(x), x.exp());
            let ulp = f32::from_bits(want.to_bits() + 1) - want;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert!(exp(-200.0) > 0.0 && exp(-200.0) < 1.3e-38);
        assert!(exp(200.0).is_finite() && exp(200.0) > 1.6e38);
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn gelu_matches_candles() {
        let x = tensor(80, &[8, 10], |i| (i as f32 - 40.0) * 0.15);
        compare(&[x], |v| gelu(&v[0]).unwrap(), |v| v[0].gelu().unwrap());
    }

    #[test]
    fn layer_norm_matches_candles_differentiable_form() {
        let x = tensor(60, &[2, 5, 6], |i| ((i * 37) % 11) as f32 * 0.3 - 1.0);
        let w = tensor(6, &[6], |i| 1.0 + 0.1 * i as f32);
        let b = tensor(6, &[6], |i| 0.05 * i as f32);
        compare(
            &[x, w, b],
            |v| layer_norm(&v[0], &v[1], &v[2]).unwrap(),
            |v| candle_nn::ops::layer_norm_slow(&v[0], &v[1], &v[2], EPS).unwrap(),
        );
    }

    #[test]
    fn bias_add_matches_broadcast_add() {
        let x = tensor(24, &[2, 3, 4], |i| i as f32 * 0.5);
        let b = tensor(4, &[4], |i| i as f32 - 1.5);
        compare(&[x, b], |v| bias_add(&v[0], &v[1]).unwrap(), |v| v[0].broadcast_add(&v[1]).unwrap());
        let bad = tensor(3, &[3], |i| i as f32);
        assert!(bias_add(&tensor(24, &[2, 3, 4], |i| i as f32), &bad).is_err());
    }
}
