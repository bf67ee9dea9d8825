//! The factorisations and substitutions of `gl.linalg` as kernels (faer's blocked LAPACK-style
//! algorithms): LU with partial pivoting, the row order of LAPACK's swaps, LU solves,
//! triangular solves, Cholesky and Householder QR, over leading batch axes, in float32 and
//! float64.
//!
//! They are the fast path of composite calls (`control::call`): a graph holds each as a `Call`
//! whose callee is the algorithm written as a loop of the op table's ops (`gl.linalg._loops`,
//! what every compiler is given and what derivatives differentiate) and whose `kernel` is the
//! op here, which the frame executor and eager mode run instead. So none has a gradient, a
//! tangent or an emission of its own: asked for one, they raise (a bug: the composite's callee
//! answers for them). Conventions are LAPACK's, as the loops': `P a = L U` with L's unit lower
//! triangle packed below U; `piv[i]` is the row swapped with row i at step i; `perm[i]` the row
//! of `a` that is row i of `P a`. A zero pivot divides by zero (infinities and NaN, as LAPACK's
//! solves give); a matrix that is not positive definite gives a Cholesky factor of NaN.

use faer::dyn_stack::StackReq;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::linalg::householder::{
    apply_block_householder_sequence_on_the_left_in_place_scratch as apply_scratch,
    apply_block_householder_sequence_on_the_left_in_place_with_conj as apply_sequence,
};
use faer::linalg::lu::partial_pivoting::factor::{lu_in_place, lu_in_place_scratch};
use faer::linalg::qr::no_pivoting::factor::{
    qr_in_place, qr_in_place_scratch, recommended_block_size,
};
use faer::linalg::triangular_solve as tri;
use faer::traits::RealField;
use faer::{Conj, Mat, MatMut, MatRef, Par};
use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::{expect_arity, Grads, OpDef, Saved, Saves, Tangents, Types, Values};
use crate::dtype::{DType, Element};
use crate::emit::{Emitter, MlirValue};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Matrices at least this large are factored with rayon's threads.
const PARALLEL_FROM: usize = 192;

fn par(n: usize) -> Par {
    if n >= PARALLEL_FROM {
        Par::rayon(0)
    } else {
        Par::Seq
    }
}

/// Checks that `t` is a batch of square float matrices; gives `n` (DYN when unknown).
fn square(op: &'static str, what: &str, t: &TensorType) -> Result<usize> {
    let s = &t.shape;
    if s.len() < 2 {
        return Err(Error::shape(
            op,
            format!("`{what}` must be matrices (..., n, n), got {t}"),
        ));
    }
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    if r != c && r != DYN && c != DYN {
        return Err(Error::shape(
            op,
            format!("`{what}` must be square matrices (..., n, n), got {t}"),
        ));
    }
    if !t.dtype.is_float() {
        return Err(Error::dtype(
            op,
            format!("`{what}` must be float32 or float64, got {}", t.dtype),
        ));
    }
    Ok(if r == DYN { c } else { r })
}

/// Checks that `b` is (..., n, k) of `a`'s dtype and batch.
fn right_hand_side(op: &'static str, a: &TensorType, b: &TensorType) -> Result<()> {
    let (sa, sb) = (&a.shape, &b.shape);
    let fits = sb.len() == sa.len()
        && sa[..sa.len() - 1]
            .iter()
            .zip(&sb[..sb.len() - 1])
            .all(|(&x, &y)| x == y || x == DYN || y == DYN);
    if !fits || a.dtype != b.dtype {
        return Err(Error::shape(
            op,
            format!("`b` {b} does not match the matrices {a}: (..., n, k) of their dtype"),
        ));
    }
    Ok(())
}

/// The kernels have no derivatives: the composite call's callee has them.
fn no_gradient<V>(op: &'static str) -> Result<Grads<V>> {
    Err(Error::internal(
        op,
        "a factorisation kernel was differentiated: its composite call's loop should have been",
    ))
}

fn no_tangent<V>(op: &'static str) -> Result<Tangents<V>> {
    Err(Error::internal(
        op,
        "a factorisation kernel was differentiated: its composite call's loop should have been",
    ))
}

fn no_emission(e: &Emitter, op: &str) -> Result<Values<MlirValue>> {
    Err(e.unsupported(format!(
        "{op} is emitted through its composite call's loop, never on its own"
    )))
}

const NOT_DIFFERENTIABLE: Saves =
    Saves::NotDifferentiable("a factorisation kernel; gl.linalg's rules differentiate it");

/// Runs `each(matrix k of every input, matrix k of every output)` over the batch; the outputs
/// start as `init` (copies of inputs or zeros) and are returned.
fn batched<T: Element>(
    inputs: &[&[T]],
    in_sizes: &[usize],
    mut outputs: Vec<Vec<T>>,
    out_sizes: &[usize],
    mut each: impl FnMut(&[&[T]], &mut [&mut [T]]),
) -> Vec<Vec<T>> {
    let count = match out_sizes.first() {
        Some(&s) if s > 0 => outputs[0].len() / s,
        _ => 0,
    };
    for k in 0..count {
        let ins: Vec<&[T]> = inputs
            .iter()
            .zip(in_sizes)
            .map(|(x, &s)| &x[k * s..(k + 1) * s])
            .collect();
        let mut outs: Vec<&mut [T]> = outputs
            .iter_mut()
            .zip(out_sizes)
            .map(|(y, &s)| &mut y[k * s..(k + 1) * s])
            .collect();
        each(&ins, &mut outs);
    }
    outputs
}

fn float_kernel<R>(
    op: &'static str,
    dtype: DType,
    f32_case: impl FnOnce() -> Result<R>,
    f64_case: impl FnOnce() -> Result<R>,
) -> Result<R> {
    match dtype {
        DType::F32 => f32_case(),
        DType::F64 => f64_case(),
        other => Err(Error::internal(
            op,
            format!("{other} (the rule refuses it)"),
        )),
    }
}

// --- LU ----------------------------------------------------------------------------------------

/// `a` (..., n, n) -> `(lu, piv, perm)`: the packed factors, LAPACK's swaps (int32) and the row
/// order they make (int32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LuFactor;
op_attrs!(LuFactor = "lu_factor" {});

/// The factors of one row-major `n x n` matrix in place; the swaps and the row order.
fn lu_one<T: RealField + Copy>(a: &mut [T], n: usize, piv: &mut [i32], order: &mut [i32]) {
    let mut perm = vec![0usize; n];
    let mut perm_inv = vec![0usize; n];
    let scratch = lu_in_place_scratch::<usize, T>(n, n, par(n), Default::default());
    let mut buffer = MemBuffer::new(scratch);
    // faer's blocked LU runs on contiguous columns: a column-major copy factors faster than
    // the row-major buffer in place, for the cost of two copies
    let mut m = Mat::<T>::from_fn(n, n, |i, j| a[i * n + j]);
    lu_in_place(
        m.as_mut(),
        &mut perm,
        &mut perm_inv,
        par(n),
        MemStack::new(&mut buffer),
        Default::default(),
    );
    for i in 0..n {
        for j in 0..n {
            a[i * n + j] = m[(i, j)];
        }
    }
    // LAPACK's swaps from the row order: replay them on the identity order
    let mut at: Vec<usize> = (0..n).collect(); // at[r]: where row r of `a` now is
    let mut current: Vec<usize> = (0..n).collect(); // current[i]: the row now at i
    for i in 0..n {
        let j = at[perm[i]];
        piv[i] = j as i32;
        let (ri, rj) = (current[i], current[j]);
        current.swap(i, j);
        at[ri] = j;
        at[rj] = i;
        order[i] = perm[i] as i32;
    }
}

impl OpDef for LuFactor {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("lu_factor", inputs, 1)?;
        square("lu_factor", "a", &inputs[0])?;
        let a = &inputs[0];
        let rows = TensorType {
            dtype: DType::I32,
            shape: a.shape[..a.shape.len() - 1].into(),
        };
        Ok(smallvec![a.clone(), rows.clone(), rows])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let a = &inputs[0];
        let n = *a.shape().last().unwrap_or(&0);
        let rows = a.numel() / n.max(1);
        let mut piv = vec![0i32; rows];
        let mut order = vec![0i32; rows];
        let lu = match a.dtype() {
            DType::F32 => lu_batch::<f32>(a, n, &mut piv, &mut order)?,
            _ => lu_batch::<f64>(a, n, &mut piv, &mut order)?,
        };
        Ok(smallvec![
            lu,
            Tensor::from_vec(piv, &outputs[1].shape)?,
            Tensor::from_vec(order, &outputs[2].shape)?
        ])
    }

    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        cubic(inputs)
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "lu_factor")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("lu_factor")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("lu_factor")
    }
}

fn lu_batch<T: RealField + Element>(
    a: &Tensor,
    n: usize,
    piv: &mut [i32],
    order: &mut [i32],
) -> Result<Tensor> {
    let mut data = a.as_slice::<T>()?.to_vec();
    for (k, m) in data.chunks_mut((n * n).max(1)).enumerate() {
        if n > 0 {
            lu_one(
                m,
                n,
                &mut piv[k * n..(k + 1) * n],
                &mut order[k * n..(k + 1) * n],
            );
        }
    }
    Tensor::from_vec(data, a.shape())
}

/// n^3 per matrix: what an executor weighs.
fn cubic(inputs: &[&[usize]]) -> usize {
    let a = inputs.first().copied().unwrap_or(&[]);
    let n = a.last().copied().unwrap_or(0);
    a.iter().product::<usize>().saturating_mul(n)
}

/// `piv` (..., n) int32 -> the row order (..., n) int32 that LAPACK's swaps make in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LuPermutation;
op_attrs!(LuPermutation = "lu_permutation" {});

impl OpDef for LuPermutation {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("lu_permutation", inputs, 1)?;
        let p = &inputs[0];
        if p.dtype != DType::I32 || p.shape.is_empty() {
            return Err(Error::dtype(
                "lu_permutation",
                format!("`piv` must be int32 (..., n), got {p}"),
            ));
        }
        Ok(smallvec![p.clone()])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let p = &inputs[0];
        let n = *p.shape().last().unwrap_or(&0);
        let piv = p.as_slice::<i32>()?;
        let mut order = vec![0i32; piv.len()];
        for (swaps, row) in piv.chunks(n.max(1)).zip(order.chunks_mut(n.max(1))) {
            for (i, r) in row.iter_mut().enumerate() {
                *r = i as i32;
            }
            for (i, &j) in swaps.iter().enumerate() {
                // a swap out of range is skipped, as the loop's one-hot masks skip it
                if (0..n as i32).contains(&j) {
                    row.swap(i, j as usize);
                }
            }
        }
        Ok(smallvec![Tensor::from_vec(order, p.shape())?])
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "lu_permutation")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("lu_permutation")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("lu_permutation")
    }
}

// --- solves ------------------------------------------------------------------------------------

/// `(a, b)` -> `x` with `T x = b` for the triangle of `a` (..., n, n) that `lower` names (its
/// diagonal ones when `unit_diagonal`; the other triangle is never read), `b` (..., n, k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TriangularSolve {
    pub lower: bool,
    pub unit_diagonal: bool,
}
op_attrs!(TriangularSolve = "triangular_solve" { lower, unit_diagonal });

/// `x` in place of the row-major `b` (n x k) for the row-major triangle `a` (n x n).
fn triangular_one<T: RealField + Copy>(
    a: &[T],
    b: &mut [T],
    n: usize,
    k: usize,
    lower: bool,
    unit: bool,
) {
    let t = MatRef::from_row_major_slice(a, n, n);
    let x = MatMut::from_row_major_slice_mut(b, n, k);
    let p = par(n);
    match (lower, unit) {
        (true, false) => tri::solve_lower_triangular_in_place(t, x, p),
        (true, true) => tri::solve_unit_lower_triangular_in_place(t, x, p),
        (false, false) => tri::solve_upper_triangular_in_place(t, x, p),
        (false, true) => tri::solve_unit_upper_triangular_in_place(t, x, p),
    }
}

impl OpDef for TriangularSolve {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("triangular_solve", inputs, 2)?;
        square("triangular_solve", "a", &inputs[0])?;
        right_hand_side("triangular_solve", &inputs[0], &inputs[1])?;
        Ok(smallvec![inputs[1].clone()])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let n = *a.shape().last().unwrap_or(&0);
        let k = *b.shape().last().unwrap_or(&0);
        let (lower, unit) = (self.lower, self.unit_diagonal);
        fn run<T: RealField + Element>(
            a: &Tensor,
            b: &Tensor,
            (n, k, lower, unit): (usize, usize, bool, bool),
        ) -> Result<Tensor> {
            let x = batched(
                &[a.as_slice::<T>()?],
                &[n * n],
                vec![b.as_slice::<T>()?.to_vec()],
                &[n * k],
                |ins, outs| triangular_one(ins[0], outs[0], n, k, lower, unit),
            );
            Tensor::from_vec(x.into_iter().next().unwrap_or_default(), b.shape())
        }
        let dims = (n, k, lower, unit);
        let x = float_kernel(
            "triangular_solve",
            a.dtype(),
            || run::<f32>(a, b, dims),
            || run::<f64>(a, b, dims),
        )?;
        Ok(smallvec![x])
    }

    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        let b = inputs.get(1).copied().unwrap_or(&[]);
        let n = inputs[0].last().copied().unwrap_or(0);
        b.iter().product::<usize>().saturating_mul(n)
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "triangular_solve")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("triangular_solve")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("triangular_solve")
    }
}

/// `(lu, perm, b)` -> `x` with `a x = b` (`trans`: `a^T x = b`) from `lu_factor(a)`'s packed
/// factors and row order, `b` (..., n, k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LuSolve {
    pub trans: bool,
}
op_attrs!(LuSolve = "lu_solve" { trans });

fn lu_solve_one<T: RealField + Copy>(
    lu: &[T],
    order: &[i32],
    b: &[T],
    x: &mut [T],
    (n, k, trans): (usize, usize, bool),
) {
    let row = |i: usize| (order[i].max(0) as usize).min(n - 1);
    let f = MatRef::from_row_major_slice(lu, n, n);
    if !trans {
        // x = U^-1 L^-1 P b
        for i in 0..n {
            x[i * k..(i + 1) * k].copy_from_slice(&b[row(i) * k..(row(i) + 1) * k]);
        }
        let mut m = MatMut::from_row_major_slice_mut(x, n, k);
        tri::solve_unit_lower_triangular_in_place(f, m.as_mut(), par(n));
        tri::solve_upper_triangular_in_place(f, m, par(n));
    } else {
        // x = P^T L^-T U^-T b
        let mut y = b.to_vec();
        let mut m = MatMut::from_row_major_slice_mut(&mut y, n, k);
        tri::solve_lower_triangular_in_place(f.transpose(), m.as_mut(), par(n));
        tri::solve_unit_upper_triangular_in_place(f.transpose(), m, par(n));
        for i in 0..n {
            x[row(i) * k..(row(i) + 1) * k].copy_from_slice(&y[i * k..(i + 1) * k]);
        }
    }
}

impl OpDef for LuSolve {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("lu_solve", inputs, 3)?;
        square("lu_solve", "lu", &inputs[0])?;
        let (lu, perm) = (&inputs[0], &inputs[1]);
        let rows = &lu.shape[..lu.shape.len() - 1];
        let fits = perm.shape.len() == rows.len()
            && perm
                .shape
                .iter()
                .zip(rows)
                .all(|(&x, &y)| x == y || x == DYN || y == DYN);
        if perm.dtype != DType::I32 || !fits {
            return Err(Error::shape(
                "lu_solve",
                format!("`perm` must be int32 shaped like lu's rows, got {perm} for {lu}"),
            ));
        }
        right_hand_side("lu_solve", lu, &inputs[2])?;
        Ok(smallvec![inputs[2].clone()])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (lu, perm, b) = (&inputs[0], &inputs[1], &inputs[2]);
        let n = *lu.shape().last().unwrap_or(&0);
        let k = *b.shape().last().unwrap_or(&0);
        let order = perm.as_slice::<i32>()?;
        fn run<T: RealField + Element>(
            lu: &Tensor,
            order: &[i32],
            b: &Tensor,
            dims: (usize, usize, bool),
        ) -> Result<Tensor> {
            let (n, k, _) = dims;
            let lu_data = lu.as_slice::<T>()?;
            let b_data = b.as_slice::<T>()?;
            let mut x = vec![T::default(); b_data.len()];
            if n > 0 && k > 0 {
                let count = b_data.len() / (n * k);
                for m in 0..count {
                    lu_solve_one(
                        &lu_data[m * n * n..(m + 1) * n * n],
                        &order[m * n..(m + 1) * n],
                        &b_data[m * n * k..(m + 1) * n * k],
                        &mut x[m * n * k..(m + 1) * n * k],
                        dims,
                    );
                }
            }
            Tensor::from_vec(x, b.shape())
        }
        let dims = (n, k, self.trans);
        let x = float_kernel(
            "lu_solve",
            lu.dtype(),
            || run::<f32>(lu, order, b, dims),
            || run::<f64>(lu, order, b, dims),
        )?;
        Ok(smallvec![x])
    }

    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        let b = inputs.get(2).copied().unwrap_or(&[]);
        let n = inputs[0].last().copied().unwrap_or(0);
        b.iter().product::<usize>().saturating_mul(2 * n)
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "lu_solve")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("lu_solve")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("lu_solve")
    }
}

// --- Cholesky ----------------------------------------------------------------------------------

/// `a` (..., n, n) -> the lower triangular `L` with `L L^T = a`, read from `a`'s lower
/// triangle; all NaN where `a` is not positive definite (as JAX's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cholesky;
op_attrs!(Cholesky = "cholesky" {});

fn cholesky_one<T: RealField + Copy>(a: &mut [T], n: usize) {
    let scratch = cholesky_in_place_scratch::<T>(n, par(n), Default::default());
    let mut buffer = MemBuffer::new(scratch);
    let m = MatMut::from_row_major_slice_mut(a, n, n);
    let ok = cholesky_in_place(
        m,
        Default::default(),
        par(n),
        MemStack::new(&mut buffer),
        Default::default(),
    )
    .is_ok();
    for i in 0..n {
        for j in 0..n {
            let v = &mut a[i * n + j];
            if !ok {
                *v = T::nan_impl();
            } else if j > i {
                *v = T::zero_impl();
            }
        }
    }
}

impl OpDef for Cholesky {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("cholesky", inputs, 1)?;
        square("cholesky", "a", &inputs[0])?;
        Ok(smallvec![inputs[0].clone()])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let a = &inputs[0];
        let n = *a.shape().last().unwrap_or(&0);
        fn run<T: RealField + Element>(a: &Tensor, n: usize) -> Result<Tensor> {
            let mut data = a.as_slice::<T>()?.to_vec();
            if n > 0 {
                for m in data.chunks_mut(n * n) {
                    cholesky_one(m, n);
                }
            }
            Tensor::from_vec(data, a.shape())
        }
        let l = float_kernel(
            "cholesky",
            a.dtype(),
            || run::<f32>(a, n),
            || run::<f64>(a, n),
        )?;
        Ok(smallvec![l])
    }

    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        cubic(inputs) / 3
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "cholesky")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("cholesky")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("cholesky")
    }
}

// --- QR ----------------------------------------------------------------------------------------

/// `a` (..., m, n) -> `(q, r)`: `q` (..., m, m) orthogonal and `r` (..., m, n) upper triangular
/// with `a = q r`, by Householder reflections with LAPACK's signs (`r`'s diagonal is
/// `-sign(x_j) |x|`; no reflection where a column has nothing below the diagonal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HouseholderQr;
op_attrs!(HouseholderQr = "householder_qr" {});

fn qr_one<T: RealField + Copy>(a: &[T], q: &mut [T], r: &mut [T], m: usize, n: usize) {
    let k = m.min(n);
    let mut f = MatRef::from_row_major_slice(a, m, n).to_owned();
    let block = recommended_block_size::<T>(m, n).max(1);
    let mut coeff = Mat::<T>::zeros(block, k);
    let scratch = StackReq::any_of(&[
        qr_in_place_scratch::<T>(m, n, block, par(m), Default::default()),
        apply_scratch::<T>(m, block, m),
    ]);
    let mut buffer = MemBuffer::new(scratch);
    qr_in_place(
        f.as_mut(),
        coeff.as_mut(),
        par(m),
        MemStack::new(&mut buffer),
        Default::default(),
    );
    let mut full = Mat::<T>::identity(m, m);
    apply_sequence(
        f.as_ref().get(.., ..k),
        coeff.as_ref(),
        Conj::No,
        full.as_mut(),
        par(m),
        MemStack::new(&mut buffer),
    );
    for i in 0..m {
        for j in 0..m {
            q[i * m + j] = full[(i, j)];
        }
        for j in 0..n {
            r[i * n + j] = if j >= i { f[(i, j)] } else { T::zero_impl() };
        }
    }
}

impl OpDef for HouseholderQr {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("householder_qr", inputs, 1)?;
        let a = &inputs[0];
        if a.shape.len() < 2 || !a.dtype.is_float() {
            return Err(Error::shape(
                "householder_qr",
                format!("`a` must be float32 or float64 matrices (..., m, n), got {a}"),
            ));
        }
        let m = a.shape[a.shape.len() - 2];
        let mut q = a.clone();
        let last = q.shape.len() - 1;
        q.shape[last] = m;
        Ok(smallvec![q, a.clone()])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let a = &inputs[0];
        let s = a.shape();
        let (m, n) = (s[s.len() - 2], s[s.len() - 1]);
        fn run<T: RealField + Element>(
            a: &Tensor,
            (m, n): (usize, usize),
            outputs: &[TensorType],
        ) -> Result<Values<Tensor>> {
            let data = a.as_slice::<T>()?;
            let q_shape = &outputs[0].shape;
            let batch: usize = q_shape[..q_shape.len() - 2].iter().product();
            let mut q = vec![T::default(); batch * m * m];
            let mut r = vec![T::default(); data.len()];
            for k in 0..batch {
                let q_k = &mut q[k * m * m..(k + 1) * m * m];
                if n == 0 {
                    // no columns, no reflections: q is the identity
                    for i in 0..m {
                        q_k[i * m + i] = T::one_impl();
                    }
                } else if m > 0 {
                    let a_k = &data[k * m * n..(k + 1) * m * n];
                    qr_one(a_k, q_k, &mut r[k * m * n..(k + 1) * m * n], m, n);
                }
            }
            Ok(smallvec![
                Tensor::from_vec(q, &outputs[0].shape)?,
                Tensor::from_vec(r, &outputs[1].shape)?
            ])
        }
        float_kernel(
            "householder_qr",
            a.dtype(),
            || run::<f32>(a, (m, n), outputs),
            || run::<f64>(a, (m, n), outputs),
        )
    }

    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        cubic(inputs).saturating_mul(2)
    }

    fn saves(&self) -> Saves {
        NOT_DIFFERENTIABLE
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        no_emission(e, "householder_qr")
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        no_gradient("householder_qr")
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        no_tangent("householder_qr")
    }
}

#[cfg(test)]
#[path = "factor_tests.rs"]
mod tests;
