//! The rest of numpy's elementwise float functions: tangent, the inverse trigonometric and
//! hyperbolic functions, `log1p` and `expm1`. Each block is the whole op, as in `unary`.
//!
//! Gradients (y = f(x), g = dL/dy):
//!
//! ```text
//! tan g(1+y^2); arcsin g/sqrt(1-x^2); arccos -g/sqrt(1-x^2); arctan g/(1+x^2);
//! sinh g cosh x; cosh g sinh x; arcsinh g/sqrt(x^2+1); arccosh g/sqrt((x-1)(x+1));
//! arctanh g/(1-x^2); log1p g/(1+x); expm1 g(y+1)
//! ```
//!
//! MLIR: pure StableHLO has `tan`, `log_plus_one`, `exponential_minus_one` and `atan2`; the
//! others are written with them (`arcsin x` as `atan2(x, sqrt((1-x)(1+x)))`, `sinh` with `expm1`
//! so that it keeps its precision near 0, ...), which IREE and XLA both compile. Read back, such
//! a composition agrees with the kernel to rounding, not bit for bit.

use super::attrs::op_attrs;
use super::kernels::Arith;
use super::rules::{check_dtype, Accepts};
use super::unary::{kernel_dtype_bug, neg, unary_op};
use super::{
    build, dest, expect_arity, kernels, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents,
    Types, Values,
};
use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue, ScalarForm};
use crate::error::Result;
use crate::ops::Context;
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

/// `1 - x^2` as `(1 - x)(1 + x)`, exact where `x^2` would round (|x| near 1).
fn one_minus_square<V: Value>(ctx: &mut dyn Context<V>, x: &V) -> Result<V> {
    let one = build::ones_like(ctx, x)?;
    let a = build::sub(ctx, &one, x)?;
    let b = build::add(ctx, &one, x)?;
    build::mul(ctx, &a, &b)
}

/// `g / d`.
fn over<V: Value>(ctx: &mut dyn Context<V>, g: &V, d: &V) -> Result<Option<V>> {
    Ok(Some(build::div(ctx, g, d)?))
}

// ---- emission helpers: compositions of pure StableHLO ------------------------------------

fn emit_sqrt_one_minus_square(e: &mut Emitter, x: &MlirValue) -> Result<MlirValue> {
    let one = e.splat_like(x, 1.0)?;
    let a = e.elementwise("stablehlo.subtract", &[&one, x], &x.ty);
    let b = e.elementwise("stablehlo.add", &[&one, x], &x.ty);
    let p = e.elementwise("stablehlo.multiply", &[&a, &b], &x.ty);
    Ok(e.elementwise("stablehlo.sqrt", &[&p], &x.ty))
}

/// Above this, `x * x` overflows (roughly: the square root of the dtype's largest value).
fn square_root_of_max(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e18
    } else {
        1e150
    }
}

fn emit_half(e: &mut Emitter, x: &MlirValue) -> Result<MlirValue> {
    let half = e.splat_like(x, 0.5)?;
    Ok(e.elementwise("stablehlo.multiply", &[&half, x], &x.ty))
}

unary_op! {
    /// Tangent.
    Tan, "tan", tan, Float,
    kernel: |x: T| x.tan(),
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| {
        let y = saved.output(0)?;
        let yy = build::mul(ctx, y, y)?;
        let one = build::ones_like(ctx, y)?;
        let d = build::add(ctx, &one, &yy)?;
        Ok(Some(build::mul(ctx, g, &d)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.tan", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.tan")
}

unary_op! {
    /// Inverse sine, in [-pi/2, pi/2]; NaN outside [-1, 1].
    Arcsin, "arcsin", arcsin, Float,
    kernel: |x: T| x.asin(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let d = one_minus_square(ctx, saved.input(0)?)?;
        let d = build::sqrt(ctx, &d)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| {
        let c = emit_sqrt_one_minus_square(e, x)?;
        Ok(e.elementwise("stablehlo.atan2", &[x, &c], &x.ty))
    }
}

unary_op! {
    /// Inverse cosine, in [0, pi]; NaN outside [-1, 1].
    Arccos, "arccos", arccos, Float,
    kernel: |x: T| x.acos(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let d = one_minus_square(ctx, saved.input(0)?)?;
        let d = build::sqrt(ctx, &d)?;
        let q = build::div(ctx, g, &d)?;
        Ok(Some(neg(ctx, &q)?))
    },
    mlir: |e, x| {
        let s = emit_sqrt_one_minus_square(e, x)?;
        Ok(e.elementwise("stablehlo.atan2", &[&s, x], &x.ty))
    }
}

unary_op! {
    /// Inverse tangent, in (-pi/2, pi/2).
    Arctan, "arctan", arctan, Float,
    kernel: |x: T| x.atan(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let x = saved.input(0)?;
        let xx = build::mul(ctx, x, x)?;
        let one = build::ones_like(ctx, x)?;
        let d = build::add(ctx, &one, &xx)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| {
        let one = e.splat_like(x, 1.0)?;
        Ok(e.elementwise("stablehlo.atan2", &[x, &one], &x.ty))
    },
    scalar: |d| ScalarForm::float(d, "math.atan")
}

unary_op! {
    /// Hyperbolic sine.
    Sinh, "sinh", sinh, Float,
    kernel: |x: T| x.sinh(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let c = cosh(ctx, saved.input(0)?)?;
        Ok(Some(build::mul(ctx, g, &c)?))
    },
    mlir: |e, x| {
        // (expm1(x) - expm1(-x)) / 2: no cancellation near 0.
        let m = e.elementwise("stablehlo.negate", &[x], &x.ty);
        let a = e.elementwise("stablehlo.exponential_minus_one", &[x], &x.ty);
        let b = e.elementwise("stablehlo.exponential_minus_one", &[&m], &x.ty);
        let d = e.elementwise("stablehlo.subtract", &[&a, &b], &x.ty);
        emit_half(e, &d)
    }
}

unary_op! {
    /// Hyperbolic cosine.
    Cosh, "cosh", cosh, Float,
    kernel: |x: T| x.cosh(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let s = sinh(ctx, saved.input(0)?)?;
        Ok(Some(build::mul(ctx, g, &s)?))
    },
    mlir: |e, x| {
        let m = e.elementwise("stablehlo.negate", &[x], &x.ty);
        let a = e.elementwise("stablehlo.exponential", &[x], &x.ty);
        let b = e.elementwise("stablehlo.exponential", &[&m], &x.ty);
        let s = e.elementwise("stablehlo.add", &[&a, &b], &x.ty);
        emit_half(e, &s)
    }
}

unary_op! {
    /// Inverse hyperbolic sine.
    Arcsinh, "arcsinh", arcsinh, Float,
    kernel: |x: T| x.asinh(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let x = saved.input(0)?;
        let xx = build::mul(ctx, x, x)?;
        let one = build::ones_like(ctx, x)?;
        let d = build::add(ctx, &xx, &one)?;
        let d = build::sqrt(ctx, &d)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| {
        // sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), and log|x| + log 2 where x^2 would
        // overflow.
        let a = e.elementwise("stablehlo.abs", &[x], &x.ty);
        let one = e.splat_like(x, 1.0)?;
        let aa = e.elementwise("stablehlo.multiply", &[&a, &a], &x.ty);
        let r = e.elementwise("stablehlo.add", &[&one, &aa], &x.ty);
        let r = e.elementwise("stablehlo.sqrt", &[&r], &x.ty);
        let r = e.elementwise("stablehlo.add", &[&one, &r], &x.ty);
        let q = e.elementwise("stablehlo.divide", &[&aa, &r], &x.ty);
        let s = e.elementwise("stablehlo.add", &[&a, &q], &x.ty);
        let small = e.elementwise("stablehlo.log_plus_one", &[&s], &x.ty);
        let ln2 = e.splat_like(x, std::f64::consts::LN_2)?;
        let big = e.elementwise("stablehlo.log", &[&a], &x.ty);
        let big = e.elementwise("stablehlo.add", &[&big, &ln2], &x.ty);
        let limit = e.splat_like(x, square_root_of_max(x.ty.dtype))?;
        let huge = e.compare("GT", &a, &limit);
        let y = e.select(&huge, &big, &small);
        let sign = e.elementwise("stablehlo.sign", &[x], &x.ty);
        Ok(e.elementwise("stablehlo.multiply", &[&sign, &y], &x.ty))
    }
}

unary_op! {
    /// Inverse hyperbolic cosine, for x >= 1 (NaN below).
    Arccosh, "arccosh", arccosh, Float,
    kernel: |x: T| x.acosh(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let x = saved.input(0)?;
        let one = build::ones_like(ctx, x)?;
        let a = build::sub(ctx, x, &one)?;
        let b = build::add(ctx, x, &one)?;
        let d = build::mul(ctx, &a, &b)?;
        let d = build::sqrt(ctx, &d)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| {
        // log(x + sqrt((x-1)(x+1))), and log x + log 2 where that would overflow.
        let one = e.splat_like(x, 1.0)?;
        let a = e.elementwise("stablehlo.subtract", &[x, &one], &x.ty);
        let b = e.elementwise("stablehlo.add", &[x, &one], &x.ty);
        let p = e.elementwise("stablehlo.multiply", &[&a, &b], &x.ty);
        let r = e.elementwise("stablehlo.sqrt", &[&p], &x.ty);
        let s = e.elementwise("stablehlo.add", &[x, &r], &x.ty);
        let small = e.elementwise("stablehlo.log", &[&s], &x.ty);
        let ln2 = e.splat_like(x, std::f64::consts::LN_2)?;
        let big = e.elementwise("stablehlo.log", &[x], &x.ty);
        let big = e.elementwise("stablehlo.add", &[&big, &ln2], &x.ty);
        let limit = e.splat_like(x, square_root_of_max(x.ty.dtype))?;
        let huge = e.compare("GT", x, &limit);
        Ok(e.select(&huge, &big, &small))
    }
}

unary_op! {
    /// Inverse hyperbolic tangent, for |x| < 1 (+-inf at +-1, NaN beyond).
    Arctanh, "arctanh", arctanh, Float,
    // log1p(2|x| / (1 - |x|)) / 2 with x's sign: Rust's `atanh` loses digits for x near -1.
    kernel: |x: T| {
        let a = x.abs();
        let r = ((a + a) / (T::one() - a)).ln_1p() / (T::one() + T::one());
        if x.is_sign_negative() { -r } else { r }
    },
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let d = one_minus_square(ctx, saved.input(0)?)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| {
        // (log1p(x) - log1p(-x)) / 2
        let m = e.elementwise("stablehlo.negate", &[x], &x.ty);
        let a = e.elementwise("stablehlo.log_plus_one", &[x], &x.ty);
        let b = e.elementwise("stablehlo.log_plus_one", &[&m], &x.ty);
        let d = e.elementwise("stablehlo.subtract", &[&a, &b], &x.ty);
        emit_half(e, &d)
    }
}

unary_op! {
    /// log(1 + x), exact near 0.
    Log1p, "log1p", log1p, Float,
    kernel: |x: T| x.ln_1p(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let x = saved.input(0)?;
        let one = build::ones_like(ctx, x)?;
        let d = build::add(ctx, &one, x)?;
        over(ctx, g, &d)
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.log_plus_one", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.log1p")
}

unary_op! {
    /// e^x - 1, exact near 0.
    Expm1, "expm1", expm1, Float,
    kernel: |x: T| x.exp_m1(),
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| {
        let y = saved.output(0)?;
        let one = build::ones_like(ctx, y)?;
        let d = build::add(ctx, y, &one)?;
        Ok(Some(build::mul(ctx, g, &d)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.exponential_minus_one", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.expm1")
}
