//! Shapes of tangent rules shared by many ops (forward mode; each op's `OpDef::tangent` picks
//! one or writes its own).
//!
//! - `linear`: an op linear in some inputs (a sum, a reshape, a slice, a gather, add/sub) has
//!   for tangent the op itself on those inputs' tangents, the other inputs (indices,
//!   conditions) kept; an absent tangent counts as zeros of its input.
//! - `bilinear`: `op(ta, b) + op(a, tb)` (mul, matmul).
//! - `none`: no output has a tangent (constants, comparisons, `stop_gradient`).

use smallvec::smallvec;

use super::{build, Context, Op, Tangents};
use crate::error::Result;
use crate::value::Value;

/// No tangent for any of `outputs`.
pub fn none<V: Value>(outputs: &[V]) -> Result<Tangents<V>> {
    Ok(smallvec![None; outputs.len()])
}

/// `t`, or zeros shaped like `like` when absent.
pub fn or_zeros<V: Value>(ctx: &mut dyn Context<V>, t: &Option<V>, like: &V) -> Result<V> {
    match t {
        Some(t) => Ok(t.clone()),
        None => build::zeros_like(ctx, like),
    }
}

/// Tangents of float outputs among `values` (an integer or bool output has none).
fn float_outputs<V: Value>(values: impl IntoIterator<Item = V>) -> Tangents<V> {
    values
        .into_iter()
        .map(|v| v.ty().dtype.is_float().then_some(v))
        .collect()
}

/// The tangent of `op`, linear in its inputs at `linear`: `op` on their tangents (zeros where
/// absent) and the other inputs as they are. None when no input at `linear` has a tangent.
pub fn linear<V: Value>(
    ctx: &mut dyn Context<V>,
    op: impl Into<Op>,
    inputs: &[V],
    outputs: &[V],
    tangents: &[Option<V>],
    linear: &[usize],
) -> Result<Tangents<V>> {
    if linear.iter().all(|&i| tangents[i].is_none()) {
        return none(outputs);
    }
    let mut args = inputs.to_vec();
    for &i in linear {
        args[i] = or_zeros(ctx, &tangents[i], &inputs[i])?;
    }
    Ok(float_outputs(ctx.apply(&op.into(), &args)?))
}

/// The tangent of a bilinear `op(a, b)`: `op(ta, b) + op(a, tb)`, a term dropped where its
/// tangent is absent.
pub fn bilinear<V: Value>(
    ctx: &mut dyn Context<V>,
    op: impl Into<Op>,
    inputs: &[V],
    tangents: &[Option<V>],
) -> Result<Tangents<V>> {
    let op = op.into();
    let (a, b) = (&inputs[0], &inputs[1]);
    let left = match &tangents[0] {
        Some(ta) => Some(build::apply1(ctx, op.clone(), &[ta.clone(), b.clone()])?),
        None => None,
    };
    let right = match &tangents[1] {
        Some(tb) => Some(build::apply1(ctx, op, &[a.clone(), tb.clone()])?),
        None => None,
    };
    Ok(smallvec![sum_of(ctx, left, right)?])
}

/// `a + b`, either possibly absent (zero).
pub fn sum_of<V: Value>(ctx: &mut dyn Context<V>, a: Option<V>, b: Option<V>) -> Result<Option<V>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(build::add(ctx, &a, &b)?),
        (a, None) => a,
        (None, b) => b,
    })
}

/// `t` with `out`'s shape: a tangent of an operand that broadcasting stretches is stretched the
/// same way (added to zeros of the output, which works for unknown dimensions too).
pub fn fit<V: Value>(ctx: &mut dyn Context<V>, t: Option<V>, out: &V) -> Result<Option<V>> {
    match t {
        Some(t) if t.ty().shape != out.ty().shape => {
            let zeros = build::zeros_like(ctx, out)?;
            Ok(Some(build::add(ctx, &t, &zeros)?))
        }
        t => Ok(t),
    }
}
