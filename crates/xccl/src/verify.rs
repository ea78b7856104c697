//! The verifier: runs the schedules of every rank of a collective symbolically and proves
//! the collective's postcondition.
//!
//! Every element of every rank's buffers holds a *value*: the sorted list of the
//! contributions it is made of (element `i` of rank `q`'s input), or garbage. Sends copy
//! values into per-pair FIFO channels; receives take them out, checking that the message is
//! the one the receiver expects (same step, same message index, same length), and copy or
//! merge them in. Operations inside a step run in any order the step ordering rule allows
//! (`schedule::order`, the same statement the executor runs by: operations touching
//! overlapping memory follow each other; sends to one peer leave, and receives from one peer
//! arrive, in operation order); the verifier runs each operation whole, which is at least as
//! strict as the executor's segment-by-segment order, so a schedule that would deadlock
//! stops the run with the ranks stuck and what they wait for. At the end no message may be
//! left unread and every rank's output must hold exactly what the collective promises:
//! all-reduce, every contribution exactly once; reduce-scatter (even or uneven blocks), block
//! `i` fully reduced on rank `i`; all-gather and gather (even or uneven), every block from its
//! owner; scatter (even or uneven), block `i` of the root's input on rank `i`; barrier, every
//! rank heard (transitively) from every other; and so on.

use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;

use crate::algo::{self, Algorithm, Shape};
use crate::coll::CollKind;
use crate::schedule::order::StepOrder;
use crate::schedule::{Blocks, Buf, Op, Program, Region};

/// One contribution: element `index` of rank `rank`'s input.
fn contrib(rank: usize, index: usize) -> u32 {
    ((rank as u32) << 24) | index as u32
}

/// A symbolic element: the sorted contributions it holds, or `None` for garbage.
type Val = Option<Rc<[u32]>>;

fn single(rank: usize, index: usize) -> Val {
    Some(Rc::from([contrib(rank, index)].as_slice()))
}

fn merge(a: &Val, b: &Val) -> Val {
    let (a, b) = (a.as_ref()?, b.as_ref()?);
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    Some(out.into())
}

fn describe(v: &Val) -> String {
    match v {
        None => "garbage".into(),
        Some(c) => {
            let parts: Vec<String> =
                c.iter().take(6).map(|x| format!("r{}[{}]", x >> 24, x & 0xff_ffff)).collect();
            let more = if c.len() > 6 { format!(" +{} more", c.len() - 6) } else { String::new() };
            format!("{{{}{more}}}", parts.join(", "))
        }
    }
}

/// One collective call to verify.
#[derive(Clone, Debug)]
pub struct Case {
    /// The collective.
    pub kind: CollKind,
    /// The algorithm.
    pub algo: Algorithm,
    /// Host of each rank (its length is the number of ranks).
    pub hosts: Vec<usize>,
    /// Root of rooted collectives.
    pub root: usize,
    /// The data layout; for all-to-all-v, `exchange` gives each rank's instead.
    pub shape: Shape,
    /// All-to-all-v: `exchange[s][d]` elements go from rank `s` to rank `d`.
    pub exchange: Option<Vec<Vec<usize>>>,
    /// Input and output are the same memory (in-place all-reduce, reduce, broadcast).
    pub in_place: bool,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {} on {} ranks, root {}, {:?}",
            self.kind,
            self.algo,
            self.hosts.len(),
            self.root,
            self.shape
        )?;
        if self.in_place {
            write!(f, ", in place")?;
        }
        Ok(())
    }
}

/// What a verified run took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps of the longest program.
    pub steps: usize,
    /// Messages sent by all ranks together.
    pub messages: usize,
    /// Elements sent by all ranks together.
    pub elements: usize,
}

struct Msg {
    step: usize,
    index: usize,
    vals: Vec<Val>,
    /// The ranks the sender had heard from (itself included) when it sent.
    heard: Vec<bool>,
}

struct RankState {
    program: Program,
    input: Vec<Val>,
    output: Vec<Val>,
    scratch: Vec<Val>,
    step: usize,
    /// Operations of the current step already run.
    ran: Vec<bool>,
    heard: Vec<bool>,
}

impl RankState {
    /// The memory a region names, with in-place aliasing resolved: (buffer id, offset, len).
    fn place(&self, r: Region, in_place: bool) -> (u8, usize, usize) {
        let id = match r.buf {
            Buf::Input if in_place => 1,
            Buf::Input => 0,
            Buf::Output => 1,
            Buf::Scratch => 2,
        };
        (id, r.off, r.len)
    }

    fn read(&self, r: Region, in_place: bool) -> Vec<Val> {
        let (id, off, len) = self.place(r, in_place);
        let buf = match id {
            0 => &self.input,
            1 => &self.output,
            _ => &self.scratch,
        };
        buf[off..off + len].to_vec()
    }

    fn write(&mut self, r: Region, in_place: bool, vals: Vec<Val>) {
        let (id, off, _) = self.place(r, in_place);
        let buf = match id {
            0 => &mut self.input,
            1 => &mut self.output,
            _ => &mut self.scratch,
        };
        buf[off..off + vals.len()].clone_from_slice(&vals);
    }
}

/// Runs the case with the schedules of its algorithm; returns what it took, or what went
/// wrong.
pub fn verify(case: &Case) -> Result<Stats, String> {
    verify_programs(case, |rank, shape| {
        algo::build(case.kind, case.algo, rank, &case.hosts, case.root, shape).map_err(|e| e.to_string())
    })
}

/// Runs the case with the schedules `program(rank, shape)` returns (any schedule, for
/// example a broken one in a test).
pub fn verify_programs(
    case: &Case,
    program: impl Fn(usize, &Shape) -> Result<Program, String>,
) -> Result<Stats, String> {
    let n = case.hosts.len();
    let fail = |msg: String| Err(format!("{case}: {msg}"));
    let shapes: Vec<Shape> = (0..n)
        .map(|r| match &case.exchange {
            Some(m) => Shape::Exchange {
                send: Blocks::from_counts(&m[r]),
                recv: Blocks::from_counts(&(0..n).map(|s| m[s][r]).collect::<Vec<_>>()),
            },
            None => case.shape.clone(),
        })
        .collect();
    let (ins, outs) = buffer_lengths(case, n);
    let mut ranks = Vec::with_capacity(n);
    for r in 0..n {
        let program = program(r, &shapes[r]).map_err(|e| format!("{case}: rank {r}: {e}"))?;
        let out_len = if case.in_place { ins[r].max(outs[r]) } else { outs[r] };
        let in_len = if case.in_place { out_len } else { ins[r] };
        if let Err(e) = program.check(r, n, in_len, out_len) {
            return fail(e);
        }
        let input: Vec<Val> = (0..ins[r]).map(|i| single(r, i)).collect();
        let mut output = vec![None; out_len];
        if case.in_place {
            output[..ins[r]].clone_from_slice(&input);
        }
        let ops = program.steps.first().map_or(0, |s| s.ops.len());
        let mut heard = vec![false; n];
        heard[r] = true;
        ranks.push(RankState {
            scratch: vec![None; program.scratch],
            program,
            input,
            output,
            step: 0,
            ran: vec![false; ops],
            heard,
        });
    }
    let mut chan: Vec<VecDeque<Msg>> = (0..n * n).map(|_| VecDeque::new()).collect();
    let mut stats =
        Stats { steps: ranks.iter().map(|s| s.program.steps.len()).max().unwrap_or(0), ..Stats::default() };
    loop {
        let mut progress = false;
        for r in 0..n {
            progress |= advance(&mut ranks, r, &mut chan, case.in_place, &mut stats)?;
        }
        if ranks.iter().all(|s| s.step == s.program.steps.len()) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter(|(_, s)| s.step < s.program.steps.len())
                .map(|(r, s)| {
                    let waiting: Vec<String> = s.program.steps[s.step]
                        .ops
                        .iter()
                        .zip(&s.ran)
                        .filter(|(_, ran)| !**ran)
                        .map(|(op, _)| format!("{op:?}"))
                        .collect();
                    format!("rank {r} in step {} waits on {}", s.step, waiting.join(", "))
                })
                .collect();
            return fail(format!("deadlock: {}", stuck.join("; ")));
        }
    }
    if let Some((i, c)) = chan.iter().enumerate().find(|(_, c)| !c.is_empty()) {
        return fail(format!("{} message(s) from rank {} to rank {} never received", c.len(), i / n, i % n));
    }
    check_postcondition(case, &ranks, &shapes).map_err(|e| format!("{case}: {e}"))?;
    Ok(stats)
}

/// Runs whatever rank `r` can run now; true if anything ran.
fn advance(
    ranks: &mut [RankState],
    r: usize,
    chan: &mut [VecDeque<Msg>],
    in_place: bool,
    stats: &mut Stats,
) -> Result<bool, String> {
    let n = ranks.len();
    let mut progress = false;
    loop {
        let st = &ranks[r];
        if st.step == st.program.steps.len() {
            return Ok(progress);
        }
        let ops = st.program.steps[st.step].ops.clone();
        let order = StepOrder::of(&st.program.steps[st.step], in_place)
            .map_err(|e| format!("rank {r} step {}: {e}", st.step))?;
        let mut ran_one = false;
        for j in 0..ops.len() {
            if ranks[r].ran[j] {
                continue;
            }
            let st = &ranks[r];
            // Whatever the one ordering rule says op j follows must have run (the verifier runs
            // operations whole, at least as strict as the executor's segment order).
            if order.follows(j).iter().any(|&(i, _)| !st.ran[i]) {
                continue;
            }
            let step = st.step;
            match ops[j] {
                Op::Send { peer, src } => {
                    let index =
                        (0..j).filter(|&i| matches!(ops[i], Op::Send { peer: p, .. } if p == peer)).count();
                    let mut heard = st.heard.clone();
                    heard[r] = true;
                    let vals = st.read(src, in_place);
                    stats.messages += 1;
                    stats.elements += vals.len();
                    chan[r * n + peer].push_back(Msg { step, index, vals, heard });
                }
                Op::Recv { peer, dst, with } => {
                    let Some(msg) = chan[peer * n + r].front() else { continue };
                    let index =
                        (0..j).filter(|&i| matches!(ops[i], Op::Recv { peer: p, .. } if p == peer)).count();
                    if msg.step != step || msg.index != index {
                        return Err(format!(
                            "rank {r} step {step} expects message {index} from rank {peer}, which sent message {} of its step {}",
                            msg.index, msg.step
                        ));
                    }
                    if msg.vals.len() != dst.len {
                        return Err(format!(
                            "rank {r} step {step} expects {} elements from rank {peer}, which sent {}",
                            dst.len,
                            msg.vals.len()
                        ));
                    }
                    let msg = chan[peer * n + r].pop_front().expect("front exists");
                    let st = &mut ranks[r];
                    let vals = match with {
                        Some(w) => {
                            st.read(w, in_place).iter().zip(&msg.vals).map(|(a, b)| merge(a, b)).collect()
                        }
                        None => msg.vals,
                    };
                    st.write(dst, in_place, vals);
                    for (h, m) in st.heard.iter_mut().zip(&msg.heard) {
                        *h |= *m;
                    }
                }
                Op::Copy { src, dst } => {
                    let st = &mut ranks[r];
                    let vals = st.read(src, in_place);
                    st.write(dst, in_place, vals);
                }
            }
            ranks[r].ran[j] = true;
            ran_one = true;
            progress = true;
        }
        let st = &mut ranks[r];
        if st.ran.iter().all(|&x| x) {
            st.step += 1;
            let len = st.program.steps.get(st.step).map_or(0, |s| s.ops.len());
            st.ran = vec![false; len];
            progress = true;
        } else if !ran_one {
            return Ok(progress);
        }
    }
}

/// Input and output lengths of every rank, as the API validates them.
fn buffer_lengths(case: &Case, n: usize) -> (Vec<usize>, Vec<usize>) {
    use CollKind as K;
    let count = match case.shape {
        Shape::Count(c) => c,
        _ => 0,
    };
    (0..n)
        .map(|r| match (case.kind, &case.shape) {
            (K::AllReduce | K::Broadcast, _) => (count, count),
            (K::Reduce, _) => (count, if r == case.root || case.in_place { count } else { 0 }),
            (K::AllGather, Shape::Count(c)) => (*c, c * n),
            (K::AllGather, Shape::Gather(b)) => (b.len_of(r), b.total()),
            (K::ReduceScatter, Shape::Scatter(b)) => (b.total(), b.len_of(r)),
            (K::ReduceScatter, _) => (count * n, count),
            (K::AllToAll, _) => match &case.exchange {
                Some(m) => (m[r].iter().sum(), (0..n).map(|s| m[s][r]).sum()),
                None => (count * n, count * n),
            },
            (K::Scatter, Shape::Scatter(b)) => (if r == case.root { b.total() } else { 0 }, b.len_of(r)),
            (K::Gather, Shape::Gather(b)) => (b.len_of(r), if r == case.root { b.total() } else { 0 }),
            (K::Scatter, _) => (if r == case.root { count * n } else { 0 }, count),
            (K::Gather, _) => (count, if r == case.root { count * n } else { 0 }),
            _ => (0, 0),
        })
        .unzip()
}

fn all_of(n: usize, index: usize) -> Val {
    let mut v: Vec<u32> = (0..n).map(|q| contrib(q, index)).collect();
    v.sort_unstable();
    Some(v.into())
}

/// Checks what every rank's output holds against what the collective promises.
fn check_postcondition(case: &Case, ranks: &[RankState], shapes: &[Shape]) -> Result<(), String> {
    use CollKind as K;
    let n = ranks.len();
    let expect = |r: usize, i: usize, got: &Val, want: &Val| -> Result<(), String> {
        if got != want {
            return Err(format!("rank {r} output[{i}] holds {}, expected {}", describe(got), describe(want)));
        }
        Ok(())
    };
    let count = match case.shape {
        Shape::Count(c) => c,
        _ => 0,
    };
    for (r, st) in ranks.iter().enumerate() {
        let out = &st.output;
        match case.kind {
            K::AllReduce => (0..count).try_for_each(|i| expect(r, i, &out[i], &all_of(n, i)))?,
            K::Broadcast => (0..count).try_for_each(|i| expect(r, i, &out[i], &single(case.root, i)))?,
            K::Reduce if r == case.root => {
                (0..count).try_for_each(|i| expect(r, i, &out[i], &all_of(n, i)))?
            }
            K::Reduce if case.in_place => {
                (0..count).try_for_each(|i| expect(r, i, &out[i], &single(r, i)))?
            }
            K::Reduce => {}
            K::ReduceScatter | K::Scatter => {
                // Block `r` of the input: every rank's contribution exactly once, or the root's.
                let block = match &case.shape {
                    Shape::Scatter(b) => b.region(Buf::Input, r),
                    _ => Region::new(Buf::Input, r * count, count),
                };
                let want = |i| if case.kind == K::Scatter { single(case.root, i) } else { all_of(n, i) };
                (0..block.len).try_for_each(|i| expect(r, i, &out[i], &want(block.off + i)))?
            }
            K::Gather if r != case.root => {}
            K::AllGather | K::Gather => {
                let blocks = match &case.shape {
                    Shape::Gather(b) => b.clone(),
                    _ => Blocks::uniform(count, n),
                };
                for b in 0..n {
                    let reg = blocks.region(Buf::Output, b);
                    (0..reg.len)
                        .try_for_each(|j| expect(r, reg.off + j, &out[reg.off + j], &single(b, j)))?;
                }
            }
            K::AllToAll => {
                let Shape::Exchange { recv, .. } = &shapes[r] else {
                    let blocks = Blocks::uniform(count, n);
                    for s in 0..n {
                        let reg = blocks.region(Buf::Output, s);
                        let from = blocks.region(Buf::Input, r).off;
                        (0..reg.len).try_for_each(|j| {
                            expect(r, reg.off + j, &out[reg.off + j], &single(s, from + j))
                        })?;
                    }
                    continue;
                };
                for (s, shape) in shapes.iter().enumerate() {
                    let Shape::Exchange { send, .. } = shape else { unreachable!("all ranks exchange") };
                    let (reg, from) = (recv.region(Buf::Output, s), send.region(Buf::Input, r).off);
                    (0..reg.len)
                        .try_for_each(|j| expect(r, reg.off + j, &out[reg.off + j], &single(s, from + j)))?;
                }
            }
            K::Barrier => {
                if let Some(q) = st.heard.iter().position(|h| !h) {
                    return Err(format!("rank {r} left the barrier without hearing from rank {q}"));
                }
            }
            K::SendRecv => {}
        }
    }
    Ok(())
}

/// The cases `xccl verify` runs for one algorithm of one collective on `n` ranks: every
/// root, counts below, at and not dividing the world size, in place and out of place, and
/// uneven layouts for the "v" variants. Hosts come in groups of three.
pub fn cases(kind: CollKind, algo: Algorithm, n: usize) -> Vec<Case> {
    use CollKind as K;
    let hosts: Vec<usize> = (0..n).map(|r| r / 3).collect();
    let roots: Vec<usize> = match kind {
        K::Broadcast | K::Reduce | K::Scatter | K::Gather => (0..n).collect(),
        _ => vec![0],
    };
    let counts: &[usize] = if kind == K::Barrier { &[0] } else { &[1, 2 * n + 3] };
    let in_place: &[bool] = match kind {
        K::AllReduce | K::Reduce => &[false, true],
        K::Broadcast => &[true],
        _ => &[false],
    };
    let mut out = Vec::new();
    let base = |root: usize, shape: Shape, in_place: bool| Case {
        kind,
        algo,
        hosts: hosts.clone(),
        root,
        shape,
        exchange: None,
        in_place,
    };
    for &root in &roots {
        for &c in counts {
            for &ip in in_place {
                let shape = Shape::Count(c);
                if algo.supports(kind, n, &shape) {
                    out.push(base(root, shape, ip));
                }
            }
        }
    }
    if kind == K::AllGather {
        let shape = Shape::Gather(Blocks::from_counts(&(0..n).map(|k| (k * 7 + 3) % 4).collect::<Vec<_>>()));
        if algo.supports(kind, n, &shape) {
            out.push(base(0, shape, false));
        }
    }
    if matches!(kind, K::ReduceScatter | K::Scatter | K::Gather) {
        // Uneven blocks with empty ones among them, then every block empty but one (ranks
        // that send and receive nothing), then every block empty; for every root.
        let layouts = [
            (0..n).map(|i| (i * 7 + 3) % 5).collect::<Vec<_>>(),
            (0..n).map(|i| if i == n / 2 { 2 * n + 3 } else { 0 }).collect(),
            vec![0; n],
        ];
        for (&root, counts) in roots.iter().flat_map(|r| layouts.iter().map(move |c| (r, c))) {
            let blocks = Blocks::from_counts(counts);
            let shape = if kind == K::Gather { Shape::Gather(blocks) } else { Shape::Scatter(blocks) };
            if algo.supports(kind, n, &shape) {
                out.push(base(root, shape, false));
            }
        }
    }
    if kind == K::AllToAll {
        let m: Vec<Vec<usize>> = (0..n).map(|s| (0..n).map(|d| (s + 2 * d) % 3).collect()).collect();
        let mut c =
            base(0, Shape::Exchange { send: Blocks::uniform(0, 0), recv: Blocks::uniform(0, 0) }, false);
        c.exchange = Some(m);
        if algo.supports(kind, n, &c.shape) {
            out.push(c);
        }
    }
    out
}

/// The outcome of one algorithm of one collective on one world size.
#[derive(Clone, Debug)]
pub struct Cell {
    /// The collective.
    pub kind: CollKind,
    /// The algorithm.
    pub algo: Algorithm,
    /// World size.
    pub n: usize,
    /// Cases run (0: the algorithm does not apply to this size).
    pub cases: usize,
    /// The first failure, if any.
    pub failure: Option<String>,
}

/// The collectives with schedules, in the order `xccl verify` reports them.
pub const COLLECTIVES: [CollKind; 9] = CollKind::COLLECTIVES;

/// Verifies every algorithm of every collective on world sizes `1..=max_n`, calling `report`
/// with each cell as it is done.
pub fn verify_all(max_n: usize, mut report: impl FnMut(Cell)) {
    for kind in COLLECTIVES {
        for &algo in Algorithm::for_collective(kind) {
            for n in 1..=max_n {
                let cases = cases(kind, algo, n);
                let failure = cases.iter().find_map(|c| verify(c).err());
                report(Cell { kind, algo, n, cases: cases.len(), failure });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(kind: CollKind, algo: Algorithm, n: usize, count: usize) -> Case {
        Case {
            kind,
            algo,
            hosts: vec![0; n],
            root: 0,
            shape: Shape::Count(count),
            exchange: None,
            in_place: false,
        }
    }

    #[test]
    fn a_correct_ring_passes() {
        let stats = verify(&case(CollKind::AllReduce, Algorithm::Ring, 5, 13)).unwrap();
        assert_eq!(stats.steps, 8);
        assert_eq!(stats.messages, 5 * 8);
        assert_eq!(stats.elements, 2 * 4 * 13);
    }

    /// A ring all-reduce with one deliberate mistake made by `break_it`.
    fn broken(n: usize, break_it: impl Fn(usize, &mut Program)) -> Result<Stats, String> {
        let c = case(CollKind::AllReduce, Algorithm::Ring, n, 2 * n + 1);
        verify_programs(&c, |r, shape| {
            let mut p = algo::build(c.kind, c.algo, r, &c.hosts, 0, shape).map_err(|e| e.to_string())?;
            break_it(r, &mut p);
            Ok(p)
        })
    }

    #[test]
    fn broken_schedules_are_caught() {
        // Rank 1 combines its own contribution twice instead of passing the sum on.
        let e = broken(4, |r, p| {
            if r == 1
                && let Op::Send { src, .. } = &mut p.steps[1].ops[0]
            {
                src.buf = Buf::Input;
            }
        })
        .unwrap_err();
        assert!(e.contains("expected"), "{e}");
        // Rank 2 forgets to send in its last all-gather step: rank 3 waits forever.
        let e = broken(4, |r, p| {
            if r == 2 {
                let last = p.steps.len() - 1;
                p.steps[last].ops.remove(0);
            }
        })
        .unwrap_err();
        assert!(e.contains("deadlock") && e.contains("rank 3"), "{e}");
        // Rank 0 receives before it sends in every step, and so does everyone: with the
        // receive ordered first on the same region, each waits for its neighbour.
        let e = broken(3, |_, p| {
            for step in &mut p.steps {
                step.ops.reverse();
                if let [Op::Recv { dst, .. }, Op::Send { src, .. }] = step.ops.as_mut_slice() {
                    *src = *dst;
                }
            }
        })
        .unwrap_err();
        assert!(e.contains("deadlock"), "{e}");
        // Rank 1 sends one element too many (of a block in the middle of its buffer).
        let e = broken(3, |r, p| {
            if r == 1
                && let Op::Send { src, .. } = &mut p.steps[0].ops[0]
            {
                src.len += 1;
            }
        })
        .unwrap_err();
        assert!(e.contains("expects") && e.contains("elements"), "{e}");
        // An extra message nobody receives.
        let e = broken(2, |r, p| {
            if r == 0 {
                p.step().send(1, Region::new(Buf::Input, 0, 1));
            }
        })
        .unwrap_err();
        assert!(e.contains("never received") || e.contains("expects"), "{e}");
    }

    #[test]
    fn uneven_reduce_scatter_is_checked_block_by_block() {
        let mut c = case(CollKind::ReduceScatter, Algorithm::Ring, 5, 0);
        c.shape = Shape::Scatter(Blocks::from_counts(&[3, 0, 5, 1, 2]));
        let stats = verify(&c).unwrap();
        assert_eq!(stats.elements, 4 * 11);
        // Rank 2 leaves its own contribution out of its last combine: its block misses it.
        let e = verify_programs(&c, |r, shape| {
            let mut p = algo::build(c.kind, c.algo, r, &c.hosts, 0, shape).map_err(|e| e.to_string())?;
            if r == 2 {
                let last = p.steps.len() - 1;
                if let Op::Recv { with, .. } = &mut p.steps[last].ops[1] {
                    *with = None;
                }
            }
            Ok(p)
        })
        .unwrap_err();
        assert!(e.contains("rank 2 output[0]") && e.contains("expected"), "{e}");
        // Schedules of the even layout with the same total do not fit the uneven buffers.
        let even = Shape::Count(11 / 5);
        let e = verify_programs(&c, |r, _| {
            algo::build(c.kind, c.algo, r, &c.hosts, 0, &even).map_err(|e| e.to_string())
        })
        .unwrap_err();
        assert!(e.contains("outside") || e.contains("expects"), "{e}");
        // `xccl verify` runs three uneven layouts for every algorithm.
        for &algo in Algorithm::for_collective(CollKind::ReduceScatter) {
            let uneven = cases(CollKind::ReduceScatter, algo, 5)
                .into_iter()
                .filter(|c| matches!(c.shape, Shape::Scatter(_)))
                .count();
            assert_eq!(uneven, 3, "{algo}");
        }
    }

    #[test]
    fn merging_keeps_duplicates_visible() {
        let a = single(0, 1);
        assert_eq!(merge(&a, &a).unwrap().len(), 2);
        assert_eq!(merge(&a, &None), None);
    }
}
