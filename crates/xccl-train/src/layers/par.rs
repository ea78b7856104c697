//! The fused kernels on the rank's threads: rayon's pool, the one candle's matrix products
//! use (`xccl train` sizes it to the threads of a rank).
//!
//! A kernel's output is a sequence of rows; [`rows`] cuts them into parts of at least
//! [`GRAIN`] elements and builds the parts on the pool's threads, [`sum_rows`] does the same
//! for a sum over rows. Parts have a fixed size, so results do not depend on the number of
//! threads: an element-wise row is computed the same way in any part, and partial sums are
//! added in part order. With one thread (or one part) the output is built in place, with no
//! extra pass over it.

use std::ops::Range;

use rayon::prelude::*;

/// Fewest elements in a part: below it, handing work to another thread costs more than the
/// work.
pub const GRAIN: usize = 1 << 15;

/// Rows per part for rows of `unit` elements.
fn rows_per_part(unit: usize) -> usize {
    (GRAIN / unit.max(1)).max(1)
}

/// `rows · unit` values: `f(rows, out)` appends the values of rows `rows` to `out`.
pub fn rows(rows: usize, unit: usize, f: impl Fn(Range<usize>, &mut Vec<f32>) + Sync) -> Vec<f32> {
    let per = rows_per_part(unit);
    if rayon::current_num_threads() <= 1 || rows <= per {
        let mut out = Vec::with_capacity(rows * unit);
        f(0..rows, &mut out);
        return out;
    }
    let mut out = vec![0.0f32; rows * unit];
    out.par_chunks_mut(per * unit.max(1)).enumerate().for_each(|(i, part)| {
        let first = i * per;
        let mut v = Vec::with_capacity(part.len());
        f(first..first + part.len() / unit.max(1), &mut v);
        part.copy_from_slice(&v);
    });
    out
}

/// The sum over rows `0..rows` (of `unit` elements each) of `width` values: `f(rows, acc)`
/// adds the contribution of rows `rows` into `acc`.
pub fn sum_rows(
    rows: usize,
    unit: usize,
    width: usize,
    f: impl Fn(Range<usize>, &mut [f32]) + Sync,
) -> Vec<f32> {
    let per = rows_per_part(unit);
    let parts = rows.div_ceil(per).max(1);
    let part = |p: usize| {
        let mut acc = vec![0.0f32; width];
        f(p * per..((p + 1) * per).min(rows), &mut acc);
        acc
    };
    let partial: Vec<Vec<f32>> = if rayon::current_num_threads() <= 1 || parts == 1 {
        (0..parts).map(part).collect()
    } else {
        (0..parts).into_par_iter().map(part).collect()
    };
    let mut total = vec![0.0f32; width];
    for acc in partial {
        total.iter_mut().zip(acc).for_each(|(t, a)| *t += a);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_give_the_sequential_result_on_any_number_of_threads() {
        let unit = 7;
        let n = 3 * GRAIN / unit + 5;
        let x: Vec<f32> = (0..n * unit).map(|i| ((i * 31) % 17) as f32 * 0.25 - 2.0).collect();
        let build = || {
            rows(n, unit, |r, out| out.extend(x[r.start * unit..r.end * unit].iter().map(|v| v * 2.0 + 1.0)))
        };
        let sum = || {
            sum_rows(n, unit, unit, |r, acc| {
                for row in x[r.start * unit..r.end * unit].chunks_exact(unit) {
                    acc.iter_mut().zip(row).for_each(|(a, v)| *a += v);
                }
            })
        };
        let expect: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let (built, summed) = pool.install(|| (build(), sum()));
            assert_eq!(built, expect, "{threads} threads");
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(sum);
            assert_eq!(summed, one, "{threads} threads: the same sum bit for bit");
            // Against a naive column sum (the parts' order changes rounding only).
            for (c, s) in summed.iter().enumerate() {
                let naive: f32 = x.iter().skip(c).step_by(unit).sum();
                assert!((s - naive).abs() <= 1e-3 * naive.abs().max(1.0), "column {c}: {s} vs {naive}");
            }
        }
    }
}
