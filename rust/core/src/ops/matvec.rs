//! Vector-matrix products small enough to keep their sums in registers: an RNN step's `h @ W`
//! and its gradient's `g @ W^T` at sizes like 64x64, where gemm's set-up and packing cost more
//! than the arithmetic (`docs/notes.md`, "Kernels"). Two forms, by which way the matrix is
//! contiguous:
//! - `combine_rows`: `out[j] = sum_p x[p] * mat[p * row_stride + j]`, rows contiguous. Each
//!   block of output columns stays in eight vector registers while the rows stream past.
//! - `dots`: `out[j] = sum_p x[p] * mat[j * row_stride + p]`, one dot product per output,
//!   eight rows at a time so that their sums run side by side.
//!
//! Each product is rounded, then added (no fused multiply-add), in an order fixed by the sizes
//! alone: every mode that runs a product gets the same bits.

use wide::{f32x8, f64x4};

use super::kernels::Arith;

/// Float element types with register-blocked vector-matrix products.
pub trait MatVec: Arith {
    /// `out[j] = sum_p x(p) * mat[p * row_stride + j]` for p < k, j < out.len().
    fn combine_rows(
        x: impl Fn(usize) -> Self,
        k: usize,
        mat: &[Self],
        row_stride: usize,
        out: &mut [Self],
    );

    /// `out[j] = sum_p x[p] * mat[j * row_stride + p]` for p < x.len(), j < out.len().
    fn dots(x: &[Self], mat: &[Self], row_stride: usize, out: &mut [Self]);
}

/// Vector registers a block of `combine_rows` accumulates in (x86-64-v3 has 16).
const BLOCK: usize = 8;

/// Rows `dots` sums side by side, one accumulator each: eight chains of adds in flight, and
/// each load of `x` serves eight rows (four rows of two accumulators took 10% longer at 64).
const ROWS: usize = 8;

macro_rules! matvec {
    ($T:ty, $V:ident, $N:literal) => {
        impl MatVec for $T {
            fn combine_rows(
                x: impl Fn(usize) -> $T,
                k: usize,
                mat: &[$T],
                row_stride: usize,
                out: &mut [$T],
            ) {
                let n = out.len();
                let mut j = 0;
                while j + BLOCK * $N <= n {
                    let mut acc = [$V::ZERO; BLOCK];
                    for p in 0..k {
                        let s = $V::splat(x(p));
                        let row = &mat[p * row_stride + j..][..BLOCK * $N];
                        for (a, c) in acc.iter_mut().zip(row.chunks_exact($N)) {
                            *a += s * load(c);
                        }
                    }
                    let dst = out[j..j + BLOCK * $N].chunks_exact_mut($N);
                    dst.zip(&acc)
                        .for_each(|(d, a)| d.copy_from_slice(&a.to_array()));
                    j += BLOCK * $N;
                }
                while j + $N <= n {
                    let mut acc = $V::ZERO;
                    for p in 0..k {
                        acc += $V::splat(x(p)) * load(&mat[p * row_stride + j..][..$N]);
                    }
                    out[j..j + $N].copy_from_slice(&acc.to_array());
                    j += $N;
                }
                for (j, o) in out.iter_mut().enumerate().skip(j) {
                    *o = (0..k).fold(0.0, |s, p| s + x(p) * mat[p * row_stride + j]);
                }
            }

            fn dots(x: &[$T], mat: &[$T], row_stride: usize, out: &mut [$T]) {
                let k = x.len();
                let body = k - k % $N;
                let tail = |row: &[$T]| (body..k).fold(0.0, |s, p| s + row[p] * x[p]);
                let mut j = 0;
                while j + ROWS <= out.len() {
                    let rows: [&[$T]; ROWS] =
                        std::array::from_fn(|r| &mat[(j + r) * row_stride..][..k]);
                    let mut acc = [$V::ZERO; ROWS];
                    for p in (0..body).step_by($N) {
                        let xs = load(&x[p..]);
                        for (a, row) in acc.iter_mut().zip(&rows) {
                            *a += load(&row[p..]) * xs;
                        }
                    }
                    for ((o, a), row) in out[j..j + ROWS].iter_mut().zip(&acc).zip(&rows) {
                        *o = a.reduce_add() + tail(row);
                    }
                    j += ROWS;
                }
                for (j, o) in out.iter_mut().enumerate().skip(j) {
                    let row = &mat[j * row_stride..][..k];
                    let mut acc = $V::ZERO;
                    for p in (0..body).step_by($N) {
                        acc += load(&row[p..p + $N]) * load(&x[p..p + $N]);
                    }
                    *o = acc.reduce_add() + tail(row);
                }
            }
        }

        /// A vector from the first `N` elements of `c` (an array, not `wide`'s slice
        /// conversion, whose check for a shorter slice costs a branch per load).
        #[inline(always)]
        fn load(c: &[$T]) -> $V {
            let lanes: [$T; $N] = c[..$N].try_into().expect("a slice of N lanes");
            $V::from(lanes)
        }
    };
}

mod single {
    use super::*;
    matvec!(f32, f32x8, 8);
}

mod double {
    use super::*;
    matvec!(f64, f64x4, 4);
}
