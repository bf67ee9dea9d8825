//! Elementwise StableHLO ops as gradloop ops: one-to-one where the op table has the op, and
//! composed from it otherwise (`rsqrt` is `1 / sqrt`, `remainder` is `a - b * trunc(a / b)`).
//! StableHLO's elementwise ops take operands of one shape; gradloop's broadcast, which only
//! matters for `clamp` and `select`, whose bounds or predicate may be scalars.

use super::attr::Attribute;
use super::importer::{import_error, Importer};
use super::syntax::Operation;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::build;
use crate::ops::Context;
use crate::trace::Val;
use crate::value::Value;

/// A builder of one operand.
pub(crate) type Unary = fn(&mut dyn Context<Val>, &Val) -> Result<Val>;
/// A builder of two operands.
pub(crate) type Binary = fn(&mut dyn Context<Val>, &Val, &Val) -> Result<Val>;

/// The operands, which must be exactly `N`.
pub(crate) fn operands<'a, const N: usize>(op: &Operation, x: &'a [Val]) -> Result<&'a [Val; N]> {
    x.try_into()
        .map_err(|_| import_error(&op.name, format!("expected {N} operands, got {}", x.len())))
}

pub(crate) fn unary(
    im: &mut Importer<'_>,
    op: &Operation,
    x: &[Val],
    f: Unary,
) -> Result<Vec<Val>> {
    let [a] = operands(op, x)?;
    Ok(vec![f(im.ctx(), a)?])
}

pub(crate) fn binary(
    im: &mut Importer<'_>,
    op: &Operation,
    x: &[Val],
    f: Binary,
) -> Result<Vec<Val>> {
    let [a, b] = operands(op, x)?;
    Ok(vec![f(im.ctx(), a, b)?])
}

/// `and`, `or`, `xor` and `not`: logical on `i1`, bitwise on integers (`not` of an integer is
/// refused).
pub(crate) fn logical(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let integers = x
        .iter()
        .all(|v| matches!(v.ty().dtype, DType::I32 | DType::I64));
    let ctx = im.ctx();
    if integers {
        let out = match (op.name.as_str(), x) {
            ("stablehlo.and", [a, b]) => build::bitwise_and(ctx, a, b)?,
            ("stablehlo.or", [a, b]) => build::bitwise_or(ctx, a, b)?,
            ("stablehlo.xor", [a, b]) => build::bitwise_xor(ctx, a, b)?,
            _ => {
                return Err(import_error(
                    &op.name,
                    "only the boolean (i1) form is supported for integers' `not`",
                ))
            }
        };
        return Ok(vec![out]);
    }
    if x.iter().any(|v| v.ty().dtype != DType::Bool) {
        return Err(import_error(
            &op.name,
            "operands must be booleans (i1) or integers of 32 or 64 bits",
        ));
    }
    let out = match (op.name.as_str(), x) {
        ("stablehlo.not", [a]) => build::logical_not(ctx, a)?,
        ("stablehlo.and", [a, b]) => build::logical_and(ctx, a, b)?,
        ("stablehlo.or", [a, b]) => build::logical_or(ctx, a, b)?,
        ("stablehlo.xor", [a, b]) => build::not_equal(ctx, a, b)?,
        _ => {
            return Err(import_error(
                &op.name,
                format!("unexpected {} operands", x.len()),
            ))
        }
    };
    Ok(vec![out])
}

/// `stablehlo.constant` (and `arith.constant`): a constant node.
pub(crate) fn constant(im: &mut Importer<'_>, op: &Operation, _: &[Val]) -> Result<Vec<Val>> {
    let tensor = match op.attr("value") {
        Some(Attribute::Dense(d)) => d.to_tensor()?,
        Some(Attribute::Int(v)) => match op.result_types.first().and_then(|t| t.tensor_type()) {
            Some(t) if t.is_scalar() => crate::tensor::Tensor::filled(t.dtype, &[], *v as f64),
            _ => {
                return Err(import_error(
                    &op.name,
                    "an integer value needs a scalar type",
                ))
            }
        },
        Some(Attribute::Float(v)) => match op.result_types.first().and_then(|t| t.tensor_type()) {
            Some(t) if t.is_scalar() && t.dtype.is_float() => {
                crate::tensor::Tensor::filled(t.dtype, &[], *v)
            }
            _ => {
                return Err(import_error(
                    &op.name,
                    "a float value needs a float scalar type",
                ))
            }
        },
        Some(Attribute::Bool(b)) => crate::tensor::Tensor::scalar(*b),
        other => {
            return Err(import_error(
                &op.name,
                format!("unsupported constant value {other:?}"),
            ))
        }
    };
    Ok(vec![im.constant(tensor)?])
}

/// `stablehlo.compare` with its direction; `UNSIGNED` comparisons of integers are refused
/// (gradloop's integers are signed).
pub(crate) fn compare(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [a, b] = operands(op, x)?;
    let kind = op.attr("compare_type").and_then(Attribute::enum_value);
    if kind == Some("UNSIGNED") && a.ty().dtype.is_int() {
        return Err(import_error(
            &op.name,
            "unsigned comparisons of integers are not supported",
        ));
    }
    let direction = op
        .attr("comparison_direction")
        .and_then(Attribute::enum_value);
    let f: Binary = match direction {
        Some("EQ") => build::equal,
        Some("NE") => build::not_equal,
        Some("LT") => build::less,
        Some("LE") => build::less_equal,
        Some("GT") => build::greater,
        Some("GE") => build::greater_equal,
        other => {
            return Err(import_error(
                &op.name,
                format!("unknown comparison {other:?}"),
            ))
        }
    };
    Ok(vec![f(im.ctx(), a, b)?])
}

/// `stablehlo.convert` (and `arith.index_cast`): a cast to the result's dtype.
/// The dtype of an op's first result (what a conversion converts to).
fn result_dtype(op: &Operation) -> Result<DType> {
    Ok(op
        .result_types
        .first()
        .and_then(|t| t.tensor_type())
        .ok_or_else(|| import_error(&op.name, "unsupported result type"))?
        .dtype)
}

pub(crate) fn convert(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [a] = operands(op, x)?;
    let to = result_dtype(op)?;
    if a.ty().dtype == to {
        return Ok(vec![a.clone()]);
    }
    Ok(vec![build::cast(im.ctx(), a, to)?])
}

pub(crate) fn bitcast_convert(
    im: &mut Importer<'_>,
    op: &Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [a] = operands(op, x)?;
    let to = result_dtype(op)?;
    Ok(vec![build::bitcast_convert(im.ctx(), a, to)?])
}

pub(crate) fn select(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [p, a, b] = operands(op, x)?;
    Ok(vec![build::select(im.ctx(), p, a, b)?])
}

/// `clamp(lo, x, hi)` = `min(max(x, lo), hi)`.
pub(crate) fn clamp(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [lo, v, hi] = operands(op, x)?;
    let ctx = im.ctx();
    let low = build::maximum(ctx, v, lo)?;
    Ok(vec![build::minimum(ctx, &low, hi)?])
}

/// Division; integer division truncates toward zero.
pub(crate) fn divide(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [a, b] = operands(op, x)?;
    let ctx = im.ctx();
    if a.ty().dtype.is_float() {
        return Ok(vec![build::div(ctx, a, b)?]);
    }
    Ok(vec![build::quotient(ctx, a, b)?])
}

/// `1 / sqrt(x)`.
pub(crate) fn rsqrt(ctx: &mut dyn Context<Val>, x: &Val) -> Result<Val> {
    let s = build::sqrt(ctx, x)?;
    let one = build::ones_like(ctx, &s)?;
    build::div(ctx, &one, &s)
}

/// `x == x and |x| < inf` (false for NaN and the infinities).
pub(crate) fn is_finite(ctx: &mut dyn Context<Val>, x: &Val) -> Result<Val> {
    let not_nan = build::equal(ctx, x, x)?;
    let size = build::abs(ctx, x)?;
    let inf = build::fill_like(ctx, x, f64::INFINITY)?;
    let bounded = build::less(ctx, &size, &inf)?;
    build::logical_and(ctx, &not_nan, &bounded)
}

/// Values passed through unchanged (`stablehlo.optimization_barrier`).
pub(crate) fn pass_through(_: &mut Importer<'_>, _: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    Ok(x.to_vec())
}
