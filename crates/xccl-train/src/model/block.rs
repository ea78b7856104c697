//! The [`Block`] trait, and token ids as a first block's input. The layers blocks are made
//! of are in [`crate::layers`] (re-exported here).

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
pub use crate::layers::{Init, LayerNorm, Linear};
use crate::params::Param;

/// One stage of a model: a function of one input tensor with its own parameters.
///
/// A model runs its blocks in sequence. Each block's forward gets a *leaf* input (a fresh
/// variable detached from the previous block), so the backward of one block can run on its
/// own once the gradient of its output is known: that is what lets data parallelism start
/// communicating a block's gradients while earlier blocks are still in backward.
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
