//! [`Piece`]: a part of a global tensor (a box, and a flat range of the box), and the copy of
//! the elements two pieces share ([`Piece::overlap`], [`copy_overlap`]).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A part of a global tensor: the box `offsets .. offsets + lengths` (one entry per
/// dimension), and of that box only the elements `flat` in the box's own row-major order
/// (the whole box: `0..lengths.product()`).
///
/// A tensor-parallel shard is a box (a block of rows or columns); a ZeRO shard of a flat
/// parameter vector is a flat range within a box (the whole tensor's box, or a
/// tensor-parallel shard's). Values of a piece are its [`len`](Piece::len) elements in that
/// order. A scalar (shape `[]`) has one element: the box with no dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Piece {
    /// The global tensor's name.
    pub tensor: String,
    /// Where the box starts, per dimension.
    pub offsets: Vec<usize>,
    /// The box's extent, per dimension.
    pub lengths: Vec<usize>,
    /// The elements of the box this piece holds, in the box's row-major order.
    pub flat: Range<usize>,
}

impl Piece {
    /// The whole tensor `tensor` of shape `shape`.
    pub fn whole(tensor: impl Into<String>, shape: &[usize]) -> Piece {
        Piece::boxed(tensor, vec![0; shape.len()], shape.to_vec())
    }

    /// The whole box `offsets .. offsets + lengths` of `tensor`.
    pub fn boxed(tensor: impl Into<String>, offsets: Vec<usize>, lengths: Vec<usize>) -> Piece {
        let n = lengths.iter().product();
        Piece { tensor: tensor.into(), offsets, lengths, flat: 0..n }
    }

    /// The same box, holding only its elements `flat` (in the box's row-major order).
    pub fn with_flat(self, flat: Range<usize>) -> Piece {
        Piece { flat, ..self }
    }

    /// The number of elements this piece holds.
    pub fn len(&self) -> usize {
        self.flat.len()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.flat.is_empty()
    }

    /// The number of elements of its box.
    pub fn box_len(&self) -> usize {
        self.lengths.iter().fold(1, |n, &l| n.saturating_mul(l))
    }

    /// Whether it holds its whole box.
    pub fn is_whole_box(&self) -> bool {
        self.flat.start == 0 && self.flat.end == self.box_len()
    }

    /// Checks the piece against the global shape of its tensor: one offset and one length per
    /// dimension, the box inside the shape, the flat range inside the box. The message says
    /// what is wrong.
    pub fn validate(&self, shape: &[usize]) -> std::result::Result<(), String> {
        let d = shape.len();
        if self.offsets.len() != d || self.lengths.len() != d {
            return Err(format!(
                "piece {self} of tensor {} of shape {shape:?} has {} offsets and {} lengths, not {d}",
                self.tensor,
                self.offsets.len(),
                self.lengths.len()
            ));
        }
        for j in 0..d {
            let end = self.offsets[j].checked_add(self.lengths[j]);
            if end.is_none_or(|end| end > shape[j]) {
                return Err(format!(
                    "piece {self} of tensor {} runs past its shape {shape:?} in dimension {j}",
                    self.tensor
                ));
            }
        }
        let n = self.lengths.iter().try_fold(1usize, |n, &l| n.checked_mul(l));
        if self.flat.start > self.flat.end || n.is_none_or(|n| self.flat.end > n) {
            return Err(format!(
                "piece {self} of tensor {}: the flat range runs past its box of {} elements",
                self.tensor,
                self.box_len()
            ));
        }
        Ok(())
    }

    /// Calls `f(at_self, at_other, len)` for every run of elements both `self` and `other`
    /// hold: `self`'s values `at_self .. at_self + len` are `other`'s values
    /// `at_other .. at_other + len` (positions in each piece's values, i.e. relative to its
    /// `flat.start`). Runs come in increasing order in both pieces and never overlap.
    ///
    /// Works in runs along the last dimension (along several trailing dimensions where both
    /// boxes span them whole), and skips the rows outside either flat range by bisection, so
    /// the cost is the number of runs, not of elements. Both pieces must be valid for the
    /// same shape ([`validate`](Piece::validate)); the tensor names are not compared.
    pub fn overlap(&self, other: &Piece, mut f: impl FnMut(usize, usize, usize)) {
        let (a, b) = (self, other);
        let d = a.offsets.len();
        if [a.lengths.len(), b.offsets.len(), b.lengths.len()] != [d; 3] || a.is_empty() || b.is_empty() {
            return;
        }
        if d == 0 {
            // A scalar: both hold its only element.
            f(0, 0, 1);
            return;
        }
        // The intersection of the boxes.
        let mut lo = vec![0; d];
        let mut hi = vec![0; d];
        for j in 0..d {
            lo[j] = a.offsets[j].max(b.offsets[j]);
            hi[j] = (a.offsets[j] + a.lengths[j]).min(b.offsets[j] + b.lengths[j]);
            if lo[j] >= hi[j] {
                return;
            }
        }
        // Dimensions after `k` are whole in both boxes (and so in the intersection): a run
        // covers dimension `k`'s part of the intersection and all of them.
        let mut k = d - 1;
        while k > 0 && hi[k] - lo[k] == a.lengths[k] && a.lengths[k] == b.lengths[k] {
            k -= 1;
        }
        let run: usize = (hi[k] - lo[k]) * a.lengths[k + 1..].iter().product::<usize>();
        let strides = |p: &Piece| {
            let mut s = vec![1; d];
            for j in (0..d - 1).rev() {
                s[j] = s[j + 1] * p.lengths[j + 1];
            }
            s
        };
        let (sa, sb) = (strides(a), strides(b));
        // Rows: the intersection's index over dimensions `0..k`, in row-major order.
        let extent: Vec<usize> = (0..k).map(|j| hi[j] - lo[j]).collect();
        let rows: usize = extent.iter().product();
        // Where row `idx` starts in a piece's box, in the box's row-major order.
        let start_in = |p: &Piece, s: &[usize], idx: &[usize]| -> usize {
            let mut at = (lo[k] - p.offsets[k]) * s[k];
            for j in 0..k {
                at += (lo[j] + idx[j] - p.offsets[j]) * s[j];
            }
            at
        };
        let unravel = |mut r: usize| -> Vec<usize> {
            let mut idx = vec![0; k];
            for j in (0..k).rev() {
                idx[j] = r % extent[j];
                r /= extent[j];
            }
            idx
        };
        // Row starts grow with the row in both boxes: the rows whose run meets both flat
        // ranges are one interval, found by bisection.
        let first =
            |p: &Piece, s: &[usize]| bisect(rows, |r| start_in(p, s, &unravel(r)) + run <= p.flat.start);
        let end = |p: &Piece, s: &[usize]| bisect(rows, |r| start_in(p, s, &unravel(r)) < p.flat.end);
        let from = first(a, &sa).max(first(b, &sb));
        let to = end(a, &sa).min(end(b, &sb));
        if from >= to {
            return;
        }
        let mut idx = unravel(from);
        for _ in from..to {
            let (pa, pb) = (start_in(a, &sa, &idx), start_in(b, &sb, &idx));
            let t0 = a.flat.start.saturating_sub(pa).max(b.flat.start.saturating_sub(pb));
            let t1 = run.min(a.flat.end.saturating_sub(pa)).min(b.flat.end.saturating_sub(pb));
            if t0 < t1 {
                f(pa + t0 - a.flat.start, pb + t0 - b.flat.start, t1 - t0);
            }
            // The next row (odometer over dimensions `0..k`).
            for j in (0..k).rev() {
                idx[j] += 1;
                if idx[j] < extent[j] {
                    break;
                }
                idx[j] = 0;
            }
        }
    }
}

/// The first `r` in `0..n` for which `pred(r)` is false (`pred` true then false), or `n`.
fn bisect(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl std::fmt::Display for Piece {
    /// `[0..4, 2..6] flat 0..16` (a box per dimension, then the flat range if partial).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[")?;
        for (j, (o, l)) in self.offsets.iter().zip(&self.lengths).enumerate() {
            let sep = if j == 0 { "" } else { ", " };
            write!(f, "{sep}{o}..{}", o.saturating_add(*l))?;
        }
        write!(f, "]")?;
        if !self.is_whole_box() {
            write!(f, " flat {}..{}", self.flat.start, self.flat.end)?;
        }
        Ok(())
    }
}

/// Copies the elements `src` and `dst` share from `src_values` into `dst_values` (each
/// piece's values, [`Piece::len`] long); returns how many were copied. Pieces of different
/// tensors share nothing.
pub fn copy_overlap(src: &Piece, src_values: &[f32], dst: &Piece, dst_values: &mut [f32]) -> Result<usize> {
    if src_values.len() != src.len() || dst_values.len() != dst.len() {
        return Err(Error::internal(format!(
            "copy between pieces of {} with {} and {} values for {} and {} elements",
            src.tensor,
            src_values.len(),
            dst_values.len(),
            src.len(),
            dst.len()
        )));
    }
    if src.tensor != dst.tensor {
        return Ok(0);
    }
    let mut copied = 0;
    src.overlap(dst, |s, d, n| {
        dst_values[d..d + n].copy_from_slice(&src_values[s..s + n]);
        copied += n;
    });
    Ok(copied)
}

/// The global flat (row-major) index of position `at` of `piece`'s values, for a tensor of
/// shape `shape` (for messages).
pub(crate) fn global_index(piece: &Piece, shape: &[usize], at: usize) -> Vec<usize> {
    let mut rest = piece.flat.start + at;
    let mut idx = vec![0; shape.len()];
    for j in (0..shape.len()).rev() {
        let l = piece.lengths[j].max(1);
        idx[j] = piece.offsets[j] + rest % l;
        rest /= l;
    }
    idx
}

/// The first position of `0..len` no interval of `covered` (`start..end` pairs, in any
/// order, possibly overlapping) contains, or `None` if they cover it all.
pub(crate) fn first_gap(covered: &mut [(usize, usize)], len: usize) -> Option<usize> {
    covered.sort_unstable();
    let mut reached = 0;
    for &(s, e) in covered.iter() {
        if s > reached {
            break;
        }
        reached = reached.max(e);
    }
    (reached < len).then_some(reached)
}
