//! Failure: how a rank that fails tells its peers (an abort notice after any half-written
//! frame), how it explains a lost peer (who vanished first, what it said), and what a
//! timeout reports (which peers were silent, which did not read).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::task::{Act, StepRun};
use super::{ABORT_PATIENCE, Engine};
use crate::error::{Error, Result};
use crate::frame::OpDesc;
use crate::stall;
use crate::transport::{Closed, Farewell, Interest, PeerAborted, explain_io};

/// How long a failing rank reads what its peers still send after its farewell, at most...
const LINGER: Duration = Duration::from_millis(500);
/// ...and once they have sent nothing for this long (a peer busy elsewhere for a moment
/// still reads the farewell before this rank's side is gone).
const LINGER_QUIET: Duration = Duration::from_millis(200);

/// A link's I/O error: the peer aborted (memory links say so and why), or it was lost.
pub(super) fn lost(op: String, peer: usize, e: std::io::Error) -> Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<PeerAborted>()) {
        Some(a) => Error::RemoteAbort { op, peer, origin: a.origin, reason: a.reason.clone() },
        None => Error::PeerLost { op, peer, detail: explain_io(&e) },
    }
}
/// Collectives remembered in [`Fate`].
const HISTORY: usize = 32;

/// What befell one communicator: the failure that ended it, the abort the program posted,
/// and the collectives it ran last (a late frame or LL message of an earlier sequence
/// number is reported against what this rank called under that number).
#[derive(Default)]
pub(super) struct Fate {
    /// The first failure; every later operation fails with it.
    pub dead: Option<Error>,
    /// Set by [`Communicator::abort`](crate::Communicator::abort) from any thread: why the
    /// program aborted the communicator. Checked before each operation and whenever a step
    /// waits.
    pub cancel: Arc<OnceLock<String>>,
    /// The last collectives run: the `k`-th at index `k % HISTORY` (a new one overwrites
    /// the oldest in place).
    history: Vec<OpDesc>,
    /// Collectives recorded so far.
    recorded: usize,
}

impl Fate {
    /// Notes that collective `desc` ran (the oldest is forgotten past [`HISTORY`]).
    pub fn record(&mut self, desc: OpDesc) {
        if self.history.len() < HISTORY {
            self.history.push(desc);
        } else {
            self.history[self.recorded % HISTORY] = desc;
        }
        self.recorded += 1;
    }

    /// The newest remembered collective that `is` says is the one.
    pub fn ran(&self, is: impl Fn(&OpDesc) -> bool) -> Option<&OpDesc> {
        let n = self.history.len();
        (1..=n).map(|k| &self.history[(self.recorded - k) % n.max(1)]).find(|d| is(d))
    }
}

impl Engine {
    /// Fails operation `op` (named only then) if the program aborted the communicator.
    pub(super) fn check_cancel(&self, op: impl Fn() -> String) -> Result<()> {
        match self.fate.cancel.get() {
            Some(reason) => Err(Error::Cancelled { op: op(), rank: self.rank, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    pub(super) fn abort(&mut self, err: &Error) {
        if self.fate.dead.is_some() {
            return;
        }
        self.fate.dead = Some(err.clone());
        // A notice can only follow a complete frame: finish half-written ones first (their
        // buffers are still those of the failing operation), giving up after a moment.
        self.finish_frames(Instant::now() + ABORT_PATIENCE);
        let mid: Vec<bool> = self.peers.iter().map(|p| p.out.is_some()).collect();
        // Relay news from elsewhere unchanged; otherwise the failure began here or at the
        // peer the error blames.
        let farewell = match err {
            Error::RemoteAbort { origin, reason, .. } => {
                Farewell::Abort { origin: *origin, reason: reason.clone() }
            }
            other => Farewell::Abort {
                origin: other.culprit().unwrap_or(self.rank),
                reason: format!("rank {}: {other}", self.rank),
            },
        };
        self.links.close_all(&farewell, &mid, ABORT_PATIENCE);
        self.links.linger(LINGER_QUIET, Instant::now() + LINGER);
    }

    /// Looks whether `peer` has ended its side, wherever its stream stands (the rest of a
    /// frame being read is skipped: this rank is failing and will not use it).
    fn probe(&mut self, peer: usize) {
        self.links.probe(peer, self.peers[peer].inbound.within());
    }

    /// Writes the rest of every half-written outgoing frame, until `deadline`. Frames on
    /// broken links stay half-written (so no notice is attempted there).
    fn finish_frames(&mut self, deadline: Instant) {
        let mut broken = vec![false; self.nranks];
        loop {
            let mut want = vec![Interest::default(); self.nranks];
            for peer in 0..self.nranks {
                if broken[peer] {
                    continue;
                }
                let Some(f) = self.peers[peer].out.as_mut() else {
                    continue;
                };
                let Ok(link) = self.links.link(peer) else {
                    continue;
                };
                let pad = [0u8; 8];
                let total = f.total();
                // The failing operation's buffers are valid until it returns, after this.
                let (parts, n) = f.rest(&pad);
                match link.write(&parts[..n]) {
                    Ok(n) => f.written += n,
                    Err(_) => broken[peer] = true,
                }
                if f.written == total {
                    self.peers[peer].out = None;
                }
                want[peer].write = self.peers[peer].out.is_some() && !broken[peer];
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if want.iter().all(|w| !w.write) || left.is_zero() {
                return;
            }
            // Without a last look after arming, a wake-up may be missed: the short nap bounds it.
            let token = self.links.arm();
            let _ = self.links.wait(&want, token, left.min(Duration::from_millis(10)));
        }
    }

    /// Fails if the communicator is dead, or if a peer is known to have failed: no new
    /// operation starts after that. A peer's failure found here aborts this rank too, so its
    /// other peers hear who failed first rather than a clean goodbye.
    pub(super) fn ensure_alive(&mut self, op: impl Fn() -> String) -> Result<()> {
        let res = self.check_alive(op);
        if let Err(e) = &res {
            self.abort(e);
        }
        res
    }

    fn check_alive(&self, op: impl Fn() -> String) -> Result<()> {
        if let Some(e) = &self.fate.dead {
            return Err(Error::Aborted(Box::new(e.clone())));
        }
        self.check_cancel(&op)?;
        match self.links.first_failed() {
            Some((peer, Closed::Aborted { origin, reason })) => {
                Err(Error::RemoteAbort { op: op(), peer, origin: *origin, reason: reason.clone() })
            }
            Some((peer, Closed::Vanished(detail))) => {
                Err(Error::PeerLost { op: op(), peer, detail: detail.clone() })
            }
            _ => Ok(()),
        }
    }

    /// Makes a lost-peer error as informative as the links allow: a peer that left an abort
    /// notice aborted (and says why); a peer that merely hung up may have been brought down by
    /// others that vanished first.
    pub(super) fn explain(&mut self, e: Error) -> Error {
        let Error::PeerLost { op, peer, detail } = e else { return e };
        // The broken link may still hold the peer's last word, unread.
        self.probe(peer);
        if let Some(Closed::Aborted { origin, reason }) = self.links.gone(peer) {
            return Error::RemoteAbort { op, peer, origin: *origin, reason: reason.clone() };
        }
        let vanished: Vec<String> = (0..self.nranks)
            .filter(|&q| q != peer && matches!(self.links.gone(q), Some(Closed::Vanished(_))))
            .map(|q| format!("rank {q}"))
            .collect();
        let detail = if vanished.is_empty() {
            detail
        } else {
            format!("{detail}; before it, {} vanished", vanished.join(", "))
        };
        Error::PeerLost { op, peer, detail }
    }

    /// The error of a step that made no progress for `idle_for`: which peers were silent and
    /// which did not read, and, if the ranks share a board, which rank the waiting leads to
    /// (`crate::stall`).
    pub(super) fn timeout_error(&mut self, run: &StepRun<'_>, idle_for: Duration) -> Error {
        let mut silent = Vec::new();
        let mut deaf = Vec::new();
        let mut waits_for = Vec::new();
        for t in run.tasks.iter().filter(|t| !t.complete) {
            match t.act {
                Act::Recv { peer, .. } => {
                    silent.push(format!("rank {peer} ({} of {} bytes received)", t.done, t.span.len));
                    waits_for.push(peer);
                }
                Act::Send { peer } => {
                    deaf.push(format!("rank {peer} ({} of {} bytes sent)", t.done, t.span.len));
                    waits_for.push(peer);
                }
                Act::Copy { .. } => {}
            }
        }
        let mut detail = String::new();
        if !silent.is_empty() {
            detail += &format!("not heard from {}", silent.join(", "));
        }
        if !deaf.is_empty() {
            if !detail.is_empty() {
                detail += "; ";
            }
            detail += &format!("not read by {}", deaf.join(", "));
        }
        waits_for.sort_unstable();
        waits_for.dedup();
        let mut blamed = Vec::new();
        if let Some(board) = &self.tuning.board {
            let verdict = stall::find_silent(
                board.as_ref(),
                self.rank,
                &waits_for,
                stall::patience(self.tuning.timeout),
            );
            detail += &format!("; {}", verdict.describe());
            blamed = verdict.silent();
        }
        // A peer may have failed meanwhile, elsewhere: its farewell says where the failure
        // began, though frames this rank did not read yet come before it. (One that names
        // this rank took it for silent before it timed out in turn: it is not the origin.)
        let mut origins = Vec::new();
        for peer in 0..self.nranks {
            self.probe(peer);
            if let Some(Closed::Aborted { origin, reason }) = self.links.gone(peer)
                && *origin != self.rank
                && !origins.contains(origin)
            {
                detail += &if peer == *origin {
                    format!("; meanwhile rank {peer} failed: {reason}")
                } else {
                    format!("; meanwhile rank {peer} aborted, naming rank {origin}: {reason}")
                };
                origins.push(*origin);
            }
        }
        blamed.retain(|r| !origins.contains(r));
        origins.extend(blamed);
        Error::Timeout {
            op: run.op(),
            rank: self.rank,
            secs: idle_for.as_secs_f64(),
            detail,
            blamed: origins,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;
    use crate::coll::CollKind;
    use crate::dtype::DType;

    fn desc(kind: CollKind, seq: u64) -> OpDesc {
        OpDesc { kind, seq, dtype: DType::F32, op: None, count: 4, root: None, algo: Algorithm::Ring }
    }

    #[test]
    fn the_newest_of_the_last_collectives_is_found() {
        let mut fate = Fate::default();
        for seq in 0..40 {
            let kind = if seq % 2 == 0 { CollKind::AllGather } else { CollKind::AllToAll };
            fate.record(desc(kind, seq));
        }
        assert_eq!(fate.ran(|d| d.seq == 39).map(|d| d.kind), Some(CollKind::AllToAll));
        assert_eq!(fate.ran(|d| d.kind == CollKind::AllGather).map(|d| d.seq), Some(38));
        // Only the last 32 are kept.
        assert_eq!(fate.ran(|d| d.seq == 8).map(|d| d.seq), Some(8));
        assert!(fate.ran(|d| d.seq == 7).is_none());
        assert!(fate.dead.is_none() && fate.cancel.get().is_none());
    }
}
