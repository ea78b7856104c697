//! The distinct steps of all ranks, compactly (the programs of thousands of ranks must fit):
//! a step is stored once however many ranks run it, its peers counted from the rank that
//! runs it (the ring's 4096 ranks run two distinct steps, direct exchange's too), and each
//! rank keeps its steps as runs of one step repeated.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};
use xccl::schedule::order::Follow;
use xccl::schedule::{Op, Program, Step};

use crate::ordering::Orders;

/// What an operation does (a receive combines what arrives when `reduce`).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Send,
    Recv { reduce: bool },
    Copy,
}

/// An operation as the engine needs it.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct COp {
    /// What it does.
    pub kind: Kind,
    /// Its peer, counted from the rank that runs it (`(peer - rank) mod n`).
    pub peer: u32,
    /// The bytes it moves.
    pub bytes: f64,
    /// Its `(op, how)` pairs: the earlier operations it follows.
    pub deps: (u32, u32),
    /// Its `(op, how)` pairs: the later operations that follow it.
    pub rev: (u32, u32),
}

/// The distinct steps.
#[derive(Default)]
pub(crate) struct Table {
    /// Per distinct step, the index of its first operation and of its first `(op, how)`
    /// pair; one more at the end.
    steps: Vec<(u32, u32)>,
    /// The operations of all steps, step after step.
    pub ops: Vec<COp>,
    /// `(op, how)` pairs: per operation the earlier ones it follows (its `deps` range), and
    /// the later ones that follow it (its `rev` range), indices within the step.
    deps: Vec<(u32, Follow)>,
    /// Step indices by a hash of their content.
    index: FxHashMap<u64, Vec<u32>>,
    /// The orderings of the step being added, and per operation a count, then a cursor,
    /// of its later operations.
    orders: Orders,
    later: Vec<u32>,
}

impl Table {
    pub(crate) fn new() -> Table {
        Table { steps: vec![(0, 0)], ..Table::default() }
    }

    /// The operations of step `s`.
    pub(crate) fn step(&self, s: u32) -> (usize, usize) {
        (self.steps[s as usize].0 as usize, self.steps[s as usize + 1].0 as usize)
    }

    /// The `(op, how)` pairs of step `s` in range `r` (an operation's `deps` or `rev`).
    pub(crate) fn pairs(&self, s: u32, r: (u32, u32)) -> &[(u32, Follow)] {
        let d = self.steps[s as usize].1 as usize;
        &self.deps[d + r.0 as usize..d + r.1 as usize]
    }

    /// Adds the steps of `p`, rank `rank`'s program among `n` (those not stored yet), each
    /// ordered by `order`, and returns them as runs of `(step index, times)`.
    pub(crate) fn add(
        &mut self,
        p: &Program,
        (rank, n): (usize, usize),
        esize: usize,
        order: &mut dyn FnMut(&Step, &mut Orders) -> Result<(), String>,
    ) -> Result<Vec<(u32, u32)>, String> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for step in &p.steps {
            order(step, &mut self.orders)?;
            let id = self.add_step(step, (rank, n), esize);
            match runs.last_mut() {
                Some((last, times)) if *last == id => *times += 1,
                _ => runs.push((id, 1)),
            }
        }
        Ok(runs)
    }

    /// Adds `step`, ordered by `self.orders`, unless stored already; returns its index.
    fn add_step(&mut self, step: &Step, (rank, ranks): (usize, usize), esize: usize) -> u32 {
        let (op0, dep0) = (self.ops.len(), self.deps.len());
        let n = step.ops.len();
        // Appended tentatively; dropped again when an equal step is stored.
        self.later.clear();
        self.later.resize(n + 1, 0);
        for (j, op) in step.ops.iter().enumerate() {
            let start = (self.deps.len() - dep0) as u32;
            for &(i, how) in self.orders.of(j) {
                self.deps.push((i, how));
                self.later[i as usize + 1] += 1;
            }
            let deps = (start, (self.deps.len() - dep0) as u32);
            let (kind, peer, len) = match *op {
                Op::Send { peer, src } => (Kind::Send, peer, src.len),
                Op::Recv { peer, dst, with } => (Kind::Recv { reduce: with.is_some() }, peer, dst.len),
                // No peer: its own rank, 0 counted from it.
                Op::Copy { dst, .. } => (Kind::Copy, rank, dst.len),
            };
            let peer = ((peer + ranks - rank) % ranks) as u32;
            self.ops.push(COp { kind, peer, bytes: (len * esize) as f64, deps, rev: (0, 0) });
        }
        // The later operations of each, in step order, after the earlier ones.
        let base = (self.deps.len() - dep0) as u32;
        for i in 0..n {
            self.later[i + 1] += self.later[i];
            let (from, to) = (base + self.later[i], base + self.later[i + 1]);
            self.ops[op0 + i].rev = (from, to);
        }
        self.deps.resize(self.deps.len() + self.later[n] as usize, (0, Follow::Whole));
        for j in 0..n {
            let (a, b) = self.ops[op0 + j].deps;
            for d in a..b {
                let (i, how) = self.deps[dep0 + d as usize];
                let at = base + self.later[i as usize];
                self.later[i as usize] += 1;
                self.deps[dep0 + at as usize] = (j as u32, how);
            }
        }
        let mut h = FxHasher::default();
        for op in &self.ops[op0..] {
            let k = match op.kind {
                Kind::Send => 0u8,
                Kind::Recv { reduce } => 1 + u8::from(reduce),
                Kind::Copy => 3,
            };
            (k, op.peer, op.bytes.to_bits(), op.deps, op.rev).hash(&mut h);
        }
        for &(i, how) in &self.deps[dep0..] {
            (i, how as u8).hash(&mut h);
        }
        let key = h.finish();
        let (new_ops, new_deps) = (&self.ops[op0..], &self.deps[dep0..]);
        let found = self.index.get(&key).and_then(|c| {
            c.iter().copied().find(|&s| {
                let (a, b) = self.step(s);
                let (d, e) = (self.steps[s as usize].1 as usize, self.steps[s as usize + 1].1 as usize);
                self.ops[a..b] == *new_ops && self.deps[d..e] == *new_deps
            })
        });
        match found {
            Some(s) => {
                self.ops.truncate(op0);
                self.deps.truncate(dep0);
                s
            }
            None => {
                let s = (self.steps.len() - 1) as u32;
                self.steps.push((self.ops.len() as u32, self.deps.len() as u32));
                self.index.entry(key).or_default().push(s);
                s
            }
        }
    }
}
