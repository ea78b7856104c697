//! The [`Block`] trait, and token ids as a first block's input. The layers blocks are made
//! of are in [`crate::layers`] (re-exported here).

use std::any::Any;

use candle_core::{DType, Device, Tensor, Var};

use crate::error::Result;
pub use crate::layers::grads::Deferred;
pub use crate::layers::{Init, LayerNorm, Linear};
use crate::params::Param;

/// The bytes of `tensors`' elements.
fn bytes_of(tensors: &[&Tensor]) -> usize {
    tensors.iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
}

/// A value made of tensors (what a layer saves), listed so their bytes can be counted.
pub trait Holds {
    /// The tensors it holds.
    fn tensors(&self) -> Vec<&Tensor>;
}

/// What a block's [`forward_saved`](Block::forward_saved) keeps for its backward: a value
/// of the block's own type, which only its [`backward_input`](Block::backward_input) reads,
/// and the bytes of the tensors it holds (the activation memory a forward keeps).
pub struct Saved {
    value: Box<dyn Any + Send + Sync>,
    bytes: usize,
}

impl Saved {
    /// `value`, which holds the tensors `tensors` (their bytes are counted).
    pub fn new<T: Any + Send + Sync>(value: T, tensors: &[&Tensor]) -> Saved {
        Saved { value: Box::new(value), bytes: bytes_of(tensors) }
    }

    /// `value`, which holds the tensors its `tensors` method lists.
    pub fn of<T: Holds + Any + Send + Sync>(value: T) -> Saved {
        let bytes = bytes_of(&value.tensors());
        Saved { value: Box::new(value), bytes }
    }

    /// The bytes of the tensors it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One stage of a model: a function of one input tensor with its own parameters.
///
/// A model runs its blocks in sequence, each in one of two forms:
///
/// - [`forward`](Block::forward) builds candle's autograd graph: the reference
///   ([`Graph::Whole`](super::Graph::Whole)) every other form is tested against;
/// - [`forward_saved`](Block::forward_saved) (training, and inference) builds no graph and
///   returns what the block's
///   own backward needs; [`backward_input`](Block::backward_input) then computes the gradient
///   of the input from that of the output, right away, and returns the weights' gradients
///   as [`Deferred`] work that a schedule may run at once or later (zero-bubble pipelines).
///   What is saved holds no parameter, so parameters may be freed between a block's
///   forward and its backward (ZeRO stage 3).
///
/// Blocks run one at a time, so data parallelism starts communicating a block's gradients
/// while earlier blocks are still in backward. A block that does not write its backward
/// out gets one from candle's autograd (the default methods): correct, but its weights'
/// gradients are computed with its input's and its graph keeps its parameters alive.
pub trait Block: Send + Sync {
    /// The block's name (the prefix of its parameters' names).
    fn name(&self) -> &str;
    /// The block's output for input `x`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor>;
    /// The parameters this block owns.
    fn params(&self) -> &[Param];
    /// Parameters owned by an earlier block that this block uses too (a tied output head
    /// uses the token embedding): their gradient is the sum of both blocks' contributions.
    fn shared(&self) -> &[Param] {
        &[]
    }
    /// The output for input `x` without an autograd graph, and what the backward needs.
    /// Default: [`forward`](Block::forward) on a leaf copy of `x`, keeping the graph.
    fn forward_saved(&self, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
        autograd_forward(self, x)
    }
    /// From what [`forward_saved`](Block::forward_saved) saved and the gradient `grad` of
    /// the output: the gradient of the input (`None` for token ids) and the parameters'
    /// gradients, deferred. Default: candle's backward through the saved graph.
    fn backward_input(&self, saved: Saved, grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Deferred)> {
        autograd_backward(self, saved, grad)
    }
}

/// The graph a block's default [`Block::forward_saved`] keeps.
struct AutogradSaved {
    /// The leaf input (`None`: token ids).
    input: Option<Var>,
    output: Tensor,
    /// Each parameter the block uses with the tensor its forward read (the parameter may
    /// hold another by the time backward runs).
    params: Vec<(Param, Tensor)>,
}

fn autograd_forward<B: Block + ?Sized>(block: &B, x: &Tensor) -> candle_core::Result<(Tensor, Saved)> {
    let input = if x.dtype() == DType::U32 { None } else { Some(Var::from_tensor(&x.detach())?) };
    // Candle's autograd computes gradients of variables only (a lent view is not one).
    for p in block.params().iter().chain(block.shared()) {
        p.make_variable().map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    }
    let params = block.params().iter().chain(block.shared()).map(|p| (p.clone(), p.tensor())).collect();
    let output = block.forward(input.as_ref().map_or(x, Var::as_tensor))?;
    // Counted: the input and the output; the graph between them holds more.
    let bytes = bytes_of(&[input.as_ref().map_or(x, Var::as_tensor), &output]);
    let detached = output.detach();
    let value = Box::new(AutogradSaved { input, output, params });
    Ok((detached, Saved { value, bytes }))
}

/// The saved value of `block`'s forward, as type `T`.
pub(crate) fn saved_as<T: 'static, B: Block + ?Sized>(block: &B, saved: Saved) -> candle_core::Result<T> {
    match saved.value.downcast::<T>() {
        Ok(s) => Ok(*s),
        Err(_) => candle_core::bail!("{}: backward given what another block's forward saved", block.name()),
    }
}

fn autograd_backward<B: Block + ?Sized>(
    block: &B,
    saved: Saved,
    grad: &Tensor,
) -> candle_core::Result<(Option<Tensor>, Deferred)> {
    let s: AutogradSaved = saved_as(block, saved)?;
    let store = (s.output * grad)?.sum_all()?.backward()?;
    let got = |t: &Tensor, what: &str| match store.get(t) {
        Some(g) => Ok(g.clone()),
        None => candle_core::bail!("{}: {what} received no gradient", block.name()),
    };
    let below = s.input.map(|v| got(v.as_tensor(), "the input")).transpose()?;
    let grads = s.params.into_iter().map(|(p, t)| {
        let g = got(&t, p.name())?;
        Ok((p, g))
    });
    Ok((below, Deferred::ready(grads.collect::<candle_core::Result<_>>()?)))
}

/// Token ids as a `[rows, len]` tensor.
pub fn ids_tensor(ids: &[u32], rows: usize, len: usize) -> Result<Tensor> {
    Ok(Tensor::from_slice(ids, (rows, len), &Device::Cpu)?)
}

/// Checks that the input of a first block is a `[rows, len]` tensor of token ids.
pub(crate) fn expect_ids(block: &str, x: &Tensor, context: usize) -> candle_core::Result<(usize, usize)> {
    let (b, t) = x.dims2()?;
    if x.dtype() != DType::U32 || t > context {
        candle_core::bail!(
            "{block}: expected [rows, len <= {context}] u32 token ids, got {:?} {:?}",
            x.dims(),
            x.dtype()
        );
    }
    Ok((b, t))
}
