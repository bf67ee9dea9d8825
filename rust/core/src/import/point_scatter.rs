//! `stablehlo.scatter` in its general point form, the transpose of `point_gather`: any number of
//! indexed operand dimensions (`scatter_dims_to_operand_dims`), batching dimensions
//! (`input_batching_dims` paired with `scatter_indices_batching_dims`), an index vector on any
//! dimension, windows of one element along the indexed dimensions and whole along the rest; the
//! region an add or a set (it returns the update).
//!
//! The operand's indexed dimensions are moved to the front and flattened, the updates' scatter
//! dimensions flattened the same way, and each update lands at its linear index through one
//! `scatter_add` along that axis. An update whose index is out of bounds is skipped (as
//! StableHLO's scatter skips it). A set writes where some update lands and keeps the operand
//! elsewhere; where several land on one element, the last one in the updates' order wins (what
//! XLA's CPU code does; StableHLO leaves the order open), found by comparing every pair of
//! updates, so a set without `unique_indices` is refused past `PAIRWISE_LIMIT` updates.

use super::attr::Attribute;
use super::gather::{index_scalar, Dims};
use super::importer::{import_error, Importer};
use super::syntax::Operation;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::build;
use crate::trace::Val;
use crate::value::Value;

/// The most updates a set without `unique_indices` compares pairwise (their square is the
/// comparison's size).
const PAIRWISE_LIMIT: usize = 4096;

pub(crate) fn point_scatter(
    im: &mut Importer<'_>,
    op: &Operation,
    (operand, idx, updates): (&Val, &Val, &Val),
    set: bool,
) -> Result<Val> {
    let dims = Dims::of(op, "scatter_dimension_numbers")?;
    let refuse =
        |what: &str| import_error(&op.name, format!("a scatter with {what} is not supported"));
    let to_usize = |v: Vec<i64>| -> Result<Vec<usize>> {
        v.into_iter()
            .map(|d| usize::try_from(d).map_err(|_| refuse("a negative dimension")))
            .collect()
    };
    let shape = operand.ty().shape.to_vec();
    let rank = shape.len();
    let to_operand = to_usize(dims.get("scatter_dims_to_operand_dims"))?;
    let inserted = to_usize(dims.get("inserted_window_dims"))?;
    let operand_batching = to_usize(dims.get("input_batching_dims"))?;
    let index_batching = to_usize(dims.get("scatter_indices_batching_dims"))?;
    let window_dims = to_usize(dims.get("update_window_dims"))?;
    let idx_shape = idx.ty().shape.to_vec();
    let vector_dim = dims.get("index_vector_dim").first().copied().unwrap_or(0) as usize;
    let u_shape = updates.ty().shape.to_vec();
    let indexed: Vec<usize> = to_operand
        .iter()
        .chain(&operand_batching)
        .copied()
        .collect();
    let unindexed: Vec<usize> = (0..rank).filter(|d| !indexed.contains(d)).collect();
    // the operand dimensions the updates' window dimensions stand for, in order
    let windowed: Vec<usize> = (0..rank)
        .filter(|d| !inserted.contains(d) && !operand_batching.contains(d))
        .collect();
    let vector_len = if vector_dim == idx_shape.len() {
        1
    } else {
        idx_shape.get(vector_dim).copied().unwrap_or(0)
    };
    if vector_dim > idx_shape.len()
        || vector_len != to_operand.len()
        || operand_batching.len() != index_batching.len()
        || windowed.len() != window_dims.len()
        || indexed.iter().any(|&d| d >= rank)
        || !matches!(idx.ty().dtype, DType::I32 | DType::I64)
    {
        return Err(refuse("malformed dimension numbers"));
    }
    for (&d, &u) in windowed.iter().zip(&window_dims) {
        let want = if indexed.contains(&d) { 1 } else { shape[d] };
        if u >= u_shape.len() || u_shape[u] != want {
            return Err(refuse(
                "windows other than one element along the indexed dimensions and whole along \
                 the rest",
            ));
        }
    }
    let batch_shape: Vec<usize> = (0..idx_shape.len())
        .filter(|&d| d != vector_dim)
        .map(|d| idx_shape[d])
        .collect();
    let scatter_axes: Vec<usize> = (0..u_shape.len())
        .filter(|d| !window_dims.contains(d))
        .collect();
    let u_batch: Vec<usize> = scatter_axes.iter().map(|&d| u_shape[d]).collect();
    if u_batch != batch_shape {
        return Err(refuse(
            "updates whose scatter dimensions are not the indices'",
        ));
    }
    let in_batch = |d: usize| if d > vector_dim { d - 1 } else { d };
    let count: usize = batch_shape.iter().product();
    let dtype = idx.ty().dtype;
    // the linear index of every update, and whether it lies in bounds
    let points: usize = indexed.iter().map(|&d| shape[d]).product();
    let mut linear: Option<Val> = None;
    let mut inside: Option<Val> = None;
    let mut stride = points;
    for (k, &d) in indexed.iter().enumerate() {
        stride /= shape[d].max(1);
        let i = if k < to_operand.len() {
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
            let zero = index_scalar(im, idx, 0)?;
            let size = index_scalar(im, idx, shape[d] as i64)?;
            let ge = build::greater_equal(im.ctx(), &i, &zero)?;
            let lt = build::less(im.ctx(), &i, &size)?;
            let ok = build::logical_and(im.ctx(), &ge, &lt)?;
            // out of bounds: a harmless index, the update itself dropped below
            let i = build::select(im.ctx(), &ok, &i, &zero)?;
            inside = Some(match inside {
                Some(all) => build::logical_and(im.ctx(), &all, &ok)?,
                None => ok,
            });
            i
        } else {
            let along = in_batch(index_batching[k - to_operand.len()]);
            if along >= batch_shape.len() || batch_shape[along] != shape[d] {
                return Err(refuse("batching dimensions of different sizes"));
            }
            let iota = build::arange(im.ctx(), 0.0, shape[d] as f64, 1.0, dtype)?;
            let mut at = vec![1; batch_shape.len()];
            at[along] = shape[d];
            let iota = build::reshape(im.ctx(), &iota, &at)?;
            build::broadcast_to(im.ctx(), &iota, &batch_shape)?
        };
        let scaled = if stride == 1 {
            i
        } else {
            let s = index_scalar(im, idx, stride as i64)?;
            build::mul(im.ctx(), &i, &s)?
        };
        linear = Some(match linear {
            Some(l) => build::add(im.ctx(), &l, &scaled)?,
            None => scaled,
        });
    }
    let Some(linear) = linear else {
        return Err(refuse("no indexed dimension"));
    };
    let linear = build::reshape(im.ctx(), &linear, &[count])?;
    // the updates as (count, the unindexed dimensions in operand order)
    let mut u_perm = scatter_axes.clone();
    u_perm.extend(
        windowed
            .iter()
            .zip(&window_dims)
            .filter(|(d, _)| !indexed.contains(d))
            .map(|(_, &u)| u),
    );
    let moved = build::transpose(im.ctx(), updates, &u_perm)?;
    let mut flat_u = vec![count];
    flat_u.extend(unindexed.iter().map(|&d| shape[d]));
    let mut flat_updates = build::reshape(im.ctx(), &moved, &flat_u)?;
    // where each update may land: in bounds, and (for a set) the last to land there
    let mut keep = match inside {
        Some(ok) => Some(build::reshape(im.ctx(), &ok, &[count])?),
        None => None,
    };
    let unique = matches!(op.attr("unique_indices"), Some(Attribute::Bool(true)));
    if set && !unique {
        if count > PAIRWISE_LIMIT {
            return Err(refuse(&format!(
                "a set of more than {PAIRWISE_LIMIT} updates without unique_indices"
            )));
        }
        let later = last_to_land(im, &linear, count, dtype)?;
        keep = Some(match keep {
            Some(k) => build::logical_and(im.ctx(), &k, &later)?,
            None => later,
        });
    }
    let mut mask_shape = vec![count];
    mask_shape.extend(vec![1; unindexed.len()]);
    let keep_rows = match &keep {
        Some(k) => Some(build::reshape(im.ctx(), k, &mask_shape)?),
        None => None,
    };
    if let Some(k) = &keep_rows {
        let zeros = build::zeros_like(im.ctx(), &flat_updates)?;
        flat_updates = build::select(im.ctx(), k, &flat_updates, &zeros)?;
    }
    // the operand with its indexed dimensions first, flattened
    let mut perm = indexed.clone();
    perm.extend(&unindexed);
    let mut flat_shape = vec![points];
    flat_shape.extend(unindexed.iter().map(|&d| shape[d]));
    let moved = build::transpose(im.ctx(), operand, &perm)?;
    let flat = build::reshape(im.ctx(), &moved, &flat_shape)?;
    let summed = build::scatter_add(im.ctx(), &flat_updates, &linear, 0, points)?;
    let result = if set {
        let landed = match &keep_rows {
            Some(k) => build::cast(im.ctx(), k, operand.ty().dtype)?,
            None => {
                let mut ones_shape = vec![count];
                ones_shape.extend(vec![1; unindexed.len()]);
                build::fill(im.ctx(), operand.ty().dtype, &ones_shape, 1.0)?
            }
        };
        let hits = build::scatter_add(im.ctx(), &landed, &linear, 0, points)?;
        let zero = build::zeros_like(im.ctx(), &hits)?;
        let hit = build::greater(im.ctx(), &hits, &zero)?;
        build::select(im.ctx(), &hit, &summed, &flat)?
    } else {
        build::add(im.ctx(), &flat, &summed)?
    };
    // back to the operand's layout
    let mut unflat = indexed.iter().map(|&d| shape[d]).collect::<Vec<_>>();
    unflat.extend(unindexed.iter().map(|&d| shape[d]));
    let unflat = build::reshape(im.ctx(), &result, &unflat)?;
    let mut inverse = vec![0; rank];
    for (at, &d) in perm.iter().enumerate() {
        inverse[d] = at;
    }
    build::transpose(im.ctx(), &unflat, &inverse)
}

/// Whether each of `count` updates is the last to land at its linear index.
fn last_to_land(im: &mut Importer<'_>, linear: &Val, count: usize, dtype: DType) -> Result<Val> {
    let row = build::reshape(im.ctx(), linear, &[count, 1])?;
    let col = build::reshape(im.ctx(), linear, &[1, count])?;
    let same = build::equal(im.ctx(), &row, &col)?;
    let order = build::arange(im.ctx(), 0.0, count as f64, 1.0, dtype)?;
    let before = build::reshape(im.ctx(), &order, &[count, 1])?;
    let after = build::reshape(im.ctx(), &order, &[1, count])?;
    let later = build::less(im.ctx(), &before, &after)?;
    let shadowed = build::logical_and(im.ctx(), &same, &later)?;
    let n = build::cast(im.ctx(), &shadowed, DType::I32)?;
    let n = build::sum(im.ctx(), &n, &[1], false)?;
    let zero = build::zeros_like(im.ctx(), &n)?;
    build::equal(im.ctx(), &n, &zero)
}
