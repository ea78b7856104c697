//! Distributed data parallelism: gradient buckets all-reduced while backward goes on.
//!
//! Gradients live in [`Chunks`], one chunk per bucket. Buckets are cut from the end of the
//! parameter order (the last block's parameters first, as backward produces them): the
//! first bucket holds at most `first_bucket_bytes` so that communication starts early, the
//! others at most `bucket_bytes` (a parameter larger than the cap gets a bucket of its own).
//! When the backward of the last micro-batch finishes block `k`, every bucket whose
//! parameters all belong to blocks `>= k` is moved into an `all_reduce_async(Sum)`; the
//! optimiser step waits for them all and puts the summed chunks back. Micro-batches before
//! the last only accumulate (`no_sync`). Because every rank's loss is already divided by the
//! global number of target tokens, the sum is the gradient of the global mean loss.
//!
//! `Ddp` is a `Strategy`: the loop (`train_loop`) tells it when blocks finish
//! (bucket readiness), it reduces (all-reduces the buckets, waits for them) and steps the optimiser bucket by
//! bucket on the model's variables (no second copy of the parameters is kept).

use std::ops::Range;
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp, Work};

use crate::checkpoint::{self, Source};
pub use crate::config::DdpConfig;
use crate::dcp::Snapshot;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::params::{Chunks, ParamSet};
use crate::run::{Context, Start};
use crate::strategy::{Begin, Final, Reduced, Strategy};
use crate::trace::{Kind, Trace};

/// One bucket: a chunk of the gradient chunks and the lowest block it covers.
#[derive(Clone, Debug)]
struct Bucket {
    chunk: usize,
    lowest_block: usize,
}

/// DDP's buckets in launch order as `(elements, lowest block)`, cut from `params` (each
/// parameter's `(block, elements)` in parameter order) walked from the last: the first bucket
/// holds at most `first_bucket_bytes`, the others at most `bucket_bytes`, a parameter larger
/// than the cap a bucket of its own. `xccl sim train` simulates the same buckets.
pub fn plan(
    params: impl DoubleEndedIterator<Item = (usize, usize)>,
    config: &DdpConfig,
) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for (block, len) in params.rev() {
        let cap = if ranges.is_empty() { config.first_bucket_bytes } else { config.bucket_bytes };
        current = match current.take() {
            Some((cur, low)) if (cur + len) * 4 <= cap => Some((cur + len, low.min(block))),
            Some(full) => {
                ranges.push(full);
                Some((len, block))
            }
            None => Some((len, block)),
        };
    }
    ranges.extend(current);
    ranges
}

/// The DDP state of one rank: its buckets over the data-parallel group and the whole
/// optimiser.
pub(crate) struct Ddp<'a> {
    comm: Communicator,
    /// In launch order: the bucket at the end of the parameter order first.
    buckets: Vec<Bucket>,
    /// The length of each gradient chunk, in parameter order (the buckets reversed).
    lens: Vec<usize>,
    /// The all-reduce of each launched bucket, by bucket index.
    pending: Vec<Option<Work<Vec<f32>>>>,
    /// Buckets launched so far this step.
    launched: usize,
    /// The model's parameters, which the optimiser updates in place.
    set: &'a ParamSet,
    optimizer: Optimizer,
}

impl<'a> Ddp<'a> {
    /// DDP over `cx`'s data-parallel group from `start`. The model's variables already hold
    /// the parameters; the optimiser updates them bucket by bucket, so no flat copy is kept.
    pub(crate) fn new(cx: &Context<'a>, config: DdpConfig, start: Start) -> Result<Ddp<'a>> {
        let model = cx.model;
        Ddp::with_optimizer(cx.mesh.dp().clone(), model.params(), config, start.optimizer)
    }

    /// Buckets for `set` over `comm`, gradient chunks laid out to match them.
    fn with_optimizer(
        comm: Communicator,
        set: &'a ParamSet,
        config: DdpConfig,
        optimizer: Optimizer,
    ) -> Result<Ddp<'a>> {
        if config.bucket_bytes == 0 || config.first_bucket_bytes == 0 {
            return Err(Error::config(
                "bucket sizes must be at least one byte (--bucket-mb, --first-bucket-mb)",
            ));
        }
        let ranges = plan(set.slots().iter().map(|s| (s.block, s.range().len())), &config);
        let n = ranges.len();
        // Chunks are in parameter order, buckets in the reverse.
        let lens: Vec<usize> = ranges.iter().rev().map(|&(len, _)| len).collect();
        let buckets = ranges
            .iter()
            .enumerate()
            .map(|(i, &(_, low))| Bucket { chunk: n - 1 - i, lowest_block: low })
            .collect();
        let pending = (0..n).map(|_| None).collect();
        Ok(Ddp { comm, buckets, lens, pending, launched: 0, set, optimizer })
    }

    /// The flat ranges of the buckets, in launch order.
    #[cfg(test)]
    fn buckets(&self, grads: &Chunks) -> Vec<Range<usize>> {
        self.buckets.iter().map(|b| grads.range(b.chunk)).collect()
    }

    /// Backward of the last micro-batch has finished block `block` (and every later one):
    /// launches the all-reduce of every bucket that is now complete.
    fn launch_ready(&mut self, block: usize, grads: &mut Chunks) {
        while self.launched < self.buckets.len() && self.buckets[self.launched].lowest_block >= block {
            self.launch_next(grads);
        }
    }

    fn launch_next(&mut self, grads: &mut Chunks) {
        let b = &self.buckets[self.launched];
        self.pending[self.launched] = Some(self.comm.all_reduce_async(grads.take(b.chunk), ReduceOp::Sum));
        self.launched += 1;
    }

    /// Launches the buckets not launched yet (a rank whose share of the batch was empty runs
    /// no backward), waits for every bucket and for the sum of the ranks' `loss`, and puts
    /// the summed gradients back. Returns the summed loss and the time spent waiting.
    fn wait_all(&mut self, grads: &mut Chunks, loss: f64) -> Result<(f64, Duration)> {
        while self.launched < self.buckets.len() {
            self.launch_next(grads);
        }
        let total = self.comm.all_reduce_async(vec![loss], ReduceOp::Sum);
        let t0 = Instant::now();
        for (b, work) in self.buckets.iter().zip(&mut self.pending) {
            let work = work.take().ok_or_else(|| Error::internal("bucket finished twice"))?;
            grads.put(b.chunk, work.wait()?)?;
        }
        let total = total.wait()?;
        self.launched = 0;
        Ok((total[0], t0.elapsed()))
    }
}

/// DDP's hooks: buckets launched as blocks finish, all-reduced, then the optimiser.
impl Strategy for Ddp<'_> {
    fn gradient_buffer(&self) -> Chunks {
        Chunks::new(&self.lens)
    }

    fn begin_step(&mut self, _: &Context, _: u64, _: &mut Trace) -> Result<Begin> {
        let worker = (self.comm.rank(), self.comm.size());
        Ok(Begin { worker, wait: Duration::ZERO, version: None })
    }

    fn block_done(&mut self, k: usize, grads: &mut Chunks, last: bool) -> Result<()> {
        // Micro-batches before the last only accumulate (`no_sync`).
        if last {
            self.launch_ready(k, grads);
        }
        Ok(())
    }

    fn reduce(&mut self, cx: &Context, grads: &mut Chunks, loss: f64, trace: &mut Trace) -> Result<Reduced> {
        let w0 = Instant::now();
        let (loss, wait) = self.wait_all(grads, loss)?;
        trace.record(Kind::Wait, "wait all-reduce".into(), w0, w0 + wait);
        cx.sum_shared(grads)?;
        Ok(Reduced { loss: Some(loss), wait })
    }

    fn optimizer_step(&mut self, _: &Context, grads: &Chunks) -> Result<()> {
        step_in_place(self.set, &mut self.optimizer, grads)
    }

    fn snapshot(&self, cx: &Context, step: u64, losses: &[(u64, f64)]) -> Result<Option<Snapshot>> {
        // The first replica writes its pieces (each rank of its tensor-parallel group and
        // pipeline its own); the copy is taken now and written in the background.
        let set = self.set;
        let parts = if self.comm.rank() == 0 {
            checkpoint::whole_parts(set, cx.mesh.tp().rank())
        } else {
            Vec::new()
        };
        let state = self.optimizer.state();
        let values = |source: Source, r: Range<usize>| match source {
            Source::Params => set.read_range(r),
            Source::State(i) => Ok(state[i][r].to_vec()),
        };
        cx.snapshot(step, &parts, values, self.optimizer.steps(), losses).map(Some)
    }

    fn finish(&mut self, _: &Context, _: &mut Trace) -> Result<Final> {
        let states = self.optimizer.state().len() as u64;
        let local = 4 * self.set.len() as u64;
        let held = [local, local, states * local];
        Ok(Final { params: self.set.read()?, held, role: "worker" })
    }
}

/// One optimiser step over the parameters in `set`, chunk by chunk of `grads` (each
/// covers whole parameters), one parameter at a time: a copy of its values updated in
/// cache and made its new value.
pub(crate) fn step_in_place(set: &ParamSet, optimizer: &mut Optimizer, grads: &Chunks) -> Result<()> {
    if grads.len() != set.len() || optimizer.len() != set.len() {
        return Err(Error::internal("the optimizer, gradients and parameters differ in length"));
    }
    optimizer.begin_step();
    for (range, g) in grads.iter() {
        set.update_range(range.clone(), |at, p| {
            let g = g.get(at - range.start..at - range.start + p.len()).ok_or_else(|| {
                Error::internal(format!("no gradient for elements {at}.. ({range:?} holds {})", g.len()))
            })?;
            optimizer.update(at, p, g)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, ModelConfig, ModelKind};
    use crate::optim::OptimConfig;

    #[test]
    fn buckets_follow_reverse_block_order_with_a_small_first_one() {
        let cfg = ModelConfig {
            kind: ModelKind::Gpt,
            vocab: 12,
            context: 8,
            width: 16,
            layers: 2,
            heads: 2,
            tied: false,
        };
        let model = Model::new(&cfg, 1).unwrap();
        let comm = Communicator::local(1).unwrap().pop().unwrap();
        let set = model.params();
        // A layer has 12·16² + 13·16 = 3280 elements; the head 16·12 + 32 = 224.
        let config = DdpConfig { bucket_bytes: 4 * 3300, first_bucket_bytes: 4 * 300 };
        let optimizer = Optimizer::new(OptimConfig::adamw(1e-3), set.len());
        let ddp = Ddp::with_optimizer(comm, set, config, optimizer).unwrap();
        let grads = ddp.gradient_buffer();
        let b = ddp.buckets(&grads);
        assert_eq!(b[0].end, set.len());
        assert!(b[0].len() * 4 <= 1200);
        for w in b.windows(2) {
            assert_eq!(w[1].end, w[0].start);
        }
        assert_eq!(b[b.len() - 1].start, 0);
        let total: usize = b.iter().map(|r| r.len()).sum();
        assert_eq!(total, set.len());
        // Every bucket is launched once its lowest block is done.
        let lowest: Vec<usize> = ddp.buckets.iter().map(|x| x.lowest_block).collect();
        assert!(lowest.windows(2).all(|w| w[0] >= w[1]), "{lowest:?}");
        assert_eq!(lowest[0], 3);
        assert_eq!(*lowest.last().unwrap(), 0);
    }
}
