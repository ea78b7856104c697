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

use std::ops::Range;
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp, Work};

use crate::checkpoint::{self, Source};
pub use crate::config::DdpConfig;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::params::{Chunks, ParamSet};
use crate::run::{Context, Done, Finish, Observer, Start};
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

/// The DDP state of one rank.
pub struct Ddp {
    comm: Communicator,
    /// In launch order: the bucket at the end of the parameter order first.
    buckets: Vec<Bucket>,
    /// The all-reduce of each launched bucket, by bucket index.
    pending: Vec<Option<Work<Vec<f32>>>>,
    /// Buckets launched so far this step.
    launched: usize,
}

impl Ddp {
    /// Buckets for `params` over `comm`, and gradient chunks laid out to match them.
    pub fn new(comm: Communicator, params: &ParamSet, config: DdpConfig) -> Result<(Ddp, Chunks)> {
        if config.bucket_bytes == 0 || config.first_bucket_bytes == 0 {
            return Err(Error::config(
                "bucket sizes must be at least one byte (--bucket-mb, --first-bucket-mb)",
            ));
        }
        let ranges = plan(params.slots().iter().map(|s| (s.block, s.range().len())), &config);
        let n = ranges.len();
        // Chunks are in parameter order, buckets in the reverse.
        let lens: Vec<usize> = ranges.iter().rev().map(|&(len, _)| len).collect();
        let buckets = ranges
            .iter()
            .enumerate()
            .map(|(i, &(_, low))| Bucket { chunk: n - 1 - i, lowest_block: low })
            .collect();
        let ddp = Ddp { comm, buckets, pending: (0..n).map(|_| None).collect(), launched: 0 };
        Ok((ddp, Chunks::new(&lens)))
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// The flat ranges of the buckets, in launch order.
    pub fn buckets(&self, grads: &Chunks) -> Vec<Range<usize>> {
        self.buckets.iter().map(|b| grads.range(b.chunk)).collect()
    }

    /// Backward of the last micro-batch has finished block `block` (and every later one):
    /// launches the all-reduce of every bucket that is now complete.
    pub fn block_done(&mut self, block: usize, grads: &mut Chunks) {
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
    pub fn finish(&mut self, grads: &mut Chunks, loss: f64) -> Result<(f64, Duration)> {
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

/// The DDP loop: every rank is a worker and holds the whole optimiser.
pub(crate) fn run(
    cx: &Context,
    config: DdpConfig,
    start: Start,
    trace: &mut Trace,
    observer: &mut dyn Observer,
) -> Result<Finish> {
    let dp = cx.mesh.dp();
    let (mut ddp, mut grads) = Ddp::new(dp.clone(), cx.model.params(), config)?;
    let Start { step: first, params, mut optimizer, losses } = start;
    // The model's variables hold the parameters; the optimiser updates them bucket by
    // bucket, so no second flat copy is kept.
    drop(params);
    let set = cx.model.params();
    let mut done = Done { losses, ..Done::default() };
    let mut saver = cx.saver()?;
    for step in first..cx.config.steps {
        let t0 = Instant::now();
        let (share, norm) = trace.span(|| "data".into(), || cx.share(step, dp.rank(), dp.size()));
        grads.zero();
        let (local, pipe) = cx.gradients(&share, norm, &mut grads, trace, None, |k, g, last| {
            if last {
                ddp.block_done(k, g);
            }
            Ok(())
        })?;
        let w0 = Instant::now();
        let (loss, wait) = ddp.finish(&mut grads, local)?;
        trace.record(Kind::Wait, "wait all-reduce".into(), w0, w0 + wait);
        let loss = cx.finish_step(&mut grads, loss)?;
        let sent = cx.step_comm(trace);
        trace.span(|| "optimizer".into(), || step_in_place(set, &mut optimizer, &grads))?;
        cx.end_step((step, t0, wait, sent), pipe, loss, &mut done, observer);
        // The first replica writes its pieces (each rank of its tensor-parallel group and
        // pipeline its own); the copy is taken now and written in the background.
        if cx.checkpoint_due(step + 1) {
            let parts =
                if dp.rank() == 0 { checkpoint::whole_parts(set, cx.mesh.tp().rank()) } else { Vec::new() };
            let state = optimizer.state();
            let values = |source: Source, r: Range<usize>| match source {
                Source::Params => set.read_range(r),
                Source::State(i) => Ok(state[i][r].to_vec()),
            };
            let snapshot = cx.snapshot(step + 1, &parts, values, optimizer.steps(), &done.losses)?;
            trace.span(|| "checkpoint".into(), || cx.submit(&mut saver, snapshot))?;
        }
    }
    if let Some(s) = &mut saver {
        s.wait()?;
    }
    let states = optimizer.state().len() as u64;
    let local = 4 * set.len() as u64;
    let held = [local, local, states * local];
    let Done { steps, losses, peak_rss, timeline } = done;
    Ok(Finish { params: set.read()?, steps, losses, role: "worker", peak_rss, timeline, held })
}

/// One optimiser step over the parameters in `set`, chunk by chunk of `grads` (each
/// covers whole parameters): read, update, written back.
pub(crate) fn step_in_place(set: &ParamSet, optimizer: &mut Optimizer, grads: &Chunks) -> Result<()> {
    if grads.len() != set.len() || optimizer.len() != set.len() {
        return Err(Error::internal("the optimizer, gradients and parameters differ in length"));
    }
    optimizer.begin_step();
    for (range, g) in grads.iter() {
        let mut p = set.read_range(range.clone())?;
        optimizer.update(range.start, &mut p, g)?;
        set.write_range(range.start, &p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, ModelConfig, ModelKind};

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
        let (ddp, grads) =
            Ddp::new(comm, set, DdpConfig { bucket_bytes: 4 * 3300, first_bucket_bytes: 4 * 300 }).unwrap();
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
