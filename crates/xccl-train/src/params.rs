//! Parameters as one ordered list with flat views: [`Param`], [`ParamSet`] and the chunked
//! gradient buffer [`Chunks`].
//!
//! Every collective over parameters or gradients works on one flat `f32` vector whose order
//! is fixed by the model's structure: block by block, and by name inside a block. It never
//! depends on a hash map's iteration order, so every process lays its buffers out alike.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{Tensor, TensorId, Var};

use crate::error::{Error, Result};

/// One named, trainable tensor of a block.
#[derive(Clone, Debug)]
pub struct Param {
    name: String,
    var: Var,
}

impl Param {
    /// A parameter called `name` held in `var`.
    pub fn new(name: impl Into<String>, var: Var) -> Param {
        Param { name: name.into(), var }
    }

    /// Its full name, e.g. `h01.attn.qkv.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The variable holding its value.
    pub fn var(&self) -> &Var {
        &self.var
    }

    /// Its value, as a tensor that tracks gradients.
    pub fn tensor(&self) -> &Tensor {
        self.var.as_tensor()
    }
}

/// Where one parameter sits in the flat vector.
#[derive(Clone, Debug)]
pub struct Slot {
    /// The parameter.
    pub param: Param,
    /// Index of the block that owns it.
    pub block: usize,
    /// First element in the flat vector.
    pub offset: usize,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl Slot {
    /// Its elements in the flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.shape.iter().product::<usize>()
    }
}

/// All parameters of a model in their fixed order (owning block, then name) with their
/// places in the flat vector.
#[derive(Clone, Debug)]
pub struct ParamSet {
    slots: Vec<Slot>,
    len: usize,
    by_id: HashMap<TensorId, usize>,
}

impl ParamSet {
    /// Lays out the parameters owned by each block (`owned[k]` for block `k`).
    pub fn new(owned: &[&[Param]]) -> Result<ParamSet> {
        let mut slots = Vec::new();
        let mut len = 0;
        for (block, params) in owned.iter().enumerate() {
            let mut params: Vec<&Param> = params.iter().collect();
            params.sort_by(|a, b| a.name.cmp(&b.name));
            for p in params {
                let shape = p.tensor().dims().to_vec();
                slots.push(Slot { param: p.clone(), block, offset: len, shape });
                len += p.tensor().elem_count();
            }
        }
        let mut by_id = HashMap::new();
        let mut names = HashMap::new();
        for (i, s) in slots.iter().enumerate() {
            if by_id.insert(s.param.tensor().id(), i).is_some() {
                return Err(Error::config(format!("parameter {} is owned by two blocks", s.param.name)));
            }
            if names.insert(s.param.name.clone(), i).is_some() {
                return Err(Error::config(format!("two parameters are called {}", s.param.name)));
            }
        }
        Ok(ParamSet { slots, len, by_id })
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no parameters at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parameters in order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The index of the slot holding `param`, if it belongs to this set.
    pub fn index_of(&self, param: &Param) -> Option<usize> {
        self.by_id.get(&param.tensor().id()).copied()
    }

    /// The flat elements owned by blocks `blocks` (a contiguous range, as blocks are laid
    /// out in order).
    pub fn range_of_blocks(&self, blocks: Range<usize>) -> Range<usize> {
        let inside = || self.slots.iter().filter(|s| blocks.contains(&s.block));
        let start = inside().map(|s| s.offset).min().unwrap_or(0);
        let end = inside().map(|s| s.range().end).max().unwrap_or(start);
        start..end
    }

    /// Every parameter's current value, concatenated in order.
    pub fn read(&self) -> Result<Vec<f32>> {
        let mut flat = Vec::with_capacity(self.len);
        for s in &self.slots {
            flat.extend(s.param.tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(flat)
    }

    /// Sets every parameter from `flat` (as [`read`](Self::read) returns it).
    pub fn write(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.len {
            return Err(Error::config(format!(
                "{} values given for {} parameter elements",
                flat.len(),
                self.len
            )));
        }
        for s in &self.slots {
            let t = Tensor::from_slice(&flat[s.range()], s.shape.as_slice(), s.param.tensor().device())?;
            s.param.var.set(&t)?;
        }
        Ok(())
    }
}

/// A flat `f32` vector kept as consecutive chunks, each its own `Vec`, so that one chunk
/// (a DDP bucket, a parameter-server shard) can be handed to an asynchronous collective and
/// come back without a copy.
#[derive(Clone, Debug)]
pub struct Chunks {
    /// Chunk `i` covers `starts[i]..starts[i + 1]`.
    starts: Vec<usize>,
    bufs: Vec<Vec<f32>>,
}

impl Chunks {
    /// Zeroed chunks of the given lengths, in order.
    pub fn new(lens: &[usize]) -> Chunks {
        let mut starts = vec![0];
        for &l in lens {
            starts.push(starts[starts.len() - 1] + l);
        }
        Chunks { starts, bufs: lens.iter().map(|&l| vec![0.0; l]).collect() }
    }

    /// One chunk holding `values`.
    pub fn from_vec(values: Vec<f32>) -> Chunks {
        Chunks { starts: vec![0, values.len()], bufs: vec![values] }
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

    /// Sets every element to zero.
    pub fn zero(&mut self) {
        for b in &mut self.bufs {
            b.fill(0.0);
        }
    }

    /// Adds `values` into the elements from `offset` on, across chunk boundaries.
    pub fn add(&mut self, offset: usize, values: &[f32]) -> Result<()> {
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
            let n = rest.len().min(self.bufs[i].len() - at);
            for (d, s) in self.bufs[i][at..at + n].iter_mut().zip(&rest[..n]) {
                *d += s;
            }
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Adds every gradient of `grads` (slot index, gradient tensor) at its slot's place.
    pub fn add_grads(&mut self, set: &ParamSet, grads: &[(usize, Tensor)]) -> Result<()> {
        for (i, g) in grads {
            let values = g.flatten_all()?.to_vec1::<f32>()?;
            self.add(set.slots()[*i].offset, &values)?;
        }
        Ok(())
    }

    /// Takes chunk `i` out (to hand it to a collective), leaving it empty.
    pub fn take(&mut self, i: usize) -> Vec<f32> {
        std::mem::take(&mut self.bufs[i])
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
