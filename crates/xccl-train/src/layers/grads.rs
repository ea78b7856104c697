//! The split backward's pieces: the products of a linear layer's gradients, and
//! [`Deferred`], the weight-gradient half of a backward kept for later.
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
//! use xccl_train::layers::grads::{linear_grad_input, linear_grad_weight};
//!
//! # fn main() -> candle_core::Result<()> {
//! // y = x·Wᵀ with x [2, 3], W [4, 3]: gx = gy·W, gW = gyᵀ·x.
//! let x = Tensor::arange(0f32, 6.0, &Device::Cpu)?.reshape((2, 3))?;
//! let w = Tensor::ones((4, 3), candle_core::DType::F32, &Device::Cpu)?;
//! let gy = Tensor::ones((2, 4), candle_core::DType::F32, &Device::Cpu)?;
//! assert_eq!(linear_grad_input(&gy, &w)?.to_vec2::<f32>()?, [[4.0; 3], [4.0; 3]]);
//! assert_eq!(linear_grad_weight(&gy, &x)?.to_vec2::<f32>()?[0], [3.0, 5.0, 7.0]);
//! # Ok(())
//! # }
//! ```

use candle_core::Tensor;

use crate::params::Param;

/// One deferred piece of weight-gradient work: the gradients it yields, by parameter.
type Work = Box<dyn FnOnce() -> candle_core::Result<Vec<(Param, Tensor)>> + Send>;

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
        self.work.push(Box::new(work));
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
    /// layers use appears once per use).
    pub fn run(self) -> candle_core::Result<Vec<(Param, Tensor)>> {
        let mut out = Vec::new();
        for w in self.work {
            out.extend(w()?);
        }
        Ok(out)
    }
}

/// `x` `[.., inputs]` as rows `[rows, inputs]`.
fn rows(x: &Tensor) -> candle_core::Result<Tensor> {
    let c = x.dims().last().copied().unwrap_or(1);
    x.reshape((x.elem_count() / c.max(1), c))
}

/// The gradient of a linear layer's input: `gy · W` for `gy` `[.., outputs]` and `W`
/// `[outputs, inputs]`, shaped `[.., inputs]`.
pub fn linear_grad_input(gy: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let (_, inputs) = weight.dims2()?;
    let mut dims = gy.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = inputs;
    }
    rows(&gy.contiguous()?)?.matmul(weight)?.reshape(dims)
}

/// The gradient of a linear layer's weight: `gyᵀ · x` summed over every row, for `gy`
/// `[.., outputs]` and its input `x` `[.., inputs]`: `[outputs, inputs]`.
pub fn linear_grad_weight(gy: &Tensor, x: &Tensor) -> candle_core::Result<Tensor> {
    rows(&gy.contiguous()?)?.t()?.matmul(&rows(&x.contiguous()?)?)
}
