//! The small-product kernels against gemm, on one thread: what the thresholds in
//! `ops/matmul.rs` (`MATVEC_ELEMENTS`, `OUTER_LOOP_ELEMENTS`) were chosen from.
//!
//! `cargo run --release -p gradloop --example small_products` prints, for square sizes n, the
//! median ns of a row times an n x n matrix read by rows (`MatVec::combine_rows`) and
//! transposed (`MatVec::dots`), each beside gemm computing the same product, in float32 and
//! float64, and the ratio gemm / loop (above 1: the loop is faster).

use std::time::Instant;

use gradloop::ops::kernels::Arith;
use gradloop::ops::matvec::MatVec;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Median ns per call of `f` over 15 samples of `reps` calls.
fn time(reps: usize, f: &mut dyn FnMut()) -> f64 {
    let samples = (0..15).map(|_| {
        let start = Instant::now();
        (0..reps).for_each(|_| f());
        start.elapsed().as_nanos() as f64 / reps as f64
    });
    median(samples.collect())
}

/// `out = x @ op(w)` through gemm, `w` n x n read by rows or transposed.
#[allow(unsafe_code, reason = "gemm takes raw pointers and strides")]
fn gemm_row<T: Arith>(x: &[T], w: &[T], transposed: bool, out: &mut [T]) {
    let n = out.len();
    let (rs, cs) = if transposed { (1, n) } else { (n, 1) };
    // SAFETY: x has n elements, w n * n, out n; the strides stay inside them.
    unsafe {
        gemm::gemm(
            1,
            n,
            n,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            n as isize,
            w.as_ptr(),
            cs as isize,
            rs as isize,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

fn row<T: MatVec + From<f32>>(name: &str, n: usize) {
    let x: Vec<T> = (0..n).map(|i| T::from((i as f32 * 0.37).sin())).collect();
    let w: Vec<T> = (0..n * n)
        .map(|i| T::from((i as f32 * 1e-3).cos()))
        .collect();
    let mut out = vec![T::zero(); n];
    let reps = (2_000_000 / (n * n)).max(10);
    let gemm_rows = time(reps, &mut || gemm_row(&x, &w, false, &mut out));
    let rows = time(reps, &mut || T::combine_rows(|p| x[p], n, &w, n, &mut out));
    let gemm_t = time(reps, &mut || gemm_row(&x, &w, true, &mut out));
    let dots = time(reps, &mut || T::dots(&x, &w, n, &mut out));
    println!(
        "{name:<7} {n:>4}  {gemm_rows:>9.0} {rows:>9.0} {:>6.2}x  {gemm_t:>9.0} {dots:>9.0} {:>6.2}x",
        gemm_rows / rows,
        gemm_t / dots
    );
}

fn main() {
    println!("ns per product, one thread; `x @ W` by rows, then `x @ W^T` (dot products)");
    println!(
        "{:<7} {:>4}  {:>9} {:>9} {:>7}  {:>9} {:>9} {:>7}",
        "dtype", "n", "gemm", "rows", "ratio", "gemm", "dots", "ratio"
    );
    for n in [16, 33, 64, 128, 256, 512] {
        row::<f32>("float32", n);
    }
    for n in [16, 33, 64, 128, 256, 512] {
        row::<f64>("float64", n);
    }
}
