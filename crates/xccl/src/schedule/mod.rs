//! The schedule IR: an algorithm is a pure function that returns a [`Program`], and one
//! executor runs any program over any transport.
//!
//! A program is a list of [`Step`]s over three buffers ([`Buf`]): the caller's input, the
//! caller's output (the same memory for in-place calls) and scratch owned by the
//! communicator. Steps run one after another on each rank. Inside a step every operation may
//! proceed at once, with one rule ([`order`], its one statement, which the executor, the
//! verifier and the tuner all use): operations whose regions overlap run in step order, and
//! when the regions are identical the order is kept segment by segment rather than for the
//! whole region. So `Recv{parent, R}` followed by `Send{child, R}` in one step *forwards*:
//! each segment goes on to the child as soon as it has arrived from the parent, which is how
//! a pipelined tree or chain is written. Matching sends and receives between two ranks pair
//! up in step order, then in operation order within the step.

pub mod order;

use std::fmt;

/// Which buffer of a collective a region lives in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's input (read only).
    Input,
    /// The caller's output.
    Output,
    /// Scratch space owned by the communicator, `Program::scratch` elements long.
    Scratch,
}

/// A contiguous range of elements in one buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub off: usize,
    /// Number of elements.
    pub len: usize,
}

impl Region {
    /// `len` elements of `buf` starting at `off`.
    pub const fn new(buf: Buf, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.off + self.len
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[{}..{}]", self.buf, self.off, self.end())
    }
}

/// One operation of a step.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send the elements of `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Region,
    },
    /// Receive a message of `dst.len` elements from `peer` into `dst`; with `with`, store
    /// `with ⊕ message` instead (`with` may be `dst` itself).
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the result goes.
        dst: Region,
        /// The local operand the message is combined with, if any.
        with: Option<Region>,
    },
    /// Copy `src` to `dst` locally (skipped when they are the same memory).
    Copy {
        /// Source.
        src: Region,
        /// Destination, the same length.
        dst: Region,
    },
}

impl Op {
    /// The region the operation writes, if any.
    pub fn writes(&self) -> Option<Region> {
        match *self {
            Op::Send { .. } => None,
            Op::Recv { dst, .. } | Op::Copy { dst, .. } => Some(dst),
        }
    }

    /// The regions the operation reads.
    pub fn reads(&self) -> impl Iterator<Item = Region> {
        let (a, b) = match *self {
            Op::Send { src, .. } => (Some(src), None),
            Op::Recv { with, .. } => (with, None),
            Op::Copy { src, .. } => (Some(src), None),
        };
        a.into_iter().chain(b)
    }
}

/// Operations that may run concurrently (see the module docs for the one ordering rule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The operations, in order.
    pub ops: Vec<Op>,
}

impl Step {
    /// Adds `Send{peer, src}`.
    pub fn send(&mut self, peer: usize, src: Region) -> &mut Self {
        self.ops.push(Op::Send { peer, src });
        self
    }

    /// Adds a plain receive into `dst`.
    pub fn recv(&mut self, peer: usize, dst: Region) -> &mut Self {
        self.ops.push(Op::Recv { peer, dst, with: None });
        self
    }

    /// Adds a receive that stores `with ⊕ message` into `dst`.
    pub fn recv_reduce(&mut self, peer: usize, dst: Region, with: Region) -> &mut Self {
        self.ops.push(Op::Recv { peer, dst, with: Some(with) });
        self
    }

    /// Adds a local copy.
    pub fn copy(&mut self, src: Region, dst: Region) -> &mut Self {
        self.ops.push(Op::Copy { src, dst });
        self
    }
}

/// A schedule for one rank: steps over the input, output and `scratch` elements of scratch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Steps, run in order.
    pub steps: Vec<Step>,
    /// Scratch elements the program needs.
    pub scratch: usize,
}

impl Program {
    /// An empty program (nothing to do).
    pub fn new() -> Program {
        Program::default()
    }

    /// Appends an empty step and returns it for filling.
    pub fn step(&mut self) -> &mut Step {
        self.steps.push(Step::default());
        self.steps.last_mut().expect("a step was just pushed")
    }

    /// Checks that every region lies inside buffers of the given lengths (elements) and that
    /// every operation is well formed; says what is wrong otherwise.
    pub fn check(&self, rank: usize, nranks: usize, input: usize, output: usize) -> Result<(), String> {
        let within = |r: &Region| {
            let cap = match r.buf {
                Buf::Input => input,
                Buf::Output => output,
                Buf::Scratch => self.scratch,
            };
            if r.off.checked_add(r.len).is_some_and(|end| end <= cap) {
                Ok(())
            } else {
                Err(format!("region {r} outside a buffer of {cap} elements"))
            }
        };
        for (s, step) in self.steps.iter().enumerate() {
            for op in &step.ops {
                let at = |e: String| format!("rank {rank} step {s} {op:?}: {e}");
                op.reads().try_for_each(|r| within(&r)).map_err(at)?;
                if let Some(w) = op.writes() {
                    within(&w).map_err(at)?;
                    if w.buf == Buf::Input {
                        return Err(at("writes the read-only input".into()));
                    }
                }
                match *op {
                    Op::Send { peer, .. } | Op::Recv { peer, .. } if peer >= nranks || peer == rank => {
                        return Err(at(format!("peer {peer} invalid for rank {rank} of {nranks}")));
                    }
                    Op::Recv { dst, with: Some(w), .. } if w.len != dst.len => {
                        return Err(at("combine operand differs in length".into()));
                    }
                    Op::Copy { src, dst } if src.len != dst.len => {
                        return Err(at("copy between regions of different lengths".into()));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// A partition of a buffer into consecutive blocks, one per rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocks {
    offsets: Vec<usize>,
    lens: Vec<usize>,
}

impl Blocks {
    /// `count` elements split into `n` blocks as evenly as possible: the first `count % n`
    /// blocks hold one element more.
    pub fn even(count: usize, n: usize) -> Blocks {
        let (base, extra) = (count / n.max(1), count % n.max(1));
        Blocks::from_counts(&(0..n).map(|i| base + usize::from(i < extra)).collect::<Vec<_>>())
    }

    /// `n` blocks of `len` elements each.
    pub fn uniform(len: usize, n: usize) -> Blocks {
        Blocks::from_counts(&vec![len; n])
    }

    /// Consecutive blocks of the given lengths.
    pub fn from_counts(counts: &[usize]) -> Blocks {
        let mut offsets = Vec::with_capacity(counts.len());
        let mut off = 0;
        for &c in counts {
            offsets.push(off);
            off += c;
        }
        Blocks { offsets, lens: counts.to_vec() }
    }

    /// Number of blocks.
    pub fn count(&self) -> usize {
        self.lens.len()
    }

    /// Elements in all blocks together.
    pub fn total(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Length of block `i`.
    pub fn len_of(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// The largest block.
    pub fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// Block `i` as a region of `buf`.
    pub fn region(&self, buf: Buf, i: usize) -> Region {
        Region::new(buf, self.offsets[i], self.lens[i])
    }

    /// Blocks `a..b` (consecutive) as one region of `buf`.
    pub fn span(&self, buf: Buf, a: usize, b: usize) -> Region {
        let start = self.offsets.get(a).copied().unwrap_or_else(|| self.total());
        let end = if b > a { self.offsets[b - 1] + self.lens[b - 1] } else { start };
        Region::new(buf, start, end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_blocks_cover_the_count_with_at_most_one_element_difference() {
        for count in [0usize, 1, 7, 8, 13, 1000] {
            for n in 1..9 {
                let b = Blocks::even(count, n);
                assert_eq!(b.total(), count);
                assert_eq!(b.count(), n);
                let (lo, hi) = ((0..n).map(|i| b.len_of(i)).min(), b.max_len());
                assert!(hi - lo.unwrap() <= 1);
                for i in 1..n {
                    assert_eq!(b.region(Buf::Output, i).off, b.region(Buf::Output, i - 1).end());
                }
            }
        }
    }

    #[test]
    fn check_rejects_out_of_bounds_and_bad_peers() {
        let mut p = Program::new();
        p.step().send(1, Region::new(Buf::Input, 0, 4));
        assert!(p.check(0, 2, 4, 4).is_ok());
        assert!(p.check(0, 2, 3, 4).unwrap_err().contains("outside"));
        assert!(p.check(1, 2, 4, 4).unwrap_err().contains("peer 1 invalid"));
        let mut q = Program::new();
        q.step().recv(1, Region::new(Buf::Input, 0, 1));
        assert!(q.check(0, 2, 4, 4).unwrap_err().contains("read-only"));
    }
}
