//! [`ShardLayout`]: which rank of the data-parallel group owns which slice of which
//! parameter. The optimiser, the collectives and the checkpoints all read it; nothing else
//! decides where an element lives.
//!
//! A rank's parameters form one flat vector ([`ParamSet`] order: block by block, by name
//! inside a block). Each block's elements are a *unit*, cut into `N` contiguous slices, one
//! per rank of the data-parallel group of `N`, as even as possible (the first `len mod N`
//! ranks get one element more):
//!
//! ```text
//! flat:   | embed ............ | h00 ................. | head ...... |
//! rank 0: | [0]                | [0]                   | [0]         |
//! rank 1:      [1]                    [1]                    [1]
//! rank 2:          [2]                       [2]                 [2]
//! ```
//!
//! Rank `r`'s *shard* is its slices of every unit, concatenated: the optimiser state, the
//! gradient it keeps (stage 2) and the parameters it keeps (stage 3) are laid out so. A
//! unit is what one collective moves: its gradient is reduce-scattered (`reduce_scatter_v`
//! with the unit's counts) and its parameters are all-gathered (`all_gather_v`) as one
//! call. Cutting by block rather than the flat vector as a whole is what lets stage 3 gather
//! exactly the block about to run, and stage 2 reduce a block's gradient as soon as its
//! backward is done.

use std::ops::Range;

use crate::data::shares;
use crate::params::ParamSet;

/// One block's parameters and how they are cut over the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The block (index in this rank's model) whose parameters it holds.
    pub block: usize,
    /// Its elements in this rank's flat vector.
    pub range: Range<usize>,
    /// Elements each rank of the group owns, in rank order: rank `r` owns the
    /// `counts[r]` elements after `range.start + counts[..r].sum()`.
    pub counts: Vec<usize>,
    /// Where this rank's slice starts in its shard.
    pub shard_offset: usize,
}

impl Unit {
    /// The elements of the flat vector rank `r` owns.
    pub fn slice_of(&self, r: usize) -> Range<usize> {
        let start = self.range.start + self.counts[..r].iter().sum::<usize>();
        start..start + self.counts[r]
    }
}

/// The cut of this rank's flat parameter vector over the data-parallel group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    ranks: usize,
    rank: usize,
    units: Vec<Unit>,
    shard_len: usize,
}

impl ShardLayout {
    /// The layout of `set` (whose blocks are `0..blocks`) over a group of `ranks`, seen by
    /// rank `rank`. Blocks without parameters get no unit.
    pub fn new(set: &ParamSet, blocks: usize, ranks: usize, rank: usize) -> ShardLayout {
        let ranks = ranks.max(1);
        let mut units = Vec::new();
        let mut shard_len = 0;
        for block in 0..blocks {
            let range = set.range_of_blocks(block..block + 1);
            if range.is_empty() {
                continue;
            }
            let counts: Vec<usize> = shares(range.len(), ranks).iter().map(Range::len).collect();
            let unit = Unit { block, range, counts, shard_offset: shard_len };
            shard_len += unit.counts[rank];
            units.push(unit);
        }
        ShardLayout { ranks, rank, units, shard_len }
    }

    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// This rank's place in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The units, in flat order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// The unit holding flat element `at`, if any.
    pub fn unit_of_element(&self, at: usize) -> Option<usize> {
        self.units.iter().position(|u| u.range.contains(&at))
    }

    /// Elements of this rank's shard.
    pub fn shard_len(&self) -> usize {
        self.shard_len
    }

    /// The elements of this rank's shard that hold unit `u`.
    pub fn shard_range(&self, u: usize) -> Range<usize> {
        let unit = &self.units[u];
        unit.shard_offset..unit.shard_offset + unit.counts[self.rank]
    }

    /// The elements of the flat vector this rank owns of unit `u`.
    pub fn owned(&self, u: usize) -> Range<usize> {
        self.units[u].slice_of(self.rank)
    }

    /// Where elements `range` of the flat vector (inside one of this rank's slices) are in
    /// its shard.
    pub fn in_shard(&self, range: Range<usize>) -> Option<Range<usize>> {
        let u = self.unit_of_element(range.start)?;
        let own = self.owned(u);
        if range.start < own.start || range.end > own.end {
            return None;
        }
        let at = self.shard_range(u).start + (range.start - own.start);
        Some(at..at + range.len())
    }

    /// This rank's shard cut from a whole flat vector `flat`.
    pub fn shard_of(&self, flat: &[f32]) -> Vec<f32> {
        let mut shard = Vec::with_capacity(self.shard_len);
        for u in 0..self.units.len() {
            shard.extend_from_slice(&flat[self.owned(u)]);
        }
        shard
    }

    /// For every parameter slot of `set`, the part of it this rank owns, as a range of the
    /// parameter's own elements (row-major, this rank's tensor-parallel piece): what this
    /// rank writes to a checkpoint. Slots it owns nothing of are left out.
    pub fn owned_params(&self, set: &ParamSet) -> Vec<(usize, Range<usize>)> {
        let mut out = Vec::new();
        for (i, slot) in set.slots().iter().enumerate() {
            let r = slot.range();
            for u in 0..self.units.len() {
                let own = self.owned(u);
                let (from, to) = (own.start.max(r.start), own.end.min(r.end));
                if from < to {
                    out.push((i, from - r.start..to - r.start));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, ModelConfig, ModelKind};

    fn set() -> (Model, usize) {
        let cfg = ModelConfig {
            kind: ModelKind::Gpt,
            vocab: 12,
            context: 8,
            width: 16,
            layers: 2,
            heads: 2,
            tied: true,
        };
        let model = Model::new(&cfg, 1).unwrap();
        let n = model.blocks().len();
        (model, n)
    }

    #[test]
    fn every_element_has_exactly_one_owner_and_shards_are_balanced() {
        let (model, blocks) = set();
        let p = model.params();
        for ranks in 1..=5 {
            let layouts: Vec<_> = (0..ranks).map(|r| ShardLayout::new(p, blocks, ranks, r)).collect();
            let mut owner = vec![usize::MAX; p.len()];
            for (r, l) in layouts.iter().enumerate() {
                let mut len = 0;
                for u in 0..l.units().len() {
                    for i in l.owned(u) {
                        assert_eq!(owner[i], usize::MAX, "element {i} owned twice");
                        owner[i] = r;
                    }
                    assert_eq!(l.shard_range(u).len(), l.owned(u).len());
                    len += l.owned(u).len();
                }
                assert_eq!(len, l.shard_len());
                // The pieces a checkpoint writes are the same elements.
                let pieces: usize = l.owned_params(p).iter().map(|(_, r)| r.len()).sum();
                assert_eq!(pieces, l.shard_len());
            }
            assert!(owner.iter().all(|&o| o < ranks), "every element has an owner");
            let lens: Vec<usize> = layouts.iter().map(ShardLayout::shard_len).collect();
            let units = layouts[0].units().len();
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= units, "{lens:?}");
        }
    }

    #[test]
    fn shard_of_takes_the_owned_slices_in_unit_order() {
        let (model, blocks) = set();
        let p = model.params();
        let flat: Vec<f32> = (0..p.len()).map(|i| i as f32).collect();
        let l = ShardLayout::new(p, blocks, 3, 1);
        let shard = l.shard_of(&flat);
        for u in 0..l.units().len() {
            let want: Vec<f32> = l.owned(u).map(|i| i as f32).collect();
            assert_eq!(&shard[l.shard_range(u)], want.as_slice());
        }
        assert_eq!(l.unit_of_element(l.owned(1).start), Some(1));
    }
}
