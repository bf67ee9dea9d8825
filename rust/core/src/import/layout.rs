//! StableHLO ops that move elements: `broadcast_in_dim`, `reshape`, `transpose`, `iota`,
//! `slice`, `concatenate`, `reverse`, `pad`, `dynamic_slice` and `dynamic_update_slice`, each
//! as the gradloop layout ops with the same semantics. Shapes come from the declared result
//! type, attributes from the op.

use super::attr::Attribute;
use super::elementwise::operands;
use super::importer::{import_error, Importer};
use super::syntax::Operation;
use crate::error::Result;
use crate::ops::build;
use crate::shape::{Shape, TensorType};
use crate::trace::Val;
use crate::value::Value;

/// The declared type of result 0.
pub(crate) fn result_type(op: &Operation) -> Result<TensorType> {
    op.result_types
        .first()
        .and_then(|t| t.tensor_type())
        .ok_or_else(|| import_error(&op.name, "unsupported result type"))
}

/// An integer-list attribute (`array<i64: ...>` or `[...]`).
pub(crate) fn ints(op: &Operation, name: &str) -> Result<Vec<i64>> {
    op.attr(name)
        .and_then(Attribute::as_ints)
        .ok_or_else(|| import_error(&op.name, format!("missing integer list `{name}`")))
}

/// Non-negative integers as sizes or axes.
pub(crate) fn sizes(op: &Operation, name: &str) -> Result<Vec<usize>> {
    ints(op, name)?
        .into_iter()
        .map(|v| {
            usize::try_from(v).map_err(|_| {
                import_error(
                    &op.name,
                    format!("`{name}` has a negative entry {v} (not supported)"),
                )
            })
        })
        .collect()
}

/// `broadcast_in_dim`: operand dimension `i` becomes result dimension `dims[i]` (sizes equal
/// or 1); the other result dimensions repeat. Unsorted `dims` transpose the operand first.
pub(crate) fn broadcast_in_dim(
    im: &mut Importer<'_>,
    op: &Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [v] = operands(op, x)?;
    let out = result_type(op)?;
    let dims = sizes(op, "broadcast_dimensions")?;
    let ctx = im.ctx();
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| dims[i]);
    let v = if order.iter().enumerate().all(|(i, &o)| i == o) {
        v.clone()
    } else {
        build::transpose(ctx, v, &order)?
    };
    let mut expanded: Shape = std::iter::repeat_n(1, out.ndim()).collect();
    for (k, &i) in order.iter().enumerate() {
        expanded[dims[i]] = v.ty().shape[k];
    }
    let v = if expanded == v.ty().shape {
        v
    } else {
        build::reshape(ctx, &v, &expanded)?
    };
    if v.ty().shape == out.shape {
        return Ok(vec![v]);
    }
    Ok(vec![build::broadcast_to(ctx, &v, &out.shape)?])
}

pub(crate) fn reshape(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v] = operands(op, x)?;
    let out = result_type(op)?;
    Ok(vec![build::reshape(im.ctx(), v, &out.shape)?])
}

pub(crate) fn transpose(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v] = operands(op, x)?;
    let perm = sizes(op, "permutation")?;
    Ok(vec![build::transpose(im.ctx(), v, &perm)?])
}

/// `iota`: the index along `iota_dimension`, repeated along the others.
pub(crate) fn iota(im: &mut Importer<'_>, op: &Operation, _: &[Val]) -> Result<Vec<Val>> {
    let out = result_type(op)?;
    let dim = op
        .attr("iota_dimension")
        .and_then(Attribute::as_int)
        .and_then(|d| usize::try_from(d).ok())
        .filter(|&d| d < out.ndim())
        .ok_or_else(|| import_error(&op.name, "bad `iota_dimension`"))?;
    let n = out.shape[dim];
    let ctx = im.ctx();
    let line = build::arange(ctx, 0.0, n as f64, 1.0, out.dtype)?;
    let mut shape: Shape = std::iter::repeat_n(1, out.ndim()).collect();
    shape[dim] = n;
    let line = build::reshape(ctx, &line, &shape)?;
    Ok(vec![build::broadcast_to(ctx, &line, &out.shape)?])
}

pub(crate) fn slice(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v] = operands(op, x)?;
    let start = sizes(op, "start_indices")?;
    let stop = sizes(op, "limit_indices")?;
    let step = sizes(op, "strides")?;
    Ok(vec![build::slice(im.ctx(), v, &start, &stop, &step)?])
}

pub(crate) fn concatenate(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let axis = op
        .attr("dimension")
        .and_then(Attribute::as_int)
        .and_then(|d| usize::try_from(d).ok())
        .ok_or_else(|| import_error(&op.name, "bad `dimension`"))?;
    Ok(vec![build::concatenate(im.ctx(), x, axis)?])
}

pub(crate) fn reverse(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v] = operands(op, x)?;
    let axes = sizes(op, "dimensions")?;
    Ok(vec![build::reverse(im.ctx(), v, &axes)?])
}

/// `pad(x, value)`: gradloop pads with zeros, so another padding value `p` is added where the
/// padding is: `pad(x) + p * (1 - pad(ones))`. Negative (cropping) padding is not supported.
pub(crate) fn pad(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v, value] = operands(op, x)?;
    let low = sizes(op, "edge_padding_low")?;
    let high = sizes(op, "edge_padding_high")?;
    let interior = sizes(op, "interior_padding")?;
    let zero = im
        .known_constant(value)
        .is_some_and(|t| t.to_f64_vec().iter().all(|&e| e == 0.0));
    let ctx = im.ctx();
    let padded = build::pad(ctx, v, &low, &high, &interior)?;
    if zero {
        return Ok(vec![padded]);
    }
    let ones = build::ones_like(ctx, v)?;
    let inside = build::pad(ctx, &ones, &low, &high, &interior)?;
    let all = build::ones_like(ctx, &inside)?;
    let outside = build::sub(ctx, &all, &inside)?;
    let fill = build::mul(ctx, &outside, value)?;
    Ok(vec![build::add(ctx, &padded, &fill)?])
}

pub(crate) fn dynamic_slice(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let (v, starts) = x
        .split_first()
        .ok_or_else(|| import_error(&op.name, "expected an operand"))?;
    let sizes = sizes(op, "slice_sizes")?;
    Ok(vec![build::dynamic_slice(im.ctx(), v, starts, &sizes)?])
}

pub(crate) fn dynamic_update_slice(
    im: &mut Importer<'_>,
    op: &Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [v, update, starts @ ..] = x else {
        return Err(import_error(&op.name, "expected an operand and an update"));
    };
    Ok(vec![build::dynamic_update_slice(
        im.ctx(),
        v,
        update,
        starts,
    )?])
}
