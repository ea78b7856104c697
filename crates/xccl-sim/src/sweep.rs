//! Every algorithm of a collective at every size on one topology: simulated times, the
//! simulator's best, and the tuner's pick for the same layout.

use std::time::Instant;

use xccl::CollKind;
use xccl::algo::tune::{self, CostModel, LinkClass, LinkCost};
use xccl::algo::{self, Algorithm, Shape};

use crate::engine::{Call, Outcome, simulate};
use crate::topology::Topology;

/// Operations the step ordering rule may look at in one simulation (it is quadratic in the
/// operations of a step): beyond this an algorithm is skipped, saying why.
pub const ORDER_BUDGET: f64 = 4e9;

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
/// `placement`.
pub fn sweep(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    kind: CollKind,
    only: Option<&[Algorithm]>,
    sizes: &[usize],
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
            let outcome = affordable(kind, algo, placement, &shape).and_then(|()| {
                simulate(
                    topo,
                    costs,
                    placement,
                    &Call { kind, algo, root: 0, shape: shape.clone(), esize: 4 },
                )
            });
            rows.push(Row { algo, bytes, outcome, wall: t0.elapsed().as_secs_f64() });
        }
    }
    rows
}

/// The layout of `kind` moving `bytes` per rank in f32 elements (a barrier moves none).
pub fn shape_of(kind: CollKind, bytes: usize) -> Shape {
    Shape::Count(if kind == CollKind::Barrier { 0 } else { bytes / 4 })
}

/// Whether simulating `algo` stays within [`ORDER_BUDGET`], judged on the programs of the
/// root (rank 0) and of the last rank, standing for the others.
pub fn affordable(kind: CollKind, algo: Algorithm, placement: &[usize], shape: &Shape) -> Result<(), String> {
    let n = placement.len();
    let cost = |r: usize| -> Result<(f64, usize), String> {
        let p = algo::build(kind, algo, r, placement, 0, shape).map_err(|e| e.to_string())?;
        let sq = p.steps.iter().map(|s| (s.ops.len() as f64).powi(2)).sum();
        Ok((sq, p.steps.iter().map(|s| s.ops.len()).max().unwrap_or(0)))
    };
    let (root, root_widest) = cost(0)?;
    let (other, other_widest) = if n > 1 { cost(n - 1)? } else { (0.0, 0) };
    let work = root + other * (n.saturating_sub(1)) as f64;
    if work > ORDER_BUDGET {
        let widest = root_widest.max(other_widest);
        return Err(format!(
            "skipped: {} ranks with {widest} operations in a step need ~{work:.0e} ordering checks (budget {ORDER_BUDGET:.0e})",
            placement.len()
        ));
    }
    Ok(())
}

/// What the tuner would pick here, as a rank of this job would: the layout of hosts, the
/// shared-memory constants of `costs`, and the links between hosts as the bootstrap probe
/// would measure them (the per-message latency plus a typical route's, and one host link's
/// rate). Algorithms beyond the ordering budget are left out, as in the sweep.
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
