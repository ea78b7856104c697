//! Which rank holds which global stage: the pipeline's placement of its `p·v` stages on its
//! `p` ranks.
//!
//! - [`Placement::Looped`] (Megatron-LM's interleaving, and every one-chunk schedule): rank
//!   `r`'s chunk `c` is global stage `c·p + r`, so a micro-batch loops through the ranks `v`
//!   times, always to the next rank.
//! - [`Placement::V`] (ZB-V, two chunks per rank): rank `r` holds global stages `r` and `2·p
//!   − 1 − r`, so a micro-batch goes down the ranks and back up: rank `p − 1` hands its first
//!   chunk's output to its own second chunk, and rank 0 holds the first stage and the last
//!   (the loss). Every rank then gets the gradient of its second chunk while it still holds
//!   the first's work, which is what lets ZB-V fill the bubble at 1F1B's memory.
//!
//! ```
//! use xccl_train::pipeline::placement::Placement;
//!
//! // Four ranks, two chunks each.
//! assert_eq!(Placement::Looped.global_stage(4, 1, 1), 5);
//! assert_eq!(Placement::V.global_stage(4, 1, 1), 6);
//! assert_eq!(Placement::V.locate(4, 6), (1, 1));
//! assert_eq!(Placement::V.locate(4, 3), (3, 0));
//! ```

use std::ops::Range;

/// How global stages are placed on the ranks (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Rank `r`'s chunk `c` is global stage `c·p + r`.
    Looped,
    /// Two chunks per rank: rank `r`'s chunk 0 is global stage `r`, its chunk 1 global stage
    /// `2·p − 1 − r`.
    V,
}

impl Placement {
    /// The global stage of `rank`'s local `chunk` on `p` ranks.
    pub fn global_stage(self, p: usize, rank: usize, chunk: usize) -> usize {
        match self {
            Placement::V if chunk % 2 == 1 => (chunk + 1) * p - 1 - rank,
            Placement::V => chunk * p + rank,
            Placement::Looped => chunk * p + rank,
        }
    }

    /// The rank and local chunk holding global stage `stage` on `p` ranks.
    pub fn locate(self, p: usize, stage: usize) -> (usize, usize) {
        let (chunk, within) = (stage / p, stage % p);
        match self {
            Placement::V if chunk % 2 == 1 => (p - 1 - within, chunk),
            Placement::V | Placement::Looped => (within, chunk),
        }
    }

    /// The block ranges (in the whole model) of rank `rank`'s `v` chunks, in chunk order, from
    /// the ranges of every global stage (`stages`, `p·v` of them, in pipeline order).
    pub fn chunks_of(self, stages: &[Range<usize>], p: usize, rank: usize) -> Vec<Range<usize>> {
        let v = stages.len() / p.max(1);
        (0..v).filter_map(|c| stages.get(self.global_stage(p, rank, c)).cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_is_held_once_and_located_back() {
        for placement in [Placement::Looped, Placement::V] {
            for p in 1..=9 {
                for v in 1..=4 {
                    let mut held = vec![false; p * v];
                    for rank in 0..p {
                        for chunk in 0..v {
                            let g = placement.global_stage(p, rank, chunk);
                            assert!(!std::mem::replace(&mut held[g], true), "{placement:?} p={p} v={v}");
                            assert_eq!(placement.locate(p, g), (rank, chunk));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_v_goes_down_and_back_up() {
        // p = 3: stages 0 1 2 on ranks 0 1 2 (chunk 0), stages 3 4 5 on ranks 2 1 0 (chunk 1).
        let ranks: Vec<usize> = (0..6).map(|g| Placement::V.locate(3, g).0).collect();
        assert_eq!(ranks, [0, 1, 2, 2, 1, 0]);
        let stages = [0..1, 1..2, 2..3, 3..5, 5..6, 6..8];
        assert_eq!(Placement::V.chunks_of(&stages, 3, 0), vec![0..1, 6..8]);
        assert_eq!(Placement::V.chunks_of(&stages, 3, 2), vec![2..3, 3..5]);
        assert_eq!(Placement::Looped.chunks_of(&stages, 3, 0), vec![0..1, 3..5]);
    }
}
