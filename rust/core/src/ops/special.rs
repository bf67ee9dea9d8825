//! Special functions: the error function `erf`.
//!
//! One algorithm serves the kernel and the emission, so that eager, executor and compiled
//! values agree to rounding: Cephes' rational approximations (`ndtr.c`), `x T(x^2) / U(x^2)`
//! for |x| <= 1 and `1 - erfc(|x|)` with `erfc(a) = e^(-a^2) P(a) / Q(a)` (R / S from 8 on)
//! beyond (|x| clamped to 30, where erfc is 0), with x's sign. About 4e-16 relative error in
//! float64. Gradient: `g 2/sqrt(pi) e^(-x^2)`.

// Cephes' coefficients as published, a digit or two past what f64 holds.
#![allow(clippy::excessive_precision)]

use num_traits::Float;

use super::attrs::op_attrs;
use super::rules::{check_dtype, Accepts};
use super::unary::{kernel_dtype_bug, unary_op};
use super::{
    build, dest, expect_arity, kernels, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents,
    Types, Values,
};
use crate::emit::{Emitter, MlirValue};
use crate::error::Result;
use crate::ops::Context;
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

const P: [f64; 9] = [
    2.461_969_814_735_305e-10,
    5.641_895_648_310_689e-1,
    7.463_210_564_422_7,
    4.863_719_709_856_814e1,
    1.965_208_329_560_771e2,
    5.264_451_949_954_773e2,
    9.345_285_271_719_576e2,
    1.027_551_886_895_157e3,
    5.575_353_353_693_993e2,
];
const Q: [f64; 9] = [
    1.0,
    1.322_819_511_547_449_9e1,
    8.670_721_408_859_897e1,
    3.549_377_788_878_199e2,
    9.757_085_017_432_055e2,
    1.823_909_166_879_097_4e3,
    2.246_337_608_187_109_8e3,
    1.656_663_091_941_613_5e3,
    5.575_353_408_177_277e2,
];
const R: [f64; 6] = [
    5.641_895_835_477_551e-1,
    1.275_366_707_599_781,
    5.019_050_422_511_805,
    6.160_210_979_930_536,
    7.409_742_699_504_489,
    2.978_866_653_721_002_4,
];
const S: [f64; 7] = [
    1.0,
    2.260_528_632_201_172_6,
    9.396_035_249_380_015,
    1.204_895_398_080_966_6e1,
    1.708_144_507_475_659e1,
    9.608_968_090_632_859,
    3.369_076_451_000_815,
];
const T: [f64; 5] = [
    9.604_973_739_870_516,
    9.002_601_972_038_427e1,
    2.232_005_345_946_843e3,
    7.003_325_141_128_051e3,
    5.559_230_130_103_949_6e4,
];
const U: [f64; 6] = [
    1.0,
    3.356_171_416_475_031e1,
    5.213_579_497_801_527e2,
    4.594_323_829_709_801e3,
    2.262_900_006_138_909_4e4,
    4.926_739_426_086_359e4,
];

/// Horner's rule, coefficients from the highest power down.
fn horner<F: Float>(coefficients: &[f64], x: F) -> F {
    coefficients.iter().fold(F::zero(), |acc, &c| {
        acc * x + F::from(c).unwrap_or_else(F::nan)
    })
}

/// `erf(x)` by the module's algorithm (NaN stays NaN; +-inf gives +-1).
pub fn erf_value<F: Float>(x: F) -> F {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a <= F::one() {
        let z = x * x;
        return x * horner(&T, z) / horner(&U, z);
    }
    // erfc is 0 to every float's precision from 30 on; the polynomials would overflow
    let a = a.min(F::from(30.0).unwrap_or_else(F::nan));
    let eight = F::from(8.0).unwrap_or_else(F::nan);
    let (p, q) = if a < eight {
        (horner(&P, a), horner(&Q, a))
    } else {
        (horner(&R, a), horner(&S, a))
    };
    let erfc = (-(a * a)).exp() * p / q;
    let y = F::one() - erfc;
    if x.is_sign_negative() {
        -y
    } else {
        y
    }
}

fn emit_horner(e: &mut Emitter, coefficients: &[f64], x: &MlirValue) -> Result<MlirValue> {
    let mut acc = e.splat_like(x, coefficients[0])?;
    for &c in &coefficients[1..] {
        let term = e.elementwise("stablehlo.multiply", &[&acc, x], &x.ty);
        let c = e.splat_like(x, c)?;
        acc = e.elementwise("stablehlo.add", &[&term, &c], &x.ty);
    }
    Ok(acc)
}

/// The module's algorithm in pure StableHLO: both branches everywhere, selected.
fn emit_erf(e: &mut Emitter, x: &MlirValue) -> Result<MlirValue> {
    let ty = &x.ty;
    let a = e.elementwise("stablehlo.abs", &[x], ty);
    let z = e.elementwise("stablehlo.multiply", &[x, x], ty);
    let t = emit_horner(e, &T, &z)?;
    let u = emit_horner(e, &U, &z)?;
    let small = e.elementwise("stablehlo.multiply", &[x, &t], ty);
    let small = e.elementwise("stablehlo.divide", &[&small, &u], ty);
    // the tail, on |x| clamped to [1, 30] so that its polynomials stay in their range (erfc
    // is 0 to every float's precision from 30 on)
    let one = e.splat_like(x, 1.0)?;
    let thirty = e.splat_like(x, 30.0)?;
    let b = e.elementwise("stablehlo.maximum", &[&a, &one], ty);
    let b = e.elementwise("stablehlo.minimum", &[&b, &thirty], ty);
    let (p, q) = (emit_horner(e, &P, &b)?, emit_horner(e, &Q, &b)?);
    let (r, s) = (emit_horner(e, &R, &b)?, emit_horner(e, &S, &b)?);
    let eight = e.splat_like(x, 8.0)?;
    let near = e.compare("LT", &b, &eight);
    let num = e.select(&near, &p, &r);
    let den = e.select(&near, &q, &s);
    let bb = e.elementwise("stablehlo.multiply", &[&b, &b], ty);
    let bb = e.elementwise("stablehlo.negate", &[&bb], ty);
    let decay = e.elementwise("stablehlo.exponential", &[&bb], ty);
    let erfc = e.elementwise("stablehlo.multiply", &[&decay, &num], ty);
    let erfc = e.elementwise("stablehlo.divide", &[&erfc, &den], ty);
    let tail = e.elementwise("stablehlo.subtract", &[&one, &erfc], ty);
    let sign = e.elementwise("stablehlo.sign", &[x], ty);
    let tail = e.elementwise("stablehlo.multiply", &[&sign, &tail], ty);
    let inside = e.compare("LE", &a, &one);
    Ok(e.select(&inside, &small, &tail))
}

unary_op! {
    /// The error function, `2/sqrt(pi)` times the integral of `e^(-t^2)` from 0 to x.
    Erf, "erf", erf, Float,
    kernel: |x: T| erf_value(x),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let x = saved.input(0)?;
        let xx = build::mul(ctx, x, x)?;
        let minus = build::neg(ctx, &xx)?;
        let d = build::exp(ctx, &minus)?;
        let c = build::fill_like(ctx, x, std::f64::consts::FRAC_2_SQRT_PI)?;
        let d = build::mul(ctx, &d, &c)?;
        Ok(Some(build::mul(ctx, g, &d)?))
    },
    mlir: |e, x| emit_erf(e, x)
}

#[cfg(test)]
mod tests {
    use super::erf_value as erf;

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(5), from tables to 16 digits
        let cases: [(f64, f64); 4] = [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, want) in cases {
            assert!(
                (erf(x) - want).abs() <= 2e-16 * want,
                "erf({x}) = {}",
                erf(x)
            );
            assert_eq!(erf(-x), -erf(x));
        }
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(0.0f32), 0.0);
    }
}
