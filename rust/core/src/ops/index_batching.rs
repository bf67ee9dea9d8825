//! Batching rules of the indexing ops (`Take`, `ScatterAdd`, `DynamicSlice`,
//! `DynamicUpdateSlice`) where the indices differ per lane: each lane's indices are moved into
//! its own block of the lanes' flattened axis (`lane * size + index`), so that one gather or
//! scatter serves every lane; windows at per-lane starts are gathers along each axis.
//!
//! An index out of range keeps its error: it is sent past the end of every block, where the
//! kernel rejects it as it would have rejected the lane's own.

use super::batching::{self, Inputs};
use super::build;
use super::gather::{ScatterAdd, Take};
use super::index::{DynamicSlice, DynamicUpdateSlice};
use super::{Context, Values};
use crate::error::{Error, Result};
use crate::shape::{Shape, DYN};
use crate::value::Value;

/// Static sizes the flattening needs; a size known only at run time is an error naming `op`.
fn known(op: &'static str, sizes: &[usize]) -> Result<()> {
    if sizes.contains(&DYN) {
        return Err(Error::invalid(
            op,
            "per-lane indices into a dimension known only at run time cannot be batched here",
        ));
    }
    Ok(())
}

/// `idx` (lanes along axis 0) made non-negative (numpy's wrap-around) and moved into each
/// lane's block of `size`; an index outside `[0, size)` is sent to `lanes * size`.
fn into_blocks<V: Value>(ctx: &mut dyn Context<V>, idx: &V, size: usize) -> Result<V> {
    let ty = idx.ty().clone();
    let (lanes, dtype) = (ty.shape[0], ty.dtype);
    let zero = build::scalar(ctx, dtype, 0.0)?;
    let n = build::scalar(ctx, dtype, size as f64)?;
    let negative = build::less(ctx, idx, &zero)?;
    let shifted = build::add(ctx, idx, &n)?;
    let wrapped = build::select(ctx, &negative, &shifted, idx)?;
    let low = build::greater_equal(ctx, &wrapped, &zero)?;
    let high = build::less(ctx, &wrapped, &n)?;
    let inside = build::logical_and(ctx, &low, &high)?;
    let total = (lanes * size) as f64;
    // Each lane's block start, one per lane however many (none, or blocks of no elements).
    let lane = build::arange(ctx, 0.0, lanes as f64, 1.0, dtype)?;
    let starts = build::mul(ctx, &lane, &n)?;
    let starts = build::reshape(ctx, &starts, &lane_column(lanes, ty.ndim()))?;
    let moved = build::add(ctx, &wrapped, &starts)?;
    let past = build::scalar(ctx, dtype, total)?;
    build::select(ctx, &inside, &moved, &past)
}

/// `[lanes, 1, ..., 1]` of rank `rank`.
fn lane_column(lanes: usize, rank: usize) -> Shape {
    std::iter::once(lanes)
        .chain(std::iter::repeat_n(1, rank.saturating_sub(1)))
        .collect()
}

/// The permutation that moves axis `from` to position `to`, the others keeping their order.
fn moving(rank: usize, from: usize, to: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).filter(|&a| a != from).collect();
    perm.insert(to, from);
    perm
}

/// `Take { axis }` batched.
pub fn take<V: Value>(
    ctx: &mut dyn Context<V>,
    axis: usize,
    inputs: &[V],
    batched: &[bool],
) -> Result<Values<V>> {
    let (x, idx) = (&inputs[0], &inputs[1]);
    match (batched[0], batched[1]) {
        (false, false) => Ok([build::take(ctx, x, idx, axis)?].into()),
        (true, false) => batching::pointwise(ctx, Take { axis: axis + 1 }, inputs),
        (false, true) => {
            // The lanes' axis lands where the indexed axis was: move it to the front.
            let out = build::take(ctx, x, idx, axis)?;
            let perm = moving(out.ty().ndim(), axis, 0);
            Ok([build::transpose(ctx, &out, &perm)?].into())
        }
        _ => {
            let xs = x.ty().shape.clone();
            let (lanes, size) = (xs[0], xs[axis + 1]);
            known("take", &[lanes, size])?;
            // x: [lanes, size, rest...] flattened to [lanes * size, rest...].
            let x = build::transpose(ctx, x, &moving(xs.len(), axis + 1, 1))?;
            let mut flat = Shape::from_slice(&[lanes * size]);
            flat.extend_from_slice(&x.ty().shape[2..]);
            let x = build::reshape(ctx, &x, &flat)?;
            let idx = into_blocks(ctx, idx, size)?;
            let out = build::take(ctx, &x, &idx, 0)?;
            // [lanes, idx..., before..., after...] -> [lanes, before..., idx..., after...]
            let k = idx.ty().ndim() - 1;
            let rank = out.ty().ndim();
            let perm: Vec<usize> = std::iter::once(0)
                .chain(1 + k..1 + k + axis)
                .chain(1..1 + k)
                .chain(1 + k + axis..rank)
                .collect();
            Ok([build::transpose(ctx, &out, &perm)?].into())
        }
    }
}

/// `ScatterAdd { axis, dim_size }` batched.
pub fn scatter_add<V: Value>(
    ctx: &mut dyn Context<V>,
    op: &ScatterAdd,
    inputs: &[V],
    batched: &[bool],
) -> Result<Values<V>> {
    let (axis, dim_size) = (op.axis, op.dim_size);
    if !batched[1] {
        let op = ScatterAdd {
            axis: axis + 1,
            dim_size,
        };
        return batching::pointwise(ctx, op, inputs);
    }
    let inputs: Inputs<V> = batching::all_batched(ctx, inputs, batched)?;
    let (u, idx) = (&inputs[0], &inputs[1]);
    let lanes = idx.ty().shape[0];
    known("scatter_add", &[lanes])?;
    let k = idx.ty().ndim() - 1;
    // updates: [lanes, before(axis), idx(k), after...] -> [lanes, idx(k), before, after...]
    let rank = u.ty().ndim();
    let perm: Vec<usize> = std::iter::once(0)
        .chain(1 + axis..1 + axis + k)
        .chain(1..1 + axis)
        .chain(1 + axis + k..rank)
        .collect();
    let u = build::transpose(ctx, u, &perm)?;
    let blocks = into_blocks(ctx, idx, dim_size)?;
    let sums = build::scatter_add(ctx, &u, &blocks, 0, lanes * dim_size)?;
    // [lanes * dim_size, before, after...] -> [lanes, dim_size, before, after...] -> axis back
    let mut split = Shape::from_slice(&[lanes, dim_size]);
    split.extend_from_slice(&sums.ty().shape[1..]);
    let sums = build::reshape(ctx, &sums, &split)?;
    let perm = moving(split.len(), 1, axis + 1);
    Ok([build::transpose(ctx, &sums, &perm)?].into())
}

/// The indices `start + [0, size)` of each lane's window of `size` in a dimension of `dim`,
/// its start (lanes along axis 0) clamped so that the window fits.
fn window<V: Value>(ctx: &mut dyn Context<V>, start: &V, dim: usize, size: usize) -> Result<V> {
    let dtype = start.ty().dtype;
    let zero = build::scalar(ctx, dtype, 0.0)?;
    let last = build::scalar(ctx, dtype, (dim - size) as f64)?;
    let start = build::maximum(ctx, start, &zero)?;
    let start = build::minimum(ctx, &start, &last)?;
    let steps = build::arange(ctx, 0.0, size as f64, 1.0, dtype)?;
    let column = build::reshape(ctx, &start, &lane_column(start.ty().shape[0], 2))?;
    build::add(ctx, &column, &steps)
}

/// `DynamicSlice { sizes }` batched: the dimensions whose start is the same in every lane are
/// sliced at once, those with per-lane starts gathered one after another.
pub fn dynamic_slice<V: Value>(
    ctx: &mut dyn Context<V>,
    op: &DynamicSlice,
    inputs: &[V],
    batched: &[bool],
) -> Result<Values<V>> {
    let (x, starts) = (&inputs[0], &inputs[1..]);
    let x_batched = batched[0];
    let shape = x.ty().shape.clone();
    let lane_dims = &shape[usize::from(x_batched)..];
    // The window of the shared starts; per-lane starts take the whole dimension for now.
    let mut sizes = op.sizes.clone();
    let mut shared: Vec<V> = Vec::with_capacity(starts.len() + 1);
    let mut per_lane = Vec::new();
    for (d, start) in starts.iter().enumerate() {
        if batched[d + 1] {
            shared.push(build::scalar(ctx, start.ty().dtype, 0.0)?);
            sizes[d] = lane_dims[d];
            per_lane.push(d);
        } else {
            shared.push(start.clone());
        }
    }
    let mut out = if x_batched {
        let lanes = shape[0];
        let dtype = starts
            .first()
            .map_or(crate::dtype::DType::I64, |s| s.ty().dtype);
        shared.insert(0, build::scalar(ctx, dtype, 0.0)?);
        let sizes: Vec<usize> = std::iter::once(lanes).chain(sizes).collect();
        build::dynamic_slice(ctx, x, &shared, &sizes)?
    } else {
        build::dynamic_slice(ctx, x, &shared, &sizes)?
    };
    let mut out_batched = x_batched;
    for d in per_lane {
        known("dynamic_slice", &[lane_dims[d]])?;
        let indices = window(ctx, &starts[d], lane_dims[d], op.sizes[d])?;
        out = take(ctx, d, &[out, indices], &[out_batched, true])?.remove(0);
        out_batched = true;
    }
    Ok([out].into())
}

/// `DynamicUpdateSlice` batched: with per-lane starts, each lane's window is a mask and the
/// update is gathered into place along each dimension, then selected where the mask holds
/// (what is written is the update's elements, bit for bit).
pub fn dynamic_update_slice<V: Value>(
    ctx: &mut dyn Context<V>,
    inputs: &[V],
    batched: &[bool],
) -> Result<Values<V>> {
    if !batched[2..].iter().any(|&b| b) {
        let mut all: Inputs<V> = batching::all_batched(ctx, &inputs[..2], &batched[..2])?;
        let dtype = inputs
            .get(2)
            .map_or(crate::dtype::DType::I64, |s| s.ty().dtype);
        all.push(build::scalar(ctx, dtype, 0.0)?);
        all.extend(inputs[2..].iter().cloned());
        return batching::pointwise(ctx, DynamicUpdateSlice {}, &all);
    }
    let (x, update, starts) = (&inputs[0], &inputs[1], &inputs[2..]);
    let lane_shape: Shape = x.ty().shape[usize::from(batched[0])..].into();
    let update_shape: Shape = update.ty().shape[usize::from(batched[1])..].into();
    let rank = lane_shape.len();
    let mut placed = update.clone();
    let mut placed_batched = batched[1];
    let mut mask: Option<V> = None;
    let mut mask_batched = false;
    for d in 0..rank {
        let (dim, size) = (lane_shape[d], update_shape[d]);
        known("dynamic_update_slice", &[dim, size])?;
        let start = &starts[d];
        let dtype = start.ty().dtype;
        let zero = build::scalar(ctx, dtype, 0.0)?;
        let last = build::scalar(ctx, dtype, (dim - size) as f64)?;
        let start = build::maximum(ctx, start, &zero)?;
        let start = build::minimum(ctx, &start, &last)?;
        let start_batched = batched[d + 2];
        let positions = build::arange(ctx, 0.0, dim as f64, 1.0, dtype)?;
        let start_col = if start_batched {
            build::reshape(ctx, &start, &lane_column(start.ty().shape[0], 2))?
        } else {
            start.clone()
        };
        // Which positions of dimension d the window covers, and which update element each reads.
        let offset = build::sub(ctx, &positions, &start_col)?;
        let size_v = build::scalar(ctx, dtype, size as f64)?;
        let after = build::greater_equal(ctx, &offset, &zero)?;
        let before = build::less(ctx, &offset, &size_v)?;
        let covered = build::logical_and(ctx, &after, &before)?;
        let top = build::scalar(ctx, dtype, size.saturating_sub(1) as f64)?;
        let source = build::maximum(ctx, &offset, &zero)?;
        let source = build::minimum(ctx, &source, &top)?;
        placed = take(ctx, d, &[placed, source], &[placed_batched, start_batched])?.remove(0);
        placed_batched |= start_batched;
        // covered: [lanes, dim] or [dim], along dimension d of one lane (numpy broadcasting
        // lines an unbatched mask up with a batched one from the right).
        let mut to: Shape = if start_batched {
            Shape::from_slice(&covered.ty().shape[..1])
        } else {
            Shape::new()
        };
        to.extend((0..rank).map(|a| if a == d { dim } else { 1 }));
        let covered = build::reshape(ctx, &covered, &to)?;
        mask = Some(match mask {
            None => covered,
            Some(m) => build::logical_and(ctx, &m, &covered)?,
        });
        mask_batched |= start_batched;
    }
    let mask = mask.ok_or_else(|| Error::internal("dynamic_update_slice", "rank 0 with starts"))?;
    let ins = [mask, placed, x.clone()];
    let flags = [mask_batched, placed_batched, batched[0]];
    batching::broadcasting(ctx, super::binary::Select, &ins, &flags)
}
