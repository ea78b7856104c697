//! [`Chunks`]: a flat `f32` vector (gradients, parameters) as consecutive owned pieces.

use std::ops::Range;

use super::Grad;
use super::ParamSet;
use crate::error::{Error, Result};

/// Chunks found vacant by one [`Chunks::add_grads`], each with the regions written so far.
type Fresh = Vec<(usize, Vec<Range<usize>>)>;

/// A flat `f32` vector kept as consecutive chunks, each its own `Vec`, so that one chunk
/// (a DDP bucket, a parameter-server shard) can be handed to an asynchronous collective and
/// come back without a copy.
#[derive(Clone, Debug)]
pub struct Chunks {
    /// Chunk `i` covers `starts[i]..starts[i + 1]`.
    starts: Vec<usize>,
    bufs: Vec<Vec<f32>>,
    /// Buffers given back ([`recycle`](Self::recycle)), reused when a vacant chunk of their
    /// length is first written: a fresh one costs a page fault per page.
    spare: Vec<Vec<f32>>,
}

impl Chunks {
    /// Zeroed chunks of the given lengths, in order.
    pub fn new(lens: &[usize]) -> Chunks {
        let mut starts = vec![0];
        for &l in lens {
            starts.push(starts[starts.len() - 1] + l);
        }
        Chunks { starts, bufs: lens.iter().map(|&l| vec![0.0; l]).collect(), spare: Vec::new() }
    }

    /// Chunks of the given lengths that hold nothing yet: each is allocated, zeroed, when
    /// something is first added to it, and may be [taken](Self::take) for good (ZeRO stages
    /// 2 and 3 keep a block's full gradient only until it is reduce-scattered).
    pub fn vacant(lens: &[usize]) -> Chunks {
        let mut c = Chunks::new(lens);
        for b in &mut c.bufs {
            *b = Vec::new();
        }
        c
    }

    /// One chunk holding `values`.
    pub fn from_vec(values: Vec<f32>) -> Chunks {
        Chunks { starts: vec![0, values.len()], bufs: vec![values], spare: Vec::new() }
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.bufs.len()
    }

    /// Total elements.
    pub fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The flat range chunk `i` covers.
    pub fn range(&self, i: usize) -> Range<usize> {
        self.starts[i]..self.starts[i + 1]
    }

    /// Chunk `i`.
    pub fn chunk(&self, i: usize) -> &[f32] {
        &self.bufs[i]
    }

    /// Chunk `i`, to change in place (empty while [taken](Self::take) or vacant).
    pub fn chunk_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.bufs[i]
    }

    /// Sets every element to zero.
    pub fn zero(&mut self) {
        for b in &mut self.bufs {
            b.fill(0.0);
        }
    }

    /// Adds `values` into the elements from `offset` on, across chunk boundaries.
    pub fn add(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        self.zip_mut(offset, values, |d, s| *d += s)
    }

    /// Sets the elements from `offset` on to `values`, across chunk boundaries.
    pub fn set(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        self.zip_mut(offset, values, |d, s| *d = s)
    }

    /// Applies `f(element, value)` to the elements from `offset` on and `values`.
    fn zip_mut(&mut self, offset: usize, values: &[f32], f: impl Fn(&mut f32, f32)) -> Result<()> {
        if offset + values.len() > self.len() {
            return Err(Error::internal(format!(
                "gradient of {} elements at {offset} does not fit in {} elements",
                values.len(),
                self.len()
            )));
        }
        let mut pos = offset;
        let mut rest = values;
        while !rest.is_empty() {
            let i = self.starts.partition_point(|&s| s <= pos) - 1;
            let at = pos - self.starts[i];
            self.fill_vacant(i, true);
            let n = rest.len().min(self.bufs[i].len() - at);
            for (d, s) in self.bufs[i][at..at + n].iter_mut().zip(&rest[..n]) {
                f(d, *s);
            }
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A copy of the elements in `range`, across chunk boundaries; an error if part of it lies
    /// in a chunk taken out or vacant.
    pub fn get(&self, range: Range<usize>) -> Result<Vec<f32>> {
        if range.end > self.len() {
            return Err(Error::internal(format!("elements {range:?} are beyond {}", self.len())));
        }
        let mut out = Vec::with_capacity(range.len());
        for (r, chunk) in self.iter() {
            let (from, to) = (range.start.max(r.start), range.end.min(r.end));
            if from < to {
                let values = chunk.get(from - r.start..to - r.start).ok_or_else(|| {
                    Error::internal(format!("elements {range:?} lie in a chunk taken out or never filled"))
                })?;
                out.extend_from_slice(values);
            }
        }
        Ok(out)
    }

    /// Adds every gradient of `grads` (slot index, gradient) at its slot's place: straight
    /// from the gradient's storage, and a weight's product computed into the chunk
    /// ([`Grad::add_to`]), when the slot lies in one chunk.
    ///
    /// A chunk this call finds vacant is not zero-filled first: a spare buffer is taken as
    /// it is, the first gradient of each region is written over it ([`Grad::write_to`]),
    /// and what no gradient covers is zeroed once they all are in (also when one fails), so
    /// that every chunk holds only sums of gradients when this returns.
    pub fn add_grads(&mut self, set: &ParamSet, grads: &[(usize, Grad)]) -> Result<()> {
        let mut fresh = Vec::new();
        let stored = self.store_grads(set, grads, &mut fresh);
        self.settle(&mut fresh);
        stored
    }

    /// [`add_grads`](Self::add_grads)' loop; `fresh` collects the chunks it found vacant,
    /// each with the regions (in the chunk) written so far.
    fn store_grads(&mut self, set: &ParamSet, grads: &[(usize, Grad)], fresh: &mut Fresh) -> Result<()> {
        for (i, g) in grads {
            let slot = &set.slots()[*i];
            let (offset, len) = (slot.offset, slot.range().len());
            let Some((c, at)) = self.locate(offset, len) else {
                // Across chunks: added element by element, over settled chunks.
                self.settle(fresh);
                let t = g.tensor()?.flatten_all()?.to_vec1::<f32>()?;
                self.add(offset, &t)?;
                continue;
            };
            let region = at..at + len;
            if self.bufs[c].is_empty() && !self.range(c).is_empty() {
                self.fill_vacant(c, false);
                fresh.push((c, Vec::new()));
            }
            let disjoint = |r: &Range<usize>| r.end <= region.start || region.end <= r.start;
            let within = |r: &Range<usize>| r.start <= region.start && region.end <= r.end;
            match fresh.iter_mut().find(|(k, _)| *k == c) {
                // The region's first gradient: written over whatever the buffer held.
                Some((_, written)) if written.iter().all(disjoint) => {
                    g.write_to(&mut self.bufs[c][region.clone()])?;
                    written.push(region);
                }
                // Added to a gradient written before (the same parameter again).
                Some((_, written)) if written.iter().any(within) => g.add_to(&mut self.bufs[c][region])?,
                // Partly over unwritten elements: they are zeroed first.
                Some(_) => {
                    self.settle(fresh);
                    g.add_to(&mut self.bufs[c][region])?;
                }
                None => g.add_to(&mut self.bufs[c][region])?,
            }
        }
        Ok(())
    }

    /// Zeroes what no gradient wrote of the chunks in `fresh` (their regions are disjoint),
    /// and forgets them.
    fn settle(&mut self, fresh: &mut Fresh) {
        for (c, mut written) in fresh.drain(..) {
            written.sort_by_key(|r| r.start);
            let buf = &mut self.bufs[c];
            let mut at = 0;
            for r in written {
                buf[at..r.start].fill(0.0);
                at = r.end;
            }
            buf[at..].fill(0.0);
        }
    }

    /// The chunk holding elements `offset .. offset + len` whole, and where they start in it.
    fn locate(&self, offset: usize, len: usize) -> Option<(usize, usize)> {
        if offset + len > self.len() {
            return None;
        }
        let i = self.starts.partition_point(|&s| s <= offset).checked_sub(1)?;
        let at = offset - self.starts[i];
        (at + len <= self.range(i).len()).then_some((i, at))
    }

    /// Allocates chunk `i` if it is vacant, reusing a spare buffer of its length (zeroed if
    /// `zero`, else as it is: the caller writes every element before anyone reads it) or a
    /// fresh zeroed one.
    fn fill_vacant(&mut self, i: usize, zero: bool) {
        if self.bufs[i].is_empty() {
            let len = self.range(i).len();
            self.bufs[i] = match self.spare.iter().position(|b| b.len() == len) {
                Some(k) => {
                    let mut b = self.spare.swap_remove(k);
                    if zero {
                        b.fill(0.0);
                    }
                    b
                }
                None => vec![0.0; len],
            };
        }
    }

    /// Takes chunk `i` out (to hand it to a collective), leaving it empty.
    pub fn take(&mut self, i: usize) -> Vec<f32> {
        std::mem::take(&mut self.bufs[i])
    }

    /// Gives back a buffer taken for good (a chunk reduce-scattered and no longer needed),
    /// for a vacant chunk of the same length to reuse.
    pub fn recycle(&mut self, buf: Vec<f32>) {
        self.spare.push(buf);
    }

    /// Puts chunk `i` back after [`take`](Self::take).
    pub fn put(&mut self, i: usize, buf: Vec<f32>) -> Result<()> {
        if buf.len() != self.range(i).len() {
            return Err(Error::internal(format!(
                "chunk {i} came back with {} elements instead of {}",
                buf.len(),
                self.range(i).len()
            )));
        }
        self.bufs[i] = buf;
        Ok(())
    }

    /// The chunks, with the flat range each covers.
    pub fn iter(&self) -> impl Iterator<Item = (Range<usize>, &[f32])> {
        (0..self.count()).map(|i| (self.range(i), self.bufs[i].as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;
    use crate::params::Param;

    fn grad(values: &[f32]) -> Grad {
        Grad::Tensor(Tensor::from_slice(values, values.len(), &Device::Cpu).unwrap())
    }

    /// Gradients stored into vacant chunks whose spare buffers hold garbage give what
    /// zeroed chunks give: each region's first gradient written over, a second one added,
    /// what no gradient covers zero; a chunk nothing reached stays vacant.
    #[test]
    fn gradients_into_vacant_chunks_equal_gradients_into_zeroed_ones() {
        let p = |name: &str, n: usize| {
            Param::new(name, Var::zeros(n, candle_core::DType::F32, &Device::Cpu).unwrap())
        };
        let (a, b, c) = (p("a", 6), p("b", 4), p("c", 5));
        let set = ParamSet::new(&[&[a, b], &[c]]).unwrap();
        let ga: Vec<f32> = (0..6).map(|i| i as f32 + 0.5).collect();
        let gb = [1.0, -2.0, 3.0, -4.0];
        let rounds: [Vec<(usize, Grad)>; 3] = [
            vec![(0, grad(&ga))],
            vec![(1, grad(&gb)), (0, grad(&ga)), (1, grad(&gb))],
            vec![(2, grad(&[1.0; 5]))],
        ];
        let mut zeroed = Chunks::new(&[10, 5]);
        let mut vacant = Chunks::vacant(&[10, 5]);
        vacant.recycle(vec![f32::NAN; 10]);
        vacant.recycle(vec![f32::NAN; 5]);
        for (k, round) in rounds.iter().enumerate() {
            zeroed.add_grads(&set, round).unwrap();
            vacant.add_grads(&set, round).unwrap();
            assert_eq!(vacant.chunk(0), zeroed.chunk(0), "round {k}");
            if k < 2 {
                assert!(vacant.chunk(1).is_empty(), "round {k}: a chunk nothing reached was filled");
            }
        }
        assert_eq!(vacant.chunk(1), zeroed.chunk(1));
        let want: Vec<f32> = ga.iter().map(|g| 2.0 * g).chain(gb.iter().map(|g| 2.0 * g)).collect();
        assert_eq!(zeroed.chunk(0), want.as_slice());
        // Only the region a gradient reached was written; the rest is zero, not garbage.
        let mut part = Chunks::vacant(&[10, 5]);
        part.recycle(vec![f32::NAN; 10]);
        part.add_grads(&set, &[(1, grad(&gb))]).unwrap();
        assert_eq!(&part.chunk(0)[..6], &[0.0; 6]);
        assert_eq!(&part.chunk(0)[6..], &gb);
        // The same parameter twice in the call that fills a vacant chunk: written, then added.
        let mut twice = Chunks::vacant(&[10, 5]);
        twice.recycle(vec![f32::NAN; 10]);
        twice.add_grads(&set, &[(1, grad(&gb)), (1, grad(&gb)), (0, grad(&ga))]).unwrap();
        let want: Vec<f32> = ga.iter().copied().chain(gb.iter().map(|g| 2.0 * g)).collect();
        assert_eq!(twice.chunk(0), want.as_slice());
    }

    #[test]
    fn add_spans_chunks() {
        let mut c = Chunks::new(&[2, 0, 3]);
        c.add(1, &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(c.chunk(0), &[0.0, 1.0]);
        assert_eq!(c.chunk(1), &[] as &[f32]);
        assert_eq!(c.chunk(2), &[2.0, 3.0, 0.0]);
        assert!(c.add(4, &[1.0, 1.0]).is_err());
        let b = c.take(2);
        assert!(c.get(1..4).is_err(), "a taken chunk read");
        assert!(c.put(2, vec![0.0]).is_err());
        c.put(2, b).unwrap();
        assert_eq!(c.range(2), 2..5);
    }
}
