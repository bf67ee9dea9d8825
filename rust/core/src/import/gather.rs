//! `stablehlo.gather` and `stablehlo.scatter` in the forms of numpy's `take` along one axis and
//! its transpose, an add-scatter (what gradloop's `take` and `scatter_add` write, and what
//! JAX writes for `x[idx]` and its gradient): one index per slice, the indexed axis collapsed
//! (or inserted), the indices' dimensions in its place. StableHLO clamps a gather's start
//! indices into range and skips a scatter's out-of-range updates; gradloop's ops take indices
//! in range, so the importer clamps and masks explicitly. Other forms are refused by name.

use super::contract::{combiner, Combiner};
use super::elementwise::operands;
use super::importer::{import_error, Importer};
use super::layout::{result_type, sizes};
use super::syntax::Operation;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::build;
use crate::tensor::Tensor;
use crate::trace::Val;
use crate::value::Value;

/// The dimension numbers of a gather or scatter, by field name.
struct Dims(Vec<(String, Vec<i64>)>);

impl Dims {
    fn of(op: &Operation, attr: &str) -> Result<Dims> {
        let value = op
            .attr(attr)
            .ok_or_else(|| import_error(&op.name, format!("missing `{attr}`")))?;
        let mut fields = Vec::new();
        for (name, v) in value.fields()? {
            let list = v
                .as_ints()
                .or_else(|| v.as_int().map(|i| vec![i]))
                .ok_or_else(|| import_error(&op.name, format!("bad `{name}`")))?;
            fields.push((name, list));
        }
        Ok(Dims(fields))
    }

    /// A field as dimensions (absent: empty, as MLIR leaves empty lists out).
    fn get(&self, name: &str) -> Vec<i64> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}

fn unsupported(op: &Operation, what: &str) -> crate::error::Error {
    import_error(
        &op.name,
        format!(
            "only the form of numpy's take along one axis (and its add-scatter) is supported: {what}"
        ),
    )
}

/// The indices with the index vector dimension (a trailing 1, or implicit) dropped, and the
/// one operand axis they index.
fn take_indices(
    im: &mut Importer<'_>,
    op: &Operation,
    dims: &Dims,
    idx: &Val,
    (inserted, to_operand): (&str, &str),
) -> Result<(Val, usize)> {
    let batching = ["operand_batching_dims", "input_batching_dims"];
    if batching.iter().any(|b| !dims.get(b).is_empty()) {
        return Err(unsupported(op, "batching dimensions"));
    }
    let axis = match (
        dims.get(inserted).as_slice(),
        dims.get(to_operand).as_slice(),
    ) {
        (&[a], &[b]) if a == b && a >= 0 => a as usize,
        _ => return Err(unsupported(op, "more than one indexed axis")),
    };
    let shape = idx.ty().shape.to_vec();
    let vector_dim = dims.get("index_vector_dim").first().copied().unwrap_or(0);
    let idx = if vector_dim == shape.len() as i64 {
        idx.clone()
    } else if vector_dim + 1 == shape.len() as i64 && shape.last() == Some(&1) {
        build::reshape(im.ctx(), idx, &shape[..shape.len() - 1])?
    } else {
        return Err(unsupported(op, "an index vector of more than one index"));
    };
    Ok((idx, axis))
}

/// `v` as a constant scalar of `idx`'s integer dtype.
fn index_scalar(im: &mut Importer<'_>, idx: &Val, v: i64) -> Result<Val> {
    let t = match idx.ty().dtype {
        DType::I32 => Tensor::scalar(v as i32),
        _ => Tensor::scalar(v),
    };
    im.constant(t)
}

/// `stablehlo.gather` as `take(x, clamp(idx, 0, n - 1), axis)`.
pub(crate) fn gather(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v, idx] = operands(op, x)?;
    let dims = Dims::of(op, "dimension_numbers")?;
    let (idx, axis) = take_indices(
        im,
        op,
        &dims,
        idx,
        ("collapsed_slice_dims", "start_index_map"),
    )?;
    let shape = v.ty().shape.to_vec();
    let (r, k) = (shape.len(), idx.ty().ndim());
    let mut slice = shape.clone();
    slice[axis] = 1;
    let offsets: Vec<i64> = (0..axis)
        .chain(axis + k..r - 1 + k)
        .map(|d| d as i64)
        .collect();
    if sizes(op, "slice_sizes")? != slice || dims.get("offset_dims") != offsets {
        return Err(unsupported(
            op,
            "slices other than whole rows along the indexed axis",
        ));
    }
    let zero = index_scalar(im, &idx, 0)?;
    let last = index_scalar(im, &idx, shape[axis] as i64 - 1)?;
    let ctx = im.ctx();
    let clamped = build::maximum(ctx, &idx, &zero)?;
    let clamped = build::minimum(ctx, &clamped, &last)?;
    let out = build::take(ctx, v, &clamped, axis)?;
    check_type(op, &out)?;
    Ok(vec![out])
}

/// `stablehlo.scatter` with an add region as `operand + scatter_add(updates, idx, axis, n)`,
/// updates whose index is out of range left out.
pub(crate) fn scatter(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [operand, idx, updates] = operands(op, x)?;
    if combiner(op).ok() != Some(Combiner::Add) {
        return Err(unsupported(op, "a region other than one add"));
    }
    let dims = Dims::of(op, "scatter_dimension_numbers")?;
    let (idx, axis) = take_indices(
        im,
        op,
        &dims,
        idx,
        ("inserted_window_dims", "scatter_dims_to_operand_dims"),
    )?;
    let shape = operand.ty().shape.to_vec();
    let (r, k) = (shape.len(), idx.ty().ndim());
    let window: Vec<i64> = (0..axis)
        .chain(axis + k..r - 1 + k)
        .map(|d| d as i64)
        .collect();
    if dims.get("update_window_dims") != window {
        return Err(unsupported(
            op,
            "windows other than whole rows along the indexed axis",
        ));
    }
    let n = shape[axis];
    let zero = index_scalar(im, &idx, 0)?;
    let size = index_scalar(im, &idx, n as i64)?;
    let ctx = im.ctx();
    let at_least_zero = build::greater_equal(ctx, &idx, &zero)?;
    let below_n = build::less(ctx, &idx, &size)?;
    let valid = build::logical_and(ctx, &at_least_zero, &below_n)?;
    let idx = build::select(ctx, &valid, &idx, &zero)?;
    // `valid` where the updates have the indices' dimensions, broadcast along the rest.
    let mut mask_shape = vec![1; axis];
    mask_shape.extend(valid.ty().shape.iter().copied());
    mask_shape.resize(r - 1 + k, 1);
    let mask = build::reshape(ctx, &valid, &mask_shape)?;
    let none = build::zeros_like(ctx, updates)?;
    let kept = build::select(ctx, &mask, updates, &none)?;
    let summed = build::scatter_add(ctx, &kept, &idx, axis, n)?;
    let out = build::add(ctx, operand, &summed)?;
    check_type(op, &out)?;
    Ok(vec![out])
}

fn check_type(op: &Operation, out: &Val) -> Result<()> {
    let declared = result_type(op)?;
    if crate::graph::tensor_types_compatible(&declared, out.ty()) {
        Ok(())
    } else {
        Err(import_error(
            &op.name,
            format!(
                "the result is declared {declared} but computes {}",
                out.ty()
            ),
        ))
    }
}
