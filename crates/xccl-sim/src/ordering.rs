//! The step ordering rule of `xccl::schedule::order` as the engine needs it: each operation
//! follows the earlier ones the rule names, less those that other orderings already imply,
//! found without comparing every pair of a step's operations. A direct exchange of 4096
//! ranks has 8190 operations in a step, every receive into one block: the rule orders each
//! after every earlier one (8.4 million orderings per rank); here each follows the last.
//!
//! Why the engine runs the same with fewer orderings. An operation that follows another
//! *hard* (any ordering but a send following segment by segment, which forwards) starts
//! only once the earlier has ended; one that forwards starts once the earlier has its first
//! segment or has ended, either after the earlier started, and ends no earlier than one
//! segment after it. So where `i` precedes `k` hard and `k` precedes `j` in any way, `j`
//! starts after `i` has ended, at an event handled later than `i`'s end: `i` is never the
//! last of `j`'s blockers, and without `i → j` the engine starts `j` at the very same event
//! (and chains of such orderings the same, by induction over the step). The orderings left
//! out are those of `i → j` where such a `k` exists, for some unit both touch:
//! - `i` wrote it and a later `k` wrote it again (`k` writes, so `i → k` is hard);
//! - `i` read it and a later `k` wrote it, and `j` writes it (hard for the same reason);
//! - `i` and `j` use one channel and a later `k` used it (two sends, ordered in turn, or two
//!   receives: hard either way).
//!
//! A forwarding send also follows the last operation that wrote exactly what it sends (if
//! still the last to write it, that one is kept anyway): the earlier ones it forwards wrote
//! the same region before it and ended no later, so the send's end, one segment after the
//! ends of what it forwards, is unchanged to the bit.
//!
//! Steps of up to [`PAIRWISE`] operations keep every ordering: comparing their pairs costs
//! less than finding the implied ones (and every ordering is as good as fewer).

use rustc_hash::FxHashMap;
use xccl::schedule::Step;
use xccl::schedule::order::{self, Access, Channel, Extent, Follow};

/// No operation.
const NONE: u32 = u32::MAX;

/// A step's orderings: per operation, in step order, the earlier ones it follows and how.
#[derive(Default)]
pub(crate) struct Orders {
    /// `(earlier operation, how)`, operation after operation, earlier ones first.
    pairs: Vec<(u32, Follow)>,
    /// Per operation, the end of its pairs in `pairs`.
    ends: Vec<u32>,
}

impl Orders {
    /// What operation `j` follows.
    pub(crate) fn of(&self, j: usize) -> &[(u32, Follow)] {
        let start = if j == 0 { 0 } else { self.ends[j - 1] as usize };
        &self.pairs[start..self.ends[j] as usize]
    }

    fn clear(&mut self) {
        self.pairs.clear();
        self.ends.clear();
    }

    /// Closes the list of the next operation.
    fn close(&mut self) {
        self.ends.push(self.pairs.len() as u32);
    }

    /// Every ordering of the rule, pair by pair (`xccl::schedule::order::StepOrder`): what
    /// the reduced orderings are checked against.
    #[cfg(test)]
    pub(crate) fn full(&mut self, step: &Step) -> Result<(), String> {
        let o = order::StepOrder::of(step, false)?;
        self.clear();
        for j in 0..o.len() {
            self.pairs.extend(o.follows(j).iter().map(|&(i, how)| (i as u32, how)));
            self.close();
        }
        Ok(())
    }
}

/// Works out the reduced orderings of steps, keeping its tables from one step to the next.
/// A step's regions cut each memory space into units (between consecutive region bounds);
/// per unit it knows the last operation that wrote it and those that read it since.
#[derive(Default)]
pub(crate) struct Orderer {
    acc: Vec<Access>,
    /// The bounds of the step's regions as `(space, unit)`, sorted: unit `u` lies between
    /// `bounds[u]` and `bounds[u + 1]`.
    bounds: Vec<(usize, usize)>,
    /// Per unit, its last writer.
    writer: Vec<u32>,
    /// Per unit, the head of its readers since its last writer in `links`.
    readers: Vec<u32>,
    /// Readers' lists: `(operation, next)`.
    links: Vec<(u32, u32)>,
    /// The last operation on each channel, as `(receives, peer)`.
    channel: FxHashMap<(bool, usize), u32>,
    /// The last writer of each exact region, as `(space, off, len)`.
    exact: FxHashMap<(usize, usize, usize), u32>,
    /// Per operation, the operation for which it was last found as a candidate.
    seen: Vec<u32>,
    cand: Vec<u32>,
}

/// Steps of up to this many operations are ordered pair by pair (every ordering of the
/// rule, fewer steps of work than finding those implied).
const PAIRWISE: usize = 8;

impl Orderer {
    /// Puts the orderings of `step` in `out`: the rule's, without those implied (all of
    /// them in steps of a few operations).
    pub(crate) fn order(&mut self, step: &Step, out: &mut Orders) -> Result<(), String> {
        self.acc.clear();
        for op in &step.ops {
            self.acc.push(order::checked_access(op, false)?);
        }
        if self.acc.len() > PAIRWISE {
            self.reduced(out);
            return Ok(());
        }
        out.clear();
        for (j, a) in self.acc.iter().enumerate() {
            for (i, e) in self.acc[..j].iter().enumerate() {
                if let Some(how) = order::follow(e, a) {
                    out.pairs.push((i as u32, how));
                }
            }
            out.close();
        }
        Ok(())
    }

    /// The orderings of the step whose accesses are `self.acc`, without those implied.
    fn reduced(&mut self, out: &mut Orders) {
        self.bounds.clear();
        for a in self.acc.iter().filter(|a| !a.is_noop()) {
            for e in [a.reads, a.writes].into_iter().flatten().filter(|e| e.len > 0) {
                self.bounds.extend([(e.space, e.off), (e.space, e.off + e.len)]);
            }
        }
        self.bounds.sort_unstable();
        self.bounds.dedup();
        self.writer.clear();
        self.writer.resize(self.bounds.len(), NONE);
        self.readers.clear();
        self.readers.resize(self.bounds.len(), NONE);
        self.links.clear();
        self.channel.clear();
        self.exact.clear();
        self.seen.clear();
        self.seen.resize(self.acc.len(), NONE);
        out.clear();
        for j in 0..self.acc.len() {
            let a = self.acc[j];
            if !a.is_noop() {
                self.candidates(j as u32, &a);
                for &i in &self.cand {
                    if let Some(how) = order::follow(&self.acc[i as usize], &a) {
                        out.pairs.push((i, how));
                    }
                }
                self.record(j as u32, &a);
            }
            out.close();
        }
    }

    /// The units of extent `e`.
    fn units(&self, e: Option<Extent>) -> std::ops::Range<usize> {
        let at = |unit| self.bounds.partition_point(|&b| b < unit);
        match e {
            Some(e) if e.len > 0 => at((e.space, e.off))..at((e.space, e.off + e.len)),
            _ => 0..0,
        }
    }

    fn channel_key(c: Channel) -> (bool, usize) {
        match c {
            Channel::To(p) => (false, p),
            Channel::From(p) => (true, p),
        }
    }

    /// The earlier operations `j` may have to follow, in step order: the last writers of
    /// the units it touches, the readers since of those it writes, the last on its channel,
    /// and for a send, the last writer of exactly its region.
    fn candidates(&mut self, j: u32, a: &Access) {
        self.cand.clear();
        let (reads, writes) = (self.units(a.reads), self.units(a.writes));
        let (seen, cand) = (&mut self.seen, &mut self.cand);
        let mut add = |i: u32| {
            if i != NONE && seen[i as usize] != j {
                seen[i as usize] = j;
                cand.push(i);
            }
        };
        for u in reads {
            add(self.writer[u]);
        }
        for u in writes {
            add(self.writer[u]);
            let mut l = self.readers[u];
            while l != NONE {
                let (i, next) = self.links[l as usize];
                add(i);
                l = next;
            }
        }
        if let Some(&i) = a.channel.and_then(|c| self.channel.get(&Self::channel_key(c))) {
            add(i);
        }
        if let (Some(r), None) = (a.reads, a.writes)
            && let Some(&i) = self.exact.get(&(r.space, r.off, r.len))
        {
            add(i);
        }
        self.cand.sort_unstable();
    }

    /// Operation `j` has read and written what `a` says.
    fn record(&mut self, j: u32, a: &Access) {
        for u in self.units(a.reads) {
            self.links.push((j, self.readers[u]));
            self.readers[u] = (self.links.len() - 1) as u32;
        }
        for u in self.units(a.writes) {
            self.writer[u] = j;
            self.readers[u] = NONE;
        }
        if let Some(w) = a.writes {
            self.exact.insert((w.space, w.off, w.len), j);
        }
        if let Some(c) = a.channel {
            self.channel.insert(Self::channel_key(c), j);
        }
    }
}

#[cfg(test)]
mod tests {
    use xccl::CollKind;
    use xccl::algo::Algorithm;
    use xccl::algo::tune::CostModel;
    use xccl::schedule::{Buf, Op, Region};

    use super::*;
    use crate::engine::{Call, simulate_ordered};
    use crate::sweep::shape_of;
    use crate::topology::Topology;

    /// Whether the engine starts `j` only once `i` has ended when `j` follows `i` by `how`.
    fn hard(step: &Step, j: usize, how: Follow) -> bool {
        !(how == Follow::Segments && matches!(step.ops[j], Op::Send { .. }))
    }

    /// Whether `to` follows `from` through the orderings `o`, the first one hard.
    fn implied(step: &Step, o: &Orders, from: usize, to: usize) -> bool {
        let mut reached = vec![false; o.ends.len()];
        for j in from + 1..o.ends.len() {
            reached[j] = o.of(j).iter().any(|&(i, how)| {
                let i = i as usize;
                (i == from && hard(step, j, how)) || (i > from && reached[i])
            });
        }
        reached[to]
    }

    #[test]
    fn every_ordering_left_out_is_implied_by_one_kept() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        let (mut orderer, mut full, mut reduced) = (Orderer::default(), Orders::default(), Orders::default());
        let (mut kept, mut all) = (0, 0);
        for _ in 0..20_000 {
            let mut step = Step::default();
            // Few buffers, regions and peers, so that operations clash often.
            let region = |next: &mut dyn FnMut(usize) -> usize, writes: bool| {
                let buf = [Buf::Input, Buf::Output, Buf::Scratch][if writes { 1 + next(2) } else { next(3) }];
                let (off, len) = [(0, 4), (0, 4), (4, 4), (0, 8), (2, 4), (4, 0)][next(6)];
                Region::new(buf, off, len)
            };
            for _ in 0..1 + next(24) {
                let (dst, src, peer) = (region(&mut next, true), region(&mut next, false), next(3));
                let src_same = Region::new(src.buf, src.off, dst.len);
                match next(5) {
                    0 | 1 => step.send(peer, src),
                    2 => step.recv(peer, dst),
                    3 => step.recv_reduce(peer, dst, if next(2) == 0 { dst } else { src_same }),
                    _ => step.copy(src_same, dst),
                };
            }
            let accesses: Result<Vec<_>, _> =
                step.ops.iter().map(|op| order::checked_access(op, false)).collect();
            if let Err(e) = full.full(&step) {
                assert_eq!(accesses, Err(e));
                continue;
            }
            orderer.acc = accesses.unwrap();
            orderer.reduced(&mut reduced);
            for j in 0..full.ends.len() {
                let r = reduced.of(j);
                assert!(r.iter().all(|p| full.of(j).contains(p)), "{step:?}: op {j} {r:?}");
                all += full.of(j).len();
                kept += r.len();
                for &(i, how) in full.of(j).iter().filter(|p| !r.contains(p)) {
                    assert!(implied(&step, &reduced, i as usize, j), "{step:?}: {i} -> {j} left out");
                    if !hard(&step, j, how) {
                        // What it forwards: one kept that ends no earlier.
                        let later = r.iter().any(|&(k, how)| {
                            how == Follow::Segments && implied(&step, &reduced, i as usize, k as usize)
                        });
                        assert!(later, "{step:?}: forwarding {i} -> {j} left out");
                    }
                }
            }
        }
        assert!(kept < all * 4 / 5, "{kept} of {all} orderings kept");
    }

    #[test]
    fn every_schedule_runs_alike_with_every_ordering_and_without_those_implied() {
        let costs = CostModel::default();
        let topos =
            [Topology::fat_tree(8, 3, 2.0, 32, 12.5e9, 0.5e-6).unwrap(), Topology::ring(32, 10e9, 1e-6)];
        let layouts: Vec<Vec<usize>> = [1, 2, 3, 5, 8, 13]
            .into_iter()
            .map(|n| (0..n).collect())
            .chain([(0..12).map(|r| r / 2).collect(), (0..9).map(|r| r % 3).collect()])
            .collect();
        let mut fewer = 0;
        for kind in CollKind::COLLECTIVES {
            for &algo in Algorithm::for_collective(kind) {
                for hosts in &layouts {
                    let n = hosts.len();
                    for bytes in [0, 4096, 3 << 20] {
                        let shape = shape_of(kind, bytes);
                        if !algo.supports(kind, n, &shape) {
                            continue;
                        }
                        let call = Call { kind, algo, root: n / 2, shape, esize: 4 };
                        for topo in &topos {
                            let (mut orderer, mut count) = (Orderer::default(), [0, 0]);
                            let mut run = |full: bool| {
                                simulate_ordered(topo, &costs, hosts, &call, 1, &mut |s, o| {
                                    if full { o.full(s) } else { orderer.order(s, o) }?;
                                    count[usize::from(full)] += o.pairs.len();
                                    Ok(())
                                })
                            };
                            let (reduced, all) = (run(false), run(true));
                            assert_eq!(
                                reduced, all,
                                "{kind} by {algo} on {n} ranks, {bytes} B, {}",
                                topo.name
                            );
                            fewer += usize::from(count[0] < count[1]);
                        }
                    }
                }
            }
        }
        assert!(fewer > 0, "no schedule had orderings to leave out");
    }
}
