//! The layers blocks are made of, below both the models (`model`) and tensor parallelism
//! (`tp`, whose column- and row-parallel layers are `Linear`s): seeded parameter
//! initialisation ([`Init`]), [`LayerNorm`], [`Linear`], the fused CPU kernels with their
//! backward ([`ops`]), and the split backward's pieces ([`grads`]).
//!
//! Each layer has two forms. `forward` (candle's [`Module`]) builds an autograd graph: the
//! reference the tests compare against. `apply` computes the same output without a graph,
//! and `backward_input` computes the gradient of the input from the output's gradient and
//! the input the caller saved, deferring the parameters' gradients ([`grads::Deferred`]).

pub mod grads;
pub mod ops;
pub mod par;

use candle_core::{Device, Module, Tensor, Var};
use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use crate::error::{Error, Result};
use crate::params::{Param, Shard};
use crate::product::{self, Matrix, Output};
use grads::{Deferred, linear_grad_input};

/// Creates parameters from a seeded generator, so every process builds identical ones
/// (candle's own random tensors on the CPU cannot be seeded).
pub struct Init {
    rng: ChaCha8Rng,
    device: Device,
}

impl Init {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Init {
        Init { rng: ChaCha8Rng::seed_from_u64(seed), device: Device::Cpu }
    }

    /// A parameter called `name` with elements drawn from N(0, `std`²).
    pub fn normal(&mut self, name: String, shape: &[usize], std: f32) -> Result<Param> {
        self.normal_sharded(name, shape, std, Shard::Replicated)
    }

    /// This rank's piece `shard` of a parameter of full shape `shape` drawn from N(0, `std`²):
    /// the whole tensor is drawn, as for the unsharded model, and the piece kept, so that the
    /// pieces of all ranks are exactly the unsharded parameter.
    pub fn normal_sharded(&mut self, name: String, shape: &[usize], std: f32, shard: Shard) -> Result<Param> {
        let normal = Normal::new(0.0f32, std)
            .map_err(|e| Error::config(format!("standard deviation {std} for {name}: {e}")))?;
        let n = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| normal.sample(&mut self.rng)).collect();
        self.param(name, shape, &values, shard)
    }

    /// A parameter called `name` with every element `value`.
    pub fn constant(&mut self, name: String, shape: &[usize], value: f32) -> Result<Param> {
        self.constant_sharded(name, shape, value, Shard::Replicated)
    }

    /// This rank's piece `shard` of a parameter of full shape `shape`, every element `value`
    /// (padding zero).
    pub fn constant_sharded(
        &mut self,
        name: String,
        shape: &[usize],
        value: f32,
        shard: Shard,
    ) -> Result<Param> {
        let values = vec![value; shape.iter().product()];
        self.param(name, shape, &values, shard)
    }

    fn param(&self, name: String, full: &[usize], values: &[f32], shard: Shard) -> Result<Param> {
        let local = shard.slice(full, values);
        let t = Tensor::from_vec(local, shard.local_shape(full), &self.device)?;
        Ok(Param::sharded(name, Var::from_tensor(&t)?, shard, full.to_vec()))
    }

    /// A linear layer `x W^T + b` from `inputs` to `outputs` features, its weight drawn
    /// from N(0, `std`²) and its bias zero; its parameters are pushed onto `params`.
    pub fn linear(
        &mut self,
        params: &mut Vec<Param>,
        name: &str,
        inputs: usize,
        outputs: usize,
        std: f32,
    ) -> Result<Linear> {
        let w = self.normal(format!("{name}.weight"), &[outputs, inputs], std)?;
        let b = self.constant(format!("{name}.bias"), &[outputs], 0.0)?;
        let layer = Linear::new(w.clone(), Some(b.clone()));
        params.extend([w, b]);
        Ok(layer)
    }

    /// A layer norm over `width` features (weight one, bias zero); its parameters are pushed
    /// onto `params`.
    pub fn layer_norm(&mut self, params: &mut Vec<Param>, name: &str, width: usize) -> Result<LayerNorm> {
        let w = self.constant(format!("{name}.weight"), &[width], 1.0)?;
        let b = self.constant(format!("{name}.bias"), &[width], 0.0)?;
        let norm = LayerNorm { weight: w.clone(), bias: b.clone() };
        params.extend([w, b]);
        Ok(norm)
    }
}

/// Layer normalisation over the last dimension ([`ops::layer_norm`]: candle-nn's fused
/// layer norm has no backward, and the parameters before it would silently get no gradient).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Param,
    bias: Param,
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        ops::layer_norm(x, &self.weight.tensor(), &self.bias.tensor())
    }
}

impl LayerNorm {
    /// The output for `x` without an autograd graph; its backward needs `x`.
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        ops::layer_norm(x, &self.weight.tensor().detach(), &self.bias.tensor().detach())
    }

    /// The gradient of the input `x` (as [`apply`](Self::apply) saw it) from the output's
    /// gradient `gy`; the weight's and bias's gradients go onto `deferred`.
    pub fn backward_input(
        &self,
        x: Tensor,
        gy: &Tensor,
        deferred: &mut Deferred,
    ) -> candle_core::Result<Tensor> {
        let gx = ops::layer_norm_grad_input(&x, &self.weight.tensor().detach(), gy)?;
        let (w, b, gy) = (self.weight.clone(), self.bias.clone(), gy.clone());
        deferred.push(move || {
            let (gw, gb) = ops::layer_norm_grad_params(&x, &gy)?;
            Ok(vec![(w, gw), (b, gb)])
        });
        Ok(gx)
    }
}

/// A linear layer over the last dimension, `x W^T (+ b)`, as one matrix product of the
/// flattened rows (no broadcast weight, whose gradient candle would have to reduce) and
/// [`ops::bias_add`] (which makes the product's transposed result contiguous).
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[outputs, inputs]`.
    weight: Param,
    bias: Option<Param>,
}

impl Linear {
    /// The layer with `weight` (`[outputs, inputs]`) and an optional `bias` (`[outputs]`).
    pub fn new(weight: Param, bias: Option<Param>) -> Linear {
        Linear { weight, bias }
    }

    /// The output for `x` without an autograd graph; its backward needs `x`. Computed as
    /// `b + x · Wᵀ` in one product whose output starts as the bias in every row, row-major
    /// as it comes out (the weight enters transposed, which the product reads in place).
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let weight = self.weight.tensor();
        let (outputs, inputs) = weight.dims2()?;
        let mut dims = x.dims().to_vec();
        let rows = x.elem_count() / inputs.max(1);
        let y = ops::with_values("a linear layer", x, |x| {
            ops::with_values("a linear layer", &weight, |w| {
                let (x, wt) = (Matrix::new(x, rows, inputs), Matrix::new(w, outputs, inputs).t());
                match &self.bias {
                    // The bias in every row first, the product added to it: no zeroed
                    // output and no separate pass for the bias.
                    Some(b) => ops::with_values("a linear layer", &b.tensor(), |b| {
                        let mut y = Vec::with_capacity(rows * outputs);
                        (0..rows).for_each(|_| y.extend_from_slice(b));
                        product::product_into(&mut y, x, wt, Output::Add)?;
                        Ok(y)
                    }),
                    None => product::product(x, wt),
                }
            })
        })?;
        if let Some(last) = dims.last_mut() {
            *last = outputs;
        }
        Tensor::from_vec(y, dims, x.device())
    }

    /// The gradient of the input from the output's gradient `gy`; the weight's and bias's
    /// gradients go onto `deferred`, computed from `gy` and the input `x()` returns then
    /// (the input [`apply`](Self::apply) saw, or a way to get it back: with sequence
    /// parallelism, gathering it again).
    pub fn backward_input(
        &self,
        gy: &Tensor,
        x: impl FnOnce() -> candle_core::Result<Tensor> + Send + 'static,
        deferred: &mut Deferred,
    ) -> candle_core::Result<Tensor> {
        let gx = linear_grad_input(gy, &self.weight.tensor().detach())?;
        deferred.push_product(self.weight.clone(), gy.clone(), x);
        if let Some(b) = &self.bias {
            let (b, gy) = (b.clone(), gy.clone());
            deferred.push(move || Ok(vec![(b, ops::column_sum(&gy)?)]));
        }
        Ok(gx)
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        product(&self.weight.tensor(), self.bias.as_ref().map(Param::tensor).as_ref(), x)
    }
}

/// `x Wᵀ (+ b)` over the last dimension of `x`.
fn product(weight: &Tensor, bias: Option<&Tensor>, x: &Tensor) -> candle_core::Result<Tensor> {
    let (outputs, inputs) = weight.dims2()?;
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / inputs.max(1);
    // (W · xᵀ)ᵀ rather than x · Wᵀ: the weight enters the product as it is, so candle's
    // backward produces its gradient `[outputs, inputs]` contiguous in one matrix product,
    // where a transposed weight would cost a zeroed buffer and a strided (transposing) add
    // of the weight's size per backward (candle accumulates every node's gradient).
    let y = weight.matmul(&x.reshape((rows, inputs))?.t()?)?.t()?;
    let y = match bias {
        Some(b) => ops::bias_add(&y, b)?,
        None => y,
    };
    if let Some(last) = dims.last_mut() {
        *last = outputs;
    }
    y.reshape(dims)
}
