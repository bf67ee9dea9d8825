//! Matrix product with broadcast batch dimensions: numpy's matmul for operands of rank >= 2.
//!
//! Shapes: a [..., m, k] and b [..., k, n] give [..., m, n]; batch dimensions broadcast as in
//! numpy. `transpose_a`/`transpose_b` read an operand's last two axes swapped (a [..., k, m],
//! b [..., n, k]): the kernels take strides, so a transposed operand costs nothing, and gradients
//! use this instead of materialising a transpose. Dtypes: float32/float64 (the `gemm` crate),
//! int32/int64 (wrapping arithmetic); bool is rejected. The `matmul` builder adds numpy's
//! rank-1 rules. MLIR: `stablehlo.dot_general` (the flags choose the contracting dimensions).
//!
//! Gradient (C = A'B' with A' = op_a(A), B' = op_b(B), g = dL/dC): dA' = g B'^T and
//! dB' = A'^T g, each one MatMul with transpose flags, summed over broadcast batch dimensions.

use rayon::prelude::*;
use smallvec::smallvec;

use super::kernels::{Arith, PARALLEL_THRESHOLD};
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{broadcast_shapes, numel, Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Multiply-adds above which one product is worth splitting over threads (measured: below
/// it rayon's start-up costs more than the product itself).
const GEMM_PARALLEL_FLOPS: usize = 1 << 18;

/// `op_a(a) @ op_b(b)`, where `op_x` swaps the last two axes when `transpose_x` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MatMul {
    pub transpose_a: bool,
    pub transpose_b: bool,
}

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
        let msg = format!("operands must have the same dtype, got {}; cast one of them (gl.cast) first", operands(a, b));
        return Err(Error::dtype("matmul", msg));
    }
    if !a.dtype.is_numeric() {
        let msg = format!("expected numeric operands (float32, float64, int32 or int64), got {}", operands(a, b));
        return Err(Error::dtype("matmul", msg));
    }
    Ok(())
}

fn contraction_error(a: &TensorType, b: &TensorType, ka: usize, kb: usize, expected: &str) -> Error {
    let (ka, kb) = (ShapeDisplay(&[ka]), ShapeDisplay(&[kb]));
    let msg = format!("contraction dimensions differ ({ka} vs {kb}), got {}; expected {expected}", operands(a, b));
    Error::shape("matmul", msg)
}

impl MatMul {
    fn expected(&self) -> String {
        let a = if self.transpose_a { "a: [..., k, m] (transpose_a)" } else { "a: [..., m, k]" };
        let b = if self.transpose_b { "b: [..., n, k] (transpose_b)" } else { "b: [..., k, n]" };
        format!("{a} and {b}")
    }

    /// Output batch shape and (m, k, n); shapes may hold `DYN` (graph mode).
    fn dims(&self, a: &TensorType, b: &TensorType) -> Result<(Shape, [usize; 3])> {
        let (ra, rb) = (a.ndim(), b.ndim());
        if ra < 2 || rb < 2 {
            let msg = format!("expected operands of rank >= 2 ({}), got {}", self.expected(), operands(a, b));
            return Err(Error::shape("matmul", msg));
        }
        let (sa, sb) = (&a.shape, &b.shape);
        let (m, ka) = if self.transpose_a { (sa[ra - 1], sa[ra - 2]) } else { (sa[ra - 2], sa[ra - 1]) };
        let (kb, n) = if self.transpose_b { (sb[rb - 1], sb[rb - 2]) } else { (sb[rb - 2], sb[rb - 1]) };
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
        let (ao, bo) = (batch_offsets(&batch, &a.shape, m * k), batch_offsets(&batch, &b.shape, k * n));
        // One tall product instead of many small ones when b is shared by every batch element
        // and a's matrices are stacked rows: same memory order, far better kernel efficiency.
        let stacked_a = !self.transpose_a && ao.iter().enumerate().all(|(t, &o)| o == t * m * k);
        if ao.len() > 1 && stacked_a && bo.iter().all(|&o| o == 0) {
            let (rows, m, offsets) = (m, m * ao.len(), vec![(0, 0)]);
            return Ok(Plan { batch, rows, m, k, n, offsets, a_strides: (k, 1), b_strides });
        }
        let offsets = ao.into_iter().zip(bo).collect();
        Ok(Plan { batch, rows: m, m, k, n, offsets, a_strides, b_strides })
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
        offsets = offsets.iter().flat_map(|&o| (0..size).map(move |i| o + i * s)).collect();
    }
    offsets
}

impl Plan {
    /// Every element the kernels will read lies inside the operands: what makes the raw
    /// pointers handed to gemm sound.
    fn fits(&self, a_len: usize, b_len: usize) -> bool {
        let end = |o: usize, (rs, cs): (usize, usize), r: usize, c: usize| o + (r - 1) * rs + (c - 1) * cs;
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return true;
        }
        self.offsets.iter().all(|&(ao, bo)| {
            end(ao, self.a_strides, self.m, self.k) < a_len && end(bo, self.b_strides, self.k, self.n) < b_len
        })
    }
}

/// The matmul kernel of one element type.
trait Kernel: Arith {
    /// Writes every batch element's product into `out` (zeroed, row-major [batch, m, n]).
    fn product(plan: &Plan, a: &[Self], b: &[Self], out: &mut [Self]);
}

macro_rules! gemm_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            fn product(plan: &Plan, a: &[$t], b: &[$t], out: &mut [$t]) {
                let (m, k, n) = (plan.m, plan.k, plan.n);
                if m * n * k == 0 {
                    return;
                }
                let flops = m * n * k;
                let one = |par: gemm::Parallelism, dst: &mut [$t], (ao, bo): (usize, usize)| {
                    let ((ars, acs), (brs, bcs)) = (plan.a_strides, plan.b_strides);
                    // SAFETY: `Plan::fits` checked (before any kernel runs) that every element
                    // read lies inside `a` and `b`; `dst` holds exactly m * n elements.
                    unsafe {
                        gemm::gemm(m, n, k, dst.as_mut_ptr(), 1, n as isize, false,
                            a.as_ptr().add(ao), acs as isize, ars as isize,
                            b.as_ptr().add(bo), bcs as isize, brs as isize,
                            0.0, 1.0, false, false, false, par)
                    }
                };
                let chunks = out.chunks_mut(m * n).zip(plan.offsets.iter().copied());
                if plan.offsets.len() > 1 && flops < GEMM_PARALLEL_FLOPS && flops * plan.offsets.len() >= GEMM_PARALLEL_FLOPS {
                    let chunks = out.par_chunks_mut(m * n).zip(plan.offsets.par_iter().copied());
                    chunks.for_each(|(dst, o)| one(gemm::Parallelism::None, dst, o));
                } else if flops >= GEMM_PARALLEL_FLOPS {
                    chunks.for_each(|(dst, o)| one(gemm::Parallelism::Rayon(0), dst, o));
                } else {
                    chunks.for_each(|(dst, o)| one(gemm::Parallelism::None, dst, o));
                }
            }
        }
    )*};
}
gemm_kernel!(f32, f64);

macro_rules! loop_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            fn product(plan: &Plan, a: &[$t], b: &[$t], out: &mut [$t]) {
                if out.is_empty() {
                    return;
                }
                let (m, k, n) = (plan.m, plan.k, plan.n);
                let ((ars, acs), (brs, bcs)) = (plan.a_strides, plan.b_strides);
                // One output row at a time, i-k-j order: the innermost loop walks b's row and
                // the output row contiguously (unless b is transposed).
                let row = |index: usize, dst: &mut [$t]| {
                    let (ao, bo) = plan.offsets[index / m];
                    let ai = ao + (index % m) * ars;
                    for p in 0..k {
                        let (x, bp) = (a[ai + p * acs], bo + p * brs);
                        if bcs == 1 {
                            dst.iter_mut().zip(&b[bp..bp + n]).for_each(|(d, &y)| *d = d.wadd(x.wmul(y)));
                        } else {
                            dst.iter_mut().enumerate().for_each(|(j, d)| *d = d.wadd(x.wmul(b[bp + j * bcs])));
                        }
                    }
                };
                if out.len() * k >= PARALLEL_THRESHOLD {
                    out.par_chunks_mut(n).enumerate().for_each(|(i, dst)| row(i, dst));
                } else {
                    out.chunks_mut(n).enumerate().for_each(|(i, dst)| row(i, dst));
                }
            }
        }
    )*};
}
loop_kernel!(i32, i64);

fn run<T: Kernel>(plan: &Plan, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (xs, ys) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    if !plan.fits(xs.len(), ys.len()) {
        return Err(Error::internal("matmul", "kernel plan reaches outside an operand"));
    }
    let mut out = vec![T::zero(); plan.offsets.len() * plan.m * plan.n];
    T::product(plan, xs, ys, &mut out);
    let mut shape = plan.batch.clone();
    shape.extend([plan.rows, plan.n]);
    Tensor::from_vec(out, &shape)
}

impl OpDef for MatMul {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("matmul", inputs, 2)?;
        let (a, b) = (&inputs[0], &inputs[1]);
        check_dtypes(a, b)?;
        let (mut shape, [m, _, n]) = self.dims(a, b)?;
        shape.extend([m, n]);
        Ok(smallvec![TensorType::new(a.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let plan = self.plan(a.ty(), b.ty())?;
        let out = crate::with_numeric!(a.dtype(), T, { run::<T>(&plan, a, b)? },
            return Err(Error::internal("matmul", format!("kernel called with {}", DType::Bool))));
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::INPUTS
    }

    fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], needs: &[bool]) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else { return Ok(smallvec![None, None]) };
        let (a, b) = (saved.input(0)?, saved.input(1)?);
        let (ta, tb) = (self.transpose_a, self.transpose_b);
        let ga = if needs[0] {
            // dA' = g B'^T; stored transposed when A was: A^T-grad = B' g^T.
            let d = if ta { matmul_transposed(ctx, b, g, tb, true)? } else { matmul_transposed(ctx, g, b, false, !tb)? };
            Some(build::sum_to_shape(ctx, &d, &saved.input_types[0].shape)?)
        } else {
            None
        };
        let gb = if needs[1] { Some(self.grad_b(ctx, saved, a, g)?) } else { None };
        Ok(smallvec![ga, gb])
    }
}

impl MatMul {
    /// dB' = A'^T g (stored transposed when B was: g^T A'), summed over broadcast batch dims.
    fn grad_b<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, a: &V, g: &V) -> Result<V> {
        let (ta, tb) = (self.transpose_a, self.transpose_b);
        let (at, bt) = (&saved.input_types[0], &saved.input_types[1]);
        let b_batch = numel(&bt.shape[..bt.ndim() - 2]);
        let a_batch = numel(&at.shape[..at.ndim() - 2]);
        let g_batch = numel(&g.ty().shape[..g.ty().ndim() - 2]);
        // b shared by a batch of a's: one product over the stacked rows instead of a batch of
        // products summed afterwards.
        if !ta && b_batch == 1 && a_batch > 1 && a_batch == g_batch && a_batch != DYN {
            let (rows, k, n) = (a_batch * at.shape[at.ndim() - 2], at.shape[at.ndim() - 1], bt.shape[bt.ndim() - if tb { 2 } else { 1 }]);
            let a2 = build::reshape(ctx, a, &[rows, k])?;
            let g2 = build::reshape(ctx, g, &[rows, n])?;
            let d = if tb { matmul_transposed(ctx, &g2, &a2, true, false)? } else { matmul_transposed(ctx, &a2, &g2, true, false)? };
            return if bt.ndim() == 2 { Ok(d) } else { build::reshape(ctx, &d, &bt.shape) };
        }
        let d = if tb { matmul_transposed(ctx, g, a, true, ta)? } else { matmul_transposed(ctx, a, g, !ta, false)? };
        build::sum_to_shape(ctx, &d, &bt.shape)
    }
}

/// `op_a(a) @ op_b(b)` for operands of rank >= 2, `op_x` swapping the last two axes when
/// `transpose_x` is set (no copy is made).
pub fn matmul_transposed<V: Value>(ctx: &mut dyn Context<V>, a: &V, b: &V, transpose_a: bool, transpose_b: bool) -> Result<V> {
    build::apply1(ctx, MatMul { transpose_a, transpose_b }, &[a.clone(), b.clone()])
}

/// numpy's matmul: batch dimensions broadcast; a rank-1 `a` is a row vector and a rank-1 `b` a
/// column vector, and the dimension they gain is removed from the result.
pub fn matmul<V: Value>(ctx: &mut dyn Context<V>, a: &V, b: &V) -> Result<V> {
    let (at, bt) = (a.ty().clone(), b.ty().clone());
    if at.ndim() >= 2 && bt.ndim() >= 2 {
        return matmul_transposed(ctx, a, b, false, false);
    }
    if at.ndim() == 0 || bt.ndim() == 0 {
        let msg = format!("operands must have at least one dimension, got {} (use mul for scalars)", operands(&at, &bt));
        return Err(Error::shape("matmul", msg));
    }
    check_dtypes(&at, &bt)?;
    let ka = at.shape[at.ndim() - 1];
    let kb = bt.shape[bt.ndim().saturating_sub(2)];
    if ka != kb && ka != DYN && kb != DYN {
        return Err(contraction_error(&at, &bt, ka, kb, "a: [..., m, k] or [k], and b: [..., k, n] or [k]"));
    }
    let a2 = if at.ndim() == 1 { build::reshape(ctx, a, &[1, ka])? } else { a.clone() };
    let b2 = if bt.ndim() == 1 { build::reshape(ctx, b, &[kb, 1])? } else { b.clone() };
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
mod tests {
    use super::*;
    use crate::context::EagerContext;
    use crate::dtype::Element;
    use crate::ops::gradcheck;
    use crate::ErrorKind;

    /// Small integers in [-3, 3]: products and sums stay exact in every dtype.
    fn data(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f64> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) % 7) as f64 - 3.0
            })
            .collect();
        crate::with_dtype!(dtype, T, { Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>(), shape).unwrap() })
    }

    /// Triple loop over broadcast batch indices.
    fn reference(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> (Vec<usize>, Vec<f64>) {
        let (sa, sb) = (a.shape(), b.shape());
        let (ra, rb) = (sa.len(), sb.len());
        let (m, k) = if ta { (sa[ra - 1], sa[ra - 2]) } else { (sa[ra - 2], sa[ra - 1]) };
        let n = if tb { sb[rb - 2] } else { sb[rb - 1] };
        let batch = broadcast_shapes("t", &sa[..ra - 2], &sb[..rb - 2]).unwrap();
        let (xa, xb) = (a.to_f64_vec(), b.to_f64_vec());
        let index = |shape: &[usize], bidx: &[usize], r: usize, c: usize| {
            let own = &shape[..shape.len() - 2];
            let lead = bidx.len() - own.len();
            let mut off = 0;
            for (d, &size) in own.iter().enumerate() {
                off = off * size + if size == 1 { 0 } else { bidx[lead + d] };
            }
            let cols = shape[shape.len() - 1];
            off * shape[shape.len() - 2] * cols + r * cols + c
        };
        let mut out = vec![];
        for t in 0..numel(&batch) {
            let mut bidx = vec![0; batch.len()];
            let mut u = t;
            for d in (0..batch.len()).rev() {
                bidx[d] = u % batch[d];
                u /= batch[d];
            }
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k)
                        .map(|p| {
                            let x = if ta { xa[index(sa, &bidx, p, i)] } else { xa[index(sa, &bidx, i, p)] };
                            let y = if tb { xb[index(sb, &bidx, j, p)] } else { xb[index(sb, &bidx, p, j)] };
                            x * y
                        })
                        .sum();
                    out.push(s);
                }
            }
        }
        let mut shape = batch.to_vec();
        shape.extend([m, n]);
        (shape, out)
    }

    fn check(sa: &[usize], sb: &[usize], ta: bool, tb: bool) {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
            let (a, b) = (data(sa, 1, dtype), data(sb, 2, dtype));
            let c = matmul_transposed(&mut EagerContext, &a, &b, ta, tb).unwrap();
            let (shape, want) = reference(&a, &b, ta, tb);
            assert_eq!(c.shape(), shape.as_slice(), "{sa:?} @ {sb:?} ({ta}, {tb}) {dtype}");
            assert_eq!(c.dtype(), dtype);
            assert_eq!(c.to_f64_vec(), want, "{sa:?} @ {sb:?} ({ta}, {tb}) {dtype}");
        }
    }

    #[test]
    fn matches_the_reference_with_broadcast_batches_and_transposes() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[3, 4], &[4, 5]),
            (&[2, 3, 4], &[4, 5]),
            (&[3, 4], &[2, 4, 5]),
            (&[2, 1, 3, 4], &[5, 4, 6]),
            (&[1, 3, 4], &[2, 4, 5]),
            (&[2, 3, 4], &[1, 4, 5]),
            (&[1, 1], &[1, 7]),
            (&[600, 8, 8], &[600, 8, 8]),
            (&[70, 300], &[300, 40]),
            (&[3, 40, 30], &[30, 40]),
        ];
        for &(sa, sb) in cases {
            check(sa, sb, false, false);
            let swap = |s: &[usize]| {
                let mut s = s.to_vec();
                let r = s.len();
                s.swap(r - 1, r - 2);
                s
            };
            check(&swap(sa), sb, true, false);
            check(sa, &swap(sb), false, true);
            check(&swap(sa), &swap(sb), true, true);
        }
    }

    #[test]
    fn size_zero_dimensions() {
        check(&[0, 3], &[3, 2], false, false);
        check(&[2, 0], &[0, 3], false, false);
        check(&[0, 2, 3], &[3, 4], false, false);
        check(&[2, 3], &[3, 0], false, false);
        let c = matmul(&mut EagerContext, &data(&[2, 0], 1, DType::F32), &data(&[0, 3], 2, DType::F32)).unwrap();
        assert_eq!((c.shape(), c.to_f64_vec()), (&[2, 3][..], vec![0.0; 6]));
    }

    #[test]
    fn integer_products_wrap() {
        let a = Tensor::from_vec(vec![i32::MAX, 1], &[1, 2]).unwrap();
        let b = Tensor::from_vec(vec![2i32, 3], &[2, 1]).unwrap();
        let c = matmul(&mut EagerContext, &a, &b).unwrap();
        assert_eq!(c.as_slice::<i32>().unwrap(), &[i32::MAX.wrapping_mul(2).wrapping_add(3)]);
    }

    #[test]
    fn rank_one_operands_follow_numpy() {
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[3], &[3], &[]),
            (&[3], &[3, 4], &[4]),
            (&[2, 3], &[3], &[2]),
            (&[5, 2, 3], &[3], &[5, 2]),
            (&[3], &[5, 3, 4], &[5, 4]),
        ];
        for &(sa, sb, want) in cases {
            let (a, b) = (data(sa, 3, DType::F64), data(sb, 4, DType::F64));
            let c = matmul(&mut EagerContext, &a, &b).unwrap();
            assert_eq!(c.shape(), want, "{sa:?} @ {sb:?}");
            let a2 = if sa.len() == 1 { a.reshaped(&[1, sa[0]]).unwrap() } else { a.clone() };
            let b2 = if sb.len() == 1 { b.reshaped(&[sb[0], 1]).unwrap() } else { b.clone() };
            assert_eq!(c.to_f64_vec(), reference(&a2, &b2, false, false).1);
        }
    }

    fn err(sa: &[usize], da: DType, sb: &[usize], db: DType) -> Error {
        matmul(&mut EagerContext, &data(sa, 1, da), &data(sb, 2, db)).unwrap_err()
    }

    #[test]
    fn errors_name_the_op_both_operands_and_the_expectation() {
        let e = err(&[2, 3], DType::F32, &[4, 5], DType::F32);
        assert_eq!(e.kind, ErrorKind::Shape);
        let text = e.to_string();
        assert!(text.starts_with("matmul:") && text.contains("float32[2, 3]") && text.contains("float32[4, 5]"), "{text}");
        assert!(text.contains("[..., k, n]"), "{text}");
        let e = err(&[3], DType::F32, &[4, 5], DType::F32);
        assert!(e.kind == ErrorKind::Shape && e.to_string().contains("float32[3]"), "{e}");
        let e = err(&[2, 3, 4], DType::F64, &[3, 4, 5], DType::F64);
        assert!(e.kind == ErrorKind::Shape && e.to_string().contains("batch dimensions [2] and [3]"), "{e}");
        let e = err(&[], DType::F64, &[3], DType::F64);
        assert!(e.kind == ErrorKind::Shape && e.to_string().contains("at least one dimension"), "{e}");
        let e = err(&[2, 3], DType::F32, &[3, 2], DType::F64);
        assert!(e.kind == ErrorKind::DType && e.to_string().contains("float64[3, 2]"), "{e}");
        let t = Tensor::from_vec(vec![true; 4], &[2, 2]).unwrap();
        let e = matmul(&mut EagerContext, &t, &t).unwrap_err();
        assert!(e.kind == ErrorKind::DType && e.to_string().contains("bool[2, 2]"), "{e}");
        let v = data(&[3], 1, DType::F32);
        let e = matmul_transposed(&mut EagerContext, &v, &v, false, false).unwrap_err();
        assert!(e.kind == ErrorKind::Shape && e.to_string().contains("rank >= 2"), "{e}");
    }

    #[test]
    fn gradients_match_finite_differences() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3], &[3, 4]),
            (&[2, 2, 3], &[3, 4]),
            (&[3, 2], &[2, 2, 3]),
            (&[2, 1, 2, 3], &[3, 3, 2]),
            (&[3], &[3, 2]),
            (&[2, 3], &[3]),
        ];
        for &(sa, sb) in cases {
            let (a, b) = (gradcheck::ramp(sa), gradcheck::ramp(sb));
            let scaled = |x: &Tensor| Tensor::from_vec(x.to_f64_vec().iter().map(|v| v * 0.1).collect(), x.shape()).unwrap();
            let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
                let y = matmul(ctx, &xs[0], &xs[1])?;
                gradcheck::smooth_loss(ctx, &y)
            };
            gradcheck::check_gradients(&f, &[scaled(&a), scaled(&b)]);
        }
    }

    #[test]
    fn transposed_operand_gradients_match_finite_differences() {
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            let (a, b) = (gradcheck::ramp(&[2, 3, 2]), gradcheck::ramp(&[4, 3]));
            let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
                let y = matmul_transposed(ctx, &xs[0], &xs[1], ta, tb)?;
                gradcheck::smooth_loss(ctx, &y)
            };
            let (a, b) = if ta { (a, b) } else { (a.reshaped(&[2, 2, 3]).unwrap(), b) };
            let b = if tb { b } else { b.reshaped(&[3, 4]).unwrap() };
            gradcheck::check_gradients(&f, &[a, b]);
        }
    }
}
