//! What the pipeline checker ([`check`](super::check::check)) reports: a correct schedule's
//! [`Report`] (makespan, work, bubble, activations held), or the [`Violation`] that makes a
//! schedule wrong, naming the rank, the action and the [`Fault`] (a message not the one
//! expected, a peer not the neighbour, an action before what it needs), or the ranks
//! [`Blocked`] in a deadlock.

use std::fmt;

use super::schedule::Action;

/// What a schedule does, once [`check`](super::check::check)ed.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The most activations a rank held at once (the largest over ranks).
    pub max_activations: usize,
    /// Per rank, the most activations it held at once (a micro-batch's from its forward to
    /// its backward, or, split, to its weight-gradient backward).
    pub rank_activations: Vec<usize>,
    /// [`Schedule::activation_bound`](crate::pipeline::schedule::Schedule::activation_bound).
    pub activation_bound: usize,
    /// The simulated step time, in units of a chunk's forward.
    pub makespan: u64,
    /// Each rank's computing time in the step: `3·m·v` units.
    pub busy: u64,
    /// The simulated bubble fraction, `1 − busy / makespan`.
    pub simulated_bubble: f64,
    /// [`Schedule::closed_form_bubble`](crate::pipeline::schedule::Schedule::closed_form_bubble).
    pub closed_form_bubble: f64,
}

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A forward's output, to the next global stage.
    Activation,
    /// The gradient of a backward's input, to the previous global stage.
    Gradient,
}

/// A message between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// What it carries.
    pub payload: Payload,
    /// Its micro-batch.
    pub mb: usize,
    /// The global stage it leaves.
    pub stage: usize,
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.payload {
            Payload::Activation => "activation",
            Payload::Gradient => "gradient",
        };
        write!(f, "{what} of micro-batch {} from global stage {}", self.mb, self.stage)
    }
}

/// What an action needs to have happened before it on its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The forward of its micro-batch and chunk.
    Forward,
    /// The backward of its micro-batch and chunk (whole, or its input-gradient half).
    Backward,
    /// The input-gradient backward of its micro-batch and chunk (for a weight-gradient one).
    InputGradient,
    /// The receive of its forward's input activation.
    Activation,
    /// The receive of its backward's output gradient.
    Gradient,
}

/// What is wrong with one action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Its micro-batch, chunk or peer is outside the schedule's shape.
    OutOfRange,
    /// It sends to or receives from a rank that does not hold the neighbouring global stage,
    /// which is on rank `expected`.
    WrongPeer {
        /// The rank of the neighbouring global stage.
        expected: usize,
    },
    /// No such message exists: no activation leaves the last global stage or enters global
    /// stage 0, no gradient leaves global stage 0 or enters the last one.
    NoSuchMessage,
    /// The same action ran before on this rank.
    Repeated,
    /// It comes before what it needs.
    Early(Need),
    /// A receive whose channel's next message is another one.
    Mismatch {
        /// The message the receive is for.
        expected: Message,
        /// The next message on the channel.
        got: Message,
    },
    /// An optimiser step before the end of the list.
    EarlyStep,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::OutOfRange => f.write_str("its micro-batch, chunk or peer is out of range for the shape"),
            Fault::WrongPeer { expected } => {
                write!(f, "wrong peer: the neighbouring global stage is on rank {expected}")
            }
            Fault::NoSuchMessage => f.write_str(
                "no such message: no activation leaves the last global stage or enters stage 0, \
                 no gradient leaves stage 0 or enters the last one",
            ),
            Fault::Repeated => f.write_str("it already ran on this rank"),
            Fault::Early(need) => f.write_str(match need {
                Need::Forward => "it comes before the forward of its micro-batch and chunk",
                Need::Backward => "it comes before the backward of its micro-batch and chunk",
                Need::InputGradient => {
                    "it comes before the input-gradient backward of its micro-batch and chunk"
                }
                Need::Activation => "it comes before the receive of its input activation",
                Need::Gradient => "it comes before the receive of its output gradient",
            }),
            Fault::Mismatch { expected, got } => {
                write!(f, "it expects the {expected}, but the next message on its channel is the {got}")
            }
            Fault::EarlyStep => f.write_str("an optimiser step before the end of the list"),
        }
    }
}

/// A rank stuck at a receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The rank.
    pub rank: usize,
    /// The index of the receive in its list.
    pub index: usize,
    /// The receive.
    pub action: Action,
}

/// Why a schedule is wrong: which rank, which action, what.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// The shape is one [`Schedule::new`](crate::pipeline::schedule::Schedule::new) rejects, or there is not one list per rank.
    Shape(String),
    /// Action `index` of `rank`'s list is wrong where it stands.
    Action {
        /// The rank.
        rank: usize,
        /// The action's index in the rank's list.
        index: usize,
        /// The action.
        action: Action,
        /// What is wrong.
        fault: Fault,
    },
    /// `rank`'s list does not end with its optimiser step (`missing` is
    /// [`Action::OptimizerStep`]), or reaches it without having run `missing`.
    End {
        /// The rank.
        rank: usize,
        /// The missing action.
        missing: Action,
    },
    /// No rank can progress before all are done.
    Deadlock {
        /// The ranks not done, each at the receive it waits at.
        blocked: Vec<Blocked>,
    },
    /// A forward makes `rank` hold more activations (forwards whose backward, or split,
    /// weight-gradient backward, has not run) than the schedule's bound.
    Memory {
        /// The rank.
        rank: usize,
        /// The index of the forward in its list.
        index: usize,
        /// Activations held after it.
        held: usize,
        /// [`Schedule::activation_bound`](crate::pipeline::schedule::Schedule::activation_bound).
        bound: usize,
    },
    /// The simulated bubble differs from the closed form.
    Bubble {
        /// The simulated step time.
        makespan: u64,
        /// Each rank's computing time.
        busy: u64,
        /// [`Schedule::bubble_ratio`](crate::pipeline::schedule::Schedule::bubble_ratio).
        closed_form: (usize, usize),
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Shape(msg) => write!(f, "invalid schedule: {msg}"),
            Violation::Action { rank, index, action, fault } => {
                write!(f, "rank {rank}, action {index} ({action}): {fault}")
            }
            Violation::End { rank, missing: Action::OptimizerStep } => {
                write!(f, "rank {rank}: its list does not end with the optimiser step")
            }
            Violation::End { rank, missing } => {
                write!(f, "rank {rank} reaches its optimiser step without {missing}")
            }
            Violation::Deadlock { blocked } => {
                f.write_str("deadlock: no rank can progress:")?;
                for (i, b) in blocked.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    write!(f, "{sep}rank {} waits at action {} ({})", b.rank, b.index, b.action)?;
                }
                Ok(())
            }
            Violation::Memory { rank, index, held, bound } => write!(
                f,
                "rank {rank}, action {index}: holds {held} activations, more than the schedule's \
                 bound {bound}"
            ),
            Violation::Bubble { makespan, busy, closed_form: (num, den) } => write!(
                f,
                "simulated step time {makespan} with {busy} busy per rank: bubble {}/{makespan} = {:.6}, \
                 but the closed form is {num}/{den} = {:.6}",
                makespan - busy,
                (makespan - busy) as f64 / *makespan as f64,
                *num as f64 / *den as f64
            ),
        }
    }
}

impl std::error::Error for Violation {}
