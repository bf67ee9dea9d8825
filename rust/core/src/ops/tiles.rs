//! Row-major matrix transposes through vector-register tiles, for the products gemm is slow
//! at: a product with a transposed right operand (`g @ W^T`, an MLP gradient's) ran 3-5x
//! slower than the same product with both operands row-major when a row held 512 or 784
//! elements (`docs/notes.md`, "Kernels"), so `ops/matmul.rs` transposes the smaller operands
//! first. A tile is 8x8 float32 or 4x4 float64, transposed in registers; the scalar loop,
//! with its column stride of a whole row, took 3x longer at 512x512.

use wide::{f32x8, f64x4};

/// Element types with a register-tiled transpose.
pub trait Tiled: Copy {
    /// `dst[j * rows + i] = src[i * cols + j]` for i < rows, j < cols.
    fn transpose(src: &[Self], rows: usize, cols: usize, dst: &mut [Self]);
}

macro_rules! tiled {
    ($T:ty, $V:ident, $N:literal) => {
        impl Tiled for $T {
            fn transpose(src: &[$T], rows: usize, cols: usize, dst: &mut [$T]) {
                assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
                let (whole_rows, whole_cols) = (rows / $N * $N, cols / $N * $N);
                for i in (0..whole_rows).step_by($N) {
                    for j in (0..whole_cols).step_by($N) {
                        let tile = $V::transpose(std::array::from_fn(|r| {
                            let row: [$T; $N] = src[(i + r) * cols + j..][..$N].try_into().unwrap();
                            $V::from(row)
                        }));
                        for (c, column) in tile.iter().enumerate() {
                            dst[(j + c) * rows + i..][..$N].copy_from_slice(&column.to_array());
                        }
                    }
                }
                // the ragged right columns, then the ragged bottom rows
                for i in 0..rows {
                    for j in whole_cols..cols {
                        dst[j * rows + i] = src[i * cols + j];
                    }
                }
                for i in whole_rows..rows {
                    for j in 0..whole_cols {
                        dst[j * rows + i] = src[i * cols + j];
                    }
                }
            }
        }
    };
}
tiled!(f32, f32x8, 8);
tiled!(f64, f64x4, 4);

#[cfg(test)]
mod tests {
    use super::Tiled;

    fn check<T: Tiled + From<u16> + PartialEq + std::fmt::Debug>() {
        for rows in [0, 1, 3, 4, 7, 8, 9, 16, 17, 33] {
            for cols in [0, 1, 2, 5, 8, 12, 15, 16, 31] {
                let src: Vec<T> = (0..rows * cols).map(|i| T::from(i as u16)).collect();
                let mut dst = vec![T::from(u16::MAX); rows * cols];
                T::transpose(&src, rows, cols, &mut dst);
                for i in 0..rows {
                    for j in 0..cols {
                        assert_eq!(
                            dst[j * rows + i],
                            src[i * cols + j],
                            "{rows}x{cols} ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tiled_transposes_match_the_definition_at_ragged_sizes() {
        check::<f32>();
        check::<f64>();
    }
}
