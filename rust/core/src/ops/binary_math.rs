//! numpy's other two-operand elementwise functions, with broadcasting as in `binary`:
//! `arctan2`, and truncated division's remainder and quotient (`rem`, `quotient`), from which
//! the Python API composes numpy's `mod`/`remainder`, `fmod` and `floor_divide` as JAX does.
//!
//! Gradients (z = f(a, b), g = dL/dz): arctan2 (g b/(a^2+b^2), -g a/(a^2+b^2));
//! rem (g, -g trunc(a/b)); quotient is piecewise constant: zero.
//!
//! MLIR: `stablehlo.atan2`, `stablehlo.remainder` (C's fmod for floats, truncated for integers),
//! `stablehlo.divide` (truncated for integers; for floats `sign(q) floor(|q|)`). Compiled, an
//! integer divided by zero gives what the target gives; eagerly, 0 as numpy.

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::binary::{binary_op, kernel_dtype_bug, unbroadcast};
use super::kernels::{self, Arith};
use super::rules::{broadcast_binary, Accepts};
use super::{
    build, dest, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents, Types, Values,
};
use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue, ScalarForm};
use crate::error::Result;
use crate::ops::Context;
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

binary_op! {
    /// The angle of the point (b, a) from the x axis, in [-pi, pi] (numpy's `arctan2(a, b)`).
    Arctan2, "arctan2", arctan2, Float -> Same,
    kernel: |x, y| x.atan2(y),
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let (a, b) = (saved.input(0)?, saved.input(1)?);
        let aa = build::mul(ctx, a, a)?;
        let bb = build::mul(ctx, b, b)?;
        let r = build::add(ctx, &aa, &bb)?;
        let q = build::div(ctx, g, &r)?;
        let ga = if needs[0] { Some(build::mul(ctx, &q, b)?) } else { None };
        let gb = if needs[1] {
            let t = build::mul(ctx, &q, a)?;
            Some(build::neg(ctx, &t)?)
        } else {
            None
        };
        (ga, gb)
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.atan2", &[a, b], out)),
    scalar: |d| ScalarForm::float(d, "math.atan2")
}

binary_op! {
    /// The remainder of a / b rounded toward zero, with the sign of a (C's `fmod`).
    Rem, "rem", rem, Numeric -> Same,
    kernel: |x, y| x.wrem(y),
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let gb = if needs[1] {
            let q = quotient(ctx, saved.input(0)?, saved.input(1)?)?;
            let t = build::mul(ctx, g, &q)?;
            Some(build::neg(ctx, &t)?)
        } else {
            None
        };
        (needs[0].then(|| g.clone()), gb)
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.remainder", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.remf", "arith.remsi")
}

binary_op! {
    /// a / b rounded toward zero (integers: C's division). Its gradient is zero, as it is
    /// almost everywhere.
    Quotient, "quotient", quotient, Numeric -> Same,
    kernel: |x, y| x.wquot(y),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g, needs| {
        let zero = build::zeros_like(ctx, g)?;
        (needs[0].then(|| zero.clone()), needs[1].then_some(zero))
    },
    mlir: |e, a, b, out| {
        let q = e.elementwise("stablehlo.divide", &[a, b], out);
        if out.dtype.is_float() {
            let size = e.elementwise("stablehlo.abs", &[&q], out);
            let whole = e.elementwise("stablehlo.floor", &[&size], out);
            let sign = e.elementwise("stablehlo.sign", &[&q], out);
            Ok(e.elementwise("stablehlo.multiply", &[&sign, &whole], out))
        } else {
            Ok(q)
        }
    }
}
