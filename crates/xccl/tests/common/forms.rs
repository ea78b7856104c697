//! Every form of every collective (blocking, in place, out of place, asynchronous, even and
//! uneven) at the awkward sizes of [`SIZES`], for any element type, checked on one rank
//! against the naive reference: run on every rank of any communicator, local, TCP or MPI.
//! The uneven gather and scatter run for every root, with empty blocks among unequal ones.

use xccl::{Communicator, ReduceOp};

use super::*;

/// Asserts `got[i] == want(i)` for all `i`, naming the first difference.
pub fn assert_each<T: Small>(got: &[T], want: impl Fn(usize) -> T, what: &str) {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
        panic!("{what}: element {i} of {} is {:?}, expected {:?}", got.len(), got[i], want(i));
    }
}

/// Calls `$f::<T>(args)` for every element type `T`.
macro_rules! every_dtype {
    ($f:ident $(, $arg:expr)*) => {{
        $f::<f32>($($arg),*);
        $f::<f64>($($arg),*);
        $f::<xccl::f16>($($arg),*);
        $f::<xccl::bf16>($($arg),*);
        $f::<i8>($($arg),*);
        $f::<i32>($($arg),*);
        $f::<i64>($($arg),*);
        $f::<u8>($($arg),*);
        $f::<u32>($($arg),*);
        $f::<u64>($($arg),*);
    }};
}
pub(crate) use every_dtype;

pub fn all_reduce_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let t = std::any::type_name::<T>();
    for &len in SIZES {
        for op in ReduceOp::ALL {
            let salt = len + op as usize;
            let want = |i| expected::<T>(op, n, i, salt);
            let mut buf = input::<T>(op, r, len, salt);
            c.all_reduce(&mut buf, op).unwrap();
            assert_each(&buf, want, &format!("all_reduce {t} {op} len {len} n {n} rank {r}"));

            let inp = input::<T>(op, r, len, salt);
            let mut out = vec![T::small(99); len];
            c.all_reduce_into(&inp, &mut out, op).unwrap();
            assert_each(&out, want, &format!("all_reduce_into {t} {op} len {len} n {n}"));
            assert_each(&inp, |i| val(op, r, i, salt), "all_reduce_into leaves its input alone");

            let back = c.all_reduce_async(input::<T>(op, r, len, salt), op).wait().unwrap();
            assert_each(&back, want, &format!("all_reduce_async {t} {op} len {len} n {n}"));
        }
    }
}

pub fn reduce_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let t = std::any::type_name::<T>();
    for root in 0..n {
        for &len in SIZES {
            for op in ReduceOp::ALL {
                let salt = len * 3 + op as usize + root;
                let want = |i| expected::<T>(op, n, i, salt);
                let mut buf = input::<T>(op, r, len, salt);
                c.reduce_in_place(&mut buf, op, root).unwrap();
                if r == root {
                    assert_each(&buf, want, &format!("reduce_in_place {t} {op} len {len} n {n} root {root}"));
                } else {
                    assert_each(&buf, |i| val(op, r, i, salt), "reduce_in_place leaves non-roots alone");
                }
                let inp = input::<T>(op, r, len, salt);
                let mut out = if r == root { vec![T::small(77); len] } else { Vec::new() };
                c.reduce(&inp, &mut out, op, root).unwrap();
                if r == root {
                    assert_each(&out, want, &format!("reduce {t} {op} len {len} n {n} root {root}"));
                }
            }
        }
    }
}

pub fn broadcast_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    for root in 0..n {
        for &len in SIZES {
            let salt = len + root;
            let mine = input::<T>(ReduceOp::Sum, r, len, salt);
            let mut buf = mine.clone();
            c.broadcast(&mut buf, root).unwrap();
            assert_each(
                &buf,
                |i| val(ReduceOp::Sum, root, i, salt),
                &format!("broadcast len {len} n {n} root {root}"),
            );
            let back = c.broadcast_async(mine, root).wait().unwrap();
            assert_each(&back, |i| val(ReduceOp::Sum, root, i, salt), "broadcast_async");
        }
    }
}

pub fn gather_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    for &len in SIZES {
        let from = |rank: usize, i: usize| val::<T>(ReduceOp::Sum, rank, i, len);
        let mine: Vec<T> = (0..len).map(|i| from(r, i)).collect();
        let mut out = vec![T::small(5); len * n];
        c.all_gather(&mine, &mut out).unwrap();
        assert_each(&out, |i| from(i / len.max(1), i % len.max(1)), &format!("all_gather len {len} n {n}"));
        let (_, out2) = c.all_gather_async(mine.clone(), vec![T::small(5); len * n]).wait().unwrap();
        assert_eq!(out, out2);

        // Uneven: rank k contributes (len + k) % 5 elements, some of them none.
        let counts: Vec<usize> = (0..n).map(|k| (len + k * 3) % 5).collect();
        let mine: Vec<T> = (0..counts[r]).map(|i| from(r, i)).collect();
        let mut out = vec![T::small(5); counts.iter().sum()];
        c.all_gather_v(&mine, &mut out, &counts).unwrap();
        let mut want = Vec::new();
        for (k, &cnt) in counts.iter().enumerate() {
            want.extend((0..cnt).map(|i| from(k, i)));
        }
        assert_eq!(out, want, "all_gather_v counts {counts:?}");

        for root in 0..n {
            let mine: Vec<T> = (0..len).map(|i| from(r, i)).collect();
            let mut out = if r == root { vec![T::small(5); len * n] } else { Vec::new() };
            c.gather(&mine, &mut out, root).unwrap();
            if r == root {
                assert_each(
                    &out,
                    |i| from(i / len.max(1), i % len.max(1)),
                    &format!("gather len {len} root {root}"),
                );
            }
            for counts in uneven_counts(len, n, root) {
                gather_v_form::<T>(c, &counts, root, len);
            }
        }
    }
}

/// Uneven layouts for `len` and `root` (the same on every rank): unequal blocks with empty
/// ones among them, and one non-empty block (the root's neighbour's).
pub fn uneven_counts(len: usize, n: usize, root: usize) -> [Vec<usize>; 2] {
    [
        (0..n).map(|k| (len + 3 * k + root) % 5 * (len / 4 + 1)).collect(),
        (0..n).map(|k| if k == (root + 1) % n { len + 1 } else { 0 }).collect(),
    ]
}

/// `gather_v` of `counts` to `root`, blocking and asynchronous, against the concatenation
/// of every rank's input; a non-root's output, of any length, is left alone.
pub fn gather_v_form<T: Small>(c: &Communicator, counts: &[usize], root: usize, salt: usize) {
    let (n, r) = (c.size(), c.rank());
    let from = |rank: usize, i: usize| val::<T>(ReduceOp::Sum, rank, i, salt + root);
    let mine: Vec<T> = (0..counts[r]).map(|i| from(r, i)).collect();
    let want: Vec<T> = (0..n).flat_map(|k| (0..counts[k]).map(move |i| from(k, i))).collect();
    let what = format!("gather_v {} counts {counts:?} root {root} rank {r}", std::any::type_name::<T>());
    let mut out = vec![T::small(5); if r == root { want.len() } else { 3 }];
    c.gather_v(&mine, &mut out, counts, root).unwrap();
    if r == root {
        assert_eq!(out, want, "{what}");
    } else {
        assert_each(&out, |_| T::small(5), &format!("{what}: a non-root's output is not written"));
    }
    let out = vec![T::small(6); if r == root { want.len() } else { 0 }];
    let (back, out) = c.gather_v_async(mine.clone(), out, counts, root).wait().unwrap();
    if r == root {
        assert_eq!(out, want, "{what} (async)");
    }
    assert_eq!(back, mine, "{what}: the input comes back untouched");
}

/// `scatter_v` of `counts` from `root`, blocking and asynchronous, against the blocks of the
/// root's input; a non-root's input, of any length, is not read.
pub fn scatter_v_form<T: Small>(c: &Communicator, counts: &[usize], root: usize, salt: usize) {
    let r = c.rank();
    let total: usize = counts.iter().sum();
    let off: usize = counts[..r].iter().sum();
    let all: Vec<T> = (0..total).map(|i| val(ReduceOp::Sum, root, i, salt + root)).collect();
    let what = format!("scatter_v {} counts {counts:?} root {root} rank {r}", std::any::type_name::<T>());
    let inp = if r == root { all.clone() } else { vec![T::small(1); 2] };
    let mut out = vec![T::small(3); counts[r]];
    c.scatter_v(&inp, &mut out, counts, root).unwrap();
    assert_eq!(out, all[off..off + counts[r]], "{what}");
    let inp = if r == root { all.clone() } else { Vec::new() };
    let (back, out) =
        c.scatter_v_async(inp.clone(), vec![T::small(4); counts[r]], counts, root).wait().unwrap();
    assert_eq!(out, all[off..off + counts[r]], "{what} (async)");
    assert_eq!(back, inp, "{what}: the input comes back untouched");
}

pub fn scatter_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    for root in 0..n {
        for &len in SIZES {
            let all: Vec<T> = (0..len * n).map(|i| val(ReduceOp::Sum, root, i, len)).collect();
            let inp = if r == root { all.clone() } else { Vec::new() };
            let mut out = vec![T::small(3); len];
            c.scatter(&inp, &mut out, root).unwrap();
            assert_each(&out, |i| all[r * len + i], &format!("scatter len {len} n {n} root {root}"));
            let (_, out2) = c.scatter_async(inp, vec![T::small(3); len], root).wait().unwrap();
            assert_eq!(out, out2);
            for counts in uneven_counts(len, n, root) {
                scatter_v_form::<T>(c, &counts, root, len);
            }
        }
    }
}

pub fn reduce_scatter_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let t = std::any::type_name::<T>();
    for &block in SIZES {
        for op in ReduceOp::ALL {
            let salt = block + op as usize;
            let inp = input::<T>(op, r, block * n, salt);
            let mut out = vec![T::small(9); block];
            c.reduce_scatter(&inp, &mut out, op).unwrap();
            assert_each(
                &out,
                |i| expected::<T>(op, n, r * block + i, salt),
                &format!("reduce_scatter {t} {op} block {block} n {n}"),
            );
            let (_, out2) = c.reduce_scatter_async(inp, vec![T::small(9); block], op).wait().unwrap();
            assert_eq!(out, out2);

            // Uneven: rank k's block holds (block + 7k + 3) % 5 parts of block / 5 + 1
            // elements, some of them none.
            let counts: Vec<usize> = (0..n).map(|k| (block + k * 7 + 3) % 5 * (block / 5 + 1)).collect();
            let off: usize = counts[..r].iter().sum();
            let inp = input::<T>(op, r, counts.iter().sum(), salt);
            let mut out = vec![T::small(9); counts[r]];
            c.reduce_scatter_v(&inp, &mut out, &counts, op).unwrap();
            let what = format!("reduce_scatter_v {t} {op} counts {counts:?} rank {r}");
            assert_each(&out, |i| expected::<T>(op, n, off + i, salt), &what);
            let (back, out2) = c
                .reduce_scatter_v_async(inp.clone(), vec![T::small(9); counts[r]], &counts, op)
                .wait()
                .unwrap();
            assert_eq!(out, out2, "{what} (async)");
            assert_eq!(back, inp, "{what}: the input comes back untouched");
        }
    }
}

pub fn all_to_all_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    // Element i of the block rank `s` sends to rank `d` encodes (s, d, i).
    let code = |s: usize, d: usize, i: usize| T::small(((s * 31 + d * 7 + i) % 100) as i64);
    for &block in SIZES {
        let inp: Vec<T> = (0..block * n).map(|k| code(r, k / block.max(1), k % block.max(1))).collect();
        let mut out = vec![T::small(1); block * n];
        c.all_to_all(&inp, &mut out).unwrap();
        assert_each(
            &out,
            |k| code(k / block.max(1), r, k % block.max(1)),
            &format!("all_to_all block {block} n {n}"),
        );
        let (_, out2) = c.all_to_all_async(inp, vec![T::small(1); block * n]).wait().unwrap();
        assert_eq!(out, out2);

        // Uneven: rank s sends (s + d + block) % 4 elements to rank d.
        let cnt = |s: usize, d: usize| (s + 2 * d + block) % 4;
        let send: Vec<usize> = (0..n).map(|d| cnt(r, d)).collect();
        let recv: Vec<usize> = (0..n).map(|s| cnt(s, r)).collect();
        let inp: Vec<T> = (0..n).flat_map(|d| (0..cnt(r, d)).map(move |i| code(r, d, i))).collect();
        let mut out = vec![T::small(1); recv.iter().sum()];
        c.all_to_all_v(&inp, &send, &mut out, &recv).unwrap();
        let want: Vec<T> = (0..n).flat_map(|s| (0..cnt(s, r)).map(move |i| code(s, r, i))).collect();
        assert_eq!(out, want, "all_to_all_v n {n} rank {r}");
    }
}

/// All-reduce counts whose halves (the messages of a 2-rank exchange) are pulled and folded,
/// so that the fused protocol writes them ahead: an even number of 256 KiB pieces, halves
/// that are not whole pieces (odd counts: the halves differ by one element), and one whose
/// halves fall either side of the 64 KiB pull threshold in `f32` (one rank's half is pulled
/// and written ahead, the other's streams).
pub const LARGE: &[usize] = &[1 << 19, 600_001, 32_767, 1_048_579];

/// Large all-reduces, in place and out of place, summed and maximised, checked element by
/// element against the naive reference. Out of place, the result lies between guard
/// elements that must stay untouched, and the input must come back unchanged: a rank that
/// writes its folded half into its peer's memory ahead (protocol `fused`) must write exactly
/// the range its peer named, with exactly the bytes the peer would have received.
pub fn large_all_reduce_forms<T: Small>(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    let t = std::any::type_name::<T>();
    const GUARD: usize = 4099;
    for &len in LARGE {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            for round in 0..2 {
                let salt = len + op as usize + round;
                let reference: Vec<T> = (0..len).map(|i| expected::<T>(op, n, i, salt)).collect();
                let want = |i: usize| reference[i];
                let mut buf = input::<T>(op, r, len, salt);
                c.all_reduce(&mut buf, op).unwrap();
                assert_each(&buf, want, &format!("in place {t} {op} len {len} n {n} rank {r}"));

                let inp = input::<T>(op, r, len, salt);
                let mut out = vec![T::small(77); len + 2 * GUARD];
                c.all_reduce_into(&inp, &mut out[GUARD..GUARD + len], op).unwrap();
                let what = format!("out of place {t} {op} len {len} n {n} rank {r}");
                assert_each(&out[GUARD..GUARD + len], want, &what);
                assert_each(&out[..GUARD], |_| T::small(77), &format!("{what}: the guard before"));
                assert_each(&out[GUARD + len..], |_| T::small(77), &format!("{what}: the guard after"));
                assert_each(&inp, |i| val(op, r, i, salt), &format!("{what}: the input"));
            }
        }
    }
}
