//! Running a [`Schedule`] on one pipeline rank: forwards and backwards of this rank's
//! chunks on micro-batches, activations and their gradients sent to the neighbouring
//! stages, the tied parameters' gradients summed between the stages that share them.
//!
//! The executor only follows the schedule's list of actions; every ordering decision is
//! the schedule's, which [`check`](super::check) proves free of deadlock. Sends are
//! asynchronous (`isend`: a stage goes on computing while its activation travels);
//! receives block, each recorded as a wait span, so the bubble shows in the trace. A
//! message is a small header (the tensor's shape) and the values, both on the pipeline
//! group with one tag for activations and one for gradients: the receiver learns the shape
//! from the sender, whatever the blocks at the boundary are.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::Instant;

use candle_core::{Device, Tensor};
use xccl::{Communicator, ReduceOp, Work};

use super::schedule::{Action, Schedule};
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::mesh::{Axis, Mesh};
use crate::model::{Deferred, Model, Saved};
use crate::params::Chunks;
use crate::trace::{Kind, Trace};

/// Tag of activation messages on the pipeline group.
const TAG_ACTIVATION: u32 = 0x5050_0001;
/// Tag of gradient messages.
const TAG_GRADIENT: u32 = 0x5050_0002;
/// A message header: the number of dimensions, then up to four of them.
const HEADER: usize = 5;

/// What one step's pipeline did on this rank.
#[derive(Clone, Debug)]
pub struct PipeStat {
    /// Seconds spent in forwards and backwards.
    pub busy: f64,
    /// When this rank started the step's pipeline.
    pub start: Instant,
    /// When its last backward ended. The step's pipeline runs from the earliest start to
    /// the latest end over the ranks; `1 − busy / that` is this rank's bubble.
    pub end: Instant,
    /// The forwards and backwards, `F(mb,chunk)`, `B(mb,chunk)` (a whole backward),
    /// `Bi(mb,chunk)` and `W(mb,chunk)` (its input and weight halves), with their start
    /// and end.
    pub timeline: Vec<(String, Instant, Instant)>,
}

/// A parameter that two stages hold (a tied embedding and output head): its elements in
/// this rank's flat vector and the group of the two ranks.
struct Tie {
    range: Range<usize>,
    comm: Communicator,
}

/// One pipeline rank: its schedule, its chunks of the model and its pipeline group.
pub struct Pipeline {
    schedule: Schedule,
    comm: Communicator,
    rank: usize,
    /// For each of this rank's chunks, its blocks (indices in this rank's model).
    chunks: Vec<Range<usize>>,
    recompute: bool,
    ties: Vec<Tie>,
}

/// What a forward keeps for its backward.
struct Held {
    /// The stage input (`None` on the first stage: the micro-batch's token ids).
    input: Option<Tensor>,
    /// What the chunk's blocks saved; `None` with recomputation.
    saved: Option<Vec<Saved>>,
}

impl Pipeline {
    /// The pipeline rank of `mesh` running `schedule` on `model`, a part built with the
    /// blocks of `stages[g]` for every global stage `g` this rank holds (`stages`: the block
    /// ranges of every global stage, in pipeline order). Collective over the world: every
    /// pair of stages that shares a parameter gets a group of its own from the mesh
    /// ([`Mesh::subgroup`]).
    pub fn new(
        mesh: &Mesh,
        schedule: Schedule,
        model: &Model,
        stages: &[Range<usize>],
        recompute: bool,
    ) -> Result<Pipeline> {
        let rank = mesh.coord(Axis::Pp);
        let global = model.global_blocks();
        let local = |b: usize| global.iter().position(|&g| g == b);
        let mut chunks = Vec::new();
        for range in schedule.chunks_of(stages, rank) {
            let (Some(start), Some(last)) = (local(range.start), local(range.end - 1)) else {
                return Err(Error::internal(format!("stage blocks {range:?} are not in this rank's model")));
            };
            chunks.push(start..last + 1);
        }
        let rank_of =
            |block: usize| stages.iter().position(|r| r.contains(&block)).map(|g| schedule.locate(g).0);
        let layout = model.params().layout();
        let mut ties = Vec::new();
        for (block, name) in layout.shared() {
            let (Some(owner), Some(user)) =
                (layout.get(name).and_then(|e| rank_of(e.block)), rank_of(*block))
            else {
                return Err(Error::internal(format!("shared parameter {name} is outside the pipeline")));
            };
            if owner == user {
                continue;
            }
            if let Some(comm) = mesh.subgroup(Axis::Pp, &|c| c == owner || c == user, None)? {
                let slot = model.params().slots().iter().find(|s| s.param.name() == name.as_str());
                let slot = slot.ok_or_else(|| Error::internal(format!("{name} is not held by its stage")))?;
                ties.push(Tie { range: slot.range(), comm });
            }
        }
        Ok(Pipeline { schedule, comm: mesh.pp().clone(), rank, chunks, recompute, ties })
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The global stage of this rank's chunk `chunk`.
    fn global(&self, chunk: usize) -> usize {
        self.schedule.global_stage(self.rank, chunk)
    }

    fn is_last(&self, chunk: usize) -> bool {
        self.global(chunk) + 1 == self.schedule.shape.global_stages()
    }

    /// Runs this rank's actions for one step on its data-parallel `share` of the batch (cut
    /// into the schedule's micro-batches), accumulating into `grads` the gradient of this
    /// rank's part of the global mean loss (`norm`: counted tokens of the global batch).
    /// `chunk_done(block, grads)` is called when the last backward of a chunk whose first
    /// block is `block` is done. Returns the loss of this rank's share (0 on ranks without
    /// the last stage) and what the step did.
    pub fn run(
        &self,
        model: &Model,
        share: &Batch,
        norm: f64,
        grads: &mut Chunks,
        trace: &mut Trace,
        mut chunk_done: impl FnMut(usize, &mut Chunks),
    ) -> Result<(f64, PipeStat)> {
        let m = self.schedule.shape.micro_batches;
        if !share.rows.is_multiple_of(m) {
            return Err(Error::config(format!(
                "a share of {} rows does not cut into {m} equal micro-batches",
                share.rows
            )));
        }
        let rows = share.rows / m;
        let micro = |mb: usize| share.rows(mb * rows..(mb + 1) * rows).tensors();
        let started = Instant::now();
        let mut stat = PipeStat { busy: 0.0, start: started, end: started, timeline: Vec::new() };
        let mut wire =
            Wire { comm: &self.comm, sends: Vec::new(), headers: Vec::new(), own: Default::default() };
        let mut received: HashMap<(usize, usize), Tensor> = HashMap::new();
        let mut gradients: HashMap<(usize, usize), Tensor> = HashMap::new();
        // What a forward or backward produced for a later send, by (tag, micro-batch, chunk).
        let mut outbox: HashMap<(u32, usize, usize), Tensor> = HashMap::new();
        let mut held: HashMap<(usize, usize), Held> = HashMap::new();
        // Weight gradients deferred by a `BackwardInput`, until their `BackwardWeight`.
        let mut pending: HashMap<(usize, usize), Deferred> = HashMap::new();
        let mut backwards = vec![0; self.chunks.len()];
        let mut loss_sum = 0.0;
        for &action in &self.schedule.ranks[self.rank] {
            match action {
                Action::RecvActivation { mb, chunk, peer } => {
                    let t = wire.recv(peer, TAG_ACTIVATION, trace, &format!("recv A({mb},{chunk})"))?;
                    received.insert((mb, chunk), t);
                }
                Action::RecvGradient { mb, chunk, peer } => {
                    let t = wire.recv(peer, TAG_GRADIENT, trace, &format!("recv G({mb},{chunk})"))?;
                    gradients.insert((mb, chunk), t);
                }
                Action::SendActivation { mb, chunk, peer } | Action::SendGradient { mb, chunk, peer } => {
                    let tag = match action {
                        Action::SendActivation { .. } => TAG_ACTIVATION,
                        _ => TAG_GRADIENT,
                    };
                    let t = outbox.remove(&(tag, mb, chunk)).ok_or_else(|| missing(action))?;
                    wire.send(t, peer, tag)?;
                }
                Action::Forward { mb, chunk } => {
                    let t0 = Instant::now();
                    let input = match self.global(chunk) {
                        0 => None,
                        _ => Some(received.remove(&(mb, chunk)).ok_or_else(|| missing(action))?),
                    };
                    let (ids, targets, mask) = micro(mb)?;
                    let blocks = self.chunks[chunk].clone();
                    let (output, saved) = model.forward_saved(blocks, input.as_ref().unwrap_or(&ids))?;
                    if self.is_last(chunk) {
                        // The last stage's backward starts from the loss's gradient.
                        let (loss, grad) = model.loss_and_grad(&output, &targets, &mask, norm)?;
                        loss_sum += loss;
                        gradients.insert((mb, chunk), grad);
                    } else {
                        outbox.insert((TAG_ACTIVATION, mb, chunk), output);
                    }
                    let saved = (!self.recompute).then_some(saved);
                    held.insert((mb, chunk), Held { input, saved });
                    stat.compute(trace, format!("F({mb},{chunk})"), t0);
                }
                Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                    let t0 = Instant::now();
                    let Held { input, saved } = held.remove(&(mb, chunk)).ok_or_else(|| missing(action))?;
                    let blocks = self.chunks[chunk].clone();
                    let saved = match saved {
                        Some(s) => s,
                        None => {
                            let ids = micro(mb)?.0;
                            model.forward_saved(blocks.clone(), input.as_ref().unwrap_or(&ids))?.1
                        }
                    };
                    let grad = gradients.remove(&(mb, chunk)).ok_or_else(|| missing(action))?;
                    let (below, deferred) = model.backward_input(blocks, saved, &grad)?;
                    if let Some(below) = below {
                        outbox.insert((TAG_GRADIENT, mb, chunk), below);
                    }
                    let name = match action {
                        Action::Backward { .. } => {
                            self.weights(model, chunk, deferred, grads, &mut backwards, &mut chunk_done)?;
                            format!("B({mb},{chunk})")
                        }
                        _ => {
                            pending.insert((mb, chunk), deferred);
                            format!("Bi({mb},{chunk})")
                        }
                    };
                    stat.compute(trace, name, t0);
                    stat.end = Instant::now();
                }
                Action::BackwardWeight { mb, chunk } => {
                    let t0 = Instant::now();
                    let deferred = pending.remove(&(mb, chunk)).ok_or_else(|| missing(action))?;
                    self.weights(model, chunk, deferred, grads, &mut backwards, &mut chunk_done)?;
                    stat.compute(trace, format!("W({mb},{chunk})"), t0);
                    stat.end = Instant::now();
                }
                Action::OptimizerStep => break,
            }
            wire.reap()?;
        }
        wire.finish()?;
        Ok((loss_sum, stat))
    }

    /// Runs the weight half of a backward of `chunk`, adds its gradients to `grads`, and
    /// once it was the chunk's last, tells `chunk_done`.
    fn weights(
        &self,
        model: &Model,
        chunk: usize,
        deferred: Deferred,
        grads: &mut Chunks,
        backwards: &mut [usize],
        chunk_done: &mut impl FnMut(usize, &mut Chunks),
    ) -> Result<()> {
        let blocks = self.chunks[chunk].clone();
        grads.add_grads(model.params(), &model.weight_grads(blocks.clone(), deferred)?)?;
        backwards[chunk] += 1;
        if backwards[chunk] == self.schedule.shape.micro_batches {
            chunk_done(blocks.start, grads);
        }
        Ok(())
    }

    /// Sums the gradients of parameters two stages hold between them, in this rank's full
    /// flat `grads` (collective over each pair of stages that shares a parameter).
    pub fn sum_shared(&self, grads: &mut Chunks) -> Result<()> {
        for tie in &self.ties {
            let mut g = grads.get(tie.range.clone())?;
            tie.comm.all_reduce(&mut g, ReduceOp::Sum)?;
            grads.set(tie.range.start, &g)?;
        }
        Ok(())
    }

    /// Gives every stage the step's `loss` (known on the last stage, zero on the others):
    /// the sum over the pipeline group.
    pub fn total_loss(&self, loss: f64) -> Result<f64> {
        let mut total = [loss];
        self.comm.all_reduce(&mut total, ReduceOp::Sum)?;
        Ok(total[0])
    }
}

impl PipeStat {
    fn compute(&mut self, trace: &mut Trace, name: String, t0: Instant) {
        let t1 = Instant::now();
        self.busy += (t1 - t0).as_secs_f64();
        trace.record(Kind::Compute, name.clone(), t0, t1);
        self.timeline.push((name, t0, t1));
    }
}

fn missing(action: Action) -> Error {
    Error::internal(format!("pipeline action {action:?} has nothing to work on"))
}

/// The sends of one step still in flight, and the messages a rank sent to itself (where two
/// consecutive global stages are its own: ZB-V's turn), activations then gradients, in the
/// order sent: the checker proves they are received in that order.
struct Wire<'a> {
    comm: &'a Communicator,
    sends: Vec<Work<Vec<f32>>>,
    headers: Vec<Work<Vec<u64>>>,
    own: [VecDeque<Tensor>; 2],
}

impl Wire<'_> {
    /// This rank's queue of messages to itself with `tag`.
    fn own(&mut self, tag: u32) -> &mut VecDeque<Tensor> {
        &mut self.own[usize::from(tag == TAG_GRADIENT)]
    }

    fn send(&mut self, t: Tensor, peer: usize, tag: u32) -> Result<()> {
        if peer == self.comm.rank() {
            self.own(tag).push_back(t);
            return Ok(());
        }
        let dims = t.dims();
        if dims.len() >= HEADER {
            return Err(Error::internal(format!("a pipeline message of {} dimensions", dims.len())));
        }
        let mut header = vec![0u64; HEADER];
        header[0] = dims.len() as u64;
        for (h, &d) in header[1..].iter_mut().zip(dims) {
            *h = d as u64;
        }
        let values = t.flatten_all()?.to_vec1::<f32>()?;
        self.headers.push(self.comm.isend(header, peer, tag));
        self.sends.push(self.comm.isend(values, peer, tag));
        Ok(())
    }

    fn recv(&mut self, peer: usize, tag: u32, trace: &mut Trace, what: &str) -> Result<Tensor> {
        if peer == self.comm.rank() {
            return self.own(tag).pop_front().ok_or_else(|| Error::internal(format!("{what}: not sent yet")));
        }
        let t0 = Instant::now();
        let mut header = [0u64; HEADER];
        self.comm.recv(&mut header, peer, tag)?;
        let dims = usize::try_from(header[0])
            .ok()
            .filter(|&n| n < HEADER)
            .and_then(|n| header[1..=n].iter().map(|&d| usize::try_from(d).ok()).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::internal(format!("{what}: a malformed header {header:?}")))?;
        let mut values = vec![0.0f32; dims.iter().product()];
        self.comm.recv(&mut values, peer, tag)?;
        trace.record(Kind::Wait, what.to_string(), t0, Instant::now());
        Ok(Tensor::from_vec(values, dims, &Device::Cpu)?)
    }

    /// Lets go of sends that are done.
    fn reap(&mut self) -> Result<()> {
        reap(&mut self.sends)?;
        reap(&mut self.headers)
    }

    /// Waits for every send.
    fn finish(self) -> Result<()> {
        for s in self.headers {
            s.wait()?;
        }
        for s in self.sends {
            s.wait()?;
        }
        Ok(())
    }
}

/// Waits for (and drops) the works of `sends` that are done.
fn reap<T: Send + 'static>(sends: &mut Vec<Work<T>>) -> Result<()> {
    let mut i = 0;
    while i < sends.len() {
        if sends[i].is_completed() {
            sends.swap_remove(i).wait()?;
        } else {
            i += 1;
        }
    }
    Ok(())
}
