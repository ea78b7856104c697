//! Per-block compute times for `xccl sim train`, measured here by running the model's own
//! blocks (forward and backward, blockwise as `xccl train` runs them, `tp` threads over a
//! local tensor-parallel group, a host's groups at once), read out of their spans as
//! [`super::spans`] reads them (it also reads those of an earlier `xccl train`'s trace).

use std::time::Instant;

use xccl::{CollKind, Communicator};
use xccl_train::model::{Graph, Model, ModelConfig};
use xccl_train::optim::{OptimConfig, Optimizer};
use xccl_train::params::Chunks;
use xccl_train::tp::Tp;
use xccl_train::trace::{Span, Trace};

use super::spans::{apply_groups, apply_spans};
use super::spread::Spread;
use crate::bench::median;

/// One block of the model as one tensor-parallel rank runs it on one micro-batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockTimes {
    /// The block's name (`embed`, `h00`, `head`).
    pub name: String,
    /// Seconds of forward compute (the loss's included on the last block).
    pub fwd: f64,
    /// Seconds of backward compute.
    pub bwd: f64,
    /// Elements of its output (what a pipeline stage ending with it sends).
    pub out_elems: usize,
    /// Parameter elements this rank holds for it (what DDP and ZeRO reduce).
    pub params: usize,
    /// Bytes its forward keeps for its backward, per micro-batch (its `Saved`).
    pub saved: usize,
    /// The tensor-parallel collectives of its forward: `(kind, bytes of this rank's input)`.
    pub tp_fwd: Vec<(CollKind, usize)>,
    /// Those of its backward.
    pub tp_bwd: Vec<(CollKind, usize)>,
    /// Seconds its tensor-parallel group waits, in those of its forward, for the group's
    /// slowest rank (0 without tensor parallelism).
    pub wait_fwd: f64,
    /// The same in its backward.
    pub wait_bwd: f64,
}

/// What the prediction needs to know about the model's compute.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Every block of the whole model, in forward order.
    pub blocks: Vec<BlockTimes>,
    /// For each block, its parameters as `(block, elements)` in parameter order (DDP's
    /// bucket cut walks them).
    pub slots: Vec<(usize, usize)>,
    /// Seconds of the optimiser's update per parameter element.
    pub optim_per_elem: f64,
    /// How unevenly the ranks measured at once computed, iteration by iteration.
    pub spread: Spread,
    /// Where the times come from, in words.
    pub source: String,
}

/// The micro-batch a measurement runs on.
#[derive(Clone, Copy, Debug)]
pub struct Micro {
    /// Rows (sequences).
    pub rows: usize,
    /// Tokens per row.
    pub len: usize,
}

/// Measures `config`'s blocks on micro-batches of `micro`, over `tp` local ranks (threads,
/// sequence-parallel if `sp`), `iters` timed iterations after one warm-up: the median
/// compute of each block on the groups' first ranks. `replicas` groups run at once, as the
/// ranks of one host share its cores and memory while `xccl train` runs.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    config: &ModelConfig,
    seed: u64,
    tp: usize,
    sp: bool,
    micro: Micro,
    optim: OptimConfig,
    iters: usize,
    replicas: usize,
) -> Result<Profile, String> {
    let mut comms: Vec<(bool, Option<Communicator>)> = Vec::new();
    for _ in 0..replicas.max(1) {
        if tp > 1 {
            let group = Communicator::local(tp).map_err(|e| e.to_string())?;
            comms.extend(group.into_iter().enumerate().map(|(i, c)| (i == 0, Some(c))));
        } else {
            comms.push((true, None));
        }
    }
    // Every rank also holds a world communicator, as train's ranks do: its progress
    // thread shares the cores with the compute.
    let world = Communicator::local(comms.len()).map_err(|e| e.to_string())?;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(world)
            .map(|((first, c), w)| {
                s.spawn(move || {
                    let r = measure_rank(config, seed, c, sp, micro, iters);
                    drop(w);
                    (first, r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| (false, Err("a measuring thread panicked".into()))))
            .collect::<Vec<_>>()
    });
    let mut structure = None;
    let mut firsts = Vec::new();
    let mut every = Vec::new();
    for (first, r) in results {
        let (blocks, slots, mine) = r?;
        if first {
            firsts.extend(mine.iter().cloned());
            structure.get_or_insert((blocks, slots));
        }
        every.push(mine);
    }
    let (blocks, slots) = structure.ok_or("no measurement")?;
    let mut profile =
        Profile { blocks, slots, optim_per_elem: 0.0, spread: Spread::default(), source: String::new() };
    apply_spans(&mut profile.blocks, &firsts)?;
    let groups: Vec<Vec<&[Vec<Span>]>> =
        every.chunks(tp.max(1)).map(|g| g.iter().map(Vec::as_slice).collect()).collect();
    apply_groups(&mut profile, &groups)?;
    // The optimiser's step too runs on every rank of a host at once (as many threads here as
    // the host's ranks measured above): its memory traffic and cores are shared.
    let held: usize = profile.slots.iter().map(|s| s.1).sum();
    let mut rates = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..replicas.max(1) * tp.max(1)).map(|_| s.spawn(move || optimizer_rate(optim, held))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a measuring thread panicked".into())))
            .collect::<Result<Vec<f64>, String>>()
    })?;
    profile.optim_per_elem = median(&mut rates);
    profile.source = format!(
        "measured here: {} rows x {} tokens per micro-batch, median of {iters} iteration(s) x {} group(s) of {tp} rank(s) at once, {} thread(s) each",
        micro.rows,
        micro.len,
        replicas.max(1),
        candle_core::utils::get_num_threads()
    );
    Ok(profile)
}

type RankOut = (Vec<BlockTimes>, Vec<(usize, usize)>, Vec<Vec<Span>>);

/// One tensor-parallel rank: the structure of its blocks and, per iteration, its spans.
fn measure_rank(
    config: &ModelConfig,
    seed: u64,
    comm: Option<Communicator>,
    sp: bool,
    micro: Micro,
    iters: usize,
) -> Result<RankOut, String> {
    let err = |e: xccl_train::Error| e.to_string();
    let tp = match &comm {
        Some(c) => {
            c.record_timeline(true);
            Tp::new(c.clone(), sp)
        }
        None => Tp::none(),
    };
    let model = Model::with_tp(config, seed, &tp).map_err(err)?;
    let Micro { rows, len } = micro;
    let n = rows * len;
    let vocab = config.vocab.max(1) as u32;
    let ids: Vec<u32> = (0..n).map(|i| (i as u32).wrapping_mul(7).wrapping_add(3) % vocab).collect();
    let targets: Vec<u32> = (0..n).map(|i| (i as u32).wrapping_mul(5).wrapping_add(1) % vocab).collect();
    let mask = vec![1f32; n];
    let tensors = || -> candle_core::Result<_> {
        let d = candle_core::Device::Cpu;
        Ok((
            candle_core::Tensor::from_slice(&ids, (rows, len), &d)?,
            candle_core::Tensor::from_slice(&targets, (rows, len), &d)?,
            candle_core::Tensor::from_slice(&mask, (rows, len), &d)?,
        ))
    };
    let (ids, targets, mask) = tensors().map_err(|e| e.to_string())?;
    // Structure: outputs and parameters per block.
    let set = model.params();
    let slots: Vec<(usize, usize)> = set.slots().iter().map(|s| (s.block, s.range().len())).collect();
    let mut blocks = Vec::new();
    let mut x = ids.clone();
    for (k, b) in model.blocks().iter().enumerate() {
        let (y, saved) = model.forward_saved(k..k + 1, &x).map_err(err)?;
        x = y;
        let params = slots.iter().filter(|s| s.0 == k).map(|s| s.1).sum();
        blocks.push(BlockTimes {
            name: b.name().to_string(),
            fwd: 0.0,
            bwd: 0.0,
            out_elems: x.elem_count(),
            params,
            saved: saved.iter().map(|s| s.bytes()).sum(),
            tp_fwd: Vec::new(),
            tp_bwd: Vec::new(),
            wait_fwd: 0.0,
            wait_bwd: 0.0,
        });
    }
    // Gradients accumulate into flat chunks inside each block's backward span, as in train.
    let mut grads = Chunks::new(&[set.len()]);
    let mut runs = Vec::new();
    for i in 0..=iters {
        if let Some(c) = &comm {
            c.take_timeline();
        }
        let mut trace = Trace::new("compute", true);
        let fwd = model.forward(&ids, Graph::Blockwise, &mut trace).map_err(err)?;
        let loss = trace
            .span(|| "loss".into(), || model.loss(fwd.logits(), &targets, &mask, n as f64))
            .map_err(err)?;
        model.backward(fwd, &loss, &mut trace, |_, g| grads.add_grads(set, &g)).map_err(err)?;
        if let Some(c) = &comm {
            trace.add_ops("comm tp", c.take_timeline());
        }
        if i > 0 {
            runs.push(trace.take());
        }
    }
    Ok((blocks, slots, runs))
}

/// Seconds per element of the optimiser's update, measured on a vector of `len` elements
/// (at least 64 Ki, median of 5 after one warm-up).
fn optimizer_rate(optim: OptimConfig, len: usize) -> Result<f64, String> {
    let len = len.max(1 << 16);
    let mut opt = Optimizer::new(optim, len);
    let mut params = vec![0.5f32; len];
    let mut grads = Chunks::new(&[len]);
    grads.set(0, &vec![1e-3f32; len]).map_err(|e| e.to_string())?;
    let mut t = Vec::new();
    for _ in 0..6 {
        let t0 = Instant::now();
        opt.step(&mut params, &grads).map_err(|e| e.to_string())?;
        t.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&mut t[1..]) / len as f64)
}
