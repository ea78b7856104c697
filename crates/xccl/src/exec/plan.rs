//! Plans: a collective's schedule checked once against its buffers, and its steps compiled
//! once per aliasing (input and output the same memory or not): message labels, each
//! message's protocol, and what each operation follows by the step ordering rule.

use std::sync::OnceLock;

use super::peer::Peer;
use super::{fused, ll};
use crate::error::{Error, Result};
use crate::frame::OpDesc;
use crate::protocol::{self, Outgoing, Protocol, ProtocolPolicy};
use crate::schedule::order::{self, Follow, StepOrder};
use crate::schedule::{Op, Program, Region};

/// A collective ready to run on one rank: its identity (under sequence number 0), its
/// schedule, checked against the buffer lengths it was built for, and the region that holds
/// this rank's final reduced values (finalised for `Avg`).
#[derive(Debug)]
pub(crate) struct Plan {
    pub desc: OpDesc,
    pub program: Program,
    /// Bytes of input and output the program was checked against.
    pub input_len: usize,
    pub output_len: usize,
    pub result: Option<Region>,
    /// The steps compiled for separate (index 0) and shared (index 1) input and output
    /// memory, made on first use.
    compiled: [OnceLock<std::result::Result<Vec<CompiledStep>, String>>; 2],
}

impl Plan {
    /// Builds the plan, checking the schedule against the buffers once for all its runs.
    pub fn new(
        desc: OpDesc,
        program: Program,
        rank: usize,
        nranks: usize,
        elems: (usize, usize),
        result: Option<Region>,
    ) -> Result<Plan> {
        program
            .check(rank, nranks, elems.0, elems.1)
            .map_err(|e| Error::Internal(format!("{desc}: bad schedule: {e}")))?;
        let esize = desc.dtype.size();
        Ok(Plan {
            desc,
            program,
            input_len: elems.0 * esize,
            output_len: elems.1 * esize,
            result,
            compiled: [OnceLock::new(), OnceLock::new()],
        })
    }

    /// The compiled steps for input and output that are the same memory (`aliased`) or not,
    /// with each message's protocol chosen for the links `how` describes (the same for every
    /// run on one communicator).
    pub(super) fn steps(&self, aliased: bool, how: &Compiling<'_>) -> Result<&[CompiledStep]> {
        self.compiled[usize::from(aliased)]
            .get_or_init(|| {
                let steps = compile(&self.program, aliased, &self.desc, how)?;
                tracing::info!(rank = how.rank, "{}: protocols {}", self.desc, protocols_used(&steps));
                Ok(steps)
            })
            .as_deref()
            .map_err(|e| Error::Internal(format!("{}: bad schedule: {e}", self.desc)))
    }
}

/// What compiling a plan's steps needs to know about the communicator.
pub(super) struct Compiling<'a> {
    /// This rank (for messages).
    pub rank: usize,
    /// Per peer, its link's facts.
    pub peers: &'a [Peer],
    /// The protocols each collective may use.
    pub policy: &'a ProtocolPolicy,
    /// From which length messages may be pulled.
    pub pull_min: protocol::PullMin,
    /// Each rank has a core of its own (links are polled by spinning).
    pub spinning: bool,
}

/// One operation of a compiled step: what it does on which regions, how its message
/// travels, and what it follows.
#[derive(Clone, Debug)]
pub(super) struct TaskPlan {
    pub act: PlannedAct,
    pub region: Region,
    /// Its index among the step's messages to (sends) or from (receives) its peer.
    pub msg: u32,
    /// LL messages: the signature their label carries.
    pub sig: u64,
    /// Sends: the protocol; receives: LL, eager or stream (the sender's frames tell
    /// streamed from pulled); copies: stream, unused.
    pub proto: Protocol,
    /// Earlier operations of the step to follow: (index, segment by segment?).
    pub deps: Vec<(u32, bool)>,
    pub has_dependents: bool,
    /// Nothing to do (an empty copy, or one onto itself).
    pub noop: bool,
    /// Sends: the next step's receive from the same peer (message index, region) whose
    /// memory the pull descriptor grants the peer (protocol `fused`, `exec/fused.rs`).
    pub grant: Option<(u32, Region)>,
    /// Folding receives: the next step's send back of exactly this region (message index)
    /// that a grant may let this rank write ahead.
    pub fold_ahead: Option<u32>,
}

/// A compiled operation's kind, with its regions.
#[derive(Copy, Clone, Debug)]
pub(super) enum PlannedAct {
    Send { peer: usize },
    Recv { peer: usize, with: Option<Region> },
    Copy { src: Region },
}

/// A step with its ordering and protocols worked out once for all runs of the plan.
#[derive(Clone, Debug)]
pub(super) struct CompiledStep {
    pub(super) tasks: Vec<TaskPlan>,
}

/// The protocols a plan's messages use, as `ll,stream` (`none` without messages).
fn protocols_used(steps: &[CompiledStep]) -> String {
    let mut used: Vec<Protocol> = Vec::new();
    for t in steps.iter().flat_map(|s| &s.tasks) {
        if !matches!(t.act, PlannedAct::Copy { .. }) && !used.contains(&t.proto) {
            used.push(t.proto);
        }
        if (t.grant.is_some() || t.fold_ahead.is_some()) && !used.contains(&Protocol::Fused) {
            used.push(Protocol::Fused);
        }
    }
    used.sort_by_key(|p| Protocol::ALL.iter().position(|q| q == p));
    if used.is_empty() {
        return "none".into();
    }
    used.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
}

/// Compiles a program's steps: message labels, protocols, no-op copies and the ordering
/// rule (`schedule::order`).
pub(super) fn compile(
    program: &Program,
    aliased: bool,
    desc: &OpDesc,
    how: &Compiling<'_>,
) -> std::result::Result<Vec<CompiledStep>, String> {
    let allowed = how.policy.for_kind(desc.kind);
    let one_way = desc.kind.one_way() && how.spinning;
    let esize = desc.dtype.size();
    let mut steps = Vec::with_capacity(program.steps.len());
    for (s, step) in program.steps.iter().enumerate() {
        let order = StepOrder::of(step, aliased)?;
        // A large one-way message streams only where it is the step's only send or copy.
        let sole = step.ops.iter().filter(|op| !matches!(op, Op::Recv { .. })).count() == 1;
        let mut msgs: Vec<(usize, u32, u32)> = Vec::new();
        let mut count = |peer: usize, send: bool| {
            let at = match msgs.iter().position(|m| m.0 == peer) {
                Some(at) => at,
                None => {
                    msgs.push((peer, 0, 0));
                    msgs.len() - 1
                }
            };
            let slot = if send { &mut msgs[at].1 } else { &mut msgs[at].2 };
            *slot += 1;
            *slot - 1
        };
        let mut tasks: Vec<TaskPlan> = Vec::with_capacity(step.ops.len());
        for (j, op) in step.ops.iter().enumerate() {
            let has_dependents = order.has_dependents(j);
            let link = |peer: usize| how.peers.get(peer).map(|p| p.facts).unwrap_or_default();
            let (act, region, msg, proto) = match *op {
                Op::Send { peer, src } => {
                    let m = Outgoing {
                        len: src.len * esize,
                        has_dependents,
                        sole_one_way: one_way && sole,
                        plain: !desc.kind.combines() && (how.spinning || !desc.kind.one_way()),
                        pull_min: how.pull_min,
                    };
                    (
                        PlannedAct::Send { peer },
                        src,
                        count(peer, true),
                        protocol::for_send(&m, &link(peer), allowed),
                    )
                }
                Op::Recv { peer, dst, with } => {
                    let proto =
                        protocol::expected(dst.len * esize, &link(peer), how.pull_min.combining, allowed);
                    (PlannedAct::Recv { peer, with }, dst, count(peer, false), proto)
                }
                Op::Copy { src, dst } => (PlannedAct::Copy { src }, dst, 0, Protocol::Stream),
            };
            let noop = order::access(op, aliased).is_noop();
            let deps = order
                .follows(j)
                .iter()
                .filter_map(|&(i, how)| match how {
                    Follow::Segments => Some((i as u32, true)),
                    Follow::Whole => Some((i as u32, false)),
                    // Messages on one channel pair up in order through the per-peer queues.
                    Follow::InOrder => None,
                })
                .collect();
            let sig = if proto == Protocol::Ll {
                ll::signature(desc, s as u32, msg, region.len * esize)
            } else {
                0
            };
            tasks.push(TaskPlan {
                act,
                region,
                msg,
                sig,
                proto,
                deps,
                has_dependents,
                noop,
                grant: None,
                fold_ahead: None,
            });
        }
        steps.push(CompiledStep { tasks });
    }
    let facts = |peer: usize| how.peers.get(peer).map(|p| p.facts).unwrap_or_default();
    fused::mark(&mut steps, program, aliased, esize, allowed, facts);
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;
    use crate::coll::CollKind;
    use crate::dtype::DType;
    use crate::protocol::LinkFacts;
    use crate::schedule::Buf;

    fn desc(kind: CollKind) -> OpDesc {
        OpDesc { kind, seq: 0, dtype: DType::F32, op: None, count: 0, root: Some(0), algo: Algorithm::Chain }
    }

    fn peers(memory: bool) -> Vec<Peer> {
        (0..3)
            .map(|_| {
                let mut p = Peer::new(None);
                p.facts = LinkFacts {
                    memory,
                    ll_max: if memory { 256 } else { 0 },
                    seg: 1 << 20,
                    peer_pulls: memory,
                };
                p
            })
            .collect()
    }

    fn compiled(
        kind: CollKind,
        program: &Program,
        peers: &[Peer],
        policy: &ProtocolPolicy,
    ) -> Vec<CompiledStep> {
        let how =
            Compiling { rank: 1, peers, policy, pull_min: protocol::PullMin::default(), spinning: true };
        compile(program, false, &desc(kind), &how).unwrap()
    }

    #[test]
    fn a_forwarding_step_follows_segment_by_segment_and_streams_what_it_forwards() {
        // Rank 1 of a chain: receive from 0 and pass on to 2, the same region.
        let r = Region::new(Buf::Output, 0, 1 << 20);
        let mut p = Program::new();
        p.step().recv(0, r).send(2, r);
        let steps = compiled(CollKind::Broadcast, &p, &peers(true), &ProtocolPolicy::default());
        let t = &steps[0].tasks;
        assert_eq!(t[1].deps, vec![(0, true)]);
        assert!(t[0].has_dependents && !t[1].has_dependents);
        // 4 MiB one way, the step's only send: it streams through the ring (both cores copy);
        // in an exchange it would be pulled.
        assert_eq!((t[0].proto, t[1].proto), (Protocol::Stream, Protocol::Stream));
        let exchange = compiled(CollKind::AllReduce, &p, &peers(true), &ProtocolPolicy::default());
        assert_eq!(exchange[0].tasks[1].proto, Protocol::Pull);
    }

    #[test]
    fn protocols_follow_size_link_and_policy() {
        let mut p = Program::new();
        p.step()
            .send(0, Region::new(Buf::Input, 0, 2))
            .recv(0, Region::new(Buf::Output, 0, 2))
            .send(2, Region::new(Buf::Input, 0, 1024))
            .send(0, Region::new(Buf::Input, 1024, 1 << 20));
        let protos = |peers: &[Peer], policy: &str| -> Vec<Protocol> {
            let policy = ProtocolPolicy::parse(policy).unwrap();
            compiled(CollKind::AllReduce, &p, peers, &policy)[0].tasks.iter().map(|t| t.proto).collect()
        };
        use Protocol::*;
        assert_eq!(protos(&peers(true), ""), vec![Ll, Ll, Eager, Pull]);
        assert_eq!(protos(&peers(false), ""), vec![Stream, Stream, Stream, Stream]);
        assert_eq!(protos(&peers(true), "stream"), vec![Stream, Stream, Stream, Stream]);
        assert_eq!(protos(&peers(true), "broadcast:stream"), vec![Ll, Ll, Eager, Pull]);
        assert_eq!(protos(&peers(true), "all_reduce:eager"), vec![Eager, Eager, Eager, Stream]);
        // LL messages carry their signature; the others none.
        let steps = compiled(CollKind::AllReduce, &p, &peers(true), &ProtocolPolicy::default());
        assert!(steps[0].tasks[0].sig != 0 && steps[0].tasks[2].sig == 0);
        assert_eq!(
            steps[0].tasks[0].sig, steps[0].tasks[1].sig,
            "the send and the receive of one exchange agree"
        );
        assert_eq!(protocols_used(&steps), "ll,eager,pull");
    }
}
