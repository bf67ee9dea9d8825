//! Builders: the functional API over a `Context`. Gradient rules, the Python bindings and
//! (later) tracing all build ops through these functions, so they work eagerly and symbolically
//! alike. Each family file defines the builders of its ops; this module holds the generic ones
//! and re-exports the rest, so `build::` is the one place to look.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::ops::Op;
use crate::shape::{ShapeDisplay, DYN};
use crate::value::Value;

pub use super::binary::{
    add, bitwise_and, bitwise_or, bitwise_xor, div, equal, greater, greater_equal, less,
    less_equal, logical_and, logical_or, maximum, minimum, mul, not_equal, pow, relu_grad, select,
    sub,
};
pub use super::binary_math::{arctan2, quotient, rem};
pub use super::creation::{
    arange, arange_of, bitcast_convert, cast, fill, fill_like, identity, ones_like, stop_gradient,
    zeros_like,
};
pub use super::gather::take_along;
pub use super::index::{dynamic_slice, dynamic_update_slice, scatter_add, take};
pub use super::indexing::{getitem, IndexItem};
pub use super::layout::{
    broadcast_to, concatenate, expand_dims, pad, reshape, reverse, slice, squeeze, squeeze_axes,
    stack, transpose,
};
pub use super::matmul::matmul;
pub use super::reduce::{mean, reduce_max, reduce_min, sum};
pub use super::special::erf;
pub use super::unary::{
    abs, ceil, cos, exp, floor, log, logical_not, neg, relu, round, sigmoid, sign, sin, sqrt, tanh,
};
pub use super::unary_math::{
    arccos, arccosh, arcsin, arcsinh, arctan, arctanh, cosh, expm1, log1p, sinh, tan,
};

/// Applies a single-output op.
pub fn apply1<V: Value>(ctx: &mut dyn Context<V>, op: impl Into<Op>, inputs: &[V]) -> Result<V> {
    let op = op.into();
    let mut out = ctx.apply(&op, inputs)?;
    if out.len() != 1 {
        return Err(Error::internal(
            op.name(),
            format!("expected one output, got {}", out.len()),
        ));
    }
    Ok(out.swap_remove(0))
}

/// A scalar constant of `dtype`.
pub fn scalar<V: Value>(ctx: &mut dyn Context<V>, dtype: DType, value: f64) -> Result<V> {
    fill(ctx, dtype, &[], value)
}

/// Sums `g` over the dimensions that broadcasting added or stretched, so that it has `shape`:
/// the gradient of a broadcast.
pub fn sum_to_shape<V: Value>(ctx: &mut dyn Context<V>, g: &V, shape: &[usize]) -> Result<V> {
    let gshape = g.ty().shape.clone();
    if gshape.as_slice() == shape {
        return Ok(g.clone());
    }
    if shape.len() > gshape.len() {
        return Err(Error::internal(
            "sum_to_shape",
            format!(
                "cannot reduce {} to {}",
                ShapeDisplay(&gshape),
                ShapeDisplay(shape)
            ),
        ));
    }
    let lead = gshape.len() - shape.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &d) in shape.iter().enumerate() {
        let gd = gshape[lead + i];
        if d == 1 && gd != 1 {
            axes.push(lead + i);
        } else if d != gd && d != DYN && gd != DYN {
            return Err(Error::internal(
                "sum_to_shape",
                format!(
                    "cannot reduce {} to {}",
                    ShapeDisplay(&gshape),
                    ShapeDisplay(shape)
                ),
            ));
        }
    }
    let summed = if axes.is_empty() {
        g.clone()
    } else {
        sum(ctx, g, &axes, false)?
    };
    if summed.ty().shape.as_slice() == shape {
        Ok(summed)
    } else {
        reshape(ctx, &summed, shape)
    }
}
