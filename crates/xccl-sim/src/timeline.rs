//! Timelines of a training step: lanes (pipeline ranks) that run their operations in
//! order, compute occupying the lane, messages between lanes ([`run`]); and a stream of
//! collectives started as their inputs become ready, one after the other, as a
//! communicator's progress thread runs them ([`stream`]).
//!
//! These are the overlap rules `xccl sim train` composes: DDP's bucket all-reduces start as
//! backward finishes their blocks and run while backward goes on, so a step takes
//! `max(compute, last bucket's end)`; a pipeline schedule's forwards and backwards wait for
//! the activations and gradients their neighbours send.
//!
//! ```
//! use xccl_sim::timeline::{Op, run, stream};
//!
//! // Two stages, one micro-batch: F on stage 0, then F and B on stage 1, then B on stage 0;
//! // messages take 1.
//! let lanes = vec![
//!     vec![Op::compute(2.0), Op::send(0, 1.0), Op::recv(1), Op::compute(4.0)],
//!     vec![Op::recv(0), Op::compute(2.0), Op::compute(4.0), Op::send(1, 1.0)],
//! ];
//! let t = run(&lanes).unwrap();
//! // 2 + 1 + 2 + 4 + 1 + 4.
//! assert_eq!(t.end, 14.0);
//! // Buckets ready at 1 and 2 that take 3 each: the second ends at 7.
//! assert_eq!(stream(&[1.0, 2.0], &[3.0, 3.0]), 7.0);
//! ```

/// One operation of a lane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Computation that occupies the lane for `dur` seconds.
    Compute {
        /// Seconds.
        dur: f64,
    },
    /// Sends message `msg` (asynchronously: the lane goes on), which arrives `dur` seconds
    /// after the send.
    Send {
        /// The message's key, unique in the step.
        msg: usize,
        /// Seconds from the send to the arrival.
        dur: f64,
    },
    /// Waits until message `msg` has arrived.
    Recv {
        /// The message's key.
        msg: usize,
    },
}

impl Op {
    /// [`Op::Compute`] of `dur` seconds.
    pub fn compute(dur: f64) -> Op {
        Op::Compute { dur }
    }

    /// [`Op::Send`] of message `msg`, arriving `dur` seconds later.
    pub fn send(msg: usize, dur: f64) -> Op {
        Op::Send { msg, dur }
    }

    /// [`Op::Recv`] of message `msg`.
    pub fn recv(msg: usize) -> Op {
        Op::Recv { msg }
    }
}

/// What the lanes did.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// When each lane finished its last operation.
    pub ends: Vec<f64>,
    /// Seconds each lane computed.
    pub busy: Vec<f64>,
    /// For each lane, its compute operations as `(index in the lane, start, end)`.
    pub spans: Vec<Vec<(usize, f64, f64)>>,
    /// The latest end.
    pub end: f64,
}

impl Timeline {
    /// The bubble: the mean over lanes of `1 − busy / end` (0 for an empty timeline).
    pub fn bubble(&self) -> f64 {
        if self.end <= 0.0 || self.busy.is_empty() {
            return 0.0;
        }
        self.busy.iter().map(|b| 1.0 - b / self.end).sum::<f64>() / self.busy.len() as f64
    }
}

/// Runs every lane's operations in order from time 0: a compute starts when the lane is
/// free, a send's message arrives `dur` after it is sent, a receive waits for its message.
/// An error when a receive waits for a message no lane sends before it (a deadlock), or a
/// duration is negative or not finite.
pub fn run(lanes: &[Vec<Op>]) -> Result<Timeline, String> {
    let n = lanes.len();
    for op in lanes.iter().flatten() {
        let d = match *op {
            Op::Compute { dur } | Op::Send { dur, .. } => dur,
            Op::Recv { .. } => 0.0,
        };
        if !d.is_finite() || d < 0.0 {
            return Err(format!("a duration of {d} s in a timeline"));
        }
    }
    let mut arrived: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
    let mut at = vec![0usize; n];
    let mut now = vec![0.0f64; n];
    let mut busy = vec![0.0f64; n];
    let mut spans = vec![Vec::new(); n];
    loop {
        let mut progressed = false;
        for l in 0..n {
            while let Some(op) = lanes[l].get(at[l]) {
                match *op {
                    Op::Compute { dur } => {
                        spans[l].push((at[l], now[l], now[l] + dur));
                        now[l] += dur;
                        busy[l] += dur;
                    }
                    Op::Send { msg, dur } => {
                        if arrived.insert(msg, now[l] + dur).is_some() {
                            return Err(format!("message {msg} is sent twice"));
                        }
                    }
                    Op::Recv { msg } => match arrived.get(&msg) {
                        Some(&t) => now[l] = now[l].max(t),
                        None => break,
                    },
                }
                at[l] += 1;
                progressed = true;
            }
        }
        if (0..n).all(|l| at[l] == lanes[l].len()) {
            break;
        }
        if !progressed {
            let stuck: Vec<String> = (0..n)
                .filter(|&l| at[l] < lanes[l].len())
                .map(|l| format!("lane {l} at operation {} ({:?})", at[l], lanes[l][at[l]]))
                .collect();
            return Err(format!("the timeline deadlocks: {}", stuck.join("; ")));
        }
    }
    let end = now.iter().copied().fold(0.0, f64::max);
    Ok(Timeline { ends: now, busy, spans, end })
}

/// The end of a stream of operations run one after the other in order, operation `i`
/// starting when it is ready (`ready[i]`) and the one before has ended, and taking `dur[i]`:
/// DDP's bucket all-reduces on the data-parallel communicator. 0 for no operations.
pub fn stream(ready: &[f64], dur: &[f64]) -> f64 {
    ready.iter().zip(dur).fold(0.0, |end, (&r, &d)| end.max(r) + d)
}

/// The lanes of GPipe (every forward, then every backward) on `p` stages and `m`
/// micro-batches, with forward `f[s]` and backward `b[s]` on stage `s` and `hop` seconds per
/// message: the reference the hand-computed bubble is checked against.
pub fn gpipe(p: usize, m: usize, f: &[f64], b: &[f64], hop: f64) -> Vec<Vec<Op>> {
    let act = |s: usize, j: usize| 2 * (s * m + j);
    let grad = |s: usize, j: usize| 2 * (s * m + j) + 1;
    (0..p)
        .map(|s| {
            let mut ops = Vec::new();
            for j in 0..m {
                if s > 0 {
                    ops.push(Op::recv(act(s - 1, j)));
                }
                ops.push(Op::compute(f[s]));
                if s + 1 < p {
                    ops.push(Op::send(act(s, j), hop));
                }
            }
            for j in 0..m {
                if s + 1 < p {
                    ops.push(Op::recv(grad(s + 1, j)));
                }
                ops.push(Op::compute(b[s]));
                if s > 0 {
                    ops.push(Op::send(grad(s, j), hop));
                }
            }
            ops
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn gpipe_bubble_is_the_closed_form_with_equal_stages_and_free_messages() {
        for (p, m) in [(2, 1), (2, 4), (4, 8), (3, 5), (8, 2)] {
            let (tf, tb) = (1.0, 2.0);
            let t = run(&gpipe(p, m, &vec![tf; p], &vec![tb; p], 0.0)).unwrap();
            // (m + p − 1) forwards' and backwards' times from start to end.
            let expect = (m + p - 1) as f64 * (tf + tb);
            assert!(close(t.end, expect), "p={p} m={m}: {} vs {expect}", t.end);
            let bubble = (p - 1) as f64 / (m + p - 1) as f64;
            assert!(close(t.bubble(), bubble), "p={p} m={m}: {} vs {bubble}", t.bubble());
        }
    }

    #[test]
    fn messages_add_their_hops_to_the_fill_and_drain() {
        // GPipe, p stages, m micro-batches, hop h: the fill and the drain cross p − 1 hops.
        let (p, m, h) = (4, 3, 0.25);
        let t = run(&gpipe(p, m, &[1.0; 4], &[1.0; 4], h)).unwrap();
        let expect = 2.0 * (m + p - 1) as f64 + 2.0 * (p - 1) as f64 * h;
        assert!(close(t.end, expect), "{} vs {expect}", t.end);
    }

    #[test]
    fn the_slowest_stage_sets_the_pace() {
        // Stage 1 twice as slow: the steady state runs at its pace.
        let (p, m) = (2, 6);
        let t = run(&gpipe(p, m, &[1.0, 2.0], &[1.0, 2.0], 0.0)).unwrap();
        // Stage 1: starts after stage 0's first forward (1), runs m forwards (2 each), then m
        // backwards (2 each); stage 0's last backward follows stage 1's last (1).
        assert!(close(t.end, 1.0 + 2.0 * m as f64 * 2.0 + 1.0), "{}", t.end);
    }

    #[test]
    fn ddp_overlap_is_max_of_compute_and_communication() {
        // Backward of 4 blocks of 1 s; a bucket per block ready as it finishes.
        let ready = [1.0, 2.0, 3.0, 4.0];
        // Cheap communication hides behind backward but the last bucket's.
        assert!(close(stream(&ready, &[0.5; 4]), 4.5));
        // Communication-bound: the stream runs back to back from the first bucket.
        assert!(close(stream(&ready, &[3.0; 4]), 1.0 + 12.0));
        // One bucket at the end: nothing overlaps.
        assert!(close(stream(&[4.0], &[2.0]), 6.0));
        assert_eq!(stream(&[], &[]), 0.0);
    }

    #[test]
    fn deadlocks_and_bad_durations_are_errors() {
        let lanes = vec![vec![Op::recv(1), Op::send(0, 0.0)], vec![Op::recv(0), Op::send(1, 0.0)]];
        assert!(run(&lanes).unwrap_err().contains("deadlock"));
        assert!(run(&[vec![Op::compute(f64::NAN)]]).unwrap_err().contains("duration"));
        assert!(run(&[vec![Op::send(3, 0.0), Op::send(3, 0.0)]]).unwrap_err().contains("twice"));
    }
}
