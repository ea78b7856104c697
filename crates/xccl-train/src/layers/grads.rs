//! The split backward's pieces: the gradient of a linear layer's input, and [`Deferred`],
//! the weight-gradient half of a backward kept for later (a weight's gradient handed over as
//! a [`Grad::Product`]).
//!
//! A layer's backward is two computations with different deadlines. The gradient of its
//! input (B) is on the critical path: the layer below, and in a pipeline the previous
//! stage, waits for it. The gradients of its weights (W) are needed only by the optimiser,
//! so a schedule may run them later, in a bubble (zero-bubble pipelines). A layer's
//! `backward_input` computes B and pushes W onto a [`Deferred`] as a closure over exactly
//! the tensors W needs (the layer's saved input and its output's gradient), never over the
//! weights themselves: once B has run, the weights may be freed (ZeRO stage 3).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use xccl_train::layers::grads::linear_grad_input;
//! use xccl_train::params::Grad;
//!
//! # fn main() -> candle_core::Result<()> {
//! // y = x·Wᵀ with x [2, 3], W [4, 3]: gx = gy·W, gW = gyᵀ·x.
//! let x = Tensor::arange(0f32, 6.0, &Device::Cpu)?.reshape((2, 3))?;
//! let w = Tensor::ones((4, 3), candle_core::DType::F32, &Device::Cpu)?;
//! let gy = Tensor::ones((2, 4), candle_core::DType::F32, &Device::Cpu)?;
//! assert_eq!(linear_grad_input(&gy, &w)?.to_vec2::<f32>()?, [[4.0; 3], [4.0; 3]]);
//! let gw = Grad::Product { gy, x }.tensor()?;
//! assert_eq!(gw.to_vec2::<f32>()?[0], [3.0, 5.0, 7.0]);
//! # Ok(())
//! # }
//! ```

use candle_core::Tensor;

use crate::params::{Grad, Param};
use crate::product::{Matrix, product};

use super::ops;

/// Work that computes the gradients of some parameters.
type Compute = Box<dyn FnOnce() -> candle_core::Result<Vec<(Param, Tensor)>> + Send>;

/// Work that gives a layer's input back (the input itself, or gathered again).
type Input = Box<dyn FnOnce() -> candle_core::Result<Tensor> + Send>;

/// One deferred piece of weight-gradient work.
enum Work {
    /// Computes the gradients of some parameters.
    Compute(Compute),
    /// A linear layer's weight: `gyᵀ·x` with the input `x()` returns then.
    Product { param: Param, gy: Tensor, x: Input },
}

/// The weight-gradient half (W) of one or more layers' backward, kept until a schedule
/// runs it.
#[derive(Default)]
pub struct Deferred {
    work: Vec<Work>,
}

impl Deferred {
    /// Nothing deferred yet.
    pub fn new() -> Deferred {
        Deferred::default()
    }

    /// Defers `work`, which computes the gradients of some parameters.
    pub fn push(
        &mut self,
        work: impl FnOnce() -> candle_core::Result<Vec<(Param, Tensor)>> + Send + 'static,
    ) {
        self.work.push(Work::Compute(Box::new(work)));
    }

    /// Defers the gradient of a linear layer's weight `param`: `gyᵀ·x()`, where `x()` gives
    /// the layer's input when the work runs (with sequence parallelism, gathering it).
    pub fn push_product(
        &mut self,
        param: Param,
        gy: Tensor,
        x: impl FnOnce() -> candle_core::Result<Tensor> + Send + 'static,
    ) {
        self.work.push(Work::Product { param, gy, x: Box::new(x) });
    }

    /// Gradients already computed (a backward that cannot split its weight half).
    pub fn ready(grads: Vec<(Param, Tensor)>) -> Deferred {
        let mut d = Deferred::new();
        d.push(move || Ok(grads));
        d
    }

    /// Appends `other`'s work after this one's.
    pub fn extend(&mut self, other: Deferred) {
        self.work.extend(other.work);
    }

    /// Runs every piece of work: each parameter's gradient (a parameter that several
    /// layers use appears once per use); a weight's product is left for the caller to
    /// store ([`Grad::Product`]).
    pub fn run(self) -> candle_core::Result<Vec<(Param, Grad)>> {
        let mut out = Vec::new();
        for w in self.work {
            match w {
                Work::Compute(f) => out.extend(f()?.into_iter().map(|(p, t)| (p, Grad::Tensor(t)))),
                Work::Product { param, gy, x } => out.push((param, Grad::Product { gy, x: x()? })),
            }
        }
        Ok(out)
    }
}

/// The gradient of a linear layer's input: `gy · W` for `gy` `[.., outputs]` and `W`
/// `[outputs, inputs]`, shaped `[.., inputs]`.
pub fn linear_grad_input(gy: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let (outputs, inputs) = weight.dims2()?;
    let mut dims = gy.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = inputs;
    }
    let n = gy.elem_count() / outputs.max(1);
    let gx = ops::with_values("a linear layer's backward", gy, |gy| {
        ops::with_values("a linear layer's backward", weight, |w| {
            product(Matrix::new(gy, n, outputs), Matrix::new(w, outputs, inputs))
        })
    })?;
    Tensor::from_vec(gx, dims, gy.device())
}
