//! Tensor-parallel shards ([`Shard`]) as pieces: what a rank's local tensor holds of the
//! global one, for writing ([`shard_pieces`]) and reading ([`read_shard`]).
//!
//! A [`Shard::Split`] local tensor is, along its split dimension, `groups` blocks of
//! `⌈per_group / parts⌉` rows: block `g` holds rows `g·per_group + index·⌈…⌉ ..` of the
//! global tensor, then zero padding where the group runs out. Each block's real rows are one
//! box of the global tensor ([`shard_boxes`]); padding is in no piece.

use super::{Piece, Reader};
use crate::error::{Error, Result};
use crate::params::Shard;

/// The boxes of the global tensor `tensor` (shape `full`) that `shard` holds, without
/// padding, each with the index along the split dimension where its rows start in the
/// local tensor (0 for a replicated tensor: one box, the whole tensor).
pub fn shard_boxes(tensor: &str, full: &[usize], shard: Shard) -> Vec<(Piece, usize)> {
    let Shard::Split { dim, groups, .. } = shard else { return vec![(Piece::whole(tensor, full), 0)] };
    let per_group = full[dim] / groups.max(1);
    let rows = shard.piece(per_group);
    let held = rows.end.min(per_group).saturating_sub(rows.start);
    (0..groups)
        .filter(|_| held > 0)
        .map(|g| {
            let mut offsets = vec![0; full.len()];
            let mut lengths = full.to_vec();
            offsets[dim] = g * per_group + rows.start;
            lengths[dim] = held;
            (Piece::boxed(tensor, offsets, lengths), g * rows.len())
        })
        .collect()
}

/// Elements before dimension `dim` (as one count) and after it.
fn outer_inner(shape: &[usize], dim: usize) -> (usize, usize) {
    (shape[..dim].iter().product(), shape[dim + 1..].iter().product())
}

/// Copies between the local tensor `local` (shape `local_shape`) and one box's values
/// `values`: the box's `held` rows along `dim` sit at rows `at..` of the local tensor.
fn each_row(
    local_shape: &[usize],
    dim: usize,
    at: usize,
    held: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let (outer, inner) = outer_inner(local_shape, dim);
    for o in 0..outer {
        let from = (o * local_shape[dim] + at) * inner;
        f(from, o * held * inner, held * inner);
    }
}

/// This rank's pieces of `tensor` (global shape `full`) with their values, cut from its
/// local tensor `local` under `shard` (padding left out): what it puts in a
/// [`Snapshot`](super::Snapshot).
pub fn shard_pieces(
    tensor: &str,
    full: &[usize],
    shard: Shard,
    local: &[f32],
) -> Result<Vec<(Piece, Vec<f32>)>> {
    let local_shape = shard.local_shape(full);
    if local.len() != local_shape.iter().product::<usize>() {
        return Err(Error::internal(format!(
            "{} local values of {tensor} for its shard of shape {local_shape:?}",
            local.len()
        )));
    }
    let dim = match shard {
        Shard::Split { dim, .. } => dim,
        Shard::Replicated => return Ok(vec![(Piece::whole(tensor, full), local.to_vec())]),
    };
    let pieces = shard_boxes(tensor, full, shard)
        .into_iter()
        .map(|(piece, at)| {
            let mut values = vec![0.0; piece.len()];
            each_row(&local_shape, dim, at, piece.lengths[dim], |from, to, n| {
                values[to..to + n].copy_from_slice(&local[from..from + n]);
            });
            (piece, values)
        })
        .collect();
    Ok(pieces)
}

/// This rank's local tensor of `tensor` under `shard` (padding zero), read from `reader`:
/// only the boxes it holds are read.
pub fn read_shard(reader: &Reader, tensor: &str, shard: Shard) -> Result<Vec<f32>> {
    let full = reader.shape(tensor).ok_or_else(|| Error::Checkpoint {
        path: reader.dir().to_path_buf(),
        msg: format!("has no tensor {tensor}"),
    })?;
    let local_shape = shard.local_shape(full);
    let Shard::Split { dim, .. } = shard else { return reader.read(&Piece::whole(tensor, full)) };
    let mut local = vec![0.0; local_shape.iter().product()];
    for (piece, at) in shard_boxes(tensor, full, shard) {
        let values = reader.read(&piece)?;
        each_row(&local_shape, dim, at, piece.lengths[dim], |to, from, n| {
            local[to..to + n].copy_from_slice(&values[from..from + n]);
        });
    }
    Ok(local)
}
