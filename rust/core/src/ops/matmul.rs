//! Matrix product with broadcast batch dimensions: numpy's matmul for operands of rank >= 2.
//!
//! Shapes: a [..., m, k] and b [..., k, n] give [..., m, n]; batch dimensions broadcast as in
//! numpy. `transpose_a`/`transpose_b` read an operand's last two axes swapped (a [..., k, m],
//! b [..., n, k]): the kernels take strides, so a transposed operand costs nothing, and gradients
//! use this instead of materialising a transpose. Dtypes: float32/float64 (the `gemm` crate),
//! int32/int64 (wrapping arithmetic); bool is rejected. The `matmul` builder adds numpy's
//! rank-1 rules. MLIR: `stablehlo.dot_general` (the flags choose the contracting dimensions);
//! batch dimensions are broadcast explicitly first, except for a rank-2 `b`, whose product with
//! any `a` needs no batch dimensions at all.
//!
//! Gradient (C = A'B' with A' = op_a(A), B' = op_b(B), g = dL/dC): dA' = g B'^T and
//! dB' = A'^T g, each one MatMul with transpose flags, summed over broadcast batch dimensions.

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::kernels::{Arith, PARALLEL_THRESHOLD};
use super::matvec::MatVec;
use super::parallel;
use super::tiles::Tiled;
use super::{build, dest, expect_arity, DestKernel, Grads, OpDef, Saved, Saves, Types, Values};
use super::{tangents, Tangents};
use crate::dtype::Storage;
use crate::emit::{Emitter, MlirValue, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{broadcast_shapes, numel, Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Multiply-adds from which one product is split over threads: below it rayon's start-up and
/// gemm's split packing cost more than a second core saves (measured on 2 cores with AVX-512);
/// many smaller products are spread one per task instead.
const GEMM_PARALLEL_FLOPS: usize = 1 << 22;

/// `op_a(a) @ op_b(b)`, where `op_x` swaps the last two axes when `transpose_x` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MatMul {
    pub transpose_a: bool,
    pub transpose_b: bool,
}
op_attrs!(MatMul = "matmul" { transpose_a, transpose_b });

/// What the kernels need: the output's batch shape, the matrix sizes, where each batch
/// element's matrices start, and the (row, column) strides of op_a(A) and op_b(B).
struct Plan {
    batch: Shape,
    /// Rows of each batch element's result (`m` counts the rows of all when they are stacked).
    rows: usize,
    m: usize,
    k: usize,
    n: usize,
    offsets: Vec<(usize, usize)>,
    a_strides: (usize, usize),
    b_strides: (usize, usize),
}

fn operands(a: &TensorType, b: &TensorType) -> String {
    format!("a: {a} and b: {b}")
}

/// Dtype rule shared by the op and the builder (which checks before reshaping rank-1 operands).
fn check_dtypes(a: &TensorType, b: &TensorType) -> Result<()> {
    if a.dtype != b.dtype {
        let msg = format!(
            "operands must have the same dtype, got {}; cast one of them (gl.cast) first",
            operands(a, b)
        );
        return Err(Error::dtype("matmul", msg));
    }
    if !a.dtype.is_numeric() {
        let msg = format!(
            "expected numeric operands (float32, float64, int32 or int64), got {}",
            operands(a, b)
        );
        return Err(Error::dtype("matmul", msg));
    }
    Ok(())
}

fn contraction_error(
    a: &TensorType,
    b: &TensorType,
    ka: usize,
    kb: usize,
    expected: &str,
) -> Error {
    let (ka, kb) = (ShapeDisplay(&[ka]), ShapeDisplay(&[kb]));
    let msg = format!(
        "contraction dimensions differ ({ka} vs {kb}), got {}; expected {expected}",
        operands(a, b)
    );
    Error::shape("matmul", msg)
}

impl MatMul {
    fn expected(&self) -> String {
        let a = ["a: [..., m, k]", "a: [..., k, m] (transpose_a)"][usize::from(self.transpose_a)];
        let b = ["b: [..., k, n]", "b: [..., n, k] (transpose_b)"][usize::from(self.transpose_b)];
        format!("{a} and {b}")
    }

    /// Output batch shape and (m, k, n); shapes may hold `DYN` (graph mode).
    fn dims(&self, a: &TensorType, b: &TensorType) -> Result<(Shape, [usize; 3])> {
        let (ra, rb) = (a.ndim(), b.ndim());
        if ra < 2 || rb < 2 {
            let msg = format!(
                "expected operands of rank >= 2 ({}), got {}",
                self.expected(),
                operands(a, b)
            );
            return Err(Error::shape("matmul", msg));
        }
        let (sa, sb) = (&a.shape, &b.shape);
        let (m, ka) = if self.transpose_a {
            (sa[ra - 1], sa[ra - 2])
        } else {
            (sa[ra - 2], sa[ra - 1])
        };
        let (kb, n) = if self.transpose_b {
            (sb[rb - 1], sb[rb - 2])
        } else {
            (sb[rb - 2], sb[rb - 1])
        };
        if ka != kb && ka != DYN && kb != DYN {
            return Err(contraction_error(a, b, ka, kb, &self.expected()));
        }
        let batch = broadcast_shapes("matmul", &sa[..ra - 2], &sb[..rb - 2]).map_err(|_| {
            let (ba, bb) = (ShapeDisplay(&sa[..ra - 2]), ShapeDisplay(&sb[..rb - 2]));
            let msg = format!("batch dimensions {ba} and {bb} do not broadcast, got {}; expected batch dimensions that are equal or 1", operands(a, b));
            Error::shape("matmul", msg)
        })?;
        Ok((batch, [m, if ka == DYN { kb } else { ka }, n]))
    }

    fn plan(&self, a: &TensorType, b: &TensorType) -> Result<Plan> {
        let (batch, [m, k, n]) = self.dims(a, b)?;
        let a_strides = if self.transpose_a { (1, m) } else { (k, 1) };
        let b_strides = if self.transpose_b { (1, k) } else { (n, 1) };
        let (ao, bo) = (
            batch_offsets(&batch, &a.shape, m * k),
            batch_offsets(&batch, &b.shape, k * n),
        );
        // One tall product instead of many small ones when b is shared by every batch element
        // and a's matrices are stacked rows: same memory order, far better kernel efficiency.
        let stacked_a = !self.transpose_a && ao.iter().enumerate().all(|(t, &o)| o == t * m * k);
        let mut plan = Plan {
            batch,
            rows: m,
            m,
            k,
            n,
            offsets: vec![],
            a_strides,
            b_strides,
        };
        if ao.len() > 1 && stacked_a && bo.iter().all(|&o| o == 0) {
            plan.m = m * ao.len();
            plan.offsets.push((0, 0));
        } else {
            plan.offsets = ao.into_iter().zip(bo).collect();
        }
        Ok(plan)
    }
}

/// Start of an operand's matrix for each output batch element (row-major over `batch`);
/// broadcast dimensions (size 1 or missing) do not advance.
fn batch_offsets(batch: &[usize], shape: &[usize], matrix: usize) -> Vec<usize> {
    let own = &shape[..shape.len() - 2];
    let lead = batch.len() - own.len();
    let mut stride = matrix;
    let mut strides: Shape = smallvec![0; batch.len()];
    for d in (0..own.len()).rev() {
        strides[lead + d] = if own[d] == 1 { 0 } else { stride };
        stride *= own[d];
    }
    let mut offsets = vec![0];
    for (&size, &s) in batch.iter().zip(&strides) {
        offsets = offsets
            .iter()
            .flat_map(|&o| (0..size).map(move |i| o + i * s))
            .collect();
    }
    offsets
}

impl Plan {
    /// Every element the kernels will read lies inside the operands: what makes the raw
    /// pointers handed to gemm sound.
    fn fits(&self, a_len: usize, b_len: usize) -> bool {
        let end = |o: usize, (rs, cs): (usize, usize), r: usize, c: usize| {
            o + (r - 1) * rs + (c - 1) * cs
        };
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return true;
        }
        self.offsets.iter().all(|&(ao, bo)| {
            end(ao, self.a_strides, self.m, self.k) < a_len
                && end(bo, self.b_strides, self.k, self.n) < b_len
        })
    }
}

/// The matmul kernel of one element type: writes every batch element's product into `out`
/// (row-major [batch, m, n]; whatever it held before is overwritten).
trait Kernel: Arith {
    fn product(plan: &Plan, a: &[Self], b: &[Self], out: &mut [Self]);
}

macro_rules! kernel {
    ($($t:ty => $product:ident),*) => {$(
        impl Kernel for $t {
            fn product(plan: &Plan, a: &[$t], b: &[$t], out: &mut [$t]) {
                $product(plan, a, b, out)
            }
        }
    )*};
}
kernel!(f32 => gemm_product, f64 => gemm_product, i32 => loop_product, i64 => loop_product);

/// Outer products (k = 1) of up to this many elements run as a plain loop: gemm's set-up
/// dominates there, and the loop computes exactly `a[i] * b[j]`, which `rank_one_update_into`
/// relies on. Above it gemm's AVX-512 stores win (`docs/notes.md`, "Kernels").
pub const OUTER_LOOP_ELEMENTS: usize = 1 << 14;

/// Vector-matrix products (one row or one column out) whose matrix has up to this many
/// elements run as `MatVec`'s register-blocked loops, which beat gemm up to there and lose at
/// 512x512 in float64 (`docs/notes.md`, "Kernels").
const MATVEC_ELEMENTS: usize = 1 << 16;

/// Float products through gemm, which reads both operands through strides; outer products up
/// to `OUTER_LOOP_ELEMENTS` through `outer_rows`, vector-matrix products up to
/// `MATVEC_ELEMENTS` through `vector_product`, large products with a transposed operand
/// through `Reroute`. Many small products are spread over threads one per task; large ones
/// are split into one block per thread (`gemm_split`).
/// Only instantiated for f32 and f64 (gemm panics on other types).
fn gemm_product<T: MatVec + Tiled + 'static>(plan: &Plan, a: &[T], b: &[T], out: &mut [T]) {
    let (m, k, n) = (plan.m, plan.k, plan.n);
    let flops = m * n * k;
    if flops == 0 {
        out.fill(T::zero()); // an empty contraction sums nothing
        return;
    }
    if k == 1 && m * n <= OUTER_LOOP_ELEMENTS {
        for (dst, &(ao, bo)) in out.chunks_mut(m * n).zip(&plan.offsets) {
            // With k = 1 both operands are vectors: b's elements are contiguous whether or
            // not it is transposed (its column stride is 1 or k).
            let column = |len, start, stride| (0..len).map(move |i| start + i * stride);
            let xs = column(m, ao, plan.a_strides.0).map(|i| a[i]);
            outer_rows(dst, xs, &b[bo..], n);
        }
        return;
    }
    let small = (m == 1 || n == 1) && k * m * n <= MATVEC_ELEMENTS;
    let reroute = Reroute::choose(plan);
    let one = |par: gemm::Parallelism, dst: &mut [T], (ao, bo): (usize, usize)| {
        let (a, b) = (&a[ao..], &b[bo..]);
        if small && vector_product(plan, a, b, dst) {
            return;
        }
        match reroute {
            Some(Reroute::Right) => {
                let mut bt = vec![T::zero(); n * k];
                T::transpose(b, n, k, &mut bt);
                gemm_into(par, [m, n, k], (dst, (n, 1)), (a, (k, 1)), (&bt, (n, 1)));
            }
            Some(Reroute::Left) => {
                let mut at = vec![T::zero(); m * k];
                T::transpose(a, k, m, &mut at);
                gemm_into(par, [m, n, k], (dst, (n, 1)), (&at, (k, 1)), (b, (n, 1)));
            }
            Some(Reroute::LeftAndResult) => {
                let (mut at, mut ct) = (vec![T::zero(); m * k], vec![T::zero(); n * m]);
                T::transpose(a, m, k, &mut at);
                gemm_into(
                    par,
                    [n, m, k],
                    (&mut ct, (m, 1)),
                    (b, (k, 1)),
                    (&at, (m, 1)),
                );
                T::transpose(&ct, n, m, dst);
            }
            None => gemm_into(
                par,
                [m, n, k],
                (dst, (n, 1)),
                (a, plan.a_strides),
                (b, plan.b_strides),
            ),
        }
    };
    let batches = plan.offsets.len();
    let big = flops >= GEMM_PARALLEL_FLOPS;
    let spread = batches > 1 && flops * batches >= GEMM_PARALLEL_FLOPS;
    if spread && (!big || batches >= rayon::current_num_threads()) {
        parallel::chunks_mut(out, m * n, &|b, dst| {
            one(gemm::Parallelism::None, dst, plan.offsets[b])
        });
    } else {
        let par = [gemm::Parallelism::None, gemm::Parallelism::Rayon(0)][usize::from(big)];
        let chunks = out.chunks_mut(m * n).zip(&plan.offsets);
        chunks.for_each(|(dst, &o)| one(par, dst, o));
    }
}

/// The fewest rows or columns of the result one thread's block of a split product holds:
/// narrower blocks leave gemm's register tiles part empty.
const SPLIT_MIN: usize = 32;

/// `dst = lhs @ rhs` for `[m, n, k]` (operands as `gemm_into` takes them, `dst` row-major),
/// on rayon's threads: the longer of the result's sides is cut into one block per thread,
/// each a product of its own on one thread. gemm's own split shares its packed operands
/// between threads and synchronises at each panel, which costs more on 2 cores than the
/// blocks' independence (`docs/notes.md`, "Kernels").
fn gemm_split<T: 'static + Arith>(
    [m, n, k]: [usize; 3],
    (dst, drs): (&mut [T], usize),
    (lhs, (ars, acs)): (&[T], (usize, usize)),
    (rhs, (brs, bcs)): (&[T], (usize, usize)),
) {
    let threads = rayon::current_num_threads();
    let blocks = |side: usize| threads.min(side / SPLIT_MIN);
    let none = gemm::Parallelism::None;
    if m >= n && blocks(m) >= 2 {
        // Rows: each block's result rows are contiguous in `dst`.
        let rows = m.div_ceil(blocks(m));
        parallel::chunks_mut(&mut dst[..m * drs], rows * drs, &|i, dst| {
            let r = (m - i * rows).min(rows);
            let a = &lhs[i * rows * ars..];
            gemm_into(
                none,
                [r, n, k],
                (dst, (drs, 1)),
                (a, (ars, acs)),
                (rhs, (brs, bcs)),
            );
        });
    } else if blocks(n) >= 2 {
        // Columns: each block into a buffer of its own, then copied into its columns.
        let cols = n.div_ceil(blocks(n)).next_multiple_of(16);
        let parts = parallel::map_indices(n.div_ceil(cols), &|j| {
            let c = (n - j * cols).min(cols);
            let mut part = vec![T::zero(); m * c];
            let b = &rhs[j * cols * bcs..];
            gemm_into(
                none,
                [m, c, k],
                (&mut part, (c, 1)),
                (lhs, (ars, acs)),
                (b, (brs, bcs)),
            );
            (c, part)
        });
        for (j, (c, part)) in parts.iter().enumerate() {
            for (row, src) in dst.chunks_mut(drs).zip(part.chunks(*c)) {
                row[j * cols..j * cols + c].copy_from_slice(src);
            }
        }
    } else {
        // gemm's own split (a thread count, not 0: `gemm_into` would send it back here).
        let par = gemm::Parallelism::Rayon(threads);
        gemm_into(
            par,
            [m, n, k],
            (dst, (drs, 1)),
            (lhs, (ars, acs)),
            (rhs, (brs, bcs)),
        );
    }
}

/// `dst = lhs @ rhs` through gemm for `[m, n, k]`, each operand given with its (row, column)
/// strides; whatever `dst` held is overwritten (`read_dst` false). On rayon's threads, with a
/// row-major `dst`, through `gemm_split`.
#[allow(unsafe_code, reason = "gemm takes raw pointers and strides")]
#[rustfmt::skip]
fn gemm_into<T: 'static + Arith>(
    par: gemm::Parallelism,
    [m, n, k]: [usize; 3],
    (dst, (drs, dcs)): (&mut [T], (usize, usize)),
    (lhs, (ars, acs)): (&[T], (usize, usize)),
    (rhs, (brs, bcs)): (&[T], (usize, usize)),
) {
    if matches!(par, gemm::Parallelism::Rayon(0)) && dcs == 1 && drs == n {
        return gemm_split([m, n, k], (dst, drs), (lhs, (ars, acs)), (rhs, (brs, bcs)));
    }
    let last = |rs: usize, cs: usize, r: usize, c: usize| (r - 1) * rs + (c - 1) * cs;
    assert!(
        last(drs, dcs, m, n) < dst.len()
            && last(ars, acs, m, k) < lhs.len()
            && last(brs, bcs, k, n) < rhs.len()
    );
    // SAFETY: the assertion keeps every element gemm reads or writes inside the slices (m, n
    // and k are at least 1: an empty product returns before any call).
    unsafe {
        gemm::gemm(
            m, n, k, dst.as_mut_ptr(), dcs as isize, drs as isize, false,
            lhs.as_ptr(), acs as isize, ars as isize,
            rhs.as_ptr(), bcs as isize, brs as isize,
            T::zero(), T::one(), false, false, false, par,
        )
    }
}

/// Products with at least this many multiply-adds are candidates for `Reroute`.
const REROUTE_FLOPS: usize = 1 << 20;

/// Which operands a product with a transposed operand copies into row-major order first, so
/// that gemm runs with every operand row-major, its fastest layout. `a @ b^T` with both
/// operands row-major contracts along both operands' rows, several times slower than the
/// row-major product (gemm's packing of a right operand whose columns are contiguous);
/// `a^T @ b` gains less (`docs/notes.md`, "Kernels"). Where both `Right` and `LeftAndResult` apply, the one that moves
/// fewer elements is chosen, and only where it moves at most one element per 64 multiply-adds
/// (a tiled transpose costs about 25 multiply-adds' time per element here).
#[derive(Clone, Copy)]
enum Reroute {
    /// `a @ (b^T)`: b's [n, k] transposed into a row-major [k, n] copy.
    Right,
    /// `(a^T) @ b` for a stored [k, m]: a transposed into a row-major [m, k] copy.
    Left,
    /// `(b @ a^T)^T`: a's [m, k] transposed into [k, m], the [n, m] product transposed into dst.
    LeftAndResult,
}

impl Reroute {
    fn choose(plan: &Plan) -> Option<Reroute> {
        let (m, k, n) = (plan.m, plan.k, plan.n);
        let flops = m * n * k;
        if flops < REROUTE_FLOPS {
            return None;
        }
        if plan.a_strides == (1, m) && plan.b_strides == (n, 1) {
            return (m * k * 64 <= flops).then_some(Reroute::Left);
        }
        if plan.a_strides != (k, 1) || plan.b_strides != (1, k) {
            return None;
        }
        let (right, left_and_result) = (n * k, m * k + m * n);
        if right.min(left_and_result) * 64 > flops {
            return None;
        }
        Some(if right <= left_and_result {
            Reroute::Right
        } else {
            Reroute::LeftAndResult
        })
    }
}

/// One batch element's product `a @ b` (a and b starting at its offsets) when it has one row or
/// one column and `MatVec` has a form for its strides; false leaves `dst` to gemm. A row
/// combines b's rows (contiguous) or takes dot products with its columns (contiguous, and a
/// contiguous too); a column likewise with a's columns or rows.
fn vector_product<T: MatVec>(plan: &Plan, a: &[T], b: &[T], dst: &mut [T]) -> bool {
    let (k, ((ars, acs), (brs, bcs))) = (plan.k, (plan.a_strides, plan.b_strides));
    let (x, x_stride, mat, (p_stride, j_stride)) = match (plan.m, plan.n) {
        (1, _) => (a, acs, b, (brs, bcs)),
        (_, 1) => (b, brs, a, (acs, ars)),
        _ => return false,
    };
    if j_stride == 1 {
        T::combine_rows(|p| x[p * x_stride], k, mat, p_stride, dst);
    } else if p_stride == 1 && x_stride == 1 {
        T::dots(&x[..k], mat, j_stride, dst);
    } else {
        return false;
    }
    true
}

/// Each row i of `dst` (`n` wide) from `x_i` and b: `dst[i][j] = x_i * b_j`.
fn outer_rows<T: Arith>(dst: &mut [T], xs: impl Iterator<Item = T>, b: &[T], n: usize) {
    for (row, x) in dst.chunks_exact_mut(n).zip(xs) {
        row.iter_mut()
            .zip(&b[..n])
            .for_each(|(d, &y)| *d = x.wmul(y));
    }
}

/// The fused kernel of `x + outer(a, b)` (or `outer(a, b) + x`, `product_first`) for an
/// `m`-vector `a`, an `n`-vector `b` and `x` of shape [m, n]: one pass over the accumulator
/// instead of the product's buffer and an add. The gradient of a vector-matrix product
/// accumulated over a loop is this (`executor::rank_one`). Inputs (x, a, b) write the sum into
/// the output; inputs (a, b) add to what the output holds (x's buffer, moved there). Each
/// element is the product rounded, then the sum, in the add's operand order: bit for bit what
/// the two ops compute (`gemm_product` runs these outer products as `outer_rows`). Float32 and
/// float64, up to `OUTER_LOOP_ELEMENTS`.
pub fn rank_one_update_into(
    dtype: crate::dtype::DType,
    m: usize,
    n: usize,
    product_first: bool,
) -> Option<DestKernel> {
    if m * n > OUTER_LOOP_ELEMENTS || m * n == 0 {
        return None;
    }
    fn kernel<T: Arith>(m: usize, n: usize, product_first: bool) -> DestKernel {
        let sum = move |x: T, p: T| if product_first { p.wadd(x) } else { x.wadd(p) };
        Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
            let sizes = |a: &[T], b: &[T], out: &[T]| {
                if a.len() == m && b.len() == n && out.len() == m * n {
                    Ok(())
                } else {
                    Err(Error::internal(
                        "matmul",
                        "a rank-one update of other sizes",
                    ))
                }
            };
            let out = dest::output::<T>(outs, 0)?;
            if let [_, _] = ins {
                let (a, b) = (dest::input::<T>(ins, 0)?, dest::input::<T>(ins, 1)?);
                sizes(a, b, out)?;
                for (row, &ai) in out.chunks_exact_mut(n).zip(a) {
                    row.iter_mut()
                        .zip(b)
                        .for_each(|(d, &bj)| *d = sum(*d, ai.wmul(bj)));
                }
                return Ok(());
            }
            let (x, a, b) = (
                dest::input::<T>(ins, 0)?,
                dest::input::<T>(ins, 1)?,
                dest::input::<T>(ins, 2)?,
            );
            sizes(a, b, out)?;
            if x.len() != m * n {
                return Err(Error::internal(
                    "matmul",
                    "a rank-one update of other sizes",
                ));
            }
            let rows = out.chunks_exact_mut(n).zip(x.chunks_exact(n)).zip(a);
            for ((row, xs), &ai) in rows {
                let terms = row.iter_mut().zip(xs).zip(b);
                terms.for_each(|((d, &xj), &bj)| *d = sum(xj, ai.wmul(bj)));
            }
            Ok(())
        })
    }
    match dtype {
        crate::dtype::DType::F32 => Some(kernel::<f32>(m, n, product_first)),
        crate::dtype::DType::F64 => Some(kernel::<f64>(m, n, product_first)),
        _ => None,
    }
}

/// Integer products, one output row at a time in i-k-j order: the innermost loop walks a row
/// of b and the output row contiguously (unless b is transposed). Wrapping, as numpy.
fn loop_product<T: Arith>(plan: &Plan, a: &[T], b: &[T], out: &mut [T]) {
    out.fill(T::zero()); // the rows accumulate
    if out.is_empty() {
        return;
    }
    let (m, k, n) = (plan.m, plan.k, plan.n);
    let ((ars, acs), (brs, bcs)) = (plan.a_strides, plan.b_strides);
    let row = |(index, dst): (usize, &mut [T])| {
        let (ao, bo) = plan.offsets[index / m];
        let ai = ao + (index % m) * ars;
        for p in 0..k {
            let (x, bp) = (a[ai + p * acs], bo + p * brs);
            if bcs == 1 {
                let ys = &b[bp..bp + n];
                dst.iter_mut()
                    .zip(ys)
                    .for_each(|(d, &y)| *d = d.wadd(x.wmul(y)));
            } else {
                let ys = (0..n).map(|j| b[bp + j * bcs]);
                dst.iter_mut()
                    .zip(ys)
                    .for_each(|(d, y)| *d = d.wadd(x.wmul(y)));
            }
        }
    };
    if out.len() * k >= PARALLEL_THRESHOLD {
        parallel::chunks_mut(out, n, &|i, dst| row((i, dst)));
    } else {
        out.chunks_mut(n).enumerate().for_each(row);
    }
}

fn run<T: Kernel>(plan: &Plan, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (xs, ys) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    if !plan.fits(xs.len(), ys.len()) {
        return Err(Error::internal(
            "matmul",
            "the kernel plan reaches outside an operand",
        ));
    }
    let mut out = vec![T::zero(); plan.offsets.len() * plan.m * plan.n];
    T::product(plan, xs, ys, &mut out);
    let mut shape = plan.batch.clone();
    shape.extend([plan.rows, plan.n]);
    Tensor::from_vec(out, &shape)
}

impl OpDef for MatMul {
    /// Multiply-adds: the first operand's elements times the second's columns (batches
    /// included).
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        let _ = outputs;
        match inputs {
            [a, b, ..] => {
                let columns = if self.transpose_b {
                    b.iter().rev().nth(1)
                } else {
                    b.last()
                };
                a.iter().product::<usize>() * columns.copied().unwrap_or(1)
            }
            _ => 0,
        }
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("matmul", inputs, 2)?;
        let (a, b) = (&inputs[0], &inputs[1]);
        check_dtypes(a, b)?;
        let (mut shape, [m, _, n]) = self.dims(a, b)?;
        shape.extend([m, n]);
        Ok(smallvec![TensorType::new(a.dtype, &shape)])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        let plan = self.plan(&inputs[0], &inputs[1]).ok()?;
        if plan.offsets.len() * plan.m * plan.n != numel(&outputs[0].shape) {
            return None;
        }
        crate::with_numeric!(
            inputs[0].dtype,
            T,
            {
                Some(Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
                    let (xs, ys) = (dest::input::<T>(ins, 0)?, dest::input::<T>(ins, 1)?);
                    if !plan.fits(xs.len(), ys.len()) {
                        let msg = "the kernel plan reaches outside an operand";
                        return Err(Error::internal("matmul", msg));
                    }
                    T::product(&plan, xs, ys, dest::output::<T>(outs, 0)?);
                    Ok(())
                }))
            },
            None
        )
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let plan = self.plan(a.ty(), b.ty())?;
        let bug = || Error::internal("matmul", "the kernel got bool operands");
        let out = crate::with_numeric!(a.dtype(), T, { run::<T>(&plan, a, b)? }, return Err(bug()));
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::INPUTS
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (a, b, out) = (&inputs[0], &inputs[1], &outputs[0]);
        let (ra, rb) = (a.ty.ndim(), b.ty.ndim());
        let ka = if self.transpose_a { ra - 2 } else { ra - 1 };
        let kb = if self.transpose_b { rb - 1 } else { rb - 2 };
        if a.ty.shape[ka] == 0 {
            // An empty sum is 0 (and iree-compile 3.13 crashes on a zero-length contraction).
            return Ok(smallvec![e.splat(out.dtype, &out.shape, 0.0)?]);
        }
        if rb == 2 {
            // No batch dimensions: a's free dimensions (batch..., m) then b's (n) are the
            // result's, in order, whatever a's rank.
            let dims = format!("contracting_dims = [{ka}] x [{kb}]");
            return Ok(smallvec![dot_general(e, a, b, &dims, out)]);
        }
        let batch = &out.shape[..out.ndim() - 2];
        let widen = |e: &mut Emitter, x: &MlirValue| {
            let r = x.ty.ndim();
            let mut shape: Shape = batch.into();
            shape.extend_from_slice(&x.ty.shape[r - 2..]);
            if shape != x.ty.shape && shape.contains(&DYN) {
                return Err(e.unsupported(format!(
                    "broadcasting the batch dimensions of {} to {} (unknown sizes)",
                    TypeText(&x.ty),
                    ShapeDisplay(&shape)
                )));
            }
            e.broadcast_to(x, &shape, &[])
        };
        let (a, b) = (widen(e, a)?, widen(e, b)?);
        let nb = batch.len();
        let list = |n: usize| (0..n).map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        let dims = format!(
            "batching_dims = [{}] x [{}], contracting_dims = [{}] x [{}]",
            list(nb),
            list(nb),
            nb + ka - (ra - 2),
            nb + kb - (rb - 2)
        );
        Ok(smallvec![dot_general(e, &a, &b, &dims, out)])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None, None]);
        };
        let (a, b) = (saved.input(0)?, saved.input(1)?);
        let (ta, tb) = (self.transpose_a, self.transpose_b);
        let ga = if needs[0] {
            // dA' = g B'^T; stored transposed when A was: A^T-grad = B' g^T.
            let d = if ta {
                matmul_transposed(ctx, b, g, tb, true)?
            } else {
                matmul_transposed(ctx, g, b, false, !tb)?
            };
            Some(build::sum_to_shape(ctx, &d, &saved.input_types[0].shape)?)
        } else {
            None
        };
        let gb = if needs[1] {
            Some(self.grad_b(ctx, saved, a, g)?)
        } else {
            None
        };
        Ok(smallvec![ga, gb])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        // Operands have rank >= 2: their batch axes broadcast as numpy's.
        batching::broadcasting(ctx, *self, inputs, batched)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let _ = outputs;
        tangents::bilinear(ctx, *self, inputs, tangents)
    }
}

/// `stablehlo.dot_general` with dimension numbers `dims`; the result is typed `out`.
fn dot_general(
    e: &mut Emitter,
    a: &MlirValue,
    b: &MlirValue,
    dims: &str,
    out: &TensorType,
) -> MlirValue {
    let body = format!(
        "stablehlo.dot_general {a}, {b}, {dims} : ({}, {}) -> {}",
        TypeText(&a.ty),
        TypeText(&b.ty),
        TypeText(out)
    );
    e.op(&body, out)
}

impl MatMul {
    /// dB' = A'^T g (stored transposed when B was: g^T A'), summed over broadcast batch dims.
    fn grad_b<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        a: &V,
        g: &V,
    ) -> Result<V> {
        let (ta, tb) = (self.transpose_a, self.transpose_b);
        let (at, bt) = (&saved.input_types[0], &saved.input_types[1]);
        let b_batch = numel(&bt.shape[..bt.ndim() - 2]);
        let a_batch = numel(&at.shape[..at.ndim() - 2]);
        let g_batch = numel(&g.ty().shape[..g.ty().ndim() - 2]);
        // b shared by a batch of a's: one product over the stacked rows instead of a batch of
        // products summed afterwards.
        if !ta && b_batch == 1 && a_batch > 1 && a_batch == g_batch && a_batch != DYN {
            let (rows, k, n) = (
                a_batch * at.shape[at.ndim() - 2],
                at.shape[at.ndim() - 1],
                bt.shape[bt.ndim() - if tb { 2 } else { 1 }],
            );
            let a2 = build::reshape(ctx, a, &[rows, k])?;
            let g2 = build::reshape(ctx, g, &[rows, n])?;
            let d = if tb {
                matmul_transposed(ctx, &g2, &a2, true, false)?
            } else {
                matmul_transposed(ctx, &a2, &g2, true, false)?
            };
            return if bt.ndim() == 2 {
                Ok(d)
            } else {
                build::reshape(ctx, &d, &bt.shape)
            };
        }
        let d = if tb {
            matmul_transposed(ctx, g, a, true, ta)?
        } else {
            matmul_transposed(ctx, a, g, !ta, false)?
        };
        build::sum_to_shape(ctx, &d, &bt.shape)
    }
}

/// `op_a(a) @ op_b(b)` for operands of rank >= 2, `op_x` swapping the last two axes when
/// `transpose_x` is set (no copy is made).
pub fn matmul_transposed<V: Value>(
    ctx: &mut dyn Context<V>,
    a: &V,
    b: &V,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<V> {
    let op = MatMul {
        transpose_a,
        transpose_b,
    };
    build::apply1(ctx, op, &[a.clone(), b.clone()])
}

/// numpy's matmul: batch dimensions broadcast; a rank-1 `a` is a row vector and a rank-1 `b` a
/// column vector, and the dimension they gain is removed from the result.
pub fn matmul<V: Value>(ctx: &mut dyn Context<V>, a: &V, b: &V) -> Result<V> {
    let (at, bt) = (a.ty().clone(), b.ty().clone());
    if at.ndim() >= 2 && bt.ndim() >= 2 {
        return matmul_transposed(ctx, a, b, false, false);
    }
    if at.ndim() == 0 || bt.ndim() == 0 {
        let msg = format!(
            "operands must have at least one dimension, got {} (use mul for scalars)",
            operands(&at, &bt)
        );
        return Err(Error::shape("matmul", msg));
    }
    check_dtypes(&at, &bt)?;
    let ka = at.shape[at.ndim() - 1];
    let kb = bt.shape[bt.ndim().saturating_sub(2)];
    if ka != kb && ka != DYN && kb != DYN {
        let expected = "a: [..., m, k] or [k], and b: [..., k, n] or [k]";
        return Err(contraction_error(&at, &bt, ka, kb, expected));
    }
    let a2 = if at.ndim() == 1 {
        build::reshape(ctx, a, &[1, ka])?
    } else {
        a.clone()
    };
    let b2 = if bt.ndim() == 1 {
        build::reshape(ctx, b, &[kb, 1])?
    } else {
        b.clone()
    };
    let c = matmul_transposed(ctx, &a2, &b2, false, false)?;
    let mut shape = c.ty().shape.clone();
    let r = shape.len();
    if bt.ndim() == 1 {
        shape.remove(r - 1);
    }
    if at.ndim() == 1 {
        shape.remove(r - 2);
    }
    build::reshape(ctx, &c, &shape)
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
