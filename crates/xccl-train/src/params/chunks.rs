//! [`Chunks`]: a flat `f32` vector (gradients, parameters) as consecutive owned pieces.

use std::ops::Range;

use super::Grad;
use super::ParamSet;
use crate::error::{Error, Result};

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
            self.fill_vacant(i);
            let n = rest.len().min(self.bufs[i].len() - at);
            for (d, s) in self.bufs[i][at..at + n].iter_mut().zip(&rest[..n]) {
                f(d, *s);
            }
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A copy of the elements in `range`, across chunk boundaries.
    pub fn get(&self, range: Range<usize>) -> Result<Vec<f32>> {
        if range.end > self.len() {
            return Err(Error::internal(format!("elements {range:?} are beyond {}", self.len())));
        }
        let mut out = Vec::with_capacity(range.len());
        for (r, chunk) in self.iter() {
            let (from, to) = (range.start.max(r.start), range.end.min(r.end));
            if from < to {
                out.extend_from_slice(&chunk[from - r.start..to - r.start]);
            }
        }
        Ok(out)
    }

    /// Adds every gradient of `grads` (slot index, gradient) at its slot's place: straight
    /// from the gradient's storage, and a weight's product computed into the chunk
    /// ([`Grad::add_to`]), when the slot lies in one chunk.
    pub fn add_grads(&mut self, set: &ParamSet, grads: &[(usize, Grad)]) -> Result<()> {
        for (i, g) in grads {
            let slot = &set.slots()[*i];
            match self.slice_mut(slot.offset, slot.range().len()) {
                Some(dst) => g.add_to(dst)?,
                None => {
                    let t = g.tensor()?.flatten_all()?.to_vec1::<f32>()?;
                    self.add(slot.offset, &t)?;
                }
            }
        }
        Ok(())
    }

    /// Elements `offset .. offset + len` as one slice, when they lie in one chunk (a vacant
    /// chunk is allocated, zeroed).
    fn slice_mut(&mut self, offset: usize, len: usize) -> Option<&mut [f32]> {
        if offset + len > self.len() {
            return None;
        }
        let i = self.starts.partition_point(|&s| s <= offset).checked_sub(1)?;
        let at = offset - self.starts[i];
        if at + len > self.range(i).len() {
            return None;
        }
        self.fill_vacant(i);
        Some(&mut self.bufs[i][at..at + len])
    }

    /// Allocates chunk `i`, zeroed, if it is vacant (reusing a spare buffer of its length).
    fn fill_vacant(&mut self, i: usize) {
        if self.bufs[i].is_empty() {
            let len = self.range(i).len();
            self.bufs[i] = match self.spare.iter().position(|b| b.len() == len) {
                Some(k) => {
                    let mut b = self.spare.swap_remove(k);
                    b.fill(0.0);
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
    use super::*;

    #[test]
    fn add_spans_chunks() {
        let mut c = Chunks::new(&[2, 0, 3]);
        c.add(1, &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(c.chunk(0), &[0.0, 1.0]);
        assert_eq!(c.chunk(1), &[] as &[f32]);
        assert_eq!(c.chunk(2), &[2.0, 3.0, 0.0]);
        assert!(c.add(4, &[1.0, 1.0]).is_err());
        let b = c.take(2);
        assert!(c.put(2, vec![0.0]).is_err());
        c.put(2, b).unwrap();
        assert_eq!(c.range(2), 2..5);
    }
}
