//! Every algorithm of a collective at every size on one topology: simulated times, the
//! simulator's best, and the tuner's pick for the same layout.

use std::time::Instant;

use xccl::CollKind;
use xccl::algo::tune::{self, CostModel, LinkClass, LinkCost};
use xccl::algo::{self, Algorithm, Shape};
use xccl::schedule::Op;

use crate::engine::{Call, Outcome, simulate, simulate_calls};
use crate::topology::Topology;

/// Flows the fluid model may re-rate in one simulation: beyond this an algorithm is skipped,
/// saying why. Where a rank sends several messages in one step (one after another, `alpha`
/// apart), the flows of all ranks are in flight together and share links, and each start or
/// end re-rates them all: a step costs the square of its messages (direct exchange on 256
/// ranks, 65 280 messages a step: ~10¹⁰). Where every rank sends at most one, a step costs
/// its messages.
pub const FLUID_BUDGET: f64 = 1e9;

/// One algorithm at one size.
#[derive(Clone, Debug)]
pub struct Row {
    /// The algorithm.
    pub algo: Algorithm,
    /// Bytes per rank (the collective's count times the element size).
    pub bytes: usize,
    /// The simulation, or why it was skipped.
    pub outcome: Result<Outcome, String>,
    /// Wall-clock seconds the simulation took.
    pub wall: f64,
}

/// Simulates every algorithm of `kind` that runs on this layout (or those of `only`) at
/// every size of `sizes` (bytes per rank, f32 elements), ranks placed on hosts by
/// `placement`. With `calls` above 1, each rank makes that many calls back to back (as a
/// benchmark's loop does) and a row's time is a call's in that loop: the time of all the
/// calls less that of one alone, over the calls after the first ([`per_call`]).
pub fn sweep(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    kind: CollKind,
    only: Option<&[Algorithm]>,
    sizes: &[usize],
    calls: usize,
) -> Vec<Row> {
    let n = placement.len();
    let mut rows = Vec::new();
    for &bytes in sizes {
        let shape = shape_of(kind, bytes);
        for &algo in Algorithm::for_collective(kind) {
            if only.is_some_and(|o| !o.contains(&algo)) || !algo.supports(kind, n, &shape) {
                continue;
            }
            let t0 = Instant::now();
            let call = Call { kind, algo, root: 0, shape: shape.clone(), esize: 4 };
            let outcome = affordable(kind, algo, placement, &shape)
                .and_then(|()| per_call(topo, costs, placement, &call, calls));
            rows.push(Row { algo, bytes, outcome, wall: t0.elapsed().as_secs_f64() });
        }
    }
    rows
}

/// One call of `call` as it runs among `calls` made back to back: a single call's outcome
/// (its messages, the bytes on each link) with the time a call adds to the loop, `(T(calls)
/// - T(1)) / (calls - 1)`; for `calls` of 1, the single call's.
pub fn per_call(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    call: &Call,
    calls: usize,
) -> Result<Outcome, String> {
    let one = simulate(topo, costs, placement, call)?;
    if calls <= 1 {
        return Ok(one);
    }
    let all = simulate_calls(topo, costs, placement, call, calls)?;
    Ok(Outcome { time: (all.time - one.time) / (calls - 1) as f64, ..one })
}

/// The layout of `kind` moving `bytes` per rank in f32 elements (a barrier moves none).
pub fn shape_of(kind: CollKind, bytes: usize) -> Shape {
    Shape::Count(if kind == CollKind::Barrier { 0 } else { bytes / 4 })
}

/// Whether simulating `algo` stays within [`FLUID_BUDGET`], judged on the programs of the
/// root (rank 0) and of the last rank, standing for the others (messages of no bytes take
/// no flow).
pub fn affordable(kind: CollKind, algo: Algorithm, placement: &[usize], shape: &Shape) -> Result<(), String> {
    let n = placement.len();
    let sends = |r: usize| -> Result<Vec<usize>, String> {
        let p = algo::build(kind, algo, r, placement, 0, shape).map_err(|e| e.to_string())?;
        Ok(p.steps
            .iter()
            .map(|s| s.ops.iter().filter(|op| matches!(op, Op::Send { src, .. } if src.len > 0)).count())
            .collect())
    };
    let root = sends(0)?;
    let other = if n > 1 { sends(n - 1)? } else { Vec::new() };
    let (mut work, mut widest, mut most) = (0.0, 0, 0.0f64);
    for s in 0..root.len().max(other.len()) {
        let (a, b) = (root.get(s).copied().unwrap_or(0), other.get(s).copied().unwrap_or(0));
        let flows = a as f64 + b as f64 * n.saturating_sub(1) as f64;
        work += if a.max(b) > 1 { flows * flows } else { flows };
        widest = widest.max(a.max(b));
        most = most.max(flows);
    }
    if work > FLUID_BUDGET {
        return Err(format!(
            "skipped: {n} ranks sending up to {widest} messages at once in a step ({most:.0e} flows in flight) need ~{work:.0e} re-ratings of flows (budget {FLUID_BUDGET:.0e})"
        ));
    }
    Ok(())
}

/// What the tuner would pick here, as a rank of this job would: the layout of hosts, the
/// shared-memory constants of `costs`, and the links between hosts as the bootstrap probe
/// would measure them (the per-message latency plus a typical route's, and one host link's
/// rate). Algorithms beyond the fluid budget are left out, as in the sweep.
pub fn tuner_pick(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    kind: CollKind,
    bytes: usize,
) -> Option<(Algorithm, f64)> {
    let n = placement.len();
    let per_host = n / placement.iter().collect::<std::collections::BTreeSet<_>>().len().max(1);
    let far = placement.iter().copied().max().unwrap_or(0);
    let route = topo.route(placement[0], far);
    let lat: f64 = route.iter().map(|&l| topo.links[l].lat).sum();
    let host_bw = route.first().map_or(1.0 / costs.shm.beta, |&l| topo.links[l].bw);
    let mut c = costs.clone();
    c.tcp = LinkCost { alpha: costs.tcp.alpha + lat, beta: 1.0 / host_bw, ..c.tcp };
    let t =
        tune::Placement::new(placement.to_vec(), vec![per_host.max(1); n], LinkClass::Shm, LinkClass::Tcp);
    let shape = shape_of(kind, bytes);
    Algorithm::for_collective(kind)
        .iter()
        .filter(|a| a.supports(kind, n, &shape) && affordable(kind, **a, placement, &shape).is_ok())
        .filter_map(|&a| tune::predict(&c, &t, kind, a, 0, &shape, 4).ok().map(|p| (a, p)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
}
