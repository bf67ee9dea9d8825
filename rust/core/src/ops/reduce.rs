//! Reductions over a set of axes: `sum`, `reduce_max`, `reduce_min` (and the `mean` builder).
//! Axes are stored absolute and sorted; `keepdims` keeps reduced axes with size 1.
//!
//! Gradients: sum broadcasts g back over the reduced axes; max/min send g to the elements equal
//! to the result, split evenly between ties (as TensorFlow does); mean is sum times 1/n.
//!
//! MLIR: `stablehlo.reduce` with an `add`/`maximum`/`minimum` region from 0, the lowest or the
//! highest value; keepdims reshapes the result.

use smallvec::{smallvec, SmallVec};

use super::attrs::op_attrs;
use super::kernels::{self, Arith, PARALLEL_THRESHOLD};
use super::parallel;
use super::rules::{check_dtype, Accepts};
use super::{
    build, dest, expect_arity, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents, Types,
    Values,
};
use crate::dtype::{DType, Element, Storage};
use crate::emit::{Emitter, MlirValue, ScalarForm, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{normalize_axes, numel, Shape, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Output shape of reducing `shape` over `axes`.
pub fn reduced_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Shape {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

fn reduce_infer(
    op: &'static str,
    accepts: Accepts,
    axes: &[usize],
    keepdims: bool,
    inputs: &[TensorType],
) -> Result<Types> {
    expect_arity(op, inputs, 1)?;
    let x = &inputs[0];
    check_dtype(op, accepts, x)?;
    if let Some(&bad) = axes.iter().find(|&&a| a >= x.ndim()) {
        return Err(Error::index(
            op,
            format!(
                "axis {bad} is out of bounds for a tensor of rank {}",
                x.ndim()
            ),
        ));
    }
    Ok(smallvec![TensorType::new(
        x.dtype,
        &reduced_shape(&x.shape, axes, keepdims)
    )])
}

/// Inputs below this many elements are reduced on one thread: one thread reduces them in less
/// time than splitting over rayon saves (measured: `docs/notes.md`), and loses less on a busy
/// machine. Softmax rows and bias gradients of typical batches stay below it.
const PARALLEL_ELEMENTS: usize = 8 * PARALLEL_THRESHOLD;
/// Input elements per parallel task.
const TASK_ELEMENTS: usize = 2 * PARALLEL_THRESHOLD;

/// Folds `x` over `axes` with `f`, starting from `init`; the result has `out_shape`. Reads the
/// input in place: trailing reduced axes fold contiguous runs, trailing kept axes accumulate
/// whole rows, so both inner loops stream memory (and vectorise).
fn fold<T: Element + Arith>(
    x: &Tensor,
    axes: &[usize],
    out_shape: &[usize],
    init: T,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Result<Tensor> {
    let mut out = vec![init; numel(out_shape)];
    fold_into(x.as_slice::<T>()?, x.shape(), axes, &mut out, init, &f);
    Tensor::from_vec(out, out_shape)
}

/// `fold` of `data` (of `shape`) written into `out` (of the output's size).
fn fold_into<T: Copy + Send + Sync>(
    data: &[T],
    shape: &[usize],
    axes: &[usize],
    out: &mut [T],
    init: T,
    f: &(impl Fn(T, T) -> T + Sync),
) {
    out.fill(init);
    if out.is_empty() || data.is_empty() {
        return;
    }
    match merge_dims(shape, axes).as_slice() {
        [] | [(_, true)] => out[0] = fold_all(data, init, f),
        [(_, false)] => out.copy_from_slice(data),
        &[(r, true), (k, false)] => fold_leading(data, r, k, init, f, out),
        dims => fold_general(data, dims, init, f, out),
    }
}

/// The input's dimensions as (size, reduced), without size-1 dimensions and with neighbours of
/// the same kind merged: [2, 3, 4] reduced over (1, 2) is [(2, kept), (12, reduced)].
fn merge_dims(shape: &[usize], axes: &[usize]) -> SmallVec<[(usize, bool); 4]> {
    let mut dims: SmallVec<[(usize, bool); 4]> = SmallVec::new();
    for (i, &d) in shape.iter().enumerate().filter(|&(_, &d)| d != 1) {
        let reduced = axes.contains(&i);
        match dims.last_mut() {
            Some((size, r)) if *r == reduced => *size *= d,
            _ => dims.push((d, reduced)),
        }
    }
    dims
}

/// Folds a contiguous run with 32 independent accumulators: one chain of dependent adds or
/// compares would bound the speed by their latency; the lanes vectorise. Short runs (softmax
/// over 10 classes) fold directly: setting up and combining lanes would cost more.
fn fold_run<T: Copy>(run: &[T], init: T, f: &impl Fn(T, T) -> T) -> T {
    const N: usize = 32;
    if run.len() < 2 * N {
        return run.iter().fold(init, |a, &v| f(a, v));
    }
    let mut lanes = [init; N];
    let mut chunks = run.chunks_exact(N);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = f(*l, v);
        }
    }
    // Halving combines: log2(N) dependent steps instead of N.
    let mut width = N / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] = f(lanes[i], lanes[i + width]);
        }
        width /= 2;
    }
    chunks.remainder().iter().fold(lanes[0], |a, &v| f(a, v))
}

fn fold_all<T: Copy + Send + Sync>(data: &[T], init: T, f: &(impl Fn(T, T) -> T + Sync)) -> T {
    if data.len() < PARALLEL_ELEMENTS {
        return fold_run(data, init, f);
    }
    // The partial results combine in order: the same bits whatever the threads did.
    let partials = parallel::map_chunks(data, TASK_ELEMENTS, &|c| fold_run(c, init, f));
    partials.into_iter().fold(init, f)
}

/// Column folds of a row-major [r, k] block: `acc[j] = f(acc[j], x[i, j])` row after row.
fn fold_rows_into<T: Copy>(acc: &mut [T], rows: &[T], f: &impl Fn(T, T) -> T) {
    for row in rows.chunks_exact(acc.len()) {
        acc.iter_mut().zip(row).for_each(|(a, &v)| *a = f(*a, v));
    }
}

/// Reduction of the leading axis of [r, k] (a bias gradient over the batch). In parallel, wide
/// blocks split their columns; tall narrow ones split their rows into partial results.
fn fold_leading<T: Copy + Send + Sync>(
    data: &[T],
    r: usize,
    k: usize,
    init: T,
    f: &(impl Fn(T, T) -> T + Sync),
    acc: &mut [T],
) {
    if data.len() < PARALLEL_ELEMENTS {
        fold_rows_into(acc, data, f);
    } else if k >= 4096 {
        parallel::chunks_mut(acc, 1024, &|c, block| {
            let cols = c * 1024..c * 1024 + block.len();
            (0..r).for_each(|i| {
                block
                    .iter_mut()
                    .zip(&data[i * k..][cols.clone()])
                    .for_each(|(a, &v)| *a = f(*a, v))
            });
        });
    } else {
        let rows_per_task = (TASK_ELEMENTS / k).max(1);
        let partials = parallel::map_chunks(data, rows_per_task * k, &|rows| {
            let mut part = vec![init; k];
            fold_rows_into(&mut part, rows, f);
            part
        });
        partials.iter().for_each(|p| fold_rows_into(acc, p, f));
    }
}

/// Any other pattern. Output units are single elements when the innermost dimension is reduced
/// (each folds runs of it) and rows of the innermost kept dimension otherwise (each
/// accumulates whole input rows); units are independent, so they are split between threads.
fn fold_general<T: Copy + Send + Sync>(
    data: &[T],
    dims: &[(usize, bool)],
    init: T,
    f: &(impl Fn(T, T) -> T + Sync),
    out: &mut [T],
) {
    let out_len = out.len();
    let (inner, inner_reduced) = dims[dims.len() - 1];
    let mut stride = 1;
    let mut strides: SmallVec<[usize; 4]> = smallvec![0; dims.len()];
    for (s, &(d, _)) in strides.iter_mut().zip(dims).rev() {
        *s = stride;
        stride *= d;
    }
    let outer = dims.len() - 1;
    let reduced: Vec<usize> = dims[..outer]
        .iter()
        .zip(&strides)
        .filter(|((_, r), _)| *r)
        .fold(vec![0], |offs, (&(d, _), &s)| {
            offs.iter()
                .flat_map(|&o| (0..d).map(move |i| o + i * s))
                .collect()
        });
    let kept: SmallVec<[(usize, usize); 4]> = dims[..outer]
        .iter()
        .zip(&strides)
        .filter(|((_, r), _)| !*r)
        .map(|(&(d, _), &s)| (d, s))
        .collect();
    let base = |mut unit: usize| {
        kept.iter().rev().fold(0, |off, &(d, s)| {
            let i = unit % d;
            unit /= d;
            off + i * s
        })
    };
    let unit = if inner_reduced { 1 } else { inner };
    let work = |(u, dst): (usize, &mut [T])| {
        let b = base(u);
        if inner_reduced {
            dst[0] = reduced.iter().fold(init, |a, &o| {
                f(a, fold_run(&data[b + o..b + o + inner], init, f))
            });
        } else {
            reduced
                .iter()
                .for_each(|&o| fold_rows_into(dst, &data[b + o..b + o + inner], f));
        }
    };
    if data.len() < PARALLEL_ELEMENTS {
        out.chunks_mut(unit).enumerate().for_each(work);
    } else if inner_reduced && out_len < rayon::current_num_threads() && reduced.len() == 1 {
        // A few long rows: the parallelism is inside each row.
        out.iter_mut()
            .enumerate()
            .for_each(|(u, d)| *d = fold_all(&data[base(u)..base(u) + inner], init, f));
    } else {
        parallel::chunks_mut(out, unit, &|u, dst| work((u, dst)));
    }
}

macro_rules! reduction {
    ($(#[$doc:meta])* $name:ident, $opname:literal, $accepts:ident, $saves:expr, init: $init:ident, |$a:ident, $b:ident| $f:expr, mlir: $combine:literal, scalar: $float:literal, $int:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name {
            pub axes: Vec<usize>,
            pub keepdims: bool,
        }
        op_attrs!($name = $opname { axes, keepdims });

        impl OpDef for $name {

            fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
                reduce_infer($opname, Accepts::$accepts, &self.axes, self.keepdims, inputs)
            }

            fn fold(&self, dtype: DType) -> Option<(ScalarForm, &[usize])> {
                Some((ScalarForm::arith(dtype, $float, $int)?, &self.axes))
            }

            fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let x = &inputs[0];
                let out = &outputs[0].shape;
                if reduction!(@needs_identity $init) && self.axes.iter().any(|&a| x.shape()[a] == 0) {
                    return Err(Error::invalid($opname, format!(
                        "cannot reduce over an axis of size 0 (shape {:?}): the reduction has no identity", x.shape())));
                }
                let r = crate::with_numeric!(x.dtype(), T, { fold::<T>(x, &self.axes, out, reduction!(@init $init T), |$a: T, $b: T| $f)? },
                    return Err(Error::internal($opname, "bool reached the kernel")));
                Ok(smallvec![r])
            }

            fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
                let x = &inputs[0];
                if reduction!(@needs_identity $init) && self.axes.iter().any(|&a| x.shape[a] == 0) {
                    return None;
                }
                let (shape, axes) = (x.shape.clone(), self.axes.clone());
                crate::with_numeric!(x.dtype, T, {
                    Some(Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
                        let data = dest::input::<T>(ins, 0)?;
                        let out = dest::output::<T>(outs, 0)?;
                        fold_into(data, &shape, &axes, out, reduction!(@init $init T), &|$a: T, $b: T| $f);
                        Ok(())
                    }))
                }, None)
            }

            fn saves(&self) -> Saves {
                $saves
            }

            fn emit(&self, e: &mut Emitter, inputs: &[MlirValue], outputs: &[TensorType]) -> Result<Values<MlirValue>> {
                let x = &inputs[0];
                let init = crate::with_numeric!(x.ty.dtype, T, { reduction!(@init $init T).to_f64() },
                    return Err(e.bug(concat!($opname, " of bool"))));
                Ok(smallvec![emit_reduction(e, x, &self.axes, &outputs[0], $combine, init)?])
            }

            fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], _needs: &[bool]) -> Result<Grads<V>> {
                let Some(g) = grads[0].as_ref() else { return Ok(smallvec![None]) };
                Ok(smallvec![Some(reduction!(@grad $init, ctx, saved, g, &self.axes, self.keepdims)?)])
            }

            fn tangent<V: Value>(&self, ctx: &mut dyn Context<V>, inputs: &[V], outputs: &[V], tangents: &[Option<V>]) -> Result<Tangents<V>> {
                if !outputs[0].ty().dtype.is_float() {
                    return tangents::none(outputs);
                }
                reduction!(@tangent $init, self, ctx, inputs, outputs, tangents)
            }

            /// One lane's axes are the batch's shifted past the lanes' axis.
            fn batch<V: Value>(&self, ctx: &mut dyn Context<V>, inputs: &[V], _batched: &[bool]) -> Result<Values<V>> {
                let op = $name { axes: $crate::ops::batching::shifted(&self.axes), keepdims: self.keepdims };
                $crate::ops::batching::pointwise(ctx, op, inputs)
            }
        }
    };
    (@needs_identity zero) => { false };
    (@needs_identity $other:ident) => { true };
    (@init zero $T:ident) => { <$T as Arith>::zero() };
    (@init lowest $T:ident) => { <$T as Bounded>::lowest() };
    (@init highest $T:ident) => { <$T as Bounded>::highest() };
    (@tangent zero, $self:ident, $ctx:ident, $inputs:ident, $outputs:ident, $tangents:ident) => {
        tangents::linear($ctx, $self.clone(), $inputs, $outputs, $tangents, &[0])
    };
    (@tangent $other:ident, $self:ident, $ctx:ident, $inputs:ident, $outputs:ident, $tangents:ident) => {
        extremum_tangent($ctx, $inputs, $outputs, $tangents, &$self.axes, $self.keepdims)
    };
    (@grad zero, $ctx:ident, $saved:ident, $g:ident, $axes:expr, $keep:expr) => { expand_to_input($ctx, $saved, $g, $axes, $keep) };
    (@grad $other:ident, $ctx:ident, $saved:ident, $g:ident, $axes:expr, $keep:expr) => { extremum_grad($ctx, $saved, $g, $axes, $keep) };
}

/// Lowest and highest values: identities of max and min.
pub trait Bounded {
    fn lowest() -> Self;
    fn highest() -> Self;
}
macro_rules! bounded {
    ($($t:ty: $lo:expr, $hi:expr;)*) => {$( impl Bounded for $t { fn lowest() -> Self { $lo } fn highest() -> Self { $hi } } )*};
}
bounded! { f32: f32::NEG_INFINITY, f32::INFINITY; f64: f64::NEG_INFINITY, f64::INFINITY; i32: i32::MIN, i32::MAX; i64: i64::MIN, i64::MAX; }

reduction!(
    /// Sum over `axes`.
    Sum, "sum", Numeric, Saves::NOTHING, init: zero, |a, b| a.wadd(b), mlir: "stablehlo.add",
    scalar: "arith.addf", "arith.addi"
);
reduction!(
    /// Maximum over `axes` (NaN propagates).
    ReduceMax, "max", Numeric, Saves::Values { inputs: 1, outputs: 1 }, init: lowest, |a, b| if a >= b || kernels::is_nan(a) { a } else { b }, mlir: "stablehlo.maximum",
    scalar: "arith.maximumf", "arith.maxsi"
);
reduction!(
    /// Minimum over `axes` (NaN propagates).
    ReduceMin, "min", Numeric, Saves::Values { inputs: 1, outputs: 1 }, init: highest, |a, b| if a <= b || kernels::is_nan(a) { a } else { b }, mlir: "stablehlo.minimum",
    scalar: "arith.minimumf", "arith.minsi"
);

/// `stablehlo.reduce` of `x` over `axes` from `init`, reshaped to `out` (keepdims) when the
/// reduced axes stay as size 1.
fn emit_reduction(
    e: &mut Emitter,
    x: &MlirValue,
    axes: &[usize],
    out: &TensorType,
    combine: &str,
    init: f64,
) -> Result<MlirValue> {
    if axes.is_empty() {
        return Ok(x.clone());
    }
    let r = match collapsed_sum(e, x, axes, combine)? {
        Some(flat) => e.reduce(&flat, &[flat.ty.ndim() - 1], combine, init)?,
        None => e.reduce(x, axes, combine, init)?,
    };
    if r.ty.shape == out.shape {
        return Ok(r);
    }
    // keepdims: the kept dimensions of `r` go back to their places, between size-1 ones (a
    // broadcast that expands nothing; IREE has no dynamic reshape).
    let kept: Vec<usize> = (0..out.ndim()).filter(|d| !axes.contains(d)).collect();
    let known: Vec<Vec<(MlirValue, usize)>> = (0..out.ndim())
        .map(|d| match kept.iter().position(|&k| k == d) {
            Some(i) => vec![(r.clone(), i)],
            None => vec![],
        })
        .collect();
    e.broadcast_in_dim(&r, &kept, &out.shape, &known)
}

/// A sum over several static axes, as `x` with those axes moved last and merged into one
/// (the `multi_axis_sums` workaround: IREE reads a sum over several axes of a product with a
/// broadcast operand as a contraction it cannot vectorize, and fails to compile it).
fn collapsed_sum(
    e: &mut Emitter,
    x: &MlirValue,
    axes: &[usize],
    combine: &str,
) -> Result<Option<MlirValue>> {
    if combine != "stablehlo.add" || axes.len() < 2 || x.ty.shape.contains(&DYN) {
        return Ok(None);
    }
    let kept: Vec<usize> = (0..x.ty.ndim()).filter(|d| !axes.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let moved = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x.clone()
    } else {
        let shape: Vec<usize> = perm.iter().map(|&d| x.ty.shape[d]).collect();
        let ty = TensorType::new(x.ty.dtype, &shape);
        let body = format!(
            "stablehlo.transpose {x}, dims = {perm:?} : ({}) -> {}",
            TypeText(&x.ty),
            TypeText(&ty)
        );
        e.op(&body, &ty)
    };
    let mut shape: Vec<usize> = kept.iter().map(|&d| x.ty.shape[d]).collect();
    shape.push(axes.iter().map(|&d| x.ty.shape[d]).product());
    e.reshape(&moved, &shape).map(Some)
}

/// `g` (shaped like the reduction's output) broadcast back to the input's shape.
fn expand_to_input<V: Value>(
    ctx: &mut dyn Context<V>,
    saved: &Saved<V>,
    g: &V,
    axes: &[usize],
    keepdims: bool,
) -> Result<V> {
    let in_shape = saved.input_types[0].shape.clone();
    let kept = reduced_shape(&in_shape, axes, true);
    let g = if keepdims {
        g.clone()
    } else {
        build::reshape(ctx, g, &kept)?
    };
    build::broadcast_to(ctx, &g, &in_shape)
}

fn extremum_grad<V: Value>(
    ctx: &mut dyn Context<V>,
    saved: &Saved<V>,
    g: &V,
    axes: &[usize],
    keepdims: bool,
) -> Result<V> {
    let x = saved.input(0)?;
    let y = expand_to_input(ctx, saved, saved.output(0)?, axes, keepdims)?;
    let mask = build::equal(ctx, x, &y)?;
    let ones = build::ones_like(ctx, x)?;
    let zeros = build::zeros_like(ctx, x)?;
    let hits = build::select(ctx, &mask, &ones, &zeros)?;
    let count = build::sum(ctx, &hits, axes, true)?;
    let count = build::broadcast_to(ctx, &count, &saved.input_types[0].shape)?;
    let g = expand_to_input(ctx, saved, g, axes, keepdims)?;
    let share = build::div(ctx, &g, &count)?;
    build::select(ctx, &mask, &share, &zeros)
}

/// The tangent of a max or min: the mean of the tangents of the elements that attain it (the
/// gradient's convention for ties).
fn extremum_tangent<V: Value>(
    ctx: &mut dyn Context<V>,
    inputs: &[V],
    outputs: &[V],
    tangents: &[Option<V>],
    axes: &[usize],
    keepdims: bool,
) -> Result<Tangents<V>> {
    let Some(t) = &tangents[0] else {
        return tangents::none(outputs);
    };
    let (x, y) = (&inputs[0], &outputs[0]);
    let saved = Saved::capture(Saves::NOTHING, inputs, outputs);
    let y = expand_to_input(ctx, &saved, y, axes, keepdims)?;
    let mask = build::equal(ctx, x, &y)?;
    let ones = build::ones_like(ctx, x)?;
    let zeros = build::zeros_like(ctx, x)?;
    let hits = build::select(ctx, &mask, &ones, &zeros)?;
    let count = build::sum(ctx, &hits, axes, keepdims)?;
    let picked = build::select(ctx, &mask, t, &zeros)?;
    let picked = build::sum(ctx, &picked, axes, keepdims)?;
    Ok(smallvec![Some(build::div(ctx, &picked, &count)?)])
}

macro_rules! reduction_builders {
    ($($(#[$doc:meta])* $builder:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $builder<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize], keepdims: bool) -> Result<V> {
            build::apply1(ctx, $op { axes: sorted(axes), keepdims }, std::slice::from_ref(x))
        }
    )*};
}

reduction_builders! {
    /// Sum over absolute `axes`.
    sum => Sum;
    /// Maximum over absolute `axes`.
    reduce_max => ReduceMax;
    /// Minimum over absolute `axes`.
    reduce_min => ReduceMin;
}

/// Mean over absolute `axes`: the sum times 1/n (float only: an integer mean is not exact).
pub fn mean<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    axes: &[usize],
    keepdims: bool,
) -> Result<V> {
    let ty = x.ty().clone();
    check_dtype("mean", Accepts::Float, &ty)?;
    let n: usize = axes.iter().filter_map(|&a| ty.shape.get(a)).product();
    let s = sum(ctx, x, axes, keepdims)?;
    let scale = build::scalar(ctx, ty.dtype, 1.0 / n as f64)?;
    build::mul(ctx, &s, &scale)
}

/// User-facing axes (`None`, negative, unsorted) made absolute for a rank-`ndim` input.
pub fn axes_for(op: &'static str, axes: Option<&[i64]>, ndim: usize) -> Result<Vec<usize>> {
    normalize_axes(op, axes, ndim)
}

fn sorted(axes: &[usize]) -> Vec<usize> {
    let mut a = axes.to_vec();
    a.sort_unstable();
    a.dedup();
    a
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
