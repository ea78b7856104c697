//! The fused protocol (`protocol::fuses`): a rank that folds a pulled message, and owes its
//! sender the folded result in the next step, writes each folded piece straight into the
//! sender's receive buffer of that next message while the piece is still in cache, so the
//! next step has nothing left to move (the 2-rank all-reduce: the reduce-scatter's fold
//! and the all-gather's copy become one pass; `bench/native/cma_allreduce.c push`).
//!
//! Who may write where is the owner's word, never the writer's guess:
//!
//! 1. **Plan** ([`mark`], once per plan): a pulled send of step `s` may *grant* its peer the
//!    region of a plain receive from that peer in step `s + 1` that follows nothing there,
//!    is as long, and that no operation of step `s` touches (but the send itself, reading
//!    exactly that region: in place, the peer writes piece `k` only after it pulled piece
//!    `k`). A folding receive of step `s` that nothing follows may *fold ahead* into the
//!    send of step `s + 1` back to the same peer of exactly its region, which follows nothing
//!    there.
//! 2. **Grant**: the sender writes a `Grant` frame (step `s + 1`, message `m`, where, how
//!    long) just before the pull descriptor, and keeps its peer's [`Ahead::granted`].
//! 3. **Fold and write**: the receiver takes the grant for the receive the descriptor is for
//!    if it would have planned the same (its `fold_ahead` is message `m`, the lengths agree,
//!    nothing is received yet), else it declines (`Pushed` of 0 bytes, at once). Taken, each
//!    folded piece is written to the grant's address plus its offset; once the receive is
//!    complete, `Pushed` with the whole length follows the pull's acknowledgement, and the
//!    receiver's send of step `s + 1` is done before it starts ([`Ahead::sent`]).
//! 4. **Next step** ([`Engine::load_ahead`]): the granter's receive is complete if the answer
//!    came, or waits for it (`awaited`); a declined grant leaves the receive to the usual
//!    frames.

use super::outbound::{Body, OutFrame};
use super::plan::{CompiledStep, PlannedAct};
use super::task::{Act, Label, StepRun};
use super::{Ctx, Engine};
use crate::error::{Error, Result};
use crate::frame::{FrameKind, Header, PULL_LEN};
use crate::protocol::{self, LinkFacts, Protocol, Protocols};
use crate::schedule::Program;
use crate::schedule::order::{self, Extent};
use crate::transport::pull::{self, Pull};

/// What a peer and this rank agreed for the next step of the running collective.
#[derive(Clone, Debug, Default)]
pub(super) struct Ahead {
    /// This rank granted the peer its receive of (step, message), of this many bytes, and
    /// the peer's answer so far (bytes written, 0 if declined).
    pub granted: Option<Granted>,
    /// This rank wrote its (step, message) to the peer ahead: that send is done.
    pub sent: Option<(u32, u32)>,
}

/// A grant given to a peer.
#[derive(Copy, Clone, Debug)]
pub(super) struct Granted {
    pub step: u32,
    pub msg: u32,
    pub len: usize,
    pub answer: Option<usize>,
}

/// A grant taken by a receive: where its folded pieces go, and the message of the next step
/// they are (named in the answer).
#[derive(Copy, Clone, Debug)]
pub(super) struct PushTo {
    pub to: Pull,
    pub addr: u64,
    pub msg: u32,
}

/// Marks, in compiled steps, the sends that grant their peer the next step's receive and the
/// folding receives that fold ahead into the next step's send (the module docs, point 1).
/// `facts` gives the link to each peer; `esize` is the element size.
pub(super) fn mark(
    steps: &mut [CompiledStep],
    program: &Program,
    aliased: bool,
    esize: usize,
    allowed: Protocols,
    facts: impl Fn(usize) -> LinkFacts,
) {
    for s in 0..steps.len().saturating_sub(1) {
        let (now, next) = steps.split_at_mut(s + 1);
        let (now, next) = (&mut now[s], &next[0]);
        let ops = &program.steps[s].ops;
        let touched: Vec<(Option<Extent>, Option<Extent>)> = ops
            .iter()
            .map(|op| {
                let a = order::access(op, aliased);
                (a.reads, a.writes)
            })
            .collect();
        let extent = |j: usize, step: usize| order::access(&program.steps[step].ops[j], aliased);
        let mut granting: Vec<usize> = Vec::new();
        let mut folding: Vec<usize> = Vec::new();
        for j in 0..now.tasks.len() {
            let t = &now.tasks[j];
            let len = t.region.len * esize;
            match t.act {
                PlannedAct::Send { peer } => {
                    if t.proto != Protocol::Pull
                        || !t.deps.is_empty()
                        || t.noop
                        || granting.contains(&peer)
                        || !protocol::fuses(len, &facts(peer), allowed)
                    {
                        continue;
                    }
                    let mine = extent(j, s).reads;
                    let room = next.tasks.iter().enumerate().find(|(k, r)| {
                        let PlannedAct::Recv { peer: from, with: None } = r.act else { return false };
                        let Some(g) = extent(*k, s + 1).writes else { return false };
                        from == peer
                            && r.deps.is_empty()
                            && r.proto == Protocol::Stream
                            && r.region.len == t.region.len
                            && touched.iter().enumerate().all(|(i, (rd, wr))| {
                                let clear = |e: &Option<Extent>| e.is_none_or(|e| !e.overlaps(&g));
                                (i == j && mine == Some(g) && clear(wr)) || (clear(rd) && clear(wr))
                            })
                    });
                    if let Some((_, r)) = room {
                        now.tasks[j].grant = Some((r.msg, r.region));
                        granting.push(peer);
                    }
                }
                PlannedAct::Recv { peer, with: Some(_) } => {
                    if t.has_dependents
                        || t.noop
                        || folding.contains(&peer)
                        || !protocol::fuses(len, &facts(peer), allowed)
                    {
                        continue;
                    }
                    let mine = extent(j, s).writes;
                    let back = next.tasks.iter().enumerate().find(|(k, b)| {
                        matches!(b.act, PlannedAct::Send { peer: to } if to == peer)
                            && b.deps.is_empty()
                            && !b.noop
                            && b.proto != Protocol::Ll
                            && extent(*k, s + 1).reads == mine
                    });
                    if let Some((_, b)) = back {
                        now.tasks[j].fold_ahead = Some(b.msg);
                        folding.push(peer);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Writes `result`, bytes `at..` of a receive just folded, where the grant it took says.
pub(super) fn write_ahead(to: &PushTo, at: usize, result: &[u8]) -> std::io::Result<()> {
    // `addr + span.len` was checked not to overflow when the grant was taken, and
    // `at + result.len()` lies within the span.
    let there = to.addr + at as u64;
    // SAFETY: the peer named `addr..addr + span.len` as its receive buffer of the next step,
    // which no operation of its current step touches but the pulled send this receive reads,
    // whose bytes `at..at + result.len()` were pulled before this write and are not read again;
    // for threads of one process that memory is the peer's buffer, disjoint from `result`
    // (this rank's own).
    unsafe { pull::write(to.to, there, result) }
}

impl Engine {
    /// The grant to write before the first pull descriptor of send task `i` to `peer`, if
    /// its plan grants one; keeps it in the peer's [`Ahead`].
    pub(super) fn grant_frame(&mut self, run: &StepRun<'_>, i: usize, peer: usize) -> Option<OutFrame> {
        let t = &run.tasks[i];
        let (Some((msg, room)), Ctx::Coll { desc, step }) = (t.grant, run.ctx) else { return None };
        if t.sent != 0 {
            return None;
        }
        let mut h = Header::data(self.comm, desc, step + 1, msg);
        h.kind = FrameKind::Grant;
        (h.len, h.total) = (PULL_LEN as u32, room.len as u64);
        let mut body = [0u8; PULL_LEN];
        body[..8].copy_from_slice(&(room.ptr as u64).to_le_bytes());
        body[8..].copy_from_slice(&(room.len as u64).to_le_bytes());
        self.peers[peer].ahead.granted = Some(Granted { step: step + 1, msg, len: room.len, answer: None });
        Some(OutFrame { task: None, header: h.encode(), body: Body::Push(body), written: 0 })
    }

    /// A grant from `peer` (`header`, `addr`, `len`): taken by the receive its pull
    /// descriptor is for, or declined at once.
    pub(super) fn on_grant(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        header: Header,
        addr: u64,
        len: u64,
    ) -> Result<()> {
        let ctx = run.ctx;
        let protocol = |detail: String| Error::Protocol { op: ctx.describe(), peer, detail };
        let Ctx::Coll { desc, step } = ctx else {
            return Err(protocol("a grant in a point-to-point batch".into()));
        };
        if !header.matches(desc) {
            return Err(Error::Mismatch {
                rank: self.rank,
                local: desc.to_string(),
                peer,
                remote: header.describe(),
            });
        }
        if header.step != step + 1 || addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(protocol(format!(
                "grant of {len} bytes at {addr:#x} for step {} message {} during step {step}",
                header.step, header.msg
            )));
        }
        let to = self.peers[peer]
            .pull_from
            .ok_or_else(|| protocol("a grant from a peer this rank cannot write to".into()))?;
        let allowed = self.tuning.protocols.for_kind(desc.kind);
        let facts = self.peers[peer].facts;
        let taker = run.next_recv(peer).filter(|&i| {
            let t = &run.tasks[i];
            t.fold_ahead == Some(header.msg)
                && t.push_to.is_none()
                && t.done == 0
                && t.span.len as u64 == len
                && protocol::fuses(t.span.len, &facts, allowed)
        });
        match taker {
            Some(i) => run.tasks[i].push_to = Some(PushTo { to, addr, msg: header.msg }),
            None => self.peers[peer].acks.push_back(OutFrame::reply(header, FrameKind::Pushed, 0)),
        }
        Ok(())
    }

    /// Receive task `i` from `peer` is complete: if it folded ahead, tell the peer so and
    /// remember that the next step's send is done.
    pub(super) fn folded_ahead(&mut self, run: &StepRun<'_>, i: usize, peer: usize) {
        let t = &run.tasks[i];
        if let (true, Some(p), Ctx::Coll { desc, step }) = (t.complete, t.push_to, run.ctx) {
            let header = Header::data(self.comm, desc, step + 1, p.msg);
            self.peers[peer].acks.push_back(OutFrame::reply(header, FrameKind::Pushed, t.span.len));
            self.peers[peer].ahead.sent = Some((step + 1, p.msg));
        }
    }

    /// A `Pushed` frame from `peer` that answers this rank's grant (true), or none (false).
    pub(super) fn on_pushed_ahead(
        &mut self,
        run: &StepRun<'_>,
        peer: usize,
        header: &Header,
        pushed: usize,
    ) -> Result<bool> {
        let Ctx::Coll { step, .. } = run.ctx else { return Ok(false) };
        let Some(g) = self.peers[peer].ahead.granted.as_mut() else { return Ok(false) };
        if header.step != step + 1 || header.msg != g.msg || g.answer.is_some() {
            return Ok(false);
        }
        if pushed != 0 && pushed != g.len {
            return Err(Error::Protocol {
                op: run.op(),
                peer,
                detail: format!("{pushed} bytes written ahead where {} were granted", g.len),
            });
        }
        g.answer = Some(pushed);
        Ok(true)
    }

    /// At the start of step `step`: what was agreed ahead for it. Sends written ahead are
    /// done; a granted receive is complete if the peer wrote it, waits for the answer if it
    /// has not come, and is received as usual if the peer declined.
    pub(super) fn load_ahead(&mut self, run: &mut StepRun<'_>, step: u32) -> Result<()> {
        for k in 0..run.touched.len() {
            let peer = run.touched[k];
            let ahead = &mut self.peers[peer].ahead;
            if ahead.sent.is_none() && ahead.granted.is_none() {
                continue;
            }
            let Ahead { sent, granted } = std::mem::take(ahead);
            let find = |send: bool, m: u32| {
                run.tasks.iter().position(|t| {
                    let ours = match t.act {
                        Act::Send { peer: p } => send && p == peer,
                        Act::Recv { peer: p, .. } => !send && p == peer,
                        Act::Copy { .. } => false,
                    };
                    ours && matches!(t.label, Label::Coll { msg, .. } if msg == m)
                })
            };
            let sent = sent.filter(|&(s, _)| s == step).map(|(_, m)| (m, find(true, m)));
            let granted = granted.filter(|g| g.step == step).map(|g| (g, find(false, g.msg)));
            if let Some((m, i)) = sent {
                let i = i.ok_or_else(|| {
                    Error::Internal(format!("{}: step {step} has no message {m} to write ahead", run.op()))
                })?;
                run.tasks[i].finish();
            }
            if let Some((g, i)) = granted {
                let i = i.ok_or_else(|| {
                    Error::Internal(format!("{}: step {step} has no message {} to grant", run.op(), g.msg))
                })?;
                let t = &mut run.tasks[i];
                match g.answer {
                    Some(0) => {}
                    Some(_) => t.finish(),
                    None => (t.awaited, t.granted) = (g.len, true),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{self, Algorithm, Shape};
    use crate::coll::CollKind;
    use crate::dtype::DType;
    use crate::exec::peer::Peer;
    use crate::exec::plan::Compiling;
    use crate::frame::OpDesc;
    use crate::protocol::ProtocolPolicy;
    use crate::reduce::ReduceOp;
    use crate::schedule::{Buf, Region};

    /// Rank `rank` of an all-reduce of `count` f32 on `n` ranks by Rabenseifner, compiled for
    /// shared memory (or for links whose peers cannot pull) under `policy`: per step, its
    /// grants and folds ahead.
    #[allow(clippy::type_complexity)]
    fn marked(
        n: usize,
        rank: usize,
        count: usize,
        aliased: bool,
        pulls: bool,
        policy: &str,
    ) -> Vec<(Vec<(u32, Region)>, Vec<u32>)> {
        let hosts = vec![0; n];
        let p =
            algo::build(CollKind::AllReduce, Algorithm::Rabenseifner, rank, &hosts, 0, &Shape::Count(count))
                .unwrap();
        let peers: Vec<Peer> = (0..n)
            .map(|_| {
                let mut p = Peer::new(None);
                p.facts = LinkFacts { memory: true, ll_max: 256, seg: 1 << 20, peer_pulls: pulls };
                p
            })
            .collect();
        let policy = ProtocolPolicy::parse(policy).unwrap();
        let how = Compiling {
            rank,
            peers: &peers,
            policy: &policy,
            pull_min: crate::protocol::PullMin::default(),
            spinning: true,
        };
        let desc = OpDesc {
            kind: CollKind::AllReduce,
            seq: 0,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            count: count as u64,
            root: None,
            algo: Algorithm::Rabenseifner,
        };
        let steps = crate::exec::plan::compile(&p, aliased, &desc, &how).unwrap();
        steps
            .iter()
            .map(|s| {
                (
                    s.tasks.iter().filter_map(|t| t.grant).collect(),
                    s.tasks.iter().filter_map(|t| t.fold_ahead).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn two_ranks_grant_and_fold_ahead_their_halves_in_and_out_of_place() {
        let count = 1 << 20;
        for aliased in [false, true] {
            for rank in 0..2 {
                let steps = marked(2, rank, count, aliased, true, "");
                // The half given away comes back in the all-gather, into the output.
                let give = Region::new(Buf::Output, (1 - rank) * count / 2, count / 2);
                assert_eq!(steps[0], (vec![(0, give)], vec![0]), "rank {rank}, aliased {aliased}");
                assert_eq!(steps[1], (vec![], vec![]), "the last step grants nothing");
            }
        }
    }

    #[test]
    fn four_ranks_fuse_only_the_middle_rounds() {
        let steps = marked(4, 1, 1 << 20, false, true, "");
        let marks: Vec<(usize, usize)> = steps.iter().map(|(g, f)| (g.len(), f.len())).collect();
        // Reduce-scatter rounds to partners 0 and 3, then all-gather rounds to 3 and 0: only
        // the second reduce-scatter round's result goes back to its partner next.
        assert_eq!(marks, vec![(0, 0), (1, 1), (0, 0), (0, 0)]);
    }

    #[test]
    fn nothing_is_fused_where_the_peer_cannot_pull_or_the_policy_forbids_it() {
        for (pulls, policy) in [(false, ""), (true, "ll,eager,pull,split"), (true, "fused")] {
            let steps = marked(2, 0, 1 << 20, false, pulls, policy);
            assert!(steps.iter().all(|(g, f)| g.is_empty() && f.is_empty()), "{pulls} {policy}: {steps:?}");
        }
        // Halves below the pull threshold stream: nothing to fold ahead.
        let steps = marked(2, 0, 16 << 10, false, true, "");
        assert!(steps.iter().all(|(g, f)| g.is_empty() && f.is_empty()), "{steps:?}");
    }
}
