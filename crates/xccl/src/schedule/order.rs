//! The step ordering rule, stated once: which operations of a step follow which.
//!
//! Inside a step every operation may proceed at once, except that
//! - an operation that writes memory an earlier one reads or writes, or reads memory an
//!   earlier one writes, follows it: *segment by segment* ([`Follow::Segments`]: byte `b`
//!   once the earlier has done `b` bytes) when every region they clash on is identical and
//!   the two are equally long, which is how forwarding (`Recv{parent, R}` then
//!   `Send{child, R}`) is written; else *whole* ([`Follow::Whole`]: after the earlier has
//!   finished);
//! - messages on one channel (sends to one peer, receives from one peer) pair up in order
//!   ([`Follow::InOrder`]).
//!
//! A copy onto itself, or of nothing, does nothing: it follows nothing and nothing follows
//! it. A copy between overlapping but different regions is an error.
//!
//! The executor runs the data rules segment by segment and keeps the channel order with its
//! per-peer queues; the verifier runs operations whole, which is at least as strict; the
//! tuner finds forwarding (a receive that a later send follows) here.

use super::{Buf, Op, Step};

/// Where an operation's bytes lie: a range of one memory space (bytes or elements; a step's
/// buffers are spaces of their own, a point-to-point batch uses addresses in one space).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    /// The memory space.
    pub space: usize,
    /// First unit.
    pub off: usize,
    /// Units.
    pub len: usize,
}

impl Extent {
    /// Whether the two ranges share a unit (empty ranges share none).
    pub fn overlaps(&self, other: &Extent) -> bool {
        self.space == other.space
            && self.len > 0
            && other.len > 0
            && self.off < other.off + other.len
            && other.off < self.off + self.len
    }
}

/// Which message queue an operation uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Sends to this peer.
    To(usize),
    /// Receives from this peer.
    From(usize),
}

/// What one operation touches.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// What it reads.
    pub reads: Option<Extent>,
    /// What it writes.
    pub writes: Option<Extent>,
    /// Its length.
    pub len: usize,
    /// Its channel, for messages.
    pub channel: Option<Channel>,
}

impl Access {
    /// A copy onto itself or of nothing: it does nothing, follows nothing and nothing
    /// follows it.
    pub fn is_noop(&self) -> bool {
        match (self.channel, self.reads, self.writes) {
            (None, Some(r), Some(w)) => r == w || self.len == 0,
            _ => false,
        }
    }
}

/// How a later operation follows an earlier one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Identical regions of equal length: byte `b` once the earlier has done `b` bytes.
    Segments,
    /// Overlapping regions: after the earlier has finished.
    Whole,
    /// The same channel, no clash of memory: the messages pair up in order.
    InOrder,
}

/// How `later` must follow `earlier`, if at all (the rule for one pair of operations).
pub fn follow(earlier: &Access, later: &Access) -> Option<Follow> {
    if earlier.is_noop() || later.is_noop() {
        return None;
    }
    let pairs =
        [(earlier.writes, later.reads), (earlier.writes, later.writes), (earlier.reads, later.writes)];
    let mut clash = false;
    let mut identical = true;
    for (x, y) in pairs {
        if let (Some(x), Some(y)) = (x, y)
            && x.overlaps(&y)
        {
            clash = true;
            identical &= x == y;
        }
    }
    if clash {
        Some(if identical && earlier.len == later.len { Follow::Segments } else { Follow::Whole })
    } else if earlier.channel.is_some() && earlier.channel == later.channel {
        Some(Follow::InOrder)
    } else {
        None
    }
}

/// Calls `f(i, how)` for every earlier operation `i` that `later` must follow. The
/// incremental form, for point-to-point batches whose operations arrive one by one.
pub fn follows(earlier: &[Access], later: &Access, mut f: impl FnMut(usize, Follow)) {
    if later.is_noop() {
        return;
    }
    for (i, a) in earlier.iter().enumerate() {
        if let Some(how) = follow(a, later) {
            f(i, how);
        }
    }
}

/// What `op` touches, in elements, with the buffers as spaces: input 0, output 1 (0 when
/// input and output are the same memory, `aliased`), scratch 2.
pub fn access(op: &Op, aliased: bool) -> Access {
    let extent = |r: super::Region| {
        let space = match r.buf {
            Buf::Input => 0,
            Buf::Output => usize::from(!aliased),
            Buf::Scratch => 2,
        };
        Extent { space, off: r.off, len: r.len }
    };
    match *op {
        Op::Send { peer, src } => {
            Access { reads: Some(extent(src)), writes: None, len: src.len, channel: Some(Channel::To(peer)) }
        }
        Op::Recv { peer, dst, with } => Access {
            reads: with.map(extent),
            writes: Some(extent(dst)),
            len: dst.len,
            channel: Some(Channel::From(peer)),
        },
        Op::Copy { src, dst } => {
            Access { reads: Some(extent(src)), writes: Some(extent(dst)), len: dst.len, channel: None }
        }
    }
}

/// What `op` touches (as [`access`]); a local copy between overlapping but different
/// regions is an error.
pub fn checked_access(op: &Op, aliased: bool) -> Result<Access, String> {
    let a = access(op, aliased);
    if let (None, Some(r), Some(w)) = (a.channel, a.reads, a.writes)
        && !a.is_noop()
        && r.overlaps(&w)
    {
        return Err(format!("{op:?}: a local copy between overlapping regions"));
    }
    Ok(a)
}

/// The ordering of a whole step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOrder {
    /// Per operation, the earlier ones it follows and how.
    follows: Vec<Vec<(usize, Follow)>>,
    /// Per operation, whether a later one follows it by a data rule.
    dependents: Vec<bool>,
}

impl StepOrder {
    /// Works out the order of `step`, whose input and output are the same memory when
    /// `aliased`; a local copy between overlapping but different regions is an error.
    pub fn of(step: &Step, aliased: bool) -> Result<StepOrder, String> {
        let accesses =
            step.ops.iter().map(|op| checked_access(op, aliased)).collect::<Result<Vec<Access>, String>>()?;
        let mut order = StepOrder {
            follows: Vec::with_capacity(accesses.len()),
            dependents: vec![false; accesses.len()],
        };
        for (j, a) in accesses.iter().enumerate() {
            let mut mine = Vec::new();
            follows(&accesses[..j], a, |i, how| {
                if how != Follow::InOrder {
                    order.dependents[i] = true;
                }
                mine.push((i, how));
            });
            order.follows.push(mine);
        }
        Ok(order)
    }

    /// The earlier operations operation `op` follows, and how.
    pub fn follows(&self, op: usize) -> &[(usize, Follow)] {
        &self.follows[op]
    }

    /// Whether a later operation follows `op` by a data rule (segment by segment or whole).
    pub fn has_dependents(&self, op: usize) -> bool {
        self.dependents[op]
    }

    /// Operations in the step.
    pub fn len(&self) -> usize {
        self.follows.len()
    }

    /// Whether the step has no operations.
    pub fn is_empty(&self) -> bool {
        self.follows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Program, Region};
    use super::*;

    fn r(buf: Buf, off: usize, len: usize) -> Region {
        Region::new(buf, off, len)
    }

    fn order(build: impl FnOnce(&mut Step), aliased: bool) -> StepOrder {
        let mut p = Program::new();
        build(p.step());
        StepOrder::of(&p.steps[0], aliased).unwrap()
    }

    #[test]
    fn forwarding_and_in_place_exchange_go_segment_by_segment() {
        let fwd = order(
            |s| {
                s.recv(1, r(Buf::Output, 0, 8)).send(2, r(Buf::Output, 0, 8));
            },
            false,
        );
        assert_eq!(fwd.follows(1), &[(0, Follow::Segments)]);
        assert!(fwd.has_dependents(0) && !fwd.has_dependents(1));
        let out = r(Buf::Output, 0, 8);
        let swap = order(
            |s| {
                s.send(1, out).recv_reduce(1, out, out);
            },
            false,
        );
        assert_eq!(swap.follows(1), &[(0, Follow::Segments)]);
    }

    #[test]
    fn partial_overlap_waits_for_the_whole_and_disjoint_or_read_only_not_at_all() {
        let partial = order(
            |s| {
                s.recv(1, r(Buf::Output, 0, 8)).send(2, r(Buf::Output, 4, 8));
            },
            false,
        );
        assert_eq!(partial.follows(1), &[(0, Follow::Whole)]);
        let shorter = order(
            |s| {
                s.recv(1, r(Buf::Output, 0, 8)).send(2, r(Buf::Output, 0, 4));
            },
            false,
        );
        assert_eq!(shorter.follows(1), &[(0, Follow::Whole)]);
        let disjoint = order(
            |s| {
                s.recv(1, r(Buf::Output, 0, 8)).send(2, r(Buf::Output, 8, 8));
            },
            false,
        );
        assert!(disjoint.follows(1).is_empty() && !disjoint.has_dependents(0));
        let reads = order(
            |s| {
                s.send(1, r(Buf::Input, 0, 8)).send(2, r(Buf::Input, 0, 8));
            },
            false,
        );
        assert!(reads.follows(1).is_empty());
    }

    #[test]
    fn aliasing_joins_input_and_output() {
        let build = |s: &mut Step| {
            s.send(1, r(Buf::Input, 0, 8)).recv(2, r(Buf::Output, 0, 8));
        };
        assert!(order(build, false).follows(1).is_empty());
        assert_eq!(order(build, true).follows(1), &[(0, Follow::Segments)]);
    }

    #[test]
    fn channels_keep_their_order_but_a_send_and_a_receive_do_not() {
        let o = order(
            |s| {
                s.send(1, r(Buf::Input, 0, 4))
                    .send(1, r(Buf::Input, 4, 4))
                    .recv(1, r(Buf::Output, 0, 4))
                    .recv(1, r(Buf::Output, 4, 4))
                    .send(2, r(Buf::Input, 8, 4));
            },
            false,
        );
        assert_eq!(o.follows(1), &[(0, Follow::InOrder)]);
        assert!(o.follows(2).is_empty());
        assert_eq!(o.follows(3), &[(2, Follow::InOrder)]);
        assert!(o.follows(4).is_empty());
        // Order on a channel is not a data dependency.
        assert!(!o.has_dependents(0) && !o.has_dependents(2));
    }

    #[test]
    fn no_op_copies_follow_nothing_and_overlapping_copies_are_refused() {
        let out = r(Buf::Output, 0, 8);
        let o = order(
            |s| {
                s.recv(1, out).copy(out, out).copy(r(Buf::Input, 0, 0), r(Buf::Output, 0, 0));
            },
            false,
        );
        assert!(o.follows(1).is_empty() && o.follows(2).is_empty() && !o.has_dependents(0));
        // In place, input 0..8 and output 0..8 are the same memory: a no-op.
        let inplace = order(
            |s| {
                s.copy(r(Buf::Input, 0, 8), out);
            },
            true,
        );
        assert!(inplace.follows(0).is_empty());
        let mut p = Program::new();
        p.step().copy(r(Buf::Output, 0, 8), r(Buf::Output, 4, 8));
        assert!(StepOrder::of(&p.steps[0], false).unwrap_err().contains("overlapping"));
    }

    /// The rule as a brute-force statement over single elements, written independently.
    fn naive(ops: &[Op], aliased: bool, i: usize, j: usize) -> Option<Follow> {
        let elems = |r: Option<Region>| -> Vec<(usize, usize)> {
            r.map_or(Vec::new(), |r| {
                let space = match r.buf {
                    Buf::Input => 0,
                    Buf::Output if aliased => 0,
                    Buf::Output => 1,
                    Buf::Scratch => 2,
                };
                (r.off..r.off + r.len).map(|e| (space, e)).collect()
            })
        };
        let rw = |op: &Op| (op.reads().next(), op.writes());
        let noop = |op: &Op| match *op {
            Op::Copy { src, dst } => elems(Some(src)) == elems(Some(dst)),
            _ => false,
        };
        if noop(&ops[i]) || noop(&ops[j]) {
            return None;
        }
        let ((ri, wi), (rj, wj)) = (rw(&ops[i]), rw(&ops[j]));
        let hit = |a: Option<Region>, b: Option<Region>| {
            let (ea, eb) = (elems(a), elems(b));
            ea.iter().any(|x| eb.contains(x))
        };
        let clashes = [(wi, rj), (wi, wj), (ri, wj)];
        let clashing: Vec<_> = clashes.iter().filter(|(a, b)| hit(*a, *b)).collect();
        if !clashing.is_empty() {
            let same = clashing.iter().all(|(a, b)| elems(*a) == elems(*b));
            let len = |op: &Op| op.writes().map_or_else(|| op.reads().next().map_or(0, |r| r.len), |w| w.len);
            return Some(if same && len(&ops[i]) == len(&ops[j]) { Follow::Segments } else { Follow::Whole });
        }
        match (ops[i], ops[j]) {
            (Op::Send { peer: a, .. }, Op::Send { peer: b, .. })
            | (Op::Recv { peer: a, .. }, Op::Recv { peer: b, .. })
                if a == b =>
            {
                Some(Follow::InOrder)
            }
            _ => None,
        }
    }

    #[test]
    fn the_rule_agrees_with_a_brute_force_statement_on_random_steps() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..3000 {
            let mut step = Step::default();
            for _ in 0..1 + next(5) {
                let (kind, peer) = (next(4), next(3));
                let mut regions = [(0, 0, 0); 2];
                for (k, reg) in regions.iter_mut().enumerate() {
                    *reg = (next(3), next(6), next(5));
                    // The first region is written (never the input), the second read.
                    if k == 0 && reg.0 == 0 {
                        reg.0 = 1;
                    }
                }
                let buf = |b: usize| [Buf::Input, Buf::Output, Buf::Scratch][b];
                let dst = Region::new(buf(regions[0].0), regions[0].1, regions[0].2);
                let src = Region::new(buf(regions[1].0), regions[1].1, dst.len);
                match kind {
                    0 => {
                        step.send(peer, Region::new(src.buf, src.off, regions[1].2));
                    }
                    1 => {
                        step.recv(peer, dst);
                    }
                    2 => {
                        step.recv_reduce(peer, dst, src);
                    }
                    _ => {
                        step.copy(src, dst);
                    }
                }
            }
            for aliased in [false, true] {
                let Ok(o) = StepOrder::of(&step, aliased) else { continue };
                for j in 0..step.ops.len() {
                    let want: Vec<(usize, Follow)> =
                        (0..j).filter_map(|i| naive(&step.ops, aliased, i, j).map(|f| (i, f))).collect();
                    assert_eq!(o.follows(j), want.as_slice(), "{step:?} aliased {aliased} op {j}");
                }
            }
        }
    }
}
