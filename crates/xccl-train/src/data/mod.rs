//! Training data: the [`Task`] trait, global batches as deterministic functions of (seed,
//! step), and how a global batch is shared among ranks and cut into micro-batches.
//!
//! Every rank builds the same global batch for step `t` from the seed, takes its contiguous
//! share ([`shares`]) and counts the target tokens of the whole global batch, which is the
//! loss's normaliser: no communication is needed to agree on either.

pub mod sums;
pub mod text;

use std::ops::Range;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;

use crate::error::Result;
use crate::model::{Model, ids_tensor};

pub use sums::Sums;
pub use text::Text;

/// Rows of token ids with their next-token targets and a loss mask.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Number of rows (sequences).
    pub rows: usize,
    /// Tokens per row.
    pub len: usize,
    /// Input ids, `rows × len`, row-major.
    pub ids: Vec<u32>,
    /// Target ids (the next token at each position), `rows × len`.
    pub targets: Vec<u32>,
    /// 1 where the target counts towards the loss, else 0; `rows × len`.
    pub mask: Vec<f32>,
}

impl Batch {
    /// Rows `range` of this batch.
    pub fn rows(&self, range: Range<usize>) -> Batch {
        let cells = range.start * self.len..range.end * self.len;
        Batch {
            rows: range.len(),
            len: self.len,
            ids: self.ids[cells.clone()].to_vec(),
            targets: self.targets[cells.clone()].to_vec(),
            mask: self.mask[cells].to_vec(),
        }
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Number of target tokens that count towards the loss.
    pub fn counted(&self) -> usize {
        self.mask.iter().filter(|&&m| m != 0.0).count()
    }

    /// `(ids, targets, mask)` as tensors of shape `[rows, len]`.
    pub fn tensors(&self) -> Result<(Tensor, Tensor, Tensor)> {
        Ok((
            ids_tensor(&self.ids, self.rows, self.len)?,
            ids_tensor(&self.targets, self.rows, self.len)?,
            Tensor::from_slice(&self.mask, (self.rows, self.len), &Device::Cpu)?,
        ))
    }
}

/// How well a model does on a task's held-out data.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Fraction right, in `[0, 1]`.
    pub accuracy: f64,
    /// What "right" means, e.g. "of 500 held-out sums answered exactly (greedy decoding)".
    pub measure: String,
    /// A few decoded examples.
    pub examples: Vec<String>,
}

/// A source of training sequences.
pub trait Task: Send + Sync {
    /// Vocabulary size.
    fn vocab(&self) -> usize;
    /// Tokens per training row.
    fn seq_len(&self) -> usize;
    /// Describes the data (and its vocabulary) exactly, for checkpoint fingerprints.
    fn describe(&self) -> String;
    /// The rows of global batch `step` of `rows` rows, a function of `(seed, step)` only.
    fn batch(&self, seed: u64, step: u64, rows: usize) -> Batch;
    /// The model's accuracy on held-out data (never drawn by [`batch`](Self::batch)).
    fn evaluate(&self, model: &Model) -> Result<Evaluation>;
}

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskConfig {
    /// The embedded addition task (see [`Sums`]) on numbers of `digits` digits.
    Sums {
        /// Digits of each operand.
        digits: usize,
    },
    /// A UTF-8 text file (see [`Text`]).
    Text {
        /// The file.
        path: PathBuf,
        /// Bytes as tokens (vocabulary 256) instead of characters.
        byte_level: bool,
        /// Tokens per training row.
        len: usize,
    },
}

impl TaskConfig {
    /// Loads the task.
    pub fn load(&self) -> Result<Box<dyn Task>> {
        Ok(match self {
            TaskConfig::Sums { digits } => Box::new(Sums::new(*digits)?),
            TaskConfig::Text { path, byte_level, len } => Box::new(Text::load(path, *byte_level, *len)?),
        })
    }
}

/// Contiguous shares of `total` items among `parts` (the first `total % parts` get one
/// more); shares may be empty.
pub fn shares(total: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let (base, extra) = (total / parts, total % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = base + usize::from(i < extra);
            let r = start..start + n;
            start += n;
            r
        })
        .collect()
}

/// A generator for the stream named by `parts` (e.g. `[seed, step]`), independent of every
/// other stream.
pub fn stream(parts: &[u64]) -> ChaCha8Rng {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for &p in parts {
        h ^= p.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_add(h << 6).wrapping_add(h >> 2);
        h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 29;
    }
    ChaCha8Rng::seed_from_u64(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_contiguous_and_cover_everything() {
        assert_eq!(shares(7, 3), vec![0..3, 3..5, 5..7]);
        assert_eq!(shares(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(shares(0, 2), vec![0..0, 0..0]);
    }

    #[test]
    fn batches_slice_by_rows() {
        let b = Batch {
            rows: 3,
            len: 2,
            ids: vec![1, 2, 3, 4, 5, 6],
            targets: vec![2, 3, 4, 5, 6, 7],
            mask: vec![0.0, 1.0, 1.0, 1.0, 0.0, 1.0],
        };
        let r = b.rows(1..3);
        assert_eq!(r.ids, vec![3, 4, 5, 6]);
        assert_eq!(r.counted(), 3);
        assert!(b.rows(1..1).is_empty());
    }
}
