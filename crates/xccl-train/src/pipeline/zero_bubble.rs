//! ZB-H1, the memory-bounded zero-bubble schedule of Qi, Wan, Huang and Lin, "Zero Bubble
//! Pipeline Parallelism" (ICLR 2024), for [`Kind::ZeroBubble`](super::schedule::Kind): its
//! passes per rank and its closed-form bubble.
//!
//! A backward is split into `Bi`, the gradient of the stage's input (the previous stage waits
//! for it: it is sent at once), and `W`, the gradient of the stage's weights (only the
//! optimiser step waits for it). Rank `r` of `p`, `m` micro-batches, one chunk per rank:
//!
//! 1. warm-up: the forwards of micro-batches `0..w`, `w = min(p − r − 1, m)` (1F1B's);
//! 2. steady state, `k` in `0..m − w`: `F(w + k)`, `Bi(k)`, then, once `k ≥ r`, the oldest
//!    pending `W`: rank `r` defers its first `r` weight gradients;
//! 3. cool-down, `k` in `m − w..m`: `Bi(k)`, then the oldest pending `W`;
//! 4. the `W`s still pending (`min(r, m − w)` of them), in micro-batch order.
//!
//! With unit costs `t_f = t_b = t_w = 1` (the checker's) the last rank runs `F Bi` pairs
//! without a wait, so gradients leave it every 2 units instead of 1F1B's 3 (a forward and a
//! whole backward) until its deferred `W`s are needed to fill the steady state's third unit,
//! and each upstream rank `r` spends the time 1F1B would wait for the next gradient on one of
//! its `r` deferred `W`s. Rank `r` idles `r` units before its first forward arrives and `p − r
//! − 1` between its last warm-up forward and its first gradient, then never again when `m ≥
//! p`: `p − 1` units of bubble on every rank, a step of `3·m + p − 1`, i.e. `(p − 1)·(t_f +
//! t_b − t_w)` against 1F1B's `(p − 1)·(t_f + t_b + t_w)`: a third of the bubble time (the
//! bubble *fraction*, over a shorter step, is `(p − 1) / (3·m + p − 1)` against `(p − 1) / (m
//! + p − 1)`).
//!
//! With `m < p` the step is `2·m + 2·p − 1`: rank 0 cannot run a `W` before its first `Bi`,
//! which needs micro-batch 0's forward through the `p` stages and its input gradient back
//! through `p − 1` (`2·p − 1` units), and then has `m` `Bi`s and `m` `W`s to run; the
//! schedule meets that bound. Both cases: a step of `3·m + p − 1 + max(p − m, 0)`, a bubble of
//! `p − 1 + max(p − m, 0)` units ([`bubble_ratio`]).
//!
//! Memory: a micro-batch's activations are held from its `F` to its `W`; after the steady
//! state's `F(w + k)` rank `r` holds `w + 1 + r = p` of them (fewer when `m < p`), so every
//! rank holds `min(p, m)`: 1F1B's peak, which 1F1B reaches on rank 0 only. Holding no more
//! than 1F1B on every rank (`p − r` on rank `r`) forces the last rank to run `F Bi W` with
//! nothing deferred, and the step becomes `3·m + 2·(p − 1)`: two thirds of 1F1B's bubble, not
//! one (a test below checks it).

use super::schedule::{Pass, Shape};

/// Rank `rank`'s passes, in order (see the module documentation). `shape` is one
/// [`Shape::validate`] accepts for ZB-H1 (`v = 1`) and `rank < p`.
pub(super) fn passes(shape: Shape, rank: usize) -> Vec<Pass> {
    let Shape { stages: p, micro_batches: m, .. } = shape;
    let warm_up = (p - rank - 1).min(m);
    let mut out = Vec::with_capacity(3 * m);
    out.extend((0..warm_up).map(|mb| Pass::Forward(mb, 0)));
    // The weight gradients run so far, in micro-batch order.
    let mut weights = 0;
    for k in 0..m - warm_up {
        out.push(Pass::Forward(warm_up + k, 0));
        out.push(Pass::BackwardInput(k, 0));
        if k >= rank {
            out.push(Pass::BackwardWeight(weights, 0));
            weights += 1;
        }
    }
    for k in m - warm_up..m {
        out.push(Pass::BackwardInput(k, 0));
        out.push(Pass::BackwardWeight(weights, 0));
        weights += 1;
    }
    out.extend((weights..m).map(|mb| Pass::BackwardWeight(mb, 0)));
    out
}

/// ZB-H1's bubble as `(idle, step)` in units of one pass (`t_f = t_b = t_w`) on `p` stages
/// with `m` micro-batches: `(p − 1 + max(p − m, 0), 3·m + p − 1 + max(p − m, 0))`.
pub(super) fn bubble_ratio(p: usize, m: usize) -> (usize, usize) {
    let idle = p.saturating_sub(1).saturating_add(p.saturating_sub(m));
    (idle, m.saturating_mul(3).saturating_add(idle))
}

#[cfg(test)]
mod tests {
    use super::super::check::{Violation, check};
    use super::super::schedule::{Action, Kind, Schedule};
    use super::*;

    fn build(kind: Kind, stages: usize, micro_batches: usize) -> Schedule {
        Schedule::new(kind, Shape { stages, micro_batches, virtual_stages: 1 }).unwrap()
    }

    /// A rank's computation in the `F`, `Bi`, `W` notation, without communication.
    fn compute(list: &[Action]) -> String {
        let mut out = Vec::new();
        for a in list {
            match a {
                Action::Forward { mb, .. } => out.push(format!("F{mb}")),
                Action::BackwardInput { mb, .. } => out.push(format!("B{mb}")),
                Action::BackwardWeight { mb, .. } => out.push(format!("W{mb}")),
                _ => {}
            }
        }
        out.join(" ")
    }

    #[test]
    fn four_stages_eight_micro_batches() {
        let s = build(Kind::ZeroBubble, 4, 8);
        let ranks: Vec<String> = s.ranks.iter().map(|l| compute(l)).collect();
        assert_eq!(
            ranks,
            [
                // Warm-up 3, then F Bi W from the start.
                "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
                // Warm-up 2, one W deferred.
                "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
                "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
                // No warm-up, three W deferred to the end.
                "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7",
            ]
        );
        // The gradient is sent right after Bi, W neither sends nor receives.
        #[rustfmt::skip]
        let rank2 = [
            Action::RecvGradient { mb: 1, chunk: 0, peer: 3 },
            Action::BackwardInput { mb: 1, chunk: 0 },
            Action::SendGradient { mb: 1, chunk: 0, peer: 1 },
            Action::RecvActivation { mb: 3, chunk: 0, peer: 1 },
        ];
        let at = s.ranks[2].iter().position(|&a| a == rank2[1]).unwrap();
        assert_eq!(s.ranks[2][at - 1..at + 3], rank2);
        let w = s.ranks[3].iter().position(|&a| a == Action::BackwardWeight { mb: 0, chunk: 0 }).unwrap();
        assert_eq!(s.ranks[3][w - 1], Action::SendGradient { mb: 3, chunk: 0, peer: 2 });
        // A step of 3·8 + 3 = 27 units, 1F1B's 3·(8 + 3) = 33.
        let r = check(&s).unwrap();
        assert_eq!((r.makespan, r.busy), (27, 24));
        assert_eq!(r.rank_activations, [4, 4, 4, 4]);
        let r = check(&build(Kind::OneFOneB, 4, 8)).unwrap();
        assert_eq!((r.makespan, r.busy), (33, 24));
        assert_eq!(r.rank_activations, [4, 3, 2, 1]);
    }

    #[test]
    fn a_third_of_one_f_one_b_bubble_at_its_peak_memory() {
        for p in 1..=16 {
            for m in p..=64 {
                let zb = check(&build(Kind::ZeroBubble, p, m)).unwrap();
                let one = check(&build(Kind::OneFOneB, p, m)).unwrap();
                let what = format!("p={p} m={m}");
                // Bubble times: (p − 1)·(t_f + t_b − t_w) against (p − 1)·(t_f + t_b + t_w).
                assert_eq!(zb.makespan - zb.busy, (p - 1) as u64, "{what}");
                assert_eq!(one.makespan - one.busy, 3 * (p - 1) as u64, "{what}");
                assert_eq!(3 * (zb.makespan - zb.busy), one.makespan - one.busy, "{what}");
                assert!(zb.simulated_bubble <= one.simulated_bubble, "{what}");
                // Every rank holds p, 1F1B's peak (rank 0's); 1F1B's rank r holds p − r.
                assert_eq!(zb.rank_activations, vec![p; p], "{what}");
                let one_f_one_b: Vec<usize> = (0..p).map(|r| p - r).collect();
                assert_eq!(one.rank_activations, one_f_one_b, "{what}");
                assert_eq!(zb.max_activations, one.max_activations, "{what}");
            }
        }
    }

    #[test]
    fn fewer_micro_batches_than_stages() {
        // Rank 0's first W waits 2·p − 1 units for its first Bi, then 2·m units of work.
        for p in 2..=16 {
            for m in 1..p {
                let r = check(&build(Kind::ZeroBubble, p, m)).unwrap();
                assert_eq!(r.makespan, (2 * m + 2 * p - 1) as u64, "p={p} m={m}");
                assert_eq!(r.rank_activations, vec![m; p], "p={p} m={m}");
            }
        }
    }

    #[test]
    fn weights_right_after_their_input_gradients_cost_a_third_more_bubble() {
        // Every W right after its Bi: each rank holds no more than 1F1B's p − r, but the
        // last rank's gradients leave every 3 units and the step is 3·m + 2·(p − 1).
        let (p, m) = (4, 8);
        let mut s = build(Kind::ZeroBubble, p, m);
        for list in &mut s.ranks {
            let weights: Vec<Action> =
                list.iter().copied().filter(|a| matches!(a, Action::BackwardWeight { .. })).collect();
            list.retain(|a| !matches!(a, Action::BackwardWeight { .. }));
            for w in weights {
                let Action::BackwardWeight { mb, chunk } = w else { continue };
                let bi = list.iter().position(|&a| a == Action::BackwardInput { mb, chunk }).unwrap();
                let after = bi + 1 + usize::from(matches!(list[bi + 1], Action::SendGradient { .. }));
                list.insert(after, w);
            }
        }
        let makespan = (3 * m + 2 * (p - 1)) as u64;
        let err = check(&s).unwrap_err();
        assert_eq!(err, Violation::Bubble { makespan, busy: 3 * m as u64, closed_form: (3, 27) });
    }
}
