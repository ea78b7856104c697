//! Reduction operators and the kernels that apply them.
//!
//! Kernels work on fixed-size chunks so that the compiler vectorises them, and they are
//! deterministic: the same inputs in the same order give the same bits. Integer `Sum` and
//! `Prod` wrap on overflow (as in NCCL and MPI); float `Min`/`Max` ignore NaN operands
//! (IEEE `minNum`/`maxNum`); `f16`/`bf16` are combined in `f32` and rounded after every
//! combination, so a ring and a tree may differ in the last bit, but each algorithm is
//! reproducible and every rank ends with the same bits.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A reduction operator.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum = 0,
    /// Product (wrapping for integers).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the number of ranks (truncating for integers).
    Avg = 4,
}

impl ReduceOp {
    /// Every operator, in tag order.
    pub const ALL: [ReduceOp; 5] =
        [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// Short lowercase name as nccl-tests prints it.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(tag as usize).copied()
    }

    /// The operator applied when two partial results meet (`Avg` combines as `Sum`).
    fn combiner(self) -> ReduceOp {
        if self == ReduceOp::Avg { ReduceOp::Sum } else { self }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "prod" | "product" => Ok(ReduceOp::Prod),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            "avg" | "mean" => Ok(ReduceOp::Avg),
            _ => Err(Error::Config(format!("unknown reduction '{s}': expected one of sum prod min max avg"))),
        }
    }
}

/// Elementwise arithmetic of one element type.
trait Arith: Element {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    /// `a / n`, truncating for integers.
    fn div_n(a: Self, n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty => $wide:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self {
                // The quotient of a value by a positive count always fits the type again.
                (<$wide>::from(a) / n as $wide) as $t
            }
        }
    )*};
}
int_arith!(i8 => i128, i32 => i128, i64 => i128, u8 => u128, u32 => u128, u64 => u128);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { a.max(b) }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self { a / n as $t }
        }
    )*};
}
float_arith!(f32, f64);

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().min(b.to_f32())) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().max(b.to_f32())) }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
half_arith!(f16, bf16);

/// Lanes per unrolled chunk: wide enough for AVX2 on every type, small enough for L1.
const LANES: usize = 64;

#[inline(always)]
fn zip_in_place<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    let mut d = dst.chunks_exact_mut(LANES);
    let mut s = src.chunks_exact(LANES);
    for (dc, sc) in (&mut d).zip(&mut s) {
        for i in 0..LANES {
            dc[i] = f(dc[i], sc[i]);
        }
    }
    for (x, y) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *x = f(*x, *y);
    }
}

#[inline(always)]
fn zip_into<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    let mut d = dst.chunks_exact_mut(LANES);
    let mut ac = a.chunks_exact(LANES);
    let mut bc = b.chunks_exact(LANES);
    for ((dc, x), y) in (&mut d).zip(&mut ac).zip(&mut bc) {
        for i in 0..LANES {
            dc[i] = f(x[i], y[i]);
        }
    }
    for ((o, x), y) in d.into_remainder().iter_mut().zip(ac.remainder()).zip(bc.remainder()) {
        *o = f(*x, *y);
    }
}

// The kernels below are also compiled for AVX2 and chosen at run time: the crate's baseline
// (x86-64's SSE2) halves their width, and they are the compute of every reduction.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn combine_typed<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => zip_in_place(dst, src, T::add),
        ReduceOp::Prod => zip_in_place(dst, src, T::mul),
        ReduceOp::Min => zip_in_place(dst, src, T::min),
        ReduceOp::Max => zip_in_place(dst, src, T::max),
    }
}

#[multiversion::multiversion(targets("x86_64+avx2"))]
fn combine_into_typed<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => zip_into(dst, a, b, T::add),
        ReduceOp::Prod => zip_into(dst, a, b, T::mul),
        ReduceOp::Min => zip_into(dst, a, b, T::min),
        ReduceOp::Max => zip_into(dst, a, b, T::max),
    }
}

fn finalize_typed<T: Arith>(op: ReduceOp, buf: &mut [T], nranks: usize) {
    if op == ReduceOp::Avg {
        for x in buf {
            *x = T::div_n(*x, nranks);
        }
    }
}

/// Reinterprets bytes as elements, refusing misaligned or ragged input instead of panicking.
fn typed<T: Element>(b: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(b).map_err(|e| {
        Error::Internal(format!("{} view of {} bytes at {:p}: {e:?}", T::DTYPE, b.len(), b.as_ptr()))
    })
}

fn typed_mut<T: Element>(b: &mut [u8]) -> Result<&mut [T]> {
    let (len, ptr) = (b.len(), b.as_ptr());
    bytemuck::try_cast_slice_mut(b)
        .map_err(|e| Error::Internal(format!("{} view of {len} bytes at {ptr:p}: {e:?}", T::DTYPE)))
}

/// `dst = dst ⊕ src` over raw bytes holding `dtype` elements.
pub(crate) fn combine(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::Internal(format!("combine of {} and {} bytes", dst.len(), src.len())));
    }
    crate::with_element!(dtype, T => combine_typed::<T>(op, typed_mut(dst)?, typed(src)?));
    Ok(())
}

/// `dst = a ⊕ b` over raw bytes holding `dtype` elements; `dst` must not overlap `a` or `b`.
pub(crate) fn combine_into(dtype: DType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    if dst.len() != a.len() || dst.len() != b.len() {
        return Err(Error::Internal(format!(
            "combine_into of {} = {} ⊕ {} bytes",
            dst.len(),
            a.len(),
            b.len()
        )));
    }
    crate::with_element!(dtype, T => combine_into_typed::<T>(op, typed_mut(dst)?, typed(a)?, typed(b)?));
    Ok(())
}

/// `dst = a ⊕ b` like [`combine_into`], but writing `dst` around the caches: for results much
/// larger than the caches, whose cache lines would only be fetched to be overwritten and then
/// evict data still needed. One pass: each chunk is computed in registers and streamed out
/// with non-temporal stores, fenced before returning, so that whatever is written after (an
/// acknowledgement to a peer that will read `dst`) is ordered after them. Elsewhere than on
/// x86-64 the stores are plain.
pub(crate) fn combine_into_uncached(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<()> {
    if dst.len() != a.len() || dst.len() != b.len() {
        return combine_into(dtype, op, dst, a, b);
    }
    crate::with_element!(dtype, T => combine_streamed_typed::<T, &[T]>(op, typed_mut(dst)?, typed(a)?, typed(b)?));
    Ok(())
}

/// `dst = a ⊕ b` written around the caches like [`combine_into_uncached`], and the same result
/// left in `b`, which stays in cache: for a result that is also passed on at once (written
/// ahead into a peer's memory, `exec/fused.rs`) while `dst` is too large to stay cached.
pub(crate) fn combine_into_uncached_keeping(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &mut [u8],
) -> Result<()> {
    if dst.len() != a.len() || dst.len() != b.len() {
        return combine_into(dtype, op, dst, a, b);
    }
    crate::with_element!(dtype, T => combine_streamed_typed::<T, Kept<'_, T>>(op, typed_mut(dst)?, typed(a)?, Kept(typed_mut(b)?)));
    Ok(())
}

/// The second operand of a streamed combination: read a chunk at a time, and where the
/// result is kept there too, overwritten with it.
trait Operand<T> {
    /// Its elements `at..at + n`.
    fn chunk(&self, at: usize, n: usize) -> &[T];
    /// Takes the result of elements `at..at + r.len()`.
    fn keep(&mut self, at: usize, r: &[T]);
}

impl<T> Operand<T> for &[T] {
    #[inline(always)]
    fn chunk(&self, at: usize, n: usize) -> &[T] {
        &self[at..at + n]
    }
    #[inline(always)]
    fn keep(&mut self, _: usize, _: &[T]) {}
}

/// An operand that also keeps the result.
struct Kept<'a, T>(&'a mut [T]);

impl<T: Copy> Operand<T> for Kept<'_, T> {
    #[inline(always)]
    fn chunk(&self, at: usize, n: usize) -> &[T] {
        &self.0[at..at + n]
    }
    #[inline(always)]
    fn keep(&mut self, at: usize, r: &[T]) {
        self.0[at..at + r.len()].copy_from_slice(r);
    }
}

/// Elements computed at a time by [`fold_streamed`], in registers: sixteen of any element
/// type are a whole number of 16-byte streaming stores.
const CHUNK: usize = 16;

#[multiversion::multiversion(targets("x86_64+avx2"))]
fn combine_streamed_typed<T: Arith, B: Operand<T>>(op: ReduceOp, dst: &mut [T], a: &[T], b: B) {
    match op.combiner() {
        ReduceOp::Sum | ReduceOp::Avg => fold_streamed(dst, a, b, T::add),
        ReduceOp::Prod => fold_streamed(dst, a, b, T::mul),
        ReduceOp::Min => fold_streamed(dst, a, b, T::min),
        ReduceOp::Max => fold_streamed(dst, a, b, T::max),
    }
}

/// `dst = a ⊕ b` (`f`, lengths equal), each chunk computed once and streamed to `dst`; the
/// elements before `dst`'s first 16-byte boundary and after its last whole chunk are written
/// plainly.
#[inline(always)]
fn fold_streamed<T: Arith>(dst: &mut [T], a: &[T], mut b: impl Operand<T>, f: impl Fn(T, T) -> T) {
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let (d_head, d_body) = dst.split_at_mut(head);
    let (a_head, a_body) = a.split_at(head);
    let plain = |d: &mut [T], x: &[T], at: usize, b: &mut dyn Operand<T>| {
        for ((o, x), y) in d.iter_mut().zip(x).zip(b.chunk(at, x.len())) {
            *o = f(*x, *y);
        }
        b.keep(at, d);
    };
    plain(d_head, a_head, 0, &mut b);
    let mut d = d_body.chunks_exact_mut(CHUNK);
    let mut x = a_body.chunks_exact(CHUNK);
    let mut at = head;
    for (dc, xc) in (&mut d).zip(&mut x) {
        let y = b.chunk(at, CHUNK);
        let mut r = [xc[0]; CHUNK];
        for i in 0..CHUNK {
            r[i] = f(xc[i], y[i]);
        }
        b.keep(at, &r);
        stream_chunk(bytemuck::cast_slice_mut(dc), bytemuck::cast_slice(&r));
        at += CHUNK;
    }
    plain(d.into_remainder(), x.remainder(), at, &mut b);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence has no preconditions (SSE is part of every x86-64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Writes `src` to `dst` (equal lengths, a multiple of 16, `dst` 16-byte aligned) with
/// non-temporal stores; elsewhere than on x86-64, plainly.
#[inline(always)]
fn stream_chunk(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        debug_assert!(
            dst.len() == src.len() && dst.len().is_multiple_of(16) && dst.as_ptr().align_offset(16) == 0
        );
        for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
            // SAFETY: both pieces hold 16 bytes; `d` is 16-byte aligned (the caller's `dst`
            // is, and every piece lies a multiple of 16 bytes into it), as the streaming
            // store needs; the load takes any alignment.
            unsafe {
                _mm_stream_si128(
                    d.as_mut_ptr().cast::<__m128i>(),
                    _mm_loadu_si128(s.as_ptr().cast::<__m128i>()),
                )
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Applies the final step of `op` to a fully combined result (`Avg` divides by `nranks`).
pub(crate) fn finalize(dtype: DType, op: ReduceOp, buf: &mut [u8], nranks: usize) -> Result<()> {
    crate::with_element!(dtype, T => finalize_typed::<T>(op, typed_mut(buf)?, nranks));
    Ok(())
}

/// Reduces `values` with `op` the naive way, left to right, in the element type: the
/// single-threaded reference that tests compare collectives against.
pub fn reference_reduce<T: Element>(op: ReduceOp, values: &[T]) -> Option<T> {
    let (first, rest) = values.split_first()?;
    let mut acc = [*first];
    for v in rest {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut acc);
        combine(T::DTYPE, op, bytes, bytemuck::bytes_of(v)).ok()?;
    }
    finalize(T::DTYPE, op, bytemuck::cast_slice_mut(&mut acc), values.len()).ok()?;
    Some(acc[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn combine_vec<T: Element>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
        let mut d = a.to_vec();
        combine(T::DTYPE, op, bytemuck::cast_slice_mut(&mut d), bytemuck::cast_slice(b)).unwrap();
        d
    }

    #[test]
    fn every_op_on_f32_matches_scalar_arithmetic() {
        let a: Vec<f32> = (0..200).map(|i| i as f32 - 50.0).collect();
        let b: Vec<f32> = (0..200).map(|i| (i % 7) as f32 * 3.0).collect();
        let check = |op, f: fn(f32, f32) -> f32| {
            let got = combine_vec(op, &a, &b);
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| f(*x, *y)).collect();
            assert_eq!(got, want, "{op}");
        };
        check(ReduceOp::Sum, |x, y| x + y);
        check(ReduceOp::Prod, |x, y| x * y);
        check(ReduceOp::Min, f32::min);
        check(ReduceOp::Max, f32::max);
        check(ReduceOp::Avg, |x, y| x + y);
    }

    #[test]
    fn integers_wrap_and_average_truncates() {
        assert_eq!(combine_vec(ReduceOp::Sum, &[250u8], &[10u8]), vec![4u8]);
        assert_eq!(combine_vec(ReduceOp::Prod, &[i8::MAX], &[2i8]), vec![-2i8]);
        assert_eq!(reference_reduce(ReduceOp::Avg, &[7i32, 8, 9, 1]), Some(6));
        assert_eq!(reference_reduce(ReduceOp::Avg, &[-7i32, 0]), Some(-3));
        assert_eq!(reference_reduce(ReduceOp::Avg, &[u64::MAX, 1]), Some(0));
    }

    #[test]
    fn combine_into_writes_a_fresh_buffer() {
        let a = [1.5f64, 2.0, -3.0];
        let b = [0.5f64, 4.0, 3.0];
        let mut d = [0f64; 3];
        combine_into(
            DType::F64,
            ReduceOp::Max,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&a),
            bytemuck::cast_slice(&b),
        )
        .unwrap();
        assert_eq!(d, [1.5, 4.0, 3.0]);
    }

    #[test]
    fn uncached_combination_equals_the_plain_one_at_any_alignment() {
        let a: Vec<u32> = (0..10_000).map(|i| i * 7 + 1).collect();
        let b: Vec<u32> = (0..10_000).map(|i| i ^ 0x55).collect();
        let (ab, bb) = (bytemuck::cast_slice::<u32, u8>(&a), bytemuck::cast_slice::<u32, u8>(&b));
        for skip in [0usize, 1, 3, 4] {
            let len = ab.len() - 4 * skip;
            let mut want = vec![0u32; 10_000];
            let mut got = vec![0u32; 10_000];
            let (w, g) = (
                bytemuck::cast_slice_mut::<u32, u8>(&mut want),
                bytemuck::cast_slice_mut::<u32, u8>(&mut got),
            );
            combine_into(DType::U32, ReduceOp::Sum, &mut w[4 * skip..], &ab[..len], &bb[..len]).unwrap();
            combine_into_uncached(DType::U32, ReduceOp::Sum, &mut g[4 * skip..], &ab[..len], &bb[..len])
                .unwrap();
            assert_eq!(want, got, "offset {skip} elements");
            let mut kept = bb[..len].to_vec();
            got.fill(0);
            let g = bytemuck::cast_slice_mut::<u32, u8>(&mut got);
            combine_into_uncached_keeping(
                DType::U32,
                ReduceOp::Sum,
                &mut g[4 * skip..],
                &ab[..len],
                &mut kept,
            )
            .unwrap();
            assert_eq!(want, got, "kept, offset {skip} elements");
            let want = &bytemuck::cast_slice::<u32, u8>(&want)[4 * skip..];
            assert_eq!(&kept[..], want, "the copy kept, offset {skip} elements");
        }
    }

    /// Every type and operator, the destination at every offset of a 16-byte line: the one-pass
    /// streamed kernels give, element by element, the naive reduction's bits (and the kept
    /// copy the same).
    #[test]
    fn streamed_kernels_equal_the_naive_reduction_for_every_type_and_operator() {
        fn check<T: Element>(op: ReduceOp) {
            let n = 1000;
            let a: Vec<T> = (0..n).map(|i| T::from_f64(((i * 7) % 23) as f64 - 9.5)).collect();
            let b: Vec<T> = (0..n).map(|i| T::from_f64(((i * 5) % 13) as f64 - 4.0)).collect();
            let want: Vec<T> =
                a.iter().zip(&b).map(|(x, y)| reference_reduce(op.combiner(), &[*x, *y]).unwrap()).collect();
            let size = std::mem::size_of::<T>();
            for skip in 0..16 / size {
                let len = n - skip;
                let (ab, bb) =
                    (bytemuck::cast_slice::<T, u8>(&a[..len]), bytemuck::cast_slice::<T, u8>(&b[..len]));
                let mut out = vec![T::from_f64(0.0); n];
                let o = &mut bytemuck::cast_slice_mut::<T, u8>(&mut out)[skip * size..];
                combine_into_uncached(T::DTYPE, op, o, ab, bb).unwrap();
                let bits = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
                assert_eq!(bits(&out[skip..]), bits(&want[..len]), "{} {op}, offset {skip}", T::DTYPE);
                let mut kept = b[..len].to_vec();
                out.fill(T::from_f64(0.0));
                let o = &mut bytemuck::cast_slice_mut::<T, u8>(&mut out)[skip * size..];
                combine_into_uncached_keeping(T::DTYPE, op, o, ab, bytemuck::cast_slice_mut(&mut kept))
                    .unwrap();
                assert_eq!(bits(&out[skip..]), bits(&want[..len]), "kept: {} {op}, offset {skip}", T::DTYPE);
                assert_eq!(
                    bits(&kept),
                    bits(&want[..len]),
                    "the copy kept: {} {op}, offset {skip}",
                    T::DTYPE
                );
            }
        }
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                crate::with_element!(dtype, T => check::<T>(op));
            }
        }
    }

    #[test]
    fn half_types_round_through_f32() {
        let a = [f16::from_f32(1.0), f16::from_f32(2048.0)];
        let b = [f16::from_f32(2.0), f16::from_f32(1.0)];
        let got = combine_vec(ReduceOp::Sum, &a, &b);
        // 2049 is not representable in f16 and rounds to even (2048).
        assert_eq!(got, vec![f16::from_f32(3.0), f16::from_f32(2048.0)]);
        let c = combine_vec(ReduceOp::Min, &[bf16::from_f32(-1.0)], &[bf16::from_f32(0.5)]);
        assert_eq!(c, vec![bf16::from_f32(-1.0)]);
    }

    #[test]
    fn ragged_or_misaligned_bytes_are_an_error_not_a_panic() {
        let mut d = [0u8; 6];
        assert!(combine(DType::F32, ReduceOp::Sum, &mut d, &[0u8; 6]).is_err());
        assert!(combine(DType::F32, ReduceOp::Sum, &mut d[..4], &[0u8; 5]).is_err());
    }
}
