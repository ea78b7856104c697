//! Pipeline schedules as plain data: for each rank of the pipeline group, the list of its
//! forwards, backwards, sends, receives and its optimiser step, in order.
//!
//! The model's blocks are cut into `p` ranks (pipeline stages) × `v` chunks per rank
//! (virtual stages, Megatron-LM's interleaving): rank `r`'s local chunk `c` is global stage
//! `c·p + r`, so global stage `g` lives on rank `g mod p`, chunk `g / p`
//! ([`Shape::global_stage`], [`Shape::locate`]). Global stage 0 takes the data, the last one
//! (rank `p − 1`, chunk `v − 1`) computes the loss in its forward. The mini-batch is cut into
//! `m` micro-batches; activations flow from global stage `g` to `g + 1`, gradients back.
//!
//! Every schedule is a 1F1B pattern over a rank's *virtual micro-batches*: forward number
//! `k` (of `m·v`) on a rank runs micro-batch `⌊k / (p·v)⌋·p + k mod p` on chunk
//! `⌊(k mod p·v) / p⌋` (micro-batches in groups of `p` per chunk, Megatron-LM's
//! `get_model_chunk_id`), backward number `k` the same micro-batch on the mirrored chunk
//! `v − 1 − ⌊(k mod p·v) / p⌋`; with `v = 1` forward and backward `k` are micro-batch `k`.
//! A rank runs `w` warm-up forwards, then alternates one forward and one backward (forward
//! first) until its forwards are done, then its remaining backwards (cool-down):
//!
//! - [`Kind::GPipe`]: `w = m`, every forward, then every backward in micro-batch order
//!   `0..m` (as PyTorch's `ScheduleGPipe`);
//! - [`Kind::OneFOneB`] (PipeDream-flush): `w = min(p − r − 1, m)` on rank `r`;
//! - [`Kind::Interleaved`] (Megatron-LM's `forward_backward_pipelining_with_interleaving`):
//!   `w = min(2·(p − r − 1) + (v − 1)·p, m·v)`, and with `v = 1` 1F1B's. With free
//!   communication `p − r − 1 + (v − 1)·p` would give the same bubble; Megatron-LM's doubled
//!   term keeps it when messages take time (one forward's time per message, `p = 4`, `m = 8`,
//!   `v = 2`: a step of 71 forward times instead of 87, 57 without latency).
//!
//! Communication is inserted around the computation: a [`Action::RecvActivation`] right
//! before every forward not on global stage 0 and a [`Action::SendActivation`] right after
//! every forward not on the last global stage; a [`Action::RecvGradient`] right before every
//! backward not on the last global stage and a [`Action::SendGradient`] right after every
//! backward not on global stage 0. Sends are asynchronous, receives block; with receives
//! right before their compute no schedule here deadlocks ([`check`](super::check) proves it
//! for every shape it is run on), so nothing is reordered.
//!
//! Two things differ from Megatron-LM, and the checker proves the result for each shape:
//! with one chunk per rank the interleaved schedule *is* 1F1B (Megatron-LM then runs its
//! non-interleaved 1F1B; its interleaved warm-up formula would hold `p − r − 1` more
//! activations for the same bubble), and when `m = p` Megatron-LM runs every forward first;
//! that is not needed here: the formula's warm-up already gives the closed-form bubble.
//!
//! ```
//! use xccl_train::pipeline::schedule::{Action, Kind, Schedule, Shape};
//!
//! # fn main() -> xccl_train::Result<()> {
//! let s = Schedule::new(Kind::OneFOneB, Shape { stages: 2, micro_batches: 3, virtual_stages: 1 })?;
//! // Rank 1, the last stage: one forward, one backward, from the start.
//! assert_eq!(s.ranks[1][..3], [
//!     Action::RecvActivation { mb: 0, chunk: 0, peer: 0 },
//!     Action::Forward { mb: 0, chunk: 0 },
//!     Action::Backward { mb: 0, chunk: 0 },
//! ]);
//! assert_eq!(s.closed_form_bubble(), 1.0 / 4.0);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// GPipe: every forward, then every backward; holds every micro-batch's activations.
    GPipe,
    /// 1F1B (PipeDream-flush): a warm-up of forwards, then one forward, one backward.
    OneFOneB,
    /// Megatron-LM's interleaved 1F1B: `v` chunks per rank, a bubble `v` times smaller.
    Interleaved,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::GPipe, Kind::OneFOneB, Kind::Interleaved];

    /// The name on the command line: `gpipe`, `1f1b` or `interleaved`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::GPipe => "gpipe",
            Kind::OneFOneB => "1f1b",
            Kind::Interleaved => "interleaved",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Kind, String> {
        let lower = s.to_ascii_lowercase();
        Kind::ALL.into_iter().find(|k| k.name() == lower).ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown pipeline schedule '{s}': choose one of {}", names.join(", "))
        })
    }
}

/// Sizes a schedule is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Ranks of the pipeline group, `p`.
    pub stages: usize,
    /// Micro-batches per step, `m`.
    pub micro_batches: usize,
    /// Model chunks per rank, `v` (1 but for the interleaved schedule).
    pub virtual_stages: usize,
}

impl Shape {
    /// The number of global stages, `p·v`.
    pub fn global_stages(&self) -> usize {
        self.stages * self.virtual_stages
    }

    /// The global stage of `rank`'s local `chunk`: `chunk·p + rank`.
    pub fn global_stage(&self, rank: usize, chunk: usize) -> usize {
        chunk * self.stages + rank
    }

    /// The rank and local chunk holding global stage `stage`.
    pub fn locate(&self, stage: usize) -> (usize, usize) {
        (stage % self.stages, stage / self.stages)
    }

    /// Whether [`Schedule::new`] can build `kind` for this shape; the error says what to
    /// change.
    pub fn validate(&self, kind: Kind) -> Result<()> {
        let Shape { stages: p, micro_batches: m, virtual_stages: v } = *self;
        if p == 0 || m == 0 || v == 0 {
            return Err(Error::config(format!(
                "a pipeline needs at least 1 stage (--pp), 1 micro-batch (--micro-batches) and 1 \
                 virtual stage (--virtual-stages); got {p}, {m} and {v}"
            )));
        }
        // Six actions at most per (micro-batch, chunk): all counts below then fit.
        if p.checked_mul(m).and_then(|n| n.checked_mul(v)).and_then(|n| n.checked_mul(6)).is_none() {
            return Err(Error::config(format!(
                "a pipeline of {p} stages × {m} micro-batches × {v} virtual stages is too large to schedule"
            )));
        }
        if v > 1 && kind != Kind::Interleaved {
            return Err(Error::config(format!(
                "--virtual-stages {v} needs --schedule interleaved (the {kind} schedule runs one \
                 model chunk per stage); use --schedule interleaved or --virtual-stages 1"
            )));
        }
        if v > 1 && p == 1 {
            return Err(Error::config(format!(
                "--virtual-stages {v} needs at least 2 pipeline stages: with one stage there is no \
                 bubble for interleaving to shrink; use --virtual-stages 1"
            )));
        }
        if v > 1 && m % p != 0 {
            return Err(Error::config(format!(
                "the interleaved schedule runs micro-batches in groups of one per stage (as \
                 Megatron-LM requires): --micro-batches {m} must be a multiple of --pp {p}, e.g. {}",
                m.next_multiple_of(p)
            )));
        }
        Ok(())
    }
}

/// One thing a rank does. `chunk` is the rank's local chunk index (`0..v`); `peer` a rank of
/// the pipeline group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The forward of micro-batch `mb` through local chunk `chunk`.
    Forward {
        /// Micro-batch.
        mb: usize,
        /// Local chunk.
        chunk: usize,
    },
    /// The backward of micro-batch `mb` through local chunk `chunk`.
    Backward {
        /// Micro-batch.
        mb: usize,
        /// Local chunk.
        chunk: usize,
    },
    /// After `Forward(mb, chunk)`: its output to `peer` (asynchronous send).
    SendActivation {
        /// Micro-batch.
        mb: usize,
        /// The sender's local chunk.
        chunk: usize,
        /// The rank of the next global stage.
        peer: usize,
    },
    /// Before `Forward(mb, chunk)`: its input from `peer` (blocking receive).
    RecvActivation {
        /// Micro-batch.
        mb: usize,
        /// The receiver's local chunk.
        chunk: usize,
        /// The rank of the previous global stage.
        peer: usize,
    },
    /// After `Backward(mb, chunk)`: the gradient of its input to `peer` (asynchronous send).
    SendGradient {
        /// Micro-batch.
        mb: usize,
        /// The sender's local chunk.
        chunk: usize,
        /// The rank of the previous global stage.
        peer: usize,
    },
    /// Before `Backward(mb, chunk)`: the gradient of its output from `peer` (blocking
    /// receive).
    RecvGradient {
        /// Micro-batch.
        mb: usize,
        /// The receiver's local chunk.
        chunk: usize,
        /// The rank of the next global stage.
        peer: usize,
    },
    /// The end of the step, after every backward: gradients reduced, optimiser step.
    OptimizerStep,
}

impl fmt::Display for Action {
    /// `F(mb,chunk)`, `B(mb,chunk)`, `sendA(mb,chunk)>peer`, `recvA(mb,chunk)<peer`,
    /// `sendG(mb,chunk)>peer`, `recvG(mb,chunk)<peer`, `step`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Forward { mb, chunk } => write!(f, "F({mb},{chunk})"),
            Action::Backward { mb, chunk } => write!(f, "B({mb},{chunk})"),
            Action::SendActivation { mb, chunk, peer } => write!(f, "sendA({mb},{chunk})>{peer}"),
            Action::RecvActivation { mb, chunk, peer } => write!(f, "recvA({mb},{chunk})<{peer}"),
            Action::SendGradient { mb, chunk, peer } => write!(f, "sendG({mb},{chunk})>{peer}"),
            Action::RecvGradient { mb, chunk, peer } => write!(f, "recvG({mb},{chunk})<{peer}"),
            Action::OptimizerStep => f.write_str("step"),
        }
    }
}

/// A schedule: for each rank of the pipeline group, its actions in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The schedule it is.
    pub kind: Kind,
    /// The sizes it is for.
    pub shape: Shape,
    /// `ranks[r]`: rank `r`'s actions, in order.
    pub ranks: Vec<Vec<Action>>,
}

impl Schedule {
    /// Builds `kind` for `shape`. Fails ([`Error::Config`], saying what to change) when a
    /// size is 0; when `v > 1` with a schedule other than [`Kind::Interleaved`]; for the
    /// interleaved schedule with `v > 1`, when `p = 1` (nothing to interleave) or `m` is
    /// not a multiple of `p` (micro-batches go through the chunks in groups of `p`, as in
    /// Megatron-LM); and when the sizes overflow.
    pub fn new(kind: Kind, shape: Shape) -> Result<Schedule> {
        shape.validate(kind)?;
        let ranks =
            (0..shape.stages).map(|rank| communicate(shape, rank, &compute(kind, shape, rank))).collect();
        Ok(Schedule { kind, shape, ranks })
    }

    /// The bubble fraction in closed form, `(p − 1) / (v·m + p − 1)` (so `(p − 1) / (m + p −
    /// 1)` for GPipe and 1F1B), as [`bubble_ratio`](Self::bubble_ratio) gives it exactly.
    pub fn closed_form_bubble(&self) -> f64 {
        let (idle, step) = self.bubble_ratio();
        idle as f64 / step as f64
    }

    /// The closed-form bubble fraction as `(numerator, denominator)` = `(p − 1, v·m + p − 1)`:
    /// a rank's idle time over the step time (first forward to last backward), when a
    /// chunk's forward costs `t_f / v` and its backward `t_b / v`. Every rank computes for
    /// `m·(t_f + t_b)` and the pipeline fills and drains in `(p − 1)·(t_f + t_b) / v`: the
    /// interleaved bubble is `v` times smaller. Meaningful for shapes [`Shape::validate`]
    /// accepts.
    pub fn bubble_ratio(&self) -> (usize, usize) {
        let Shape { stages: p, micro_batches: m, virtual_stages: v } = self.shape;
        (p.saturating_sub(1), (m.saturating_mul(v)).saturating_add(p.saturating_sub(1)))
    }

    /// The most forward activations, counted in (micro-batch, chunk) pairs whose forward
    /// is done and backward is not, a rank may hold at once (the maximum is on rank 0):
    /// GPipe `m`; 1F1B `min(p, m)` (warm-up `p − 1` plus the steady state's one); interleaved
    /// with `v > 1` Megatron-LM's warm-up of rank 0 plus one, capped by every pair:
    /// `min(2·(p − 1) + (v − 1)·p + 1, m·v)`, and with `v = 1` 1F1B's. Meaningful for shapes
    /// [`Shape::validate`] accepts.
    pub fn activation_bound(&self) -> usize {
        let Shape { stages: p, micro_batches: m, virtual_stages: v } = self.shape;
        match self.kind {
            Kind::GPipe => m,
            Kind::Interleaved if v > 1 => {
                let warm_up = p.saturating_sub(1).saturating_mul(2).saturating_add((v - 1).saturating_mul(p));
                warm_up.saturating_add(1).min(m.saturating_mul(v))
            }
            Kind::OneFOneB | Kind::Interleaved => p.min(m),
        }
    }
}

/// A forward or a backward of `(micro-batch, chunk)`.
#[derive(Clone, Copy)]
enum Pass {
    Forward(usize, usize),
    Backward(usize, usize),
}

/// Rank `rank`'s forwards and backwards in order (see the module documentation).
fn compute(kind: Kind, shape: Shape, rank: usize) -> Vec<Pass> {
    let Shape { stages: p, micro_batches: m, virtual_stages: v } = shape;
    let total = m * v;
    let later = p - rank - 1;
    let warm_up = match kind {
        Kind::GPipe => total,
        Kind::Interleaved if v > 1 => 2 * later + (v - 1) * p,
        Kind::OneFOneB | Kind::Interleaved => later,
    }
    .min(total);
    // Virtual micro-batch `k`: micro-batch and chunk-in-order (forward order of chunks).
    let locate = |k: usize| {
        let (group, within) = (k / (p * v), k % (p * v));
        (group * p + within % p, within / p)
    };
    let forward = |k| {
        let (mb, chunk) = locate(k);
        Pass::Forward(mb, chunk)
    };
    let backward = |k| {
        let (mb, chunk) = locate(k);
        Pass::Backward(mb, v - 1 - chunk)
    };
    let mut out = Vec::with_capacity(2 * total);
    out.extend((0..warm_up).map(forward));
    for k in 0..total - warm_up {
        out.push(forward(warm_up + k));
        out.push(backward(k));
    }
    out.extend((total - warm_up..total).map(backward));
    out
}

/// Rank `rank`'s computation with its receives before and sends after, then the optimiser
/// step.
fn communicate(shape: Shape, rank: usize, compute: &[Pass]) -> Vec<Action> {
    let last = shape.global_stages() - 1;
    let mut out = Vec::with_capacity(3 * compute.len() + 1);
    for &pass in compute {
        match pass {
            Pass::Forward(mb, chunk) => {
                let g = shape.global_stage(rank, chunk);
                if g > 0 {
                    out.push(Action::RecvActivation { mb, chunk, peer: shape.locate(g - 1).0 });
                }
                out.push(Action::Forward { mb, chunk });
                if g < last {
                    out.push(Action::SendActivation { mb, chunk, peer: shape.locate(g + 1).0 });
                }
            }
            Pass::Backward(mb, chunk) => {
                let g = shape.global_stage(rank, chunk);
                if g < last {
                    out.push(Action::RecvGradient { mb, chunk, peer: shape.locate(g + 1).0 });
                }
                out.push(Action::Backward { mb, chunk });
                if g > 0 {
                    out.push(Action::SendGradient { mb, chunk, peer: shape.locate(g - 1).0 });
                }
            }
        }
    }
    out.push(Action::OptimizerStep);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(stages: usize, micro_batches: usize, virtual_stages: usize) -> Shape {
        Shape { stages, micro_batches, virtual_stages }
    }

    fn f(mb: usize, chunk: usize) -> Action {
        Action::Forward { mb, chunk }
    }

    fn b(mb: usize, chunk: usize) -> Action {
        Action::Backward { mb, chunk }
    }

    fn send_a(mb: usize, peer: usize) -> Action {
        Action::SendActivation { mb, chunk: 0, peer }
    }

    fn recv_a(mb: usize, peer: usize) -> Action {
        Action::RecvActivation { mb, chunk: 0, peer }
    }

    fn send_g(mb: usize, peer: usize) -> Action {
        Action::SendGradient { mb, chunk: 0, peer }
    }

    fn recv_g(mb: usize, peer: usize) -> Action {
        Action::RecvGradient { mb, chunk: 0, peer }
    }

    const STEP: Action = Action::OptimizerStep;

    #[test]
    fn kinds_parse_print_and_list_the_choices() {
        for kind in Kind::ALL {
            assert_eq!(kind.to_string().parse::<Kind>(), Ok(kind));
        }
        assert_eq!("1F1B".parse::<Kind>(), Ok(Kind::OneFOneB));
        let err = "zb".parse::<Kind>().unwrap_err();
        assert!(err.contains("'zb'") && err.contains("gpipe, 1f1b, interleaved"), "{err}");
    }

    #[test]
    fn one_f_one_b_on_two_stages_three_micro_batches() {
        let s = Schedule::new(Kind::OneFOneB, shape(2, 3, 1)).unwrap();
        // Rank 0: one warm-up forward, two forward-backward pairs, one cool-down backward.
        #[rustfmt::skip]
        let rank0 = [
            f(0, 0), send_a(0, 1),
            f(1, 0), send_a(1, 1), recv_g(0, 1), b(0, 0),
            f(2, 0), send_a(2, 1), recv_g(1, 1), b(1, 0),
            recv_g(2, 1), b(2, 0),
            STEP,
        ];
        // Rank 1, the last stage: no warm-up.
        #[rustfmt::skip]
        let rank1 = [
            recv_a(0, 0), f(0, 0), b(0, 0), send_g(0, 0),
            recv_a(1, 0), f(1, 0), b(1, 0), send_g(1, 0),
            recv_a(2, 0), f(2, 0), b(2, 0), send_g(2, 0),
            STEP,
        ];
        assert_eq!(s.ranks, [rank0.to_vec(), rank1.to_vec()]);
    }

    #[test]
    fn gpipe_on_two_stages_two_micro_batches() {
        let s = Schedule::new(Kind::GPipe, shape(2, 2, 1)).unwrap();
        #[rustfmt::skip]
        let rank0 = [
            f(0, 0), send_a(0, 1), f(1, 0), send_a(1, 1),
            recv_g(0, 1), b(0, 0), recv_g(1, 1), b(1, 0),
            STEP,
        ];
        #[rustfmt::skip]
        let rank1 = [
            recv_a(0, 0), f(0, 0), recv_a(1, 0), f(1, 0),
            b(0, 0), send_g(0, 0), b(1, 0), send_g(1, 0),
            STEP,
        ];
        assert_eq!(s.ranks, [rank0.to_vec(), rank1.to_vec()]);
    }

    /// The computation of a rank, without communication.
    fn compute_only(list: &[Action]) -> Vec<Action> {
        list.iter()
            .copied()
            .filter(|a| matches!(a, Action::Forward { .. } | Action::Backward { .. }))
            .collect()
    }

    #[test]
    fn interleaved_follows_megatron_order() {
        // p = 2, v = 2, m = 4. Forwards in order: micro-batches 0, 1 on chunk 0, the same on
        // chunk 1, then 2, 3 on chunk 0 and chunk 1; backwards the same micro-batches with
        // the chunks mirrored. Warm-up 2·(p − r − 1) + (v − 1)·p: 4 on rank 0, 2 on rank 1.
        let s = Schedule::new(Kind::Interleaved, shape(2, 4, 2)).unwrap();
        #[rustfmt::skip]
        let rank0 = [
            f(0, 0), f(1, 0), f(0, 1), f(1, 1),
            f(2, 0), b(0, 1), f(3, 0), b(1, 1), f(2, 1), b(0, 0), f(3, 1), b(1, 0),
            b(2, 1), b(3, 1), b(2, 0), b(3, 0),
        ];
        #[rustfmt::skip]
        let rank1 = [
            f(0, 0), f(1, 0),
            f(0, 1), b(0, 1), f(1, 1), b(1, 1), f(2, 0), b(0, 0), f(3, 0), b(1, 0),
            f(2, 1), b(2, 1), f(3, 1), b(3, 1),
            b(2, 0), b(3, 0),
        ];
        assert_eq!(compute_only(&s.ranks[0]), rank0);
        assert_eq!(compute_only(&s.ranks[1]), rank1);
        // Rank 1's chunk 0 is global stage 1: its output goes to rank 0's chunk 1, stage 2.
        assert_eq!(s.ranks[1][..3], [recv_a(0, 0), f(0, 0), send_a(0, 0)]);
        assert_eq!(s.ranks[0][4..6], [Action::RecvActivation { mb: 0, chunk: 1, peer: 1 }, f(0, 1)]);
    }

    #[test]
    fn interleaved_with_one_chunk_is_one_f_one_b() {
        for p in 1..=6 {
            for m in 1..=12 {
                let a = Schedule::new(Kind::Interleaved, shape(p, m, 1)).unwrap();
                let b = Schedule::new(Kind::OneFOneB, shape(p, m, 1)).unwrap();
                assert_eq!(a.ranks, b.ranks, "p={p} m={m}");
                assert_eq!(a.activation_bound(), b.activation_bound());
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_what_to_do() {
        let refused = |kind, s: Shape| match Schedule::new(kind, s) {
            Err(Error::Config(msg)) => msg,
            other => panic!("{kind} {s:?} gives {other:?}"),
        };
        assert!(refused(Kind::GPipe, shape(0, 4, 1)).contains("at least 1 stage"));
        assert!(refused(Kind::OneFOneB, shape(2, 0, 1)).contains("1 micro-batch"));
        assert!(refused(Kind::Interleaved, shape(2, 4, 0)).contains("1 virtual stage"));
        assert!(
            refused(Kind::OneFOneB, shape(2, 4, 2))
                .contains("--virtual-stages 2 needs --schedule interleaved")
        );
        assert!(refused(Kind::GPipe, shape(2, 4, 3)).contains("--schedule interleaved"));
        assert!(refused(Kind::Interleaved, shape(1, 4, 2)).contains("at least 2 pipeline stages"));
        let msg = refused(Kind::Interleaved, shape(4, 6, 2));
        assert!(msg.contains("--micro-batches 6 must be a multiple of --pp 4, e.g. 8"), "{msg}");
        assert!(refused(Kind::GPipe, shape(usize::MAX / 2, 3, 1)).contains("too large"));
        // One chunk per rank: any number of micro-batches.
        assert!(Schedule::new(Kind::Interleaved, shape(4, 6, 1)).is_ok());
    }

    #[test]
    fn closed_forms() {
        let s = |kind, p, m, v| Schedule::new(kind, shape(p, m, v)).unwrap();
        assert_eq!(s(Kind::GPipe, 4, 4, 1).bubble_ratio(), (3, 7));
        assert_eq!(s(Kind::GPipe, 4, 4, 1).closed_form_bubble(), 3.0 / 7.0);
        assert_eq!(s(Kind::Interleaved, 4, 8, 2).bubble_ratio(), (3, 19));
        assert_eq!(s(Kind::GPipe, 4, 6, 1).activation_bound(), 6);
        assert_eq!(s(Kind::OneFOneB, 4, 6, 1).activation_bound(), 4);
        assert_eq!(s(Kind::OneFOneB, 4, 3, 1).activation_bound(), 3);
        // Rank 0's warm-up 2·3 + 1·4 = 10, plus one; capped by the 16 pairs.
        assert_eq!(s(Kind::Interleaved, 4, 8, 2).activation_bound(), 11);
        assert_eq!(s(Kind::Interleaved, 4, 4, 2).activation_bound(), 8);
    }
}
