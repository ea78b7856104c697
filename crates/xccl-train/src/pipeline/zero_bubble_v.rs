//! ZB-V, the V-shaped zero-bubble schedule of Qi, Wan, Huang and Lin, "Zero Bubble Pipeline
//! Parallelism" (ICLR 2024, section 6), for [`Kind::ZeroBubbleV`](super::schedule::Kind): its
//! passes per rank and its closed-form bubble.
//!
//! The model is cut into `2·p` stages placed in a V
//! ([`Placement::V`](super::placement::Placement::V)): rank `r` holds stage `r` (its chunk
//! 0, on the way down) and stage `2·p − 1 − r` (its chunk 1, on the way back up), so rank 0
//! computes the loss. Every backward is split into `Bi` and `W` as in ZB-H1. Rank `r` of
//! `p`, `m ≥ 2·p − 1` micro-batches, `F0`/`F1` a forward of chunk 0/1 (the next micro-batch
//! of that chunk), the same for `Bi` and `W`:
//!
//! 1. warm-up: `2·(p − r) − 1` × `F0`; then `r` × (`F1`, `F0`); then `p − r` × (`F1`, `Bi1`,
//!    `W1`): rank `p − 1` turns each micro-batch around at once, rank 0 fills the time the
//!    first micro-batch takes down and back up with forwards of the next ones;
//! 2. steady state, while a chunk-0 forward is left or chunk 1 trails chunk 0: `F0` (if one is
//!    left), `Bi0`, `W0`, `F1`, `Bi1`, `W1`;
//! 3. cool-down: `r` × (`Bi0`, `Bi1`); `p − r` × (`Bi0`, `W0`); the `W1`s left, then the `W0`s
//!    left (the deferred weight gradients fill the drain).
//!
//! With unit costs (a chunk's `F`, `Bi` and `W` one unit each, the checker's) rank `r` waits
//! `r` units for its first activation and never again: a step of `6·m + p − 1` units, a bubble
//! of `p − 1` units on every rank ([`bubble_ratio`]). A unit is a chunk's pass, half of a
//! one-chunk stage's, so with `t_f = t_b = t_w` (a one-chunk stage's) ZB-V idles
//! `(p − 1)·t_f / 2` against 1F1B's `(p − 1)·(t_f + t_b + t_w)`: a sixth of 1F1B's bubble
//! time, half of ZB-H1's `(p − 1)·(t_f + t_b − t_w)`. A rank holds a (micro-batch, chunk)
//! pair's activations from its `F` to its `W`: at most `2·p` pairs, each half a stage, so
//! `p` stages' worth: 1F1B's peak (reached on every rank).
//!
//! With fewer than `2·p − 1` micro-batches rank 0's warm-up would need forwards that do not
//! exist; [`Shape::validate`](super::schedule::Shape::validate) refuses such shapes and says
//! how many are needed.

use super::schedule::{Pass, Shape};

/// Rank `rank`'s passes, in order (see the module documentation). `shape` is one
/// [`Shape::validate`] accepts for ZB-V (`v = 2`, `m ≥ 2·p − 1`) and `rank < p`.
pub(super) fn passes(shape: Shape, rank: usize) -> Vec<Pass> {
    let Shape { stages: p, micro_batches: m, .. } = shape;
    let mut l = List::default();
    for _ in 0..2 * (p - rank) - 1 {
        l.forward(0);
    }
    for _ in 0..rank {
        l.forward(1);
        l.forward(0);
    }
    for _ in 0..p - rank {
        l.forward(1);
        l.input(1);
        l.weight(1);
    }
    while l.f[0] < m || l.f[1] < l.f[0] {
        if l.f[0] < m {
            l.forward(0);
        }
        l.input(0);
        l.weight(0);
        l.forward(1);
        l.input(1);
        l.weight(1);
    }
    for _ in 0..rank {
        l.input(0);
        l.input(1);
    }
    for _ in 0..p - rank {
        l.input(0);
        l.weight(0);
    }
    for c in [1, 0] {
        while l.w[c] < l.bi[c] {
            l.weight(c);
        }
    }
    l.out
}

/// A rank's passes as they are listed, with the next micro-batch of each pass per chunk.
#[derive(Default)]
struct List {
    out: Vec<Pass>,
    f: [usize; 2],
    bi: [usize; 2],
    w: [usize; 2],
}

impl List {
    fn forward(&mut self, c: usize) {
        self.out.push(Pass::Forward(self.f[c], c));
        self.f[c] += 1;
    }

    fn input(&mut self, c: usize) {
        self.out.push(Pass::BackwardInput(self.bi[c], c));
        self.bi[c] += 1;
    }

    fn weight(&mut self, c: usize) {
        self.out.push(Pass::BackwardWeight(self.w[c], c));
        self.w[c] += 1;
    }
}

/// The closed-form bubble as `(idle, step)` in units of a chunk's pass: `(p − 1, 6·m + p −
/// 1)` (see the module documentation).
pub(super) fn bubble_ratio(p: usize, m: usize) -> (usize, usize) {
    (p.saturating_sub(1), m.saturating_mul(6).saturating_add(p.saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::pipeline::check::check;
    use crate::pipeline::schedule::{Action, Kind, Schedule, Shape};

    fn build(kind: Kind, p: usize, m: usize, v: usize) -> Schedule {
        Schedule::new(kind, Shape { stages: p, micro_batches: m, virtual_stages: v }).unwrap()
    }

    /// A rank's computation as `F0 Bi1 W0 …` (pass, chunk), micro-batches left out.
    fn passes(list: &[Action]) -> String {
        let mut out = Vec::new();
        for a in list {
            out.push(match a {
                Action::Forward { chunk, .. } => format!("F{chunk}"),
                Action::BackwardInput { chunk, .. } => format!("Bi{chunk}"),
                Action::BackwardWeight { chunk, .. } => format!("W{chunk}"),
                _ => continue,
            });
        }
        out.join(" ")
    }

    #[test]
    fn two_stages_three_micro_batches() {
        let s = build(Kind::ZeroBubbleV, 2, 3, 2);
        // Rank 0: 3 forwards of chunk 0, then two F1 Bi1 W1, then the steady state and the
        // drain; rank 1: one F0, one (F1, F0), one F1 Bi1 W1, ...
        assert_eq!(passes(&s.ranks[0]), "F0 F0 F0 F1 Bi1 W1 F1 Bi1 W1 Bi0 W0 F1 Bi1 W1 Bi0 W0 Bi0 W0");
        assert_eq!(passes(&s.ranks[1]), "F0 F1 F0 F1 Bi1 W1 F0 Bi0 W0 F1 Bi1 W1 Bi0 Bi1 Bi0 W0 W1 W0");
        // Rank 1 holds stages 1 and 2: its chunk 0 hands micro-batch 0 to its chunk 1 itself,
        // and its chunk 1's input gradient goes back to its chunk 0 the same way.
        let own = |a: &Action| match *a {
            Action::SendActivation { peer, .. }
            | Action::RecvActivation { peer, .. }
            | Action::SendGradient { peer, .. }
            | Action::RecvGradient { peer, .. } => peer == 1,
            _ => false,
        };
        assert_eq!(s.ranks[1].iter().filter(|a| own(a)).count(), 4 * 3);
        assert_eq!(
            s.ranks[1][..3],
            [
                Action::RecvActivation { mb: 0, chunk: 0, peer: 0 },
                Action::Forward { mb: 0, chunk: 0 },
                Action::SendActivation { mb: 0, chunk: 0, peer: 1 },
            ]
        );
        // Rank 0 holds the first stage and the last (the loss): its chunk 1 takes no gradient.
        assert!(!s.ranks[0].iter().any(|a| matches!(a, Action::RecvGradient { chunk: 1, .. })));
    }

    #[test]
    fn a_sixth_of_one_f_one_b_bubble_at_its_peak_memory() {
        // The same model cut into p stages (1F1B) or 2·p half-stage chunks (ZB-V): in units
        // of a stage's pass ZB-V idles (p − 1)/2 of them, 1F1B 3·(p − 1).
        for p in 2..=8 {
            for m in 2 * p - 1..=32 {
                let zb = check(&build(Kind::ZeroBubbleV, p, m, 2)).unwrap();
                let ofob = check(&build(Kind::OneFOneB, p, m, 1)).unwrap();
                let idle = |r: &crate::pipeline::check::Report| r.makespan - r.busy;
                // ZB-V's units are half of 1F1B's.
                assert_eq!(6 * idle(&zb), 2 * idle(&ofob), "p={p} m={m}");
                assert_eq!(idle(&zb), (p - 1) as u64, "p={p} m={m}");
                // 2·p half-stage pairs on every rank: p stages' worth, 1F1B's peak.
                assert_eq!(zb.rank_activations, vec![2 * p; p], "p={p} m={m}");
                assert_eq!(2 * ofob.max_activations, zb.max_activations, "p={p} m={m}");
            }
        }
    }

    #[test]
    fn shapes_it_cannot_run_are_refused_with_what_to_do() {
        let refused = |p, m, v| match Schedule::new(
            Kind::ZeroBubbleV,
            Shape { stages: p, micro_batches: m, virtual_stages: v },
        ) {
            Err(Error::Config(msg)) => msg,
            other => panic!("p={p} m={m} v={v} gives {other:?}"),
        };
        let msg = refused(4, 6, 2);
        assert!(
            msg.contains("at least 2·pp − 1 = 7 micro-batches") && msg.contains("--micro-batches 7"),
            "{msg}"
        );
        let msg = refused(4, 8, 1);
        assert!(msg.contains("runs 2 model chunks per stage") && msg.contains("--virtual-stages 2"), "{msg}");
        assert!(refused(1, 4, 2).contains("at least 2 pipeline stages"));
        assert!(
            Schedule::new(Kind::ZeroBubbleV, Shape { stages: 4, micro_batches: 7, virtual_stages: 2 })
                .is_ok()
        );
    }
}
