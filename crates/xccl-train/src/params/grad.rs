//! [`Grad`]: a parameter's gradient as a backward hands it over, stored straight into a
//! gradient buffer: added, or written over what the buffer held.

use candle_core::{CpuStorage, Layout, Tensor};

use crate::product::{Matrix, Output, product_into};

/// A parameter's gradient as a backward hands it over: computed, or the product of a
/// linear layer's weight, `gyᵀ·x`, left to whoever stores it, which computes it straight
/// into its gradient buffer ([`Grad::add_to`], [`Grad::write_to`]: no tensor of its own, no
/// separate add).
#[derive(Clone, Debug)]
pub enum Grad {
    /// The gradient.
    Tensor(Tensor),
    /// `gyᵀ·x` summed over the rows of `gy` (`[.., outputs]`) and `x` (`[.., inputs]`):
    /// `[outputs, inputs]`.
    Product {
        /// The gradient of the layer's output.
        gy: Tensor,
        /// The layer's input.
        x: Tensor,
    },
}

impl Grad {
    /// The gradient as a tensor (a product is computed).
    pub fn tensor(&self) -> candle_core::Result<Tensor> {
        match self {
            Grad::Tensor(t) => Ok(t.clone()),
            Grad::Product { gy, x } => product(gy, x),
        }
    }

    /// Adds the gradient to `dst`, its row-major elements.
    pub fn add_to(&self, dst: &mut [f32]) -> candle_core::Result<()> {
        self.store(dst, Output::Add)
    }

    /// Writes the gradient over `dst`, its row-major elements (what `dst` held is never
    /// read).
    pub fn write_to(&self, dst: &mut [f32]) -> candle_core::Result<()> {
        self.store(dst, Output::Overwrite)
    }

    fn store(&self, dst: &mut [f32], how: Output) -> candle_core::Result<()> {
        match self {
            Grad::Tensor(t) => {
                let t = t.contiguous()?;
                let (storage, layout) = t.storage_and_layout();
                let candle_core::Storage::Cpu(s) = &*storage else {
                    candle_core::bail!("gradients are CPU tensors");
                };
                let v = values(s, layout)?;
                if v.len() != dst.len() {
                    candle_core::bail!("a gradient of {} elements stored in {}", v.len(), dst.len());
                }
                match how {
                    Output::Add => dst.iter_mut().zip(v).for_each(|(d, &g)| *d += g),
                    Output::Overwrite => dst.copy_from_slice(v),
                }
                Ok(())
            }
            Grad::Product { gy, x } => {
                let (gy, x) = (rows(&gy.contiguous()?)?, rows(&x.contiguous()?)?);
                let (gs, gl) = gy.storage_and_layout();
                let (xs, xl) = x.storage_and_layout();
                let (candle_core::Storage::Cpu(gs), candle_core::Storage::Cpu(xs)) = (&*gs, &*xs) else {
                    candle_core::bail!("gradients are CPU tensors");
                };
                let (n, m) = gy.dims2()?;
                let k = x.dim(1)?;
                let (gy, x) = (values(gs, gl)?, values(xs, xl)?);
                product_into(dst, Matrix::new(gy, n, m).t(), Matrix::new(x, n, k), how)
            }
        }
    }
}

/// `x` `[.., inputs]` as rows `[rows, inputs]`.
fn rows(x: &Tensor) -> candle_core::Result<Tensor> {
    let c = x.dims().last().copied().unwrap_or(1);
    x.reshape((x.elem_count() / c.max(1), c))
}

/// `gyᵀ·x` summed over the rows of `gy` (`[.., m]`) and `x` (`[.., k]`): `[m, k]`, the
/// gradient of a linear layer's weight.
pub fn product(gy: &Tensor, x: &Tensor) -> candle_core::Result<Tensor> {
    rows(&gy.contiguous()?)?.t()?.matmul(&rows(&x.contiguous()?)?)
}

/// The contiguous f32 values of a CPU storage.
fn values<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((start, end))) => Ok(&v[start..end]),
        _ => candle_core::bail!("gradients are contiguous f32 tensors on the CPU"),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// A weight's gradient added in place into a buffer holding something already, against
    /// a naive triple loop, and the same as computing the tensor and adding it; on 1 and 2
    /// threads, for a row count and widths the kernel cuts unevenly.
    #[test]
    fn products_accumulate_in_place_as_the_naive_sum() {
        let (n, m, k) = (37, 13, 29);
        let gy: Vec<f32> = (0..n * m).map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0).collect();
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 13) as f32 * 0.5 - 3.0).collect();
        let before: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.01).collect();
        let mut naive = before.clone();
        for r in 0..n {
            for i in 0..m {
                for j in 0..k {
                    naive[i * k + j] += gy[r * m + i] * x[r * k + j];
                }
            }
        }
        let grad = Grad::Product {
            gy: Tensor::from_vec(gy.clone(), (n, m), &Device::Cpu).unwrap(),
            x: Tensor::from_vec(x.clone(), (n, k), &Device::Cpu).unwrap(),
        };
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut dst = before.clone();
            pool.install(|| grad.add_to(&mut dst)).unwrap();
            for (a, b) in dst.iter().zip(&naive) {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{threads} threads: {a} against {b}");
            }
            let mut via_tensor = before.clone();
            Grad::Tensor(grad.tensor().unwrap()).add_to(&mut via_tensor).unwrap();
            for (a, b) in via_tensor.iter().zip(&naive) {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "tensor: {a} against {b}");
            }
        }
        // Written over a buffer holding anything: the product alone, either form.
        for g in [grad.clone(), Grad::Tensor(grad.tensor().unwrap())] {
            let mut over = vec![f32::NAN; m * k];
            g.write_to(&mut over).unwrap();
            for ((a, b), was) in over.iter().zip(&naive).zip(&before) {
                let want = b - was;
                assert!((a - want).abs() <= 1e-4 * want.abs().max(1.0), "written: {a} against {want}");
            }
        }
        // A buffer of the wrong size is refused, not written past.
        assert!(grad.add_to(&mut vec![0.0; m * k - 1]).is_err());
        assert!(grad.write_to(&mut vec![0.0; m * k + 1]).is_err());
    }
}
