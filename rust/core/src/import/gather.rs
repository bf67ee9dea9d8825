//! `stablehlo.gather` and `stablehlo.scatter` in the forms of numpy's `take` along one axis and
//! its transpose, an add-scatter (what gradloop's `take` and `scatter_add` write, and what
//! JAX writes for `x[idx]` and its gradient): one index per slice, the indexed axis collapsed
//! (or inserted), the indices' dimensions in its place. StableHLO clamps a gather's start
//! indices into range and skips a scatter's out-of-range updates; gradloop's ops take indices
//! in range, so the importer clamps and masks explicitly. A scatter whose region returns the
//! update (a "set") at one index vector, what JAX writes for `x.at[i].set(row)` with a scalar
//! `i`, is a `dynamic_update_slice` where the window fits and `x` where it does not. Other
//! forms are refused by name.

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
pub(crate) struct Dims(Vec<(String, Vec<i64>)>);

impl Dims {
    pub(crate) fn of(op: &Operation, attr: &str) -> Result<Dims> {
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
    pub(crate) fn get(&self, name: &str) -> Vec<i64> {
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
pub(crate) fn index_scalar(im: &mut Importer<'_>, idx: &Val, v: i64) -> Result<Val> {
    let t = match idx.ty().dtype {
        DType::I32 => Tensor::scalar(v as i32),
        _ => Tensor::scalar(v),
    };
    im.constant(t)
}

/// `stablehlo.gather` as `take(x, clamp(idx, 0, n - 1), axis)`; other point forms (several
/// indexed axes, batching dimensions) through `point_gather`.
pub(crate) fn gather(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [v, idx] = operands(op, x)?;
    if let Ok(out) = take_gather(im, op, v, idx) {
        return Ok(vec![out]);
    }
    let out = super::point_gather::point_gather(im, op, v, idx)?;
    check_type(op, &out)?;
    Ok(vec![out])
}

/// The form of numpy's `take` along one axis.
fn take_gather(im: &mut Importer<'_>, op: &Operation, v: &Val, idx: &Val) -> Result<Val> {
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
    Ok(out)
}

/// `stablehlo.scatter` with an add region as `operand + scatter_add(updates, idx, axis, n)`,
/// updates whose index is out of range left out.
pub(crate) fn scatter(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [operand, idx, updates] = operands(op, x)?;
    let set = replaces(op);
    if set {
        if let Ok(out) = scatter_one_window(im, op, operand, idx, updates) {
            return Ok(out);
        }
    } else if combiner(op).ok() != Some(Combiner::Add) {
        return Err(unsupported(op, "a region other than one add or a set"));
    } else if let Ok(out) = take_scatter(im, op, operand, idx, updates) {
        return Ok(vec![out]);
    }
    let out = super::point_scatter::point_scatter(im, op, (operand, idx, updates), set)?;
    check_type(op, &out)?;
    Ok(vec![out])
}

/// The add-scatter of numpy's `take` along one axis (its transpose).
fn take_scatter(
    im: &mut Importer<'_>,
    op: &Operation,
    operand: &Val,
    idx: &Val,
    updates: &Val,
) -> Result<Val> {
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
    Ok(out)
}

/// Whether the scatter's region returns its second argument, the update: a "set".
fn replaces(op: &Operation) -> bool {
    let Some([block]) = op.regions.first().map(|r| r.blocks.as_slice()) else {
        return false;
    };
    match (block.args.as_slice(), block.ops.as_slice()) {
        ([_, (update, _)], [ret]) => ret.operands.len() == 1 && &ret.operands[0].name == update,
        _ => false,
    }
}

/// A "set" scatter of one window at one index vector (`indices` of shape `[k]`, every update
/// dimension a window dimension): `dynamic_update_slice` of the window, kept only where it lies
/// inside `operand` (a scatter skips an update out of bounds, where the slice would clamp it).
fn scatter_one_window(
    im: &mut Importer<'_>,
    op: &Operation,
    operand: &Val,
    idx: &Val,
    updates: &Val,
) -> Result<Vec<Val>> {
    let dims = Dims::of(op, "scatter_dimension_numbers")?;
    let shape = operand.ty().shape.to_vec();
    let inserted = dims.get("inserted_window_dims");
    let to_operand = dims.get("scatter_dims_to_operand_dims");
    let update_rank = updates.ty().ndim();
    let one_vector = idx.ty().ndim() == 1
        && idx.ty().shape[0] == to_operand.len()
        && dims.get("index_vector_dim").first().copied().unwrap_or(0) == 0
        && dims.get("input_batching_dims").is_empty()
        && dims.get("update_window_dims") == (0..update_rank as i64).collect::<Vec<_>>()
        && update_rank + inserted.len() == shape.len();
    if !one_vector || !matches!(idx.ty().dtype, DType::I32 | DType::I64) {
        return Err(unsupported(
            op,
            "a set (a region returning the update) other than one window at one index vector",
        ));
    }
    // the window: the update's dimensions, with ones where dimensions were inserted
    let mut window = Vec::with_capacity(shape.len());
    let mut rest = updates.ty().shape.iter().copied();
    for d in 0..shape.len() {
        if inserted.contains(&(d as i64)) {
            window.push(1);
        } else {
            window.push(rest.next().unwrap_or(1));
        }
    }
    let zero = index_scalar(im, idx, 0)?;
    let mut starts = vec![zero.clone(); shape.len()];
    let mut fits: Option<Val> = None;
    for (j, &d) in to_operand.iter().enumerate() {
        let d = d as usize;
        let last = index_scalar(im, idx, shape[d] as i64 - window[d] as i64)?;
        let ctx = im.ctx();
        let one = build::slice(ctx, idx, &[j], &[j + 1], &[1])?;
        let start = build::reshape(ctx, &one, &[])?;
        let inside = build::greater_equal(ctx, &start, &zero)?;
        let below = build::less_equal(ctx, &start, &last)?;
        let inside = build::logical_and(ctx, &inside, &below)?;
        fits = Some(match fits {
            Some(f) => build::logical_and(ctx, &f, &inside)?,
            None => inside,
        });
        starts[d] = start;
    }
    let ctx = im.ctx();
    let window_update = build::reshape(ctx, updates, &window)?;
    let written = build::dynamic_update_slice(ctx, operand, &window_update, &starts)?;
    let out = match fits {
        Some(f) => build::select(ctx, &f, &written, operand)?,
        None => written,
    };
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
