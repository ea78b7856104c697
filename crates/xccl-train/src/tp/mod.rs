//! Tensor parallelism (Megatron-LM) and sequence parallelism on candle tensors.
//!
//! A layer too large for one rank is cut inside: [`ColumnParallelLinear`] holds a slice of
//! the output features, [`RowParallelLinear`] a slice of the input features, attention a
//! subset of the heads, [`VocabParallelEmbedding`] a contiguous range of the vocabulary,
//! and [`cross_entropy`] computes the loss on logits that stay split by vocabulary. The
//! communication is four autograd operations on the tensor-parallel communicator
//! ([`comm`]): `f` (identity forward, all-reduce backward), `g` (all-reduce forward,
//! identity backward), and for sequence parallelism all-gather forward / reduce-scatter
//! backward along the sequence and the reverse. Layers receive a [`Tp`] handle (the
//! reducer is injected, the layers never see sockets); with a group of one every operation
//! is the identity and the layers are the plain ones.
//!
//! Each rank's parameters are exact pieces of the unsharded model's ([`Shard`]):
//! initialisation draws the full tensor from the same seeded stream and keeps this rank's
//! piece, so tp = 1 and tp = k start from the same point, and checkpoints hold the full
//! tensors.
//!
//! [`Shard`]: crate::params::Shard

pub mod comm;
mod cross_entropy;
mod layers;

use xccl::{Communicator, ReduceOp};

pub use cross_entropy::cross_entropy;
pub use layers::{ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding};

use crate::error::{Error, Result};
use crate::params::{ParamSet, Shard};

/// A rank's place in its tensor-parallel group, and whether sequence parallelism is on.
#[derive(Clone, Debug)]
pub struct Tp {
    /// `None` for a group of one (no communication at all).
    comm: Option<Communicator>,
    sp: bool,
}

impl Tp {
    /// No tensor parallelism: a group of one.
    pub fn none() -> Tp {
        Tp { comm: None, sp: false }
    }

    /// The group of `comm`; `sp` turns sequence parallelism on (ignored for a group of one).
    pub fn new(comm: Communicator, sp: bool) -> Tp {
        if comm.size() == 1 { Tp::none() } else { Tp { comm: Some(comm), sp } }
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, Communicator::rank)
    }

    /// The group's size.
    pub fn size(&self) -> usize {
        self.comm.as_ref().map_or(1, Communicator::size)
    }

    /// Whether sequence parallelism is on (and the group has more than one rank).
    pub fn sp(&self) -> bool {
        self.sp
    }

    /// The communicator, for a group of more than one.
    pub fn comm(&self) -> Option<&Communicator> {
        self.comm.as_ref()
    }

    /// The first vocabulary entry this rank holds of a vocabulary of `vocab` entries (padded
    /// to a multiple of the group; each rank holds `⌈vocab / tp⌉` consecutive entries).
    pub fn vocab_start(&self, vocab: usize) -> usize {
        self.split(0, 1).piece(vocab).start
    }

    /// The division of a dimension made of `groups` consecutive groups over this group.
    pub fn split(&self, dim: usize, groups: usize) -> Shard {
        match self.size() {
            1 => Shard::Replicated,
            parts => Shard::Split { dim, groups, parts, index: self.rank() },
        }
    }

    /// The full flat parameters (as at tp = 1) from this rank's `local` ones: an all-gather
    /// over the group. Every rank of the group must call it.
    pub fn gather_full(&self, set: &ParamSet, local: &[f32]) -> Result<Vec<f32>> {
        let Some(comm) = &self.comm else { return set.full_of_locals(&[local]) };
        let mut all = vec![0.0f32; local.len() * comm.size()];
        comm.all_gather(local, &mut all)?;
        assemble(set, &all, comm.size())
    }

    /// Sums `values` over the group in place (nothing for a group of one).
    pub fn all_reduce(&self, values: &mut [f32]) -> Result<()> {
        match &self.comm {
            Some(c) => Ok(c.all_reduce(values, ReduceOp::Sum)?),
            None => Ok(()),
        }
    }

    /// Checks, before any communication, that `heads` attention heads and (with sequence
    /// parallelism, `sp`) sequences of `len` tokens can be divided over a group of `n`.
    pub fn check_sizes(n: usize, sp: bool, heads: usize, len: usize) -> Result<()> {
        if !heads.is_multiple_of(n) {
            return Err(Error::config(format!(
                "--heads {heads} is not divisible by --tp {n}: each tensor-parallel rank takes \
                 heads / tp whole heads; pick a --tp that divides --heads"
            )));
        }
        if sp && !len.is_multiple_of(n) {
            return Err(Error::config(format!(
                "sequence parallelism splits each sequence over the --tp {n} ranks, but rows \
                 have {len} tokens: pick a --tp that divides {len}, a data length that --tp \
                 divides (--context, --digits), or leave out --sp"
            )));
        }
        Ok(())
    }
}

/// The full flat parameters from `all`, the `ranks` ranks' flat vectors one after the other.
fn assemble(set: &ParamSet, all: &[f32], ranks: usize) -> Result<Vec<f32>> {
    let n = all.len() / ranks.max(1);
    let locals: Vec<&[f32]> = (0..ranks).map(|r| &all[r * n..(r + 1) * n]).collect();
    set.full_of_locals(&locals)
}
