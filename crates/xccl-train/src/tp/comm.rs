//! The tensor-parallel communication as autograd operations on candle tensors.
//!
//! | function | forward | backward |
//! |---|---|---|
//! | [`copy_to`] (`f`) | identity | all-reduce |
//! | [`reduce_from`] (`g`) | all-reduce | identity |
//! | [`gather_seq`] | all-gather along the sequence (dim 1) | reduce-scatter along it |
//! | [`scatter_seq`] | reduce-scatter along the sequence | all-gather along it |
//! | [`gather_last`] | all-gather along the last dimension | this rank's slice |
//!
//! Each is one `TpOp`: a collective for the forward and the one its backward runs. The
//! sequence is dimension 1 of `[rows, len, ...]` tensors; rank `r` holds positions
//! `r·len/tp .. (r+1)·len/tp` of every row, so a gather lays the ranks' pieces side by
//! side in each row. With a group of one every function returns its input.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use xccl::{Communicator, ReduceOp, Work};

use super::Tp;
use crate::layers::ops::values;

/// What one direction of a [`TpOp`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    /// A copy.
    Identity,
    /// Sum over the group.
    AllReduce,
    /// `[b, s, ..]` on each rank to `[b, tp·s, ..]`.
    GatherSeq,
    /// `[b, tp·s, ..]` on each rank to the sum's `[b, s, ..]` piece of this rank.
    ReduceScatterSeq,
    /// `[.., n]` on each rank to `[.., tp·n]`.
    GatherLast,
    /// `[.., tp·n]` to this rank's `[.., n]` (no communication).
    SliceLast,
}

/// A collective forward and the collective of its backward, on one group.
struct TpOp {
    comm: Communicator,
    fwd: Collective,
    bwd: Collective,
}

fn comm_err(e: xccl::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// `[outer, parts·piece, inner]` as `parts` blocks of `[outer, piece, inner]`, one after
/// the other (`to_blocks`), or back (`!to_blocks`).
fn regroup(x: &[f32], outer: usize, parts: usize, piece: usize, inner: usize, to_blocks: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    let run = piece * inner;
    for o in 0..outer {
        for p in 0..parts {
            let interleaved = (o * parts + p) * run;
            let blocked = (p * outer + o) * run;
            let (from, to) = if to_blocks { (interleaved, blocked) } else { (blocked, interleaved) };
            out[to..to + run].copy_from_slice(&x[from..from + run]);
        }
    }
    out
}

impl TpOp {
    fn run(&self, how: Collective, x: &[f32], shape: &Shape) -> candle_core::Result<(Vec<f32>, Shape)> {
        let n = self.comm.size();
        let dims = shape.dims();
        let seq = || -> candle_core::Result<(usize, usize, usize)> {
            match dims {
                [b, s, rest @ ..] => Ok((*b, *s, rest.iter().product())),
                _ => candle_core::bail!(
                    "sequence-parallel collectives take [rows, len, ..] tensors, got {dims:?}"
                ),
            }
        };
        let with = |dim: usize, len: usize| {
            let mut d = dims.to_vec();
            d[dim] = len;
            Shape::from(d)
        };
        match how {
            Collective::Identity => Ok((x.to_vec(), shape.clone())),
            Collective::AllReduce => {
                let mut y = x.to_vec();
                self.comm.all_reduce(&mut y, ReduceOp::Sum).map_err(comm_err)?;
                Ok((y, shape.clone()))
            }
            Collective::GatherSeq => {
                let (b, s, inner) = seq()?;
                let mut all = vec![0.0f32; x.len() * n];
                self.comm.all_gather(x, &mut all).map_err(comm_err)?;
                Ok((regroup(&all, b, n, s, inner, false), with(1, n * s)))
            }
            Collective::ReduceScatterSeq => {
                let (b, t, inner) = seq()?;
                if !t.is_multiple_of(n) {
                    candle_core::bail!("a sequence of {t} cannot be scattered over {n} ranks");
                }
                let blocks = regroup(x, b, n, t / n, inner, true);
                let mut y = vec![0.0f32; x.len() / n];
                self.comm.reduce_scatter(&blocks, &mut y, ReduceOp::Sum).map_err(comm_err)?;
                Ok((y, with(1, t / n)))
            }
            Collective::GatherLast => {
                let last = dims.len().saturating_sub(1);
                let c = dims.get(last).copied().unwrap_or(1);
                let mut all = vec![0.0f32; x.len() * n];
                self.comm.all_gather(x, &mut all).map_err(comm_err)?;
                Ok((regroup(&all, x.len() / c.max(1), n, c, 1, false), with(last, n * c)))
            }
            Collective::SliceLast => {
                let last = dims.len().saturating_sub(1);
                let c = dims.get(last).copied().unwrap_or(1);
                if !c.is_multiple_of(n) {
                    candle_core::bail!("{c} features cannot be split over {n} ranks");
                }
                let piece = c / n;
                let at = self.comm.rank() * piece;
                let y = x.chunks_exact(c.max(1)).flat_map(|row| &row[at..at + piece]).copied().collect();
                Ok((y, with(last, piece)))
            }
        }
    }
}

impl CustomOp1 for TpOp {
    fn name(&self) -> &'static str {
        match self.fwd {
            Collective::Identity => "tp-copy",
            Collective::AllReduce => "tp-all-reduce",
            Collective::GatherSeq => "tp-gather-seq",
            Collective::ReduceScatterSeq => "tp-reduce-scatter-seq",
            Collective::GatherLast => "tp-gather-last",
            Collective::SliceLast => "tp-slice-last",
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(self.name(), s, l)?;
        let (y, shape) = self.run(self.fwd, x, l.shape())?;
        Ok((CpuStorage::F32(y), shape))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let back = TpOp { comm: self.comm.clone(), fwd: self.bwd, bwd: self.fwd };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&back)?))
    }
}

/// Runs `how` on `x` over the group, without an autograd graph (the layers' explicit
/// forward and backward); with a group of one, `x` itself.
pub(crate) fn run(tp: &Tp, x: &Tensor, how: Collective) -> candle_core::Result<Tensor> {
    match tp.comm() {
        None => Ok(x.clone()),
        Some(comm) => {
            let op = TpOp { comm: comm.clone(), fwd: how, bwd: how };
            x.contiguous()?.apply_op1_no_bwd(&op)
        }
    }
}

/// An all-gather along the sequence in flight ([`gather_seq_start`]).
pub(crate) enum PendingGather {
    /// A group of one: the tensor itself.
    Done(Tensor),
    /// The collective, and the `[b, s, inner]` sizes of each rank's piece.
    Flight { work: Work<(Vec<f32>, Vec<f32>)>, dims: Vec<usize>, parts: usize },
}

/// Starts an all-gather of `x` `[b, s, ..]` along the sequence, to overlap with a
/// computation; [`PendingGather::wait`] gives the `[b, parts·s, ..]` result.
pub(crate) fn gather_seq_start(tp: &Tp, x: &Tensor) -> candle_core::Result<PendingGather> {
    let Some(comm) = tp.comm() else { return Ok(PendingGather::Done(x.clone())) };
    let values = x.flatten_all()?.to_vec1::<f32>()?;
    let parts = comm.size();
    let out = vec![0.0f32; values.len() * parts];
    let work = comm.all_gather_async(values, out);
    Ok(PendingGather::Flight { work, dims: x.dims().to_vec(), parts })
}

impl PendingGather {
    /// Waits for the gather: the whole sequence.
    pub(crate) fn wait(self) -> candle_core::Result<Tensor> {
        match self {
            PendingGather::Done(t) => Ok(t),
            PendingGather::Flight { work, mut dims, parts } => {
                let (_, all) = work.wait().map_err(comm_err)?;
                let (b, s) = match dims[..] {
                    [b, s, ..] => (b, s),
                    _ => candle_core::bail!("a sequence gather of a tensor of shape {dims:?}"),
                };
                let inner = dims[2..].iter().product();
                dims[1] = parts * s;
                Tensor::from_vec(regroup(&all, b, parts, s, inner, false), dims, &candle_core::Device::Cpu)
            }
        }
    }
}

fn apply(tp: &Tp, x: &Tensor, fwd: Collective, bwd: Collective) -> candle_core::Result<Tensor> {
    match tp.comm() {
        None => Ok(x.clone()),
        Some(comm) => x.contiguous()?.apply_op1(TpOp { comm: comm.clone(), fwd, bwd }),
    }
}

/// Megatron's `f`: the input of a column-parallel layer; identity forward, all-reduce of
/// the gradient backward.
pub fn copy_to(tp: &Tp, x: &Tensor) -> candle_core::Result<Tensor> {
    apply(tp, x, Collective::Identity, Collective::AllReduce)
}

/// Megatron's `g`: the output of a row-parallel layer; all-reduce forward, identity
/// backward.
pub fn reduce_from(tp: &Tp, x: &Tensor) -> candle_core::Result<Tensor> {
    apply(tp, x, Collective::AllReduce, Collective::Identity)
}

/// Sequence parallelism, into a column-parallel layer: all-gather of `[b, len/tp, ..]`
/// along the sequence forward, reduce-scatter of the gradient backward.
pub fn gather_seq(tp: &Tp, x: &Tensor) -> candle_core::Result<Tensor> {
    apply(tp, x, Collective::GatherSeq, Collective::ReduceScatterSeq)
}

/// Sequence parallelism, out of a row-parallel layer: reduce-scatter of partial
/// `[b, len, ..]` sums along the sequence forward, all-gather of the gradient backward.
pub fn scatter_seq(tp: &Tp, x: &Tensor) -> candle_core::Result<Tensor> {
    apply(tp, x, Collective::ReduceScatterSeq, Collective::GatherSeq)
}

/// The output of a column-parallel layer gathered along the last dimension; backward keeps
/// this rank's slice of the gradient.
pub fn gather_last(tp: &Tp, x: &Tensor) -> candle_core::Result<Tensor> {
    apply(tp, x, Collective::GatherLast, Collective::SliceLast)
}
