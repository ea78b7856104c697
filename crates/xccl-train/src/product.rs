//! Matrix products over row-major `f32` slices, straight through the `gemm` crate's kernels
//! (the ones candle's products use), on the rank's threads: into a new vector that is never
//! zero-filled first ([`product`]), or into a buffer, overwriting or adding to what it holds
//! ([`product_into`]). A linear layer's forward starts from its bias, its weight's gradient
//! adds into a gradient bucket, and neither pays for a zeroed output or a separate pass.

/// One operand of a product: a `rows × cols` matrix read from row-major `values`, either as
/// stored or transposed (`Matrix::new(v, r, c).t()` is the `c × r` transpose of the stored
/// `r × c` matrix, read in place).
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    /// Step between rows and between columns, in elements.
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Matrix<'a> {
    /// The `rows × cols` matrix whose row-major elements are `values` (checked by the
    /// products: `values` must hold exactly `rows · cols` elements).
    pub fn new(values: &'a [f32], rows: usize, cols: usize) -> Matrix<'a> {
        Matrix { values, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// Its transpose, read from the same elements.
    pub fn t(self) -> Matrix<'a> {
        Matrix {
            values: self.values,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }
}

/// How [`product_into`] treats what the output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `dst = a·b`: what `dst` held is never read.
    Overwrite,
    /// `dst += a·b`.
    Add,
}

fn check(len: usize, a: &Matrix, b: &Matrix) -> candle_core::Result<()> {
    let whole = |m: &Matrix| m.values.len() == m.rows * m.cols;
    if a.cols != b.rows || !whole(a) || !whole(b) || len != a.rows * b.cols {
        candle_core::bail!(
            "product of [{}, {}] ({} elements) and [{}, {}] ({} elements) into {len} elements",
            a.rows,
            a.cols,
            a.values.len(),
            b.rows,
            b.cols,
            b.values.len()
        );
    }
    Ok(())
}

/// `dst = a·b` or `dst += a·b` ([`Output`]), `dst` row-major `[a.rows, b.cols]`.
pub fn product_into(dst: &mut [f32], a: Matrix, b: Matrix, how: Output) -> candle_core::Result<()> {
    check(dst.len(), &a, &b)?;
    // SAFETY: `check` proved that dst holds a.rows · b.cols elements and that a and b hold
    // exactly the elements their shapes and strides reach; dst is a unique borrow, so it
    // aliases neither operand.
    unsafe { raw(dst.as_mut_ptr(), a, b, how) };
    Ok(())
}

/// `a·b`, row-major `[a.rows, b.cols]`, in a new vector.
pub fn product(a: Matrix, b: Matrix) -> candle_core::Result<Vec<f32>> {
    let len = a.rows * b.cols;
    check(len, &a, &b)?;
    let mut out = Vec::with_capacity(len);
    // SAFETY: the vector's capacity is len = a.rows · b.cols elements and the operands hold
    // exactly what their shapes and strides reach (`check`). With `Output::Overwrite` the
    // kernel writes every element of the output and reads none before writing it (gemm
    // zeroes alpha when read_dst is false, and its kernels then store beta·a·b without
    // loading the destination; a product over an empty inner dimension stores zeros);
    // `products_never_read_an_overwritten_output` checks this on an output full of NaN,
    // which any read would carry into the result. Hence all len elements are initialised
    // before set_len.
    unsafe {
        raw(out.as_mut_ptr(), a, b, Output::Overwrite);
        out.set_len(len);
    }
    Ok(out)
}

/// # Safety
/// `dst` is valid for writes of `a.rows · b.cols` elements (and, for `Output::Add`,
/// initialised reads of them), aliases neither operand, and each operand's values hold
/// exactly `rows · cols` elements.
unsafe fn raw(dst: *mut f32, a: Matrix, b: Matrix, how: Output) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: forwarded from the caller; the strides are those of row-major dst [m, n]
    // and of the operands as `Matrix` records them.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            how == Output::Add,
            a.values.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.values.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &Matrix, b: &Matrix) -> Vec<f32> {
        let at = |m: &Matrix, i: usize, j: usize| m.values[i * m.row_stride + j * m.col_stride];
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                out[i * b.cols + j] = (0..a.cols).map(|p| at(a, i, p) * at(b, p, j)).sum();
            }
        }
        out
    }

    fn close(x: &[f32], y: &[f32]) {
        assert_eq!(x.len(), y.len());
        for (a, b) in x.iter().zip(y) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} against {b}");
        }
    }

    /// Every transpose combination, on 1 and 2 threads and at sizes the kernel cuts
    /// unevenly, against a naive triple loop; overwriting an output full of NaN (any read
    /// of it would show in the result) and adding to one that holds values.
    #[test]
    fn products_never_read_an_overwritten_output() {
        let (m, k, n) = (37, 29, 45);
        let lhs: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0).collect();
        let rhs: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 * 0.5 - 3.0).collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    let a = if ta { Matrix::new(&lhs, k, m).t() } else { Matrix::new(&lhs, m, k) };
                    let b = if tb { Matrix::new(&rhs, n, k).t() } else { Matrix::new(&rhs, k, n) };
                    let want = naive(&a, &b);
                    close(&product(a, b).unwrap(), &want);
                    let mut dst = vec![f32::NAN; m * n];
                    product_into(&mut dst, a, b, Output::Overwrite).unwrap();
                    close(&dst, &want);
                    let mut acc: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
                    product_into(&mut acc, a, b, Output::Add).unwrap();
                    let sum: Vec<f32> = want.iter().enumerate().map(|(i, w)| w + i as f32 * 0.01).collect();
                    close(&acc, &sum);
                }
            });
        }
        // An empty inner dimension is a product of zeros, still without reading the output.
        let mut dst = vec![f32::NAN; 6];
        product_into(&mut dst, Matrix::new(&[], 2, 0), Matrix::new(&[], 0, 3), Output::Overwrite).unwrap();
        assert_eq!(dst, vec![0.0; 6]);
        // Shapes that do not fit are refused, not read or written past.
        assert!(product(Matrix::new(&lhs, m, k), Matrix::new(&rhs, n, k)).is_err());
        assert!(product(Matrix::new(&lhs[1..], m, k), Matrix::new(&rhs, k, n)).is_err());
        assert!(
            product_into(&mut [0.0; 4], Matrix::new(&lhs, m, k), Matrix::new(&rhs, k, n), Output::Add)
                .is_err()
        );
    }
}
