//! `stablehlo.gather` in general, what `vmap` and multi-axis indexing write: any number of
//! indexed operand dimensions (`start_index_map`), batching dimensions (`operand_batching_dims`
//! paired with `start_indices_batching_dims`), an index vector on any dimension, and windows of
//! any size (collapsed or kept, placed by `offset_dims`).
//!
//! It becomes one `take` along a flattened axis: the operand is sliced to its window along the
//! dimensions nobody indexes (their starts are zero), its indexed dimensions moved to the front
//! and flattened. Each start is clamped so that its window fits (as StableHLO clamps a gather's
//! starts), a batching dimension's index is the batch position itself, and a window longer than
//! one element adds an axis of offsets; the linear index sums them with the flattened strides.
//! The result's dimensions are then put where `offset_dims` says.

use super::gather::{index_scalar, Dims};
use super::importer::{import_error, Importer};
use super::layout::sizes;
use super::syntax::Operation;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::build;
use crate::trace::Val;
use crate::value::Value;

pub(crate) fn point_gather(
    im: &mut Importer<'_>,
    op: &Operation,
    operand: &Val,
    idx: &Val,
) -> Result<Val> {
    let dims = Dims::of(op, "dimension_numbers")?;
    let refuse =
        |what: &str| import_error(&op.name, format!("a gather with {what} is not supported"));
    let shape = operand.ty().shape.to_vec();
    let rank = shape.len();
    let slice_sizes = sizes(op, "slice_sizes")?;
    let to_usize = |v: Vec<i64>| -> Result<Vec<usize>> {
        v.into_iter()
            .map(|d| usize::try_from(d).map_err(|_| refuse("a negative dimension")))
            .collect()
    };
    let start_map = to_usize(dims.get("start_index_map"))?;
    let collapsed = to_usize(dims.get("collapsed_slice_dims"))?;
    let operand_batching = to_usize(dims.get("operand_batching_dims"))?;
    let index_batching = to_usize(dims.get("start_indices_batching_dims"))?;
    let offset_dims = to_usize(dims.get("offset_dims"))?;
    let idx_shape = idx.ty().shape.to_vec();
    let vector_dim = dims.get("index_vector_dim").first().copied().unwrap_or(0) as usize;
    if slice_sizes.len() != rank
        || operand_batching.len() != index_batching.len()
        || vector_dim > idx_shape.len()
        || !matches!(idx.ty().dtype, DType::I32 | DType::I64)
    {
        return Err(refuse("malformed dimension numbers"));
    }
    let indexed: Vec<usize> = start_map.iter().chain(&operand_batching).copied().collect();
    if indexed.iter().any(|&d| d >= rank)
        || operand_batching.iter().any(|&d| slice_sizes[d] != 1)
        || collapsed.iter().any(|&d| d >= rank || slice_sizes[d] != 1)
    {
        return Err(refuse("malformed windows"));
    }
    // the indices' batch shape: their dimensions without the index vector's
    let vector_len = if vector_dim == idx_shape.len() {
        1
    } else {
        idx_shape[vector_dim]
    };
    if vector_len != start_map.len() {
        return Err(refuse(
            "an index vector whose length is not start_index_map's",
        ));
    }
    let batch_shape: Vec<usize> = (0..idx_shape.len())
        .filter(|&d| d != vector_dim)
        .map(|d| idx_shape[d])
        .collect();
    let nb = batch_shape.len();
    let in_batch = |d: usize| if d > vector_dim { d - 1 } else { d };
    // the window along the dimensions nobody indexes (their starts are zero)
    let mut window = operand.clone();
    let unindexed: Vec<usize> = (0..rank).filter(|d| !indexed.contains(d)).collect();
    if unindexed.iter().any(|&d| slice_sizes[d] != shape[d]) {
        let stop: Vec<usize> = (0..rank)
            .map(|d| {
                if indexed.contains(&d) {
                    shape[d]
                } else {
                    slice_sizes[d]
                }
            })
            .collect();
        window = build::slice(im.ctx(), &window, &vec![0; rank], &stop, &vec![1; rank])?;
    }
    // indexed dimensions first, flattened
    let mut perm = indexed.clone();
    perm.extend(&unindexed);
    let moved = build::transpose(im.ctx(), &window, &perm)?;
    let points: usize = indexed.iter().map(|&d| shape[d]).product();
    let mut flat_shape = vec![points];
    flat_shape.extend(unindexed.iter().map(|&d| slice_sizes[d]));
    let flat = build::reshape(im.ctx(), &moved, &flat_shape)?;
    // indexed dimensions whose windows are longer than one element: each adds an axis of
    // window offsets to the linear index, after the batch axes
    let long: Vec<usize> = indexed
        .iter()
        .copied()
        .filter(|&d| slice_sizes[d] > 1)
        .collect();
    let mut index_shape = batch_shape.clone();
    index_shape.extend(long.iter().map(|&d| slice_sizes[d]));
    // the linear index of every batch position and window offset
    let dtype = idx.ty().dtype;
    let mut linear: Option<Val> = None;
    let mut stride = points;
    for (k, &d) in indexed.iter().enumerate() {
        stride /= shape[d].max(1);
        let one = if k < start_map.len() {
            let i = if vector_dim == idx_shape.len() {
                idx.clone()
            } else {
                let mut start = vec![0; idx_shape.len()];
                let mut stop = idx_shape.clone();
                start[vector_dim] = k;
                stop[vector_dim] = k + 1;
                let step = vec![1; idx_shape.len()];
                let part = build::slice(im.ctx(), idx, &start, &stop, &step)?;
                build::reshape(im.ctx(), &part, &batch_shape)?
            };
            // StableHLO clamps a start so that the window fits
            let zero = index_scalar(im, idx, 0)?;
            let last = index_scalar(im, idx, (shape[d] - slice_sizes[d]) as i64)?;
            let i = build::maximum(im.ctx(), &i, &zero)?;
            build::minimum(im.ctx(), &i, &last)?
        } else {
            // a batching dimension: the batch position along its indices dimension
            let along = in_batch(index_batching[k - start_map.len()]);
            if along >= nb || batch_shape[along] != shape[d] {
                return Err(refuse("batching dimensions of different sizes"));
            }
            let iota = build::arange(im.ctx(), 0.0, shape[d] as f64, 1.0, dtype)?;
            let mut at = vec![1; nb];
            at[along] = shape[d];
            let iota = build::reshape(im.ctx(), &iota, &at)?;
            build::broadcast_to(im.ctx(), &iota, &batch_shape)?
        };
        // the batch axes, then one per long window (ones but this dimension's own)
        let mut at = batch_shape.clone();
        at.extend(vec![1; long.len()]);
        let mut one = build::reshape(im.ctx(), &one, &at)?;
        if let Some(w) = long.iter().position(|&l| l == d) {
            let offsets = build::arange(im.ctx(), 0.0, slice_sizes[d] as f64, 1.0, dtype)?;
            let mut along = vec![1; nb + long.len()];
            along[nb + w] = slice_sizes[d];
            let offsets = build::reshape(im.ctx(), &offsets, &along)?;
            one = build::add(im.ctx(), &one, &offsets)?;
        }
        let one = build::broadcast_to(im.ctx(), &one, &index_shape)?;
        let scaled = if stride == 1 {
            one
        } else {
            let s = index_scalar(im, idx, stride as i64)?;
            build::mul(im.ctx(), &one, &s)?
        };
        linear = Some(match linear {
            Some(l) => build::add(im.ctx(), &l, &scaled)?,
            None => scaled,
        });
    }
    let linear = match linear {
        Some(l) => l,
        None => return Err(refuse("no indexed dimension")),
    };
    // batch axes, long windows (indexed order), then the unindexed dimensions
    let taken = build::take(im.ctx(), &flat, &linear, 0)?;
    let window_dims: Vec<usize> = (0..rank)
        .filter(|d| !collapsed.contains(d) && !operand_batching.contains(d))
        .collect();
    if window_dims.len() != offset_dims.len() {
        return Err(refuse("offset_dims that do not match the window"));
    }
    // the long and unindexed axes in operand order, then ones for the kept point dimensions
    let mut sources: Vec<(usize, usize)> = long
        .iter()
        .enumerate()
        .map(|(w, &d)| (d, nb + w))
        .chain(
            unindexed
                .iter()
                .enumerate()
                .map(|(u, &d)| (d, nb + long.len() + u)),
        )
        .collect();
    sources.sort_unstable();
    let mut order: Vec<usize> = (0..nb).collect();
    order.extend(sources.iter().map(|&(_, axis)| axis));
    let sorted = if order.iter().enumerate().all(|(i, &o)| i == o) {
        taken
    } else {
        build::transpose(im.ctx(), &taken, &order)?
    };
    let mut grouped = batch_shape.clone();
    grouped.extend(window_dims.iter().map(|&d| slice_sizes[d]));
    let grouped_val = build::reshape(im.ctx(), &sorted, &grouped)?;
    let out_rank = grouped.len();
    let mut order = vec![usize::MAX; out_rank];
    for (w, &at) in offset_dims.iter().enumerate() {
        if at >= out_rank {
            return Err(refuse("offset_dims past the result's rank"));
        }
        order[at] = batch_shape.len() + w;
    }
    for (next_batch, slot) in order.iter_mut().filter(|s| **s == usize::MAX).enumerate() {
        *slot = next_batch;
    }
    if order.iter().enumerate().all(|(i, &o)| i == o) {
        Ok(grouped_val)
    } else {
        build::transpose(im.ctx(), &grouped_val, &order)
    }
}
