//! One size of one collective for `xccl bench`: its buffers (ordinary heap memory, or
//! [`HostBuffer`]s with `--huge-pages`), the call, and the exact expected result.

use std::ops::{Deref, DerefMut};

use xccl::algo::Shape;
use xccl::schedule::Blocks;
use xccl::{Buffer, CollKind, Communicator, Element, HostBuffer, ReduceOp, reference_reduce};

use super::BenchArgs;

/// A benchmark buffer: a `Vec` by default, as most programs hold their data, a
/// [`HostBuffer`] on huge pages (`--huge-pages`), or a `Vec`'s elements from a chosen offset
/// within a page (`--page-offsets`).
pub(crate) enum Mem<T> {
    /// Ordinary heap memory.
    Heap(Vec<T>),
    /// Memory on 2 MiB pages.
    Huge(HostBuffer<T>),
    /// Heap memory whose elements `start..start + len` are the buffer.
    At { heap: Vec<T>, start: usize, len: usize },
}

/// Which of a case's buffers (`--page-offsets` places them apart).
#[derive(Copy, Clone)]
enum Which {
    Input,
    Output,
}

/// A page as `--page-offsets` counts it.
const PAGE: usize = 4096;

impl<T: Element> Mem<T> {
    /// The same elements in the memory `args` asks for.
    fn placed(self, args: &BenchArgs, which: Which) -> xccl::Result<Self> {
        let offset = args.page_offsets.map(|(input, output)| match which {
            Which::Input => input,
            Which::Output => output,
        });
        Ok(match (self, offset) {
            (Mem::Heap(v), _) if args.huge_pages => Mem::Huge(HostBuffer::from_slice(&v)?),
            (Mem::Heap(v), Some(offset)) if !v.is_empty() => Mem::at(&v, offset)?,
            (other, _) => other,
        })
    }

    /// `v`'s elements in new heap memory, the first `offset` bytes past a page boundary.
    fn at(v: &[T], offset: usize) -> xccl::Result<Self> {
        let es = size_of::<T>();
        if !offset.is_multiple_of(es) {
            return Err(xccl::Error::InvalidArgument {
                op: "--page-offsets",
                msg: format!("{offset} bytes is not a whole number of elements of {es} bytes"),
            });
        }
        // A page more than needed, so that some element lies at every offset of a page (a
        // `Vec` of elements is aligned to their size, as are the offset and the page, so the
        // gap is whole elements).
        let mut heap: Vec<T> = vec![T::from_f64(0.0); v.len() + PAGE / es];
        let gap = (offset + PAGE - heap.as_ptr() as usize % PAGE) % PAGE;
        let start = gap / es;
        heap[start..start + v.len()].copy_from_slice(v);
        Ok(Mem::At { heap, start, len: v.len() })
    }
}

impl<T> From<Vec<T>> for Mem<T> {
    fn from(v: Vec<T>) -> Self {
        Mem::Heap(v)
    }
}

impl<T> FromIterator<T> for Mem<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Mem::Heap(iter.into_iter().collect())
    }
}

impl<T> Default for Mem<T> {
    fn default() -> Self {
        Mem::Heap(Vec::new())
    }
}

impl<T> Deref for Mem<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Mem::Heap(v) => v,
            Mem::Huge(h) => h,
            Mem::At { heap, start, len } => &heap[*start..*start + *len],
        }
    }
}

impl<T> DerefMut for Mem<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Mem::Heap(v) => v,
            Mem::Huge(h) => h,
            Mem::At { heap, start, len } => &mut heap[*start..*start + *len],
        }
    }
}

// SAFETY: every variant is heap or mapped memory the value owns, which does not move when
// the value moves (a `Vec`'s elements stay where they are when the `Vec` is moved, and none
// is ever grown); the enum only hands out the slice of it the variant describes.
unsafe impl<T: Element> Buffer<T> for Mem<T> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

/// Small integers, so that every reduction is exact in every type; the pattern repeats
/// every 35 elements.
fn val<T: Element>(op: ReduceOp, rank: usize, i: usize) -> T {
    let v = match op {
        ReduceOp::Prod => 1 + usize::from((rank + i).is_multiple_of(5)),
        _ => (rank * 3 + i) % 7,
    };
    T::from_f64(v as f64)
}

/// One size of one collective: buffers, how to run it, and the exact expected output.
pub(crate) struct Case<T> {
    input: Mem<T>,
    output: Mem<T>,
    expected: Vec<T>,
    /// Elements as nccl-tests counts them.
    pub count: usize,
    /// The layout the call passes (what plans and algorithms are chosen by).
    pub shape: Shape,
    /// The blocks of an uneven call.
    counts: Vec<usize>,
    /// The result lands in `input` (in-place all-reduce).
    inplace: bool,
}

pub(crate) fn case<T: Element>(c: &Communicator, args: &BenchArgs, bytes: usize) -> xccl::Result<Case<T>> {
    let (n, r, root) = (c.size(), c.rank(), args.root);
    let es = size_of::<T>();
    let op = args.op;
    let elems = (bytes / es).max(1);
    let block = (elems / n).max(1);
    let reduced = |i: usize| -> T {
        let v: Vec<T> = (0..n).map(|q| val(op, q, i)).collect();
        reference_reduce(op, &v).unwrap_or_else(|| T::from_f64(0.0))
    };
    let code = |s: usize, d: usize, j: usize| T::from_f64(((s * 5 + d * 3 + j) % 11) as f64);
    let filler = T::from_f64(99.0);
    let inplace = args.inplace && args.coll.kind == CollKind::AllReduce;
    let k = match args.coll.kind {
        CollKind::AllReduce | CollKind::Reduce => {
            let table: Vec<T> = (0..35).map(reduced).collect();
            let is_out = args.coll.kind == CollKind::AllReduce || r == root;
            Case {
                input: (0..elems).map(|i| val(op, r, i)).collect(),
                output: vec![filler; if is_out && !inplace { elems } else { 0 }].into(),
                expected: if is_out { (0..elems).map(|i| table[i % 35]).collect() } else { Vec::new() },
                count: elems,
                shape: Shape::Count(elems),
                counts: Vec::new(),
                inplace,
            }
        }
        CollKind::Broadcast => Case {
            input: Mem::default(),
            output: (0..elems).map(|i| if r == root { val(op, root, i) } else { filler }).collect(),
            expected: (0..elems).map(|i| val(op, root, i)).collect(),
            count: elems,
            shape: Shape::Count(elems),
            counts: Vec::new(),
            inplace: false,
        },
        CollKind::AllGather | CollKind::Gather => {
            let is_out = args.coll.kind == CollKind::AllGather || r == root;
            Case {
                input: (0..block).map(|j| val(op, r, j)).collect(),
                output: vec![filler; if is_out { block * n } else { 0 }].into(),
                expected: if is_out {
                    (0..block * n).map(|k| val(op, k / block, k % block)).collect()
                } else {
                    Vec::new()
                },
                count: block * n,
                shape: Shape::Count(block),
                counts: Vec::new(),
                inplace: false,
            }
        }
        CollKind::ReduceScatter if !args.coll.uneven => {
            let table: Vec<T> = (0..35).map(reduced).collect();
            Case {
                input: (0..block * n).map(|i| val(op, r, i)).collect(),
                output: vec![filler; block].into(),
                expected: (0..block).map(|j| table[(r * block + j) % 35]).collect(),
                count: block * n,
                shape: Shape::Count(block),
                counts: Vec::new(),
                inplace: false,
            }
        }
        CollKind::ReduceScatter => {
            // Rank k's block holds 1 + k % 3 parts; the last block takes what is left over.
            let parts: Vec<usize> = (0..n).map(|k| 1 + k % 3).collect();
            let whole: usize = parts.iter().sum();
            let mut counts: Vec<usize> = parts.iter().map(|p| elems / whole * p).collect();
            counts[n - 1] += elems - counts.iter().sum::<usize>();
            let off: usize = counts[..r].iter().sum();
            let table: Vec<T> = (0..35).map(reduced).collect();
            Case {
                input: (0..elems).map(|i| val(op, r, i)).collect(),
                output: vec![filler; counts[r]].into(),
                expected: (0..counts[r]).map(|j| table[(off + j) % 35]).collect(),
                count: elems,
                shape: Shape::Scatter(Blocks::from_counts(&counts)),
                counts,
                inplace: false,
            }
        }
        CollKind::AllToAll => Case {
            input: (0..block * n).map(|k| code(r, k / block, k % block)).collect(),
            output: vec![filler; block * n].into(),
            expected: (0..block * n).map(|k| code(k / block, r, k % block)).collect(),
            count: block * n,
            shape: Shape::Count(block),
            counts: Vec::new(),
            inplace: false,
        },
        CollKind::Scatter => Case {
            input: if r == root {
                (0..block * n).map(|k| val(op, root, k)).collect()
            } else {
                Mem::default()
            },
            output: vec![filler; block].into(),
            expected: (0..block).map(|j| val(op, root, r * block + j)).collect(),
            count: block * n,
            shape: Shape::Count(block),
            counts: Vec::new(),
            inplace: false,
        },
        CollKind::Barrier => Case {
            input: Mem::default(),
            output: Mem::default(),
            expected: Vec::new(),
            count: 0,
            shape: Shape::Count(0),
            counts: Vec::new(),
            inplace: false,
        },
        CollKind::SendRecv => {
            let prev = (r + n - 1) % n;
            Case {
                input: (0..elems).map(|i| val(op, r, i)).collect(),
                output: vec![filler; elems].into(),
                expected: (0..elems).map(|i| val(op, prev, i)).collect(),
                count: elems,
                shape: Shape::Count(elems),
                counts: Vec::new(),
                inplace: false,
            }
        }
    };
    Ok(Case {
        input: k.input.placed(args, Which::Input)?,
        output: k.output.placed(args, Which::Output)?,
        ..k
    })
}

pub(crate) fn run_once<T: Element>(c: &Communicator, args: &BenchArgs, k: &mut Case<T>) -> xccl::Result<()> {
    let (op, root) = (args.op, args.root);
    match args.coll.kind {
        CollKind::AllReduce if args.inplace => c.all_reduce(&mut k.input, op),
        CollKind::AllReduce => c.all_reduce_into(&k.input, &mut k.output, op),
        CollKind::Reduce => c.reduce(&k.input, &mut k.output, op, root),
        CollKind::Broadcast => c.broadcast(&mut k.output, root),
        CollKind::AllGather => c.all_gather(&k.input, &mut k.output),
        CollKind::Gather => c.gather(&k.input, &mut k.output, root),
        CollKind::ReduceScatter if args.coll.uneven => {
            c.reduce_scatter_v(&k.input, &mut k.output, &k.counts, op)
        }
        CollKind::ReduceScatter => c.reduce_scatter(&k.input, &mut k.output, op),
        CollKind::Barrier => c.barrier(),
        CollKind::AllToAll => c.all_to_all(&k.input, &mut k.output),
        CollKind::Scatter => c.scatter(&k.input, &mut k.output, root),
        CollKind::SendRecv => {
            let (n, r) = (c.size(), c.rank());
            if n == 1 {
                k.output.copy_from_slice(&k.input);
                return Ok(());
            }
            let send = c.isend(std::mem::take(&mut k.input), (r + 1) % n, 0);
            c.recv(&mut k.output, (r + n - 1) % n, 0)?;
            k.input = send.wait()?;
            Ok(())
        }
    }
}

pub(crate) fn wrong<T: Element>(k: &Case<T>) -> usize {
    let result = if k.inplace { &k.input } else { &k.output };
    result.iter().zip(&k.expected).filter(|(a, b)| a != b).count()
}

/// The untimed correctness run on fresh buffers: the number of wrong elements.
pub(super) fn wrong_count<T: Element>(
    c: &Communicator,
    args: &BenchArgs,
    k: &mut Case<T>,
) -> xccl::Result<usize> {
    run_once(c, args, k)?;
    Ok(wrong(k))
}
