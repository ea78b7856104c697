//! [`Chunks`]: a flat `f32` vector (gradients, parameters) as consecutive owned pieces.

use std::ops::Range;

use super::Grad;
use super::ParamSet;
use crate::error::{Error, Result};

/// Chunks found zero by one [`Chunks::add_grads`], each with the regions written so far.
type Fresh = Vec<(usize, Vec<Range<usize>>)>;

/// What a chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Its buffer holds its values.
    Values,
    /// Every element is zero; its buffer, if any, holds whatever it held before (no zero
    /// fill until something reads or adds to it).
    Zero,
    /// Taken out ([`Chunks::take`]) and not put back.
    Taken,
}

/// A flat `f32` vector kept as consecutive chunks, each its own `Vec`, so that one chunk
/// (a DDP bucket, a parameter-server shard) can be handed to an asynchronous collective and
/// come back without a copy.
///
/// Zeroing is lazy: [`zero`](Chunks::zero) only marks the chunks, and the first gradients
/// stored into a zero chunk are written over its buffer ([`add_grads`](Chunks::add_grads)),
/// so a training step does not fill its gradient buffers with zeros first.
#[derive(Clone, Debug)]
pub struct Chunks {
    /// Chunk `i` covers `starts[i]..starts[i + 1]`.
    starts: Vec<usize>,
    bufs: Vec<Vec<f32>>,
    held: Vec<Held>,
    /// Buffers given back ([`recycle`](Self::recycle)), reused when a vacant chunk of their
    /// length is first written: a fresh one costs a page fault per page.
    spare: Vec<Vec<f32>>,
}

impl Chunks {
    /// Chunks of the given lengths, in order, holding zeros.
    pub fn new(lens: &[usize]) -> Chunks {
        let mut starts = vec![0];
        for &l in lens {
            starts.push(starts[starts.len() - 1] + l);
        }
        let held = vec![Held::Values; lens.len()];
        Chunks { starts, bufs: lens.iter().map(|&l| vec![0.0; l]).collect(), held, spare: Vec::new() }
    }

    /// Zero chunks of the given lengths with no buffer yet: each gets one (a spare one if
    /// any) when something is first stored into it, and may be
    /// [taken for good](Self::take_for_good) (ZeRO stages 2 and 3 keep a block's full
    /// gradient only until it is reduce-scattered).
    pub fn vacant(lens: &[usize]) -> Chunks {
        let mut c = Chunks::new(lens);
        for (b, h) in c.bufs.iter_mut().zip(&mut c.held) {
            *b = Vec::new();
            *h = Held::Zero;
        }
        c
    }

    /// One chunk holding `values`.
    pub fn from_vec(values: Vec<f32>) -> Chunks {
        Chunks {
            starts: vec![0, values.len()],
            bufs: vec![values],
            held: vec![Held::Values],
            spare: Vec::new(),
        }
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

    /// Chunk `i`: empty while it is [taken](Self::take) or zero since [`zero`](Self::zero)
    /// or [`vacant`](Self::vacant) with nothing added (readers that need its elements take
    /// it, or [`get`](Self::get) them).
    pub fn chunk(&self, i: usize) -> &[f32] {
        match self.held[i] {
            Held::Values => &self.bufs[i],
            Held::Zero | Held::Taken => &[],
        }
    }

    /// Chunk `i`, to change in place (a zero chunk is filled with zeros first; empty while
    /// taken).
    pub fn chunk_mut(&mut self, i: usize) -> &mut [f32] {
        self.fill(i, true);
        &mut self.bufs[i]
    }

    /// Sets every element to zero, lazily: the chunks are marked, their buffers kept.
    pub fn zero(&mut self) {
        for h in &mut self.held {
            if *h == Held::Values {
                *h = Held::Zero;
            }
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
            self.fill(i, true);
            let n = rest.len().min(self.bufs[i].len().saturating_sub(at));
            if n == 0 {
                return Err(Error::internal(format!("chunk {i} is taken out: nothing can be stored in it")));
            }
            for (d, s) in self.bufs[i][at..at + n].iter_mut().zip(&rest[..n]) {
                f(d, *s);
            }
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A copy of the elements in `range`, across chunk boundaries; an error if part of it lies
    /// in a chunk taken out.
    pub fn get(&self, range: Range<usize>) -> Result<Vec<f32>> {
        if range.end > self.len() {
            return Err(Error::internal(format!("elements {range:?} are beyond {}", self.len())));
        }
        let mut out = Vec::with_capacity(range.len());
        for i in 0..self.count() {
            let r = self.range(i);
            let (from, to) = (range.start.max(r.start), range.end.min(r.end));
            if from >= to {
                continue;
            }
            match self.held[i] {
                Held::Values => out.extend_from_slice(&self.bufs[i][from - r.start..to - r.start]),
                Held::Zero => out.resize(out.len() + (to - from), 0.0),
                Held::Taken => {
                    return Err(Error::internal(format!("elements {range:?} lie in chunk {i}, taken out")));
                }
            }
        }
        Ok(out)
    }

    /// Adds every gradient of `grads` (slot index, gradient) at its slot's place: straight
    /// from the gradient's storage, and a weight's product computed into the chunk
    /// ([`Grad::add_to`]), when the slot lies in one chunk.
    ///
    /// A chunk this call finds zero (vacant, or marked by [`zero`](Self::zero)) is not
    /// zero-filled first: its old buffer or a spare one is taken as it is, the first
    /// gradient of each region is written over it ([`Grad::write_to`]),
    /// and what no gradient covers is zeroed once they all are in (also when one fails), so
    /// that every chunk holds only sums of gradients when this returns.
    pub fn add_grads(&mut self, set: &ParamSet, grads: &[(usize, Grad)]) -> Result<()> {
        let mut fresh = Vec::new();
        let stored = self.store_grads(set, grads, &mut fresh);
        self.settle(&mut fresh);
        stored
    }

    /// [`add_grads`](Self::add_grads)' loop; `fresh` collects the chunks it found zero,
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
            match self.held[c] {
                Held::Zero => {
                    self.fill(c, false);
                    fresh.push((c, Vec::new()));
                }
                Held::Taken => {
                    return Err(Error::internal(format!("a gradient for chunk {c}, which is taken out")));
                }
                Held::Values => {}
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

    /// Makes a zero chunk `i` hold values: its buffer, else a spare one of its length, else
    /// a fresh zeroed one, filled with zeros if `zero` (else left as it is: the caller
    /// writes every element before anyone reads it).
    fn fill(&mut self, i: usize, zero: bool) {
        if self.held[i] != Held::Zero {
            return;
        }
        let len = self.range(i).len();
        if self.bufs[i].len() != len {
            self.bufs[i] = match self.spare.iter().position(|b| b.len() == len) {
                Some(k) => self.spare.swap_remove(k),
                None => vec![0.0; len],
            };
        }
        if zero {
            self.bufs[i].fill(0.0);
        }
        self.held[i] = Held::Values;
    }

    /// Takes chunk `i` out (to hand it to a collective; a zero chunk is filled with zeros
    /// first), leaving it empty.
    pub fn take(&mut self, i: usize) -> Vec<f32> {
        self.fill(i, true);
        self.held[i] = Held::Taken;
        std::mem::take(&mut self.bufs[i])
    }

    /// Takes chunk `i` out for good (a zero chunk is filled with zeros first): the chunk is
    /// zero again at once, and the next gradient stored into it starts a new buffer (a spare
    /// one when the taken buffer comes back through [`recycle`](Self::recycle)).
    pub fn take_for_good(&mut self, i: usize) -> Vec<f32> {
        self.fill(i, true);
        self.held[i] = Held::Zero;
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
        self.held[i] = Held::Values;
        Ok(())
    }

    /// The chunks, with the flat range each covers ([`chunk`](Self::chunk) of each).
    pub fn iter(&self) -> impl Iterator<Item = (Range<usize>, &[f32])> {
        (0..self.count()).map(|i| (self.range(i), self.chunk(i)))
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

    /// After `zero`, chunks read as zeros whatever their buffers held, the first gradient
    /// of a region is written over the old values and what none reached is zero, a chunk
    /// taken out is zeros, and a chunk taken out cannot be read or written.
    #[test]
    fn zeroing_is_lazy_and_never_shows_old_values() {
        let p = |name: &str, n: usize| {
            Param::new(name, Var::zeros(n, candle_core::DType::F32, &Device::Cpu).unwrap())
        };
        let set = ParamSet::new(&[&[p("a", 6), p("b", 4)], &[p("c", 5)]]).unwrap();
        let gb = [1.0, -2.0, 3.0, -4.0];
        let mut c = Chunks::new(&[10, 5]);
        c.set(0, &[7.0; 15]).unwrap();
        c.zero();
        assert_eq!(c.get(0..15).unwrap(), vec![0.0; 15]);
        assert!(c.iter().all(|(_, values)| values.is_empty()), "a zero chunk shows its old buffer");
        c.add_grads(&set, &[(1, grad(&gb))]).unwrap();
        assert_eq!(&c.chunk(0)[..6], &[0.0; 6], "old values under a parameter no gradient reached");
        assert_eq!(&c.chunk(0)[6..], &gb);
        let taken = c.take(1);
        assert_eq!(taken, vec![0.0; 5]);
        assert!(c.get(9..11).is_err(), "a taken chunk read");
        assert!(c.add(10, &[1.0]).is_err(), "a taken chunk written");
        assert!(c.add_grads(&set, &[(2, grad(&[1.0; 5]))]).is_err(), "a gradient into a taken chunk");
        c.put(1, taken).unwrap();
        c.add(10, &[1.0]).unwrap();
        assert_eq!(c.chunk(1), &[1.0, 0.0, 0.0, 0.0, 0.0]);
        c.zero();
        assert_eq!(c.chunk_mut(1), &mut [0.0; 5], "a zero chunk changed in place is zeros");
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
