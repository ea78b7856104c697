//! Megatron's parallel layers: [`ColumnParallelLinear`], [`RowParallelLinear`] and
//! [`VocabParallelEmbedding`]. Each holds its piece of the weight and the [`Tp`] handle
//! whose communication it needs; built with tp = 1 they are the plain layers.

use candle_core::{Device, Tensor};

use super::{Tp, comm};
use crate::error::Result;
use crate::layers::{Init, Linear};
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
        let (b, t) = ids.dims2()?;
        let table = self.table.tensor();
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
        if self.tp.sp() {
            comm::scatter_seq(&self.tp, &partial)
        } else {
            comm::reduce_from(&self.tp, &partial)
        }
    }
}
