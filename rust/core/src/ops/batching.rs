//! What batching rules (`OpDef::batch`) share. A rule sees the physical inputs and which of
//! them hold lanes (along axis 0); it returns outputs holding lanes along axis 0. Lane sizes
//! agree (`vmap` checks its arguments); an unbatched input is the same in every lane.

use smallvec::SmallVec;

use super::build;
use super::{Context, Op, Values};
use crate::error::{Error, Result};
use crate::shape::{Shape, DYN};
use crate::value::Value;

/// Inputs of a rule (most ops have at most four).
pub type Inputs<V> = SmallVec<[V; 4]>;

/// One lane's rank of input `v`.
pub fn lane_rank<V: Value>(v: &V, batched: bool) -> usize {
    v.ty().ndim() - usize::from(batched)
}

/// The number of lanes: axis 0 of the first batched input (`DYN` when known only at run time).
pub fn lane_count<V: Value>(inputs: &[V], batched: &[bool]) -> Result<usize> {
    inputs
        .iter()
        .zip(batched)
        .find(|(_, &b)| b)
        .map(|(v, _)| v.ty().shape[0])
        .ok_or_else(|| Error::internal("vmap", "a batching rule ran with no batched input"))
}

/// Axes of one lane as axes of the batch (the lanes' axis comes first).
pub fn shifted(axes: &[usize]) -> Vec<usize> {
    axes.iter().map(|a| a + 1).collect()
}

/// `v` (batched) with unit axes inserted after the lanes' axis until one lane has rank `rank`:
/// numpy's broadcasting then lines up each lane's axes with every other operand's, and lanes
/// with lanes.
pub fn lift_rank<V: Value>(ctx: &mut dyn Context<V>, v: &V, rank: usize) -> Result<V> {
    let shape = &v.ty().shape;
    let lane = shape.len() - 1;
    if lane >= rank {
        return Ok(v.clone());
    }
    let mut to: Shape = shape[..1].into();
    to.extend(std::iter::repeat_n(1, rank - lane));
    to.extend_from_slice(&shape[1..]);
    build::reshape(ctx, v, &to)
}

/// Batched inputs lifted to the highest lane rank of all inputs (`lift_rank`); unbatched ones
/// as they are (numpy broadcasting aligns them on the right, away from the lanes' axis).
pub fn aligned<V: Value>(
    ctx: &mut dyn Context<V>,
    inputs: &[V],
    batched: &[bool],
) -> Result<Inputs<V>> {
    let rank = inputs
        .iter()
        .zip(batched)
        .map(|(v, &b)| lane_rank(v, b))
        .max()
        .unwrap_or(0);
    inputs
        .iter()
        .zip(batched)
        .map(|(v, &b)| {
            if b {
                lift_rank(ctx, v, rank)
            } else {
                Ok(v.clone())
            }
        })
        .collect()
}

/// The rule of an op whose operands broadcast as numpy's do (elementwise ops, matmul's batch
/// axes): the op itself over `aligned` inputs.
pub fn broadcasting<V: Value>(
    ctx: &mut dyn Context<V>,
    op: impl Into<Op>,
    inputs: &[V],
    batched: &[bool],
) -> Result<Values<V>> {
    let inputs = aligned(ctx, inputs, batched)?;
    ctx.apply(&op.into(), &inputs)
}

/// The rule of an op that applies to each element, or each leading-axes slice, alone (a
/// unary op, a cast): the op itself over the batch.
pub fn pointwise<V: Value>(
    ctx: &mut dyn Context<V>,
    op: impl Into<Op>,
    inputs: &[V],
) -> Result<Values<V>> {
    ctx.apply(&op.into(), inputs)
}

/// `v` (unbatched) repeated for each of `lanes` lanes along a new axis 0.
pub fn instantiate<V: Value>(ctx: &mut dyn Context<V>, v: &V, lanes: usize) -> Result<V> {
    if lanes == DYN {
        return Err(Error::invalid(
            "vmap",
            "a value the same in every lane cannot be repeated for a number of lanes known only \
             at run time here",
        ));
    }
    let mut to: Shape = Shape::from_slice(&[lanes]);
    to.extend_from_slice(&v.ty().shape);
    build::broadcast_to(ctx, v, &to)
}

/// Every input batched: unbatched ones repeated for each lane (ops that need their operands'
/// leading axes equal).
pub fn all_batched<V: Value>(
    ctx: &mut dyn Context<V>,
    inputs: &[V],
    batched: &[bool],
) -> Result<Inputs<V>> {
    let lanes = lane_count(inputs, batched)?;
    inputs
        .iter()
        .zip(batched)
        .map(|(v, &b)| {
            if b {
                Ok(v.clone())
            } else {
                instantiate(ctx, v, lanes)
            }
        })
        .collect()
}

/// The error of a rule asked to batch an op without inputs (such an op is never batched).
pub fn no_inputs<V>(op: &'static str) -> Result<Values<V>> {
    Err(Error::internal(
        op,
        "an op without inputs reached a batching rule",
    ))
}
