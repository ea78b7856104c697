//! Block times read out of spans: those of the measurement's iterations, or those of a
//! Chrome trace an earlier `xccl train` wrote.
//!
//! A block's time is its compute alone: the tensor-parallel operations that ran inside its
//! span (the `comm tp` track) are taken out and kept as the block's list of collectives,
//! which the prediction simulates on the modelled network instead. What a group of
//! tensor-parallel ranks loses waiting for its slowest rank inside those operations is
//! measured beside it (the ranks measured at once in lockstep), and so is how unevenly whole
//! iterations go ([`Spread`]).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use xccl::{CollKind, SpanOp};
use xccl_train::trace::{Kind, Span, op_from_json};

use super::measure::{BlockTimes, Profile};
use super::spread::Spread;
use crate::bench::median;

/// The kind and bytes (of this rank's input) of a collective span.
pub fn collective(op: Option<SpanOp>) -> Option<(CollKind, usize)> {
    match op? {
        SpanOp::Collective { kind, dtype, count } => Some((kind, count * dtype.size())),
        _ => None,
    }
}

/// One block in one iteration: compute seconds of its forward (the loss's added on the last
/// block) and backward, and the tensor-parallel operations of each.
struct BlockRun {
    fwd: f64,
    bwd: f64,
    tp_fwd: Vec<(CollKind, usize)>,
    tp_bwd: Vec<(CollKind, usize)>,
}

/// Block `name` (the model's last when `last`) in one iteration's spans.
fn block_run(spans: &[Span], name: &str, last: bool) -> Result<BlockRun, String> {
    let ops = tp_ops(spans);
    let find = |name: &str| spans.iter().find(|s| s.kind == Kind::Compute && s.name == name);
    let f = find(&format!("fwd {name}"))
        .ok_or_else(|| format!("no span 'fwd {name}' in the trace's iterations"))?;
    let b = find(&format!("bwd {name}"))
        .ok_or_else(|| format!("no span 'bwd {name}' in the trace's iterations"))?;
    let (fc, mut tp_fwd) = inside(f, &ops);
    let (bc, tp_bwd) = inside(b, &ops);
    let mut fwd = (f.dur_us - fc).max(0.0);
    if last && let Some(l) = find("loss") {
        let (lc, lo) = inside(l, &ops);
        fwd += (l.dur_us - lc).max(0.0);
        tp_fwd.extend(lo);
    }
    Ok(BlockRun { fwd: fwd * 1e-6, bwd: (b.dur_us - bc).max(0.0) * 1e-6, tp_fwd, tp_bwd })
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
            let r = block_run(spans, &b.name, k == last)?;
            if i == 0 {
                b.tp_fwd = r.tp_fwd;
                b.tp_bwd = r.tp_bwd;
            }
            fwd.push(r.fwd);
            bwd.push(r.bwd);
        }
        b.fwd = median(&mut fwd);
        b.bwd = median(&mut bwd);
    }
    Ok(())
}

/// From the iterations of ranks that ran at once, `groups[g][r]` those of rank `r` of
/// tensor-parallel group `g` (its ranks in lockstep, meeting in every block's operations):
/// each block's wait for the group's slowest rank, forward and backward (the median over the
/// groups' iterations of their slowest rank's compute, less the median of every rank's), and
/// the spread of the groups' iterations (a group's iteration lasting as long as its slowest
/// rank's).
pub fn apply_groups(profile: &mut Profile, groups: &[Vec<&[Vec<Span>]>]) -> Result<(), String> {
    let last = profile.blocks.len().saturating_sub(1);
    let iterations = |g: &[&[Vec<Span>]]| g.iter().map(|r| r.len()).min().unwrap_or(0);
    for (k, b) in profile.blocks.iter_mut().enumerate() {
        let (mut slow, mut all) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for g in groups {
            for i in 0..iterations(g) {
                let runs =
                    g.iter().map(|r| block_run(&r[i], &b.name, k == last)).collect::<Result<Vec<_>, _>>()?;
                for (d, pick) in [|r: &BlockRun| r.fwd, |r: &BlockRun| r.bwd].into_iter().enumerate() {
                    slow[d].push(runs.iter().map(pick).fold(0.0, f64::max));
                    all[d].extend(runs.iter().map(pick));
                }
            }
        }
        let wait = |d: usize, slow: &mut [Vec<f64>; 2], all: &mut [Vec<f64>; 2]| {
            (median(&mut slow[d]) - median(&mut all[d])).max(0.0)
        };
        b.wait_fwd = wait(0, &mut slow, &mut all);
        b.wait_bwd = wait(1, &mut slow, &mut all);
    }
    let per_group: Vec<Vec<f64>> = groups
        .iter()
        .map(|g| {
            (0..iterations(g))
                .map(|i| g.iter().map(|r| iteration_compute(&r[i])).fold(0.0, f64::max))
                .collect()
        })
        .collect();
    profile.spread = Spread::from_iterations(&per_group);
    Ok(())
}

/// The tensor-parallel operations among `spans`.
fn tp_ops(spans: &[Span]) -> Vec<&Span> {
    spans.iter().filter(|s| s.kind == Kind::Comm && s.track.contains("tp")).collect()
}

/// The microseconds of the operations of `ops` that started inside `s` (at most its own),
/// and their kinds and sizes.
fn inside(s: &Span, ops: &[&Span]) -> (f64, Vec<(CollKind, usize)>) {
    let mine: Vec<&&Span> =
        ops.iter().filter(|o| o.start_us >= s.start_us && o.start_us < s.start_us + s.dur_us).collect();
    let t: f64 = mine.iter().map(|o| o.dur_us.min(s.dur_us)).sum();
    (t, mine.iter().filter_map(|o| collective(o.op)).collect())
}

/// Seconds of compute in one iteration's spans: its blocks' forwards and backwards and the
/// loss, less the tensor-parallel operations inside them.
fn iteration_compute(spans: &[Span]) -> f64 {
    let ops = tp_ops(spans);
    let block = |s: &&Span| {
        s.kind == Kind::Compute
            && (s.name.starts_with("fwd ") || s.name.starts_with("bwd ") || s.name == "loss")
    };
    spans.iter().filter(block).map(|s| (s.dur_us - inside(s, &ops).0).max(0.0)).sum::<f64>() * 1e-6
}

/// Reads the compute spans of every rank (its `pid`) of a Chrome trace `xccl train` wrote
/// (`trace.json`), with their `comm tp` spans, as one list per iteration: a new iteration
/// starts at each `fwd` of the first block. Ranks without such a span are left out.
pub fn trace_runs(text: &str, first_block: &str) -> Result<BTreeMap<u64, Vec<Vec<Span>>>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not a JSON trace: {e}"))?;
    let events = v["traceEvents"].as_array().ok_or("no traceEvents: not a Chrome trace of xccl train")?;
    let mut tracks = HashMap::new();
    for e in events {
        if e["ph"] == "M" && e["name"] == "thread_name" {
            let key = (e["pid"].as_u64().unwrap_or(0), e["tid"].as_u64().unwrap_or(0));
            tracks.insert(key, e["args"]["name"].as_str().unwrap_or("").to_string());
        }
    }
    let mut spans: Vec<(u64, Span)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| {
            let kind = match e["cat"].as_str()? {
                "compute" => Kind::Compute,
                "comm" => Kind::Comm,
                _ => return None,
            };
            let pid = e["pid"].as_u64()?;
            let tid = e["tid"].as_u64().unwrap_or(0);
            let span = Span {
                name: e["name"].as_str()?.to_string(),
                track: tracks.get(&(pid, tid)).cloned().unwrap_or_default(),
                kind,
                start_us: e["ts"].as_f64()?,
                dur_us: e["dur"].as_f64()?,
                op: op_from_json(&e["args"]),
            };
            Some((pid, span))
        })
        .collect();
    spans.sort_by(|a, b| a.1.start_us.total_cmp(&b.1.start_us));
    let start = format!("fwd {first_block}");
    let mut ranks: BTreeMap<u64, Vec<Vec<Span>>> = BTreeMap::new();
    for (pid, s) in spans {
        let runs = ranks.entry(pid).or_default();
        if s.kind == Kind::Compute && s.name == start {
            runs.push(Vec::new());
        }
        if let Some(r) = runs.last_mut() {
            r.push(s);
        }
    }
    ranks.retain(|_, runs| !runs.is_empty());
    for runs in ranks.values_mut() {
        // The first iteration warms up allocations, as train's own statistics leave it out.
        if runs.len() > 1 {
            runs.remove(0);
        }
    }
    Ok(ranks)
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

    fn s(name: &str, track: &str, kind: Kind, start: f64, dur: f64) -> Span {
        Span {
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
        }
    }

    fn block(name: &str) -> BlockTimes {
        BlockTimes {
            name: name.into(),
            fwd: 0.0,
            bwd: 0.0,
            out_elems: 1,
            params: 1,
            saved: 0,
            tp_fwd: vec![],
            tp_bwd: vec![],
            wait_fwd: 0.0,
            wait_bwd: 0.0,
        }
    }

    /// One iteration of one block `a`: a forward of `f` µs compute, then a tensor-parallel
    /// operation of 30 µs, a backward of `b` µs compute.
    fn iteration(f: f64, b: f64) -> Vec<Span> {
        vec![
            s("fwd a", "compute", Kind::Compute, 0.0, f + 30.0),
            s("all_reduce #1 (f32 x 10, sum, ring)", "comm tp", Kind::Comm, f, 30.0),
            s("bwd a", "compute", Kind::Compute, f + 30.0, b),
        ]
    }

    #[test]
    fn tensor_parallel_groups_wait_for_their_slowest_rank_in_each_block() {
        // Group 0: rank 1 is slower in the forward of iteration 0 and the backward of 1;
        // group 1: its two ranks keep one pace, 20% slower than group 0's in iteration 1.
        let g0 = [
            vec![iteration(100.0, 200.0), iteration(100.0, 200.0)],
            vec![iteration(140.0, 200.0), iteration(100.0, 260.0)],
        ];
        let g1 = [
            vec![iteration(100.0, 200.0), iteration(120.0, 240.0)],
            vec![iteration(100.0, 200.0), iteration(120.0, 240.0)],
        ];
        let groups: Vec<Vec<&[Vec<Span>]>> =
            [&g0, &g1].iter().map(|g| g.iter().map(Vec::as_slice).collect()).collect();
        let mut profile = Profile {
            blocks: vec![block("a")],
            slots: vec![(0, 1)],
            optim_per_elem: 0.0,
            spread: Spread::default(),
            source: String::new(),
        };
        apply_groups(&mut profile, &groups).unwrap();
        // Forward: the groups' slowest 140, 100, 100, 120 (median 110); every rank's 100 ×5,
        // 140, 120 ×2 (median 100): a wait of 10 µs. Backward: slowest 200, 260, 200, 240
        // (median 220), every rank's median 200: 20 µs.
        let b = &profile.blocks[0];
        assert!((b.wait_fwd - 10e-6).abs() < 1e-12, "{}", b.wait_fwd);
        assert!((b.wait_bwd - 20e-6).abs() < 1e-12, "{}", b.wait_bwd);
        // Each group's iteration is its slowest rank's compute (the operation left out):
        // 340, 360 and 300, 360; the slowest of the two groups 340, 360, whose median equals
        // every group's (350): no wait at two groups; at four, two independent pairs, the
        // 0.5^(1/2) quantile of 340, 360.
        assert_eq!(profile.spread.at_once(), 2);
        assert_eq!(profile.spread.wait_factor(2), 1.0);
        let q = 340.0 + 20.0 * 0.5f64.sqrt();
        assert!(
            (profile.spread.wait_factor(4) - q / 350.0).abs() < 1e-12,
            "{}",
            profile.spread.wait_factor(4)
        );
    }

    #[test]
    fn spans_give_compute_without_the_tp_operations_inside() {
        let run = vec![
            s("fwd a", "compute", Kind::Compute, 0.0, 100.0),
            s("all_reduce #1 (f32 x 10, sum, ring)", "comm tp", Kind::Comm, 50.0, 30.0),
            s("loss", "compute", Kind::Compute, 100.0, 20.0),
            s("bwd a", "compute", Kind::Compute, 120.0, 200.0),
        ];
        let mut blocks = vec![block("a")];
        apply_spans(&mut blocks, &[run]).unwrap();
        assert!((blocks[0].fwd - 90e-6).abs() < 1e-12, "{}", blocks[0].fwd);
        assert!((blocks[0].bwd - 200e-6).abs() < 1e-12);
        assert_eq!(blocks[0].tp_fwd, vec![(CollKind::AllReduce, 40)]);
    }
}
