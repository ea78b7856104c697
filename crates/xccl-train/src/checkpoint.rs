//! Checkpoints of a training run, in the distributed format of [`crate::dcp`]: every rank
//! writes the pieces of the global tensors it holds, and a run at any other mesh reads back
//! only the pieces it needs.
//!
//! Tensors are `param.<name>` and `optim.<state>.<name>` (e.g. `optim.m.h00.attn.qkv.weight`)
//! with the parameter's full shape (the tp = 1 model's, without the vocabulary's padding).
//! A rank's tensor-parallel piece of a parameter is one box per group of the divided
//! dimension ([`pieces_of_slot`]); a ZeRO shard of it is a flat range of those boxes. Who
//! writes what: with DDP, the first data-parallel replica (each rank its tensor-parallel
//! pieces, a piece every rank of the group holds whole written by its first rank); with
//! ZeRO, every rank its slices ([`crate::zero::layout::ShardLayout::owned_params`]); the
//! parameter server's servers their shards. Metadata (`extra`): the configuration
//! fingerprint (a resumed run must have the same one), the loss history, the optimiser's
//! step count, the mesh that wrote it and, for a job that may be restarted, the job's id
//! (`run`: a restarted attempt resumes only from its own job's checkpoints). A checkpoint made by `xccl checkpoint import`
//! has parameters only and no fingerprint: a run starts from it with fresh optimiser
//! state.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde_json::{Value, json};

use crate::dcp::{self, Piece, Reader, Snapshot};
use crate::error::{Error, Result};
use crate::optim::OptimConfig;
use crate::params::{Layout, Param, ParamSet, Shard};

/// The checkpoint directory's name inside a run's output directory.
pub const DIR_NAME: &str = "checkpoint";

/// The name of parameter `name`'s tensor.
pub fn param_tensor(name: &str) -> String {
    format!("param.{name}")
}

/// The name of optimiser state `state`'s tensor for parameter `name`.
pub fn state_tensor(state: &str, name: &str) -> String {
    format!("optim.{state}.{name}")
}

/// Every tensor of a checkpoint of the model laid out by `layout` trained with `optim`.
pub fn tensors(layout: &Layout, optim: &OptimConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for e in layout.entries() {
        out.push((param_tensor(&e.name), e.shape.clone()));
        for state in optim.state_names() {
            out.push((state_tensor(state, &e.name), e.shape.clone()));
        }
    }
    out
}

/// The pieces of global tensor `tensor` that elements `range` of `param`'s local tensor
/// (this rank's tensor-parallel piece, row-major) are, each with the local elements it
/// holds; padding (a vocabulary the group does not divide) is left out. The boxes are
/// [`dcp::shard_boxes`]'; a range that is not a whole box is a flat range of one.
pub fn pieces_of_slot(
    tensor: &str,
    param: &Param,
    range: Range<usize>,
) -> Result<Vec<(Piece, Range<usize>)>> {
    let (full, local) = (param.full_shape(), param.shape());
    let (dim, outer) = match param.shard() {
        Shard::Split { dim, .. } => (dim, local[..dim].iter().product::<usize>()),
        Shard::Replicated => (0, 1),
    };
    let inner: usize = local.get(dim + 1..).map_or(1, |d| d.iter().product());
    let boxes = dcp::shard_boxes(tensor, full, param.shard());
    let mut out = Vec::new();
    for (piece, at) in boxes {
        // The box's elements in the local tensor: one run when the split dimension is the
        // outermost (or everything before it is 1); else the box must be the whole local
        // tensor (one group, no padding), whose order is then the box's.
        let held = if outer == 1 {
            let first = at * inner;
            first..first + piece.box_len()
        } else if piece.box_len() == param.shape().iter().product::<usize>() {
            0..piece.box_len()
        } else {
            return Err(Error::internal(format!(
                "{tensor}: a piece split along dimension {dim} with groups or padding is not one box"
            )));
        };
        let (from, to) = (range.start.max(held.start), range.end.min(held.end));
        if from < to {
            out.push((piece.with_flat(from - held.start..to - held.start), from..to));
        }
    }
    Ok(out)
}

/// Which values a snapshot takes: the parameters or optimiser state vector `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The parameters.
    Params,
    /// Optimiser state vector `i` (named by [`OptimConfig::state_names`]).
    State(usize),
}

/// What this rank writes to a checkpoint of `step`: for every `(slot, elements of the
/// slot)` of `parts`, the pieces of the parameter and of its optimiser state, their values
/// given by `values(source, elements of this rank's flat vector)`.
pub fn snapshot(
    set: &ParamSet,
    optim: &OptimConfig,
    parts: &[(usize, Range<usize>)],
    mut values: impl FnMut(Source, Range<usize>) -> Result<Vec<f32>>,
    step: u64,
    extra: BTreeMap<String, Value>,
) -> Result<Snapshot> {
    let mut pieces = Vec::new();
    for (i, range) in parts {
        let slot = &set.slots()[*i];
        let name = slot.param.name();
        let mut sources = vec![(Source::Params, param_tensor(name))];
        for (k, state) in optim.state_names().iter().enumerate() {
            sources.push((Source::State(k), state_tensor(state, name)));
        }
        for (source, tensor) in sources {
            for (piece, local) in pieces_of_slot(&tensor, &slot.param, range.clone())? {
                let v = values(source, slot.offset + local.start..slot.offset + local.end)?;
                pieces.push((piece, v));
            }
        }
    }
    Ok(Snapshot { step, tensors: tensors(set.layout(), optim), pieces, extra })
}

/// The parts of `set` a rank writes when it holds all of its flat vector (DDP's first
/// replica): every slot but mirrors, and a piece the tensor-parallel group holds whole
/// only on its first rank.
pub fn whole_parts(set: &ParamSet, tp_rank: usize) -> Vec<(usize, Range<usize>)> {
    set.slots()
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.mirror && (tp_rank == 0 || s.param.shard() != Shard::Replicated))
        .map(|(i, s)| (i, 0..s.range().len()))
        .collect()
}

/// The run's entries of a checkpoint's metadata (`run`: the id of the job writing it, see
/// [`CheckpointConfig::run`](crate::config::CheckpointConfig::run)).
pub fn extra(
    fingerprint: &str,
    losses: &[(u64, f64)],
    optimizer_steps: u64,
    mesh: &str,
    run: Option<&str>,
) -> BTreeMap<String, Value> {
    let mut extra = BTreeMap::from([
        ("fingerprint".to_string(), json!(fingerprint)),
        ("losses".to_string(), json!(losses)),
        ("optimizer_steps".to_string(), json!(optimizer_steps)),
        ("mesh".to_string(), json!(mesh)),
    ]);
    if let Some(run) = run {
        extra.insert("run".to_string(), json!(run));
    }
    extra
}

/// Every parameter of the checkpoint in `dir`, whole, by its plain name.
pub fn read_params(dir: &Path) -> Result<BTreeMap<String, Vec<f32>>> {
    let reader = Reader::open(dir)?;
    let mut out = BTreeMap::new();
    for (name, shape) in reader.tensors() {
        if let Some(plain) = name.strip_prefix("param.") {
            out.insert(plain.to_string(), reader.read(&Piece::whole(name.as_str(), shape))?);
        }
    }
    Ok(out)
}

/// What a rank reads back: its flat vector of parameters and optimiser state.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    /// Steps done.
    pub step: u64,
    /// The fingerprint of the run that wrote it (`None`: an imported checkpoint).
    pub fingerprint: Option<String>,
    /// `(step, loss)` so far.
    pub losses: Vec<(u64, f64)>,
    /// The optimiser's step count.
    pub optimizer_steps: u64,
    /// This rank's flat parameters.
    pub params: Vec<f32>,
    /// This rank's flat optimiser state (zeros when the checkpoint has none).
    pub state: Vec<Vec<f32>>,
}

/// Reads this rank's flat parameters and optimiser state from `reader` (pieces of every
/// slot of `set`, whatever mesh wrote them).
pub fn load(reader: &Reader, set: &ParamSet, optim: &OptimConfig) -> Result<Loaded> {
    let bad = |msg: String| Error::Checkpoint { path: reader.dir().to_path_buf(), msg };
    let names = optim.state_names();
    let fingerprint = reader.extra().get("fingerprint").and_then(Value::as_str).map(str::to_string);
    // An imported checkpoint starts the optimiser afresh; a run's must have its state.
    let with_state = fingerprint.is_some();
    let shapes: BTreeMap<&str, &[usize]> =
        reader.tensors().iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let mut params = vec![0.0; set.len()];
    let mut state = vec![vec![0.0; set.len()]; names.len()];
    for slot in set.slots() {
        let name = slot.param.name();
        let mut wanted = vec![(param_tensor(name), &mut params)];
        if with_state {
            for (n, v) in names.iter().zip(state.iter_mut()) {
                wanted.push((state_tensor(n, name), v));
            }
        }
        for (tensor, into) in wanted {
            match shapes.get(tensor.as_str()) {
                Some(s) if *s == slot.param.full_shape() => {}
                Some(s) => {
                    return Err(bad(format!(
                        "tensor {tensor} has shape {s:?}, the model needs {:?}",
                        slot.param.full_shape()
                    )));
                }
                None => {
                    return Err(bad(format!(
                        "no tensor {tensor}: it was written for another model or optimizer"
                    )));
                }
            }
            for (piece, local) in pieces_of_slot(&tensor, &slot.param, 0..slot.range().len())? {
                let v = reader.read(&piece)?;
                into[slot.offset + local.start..slot.offset + local.end].copy_from_slice(&v);
            }
        }
    }
    let losses = match reader.extra().get("losses") {
        Some(l) => serde_json::from_value(l.clone()).map_err(|e| bad(format!("bad loss history: {e}")))?,
        None => Vec::new(),
    };
    let optimizer_steps = reader.extra().get("optimizer_steps").and_then(Value::as_u64).unwrap_or(0);
    Ok(Loaded { step: reader.step(), fingerprint, losses, optimizer_steps, params, state })
}
