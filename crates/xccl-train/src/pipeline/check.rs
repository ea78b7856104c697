//! The checker: runs every rank's action list of a [`Schedule`] and proves it correct, in the
//! spirit of the collectives' symbolic verifier ([`xccl::verify`]).
//!
//! Every rank executes its list in order. Sends are asynchronous: they put a [`Message`]
//! (what it carries, its micro-batch, the global stage it leaves) on a FIFO channel per
//! ordered pair of ranks and [`Payload`] (as a tag per payload would keep them apart on the
//! wire). Receives block until their channel holds a message, which must be the one they
//! expect. The run proves:
//!
//! 1. every list ends with its only [`Action::OptimizerStep`], and by then the rank has run
//!    the forward and the backward of each of its `(micro-batch, chunk)` pairs exactly once
//!    (a whole [`Action::Backward`], or an [`Action::BackwardInput`] and a later
//!    [`Action::BackwardWeight`], never both), and sent each activation and gradient its
//!    neighbours need ([`Violation::End`], [`Fault::Repeated`]);
//! 2. the `k`-th receive on a channel takes the `k`-th send, with the micro-batch and global
//!    stage it expects, from and to the ranks of the neighbouring global stages
//!    ([`Fault::Mismatch`], [`Fault::WrongPeer`], [`Fault::NoSuchMessage`]); every send has
//!    its receive since each message is sent at most once and each of the receiver's forwards
//!    and backwards needs the receive of its one message;
//! 3. no deadlock: when no rank can progress before all are done, [`Violation::Deadlock`]
//!    names the blocked ranks and the receives they wait at;
//! 4. on every rank a backward (whole or input-gradient) follows its forward, a weight-gradient
//!    backward its input-gradient one, a forward not on global stage 0 its activation's
//!    receive, a backward not on the last global stage its gradient's receive, and a send the
//!    computation of what it sends ([`Fault::Early`]);
//! 5. a rank never holds more activations (forwards done whose backward is not, or, split,
//!    whose weight-gradient backward is not) than [`Schedule::activation_bound`]
//!    ([`Violation::Memory`]);
//! 6. timing, with costs in integer units: a chunk's forward 1, its whole backward 2, an
//!    input-gradient and a weight-gradient backward 1 each, communication free; a rank's clock
//!    advances by its computations and a receive moves it to the time its message was sent (a
//!    computation starts when its rank is free and its inputs have arrived). With makespan `T`
//!    (the largest clock at the optimiser steps) and every rank busy `3·m·v`, the bubble `1 −
//!    3·m·v / T` must equal [`Schedule::bubble_ratio`] exactly, compared as integers
//!    ([`Violation::Bubble`]).

use std::collections::VecDeque;

use super::schedule::{Action, Kind, Schedule, Shape};
pub use super::violation::{Blocked, Fault, Message, Need, Payload, Report, Violation};

/// The cost of a chunk's forward, in time units.
const FORWARD_COST: u64 = 1;
/// The cost of a chunk's input-gradient backward, in time units.
const INPUT_COST: u64 = 1;
/// The cost of a chunk's weight-gradient backward, in time units.
const WEIGHT_COST: u64 = 1;
/// The cost of a chunk's whole backward, in time units.
const BACKWARD_COST: u64 = INPUT_COST + WEIGHT_COST;

/// Flags of one `(micro-batch, chunk)` pair on its rank: what has run. A whole backward sets
/// both `INPUT` and `WEIGHT`.
const FORWARD: u8 = 1;
const INPUT: u8 = 2;
const GOT_ACTIVATION: u8 = 4;
const GOT_GRADIENT: u8 = 8;
const SENT_ACTIVATION: u8 = 16;
const SENT_GRADIENT: u8 = 32;
const WEIGHT: u8 = 64;

/// One rank's state in the run.
#[derive(Clone, Default)]
struct RankState {
    /// The next action's index.
    next: usize,
    /// The time its next action may start.
    clock: u64,
    /// Activations held now, and at most.
    held: usize,
    peak: usize,
    /// The channel it waits on, if blocked.
    waiting: Option<usize>,
    /// Per `mb·v + chunk`: the flags above.
    done: Vec<u8>,
}

/// What running one action did.
enum Outcome {
    Ran,
    Blocked(usize),
}

/// The run of a whole schedule.
struct Run<'a> {
    s: &'a Schedule,
    bound: usize,
    ranks: Vec<RankState>,
    /// Per `(from·p + to)·2 + payload`: the messages in flight, with their send times.
    channels: Vec<VecDeque<(Message, u64)>>,
    /// Ranks that may progress.
    ready: VecDeque<usize>,
}

/// The index of the channel from rank `from` to rank `to` for `payload`, of `stages` ranks.
fn channel(stages: usize, from: usize, to: usize, payload: Payload) -> usize {
    (from * stages + to) * 2 + usize::from(payload == Payload::Gradient)
}

impl Run<'_> {
    /// Runs `rank`'s actions until it blocks, finishes or fails.
    fn advance(&mut self, rank: usize) -> Result<(), Violation> {
        let list = &self.s.ranks[rank];
        while let Some(&action) = list.get(self.ranks[rank].next) {
            let index = self.ranks[rank].next;
            match self.step(rank, index, action)? {
                Outcome::Ran => self.ranks[rank].next += 1,
                Outcome::Blocked(channel) => {
                    self.ranks[rank].waiting = Some(channel);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Runs action `index` of `rank`'s list.
    fn step(&mut self, rank: usize, index: usize, action: Action) -> Result<Outcome, Violation> {
        let fail = |fault| Err(Violation::Action { rank, index, action, fault });
        let (mb, chunk, peer) = match action {
            Action::Forward { mb, chunk }
            | Action::Backward { mb, chunk }
            | Action::BackwardInput { mb, chunk }
            | Action::BackwardWeight { mb, chunk } => (mb, chunk, 0),
            Action::SendActivation { mb, chunk, peer }
            | Action::RecvActivation { mb, chunk, peer }
            | Action::SendGradient { mb, chunk, peer }
            | Action::RecvGradient { mb, chunk, peer } => (mb, chunk, peer),
            Action::OptimizerStep => return self.optimizer_step(rank, index).map(|()| Outcome::Ran),
        };
        let shape = self.s.shape;
        if mb >= shape.micro_batches || chunk >= shape.virtual_stages || peer >= shape.stages {
            return fail(Fault::OutOfRange);
        }
        let g = self.s.global_stage(rank, chunk);
        let last = shape.global_stages() - 1;
        let pair = mb * shape.virtual_stages + chunk;
        let done = self.ranks[rank].done[pair];
        let (sets, needs, message): (u8, &[(u8, Need)], _) = match action {
            Action::Forward { .. } if g > 0 => (FORWARD, &[(GOT_ACTIVATION, Need::Activation)], None),
            Action::Forward { .. } => (FORWARD, &[], None),
            Action::Backward { .. } | Action::BackwardInput { .. } => {
                let sets = if matches!(action, Action::Backward { .. }) { INPUT | WEIGHT } else { INPUT };
                let needs: &[(u8, Need)] = match g < last {
                    true => &[(FORWARD, Need::Forward), (GOT_GRADIENT, Need::Gradient)],
                    false => &[(FORWARD, Need::Forward)],
                };
                (sets, needs, None)
            }
            Action::BackwardWeight { .. } => (WEIGHT, &[(INPUT, Need::InputGradient)], None),
            Action::SendActivation { .. } => {
                (SENT_ACTIVATION, &[(FORWARD, Need::Forward)], Some((Payload::Activation, true)))
            }
            Action::RecvActivation { .. } => (GOT_ACTIVATION, &[], Some((Payload::Activation, false))),
            Action::SendGradient { .. } => {
                (SENT_GRADIENT, &[(INPUT, Need::Backward)], Some((Payload::Gradient, true)))
            }
            _ => (GOT_GRADIENT, &[], Some((Payload::Gradient, false))),
        };
        // A message's other end, the next stage for an activation sent or a gradient
        // received, the previous one otherwise; and the stage it leaves.
        let route = match message {
            Some((payload, send)) => {
                let next = (payload == Payload::Activation) == send;
                let other = if next { (g < last).then(|| g + 1) } else { g.checked_sub(1) };
                let Some(other) = other else { return fail(Fault::NoSuchMessage) };
                let expected = self.s.locate(other).0;
                if peer != expected {
                    return fail(Fault::WrongPeer { expected });
                }
                Some((payload, send, if send { g } else { other }))
            }
            None => None,
        };
        if done & sets != 0 {
            return fail(Fault::Repeated);
        }
        if let Some(&(_, need)) = needs.iter().find(|(flag, _)| done & flag == 0) {
            return fail(Fault::Early(need));
        }
        let state = &mut self.ranks[rank];
        match route {
            None if sets == FORWARD => {
                state.clock += FORWARD_COST;
                state.held += 1;
                state.peak = state.peak.max(state.held);
                if state.held > self.bound {
                    return Err(Violation::Memory { rank, index, held: state.held, bound: self.bound });
                }
            }
            None => {
                state.clock += match action {
                    Action::Backward { .. } => BACKWARD_COST,
                    Action::BackwardInput { .. } => INPUT_COST,
                    _ => WEIGHT_COST,
                };
                // The activations are released with the weight gradient.
                if sets & WEIGHT != 0 {
                    state.held -= 1;
                }
            }
            Some((payload, true, stage)) => {
                let message = (Message { payload, mb, stage }, state.clock);
                let channel = channel(shape.stages, rank, peer, payload);
                self.channels[channel].push_back(message);
                if self.ranks[peer].waiting == Some(channel) {
                    self.ranks[peer].waiting = None;
                    self.ready.push_back(peer);
                }
            }
            Some((payload, false, stage)) => {
                let channel = channel(shape.stages, peer, rank, payload);
                let Some(&(got, sent)) = self.channels[channel].front() else {
                    return Ok(Outcome::Blocked(channel));
                };
                let expected = Message { payload, mb, stage };
                if got != expected {
                    return fail(Fault::Mismatch { expected, got });
                }
                self.channels[channel].pop_front();
                state.clock = state.clock.max(sent);
            }
        }
        self.ranks[rank].done[pair] |= sets;
        Ok(Outcome::Ran)
    }

    /// The optimiser step, action `index` of `rank`: last, after all the rank's work.
    fn optimizer_step(&self, rank: usize, index: usize) -> Result<(), Violation> {
        if index + 1 != self.s.ranks[rank].len() {
            return Err(Violation::Action {
                rank,
                index,
                action: Action::OptimizerStep,
                fault: Fault::EarlyStep,
            });
        }
        let shape = self.s.shape;
        let last = shape.global_stages() - 1;
        let v = shape.virtual_stages;
        for (pair, &done) in self.ranks[rank].done.iter().enumerate() {
            let (mb, chunk) = (pair / v, pair % v);
            let g = self.s.global_stage(rank, chunk);
            let missing = if done & FORWARD == 0 {
                Action::Forward { mb, chunk }
            } else if done & INPUT == 0 && self.s.kind.splits_backward() {
                Action::BackwardInput { mb, chunk }
            } else if done & INPUT == 0 {
                Action::Backward { mb, chunk }
            } else if done & WEIGHT == 0 {
                Action::BackwardWeight { mb, chunk }
            } else if g < last && done & SENT_ACTIVATION == 0 {
                Action::SendActivation { mb, chunk, peer: self.s.locate(g + 1).0 }
            } else if g > 0 && done & SENT_GRADIENT == 0 {
                Action::SendGradient { mb, chunk, peer: self.s.locate(g - 1).0 }
            } else {
                continue;
            };
            return Err(Violation::End { rank, missing });
        }
        Ok(())
    }
}

/// Runs `s` and proves it correct (see the module documentation), or says where it is wrong.
pub fn check(s: &Schedule) -> Result<Report, Violation> {
    let shape = s.shape;
    shape.validate(s.kind).map_err(|e| Violation::Shape(e.to_string()))?;
    let p = shape.stages;
    if s.ranks.len() != p {
        return Err(Violation::Shape(format!("{} action lists for {p} pipeline stages", s.ranks.len())));
    }
    for (rank, list) in s.ranks.iter().enumerate() {
        if list.last() != Some(&Action::OptimizerStep) {
            return Err(Violation::End { rank, missing: Action::OptimizerStep });
        }
    }
    let pairs = shape.micro_batches * shape.virtual_stages;
    let mut run = Run {
        s,
        bound: s.activation_bound(),
        ranks: vec![RankState { done: vec![0; pairs], ..RankState::default() }; p],
        channels: vec![VecDeque::new(); p * p * 2],
        ready: (0..p).collect(),
    };
    while let Some(rank) = run.ready.pop_front() {
        run.advance(rank)?;
    }
    let blocked: Vec<Blocked> = (0..p)
        .filter_map(|rank| {
            let index = run.ranks[rank].next;
            s.ranks[rank].get(index).map(|&action| Blocked { rank, index, action })
        })
        .collect();
    if !blocked.is_empty() {
        return Err(Violation::Deadlock { blocked });
    }
    let makespan = run.ranks.iter().map(|r| r.clock).max().unwrap_or(0);
    let busy = pairs as u64 * (FORWARD_COST + BACKWARD_COST);
    let (num, den) = s.bubble_ratio();
    // (makespan − busy) / makespan = num / den, in integers.
    if u128::from(makespan - busy) * den as u128 != num as u128 * u128::from(makespan) {
        return Err(Violation::Bubble { makespan, busy, closed_form: (num, den) });
    }
    Ok(Report {
        max_activations: run.ranks.iter().map(|r| r.peak).max().unwrap_or(0),
        rank_activations: run.ranks.iter().map(|r| r.peak).collect(),
        activation_bound: run.bound,
        makespan,
        busy,
        simulated_bubble: (makespan - busy) as f64 / makespan as f64,
        closed_form_bubble: s.closed_form_bubble(),
    })
}

/// Builds and [`check`]s every schedule (GPipe, 1F1B, interleaved, ZB-H1) with `p` in
/// `1..=max_stages` stages and `m` in `1..=max_micro_batches` micro-batches, the interleaved
/// one with `v` in `1..=max_virtual` chunks per rank, the others with one; in the order kind
/// ([`Kind::ALL`]), `v`, `p`, `m`, calling `each` with every result. Shapes [`Schedule::new`] rejects are skipped; returns how many.
pub fn check_all(
    max_stages: usize,
    max_micro_batches: usize,
    max_virtual: usize,
    mut each: impl FnMut(Kind, Shape, Result<Report, Violation>),
) -> usize {
    let mut skipped = 0;
    for kind in Kind::ALL {
        let chunks = match kind.chunks() {
            Some(v) => v..=v,
            None if kind == Kind::Interleaved => 1..=max_virtual,
            None => 1..=1,
        };
        for virtual_stages in chunks {
            for stages in 1..=max_stages {
                for micro_batches in 1..=max_micro_batches {
                    let shape = Shape { stages, micro_batches, virtual_stages };
                    match Schedule::new(kind, shape) {
                        Ok(s) => each(kind, shape, check(&s)),
                        Err(_) => skipped += 1,
                    }
                }
            }
        }
    }
    skipped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(kind: Kind, stages: usize, micro_batches: usize, virtual_stages: usize) -> Schedule {
        Schedule::new(kind, Shape { stages, micro_batches, virtual_stages }).unwrap()
    }

    #[test]
    fn every_shape_checks_with_its_closed_forms() {
        let (mut checked, mut failures) = (0, Vec::new());
        let skipped = check_all(16, 64, 4, |kind, shape, result| {
            checked += 1;
            let Shape { stages: p, micro_batches: m, virtual_stages: v } = shape;
            match result {
                Ok(r) => {
                    // Independently: the step is the pipeline's fill and drain plus every
                    // rank's work, 3·(v·m + p − 1); ZB-H1's fill and drain take one unit a
                    // stage, p − 1 plus p − m more with fewer micro-batches than stages (rank
                    // 0's first weight gradient waits 2·p − 1 for its input gradient, then
                    // 2·m of backwards); ZB-V's rank r waits r units for its first activation,
                    // then works its 6·m without a gap; the bound is reached.
                    let makespan = match kind {
                        Kind::ZeroBubble => 3 * m + p - 1 + p.saturating_sub(m),
                        Kind::ZeroBubbleV => 6 * m + p - 1,
                        _ => 3 * (v * m + p - 1),
                    };
                    assert_eq!(r.makespan, makespan as u64, "{kind} {shape:?}");
                    assert_eq!(r.busy, 3 * (m * v) as u64, "{kind} {shape:?}");
                    let bound = match kind {
                        Kind::GPipe => m,
                        Kind::Interleaved if v > 1 => (2 * (p - 1) + (v - 1) * p + 1).min(m * v),
                        // Two half-stage chunks a micro-batch: 1F1B's p stages' worth.
                        Kind::ZeroBubbleV => 2 * p,
                        _ => p.min(m),
                    };
                    assert_eq!((r.activation_bound, r.max_activations), (bound, bound), "{kind} {shape:?}");
                    // Every ZB-H1 and ZB-V rank holds 1F1B's peak.
                    if kind.splits_backward() {
                        assert_eq!(r.rank_activations, vec![bound; p], "{kind} {shape:?}");
                    }
                    assert_eq!(r.simulated_bubble, r.closed_form_bubble, "{kind} {shape:?}");
                }
                Err(e) => failures.push(format!("{kind} {shape:?}: {e}")),
            }
        });
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // GPipe, 1F1B, ZB-H1 and interleaved with v = 1 on every shape; interleaved with
        // v = 2..4 needs p ≥ 2 and m a multiple of p; ZB-V (v = 2) p ≥ 2 and m ≥ 2·p − 1.
        let applicable: usize = (2..=16).map(|p| 64 / p).sum::<usize>() * 3;
        let zb_v: usize = (2..=16).map(|p| 64 + 1 - (2 * p - 1)).sum();
        assert_eq!(
            (checked, skipped),
            (4 * 16 * 64 + applicable + zb_v, 3 * 16 * 64 - applicable + 16 * 64 - zb_v)
        );
    }

    #[test]
    fn gpipe_bubble_on_four_stages() {
        let r = check(&build(Kind::GPipe, 4, 4, 1)).unwrap();
        assert_eq!((r.makespan, r.busy), (21, 12));
        assert_eq!(r.simulated_bubble, 3.0 / 7.0);
        assert_eq!(r.max_activations, 4);
        // Interleaving 2 chunks on 4 stages, 8 micro-batches: 3 / 19.
        let r = check(&build(Kind::Interleaved, 4, 8, 2)).unwrap();
        assert_eq!((r.makespan, r.busy), (57, 48));
        assert_eq!(r.simulated_bubble, 9.0 / 57.0);
    }

    fn action_fault(s: &Schedule) -> (usize, usize, Action, Fault) {
        match check(s) {
            Err(Violation::Action { rank, index, action, fault }) => (rank, index, action, fault),
            other => panic!("expected a faulty action, got {other:?}"),
        }
    }

    #[test]
    fn swapped_sends_are_received_out_of_order() {
        let mut s = build(Kind::GPipe, 2, 2, 1);
        // Rank 0: F(0) sendA(0) F(1) sendA(1) ... becomes F(0) F(1) sendA(1) sendA(0) ...
        s.ranks[0][1..4].rotate_left(1);
        let activation = |mb| Message { payload: Payload::Activation, mb, stage: 0 };
        let fault = Fault::Mismatch { expected: activation(0), got: activation(1) };
        assert_eq!(action_fault(&s), (1, 0, Action::RecvActivation { mb: 0, chunk: 0, peer: 0 }, fault));
        let msg = check(&s).unwrap_err().to_string();
        assert_eq!(
            msg,
            "rank 1, action 0 (recvA(0,0)<0): it expects the activation of micro-batch 0 from global \
             stage 0, but the next message on its channel is the activation of micro-batch 1 from \
             global stage 0"
        );
    }

    #[test]
    fn a_backward_before_its_forward() {
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        // Rank 1: recvA(0) F(0) B(0) ... becomes B(0) recvA(0) F(0) ...
        s.ranks[1][..3].rotate_right(1);
        assert_eq!(
            action_fault(&s),
            (1, 0, Action::Backward { mb: 0, chunk: 0 }, Fault::Early(Need::Forward))
        );
    }

    #[test]
    fn a_removed_receive() {
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        assert_eq!(s.ranks[1].remove(4), Action::RecvActivation { mb: 1, chunk: 0, peer: 0 });
        assert_eq!(
            action_fault(&s),
            (1, 4, Action::Forward { mb: 1, chunk: 0 }, Fault::Early(Need::Activation))
        );
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        assert_eq!(s.ranks[0].remove(8), Action::RecvGradient { mb: 1, chunk: 0, peer: 1 });
        assert_eq!(
            action_fault(&s),
            (0, 8, Action::Backward { mb: 1, chunk: 0 }, Fault::Early(Need::Gradient))
        );
    }

    #[test]
    fn a_removed_send_deadlocks() {
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        assert_eq!(s.ranks[0].remove(7), Action::SendActivation { mb: 2, chunk: 0, peer: 1 });
        let blocked = vec![
            Blocked { rank: 0, index: 9, action: Action::RecvGradient { mb: 2, chunk: 0, peer: 1 } },
            Blocked { rank: 1, index: 8, action: Action::RecvActivation { mb: 2, chunk: 0, peer: 0 } },
        ];
        let err = check(&s).unwrap_err();
        assert_eq!(err, Violation::Deadlock { blocked });
        assert_eq!(
            err.to_string(),
            "deadlock: no rank can progress: rank 0 waits at action 9 (recvG(2,0)<1), rank 1 waits \
             at action 8 (recvA(2,0)<0)"
        );
    }

    #[test]
    fn gpipe_relabelled_as_one_f_one_b_exceeds_the_bound() {
        let mut s = build(Kind::GPipe, 2, 4, 1);
        s.kind = Kind::OneFOneB;
        // Rank 0: F(0) sendA(0) F(1) sendA(1) F(2): the third activation, bound min(p, m) = 2.
        assert_eq!(check(&s), Err(Violation::Memory { rank: 0, index: 4, held: 3, bound: 2 }));
    }

    #[test]
    fn a_missing_or_early_optimizer_step() {
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        s.ranks[1].pop();
        assert_eq!(check(&s), Err(Violation::End { rank: 1, missing: Action::OptimizerStep }));
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        s.ranks[0].insert(2, Action::OptimizerStep);
        assert_eq!(action_fault(&s), (0, 2, Action::OptimizerStep, Fault::EarlyStep));
        // The step reached with a backward never run (and its gradient never received).
        let mut s = build(Kind::OneFOneB, 2, 3, 1);
        s.ranks[0].drain(10..12);
        let missing = Action::Backward { mb: 2, chunk: 0 };
        assert_eq!(check(&s), Err(Violation::End { rank: 0, missing }));
    }

    #[test]
    fn wrong_peers_repeats_and_ranges() {
        let mut s = build(Kind::OneFOneB, 3, 2, 1);
        s.ranks[1][1] = Action::SendActivation { mb: 0, chunk: 0, peer: 0 };
        assert_eq!(action_fault(&s).3, Fault::WrongPeer { expected: 2 });
        let mut s = build(Kind::OneFOneB, 3, 2, 1);
        s.ranks[0].insert(1, Action::Forward { mb: 0, chunk: 0 });
        assert_eq!(action_fault(&s), (0, 1, Action::Forward { mb: 0, chunk: 0 }, Fault::Repeated));
        let mut s = build(Kind::OneFOneB, 3, 2, 1);
        s.ranks[2][0] = Action::RecvActivation { mb: 2, chunk: 0, peer: 1 };
        assert_eq!(action_fault(&s).3, Fault::OutOfRange);
        let mut s = build(Kind::OneFOneB, 3, 2, 1);
        s.ranks[2].insert(2, Action::SendActivation { mb: 0, chunk: 0, peer: 0 });
        assert_eq!(action_fault(&s).3, Fault::NoSuchMessage);
    }

    #[test]
    fn a_schedule_without_pipelining_misses_the_closed_form() {
        // Every micro-batch through forward and backward before the next one starts.
        let a = |mb| {
            (
                Action::SendActivation { mb, chunk: 0, peer: 1 },
                Action::RecvActivation { mb, chunk: 0, peer: 0 },
            )
        };
        let g = |mb| {
            (Action::SendGradient { mb, chunk: 0, peer: 0 }, Action::RecvGradient { mb, chunk: 0, peer: 1 })
        };
        let (f, b) = (|mb| Action::Forward { mb, chunk: 0 }, |mb| Action::Backward { mb, chunk: 0 });
        let mut s = build(Kind::OneFOneB, 2, 2, 1);
        s.ranks[0] = vec![f(0), a(0).0, g(0).1, b(0), f(1), a(1).0, g(1).1, b(1), Action::OptimizerStep];
        s.ranks[1] = vec![a(0).1, f(0), b(0), g(0).0, a(1).1, f(1), b(1), g(1).0, Action::OptimizerStep];
        // Each micro-batch takes 1 + 1 + 2 + 2: the step 12 for 6 of work, a bubble of 1/2.
        assert_eq!(check(&s), Err(Violation::Bubble { makespan: 12, busy: 6, closed_form: (1, 3) }));
    }

    #[test]
    fn split_backwards_in_order_once_each() {
        let (bi, w) = (Action::BackwardInput { mb: 0, chunk: 0 }, Action::BackwardWeight { mb: 0, chunk: 0 });
        // Rank 1 (last stage) of ZB-H1, p = 2, m = 2: recvA(0) F(0) Bi(0) sendG(0) recvA(1)
        // F(1) Bi(1) sendG(1) W(0) W(1) step.
        let base = build(Kind::ZeroBubble, 2, 2, 1);
        assert_eq!(base.ranks[1][2..4], [bi, Action::SendGradient { mb: 0, chunk: 0, peer: 0 }]);
        // A weight gradient before its input gradient.
        let mut s = base.clone();
        s.ranks[1].insert(2, w);
        assert_eq!(action_fault(&s), (1, 2, w, Fault::Early(Need::InputGradient)));
        // An input gradient, or a whole backward, after the input gradient.
        let mut s = base.clone();
        s.ranks[1].insert(3, bi);
        assert_eq!(action_fault(&s), (1, 3, bi, Fault::Repeated));
        let mut s = base.clone();
        s.ranks[1].insert(3, Action::Backward { mb: 0, chunk: 0 });
        assert_eq!(action_fault(&s).3, Fault::Repeated);
        // The gradient sent before the input gradient is computed.
        let mut s = base.clone();
        s.ranks[1].swap(2, 3);
        assert_eq!(action_fault(&s).3, Fault::Early(Need::Backward));
        // A weight gradient never run, or an input gradient never run.
        let mut s = base.clone();
        assert_eq!(s.ranks[1].remove(8), w);
        assert_eq!(check(&s), Err(Violation::End { rank: 1, missing: w }));
        let mut s = base.clone();
        s.ranks[1].drain(2..4);
        s.ranks[1].retain(|&a| a != w);
        assert_eq!(check(&s), Err(Violation::End { rank: 1, missing: bi }));
        // Activations are held until the weight gradient: rank 1's W moved to the end, its
        // third forward holds three, over the bound min(p, m) = 2.
        let mut s = build(Kind::ZeroBubble, 2, 4, 1);
        let is_w = |a: &Action| matches!(a, Action::BackwardWeight { .. });
        let weights: Vec<Action> = s.ranks[1].iter().copied().filter(is_w).collect();
        s.ranks[1].retain(|a| !is_w(a));
        let step = s.ranks[1].len() - 1;
        s.ranks[1].splice(step..step, weights);
        // recvA(0) F(0) Bi(0) sendG(0) recvA(1) F(1) Bi(1) sendG(1) recvA(2) F(2)
        assert_eq!(check(&s), Err(Violation::Memory { rank: 1, index: 9, held: 3, bound: 2 }));
    }

    #[test]
    fn split_backwards_cost_one_each() {
        // One stage, one micro-batch: F, Bi, W, 3 units, no bubble.
        let r = check(&build(Kind::ZeroBubble, 1, 1, 1)).unwrap();
        assert_eq!((r.makespan, r.busy, r.simulated_bubble), (3, 3, 0.0));
        // ZB-H1's closed form differs from 1F1B's: relabelled, the bubble check fails.
        let mut s = build(Kind::ZeroBubble, 2, 4, 1);
        s.kind = Kind::GPipe;
        assert_eq!(check(&s), Err(Violation::Bubble { makespan: 13, busy: 12, closed_form: (1, 5) }));
    }

    #[test]
    fn shapes_and_list_counts() {
        let mut s = build(Kind::OneFOneB, 2, 2, 1);
        s.ranks.pop();
        assert_eq!(check(&s), Err(Violation::Shape("1 action lists for 2 pipeline stages".into())));
        let mut s = build(Kind::OneFOneB, 2, 2, 1);
        s.shape.virtual_stages = 2;
        assert!(matches!(check(&s), Err(Violation::Shape(msg)) if msg.contains("--schedule interleaved")));
    }
}
