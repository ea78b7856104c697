//! Pipeline schedules as plain data: for each rank of the pipeline group, the list of its
//! forwards, backwards (whole, or split into input and weight gradients), sends, receives and
//! its optimiser step, in order.
//!
//! The model's blocks are cut into `p` ranks (pipeline stages) × `v` chunks per rank
//! (virtual stages, Megatron-LM's interleaving): rank `r`'s local chunk `c` is global stage
//! `c·p + r`, so global stage `g` lives on rank `g mod p`, chunk `g / p`; ZB-V places its
//! two chunks per rank in a V instead, rank `r` holding stages `r` and `2·p − 1 − r`
//! ([`Placement`], [`Schedule::global_stage`], [`Schedule::locate`]). Global stage 0 takes
//! the data, the last one computes the loss in its forward. The mini-batch is cut into
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
//!   `v = 2`: a step of 71 forward times instead of 87, 57 without latency);
//! - [`Kind::ZeroBubble`] (ZB-H1, Qi, Wan, Huang and Lin, "Zero Bubble Pipeline
//!   Parallelism", ICLR 2024), one chunk per rank: each backward is split into `Bi`
//!   ([`Action::BackwardInput`], the gradient of the stage's input, sent to the previous
//!   stage at once: the critical path) and `W` ([`Action::BackwardWeight`], the gradient of
//!   its weights, which nothing waits for). 1F1B's order with `Bi` for its backwards and
//!   warm-up `w = min(p − r − 1, m)`; each `W` runs right after a `Bi`, oldest pending first,
//!   but rank `r` starts them `r` steady-state pairs late: its first `r` pairs are `F Bi`,
//!   every later pair `F Bi W`, every cool-down backward `Bi W`, and the `r` deferred `W`s
//!   end the list. A deferred `W` fills the time 1F1B's rank waits for its next gradient: with
//!   `T_F = T_B = T_W` the bubble is `(p − 1)·(T_F + T_B − T_W)`, a third of 1F1B's `(p −
//!   1)·(T_F + T_B + T_W)`, when `m ≥ p` (`zero_bubble.rs` derives it, and the form for `m <
//!   p`). A rank holds a micro-batch's activations from its `F` to its `W`: `min(p, m)` on
//!   every rank, 1F1B's peak (its rank 0), though ranks `r > 0` hold more than their 1F1B
//!   `p − r` (the deferral is what shortens the critical path; holding only those, the
//!   bubble is `2·(p − 1)` forward times, two thirds of 1F1B's).
//!
//! - [`Kind::ZeroBubbleV`] (ZB-V, the same paper's section 6), two chunks per rank in a V,
//!   backwards split as in ZB-H1: a warm-up of chunk-0 forwards, then `F Bi W` of each chunk
//!   in turn (`zero_bubble_v.rs`); `(p − 1)` units of bubble in a step of `6·m + p − 1`,
//!   a sixth of 1F1B's bubble time, holding 1F1B's peak activations; it needs `m ≥ 2·p − 1`.
//!
//! Communication is inserted around the computation: a [`Action::RecvActivation`] right
//! before every forward not on global stage 0 and a [`Action::SendActivation`] right after
//! every forward not on the last global stage; a [`Action::RecvGradient`] right before
//! every backward (or input-gradient backward) not on the last global stage and a
//! [`Action::SendGradient`] right after it, when not on global stage 0; a weight-gradient
//! backward neither sends nor receives. Where two consecutive global stages are on one rank
//! (ZB-V's turn at rank `p − 1`) the message goes from the rank to itself. Sends are
//! asynchronous, receives block; with receives right before their compute no schedule here
//! deadlocks ([`check`](super::check) proves it for every shape it is run on), so nothing
//! is reordered.
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

use super::placement::Placement;
use super::{zero_bubble, zero_bubble_v};
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
    /// ZB-H1 (Qi et al., ICLR 2024): 1F1B with each backward split into its input gradient
    /// and its weight gradient, the weight gradients deferred into the bubble; a third of
    /// 1F1B's bubble time at 1F1B's peak activation memory.
    ZeroBubble,
    /// ZB-V (Qi et al., section 6): two chunks per rank placed in a V, backwards split as in
    /// ZB-H1; a sixth of 1F1B's bubble time at 1F1B's peak activation memory.
    ZeroBubbleV,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] =
        [Kind::GPipe, Kind::OneFOneB, Kind::Interleaved, Kind::ZeroBubble, Kind::ZeroBubbleV];

    /// The name on the command line: `gpipe`, `1f1b`, `interleaved`, `zb-h1` or `zb-v`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::GPipe => "gpipe",
            Kind::OneFOneB => "1f1b",
            Kind::Interleaved => "interleaved",
            Kind::ZeroBubble => "zb-h1",
            Kind::ZeroBubbleV => "zb-v",
        }
    }

    /// How its global stages are placed on the ranks: in a V for ZB-V, looped otherwise.
    pub fn placement(self) -> Placement {
        match self {
            Kind::ZeroBubbleV => Placement::V,
            _ => Placement::Looped,
        }
    }

    /// Whether its backwards are split into input and weight gradients (the zero-bubble
    /// schedules).
    pub fn splits_backward(self) -> bool {
        matches!(self, Kind::ZeroBubble | Kind::ZeroBubbleV)
    }

    /// The model chunks per rank it needs, if it needs a given number (ZB-V: 2).
    pub fn chunks(self) -> Option<usize> {
        (self == Kind::ZeroBubbleV).then_some(2)
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
        if v > 1 && kind == Kind::ZeroBubble {
            return Err(Error::config(format!(
                "--virtual-stages {v}: the zb-h1 schedule runs one model chunk per stage; use \
                 --virtual-stages 1 with --schedule zb-h1, --schedule zb-v with \
                 --virtual-stages 2 (its zero-bubble schedule on two chunks per stage), or \
                 --schedule interleaved for {v} chunks per stage"
            )));
        }
        if let Some(need) = kind.chunks()
            && v != need
        {
            return Err(Error::config(format!(
                "--virtual-stages {v}: the {kind} schedule runs {need} model chunks per stage (in a \
                 V: down the stages and back up); use --virtual-stages {need} with --schedule {kind}"
            )));
        }
        if v > 1 && kind != Kind::Interleaved && kind.chunks().is_none() {
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
        if kind == Kind::ZeroBubbleV && m < 2 * p - 1 {
            return Err(Error::config(format!(
                "--micro-batches {m}: the zb-v schedule needs at least 2·pp − 1 = {need} \
                 micro-batches (its first stage runs that many forwards before the first backward \
                 comes back); use --micro-batches {need} or more, or --schedule zb-h1",
                need = 2 * p - 1
            )));
        }
        if v > 1 && kind == Kind::Interleaved && m % p != 0 {
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
    /// The backward of micro-batch `mb` through local chunk `chunk`: the gradients of the
    /// chunk's input and of its weights together (split into [`Action::BackwardInput`] and
    /// [`Action::BackwardWeight`] by the zero-bubble schedule).
    Backward {
        /// Micro-batch.
        mb: usize,
        /// Local chunk.
        chunk: usize,
    },
    /// The input-gradient half of the backward of micro-batch `mb` through local chunk
    /// `chunk` (`B` in Qi et al.): the gradient of the chunk's input only, which the previous
    /// global stage waits for, so a [`Action::SendGradient`] follows it as it follows a
    /// whole [`Action::Backward`]. Its weight gradient comes later, in a
    /// [`Action::BackwardWeight`] of the same micro-batch and chunk on the same rank.
    BackwardInput {
        /// Micro-batch.
        mb: usize,
        /// Local chunk.
        chunk: usize,
    },
    /// The weight-gradient half of the backward of micro-batch `mb` through local chunk
    /// `chunk` (`W` in Qi et al.), after its [`Action::BackwardInput`]: the gradients of the
    /// chunk's parameters. Nothing but the optimiser step waits for it, so a schedule defers
    /// it into the bubble; the micro-batch's activations are held until it has run.
    BackwardWeight {
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
    /// After `Backward(mb, chunk)` or `BackwardInput(mb, chunk)`: the gradient of its input
    /// to `peer` (asynchronous send).
    SendGradient {
        /// Micro-batch.
        mb: usize,
        /// The sender's local chunk.
        chunk: usize,
        /// The rank of the previous global stage.
        peer: usize,
    },
    /// Before `Backward(mb, chunk)` or `BackwardInput(mb, chunk)`: the gradient of its output
    /// from `peer` (blocking receive).
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
    /// `F(mb,chunk)`, `B(mb,chunk)`, `Bi(mb,chunk)` (input gradient), `W(mb,chunk)` (weight
    /// gradient), `sendA(mb,chunk)>peer`, `recvA(mb,chunk)<peer`, `sendG(mb,chunk)>peer`,
    /// `recvG(mb,chunk)<peer`, `step`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Forward { mb, chunk } => write!(f, "F({mb},{chunk})"),
            Action::Backward { mb, chunk } => write!(f, "B({mb},{chunk})"),
            Action::BackwardInput { mb, chunk } => write!(f, "Bi({mb},{chunk})"),
            Action::BackwardWeight { mb, chunk } => write!(f, "W({mb},{chunk})"),
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
    /// size is 0; when `v > 1` with a schedule other than [`Kind::Interleaved`] and
    /// [`Kind::ZeroBubbleV`] (ZB-H1 included: it runs one chunk per rank); for ZB-V, when
    /// `v ≠ 2` or `m < 2·p − 1`; for the
    /// interleaved schedule with `v > 1`, when `p = 1` (nothing to interleave) or `m` is
    /// not a multiple of `p` (micro-batches go through the chunks in groups of `p`, as in
    /// Megatron-LM); and when the sizes overflow.
    pub fn new(kind: Kind, shape: Shape) -> Result<Schedule> {
        shape.validate(kind)?;
        let placement = kind.placement();
        let ranks = (0..shape.stages)
            .map(|rank| communicate(shape, placement, rank, &compute(kind, shape, rank)))
            .collect();
        Ok(Schedule { kind, shape, ranks })
    }

    /// The global stage of `rank`'s local `chunk` (as [`Kind::placement`] places them).
    pub fn global_stage(&self, rank: usize, chunk: usize) -> usize {
        self.kind.placement().global_stage(self.shape.stages, rank, chunk)
    }

    /// The rank and local chunk holding global stage `stage`.
    pub fn locate(&self, stage: usize) -> (usize, usize) {
        self.kind.placement().locate(self.shape.stages, stage)
    }

    /// The block ranges (in the whole model) of `rank`'s chunks, in chunk order, from the
    /// ranges of every global stage (in pipeline order).
    pub fn chunks_of(&self, stages: &[std::ops::Range<usize>], rank: usize) -> Vec<std::ops::Range<usize>> {
        self.kind.placement().chunks_of(stages, self.shape.stages, rank)
    }

    /// The bubble fraction in closed form, `(p − 1) / (v·m + p − 1)` (so `(p − 1) / (m + p −
    /// 1)` for GPipe and 1F1B; ZB-H1 `(p − 1) / (3·m + p − 1)` when `m ≥ p`), as
    /// [`bubble_ratio`](Self::bubble_ratio) gives it exactly.
    pub fn closed_form_bubble(&self) -> f64 {
        let (idle, step) = self.bubble_ratio();
        idle as f64 / step as f64
    }

    /// The closed-form bubble fraction as `(numerator, denominator)` = `(p − 1, v·m + p − 1)`:
    /// a rank's idle time over the step time (first forward to last backward), when a
    /// chunk's forward costs `t_f / v` and its backward `t_b / v`. Every rank computes for
    /// `m·(t_f + t_b)` and the pipeline fills and drains in `(p − 1)·(t_f + t_b) / v`: the
    /// interleaved bubble is `v` times smaller.
    ///
    /// ZB-H1, whose backward is split in two passes: with `t_f = t_b = t_w` (one unit each,
    /// so a rank computes `3·m` units) the ratio is `(p − 1 + max(p − m, 0), 3·m + p − 1 +
    /// max(p − m, 0))` in those units: `(p − 1)·(t_f + t_b − t_w)` idle, a third of 1F1B's
    /// `(p − 1)·(t_f + t_b + t_w)`, when `m ≥ p`; with fewer micro-batches than stages, rank
    /// 0 cannot start its first weight gradient before its first input gradient, `2·p − 1`
    /// units in, and then has `2·m` units of backwards left (`zero_bubble.rs`). Meaningful
    /// for shapes [`Shape::validate`] accepts.
    pub fn bubble_ratio(&self) -> (usize, usize) {
        let Shape { stages: p, micro_batches: m, virtual_stages: v } = self.shape;
        match self.kind {
            Kind::ZeroBubble => zero_bubble::bubble_ratio(p, m),
            Kind::ZeroBubbleV => zero_bubble_v::bubble_ratio(p, m),
            _ => (p.saturating_sub(1), (m.saturating_mul(v)).saturating_add(p.saturating_sub(1))),
        }
    }

    /// The most forward activations, counted in (micro-batch, chunk) pairs whose forward
    /// is done and backward is not (for a split backward: whose weight-gradient pass is
    /// not), a rank may hold at once (the maximum is on rank 0): GPipe `m`; 1F1B `min(p, m)`
    /// (warm-up `p − 1` plus the steady state's one); interleaved with `v > 1` Megatron-LM's
    /// warm-up of rank 0 plus one, capped by every pair: `min(2·(p − 1) + (v − 1)·p + 1,
    /// m·v)`, and with `v = 1` 1F1B's; ZB-H1 1F1B's `min(p, m)`, on every rank (rank `r`'s
    /// warm-up `p − r − 1`, plus one, plus its `r` deferred weight gradients). Meaningful for
    /// shapes [`Shape::validate`] accepts.
    pub fn activation_bound(&self) -> usize {
        let Shape { stages: p, micro_batches: m, virtual_stages: v } = self.shape;
        match self.kind {
            Kind::GPipe => m,
            Kind::Interleaved if v > 1 => {
                let warm_up = p.saturating_sub(1).saturating_mul(2).saturating_add((v - 1).saturating_mul(p));
                warm_up.saturating_add(1).min(m.saturating_mul(v))
            }
            Kind::OneFOneB | Kind::Interleaved | Kind::ZeroBubble => p.min(m),
            Kind::ZeroBubbleV => 2 * p,
        }
    }
}

/// A computation of `(micro-batch, chunk)`: a forward, a whole backward, or one of a split
/// backward's two passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Forward(usize, usize),
    Backward(usize, usize),
    BackwardInput(usize, usize),
    BackwardWeight(usize, usize),
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
        Kind::ZeroBubble => return zero_bubble::passes(shape, rank),
        Kind::ZeroBubbleV => return zero_bubble_v::passes(shape, rank),
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
fn communicate(shape: Shape, placement: Placement, rank: usize, compute: &[Pass]) -> Vec<Action> {
    let last = shape.global_stages() - 1;
    let p = shape.stages;
    let stage = |chunk| placement.global_stage(p, rank, chunk);
    let holder = |g| placement.locate(p, g).0;
    let mut out = Vec::with_capacity(3 * compute.len() + 1);
    for &pass in compute {
        match pass {
            Pass::Forward(mb, chunk) => {
                let g = stage(chunk);
                if g > 0 {
                    out.push(Action::RecvActivation { mb, chunk, peer: holder(g - 1) });
                }
                out.push(Action::Forward { mb, chunk });
                if g < last {
                    out.push(Action::SendActivation { mb, chunk, peer: holder(g + 1) });
                }
            }
            Pass::Backward(mb, chunk) | Pass::BackwardInput(mb, chunk) => {
                let g = stage(chunk);
                if g < last {
                    out.push(Action::RecvGradient { mb, chunk, peer: holder(g + 1) });
                }
                out.push(match pass {
                    Pass::Backward(..) => Action::Backward { mb, chunk },
                    _ => Action::BackwardInput { mb, chunk },
                });
                if g > 0 {
                    out.push(Action::SendGradient { mb, chunk, peer: holder(g - 1) });
                }
            }
            Pass::BackwardWeight(mb, chunk) => out.push(Action::BackwardWeight { mb, chunk }),
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
        assert!(err.contains("'zb'") && err.contains("gpipe, 1f1b, interleaved, zb-h1"), "{err}");
        assert_eq!("ZB-H1".parse::<Kind>(), Ok(Kind::ZeroBubble));
        assert_eq!(Kind::ZeroBubble.to_string(), "zb-h1");
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
        let msg = refused(Kind::ZeroBubble, shape(4, 8, 2));
        assert!(
            msg.contains("zb-h1 schedule runs one model chunk per stage")
                && msg.contains("use --virtual-stages 1 with --schedule zb-h1"),
            "{msg}"
        );
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
        // ZB-H1: (p − 1)·(t_f + t_b − t_w) idle in 3·m + p − 1, p − m more when m < p.
        assert_eq!(s(Kind::ZeroBubble, 4, 8, 1).bubble_ratio(), (3, 27));
        assert_eq!(s(Kind::ZeroBubble, 4, 4, 1).bubble_ratio(), (3, 15));
        assert_eq!(s(Kind::ZeroBubble, 4, 2, 1).bubble_ratio(), (5, 11));
        assert_eq!(s(Kind::ZeroBubble, 1, 5, 1).bubble_ratio(), (0, 15));
        assert_eq!(s(Kind::ZeroBubble, 4, 8, 1).activation_bound(), 4);
        assert_eq!(s(Kind::ZeroBubble, 4, 3, 1).activation_bound(), 3);
    }

    #[test]
    fn split_backwards_print_and_communicate_like_backwards() {
        assert_eq!(Action::BackwardInput { mb: 3, chunk: 1 }.to_string(), "Bi(3,1)");
        assert_eq!(Action::BackwardWeight { mb: 3, chunk: 1 }.to_string(), "W(3,1)");
        // p = 2, m = 1: rank 0 F, then Bi after its gradient, then W; rank 1 F, Bi (its
        // gradient sent at once), W.
        let s = Schedule::new(Kind::ZeroBubble, shape(2, 1, 1)).unwrap();
        let (bi, w) = (Action::BackwardInput { mb: 0, chunk: 0 }, Action::BackwardWeight { mb: 0, chunk: 0 });
        assert_eq!(s.ranks[0], [f(0, 0), send_a(0, 1), recv_g(0, 1), bi, w, STEP]);
        assert_eq!(s.ranks[1], [recv_a(0, 0), f(0, 0), bi, send_g(0, 0), w, STEP]);
    }
}
