//! Parameters as one ordered list with flat views: [`Param`], [`ParamSet`] and the chunked
//! gradient buffer [`Chunks`].
//!
//! Every collective over parameters or gradients works on one flat `f32` vector whose order
//! is fixed by the model's structure: block by block, and by name inside a block. It never
//! depends on a hash map's iteration order, so every process lays its buffers out alike.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, RwLock};

use candle_core::{Tensor, Var};

use crate::error::{Error, Result};

mod chunks;
pub mod grad;
mod lent;
pub use chunks::Chunks;
pub use grad::Grad;
pub use lent::Lent;

/// How a parameter is divided over the tensor-parallel group.
///
/// The *full* tensor is the parameter of the unsharded model (tp = 1), with the same name;
/// every rank of the group holds either all of it or one piece of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shard {
    /// Every rank holds the whole tensor.
    Replicated,
    /// Divided along dimension `dim`. That dimension of the full tensor is `groups` equal
    /// consecutive groups (3 for a fused q/k/v weight, else 1); each group is padded with
    /// zeros to a multiple of `parts` and cut into `parts` contiguous pieces, and rank
    /// `index` holds piece `index` of every group (Megatron's `stride`). A vocabulary of 12
    /// over 8 ranks: padded to 16, two rows per rank, ranks 6 and 7 hold padding only.
    Split {
        /// The dimension divided.
        dim: usize,
        /// Consecutive groups the dimension is made of.
        groups: usize,
        /// Pieces each group is cut into (the tensor-parallel group's size).
        parts: usize,
        /// The piece this rank holds.
        index: usize,
    },
}

impl Shard {
    /// The shape this rank holds of a full tensor of shape `full`.
    pub fn local_shape(&self, full: &[usize]) -> Vec<usize> {
        let mut shape = full.to_vec();
        if let Shard::Split { dim, groups, parts, .. } = *self {
            shape[dim] = groups * (full[dim] / groups).div_ceil(parts);
        }
        shape
    }

    /// The indices of a group of `len` this rank holds, padding included (they may run past
    /// `len`): piece `index` of `⌈len / parts⌉`; everything when not split.
    pub fn piece(&self, len: usize) -> Range<usize> {
        match *self {
            Shard::Replicated => 0..len,
            Shard::Split { parts, index, .. } => {
                let piece = len.div_ceil(parts);
                index * piece..(index + 1) * piece
            }
        }
    }

    /// For each element along the divided dimension of the local tensor, the index it has
    /// in the full tensor, or `None` for padding; `None` when not split.
    fn local_to_full(&self, full: &[usize]) -> Option<Vec<Option<usize>>> {
        let Shard::Split { dim, groups, .. } = *self else { return None };
        let per_group = full[dim] / groups;
        let piece = self.piece(per_group);
        let map = (0..groups)
            .flat_map(|g| piece.clone().map(move |at| (at < per_group).then_some(g * per_group + at)))
            .collect();
        Some(map)
    }

    /// This rank's piece of `full_values` (a tensor of shape `full`), padding zero.
    pub fn slice(&self, full: &[usize], full_values: &[f32]) -> Vec<f32> {
        let Some(map) = self.local_to_full(full) else { return full_values.to_vec() };
        let Shard::Split { dim, .. } = *self else { return full_values.to_vec() };
        let (outer, inner) = outer_inner(full, dim);
        let mut out = Vec::with_capacity(outer * map.len() * inner);
        for o in 0..outer {
            for m in &map {
                match m {
                    Some(j) => {
                        let at = (o * full[dim] + j) * inner;
                        out.extend_from_slice(&full_values[at..at + inner]);
                    }
                    None => out.extend(std::iter::repeat_n(0.0, inner)),
                }
            }
        }
        out
    }

    /// Writes this rank's piece `local` into `full_values` (shape `full`), skipping padding.
    pub fn place(&self, full: &[usize], local: &[f32], full_values: &mut [f32]) {
        let (Some(map), Shard::Split { dim, .. }) = (self.local_to_full(full), *self) else {
            full_values.copy_from_slice(local);
            return;
        };
        let (outer, inner) = outer_inner(full, dim);
        for o in 0..outer {
            for (i, m) in map.iter().enumerate() {
                if let Some(j) = m {
                    let from = (o * map.len() + i) * inner;
                    let to = (o * full[dim] + j) * inner;
                    full_values[to..to + inner].copy_from_slice(&local[from..from + inner]);
                }
            }
        }
    }

    /// The same division for another rank of the group.
    pub fn for_rank(&self, rank: usize) -> Shard {
        match *self {
            Shard::Replicated => Shard::Replicated,
            Shard::Split { dim, groups, parts, .. } => Shard::Split { dim, groups, parts, index: rank },
        }
    }
}

/// Elements before dimension `dim` (as one count) and after it.
fn outer_inner(shape: &[usize], dim: usize) -> (usize, usize) {
    (shape[..dim].iter().product(), shape[dim + 1..].iter().product())
}

/// One named, trainable tensor of a block.
///
/// Clones share one cell holding the current value: the layers of a block hold clones and
/// read the value at every forward, so the value can be released (its memory freed),
/// materialised again (ZeRO stage 3 keeps only a shard between uses) or lent from a larger
/// buffer without the layers knowing.
///
/// The value is a candle variable (a tensor whose gradient candle's autograd computes)
/// unless it was [lent](Self::lend) as a view of a gathered buffer: a block that writes its
/// backward out reads either alike; one that leaves it to candle's autograd turns its
/// parameters into variables first ([`make_variable`](Self::make_variable)).
#[derive(Clone, Debug)]
pub struct Param {
    name: String,
    value: Arc<RwLock<Tensor>>,
    /// This rank's shape (its piece of the full tensor).
    shape: Vec<usize>,
    shard: Shard,
    full_shape: Vec<usize>,
}

impl Param {
    /// A parameter called `name` held in `var`, not sharded.
    pub fn new(name: impl Into<String>, var: Var) -> Param {
        let full_shape = var.as_tensor().dims().to_vec();
        Param::sharded(name, var, Shard::Replicated, full_shape)
    }

    /// A parameter holding piece `shard` of the full tensor of shape `full_shape`.
    pub fn sharded(name: impl Into<String>, var: Var, shard: Shard, full_shape: Vec<usize>) -> Param {
        let shape = var.as_tensor().dims().to_vec();
        let value = Arc::new(RwLock::new(var.as_tensor().clone()));
        Param { name: name.into(), value, shape, shard, full_shape }
    }

    /// How it is divided over the tensor-parallel group.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The shape of the full (unsharded) tensor.
    pub fn full_shape(&self) -> &[usize] {
        &self.full_shape
    }

    /// The shape this rank holds.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its full name, e.g. `h01.attn.qkv.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn cell(&self) -> std::sync::RwLockReadGuard<'_, Tensor> {
        // A writer never panics while holding the lock, so a poisoned lock still holds a
        // whole tensor.
        self.value.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put(&self, value: Tensor) {
        *self.value.write().unwrap_or_else(std::sync::PoisonError::into_inner) = value;
    }

    /// Whether `other` is this parameter (a clone of it), whatever its value is now.
    pub fn is(&self, other: &Param) -> bool {
        Arc::ptr_eq(&self.value, &other.value)
    }

    /// Its value as a candle variable: the one it holds, or, for a [lent](Self::lend)
    /// view, a copy (which the parameter does not keep).
    pub fn var(&self) -> Result<Var> {
        Ok(Var::from_tensor(&self.cell())?)
    }

    /// Its value (the current variable's tensor, or the view it was lent).
    pub fn tensor(&self) -> Tensor {
        self.cell().clone()
    }

    /// Whether its value is held (not [released](Self::release)).
    pub fn is_resident(&self) -> bool {
        self.cell().dims() == self.shape.as_slice()
    }

    /// Sets its value from `values` (this rank's shape, row-major), in a new variable (one
    /// copy of `values`): whatever held the old value (a saved graph) keeps it.
    pub fn set(&self, values: &[f32]) -> Result<()> {
        self.check_len(values.len())?;
        let var = Var::from_slice(values, self.shape.as_slice(), &candle_core::Device::Cpu)?;
        self.put(var.as_tensor().clone());
        Ok(())
    }

    /// Holds `view` (a tensor of this rank's shape, typically a piece of a larger buffer)
    /// as its value, without a copy. It is not a variable: candle's autograd computes no
    /// gradient for it until [`make_variable`](Self::make_variable). Whatever held the old
    /// value keeps it.
    pub fn lend(&self, view: Tensor) -> Result<()> {
        if view.dims() != self.shape.as_slice() || view.dtype() != candle_core::DType::F32 {
            return Err(Error::internal(format!(
                "parameter {} of shape {:?} lent a {:?} tensor of shape {:?}",
                self.name,
                self.shape,
                view.dtype(),
                view.dims()
            )));
        }
        self.put(view);
        Ok(())
    }

    /// Makes its value a candle variable if it is not one (a [lent](Self::lend) view: one
    /// copy), so that candle's autograd computes its gradient.
    pub fn make_variable(&self) -> Result<()> {
        let t = self.tensor();
        if !t.is_variable() {
            self.put(Var::from_tensor(&t)?.as_tensor().clone());
        }
        Ok(())
    }

    fn check_len(&self, n: usize) -> Result<()> {
        let want: usize = self.shape.iter().product();
        if n != want {
            return Err(Error::internal(format!(
                "{n} values given for parameter {} of {want} elements",
                self.name
            )));
        }
        Ok(())
    }

    /// Drops its value: the memory is freed once nothing else holds the old tensor (a
    /// saved graph, other views of the buffer it was lent from). Reading it again needs
    /// [`set`](Self::set) or [`lend`](Self::lend) first; a forward on a released parameter
    /// fails with a shape error.
    pub fn release(&self) -> Result<()> {
        self.put(Tensor::zeros(0, candle_core::DType::F32, &candle_core::Device::Cpu)?);
        Ok(())
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
    /// Its shape (this rank's piece).
    pub shape: Vec<usize>,
    /// First element in the full flat vector (every parameter unsharded, as at tp = 1).
    pub full_offset: usize,
    /// A copy of a parameter that a block of another pipeline stage owns (a tied output
    /// head on the last stage holds the first stage's token embedding): trained alike, its
    /// gradient summed with the owner's, but left out when the full vector is assembled.
    pub mirror: bool,
}

impl Slot {
    /// Its elements in the flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.shape.iter().product::<usize>()
    }

    /// Its elements in the full flat vector.
    pub fn full_range(&self) -> Range<usize> {
        self.full_offset..self.full_offset + self.param.full_shape.iter().product::<usize>()
    }

    /// `f` of its current values (resident, contiguous f32), read in place.
    fn with_values<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        let t = self.param.tensor();
        let (storage, layout) = t.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b)))
                if b - a == self.range().len() =>
            {
                Ok(f(&v[a..b]))
            }
            _ => Err(Error::internal(format!(
                "parameter {} is not a resident contiguous f32 tensor",
                self.param.name
            ))),
        }
    }

    /// Runs `f` on its current values (resident, contiguous f32) in place: no copy, no new
    /// variable. Whoever holds its tensor sees the new values (an optimiser step comes after
    /// every backward that read them).
    fn update(&self, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
        let op = InPlace {
            f: std::cell::Cell::new(Some(f)),
            len: self.range().len(),
            result: std::cell::Cell::new(None),
        };
        self.param.tensor().inplace_op1(&op)?;
        op.result
            .take()
            .unwrap_or_else(|| Err(Error::internal(format!("parameter {} was not updated", self.param.name))))
    }
}

/// A change of a tensor's values in place by `f` (candle's in-place custom operation hands
/// out its storage mutably), for [`Slot::update`].
struct InPlace<F> {
    f: std::cell::Cell<Option<F>>,
    /// The elements the tensor must hold.
    len: usize,
    /// `f`'s outcome, once it ran.
    result: std::cell::Cell<Option<Result<()>>>,
}

impl<F: FnOnce(&mut [f32]) -> Result<()>> candle_core::InplaceOp1 for InPlace<F> {
    fn name(&self) -> &'static str {
        "parameter update in place"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        match (storage, layout.contiguous_offsets()) {
            (candle_core::CpuStorage::F32(v), Some((a, b))) if b - a == self.len && b <= v.len() => {
                if let Some(f) = self.f.take() {
                    self.result.set(Some(f(&mut v[a..b])));
                }
                Ok(())
            }
            _ => candle_core::bail!("a parameter updated in place must be a resident contiguous f32 tensor"),
        }
    }
}

/// One parameter of the whole model, as the full flat vector lays it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its name.
    pub name: String,
    /// Its full (unsharded) shape.
    pub shape: Vec<usize>,
    /// The index of the block that owns it, in the whole model.
    pub block: usize,
    /// First element in the full flat vector.
    pub offset: usize,
}

impl Entry {
    /// Its elements in the full flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.shape.iter().product::<usize>()
    }
}

/// The full flat vector of the whole model, every parameter unsharded, block by block and
/// by name inside a block: what checkpoints hold and what every rank's pieces (of a
/// tensor-parallel group, of a pipeline stage) are cut from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    entries: Vec<Entry>,
    len: usize,
    /// (block, name): block `block` uses parameter `name`, which an earlier block owns.
    shared: Vec<(usize, String)>,
}

impl Layout {
    /// The layout of the parameters owned by each block (`owned[k]` for block `k`, given as
    /// name and full shape).
    pub fn new<'a>(owned: impl IntoIterator<Item = Vec<(&'a str, &'a [usize])>>) -> Layout {
        let mut layout = Layout::default();
        for (block, mut params) in owned.into_iter().enumerate() {
            params.sort_by(|a, b| a.0.cmp(b.0));
            for (name, shape) in params {
                let offset = layout.len;
                layout.len += shape.iter().product::<usize>();
                layout.entries.push(Entry { name: name.to_string(), shape: shape.to_vec(), block, offset });
            }
        }
        layout
    }

    /// The parameters in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Records that block `block` uses parameter `name`, which an earlier block owns.
    pub fn share(&mut self, block: usize, name: &str) {
        self.shared.push((block, name.to_string()));
    }

    /// Every (block, parameter name) where a block uses a parameter an earlier one owns.
    pub fn shared(&self) -> &[(usize, String)] {
        &self.shared
    }

    /// Elements of the full flat vector.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the model has no parameters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// All parameters a rank holds in their fixed order (owning block, then name) with their
/// places in this rank's flat vector and in the whole model's full one ([`Layout`]).
#[derive(Clone, Debug)]
pub struct ParamSet {
    slots: Vec<Slot>,
    len: usize,
    layout: std::sync::Arc<Layout>,
}

impl ParamSet {
    /// Lays out the parameters owned by each block (`owned[k]` for block `k`) of a whole
    /// model.
    pub fn new(owned: &[&[Param]]) -> Result<ParamSet> {
        let layout = Layout::new(
            owned.iter().map(|ps| ps.iter().map(|p| (p.name.as_str(), p.full_shape.as_slice())).collect()),
        );
        let blocks: Vec<usize> = (0..owned.len()).collect();
        ParamSet::part(owned, &blocks, std::sync::Arc::new(layout))
    }

    /// Lays out the parameters owned by the blocks of a part of a model whose whole
    /// parameters are `layout`: `owned[k]` are those of block `blocks[k]` of the whole model.
    /// A parameter `layout` places in a block outside `blocks` is a [mirror](Slot::mirror).
    pub fn part(owned: &[&[Param]], blocks: &[usize], layout: std::sync::Arc<Layout>) -> Result<ParamSet> {
        let mut slots = Vec::new();
        let mut len = 0;
        for (block, params) in owned.iter().enumerate() {
            let mut params: Vec<&Param> = params.iter().collect();
            params.sort_by(|a, b| a.name.cmp(&b.name));
            for p in params {
                let shape = p.shape.clone();
                if p.shard.local_shape(&p.full_shape) != shape {
                    return Err(Error::internal(format!(
                        "parameter {} holds {shape:?}, not its piece of {:?}",
                        p.name, p.full_shape
                    )));
                }
                let entry = layout.get(&p.name).filter(|e| e.shape == p.full_shape).ok_or_else(|| {
                    Error::internal(format!("parameter {} is not in the model's layout", p.name))
                })?;
                let mirror = blocks.get(block) != Some(&entry.block);
                slots.push(Slot {
                    param: p.clone(),
                    block,
                    offset: len,
                    shape,
                    full_offset: entry.offset,
                    mirror,
                });
                len += p.shape.iter().product::<usize>();
            }
        }
        let mut names = HashMap::new();
        for (i, s) in slots.iter().enumerate() {
            if slots[..i].iter().any(|o| o.param.is(&s.param)) {
                return Err(Error::config(format!("parameter {} is owned by two blocks", s.param.name)));
            }
            if names.insert(s.param.name.clone(), i).is_some() {
                return Err(Error::config(format!("two parameters are called {}", s.param.name)));
            }
        }
        Ok(ParamSet { slots, len, layout })
    }

    /// The whole model's full flat vector.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Total number of elements this rank holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Total number of elements of the whole model's full (unsharded) parameters.
    pub fn full_len(&self) -> usize {
        self.layout.len()
    }

    /// The full flat vector from every tensor-parallel rank's flat vector (`locals[r]` is
    /// rank `r`'s, as laid out by the same model built for rank `r`). Parameters this part
    /// of the model does not own (other pipeline stages', mirrors) are left zero.
    pub fn full_of_locals(&self, locals: &[&[f32]]) -> Result<Vec<f32>> {
        let mut full = vec![0.0; self.full_len()];
        for (r, local) in locals.iter().enumerate() {
            if local.len() != self.len {
                return Err(Error::internal(format!(
                    "rank {r} holds {} parameter elements, this rank {}",
                    local.len(),
                    self.len
                )));
            }
            for s in self.slots.iter().filter(|s| !s.mirror) {
                let shard = s.param.shard.for_rank(r);
                if r > 0 && shard == Shard::Replicated {
                    continue;
                }
                shard.place(&s.param.full_shape, &local[s.range()], &mut full[s.full_range()]);
            }
        }
        Ok(full)
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
        self.slots.iter().position(|s| s.param.is(param))
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

    /// The elements `range` of this rank's flat vector, read from the parameters.
    pub fn read_range(&self, range: Range<usize>) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(range.len());
        for s in &self.slots {
            let r = s.range();
            let (from, to) = (range.start.max(r.start), range.end.min(r.end));
            if from < to {
                s.with_values(|values| out.extend_from_slice(&values[from - r.start..to - r.start]))?;
            }
        }
        Ok(out)
    }

    /// Changes every parameter whose elements lie in `range` of this rank's flat vector (whole
    /// parameters only) in place: `f(offset, values)` gets its values (the elements from
    /// `offset` of the flat vector) to change, with no copy and no new variable, one
    /// parameter at a time. A tensor taken from the parameter before sees the new values (an
    /// optimiser step, the one caller, comes after every backward that read them).
    pub fn update_range(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        self.each_whole(range, |s| s.update(|values| f(s.offset, values)))
    }

    /// `f` of every parameter whose elements lie in `range` of this rank's flat vector, in
    /// order; an error if `range` covers one only in part.
    fn each_whole(&self, range: Range<usize>, mut f: impl FnMut(&Slot) -> Result<()>) -> Result<()> {
        for s in &self.slots {
            let r = s.range();
            if r.end <= range.start || r.start >= range.end {
                continue;
            }
            if r.start < range.start || r.end > range.end {
                return Err(Error::internal(format!(
                    "elements {range:?} cover parameter {} ({r:?}) only in part",
                    s.param.name
                )));
            }
            f(s)?;
        }
        Ok(())
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
            s.param.set(&flat[s.range()])?;
        }
        Ok(())
    }
}
