//! The step-time prediction: block times and simulated collectives composed with the
//! overlap each strategy allows.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use xccl::CollKind;
use xccl::algo::tune::CostModel;
use xccl_sim::sweep::{affordable, shape_of, tuner_pick};
use xccl_sim::timeline::{self, Op};
use xccl_sim::{Call, Topology, simulate};
use xccl_train::config::{Strategy, TrainConfig};
use xccl_train::pipeline::schedule::{Action, Schedule};

use super::Layout;
use super::measure::Profile;

/// The modelled network.
pub struct Net<'a> {
    /// Hosts and links.
    pub topo: &'a Topology,
    /// The cost model: what ranks spend on a message (the simulator's and the tuner's,
    /// which picks the algorithm a rank would run).
    pub costs: &'a CostModel,
}

/// One kind of collective of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct CollRow {
    /// The group: `tp`, `dp`, `pp`.
    pub group: &'static str,
    /// The collective's name (`send/recv` for a pipeline message).
    pub kind: String,
    /// Bytes of one rank's input.
    pub bytes: usize,
    /// How many one pipeline (a rank per stage) runs per step.
    pub count: usize,
    /// Simulated seconds of one.
    pub each: f64,
    /// The algorithm simulated.
    pub algo: String,
}

/// A predicted step.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Seconds per step.
    pub step: f64,
    /// Of which the slowest rank computes (forward, backward, optimiser).
    pub compute: f64,
    /// Tensor-parallel communication (on the critical path).
    pub tp_comm: f64,
    /// The pipeline's bubble on that rank: idle while its neighbours work or messages travel.
    pub bubble: f64,
    /// Data-parallel (and ZeRO) communication not hidden behind backward, and the step's
    /// closing reductions.
    pub exposed: f64,
    /// The collectives, by group, kind and size.
    pub colls: Vec<CollRow>,
    /// The blocks of each pipeline stage (chunk).
    pub stages: Vec<Range<usize>>,
}

impl Prediction {
    /// The prediction in words, then a table of the collectives.
    pub fn render(&self) -> String {
        let ms = |s: f64| s * 1e3;
        let mut s = format!(
            "predicted step      {:.3} ms\n  compute           {:.3} ms\n  tp communication  {:.3} ms\n  bubble            {:.3} ms\n  exposed comm.     {:.3} ms\n",
            ms(self.step),
            ms(self.compute),
            ms(self.tp_comm),
            ms(self.bubble),
            ms(self.exposed)
        );
        s += &format!(
            "# {:<5} {:<15} {:>12} {:>8} {:>14} {:>14}  {}\n",
            "group", "collective", "bytes", "count", "each(us)", "total(ms)", "algorithm"
        );
        for r in &self.colls {
            s += &format!(
                "  {:<5} {:<15} {:>12} {:>8} {:>14.2} {:>14.4}  {}\n",
                r.group,
                r.kind,
                r.bytes,
                r.count,
                r.each * 1e6,
                ms(r.each * r.count as f64),
                r.algo
            );
        }
        s
    }
}

/// Simulated collectives, cached, with a tally per kind.
struct Sim<'a> {
    net: &'a Net<'a>,
    layout: Layout,
    cache: HashMap<(u8, Vec<usize>, usize), (f64, String)>,
    tally: BTreeMap<(&'static str, String, usize), (usize, f64, String)>,
}

impl Sim<'_> {
    /// Seconds of `kind` over world ranks `ranks` with `bytes` per rank (the tuner's pick, or
    /// the simulator's best when it has none), counted `count` times in the tally.
    fn time(
        &mut self,
        group: &'static str,
        kind: CollKind,
        ranks: &[usize],
        bytes: usize,
        count: usize,
    ) -> Result<f64, String> {
        if ranks.len() < 2 || (bytes == 0 && kind != CollKind::Barrier) {
            return Ok(0.0);
        }
        let placement: Vec<usize> = ranks.iter().map(|&r| self.layout.host(r)).collect();
        let key = (kind as u8, placement.clone(), bytes);
        let (t, algo) = match self.cache.get(&key) {
            Some(v) => v.clone(),
            None => {
                let v = self.simulate(kind, &placement, bytes)?;
                self.cache.insert(key, v.clone());
                v
            }
        };
        let name = if kind == CollKind::Broadcast && group == "pp" {
            "send/recv".to_string()
        } else {
            kind.to_string()
        };
        let e = self.tally.entry((group, name, bytes)).or_insert((0, t, algo));
        e.0 += count;
        Ok(t)
    }

    fn simulate(&self, kind: CollKind, placement: &[usize], bytes: usize) -> Result<(f64, String), String> {
        let Net { topo, costs } = *self.net;
        let shape = shape_of(kind, bytes);
        let run = |algo| {
            affordable(kind, algo, placement, &shape)?;
            let call = Call { kind, algo, root: 0, shape: shape.clone(), esize: 4 };
            simulate(topo, costs, placement, &call).map(|o| o.time)
        };
        if let Some((algo, _)) = tuner_pick(topo, costs, placement, kind, bytes)
            && let Ok(t) = run(algo)
        {
            return Ok((t, algo.name().to_string()));
        }
        xccl::algo::Algorithm::for_collective(kind)
            .iter()
            .filter(|a| a.supports(kind, placement.len(), &shape))
            .filter_map(|&a| run(a).ok().map(|t| (t, a.name().to_string())))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .ok_or_else(|| format!("no algorithm of {kind} runs on {} ranks of {bytes} B", placement.len()))
    }
}

/// What one pipeline rank (or the only stage) did before its data-parallel reduction.
struct Lane {
    /// Blocks it holds with their parameters as `(block, elements)`.
    slots: Vec<(usize, usize)>,
    /// For each micro-batch, when its backward finished each block the rank holds.
    done: Vec<HashMap<usize, f64>>,
    /// When its last compute ended.
    end: f64,
    /// Seconds of compute and of tensor-parallel communication.
    busy: f64,
    tp: f64,
    /// The data-parallel communicator's stream already ran until then (ZeRO-3's gathers).
    comm_free: f64,
}

/// [`predict`] on hosts whose busy threads may outnumber their cores: `crowd` is how many
/// times they do with every rank computing (1 where they do not). A rank that waits, for a
/// pipeline message or a collective, sleeps and leaves its core to the others, so the
/// threads that share the cores are the ranks computing at the time: block compute is
/// slowed by the factor `s` that solves `s = max(1, crowd · compute(s) / step(s))` (the part
/// of the step a rank computes, at that slowdown), found by iterating from `s = crowd`
/// (each step of which moves `s` down towards the solution). Returns the prediction and `s`.
pub fn predict_crowded(
    config: &TrainConfig,
    profile: &Profile,
    layout: Layout,
    net: &Net,
    crowd: f64,
) -> Result<(Prediction, f64), String> {
    let mut s = crowd.max(1.0);
    let mut p = predict(config, profile, layout, net, s)?;
    for _ in 0..50 {
        let next = if p.step > 0.0 { (crowd * p.compute / p.step).max(1.0) } else { 1.0 };
        if (next - s).abs() <= 1e-4 * s {
            break;
        }
        s = next;
        p = predict(config, profile, layout, net, s)?;
    }
    Ok((p, s))
}

/// Predicts one step of `config` with blocks timed by `profile` (compute scaled by
/// `slowdown`, and by the wait for the slowest of the job's groups that the profile's spread
/// gives), ranks placed by `layout`, collectives simulated on `net`.
pub fn predict(
    config: &TrainConfig,
    profile: &Profile,
    layout: Layout,
    net: &Net,
    slowdown: f64,
) -> Result<Prediction, String> {
    let stages = super::stage_blocks(config, profile)?;
    let mut sim = Sim { net, layout, cache: HashMap::new(), tally: BTreeMap::new() };
    let (m, pp) = (config.accum, layout.pp);
    let tp_group = |s: usize| (0..layout.tp).map(|t| layout.rank(s, 0, t)).collect::<Vec<_>>();
    let stage_of = |k: usize| stages.iter().position(|r| r.contains(&k)).unwrap_or(0) % pp.max(1);
    let recompute = config.pipeline.as_ref().is_some_and(|p| p.recompute);
    // ZeRO-3 runs a block's forward again before its backward only with --recompute (its
    // last block keeps its parameters, and what it saved, until its backward).
    let zero3 = matches!(&config.strategy, Strategy::Zero(z) if z.stage == 3);
    let zero3_again = matches!(&config.strategy, Strategy::Zero(z) if z.stage == 3 && z.recompute);
    // Per block: forward compute, its tp time, backward compute, its tp time.
    // Every group of the job waits for the slowest once a step (the closing reductions at
    // least); inside a tensor-parallel group, ranks wait in every block (below).
    let pace = slowdown * profile.spread.wait_factor(layout.dp * layout.pp);
    let mut cost = Vec::new();
    for (k, b) in profile.blocks.iter().enumerate() {
        let g = tp_group(stage_of(k));
        let fwd_runs = m * (1 + usize::from(recompute || (zero3_again && k + 1 < profile.blocks.len())));
        let mut tp = [0.0; 2];
        for (i, ops) in [&b.tp_fwd, &b.tp_bwd].into_iter().enumerate() {
            for &(kind, bytes) in ops {
                tp[i] += sim.time("tp", kind, &g, bytes, if i == 0 { fwd_runs } else { m })?;
            }
        }
        // A tensor-parallel group also waits for its slowest rank in those operations.
        cost.push([b.fwd * pace, tp[0] + b.wait_fwd, b.bwd * pace, tp[1] + b.wait_bwd]);
    }
    let lanes = match &config.pipeline {
        Some(_) => pipeline_lanes(config, profile, &stages, &cost, &mut sim)?,
        None if zero3 => vec![zero3_lane(config, profile, &cost, zero3_again, &mut sim)?],
        None => vec![sequential_lane(m, profile, &cost)],
    };
    let mut best: Option<(f64, usize, f64)> = None;
    for (r, lane) in lanes.iter().enumerate() {
        let (end, opt) = dp_tail(config, profile, layout, r, lane, &mut sim)?;
        let pp_ranks: Vec<usize> = (0..pp).map(|s| layout.rank(s, 0, 0)).collect();
        let end = end + sim.time("pp", CollKind::AllReduce, &pp_ranks, 8, usize::from(r == 0))?;
        if best.is_none_or(|b| end > b.0) {
            best = Some((end, r, opt));
        }
    }
    let (step, r, opt) = best.ok_or("no pipeline stage")?;
    let lane = &lanes[r];
    let bubble = if config.pipeline.is_some() { (lane.end - lane.busy - lane.tp).max(0.0) } else { 0.0 };
    let compute = lane.busy + opt;
    let colls = sim
        .tally
        .into_iter()
        .map(|((group, kind, bytes), (count, each, algo))| CollRow { group, kind, bytes, count, each, algo })
        .collect();
    Ok(Prediction {
        step,
        compute,
        tp_comm: lane.tp,
        bubble,
        exposed: (step - compute - lane.tp - bubble).max(0.0),
        colls,
        stages,
    })
}

/// Micro-batch after micro-batch through every block, without a pipeline.
fn sequential_lane(m: usize, profile: &Profile, cost: &[[f64; 4]]) -> Lane {
    let n = cost.len();
    let (mut t, mut busy, mut tp) = (0.0, 0.0, 0.0);
    let mut done = Vec::new();
    for _ in 0..m {
        for c in cost {
            t += c[0] + c[1];
            busy += c[0];
            tp += c[1];
        }
        let mut d = HashMap::new();
        for k in (0..n).rev() {
            t += cost[k][2] + cost[k][3];
            busy += cost[k][2];
            tp += cost[k][3];
            d.insert(k, t);
        }
        done.push(d);
    }
    Lane { slots: profile.slots.clone(), done, end: t, busy, tp, comm_free: 0.0 }
}

/// ZeRO stage 3: each block's parameters gathered over the data-parallel group just before
/// it runs (the next block's prefetched as one starts) into a buffer its parameters borrow
/// (no copy), gathered again for its backward (whose forward runs again first when
/// `again`, recomputation), and each block's gradient reduce-scattered once its backward is
/// done, all on one stream.
fn zero3_lane(
    config: &TrainConfig,
    profile: &Profile,
    cost: &[[f64; 4]],
    again: bool,
    sim: &mut Sim,
) -> Result<Lane, String> {
    let (n, layout) = (cost.len(), sim.layout);
    let dp: Vec<usize> = (0..layout.dp).map(|d| layout.rank(0, d, 0)).collect();
    let m = config.accum;
    // The operations of one micro-batch: (block, backward?).
    let ops: Vec<(usize, bool)> = (0..n).map(|k| (k, false)).chain((0..n).rev().map(|k| (k, true))).collect();
    let gather = |sim: &mut Sim, k: usize| {
        let bytes = profile.blocks[k].params.div_ceil(layout.dp) * 4;
        sim.time("dp", CollKind::AllGather, &dp, bytes, 1)
    };
    let (mut t, mut busy, mut tp, mut free) = (0.0f64, 0.0, 0.0, 0.0f64);
    let mut done = Vec::new();
    let mut ready = HashMap::new();
    for _ in 0..m {
        let mut d = HashMap::new();
        for (j, &(k, bwd)) in ops.iter().enumerate() {
            // The last block keeps its gathered parameters from its forward to its backward.
            let needs = !(bwd && k + 1 == n);
            if needs && !ready.contains_key(&j) {
                free = free.max(t) + gather(sim, k)?;
                ready.insert(j, free);
            }
            let start = if needs { t.max(ready[&j]) } else { t };
            if let Some(&(k1, b1)) = ops.get(j + 1)
                && !(b1 && k1 + 1 == n)
            {
                free = free.max(start) + gather(sim, k1)?;
                ready.insert(j + 1, free);
            }
            let c = &cost[k];
            let (comp, comm) = match bwd {
                false => (c[0], c[1]),
                true if again && k + 1 < n => (c[0] + c[2], c[1] + c[3]),
                true => (c[2], c[3]),
            };
            t = start + comp + comm;
            busy += comp;
            tp += comm;
            if bwd {
                d.insert(k, t);
                let bytes = profile.blocks[k].params * 4;
                free = free.max(t) + sim.time("dp", CollKind::ReduceScatter, &dp, bytes, 1)?;
            }
        }
        ready.clear();
        done.push(d);
    }
    Ok(Lane { slots: profile.slots.clone(), done, end: t, busy, tp, comm_free: free })
}

/// A computation of a pipeline schedule: a forward, or a share of a backward.
#[derive(Clone, Copy)]
enum Pass {
    Forward,
    /// `share` of the backward's time (1 whole, ½ for each half of a split one); `again`
    /// when the forward runs again first (recomputation, before the whole backward or its
    /// input-gradient half); `weights` when it leaves the chunk's weight gradients done.
    Backward {
        share: f64,
        again: bool,
        weights: bool,
    },
}

impl Pass {
    /// The pass `a` computes, with `recompute` set when forwards run again in backward.
    fn of(a: Action, recompute: bool) -> Option<(Pass, usize)> {
        // The profile times a block's backward whole: a split backward (zb-h1) is costed as
        // two even halves, the input gradient's and the weights', compute and tensor-parallel
        // time alike.
        let (share, again, weights, chunk) = match a {
            Action::Forward { chunk, .. } => return Some((Pass::Forward, chunk)),
            Action::Backward { chunk, .. } => (1.0, recompute, true, chunk),
            Action::BackwardInput { chunk, .. } => (0.5, recompute, false, chunk),
            Action::BackwardWeight { chunk, .. } => (0.5, false, true, chunk),
            _ => return None,
        };
        Some((Pass::Backward { share, again, weights }, chunk))
    }
}

/// A pipeline schedule's actions as timeline lanes, run; one [`Lane`] per pipeline rank.
fn pipeline_lanes(
    config: &TrainConfig,
    profile: &Profile,
    stages: &[Range<usize>],
    cost: &[[f64; 4]],
    sim: &mut Sim,
) -> Result<Vec<Lane>, String> {
    let pc = config.pipeline.as_ref().ok_or("no pipeline")?;
    let schedule = Schedule::new(pc.schedule, config.pipeline_shape(pc)).map_err(|e| e.to_string())?;
    let shape = schedule.shape;
    let (m, gs, layout) = (shape.micro_batches, shape.global_stages(), sim.layout);
    let sum = |g: usize, i: usize| stages[g].clone().map(|k| cost[k][i]).sum::<f64>();
    // A pass's compute and tensor-parallel seconds on global stage `g`.
    let costs = |pass: Pass, g: usize| match pass {
        Pass::Forward => (sum(g, 0), sum(g, 1)),
        Pass::Backward { share, again, .. } => {
            let (c, t) = (share * sum(g, 2), share * sum(g, 3));
            if again { (c + sum(g, 0), t + sum(g, 1)) } else { (c, t) }
        }
    };
    let key = |tag: usize, mb: usize, g: usize| (tag * m + mb) * gs + g;
    let mut lanes = Vec::new();
    let mut what = Vec::new();
    for (r, actions) in schedule.ranks.iter().enumerate() {
        let mut ops = Vec::new();
        let mut tags = Vec::new();
        let p2p = |sim: &mut Sim, peer: usize, elems: usize| {
            // To itself (ZB-V's turn) a message is handed over in memory.
            if peer == r {
                return Ok(0.0);
            }
            // A header of five u64 (the tensor's shape), then the f32 payload.
            let ranks = [layout.rank(r, 0, 0), layout.rank(peer, 0, 0)];
            Ok::<f64, String>(
                sim.time("pp", CollKind::Broadcast, &ranks, 40, 1)?
                    + sim.time("pp", CollKind::Broadcast, &ranks, elems * 4, 1)?,
            )
        };
        for &a in actions {
            let (op, tag) = match a {
                Action::Forward { .. }
                | Action::Backward { .. }
                | Action::BackwardInput { .. }
                | Action::BackwardWeight { .. } => {
                    let (pass, chunk) = Pass::of(a, pc.recompute).ok_or("not a computation")?;
                    let g = schedule.global_stage(r, chunk);
                    let (c, t) = costs(pass, g);
                    (Op::compute(c + t), Some((pass, chunk)))
                }
                Action::SendActivation { mb, chunk, peer } => {
                    let g = schedule.global_stage(r, chunk);
                    let elems = profile.blocks[stages[g].end - 1].out_elems;
                    (Op::send(key(0, mb, g), p2p(sim, peer, elems)?), None)
                }
                Action::SendGradient { mb, chunk, peer } => {
                    let g = schedule.global_stage(r, chunk);
                    let elems = profile.blocks[stages[g].start.saturating_sub(1)].out_elems;
                    (Op::send(key(1, mb, g), p2p(sim, peer, elems)?), None)
                }
                Action::RecvActivation { mb, chunk, .. } => {
                    (Op::recv(key(0, mb, schedule.global_stage(r, chunk) - 1)), None)
                }
                Action::RecvGradient { mb, chunk, .. } => {
                    (Op::recv(key(1, mb, schedule.global_stage(r, chunk) + 1)), None)
                }
                Action::OptimizerStep => break,
            };
            ops.push(op);
            tags.push(tag);
        }
        lanes.push(ops);
        what.push(tags);
    }
    let tl = timeline::run(&lanes)?;
    let mut out = Vec::new();
    for (r, spans) in tl.spans.iter().enumerate() {
        let chunks = schedule.chunks_of(stages, r);
        let (mut busy, mut tp) = (0.0, 0.0);
        let mut done: HashMap<usize, f64> = HashMap::new();
        for &(i, _, end) in spans {
            let Some((pass, chunk)) = what[r][i] else { continue };
            let (c, t) = costs(pass, schedule.global_stage(r, chunk));
            busy += c;
            tp += t;
            if let Pass::Backward { weights: true, .. } = pass {
                // A chunk's gradients are handed over after its last backward (or
                // weight-gradient half).
                for k in chunks[chunk].clone() {
                    let e = done.entry(k).or_insert(end);
                    *e = e.max(end);
                }
            }
        }
        let slots =
            profile.slots.iter().copied().filter(|(b, _)| chunks.iter().any(|c| c.contains(b))).collect();
        out.push(Lane { slots, done: vec![done], end: tl.ends[r], busy, tp, comm_free: 0.0 });
    }
    Ok(out)
}

/// The data-parallel reduction after rank `r`'s compute and its optimiser step: when the
/// rank's step ends, and the optimiser's seconds.
fn dp_tail(
    config: &TrainConfig,
    profile: &Profile,
    layout: Layout,
    r: usize,
    lane: &Lane,
    sim: &mut Sim,
) -> Result<(f64, f64), String> {
    let dp: Vec<usize> = (0..layout.dp).map(|d| layout.rank(r, d, 0)).collect();
    let held: usize = lane.slots.iter().map(|s| s.1).sum();
    let last = lane.done.last().ok_or("no micro-batch")?;
    let at = |k: usize| last.get(&k).copied().unwrap_or(lane.end);
    let mut ready = Vec::new();
    let mut dur = Vec::new();
    // The per-block units of ZeRO, in the order backward finishes them.
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    for &(b, len) in &lane.slots {
        match blocks.last_mut() {
            Some(u) if u.0 == b => u.1 += len,
            _ => blocks.push((b, len)),
        }
    }
    let opt_all = profile.optim_per_elem * held as f64;
    let loss = |sim: &mut Sim| sim.time("dp", CollKind::AllReduce, &dp, 8, 1);
    match &config.strategy {
        Strategy::Ddp(c) => {
            for (len, low) in xccl_train::ddp::plan(lane.slots.iter().copied(), c) {
                ready.push(at(low));
                dur.push(sim.time("dp", CollKind::AllReduce, &dp, len * 4, 1)?);
            }
            let comm = timeline::stream(&ready, &dur).max(lane.end) + loss(sim)?;
            Ok((comm + opt_all, opt_all))
        }
        Strategy::Zero(z) => {
            let rounds: Vec<&HashMap<usize, f64>> = match z.stage {
                1 => vec![last],
                2 => lane.done.iter().collect(),
                _ => Vec::new(),
            };
            for d in rounds {
                for &(b, len) in blocks.iter().rev() {
                    ready.push(d.get(&b).copied().unwrap_or(lane.end));
                    dur.push(sim.time("dp", CollKind::ReduceScatter, &dp, len * 4, 1)?);
                }
            }
            let reduced = timeline::stream(&ready, &dur).max(lane.comm_free).max(lane.end) + loss(sim)?;
            let opt = opt_all / layout.dp as f64;
            if z.stage == 3 {
                return Ok((reduced + opt, opt));
            }
            // Each unit's slice updated, then all-gathered while the next is updated.
            let (mut ready, mut dur, mut t) = (Vec::new(), Vec::new(), reduced);
            for &(_, len) in &blocks {
                t += profile.optim_per_elem * (len as f64 / layout.dp as f64);
                ready.push(t);
                dur.push(sim.time("dp", CollKind::AllGather, &dp, len.div_ceil(layout.dp) * 4, 1)?);
            }
            Ok((timeline::stream(&ready, &dur).max(t), opt))
        }
        Strategy::Ps(_) => Err("the parameter server is not modelled".into()),
    }
}

#[cfg(test)]
mod tests;
