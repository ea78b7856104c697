//! Megatron's parallel layers: [`ColumnParallelLinear`], [`RowParallelLinear`] and
//! [`VocabParallelEmbedding`]. Each holds its piece of the weight and the [`Tp`] handle
//! whose communication it needs; built with tp = 1 they are the plain layers.

use candle_core::{Device, Tensor};

use super::Tp;
use super::comm::{self, Collective};
use crate::error::Result;
use crate::layers::grads::Deferred;
use crate::layers::{Init, Linear, ops};
use crate::params::Param;

/// `y = x Wᵀ + b` with `W` (`[outputs, inputs]`) split by output rows: each rank computes
/// `outputs / tp` of the output features from the whole input.
///
/// The input enters through `f` (identity forward, all-reduce of its gradient backward)
/// or, with sequence parallelism, through an all-gather along the sequence. The output
/// stays split unless `gather_output` asks for an all-gather along the features.
#[derive(Clone, Debug)]
pub struct ColumnParallelLinear {
    linear: Linear,
    tp: Tp,
    gather_output: bool,
}

impl ColumnParallelLinear {
    /// A layer from `inputs` to `outputs` features, its weight drawn from N(0, `std`²) as the
    /// unsharded layer's would be and its bias (if `bias`) zero; the output features are
    /// `groups` consecutive groups (3 for a fused q/k/v projection), each divided over the
    /// group so that every rank gets whole heads of each. Parameters go onto `params`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        init: &mut Init,
        params: &mut Vec<Param>,
        name: &str,
        (inputs, outputs): (usize, usize),
        std: f32,
        bias: bool,
        groups: usize,
        tp: &Tp,
    ) -> Result<ColumnParallelLinear> {
        let shard = tp.split(0, groups);
        let w = init.normal_sharded(format!("{name}.weight"), &[outputs, inputs], std, shard)?;
        let b = match bias {
            true => Some(init.constant_sharded(format!("{name}.bias"), &[outputs], 0.0, shard)?),
            false => None,
        };
        let linear = Linear::new(w.clone(), b.clone());
        params.push(w);
        params.extend(b);
        Ok(ColumnParallelLinear { linear, tp: tp.clone(), gather_output: false })
    }

    /// A layer on an existing weight piece `[outputs / tp, inputs]` (a tied output head on
    /// the vocabulary-parallel embedding), without bias.
    pub fn on_weight(weight: Param, tp: &Tp) -> ColumnParallelLinear {
        ColumnParallelLinear { linear: Linear::new(weight, None), tp: tp.clone(), gather_output: false }
    }

    /// Gathers the output features on every rank (all-gather forward, slice backward).
    pub fn gather_output(mut self) -> ColumnParallelLinear {
        self.gather_output = true;
        self
    }

    /// This rank's output features for input `x` (`[rows, len, inputs]`; with sequence
    /// parallelism `[rows, len / tp, inputs]`).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = if self.tp.sp() { comm::gather_seq(&self.tp, x)? } else { comm::copy_to(&self.tp, x)? };
        let y = candle_core::Module::forward(&self.linear, &x)?;
        if self.gather_output { comm::gather_last(&self.tp, &y) } else { Ok(y) }
    }

    /// [`forward`](Self::forward) without an autograd graph. Its backward needs the input
    /// `x` as given here: with sequence parallelism only this rank's positions, which the
    /// backward gathers again (Megatron-LM's saving), not the gathered whole.
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.gather_output {
            candle_core::bail!("a column-parallel layer with a gathered output has no explicit backward");
        }
        let x = if self.tp.sp() { comm::run(&self.tp, x, Collective::GatherSeq)? } else { x.clone() };
        self.linear.apply(&x)
    }

    /// The gradient of the input `x` (as [`apply`](Self::apply) got it) from that of this
    /// rank's output features `gy`: `gy·W`, summed over the group (with sequence
    /// parallelism reduce-scattered along the sequence). The weight's and bias's gradients
    /// go onto `deferred`. With sequence parallelism they need `x` gathered again: the
    /// gather starts here and runs while `gy·W` is computed (Megatron-LM's overlap).
    pub fn backward_input(
        &self,
        x: Tensor,
        gy: &Tensor,
        deferred: &mut Deferred,
    ) -> candle_core::Result<Tensor> {
        let pending =
            if self.tp.sp() { comm::gather_seq_start(&self.tp, &x)? } else { comm::PendingGather::Done(x) };
        let gx = self.linear.backward_input(gy, move || pending.wait(), deferred)?;
        let how = if self.tp.sp() { Collective::ReduceScatterSeq } else { Collective::AllReduce };
        comm::run(&self.tp, &gx, how)
    }
}

/// `y = x Wᵀ + b` with `W` (`[outputs, inputs]`) split by input columns: each rank holds
/// `inputs / tp` of the input features (the split output of a [`ColumnParallelLinear`])
/// and computes a partial product; the partial products are summed over the group (`g`;
/// with sequence parallelism a reduce-scatter along the sequence), then the bias, which
/// every rank holds whole, is added once.
#[derive(Clone, Debug)]
pub struct RowParallelLinear {
    linear: Linear,
    bias: Param,
    tp: Tp,
}

impl RowParallelLinear {
    /// A layer from `inputs` to `outputs` features, its weight drawn from N(0, `std`²) as the
    /// unsharded layer's would be, its bias zero. Parameters go onto `params`.
    pub fn new(
        init: &mut Init,
        params: &mut Vec<Param>,
        name: &str,
        (inputs, outputs): (usize, usize),
        std: f32,
        tp: &Tp,
    ) -> Result<RowParallelLinear> {
        let w = init.normal_sharded(format!("{name}.weight"), &[outputs, inputs], std, tp.split(1, 1))?;
        let b = init.constant(format!("{name}.bias"), &[outputs], 0.0)?;
        let layer =
            RowParallelLinear { linear: Linear::new(w.clone(), None), bias: b.clone(), tp: tp.clone() };
        params.extend([w, b]);
        Ok(layer)
    }

    /// The output for this rank's input features `x` (`[rows, len, inputs / tp]`); with
    /// sequence parallelism `[rows, len / tp, outputs]`, else `[rows, len, outputs]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let partial = candle_core::Module::forward(&self.linear, x)?;
        let y = if self.tp.sp() {
            comm::scatter_seq(&self.tp, &partial)?
        } else {
            comm::reduce_from(&self.tp, &partial)?
        };
        crate::layers::ops::bias_add(&y, &self.bias.tensor())
    }

    /// [`forward`](Self::forward) without an autograd graph; its backward needs `x`.
    pub fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let how = if self.tp.sp() { Collective::ReduceScatterSeq } else { Collective::AllReduce };
        let y = comm::run(&self.tp, &self.linear.apply(x)?, how)?;
        ops::bias_add(&y, &self.bias.tensor().detach())
    }

    /// The gradient of the input `x` (as [`apply`](Self::apply) got it) from that of the
    /// output `gy` (with sequence parallelism this rank's positions, gathered first); the
    /// weight's and bias's gradients go onto `deferred`.
    pub fn backward_input(
        &self,
        x: Tensor,
        gy: &Tensor,
        deferred: &mut Deferred,
    ) -> candle_core::Result<Tensor> {
        let (bias, g) = (self.bias.clone(), gy.clone());
        deferred.push(move || Ok(vec![(bias, ops::column_sum(&g)?)]));
        let gy = if self.tp.sp() { comm::run(&self.tp, gy, Collective::GatherSeq)? } else { gy.clone() };
        self.linear.backward_input(&gy, move || Ok(x), deferred)
    }
}

/// A token embedding split by vocabulary: each rank holds a contiguous range of the
/// (padded) vocabulary, looks up the ids inside its range, writes zeros for the others,
/// and the group sums the results (with sequence parallelism, reduce-scatters them along
/// the sequence).
#[derive(Clone, Debug)]
pub struct VocabParallelEmbedding {
    table: Param,
    /// First vocabulary entry this rank holds.
    start: usize,
    tp: Tp,
}

impl VocabParallelEmbedding {
    /// A table of `vocab` rows of `width` features, drawn from N(0, `std`²) as the
    /// unsharded table would be; the vocabulary is padded to a multiple of the group with
    /// rows that stay zero. The parameter goes onto `params`.
    pub fn new(
        init: &mut Init,
        params: &mut Vec<Param>,
        name: &str,
        (vocab, width): (usize, usize),
        std: f32,
        tp: &Tp,
    ) -> Result<VocabParallelEmbedding> {
        let table = init.normal_sharded(name.to_string(), &[vocab, width], std, tp.split(0, 1))?;
        let start = tp.vocab_start(vocab);
        params.push(table.clone());
        Ok(VocabParallelEmbedding { table, start, tp: tp.clone() })
    }

    /// The table's parameter (this rank's rows), for a tied output head.
    pub fn table(&self) -> &Param {
        &self.table
    }

    /// Embeddings of `ids` (`[rows, len]`, u32): `[rows, len, width]` on every rank, or with
    /// sequence parallelism this rank's `[rows, len / tp, width]`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        self.lookup(&self.table.tensor(), ids)
    }

    /// [`forward`](Self::forward) without an autograd graph.
    pub fn apply(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        self.lookup(&self.table.tensor().detach(), ids)
    }

    /// Defers the table's gradient for `ids` (as [`apply`](Self::apply) got them) from that
    /// of the output `gy` (with sequence parallelism this rank's positions, gathered
    /// first): each id's row of the gradient added to its row of the table, for the ids of
    /// this rank's range.
    pub fn backward(&self, ids: Tensor, gy: &Tensor, deferred: &mut Deferred) -> candle_core::Result<()> {
        let gy = if self.tp.sp() { comm::run(&self.tp, gy, Collective::GatherSeq)? } else { gy.clone() };
        let (table, start) = (self.table.clone(), self.start);
        deferred.push(move || {
            let (rows, width) = (table.shape()[0], table.shape()[1]);
            let ids = ids.flatten_all()?.to_vec1::<u32>()?;
            let g = gy.flatten_all()?.to_vec1::<f32>()?;
            if g.len() != ids.len() * width {
                candle_core::bail!("embedding: {} ids for a gradient {:?}", ids.len(), gy.dims());
            }
            let mut out = vec![0.0f32; rows * width];
            for (&id, row) in ids.iter().zip(g.chunks_exact(width)) {
                let Some(local) = (id as usize).checked_sub(start).filter(|&l| l < rows) else { continue };
                for (o, &v) in out[local * width..(local + 1) * width].iter_mut().zip(row) {
                    *o += v;
                }
            }
            Ok(vec![(table, Tensor::from_vec(out, (rows, width), &Device::Cpu)?)])
        });
        Ok(())
    }

    fn lookup(&self, table: &Tensor, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let (rows, width) = table.dims2()?;
        if self.tp.size() == 1 {
            return table.index_select(&ids.flatten_all()?, 0)?.reshape((b, t, width));
        }
        let ids = ids.flatten_all()?.to_vec1::<u32>()?;
        let range = self.start..self.start + rows;
        let mut local = Vec::with_capacity(ids.len());
        let mut keep = Vec::with_capacity(ids.len());
        for &id in &ids {
            let id = id as usize;
            let inside = range.contains(&id);
            local.push(if inside { (id - self.start) as u32 } else { 0 });
            keep.push(if inside { 1.0f32 } else { 0.0 });
        }
        let local = Tensor::from_vec(local, ids.len(), &Device::Cpu)?;
        let keep = Tensor::from_vec(keep, (ids.len(), 1), &Device::Cpu)?;
        let partial = table.index_select(&local, 0)?.broadcast_mul(&keep)?.reshape((b, t, width))?;
        // On an untracked table (`apply`) these build no graph either.
        if self.tp.sp() {
            comm::scatter_seq(&self.tp, &partial)
        } else {
            comm::reduce_from(&self.tp, &partial)
        }
    }
}
