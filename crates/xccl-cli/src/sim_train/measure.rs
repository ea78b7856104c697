//! Per-block compute times for `xccl sim train`: measured here by running the model's own
//! blocks (forward and backward, blockwise as `xccl train` runs them, `tp` threads over a
//! local tensor-parallel group), or read from the Chrome trace of an earlier `xccl train`.
//!
//! Each block's time is its compute alone: the tensor-parallel operations that ran inside
//! its span (recorded on the group's timeline, the `comm tp` track of a trace) are taken
//! out and kept as the block's list of collectives, which the prediction simulates on the
//! modelled network instead.

use std::time::Instant;

use serde_json::Value;
use xccl::{CollKind, Communicator, SpanOp};
use xccl_train::model::{Graph, Model, ModelConfig};
use xccl_train::optim::{OptimConfig, Optimizer};
use xccl_train::params::Chunks;
use xccl_train::tp::Tp;
use xccl_train::trace::{Kind, Span, Trace, op_from_json};

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
    /// Seconds per parameter element of putting a gathered block into its parameters, each
    /// a fresh tensor copied out of the gathered buffer (ZeRO stage 3, every gather).
    pub copy_per_elem: f64,
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
    let mut runs = Vec::new();
    for (first, r) in results {
        let (blocks, slots, mine) = r?;
        if first {
            runs.extend(mine);
            structure.get_or_insert((blocks, slots));
        }
    }
    let (mut blocks, slots) = structure.ok_or("no measurement")?;
    apply_spans(&mut blocks, &runs)?;
    // The optimiser's step too runs on every rank of a host at once (as many threads here as
    // the host's ranks measured above): its memory traffic and cores are shared.
    let held: usize = slots.iter().map(|s| s.1).sum();
    let mut rates = std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..replicas.max(1) * tp.max(1)).map(|_| s.spawn(move || optimizer_rate(optim, held))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a measuring thread panicked".into())))
            .collect::<Result<Vec<f64>, String>>()
    })?;
    let optim_per_elem = median(&mut rates);
    // So are ZeRO stage 3's copies of gathered blocks into parameters.
    let sizes: Vec<usize> = slots.iter().map(|s| s.1).collect();
    let mut rates = std::thread::scope(|s| {
        let hs: Vec<_> = (0..replicas.max(1) * tp.max(1)).map(|_| s.spawn(|| copy_rate(&sizes))).collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| "a measuring thread panicked".to_string()))
            .collect::<Result<Vec<f64>, String>>()
    })?;
    let copy_per_elem = median(&mut rates);
    Ok(Profile {
        blocks,
        slots,
        optim_per_elem,
        copy_per_elem,
        source: format!(
            "measured here: {} rows x {} tokens per micro-batch, median of {iters} iteration(s) x {} group(s) of {tp} rank(s) at once, {} thread(s) each",
            micro.rows,
            micro.len,
            replicas.max(1),
            candle_core::utils::get_num_threads()
        ),
    })
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

/// The kind and bytes (of this rank's input) of a collective span.
pub fn collective(op: Option<SpanOp>) -> Option<(CollKind, usize)> {
    match op? {
        SpanOp::Collective { kind, dtype, count } => Some((kind, count * dtype.size())),
        _ => None,
    }
}

/// Fills the blocks' times from the spans of several iterations of one rank: per block the
/// median of `fwd NAME` and `bwd NAME` (the `loss` span added to the last forward), less the
/// tensor-parallel operations that started inside them, whose kinds and sizes become the
/// block's collectives (from the first iteration).
pub fn apply_spans(blocks: &mut [BlockTimes], runs: &[Vec<Span>]) -> Result<(), String> {
    if runs.is_empty() {
        return Err("no iteration to take times from".into());
    }
    let last = blocks.len().saturating_sub(1);
    for (k, b) in blocks.iter_mut().enumerate() {
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        for (i, spans) in runs.iter().enumerate() {
            let ops: Vec<&Span> =
                spans.iter().filter(|s| s.kind == Kind::Comm && s.track.contains("tp")).collect();
            let find = |name: String| spans.iter().find(|s| s.kind == Kind::Compute && s.name == name);
            let inside = |s: &Span| -> (f64, Vec<(CollKind, usize)>) {
                let mine: Vec<&&Span> = ops
                    .iter()
                    .filter(|o| o.start_us >= s.start_us && o.start_us < s.start_us + s.dur_us)
                    .collect();
                let t: f64 = mine.iter().map(|o| o.dur_us.min(s.dur_us)).sum();
                (t, mine.iter().filter_map(|o| collective(o.op)).collect())
            };
            let f = find(format!("fwd {}", b.name))
                .ok_or_else(|| format!("no span 'fwd {}' in the trace's iterations", b.name))?;
            let bw = find(format!("bwd {}", b.name))
                .ok_or_else(|| format!("no span 'bwd {}' in the trace's iterations", b.name))?;
            let (fc, mut fo) = inside(f);
            let (bc, bo) = inside(bw);
            let mut ft = (f.dur_us - fc).max(0.0);
            if k == last
                && let Some(l) = find("loss".into())
            {
                let (lc, lo) = inside(l);
                ft += (l.dur_us - lc).max(0.0);
                fo.extend(lo);
            }
            if i == 0 {
                b.tp_fwd = fo;
                b.tp_bwd = bo;
            }
            fwd.push(ft * 1e-6);
            bwd.push((bw.dur_us - bc).max(0.0) * 1e-6);
        }
        b.fwd = median(&mut fwd);
        b.bwd = median(&mut bwd);
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
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

/// Seconds per element of copying every parameter of sizes `sizes` out of one gathered
/// buffer into a fresh vector of its own, as ZeRO stage 3 puts a gathered block into its
/// parameters: the median of 5 rounds after one warm-up.
fn copy_rate(sizes: &[usize]) -> f64 {
    let total: usize = sizes.iter().sum();
    let gathered = vec![0.5f32; total.max(1)];
    let mut t = Vec::new();
    for _ in 0..6 {
        let t0 = Instant::now();
        let mut at = 0;
        for &n in sizes {
            std::hint::black_box(gathered[at..at + n].to_vec());
            at += n;
        }
        t.push(t0.elapsed().as_secs_f64());
    }
    median(&mut t[1..]) / total.max(1) as f64
}

/// Reads the compute spans of rank `rank` (its `pid`) from a Chrome trace `xccl train`
/// wrote (`trace.json`), with its `comm tp` spans, as one list per iteration: a new
/// iteration starts at each `fwd` of the first block.
pub fn trace_runs(text: &str, rank: usize, first_block: &str) -> Result<Vec<Vec<Span>>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not a JSON trace: {e}"))?;
    let events = v["traceEvents"].as_array().ok_or("no traceEvents: not a Chrome trace of xccl train")?;
    let mut tracks = std::collections::HashMap::new();
    for e in events {
        if e["ph"] == "M" && e["name"] == "thread_name" && e["pid"].as_u64() == Some(rank as u64) {
            tracks
                .insert(e["tid"].as_u64().unwrap_or(0), e["args"]["name"].as_str().unwrap_or("").to_string());
        }
    }
    let mut spans: Vec<Span> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"].as_u64() == Some(rank as u64))
        .filter_map(|e| {
            let kind = match e["cat"].as_str()? {
                "compute" => Kind::Compute,
                "comm" => Kind::Comm,
                _ => return None,
            };
            Some(Span {
                name: e["name"].as_str()?.to_string(),
                track: tracks.get(&e["tid"].as_u64().unwrap_or(0)).cloned().unwrap_or_default(),
                kind,
                start_us: e["ts"].as_f64()?,
                dur_us: e["dur"].as_f64()?,
                op: op_from_json(&e["args"]),
            })
        })
        .collect();
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    let start = format!("fwd {first_block}");
    let mut runs: Vec<Vec<Span>> = Vec::new();
    for s in spans {
        if s.kind == Kind::Compute && s.name == start {
            runs.push(Vec::new());
        }
        if let Some(r) = runs.last_mut() {
            r.push(s);
        }
    }
    if runs.is_empty() {
        return Err(format!(
            "rank {rank} of the trace has no span '{start}': per-block spans are recorded by `xccl train` \
             without --pp (a pipeline's trace has one span per stage)"
        ));
    }
    // The first iteration warms up allocations, as train's own statistics leave it out.
    if runs.len() > 1 {
        runs.remove(0);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xccl::DType;

    #[test]
    fn collectives_give_their_kind_and_bytes() {
        let c = |kind, dtype, count| Some(SpanOp::Collective { kind, dtype, count });
        assert_eq!(collective(c(CollKind::AllReduce, DType::F32, 1024)), Some((CollKind::AllReduce, 4096)));
        assert_eq!(collective(c(CollKind::AllGather, DType::BF16, 8)), Some((CollKind::AllGather, 16)));
        let send = SpanOp::Message { send: true, peer: 3, dtype: DType::F32, count: 1 };
        assert_eq!(collective(Some(send)), None);
        assert_eq!(collective(None), None);
    }

    #[test]
    fn spans_give_compute_without_the_tp_operations_inside() {
        let s = |name: &str, track: &str, kind, start: f64, dur: f64| Span {
            name: name.into(),
            track: track.into(),
            kind,
            start_us: start,
            dur_us: dur,
            op: (kind == Kind::Comm).then_some(SpanOp::Collective {
                kind: CollKind::AllReduce,
                dtype: DType::F32,
                count: 10,
            }),
        };
        let run = vec![
            s("fwd a", "compute", Kind::Compute, 0.0, 100.0),
            s("all_reduce #1 (f32 x 10, sum, ring)", "comm tp", Kind::Comm, 50.0, 30.0),
            s("loss", "compute", Kind::Compute, 100.0, 20.0),
            s("bwd a", "compute", Kind::Compute, 120.0, 200.0),
        ];
        let mut blocks = vec![BlockTimes {
            name: "a".into(),
            fwd: 0.0,
            bwd: 0.0,
            out_elems: 1,
            params: 1,
            saved: 0,
            tp_fwd: vec![],
            tp_bwd: vec![],
        }];
        apply_spans(&mut blocks, &[run]).unwrap();
        assert!((blocks[0].fwd - 90e-6).abs() < 1e-12, "{}", blocks[0].fwd);
        assert!((blocks[0].bwd - 200e-6).abs() < 1e-12);
        assert_eq!(blocks[0].tp_fwd, vec![(CollKind::AllReduce, 40)]);
    }
}
