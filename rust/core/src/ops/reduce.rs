//! Reductions over a set of axes: `sum`, `reduce_max`, `reduce_min` (and the `mean` builder).
//! Axes are stored absolute and sorted; `keepdims` keeps reduced axes with size 1.
//!
//! Gradients: sum broadcasts g back over the reduced axes; max/min send g to the elements equal
//! to the result, split evenly between ties (as TensorFlow does); mean is sum times 1/n.

use ndarray::{ArrayD, Axis};
use rayon::prelude::*;
use smallvec::smallvec;

use super::kernels::{Arith, PARALLEL_THRESHOLD};
use super::rules::{check_dtype, Accepts};
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::shape::{normalize_axes, Shape, TensorType};
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

fn reduce_infer(op: &'static str, accepts: Accepts, axes: &[usize], keepdims: bool, inputs: &[TensorType]) -> Result<Types> {
    expect_arity(op, inputs, 1)?;
    let x = &inputs[0];
    check_dtype(op, accepts, x)?;
    if let Some(&bad) = axes.iter().find(|&&a| a >= x.ndim()) {
        return Err(Error::index(op, format!("axis {bad} is out of bounds for a tensor of rank {}", x.ndim())));
    }
    Ok(smallvec![TensorType::new(x.dtype, &reduced_shape(&x.shape, axes, keepdims))])
}

/// Folds `x` over `axes` with `f`, starting from `init`; the result has `out_shape`.
fn fold<T: Element + Arith>(x: &Tensor, axes: &[usize], out_shape: &[usize], init: T, f: impl Fn(T, T) -> T + Sync + Send) -> Result<Tensor> {
    let data = x.as_slice::<T>()?;
    if axes.len() == x.ndim() {
        let total = if data.len() >= PARALLEL_THRESHOLD {
            data.par_chunks(PARALLEL_THRESHOLD / 4).map(|c| c.iter().fold(init, |a, &b| f(a, b))).reduce(|| init, &f)
        } else {
            data.iter().fold(init, |a, &b| f(a, b))
        };
        return Tensor::from_vec(vec![total], out_shape);
    }
    let mut acc: ArrayD<T> = x.view::<T>()?.to_owned();
    for &axis in axes.iter().rev() {
        acc = acc.fold_axis(Axis(axis), init, |&a, &b| f(a, b));
    }
    Tensor::from_array(acc).reshaped(out_shape)
}

macro_rules! reduction {
    ($(#[$doc:meta])* $name:ident, $opname:literal, $accepts:ident, $saves:expr, init: $init:ident, |$a:ident, $b:ident| $f:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name {
            pub axes: Vec<usize>,
            pub keepdims: bool,
        }

        impl OpDef for $name {
            fn name(&self) -> &'static str {
                $opname
            }

            fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
                reduce_infer($opname, Accepts::$accepts, &self.axes, self.keepdims, inputs)
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

            fn saves(&self) -> Saves {
                $saves
            }

            fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], _needs: &[bool]) -> Result<Grads<V>> {
                let Some(g) = grads[0].as_ref() else { return Ok(smallvec![None]) };
                Ok(smallvec![Some(reduction!(@grad $init, ctx, saved, g, &self.axes, self.keepdims)?)])
            }
        }
    };
    (@needs_identity zero) => { false };
    (@needs_identity $other:ident) => { true };
    (@init zero $T:ident) => { <$T as Arith>::zero() };
    (@init lowest $T:ident) => { <$T as Bounded>::lowest() };
    (@init highest $T:ident) => { <$T as Bounded>::highest() };
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
    Sum, "sum", Numeric, Saves::NOTHING, init: zero, |a, b| a.wadd(b)
);
reduction!(
    /// Maximum over `axes` (NaN propagates).
    ReduceMax, "max", Numeric, Saves::Values { inputs: 1, outputs: 1 }, init: lowest, |a, b| if a >= b || a != a { a } else { b }
);
reduction!(
    /// Minimum over `axes` (NaN propagates).
    ReduceMin, "min", Numeric, Saves::Values { inputs: 1, outputs: 1 }, init: highest, |a, b| if a <= b || a != a { a } else { b }
);

/// `g` (shaped like the reduction's output) broadcast back to the input's shape.
fn expand_to_input<V: Value>(ctx: &mut dyn Context<V>, saved: &Saved<V>, g: &V, axes: &[usize], keepdims: bool) -> Result<V> {
    let in_shape = saved.input_types[0].shape.clone();
    let kept = reduced_shape(&in_shape, axes, true);
    let g = if keepdims { g.clone() } else { build::reshape(ctx, g, &kept)? };
    build::broadcast_to(ctx, &g, &in_shape)
}

fn extremum_grad<V: Value>(ctx: &mut dyn Context<V>, saved: &Saved<V>, g: &V, axes: &[usize], keepdims: bool) -> Result<V> {
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

/// Sum over absolute `axes`.
pub fn sum<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize], keepdims: bool) -> Result<V> {
    build::apply1(ctx, Sum { axes: sorted(axes), keepdims }, std::slice::from_ref(x))
}

pub fn reduce_max<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize], keepdims: bool) -> Result<V> {
    build::apply1(ctx, ReduceMax { axes: sorted(axes), keepdims }, std::slice::from_ref(x))
}

pub fn reduce_min<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize], keepdims: bool) -> Result<V> {
    build::apply1(ctx, ReduceMin { axes: sorted(axes), keepdims }, std::slice::from_ref(x))
}

/// Mean over absolute `axes`: the sum times 1/n (float only: an integer mean is not exact).
pub fn mean<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize], keepdims: bool) -> Result<V> {
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
