//! `take` (numpy's gather along one axis) and `scatter_add` (its gradient, and take's
//! transpose). Indices are int32/int64 tensors of any shape; negative indices wrap as in numpy;
//! an index still out of range is an `Error::index` in eager execution (unlike the clamped
//! dynamic slices: a gather of a whole index array is not a loop counter, and silently reading
//! the wrong row would hide bugs).
//!
//! Gradients: take -> scatter_add of g at the same indices; scatter_add -> take of g. Both are
//! linear, so higher orders alternate between the two. MLIR: `stablehlo.gather` /
//! `stablehlo.scatter` with an add region.

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::dest::{self, DestKernel};
use super::kernels::Arith;
use super::layout::static_shape;
use super::rules::{check_dtype, shape_str, Accepts};
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use super::{tangents, Tangents};
use crate::dtype::DType;
use crate::emit::{i64_array, Emitter, MlirValue, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

fn check_indices(op: &'static str, indices: &TensorType) -> Result<()> {
    if indices.dtype.is_int() {
        return Ok(());
    }
    Err(Error::dtype(
        op,
        format!("indices must be int32 or int64, got {indices}"),
    ))
}

/// Indices made non-negative (numpy's wrap-around); any still outside `[0, n)` is an error.
fn wrapped_indices(op: &'static str, t: &Tensor, n: usize, axis: usize) -> Result<Vec<usize>> {
    match t.dtype() {
        DType::I32 => wrap_all(op, t.as_slice::<i32>()?, n, axis),
        DType::I64 => wrap_all(op, t.as_slice::<i64>()?, n, axis),
        other => Err(Error::internal(
            op,
            format!("indices of dtype {other} reached the kernel"),
        )),
    }
}

/// `raw` wrapped into `0..n` in one pass (a gather's indices are often as many as its
/// elements: batching's stand-ins gather every lane).
fn wrap_all<I: Copy + Into<i64>>(
    op: &'static str,
    raw: &[I],
    n: usize,
    axis: usize,
) -> Result<Vec<usize>> {
    let size = n as i64;
    // two branch-free passes (each vectorises); an index out of range is looked for only when
    // there is one
    let out: Vec<usize> = raw
        .iter()
        .map(|&i| {
            let i: i64 = i.into();
            (i + (size & (i >> 63))) as usize
        })
        .collect();
    let outside = out.iter().fold(false, |acc, &j| acc | (j >= n));
    if outside {
        let i: i64 = raw
            .iter()
            .map(|&i| i.into())
            .find(|&i: &i64| !(-size..size).contains(&i))
            .unwrap_or_default();
        return Err(Error::index(
            op,
            format!("index {i} is out of bounds for axis {axis} with size {n}"),
        ));
    }
    Ok(out)
}

/// `shape` as (prefix size, size of the `k` dimensions from `axis`, suffix size): a row-major
/// tensor is then `prefix` blocks of `middle` rows of `suffix` contiguous elements.
fn split_at_axis(shape: &[usize], axis: usize, k: usize) -> (usize, usize, usize) {
    let size = |dims: &[usize]| dims.iter().product::<usize>();
    (
        size(&shape[..axis]),
        size(&shape[axis..axis + k]),
        size(&shape[axis + k..]),
    )
}

// The two kernels copy whole contiguous rows rather than going through ndarray's `select` or
// per-index `Zip`s: gathers of many small rows (embedding lookups) are the common case, and
// per-row view bookkeeping cost ~10x the copy itself there.

/// Rows `idx` of each of the `pre` blocks of `n` rows of `suf` elements in `data`.
fn gather_rows<T: Copy + Default>(
    data: &[T],
    pre: usize,
    n: usize,
    suf: usize,
    idx: &[usize],
) -> Vec<T> {
    let mut out = vec![T::default(); pre * idx.len() * suf];
    gather_rows_into(data, n, suf, idx, &mut out);
    out
}

/// `take`'s rows `raw` (negative from the end) of each block of `n` rows of `suf` elements in
/// `data`, into `out`: each index wrapped and checked as it is used, with no list of them made
/// first (a batched loop's gathers are small and run every trip).
fn take_into<T: Copy, I: Copy + Into<i64>>(
    data: &[T],
    n: usize,
    suf: usize,
    raw: &[I],
    axis: usize,
    out: &mut [T],
) -> Result<()> {
    if n == 0 || suf == 0 || raw.is_empty() {
        let idx = wrap_all("take", raw, n, axis)?;
        gather_rows_into(data, n, suf, &idx, out);
        return Ok(());
    }
    let size = n as i64;
    let row = |i: I| -> Result<usize> {
        let i: i64 = i.into();
        let j = i + (size & (i >> 63));
        if (j as u64) < n as u64 {
            Ok(j as usize)
        } else {
            Err(Error::index(
                "take",
                format!("index {i} is out of bounds for axis {axis} with size {n}"),
            ))
        }
    };
    gather_rows_by(data, n, suf, raw, row, out)
}

/// `gather_rows` into `out` (`pre * idx.len() * suf` elements).
fn gather_rows_into<T: Copy>(data: &[T], n: usize, suf: usize, idx: &[usize], out: &mut [T]) {
    if suf == 0 || n == 0 || idx.is_empty() {
        return;
    }
    let in_range: Result<()> = gather_rows_by(data, n, suf, idx, Ok, out);
    debug_assert!(in_range.is_ok());
}

/// Row `row(i)` for each `i` of `idx`, of each block of `n` rows of `suf` (both nonzero)
/// elements in `data`, into `out`; the first error `row` gives stops it.
fn gather_rows_by<T: Copy, I: Copy>(
    data: &[T],
    n: usize,
    suf: usize,
    idx: &[I],
    row: impl Fn(I) -> Result<usize>,
    out: &mut [T],
) -> Result<()> {
    for (block, dest) in data
        .chunks_exact(n * suf)
        .zip(out.chunks_exact_mut(idx.len() * suf))
    {
        if suf == 1 {
            // one element a row: a plain gather, not a copy call per element
            for (o, &i) in dest.iter_mut().zip(idx) {
                *o = block[row(i)?];
            }
            continue;
        }
        for (d, &i) in dest.chunks_exact_mut(suf).zip(idx) {
            let j = row(i)?;
            d.copy_from_slice(&block[j * suf..(j + 1) * suf]);
        }
    }
    Ok(())
}

/// Zeros of `pre` blocks of `n` rows of `suf` elements, with row `j` of each block of
/// `updates` added into row `idx[j]`.
fn scatter_rows<T: Arith>(
    updates: &[T],
    pre: usize,
    n: usize,
    suf: usize,
    idx: &[usize],
) -> Vec<T> {
    let mut out = vec![T::zero(); pre * n * suf];
    scatter_rows_into(updates, n, suf, idx, &mut out);
    out
}

/// `scatter_rows` into `out`, which it clears first.
fn scatter_rows_into<T: Arith>(updates: &[T], n: usize, suf: usize, idx: &[usize], out: &mut [T]) {
    out.fill(T::zero());
    if suf == 0 || n == 0 || idx.is_empty() {
        return;
    }
    for (block, ups) in out
        .chunks_exact_mut(n * suf)
        .zip(updates.chunks_exact(idx.len() * suf))
    {
        if suf == 1 {
            // one element a row (a gather over lanes' gradient): no row slices per element
            for (&i, &u) in idx.iter().zip(ups) {
                block[i] = block[i].wadd(u);
            }
            continue;
        }
        for (&i, row) in idx.iter().zip(ups.chunks_exact(suf)) {
            for (o, &u) in block[i * suf..(i + 1) * suf].iter_mut().zip(row) {
                *o = o.wadd(u);
            }
        }
    }
}

/// Indices with numpy's wrap-around made explicit: `i < 0 ? i + n : i`.
fn emit_wrapped(e: &mut Emitter, idx: &MlirValue, n: usize) -> Result<MlirValue> {
    let zero = e.splat_like(idx, 0.0)?;
    let size = e.splat_like(idx, n as f64)?;
    let negative = e.compare("LT", idx, &zero);
    let shifted = e.elementwise("stablehlo.add", &[idx, &size], &idx.ty);
    let body = format!(
        "stablehlo.select {negative}, {shifted}, {idx} : {}, {}",
        TypeText(&negative.ty),
        TypeText(&idx.ty)
    );
    Ok(e.op(&body, &idx.ty))
}

/// Dimension-number fields `name = [..]`, leaving out empty lists (as MLIR prints them).
fn dim_fields(fields: &[(&str, Vec<usize>)], index_vector_dim: usize) -> String {
    let mut parts: Vec<String> = fields
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, v)| format!("{name} = {v:?}"))
        .collect();
    parts.push(format!("index_vector_dim = {index_vector_dim}"));
    parts.join(", ")
}

/// A `Compile` error unless `ty` has a static shape (gather and scatter need one).
fn require_static(e: &Emitter, what: &str, ty: &TensorType) -> Result<()> {
    if ty.shape.contains(&DYN) {
        return Err(e.unsupported(format!(
            "{what} of shape {} has unknown dimensions; the emitter needs them static here",
            ShapeDisplay(&ty.shape)
        )));
    }
    Ok(())
}

/// Gathers along `axis`: output shape `x.shape[:axis] + indices.shape + x.shape[axis+1:]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Take {
    pub axis: usize,
}
op_attrs!(Take = "take" { axis });

impl OpDef for Take {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("take", inputs, 2)?;
        let (x, idx) = (&inputs[0], &inputs[1]);
        check_indices("take", idx)?;
        if self.axis >= x.ndim() {
            return Err(Error::index(
                "take",
                format!(
                    "axis {} is out of bounds for a tensor of shape {}",
                    self.axis,
                    shape_str(x)
                ),
            ));
        }
        let mut shape: Shape = x.shape[..self.axis].into();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&x.shape[self.axis + 1..]);
        Ok(smallvec![TensorType::new(x.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (x, idx) = (&inputs[0], &inputs[1]);
        let (pre, n, suf) = split_at_axis(x.shape(), self.axis, 1);
        let idx = wrapped_indices("take", idx, n, self.axis)?;
        let out = crate::with_dtype!(x.dtype(), T, {
            Tensor::from_vec(
                gather_rows(x.as_slice::<T>()?, pre, n, suf, &idx),
                &outputs[0].shape,
            )?
        });
        Ok(smallvec![out])
    }

    /// Straight into the output's buffer: a gather over lanes runs on every trip of a batched
    /// loop (its stand-ins), where a copy through `compute` doubled its cost.
    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        let (x, idx) = (&inputs[0], &inputs[1]);
        if x.shape.contains(&DYN) || !idx.dtype.is_int() {
            return None;
        }
        let (_, n, suf) = split_at_axis(&x.shape, self.axis, 1);
        let (dtype, idx_dtype, axis) = (x.dtype, idx.dtype, self.axis);
        Some(Box::new(move |ins, outs| {
            crate::with_dtype!(dtype, T, {
                let x = dest::input::<T>(ins, 0)?;
                let out = dest::output::<T>(outs, 0)?;
                match idx_dtype {
                    DType::I32 => take_into(x, n, suf, dest::input::<i32>(ins, 1)?, axis, out),
                    _ => take_into(x, n, suf, dest::input::<i64>(ins, 1)?, axis, out),
                }
            })
        }))
    }

    fn saves(&self) -> Saves {
        Saves::inputs(0b10)
    }

    /// `stablehlo.gather` of one slice per index: the indexed axis collapsed, the indices'
    /// dimensions in its place (`index_vector_dim` = their rank: an implicit trailing 1).
    /// Out-of-range indices are clamped (eager execution raises instead).
    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (x, idx, out) = (&inputs[0], &inputs[1], &outputs[0]);
        require_static(e, "the gathered operand", &x.ty)?;
        let (axis, r, k) = (self.axis, x.ty.ndim(), idx.ty.ndim());
        let idx = emit_wrapped(e, idx, x.ty.shape[axis])?;
        let offset_dims: Vec<usize> = (0..axis).chain(axis + k..r - 1 + k).collect();
        let mut sizes = x.ty.shape.to_vec();
        sizes[axis] = 1;
        let dims = dim_fields(
            &[
                ("offset_dims", offset_dims),
                ("collapsed_slice_dims", vec![axis]),
                ("start_index_map", vec![axis]),
            ],
            k,
        );
        let body = format!(
            "\"stablehlo.gather\"({x}, {idx}) {{dimension_numbers = #stablehlo.gather<{dims}>, \
             indices_are_sorted = false, slice_sizes = {}}} : ({}, {}) -> {}",
            i64_array(&sizes),
            TypeText(&x.ty),
            TypeText(&idx.ty),
            TypeText(out)
        );
        Ok(smallvec![e.op(&body, out)])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref().filter(|_| needs[0]) else {
            return Ok(smallvec![None, None]);
        };
        let dim_size = static_shape("take", &saved.input_types[0])?[self.axis];
        Ok(smallvec![
            Some(scatter_add(ctx, g, saved.input(1)?, self.axis, dim_size)?),
            None
        ])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        super::index_batching::take(ctx, self.axis, inputs, batched)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        tangents::linear(ctx, self.clone(), inputs, outputs, tangents, &[0])
    }
}

/// Sums `updates` (shape `prefix + indices.shape + suffix`, `prefix` of length `axis`) into
/// zeros of shape `prefix + [dim_size] + suffix` at `indices` along `axis`; repeated indices
/// accumulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterAdd {
    pub axis: usize,
    pub dim_size: usize,
}
op_attrs!(ScatterAdd = "scatter_add" { axis, dim_size });

impl OpDef for ScatterAdd {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("scatter_add", inputs, 2)?;
        let (u, idx) = (&inputs[0], &inputs[1]);
        check_dtype("scatter_add", Accepts::Numeric, u)?;
        check_indices("scatter_add", idx)?;
        let (axis, k) = (self.axis, idx.ndim());
        let fits = u.ndim() >= axis + k
            && u.shape[axis..axis + k]
                .iter()
                .zip(&idx.shape)
                .all(|(&a, &b)| a == b || a == DYN || b == DYN);
        if !fits {
            return Err(Error::shape(
                "scatter_add",
                format!(
                    "updates of shape {} do not match indices of shape {} at axis {axis}: \
                     expected {axis} leading dimensions, then {}, then any",
                    shape_str(u),
                    shape_str(idx),
                    ShapeDisplay(&idx.shape)
                ),
            ));
        }
        let mut shape: Shape = u.shape[..axis].into();
        shape.push(self.dim_size);
        shape.extend_from_slice(&u.shape[axis + k..]);
        Ok(smallvec![TensorType::new(u.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (u, idx_t) = (&inputs[0], &inputs[1]);
        let idx = wrapped_indices("scatter_add", idx_t, self.dim_size, self.axis)?;
        let (pre, _, suf) = split_at_axis(u.shape(), self.axis, idx_t.ndim());
        let out = crate::with_numeric!(
            u.dtype(),
            T,
            {
                let sums = scatter_rows(u.as_slice::<T>()?, pre, self.dim_size, suf, &idx);
                Tensor::from_vec(sums, &outputs[0].shape)?
            },
            return Err(Error::internal("scatter_add", "bool reached the kernel"))
        );
        Ok(smallvec![out])
    }

    /// Straight into the output's buffer, as `Take`'s (its gradient, on the same trips).
    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        let (u, idx) = (&inputs[0], &inputs[1]);
        if u.shape.contains(&DYN) || !idx.dtype.is_int() || u.dtype == DType::Bool {
            return None;
        }
        let (_, _, suf) = split_at_axis(&u.shape, self.axis, idx.ndim());
        let (dtype, idx_dtype, axis, n) = (u.dtype, idx.dtype, self.axis, self.dim_size);
        Some(Box::new(move |ins, outs| {
            let idx = match idx_dtype {
                DType::I32 => wrap_all("scatter_add", dest::input::<i32>(ins, 1)?, n, axis)?,
                _ => wrap_all("scatter_add", dest::input::<i64>(ins, 1)?, n, axis)?,
            };
            crate::with_numeric!(
                dtype,
                T,
                {
                    let u = dest::input::<T>(ins, 0)?;
                    scatter_rows_into(u, n, suf, &idx, dest::output::<T>(outs, 0)?);
                },
                return Err(Error::internal("scatter_add", "bool reached the kernel"))
            );
            Ok(())
        }))
    }

    fn saves(&self) -> Saves {
        Saves::inputs(0b10)
    }

    /// `stablehlo.scatter` into zeros with an `add` region: the indexed axis is the inserted
    /// window dimension, the indices' dimensions of `updates` are the scatter dimensions.
    /// Out-of-range indices are skipped (eager execution raises instead).
    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (u, idx, out) = (&inputs[0], &inputs[1], &outputs[0]);
        require_static(e, "the result", out)?;
        let (axis, k) = (self.axis, idx.ty.ndim());
        let zeros = e.splat(out.dtype, &out.shape, 0.0)?;
        if u.ty.shape.contains(&0) {
            // nothing to add (and iree-compile 3.13 crashes on an empty scatter)
            return Ok(smallvec![zeros]);
        }
        let idx = emit_wrapped(e, idx, self.dim_size)?;
        let window: Vec<usize> = (0..axis).chain(axis + k..u.ty.ndim()).collect();
        let dims = dim_fields(
            &[
                ("update_window_dims", window),
                ("inserted_window_dims", vec![axis]),
                ("scatter_dims_to_operand_dims", vec![axis]),
            ],
            k,
        );
        let name = e.fresh();
        e.line(&format!(
            "{name} = \"stablehlo.scatter\"({zeros}, {idx}, {u}) ({{"
        ));
        let scalar = TensorType::scalar(out.dtype);
        let (a, b) = (e.fresh(), e.fresh());
        let st = TypeText(&scalar).to_string();
        e.line(&format!("^bb0({a}: {st}, {b}: {st}):"));
        e.indent();
        let (a, b) = (
            MlirValue {
                name: a,
                ty: scalar.clone(),
            },
            MlirValue {
                name: b,
                ty: scalar.clone(),
            },
        );
        let sum = e.elementwise("stablehlo.add", &[&a, &b], &scalar);
        e.line(&format!("stablehlo.return {sum} : {st}"));
        e.dedent();
        e.line(&format!(
            "}}) {{indices_are_sorted = false, scatter_dimension_numbers = \
             #stablehlo.scatter<{dims}>, unique_indices = false}} : ({}, {}, {}) -> {} {}",
            TypeText(&zeros.ty),
            TypeText(&idx.ty),
            TypeText(&u.ty),
            TypeText(out),
            e.loc()
        ));
        Ok(smallvec![MlirValue {
            name,
            ty: out.clone()
        }])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref().filter(|_| needs[0]) else {
            return Ok(smallvec![None, None]);
        };
        Ok(smallvec![
            Some(take(ctx, g, saved.input(1)?, self.axis)?),
            None
        ])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        super::index_batching::scatter_add(ctx, self, inputs, batched)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        tangents::linear(ctx, self.clone(), inputs, outputs, tangents, &[0])
    }
}

/// numpy's `take(x, indices, axis)` (absolute axis).
pub fn take<V: Value>(ctx: &mut dyn Context<V>, x: &V, indices: &V, axis: usize) -> Result<V> {
    build::apply1(ctx, Take { axis }, &[x.clone(), indices.clone()])
}

/// numpy's `take(x, indices, axis)` with `axis` of any sign, or from the flattened `x` when
/// None (the flattening is an op like any other, recorded by tapes).
pub fn take_along<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    indices: &V,
    axis: Option<i64>,
) -> Result<V> {
    match axis {
        Some(a) => {
            let axis = crate::shape::normalize_axis("take", a, x.ty().ndim())?;
            take(ctx, x, indices, axis)
        }
        None => {
            let flat = build::reshape(ctx, x, &[crate::shape::numel(&x.ty().shape)])?;
            take(ctx, &flat, indices, 0)
        }
    }
}

/// Zeros with `dim_size` along `axis`, `updates` summed in at `indices`.
pub fn scatter_add<V: Value>(
    ctx: &mut dyn Context<V>,
    updates: &V,
    indices: &V,
    axis: usize,
    dim_size: usize,
) -> Result<V> {
    build::apply1(
        ctx,
        ScatterAdd { axis, dim_size },
        &[updates.clone(), indices.clone()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Element;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};
    use crate::ErrorKind;

    fn idx(v: Vec<i64>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap()
    }

    #[test]
    fn take_along_an_axis_of_any_sign_or_the_flattened_tensor() {
        let cx = &mut EagerContext;
        let x = iota(&[2, 3]);
        let idx = Tensor::from_vec(vec![2i32, 0], &[2]).unwrap();
        let flat = take_along(cx, &x, &idx, None).unwrap();
        assert_eq!(
            flat.to_f64_vec(),
            vec![x.to_f64_vec()[2], x.to_f64_vec()[0]]
        );
        let last = take_along(cx, &x, &idx, Some(-1)).unwrap();
        assert_eq!(
            last.to_f64_vec(),
            take(cx, &x, &idx, 1).unwrap().to_f64_vec()
        );
        assert!(take_along(cx, &x, &idx, Some(2)).is_err());
    }

    #[test]
    fn take_gathers_like_numpy() {
        let (cx, x) = (&mut EagerContext, iota(&[3, 4]));
        let y = take(cx, &x, &idx(vec![2, 0, -1, 1], &[2, 2]), 0).unwrap();
        let want: Vec<f64> = [2.0, 0.0, 2.0, 1.0]
            .iter()
            .flat_map(|r| (0..4).map(move |c| 4.0 * r + c as f64))
            .collect();
        assert_eq!((y.shape(), y.to_f64_vec()), (&[2, 2, 4][..], want));
        let y = take(cx, &x, &Tensor::scalar(-1i32), 1).unwrap();
        assert_eq!(
            (y.shape(), y.to_f64_vec()),
            (&[3][..], vec![3.0, 7.0, 11.0])
        );
        assert_eq!(
            take(cx, &x, &idx(vec![], &[0]), 1).unwrap().shape(),
            &[3, 0]
        );
        assert_eq!(
            take(cx, &iota(&[0, 2]), &idx(vec![1], &[1]), 1)
                .unwrap()
                .shape(),
            &[0, 1]
        );
        let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
        assert_eq!(
            take(cx, &b, &idx(vec![1, 1, 0], &[3]), 0)
                .unwrap()
                .to_f64_vec(),
            [0.0, 0.0, 1.0]
        );
    }

    /// The destination kernel (graph mode's frames) against `compute`: rows of any sign, axes
    /// with rows of one element and of several, int32 and int64 indices, and an index out of
    /// range, which is the same error.
    #[test]
    fn take_into_buffers_gathers_and_checks_as_compute_does() {
        let x = iota(&[3, 4]);
        let storage = |t: &Tensor| f64::into_storage(t.as_slice::<f64>().unwrap().to_vec());
        for axis in [0, 1] {
            for raw in [vec![2i64, -1, 0, -3, 1], vec![1, 1], vec![]] {
                for i32_rows in [false, true] {
                    let rows = if i32_rows {
                        let narrow = raw.iter().map(|&i| i as i32).collect();
                        Tensor::from_vec::<i32>(narrow, &[raw.len()]).unwrap()
                    } else {
                        idx(raw.clone(), &[raw.len()])
                    };
                    let op = Take { axis };
                    let run = |rows: &Tensor| {
                        let types = [x.ty().clone(), rows.ty().clone()];
                        let outputs = op.infer(&types).unwrap();
                        let want = op.compute(&[x.clone(), rows.clone()], &outputs);
                        (want, op.kernel_into(&types, &outputs).unwrap())
                    };
                    let (want, kernel) = run(&rows);
                    let want = want.unwrap().remove(0);
                    let index = crate::with_dtype!(rows.dtype(), T, {
                        T::into_storage(rows.as_slice::<T>().unwrap().to_vec())
                    });
                    let mut out = [f64::into_storage(vec![7.0; want.numel()])];
                    kernel(&[&storage(&x), &index], &mut out).unwrap();
                    assert_eq!(f64::slice(&out[0]).unwrap(), want.to_f64_vec().as_slice());
                }
            }
            for (raw, bad) in [(vec![0i64, 4, -9], "index 4"), (vec![0, -9, 4], "index -9")] {
                let rows = idx(raw.clone(), &[3]);
                let types = [x.ty().clone(), rows.ty().clone()];
                let op = Take { axis };
                let kernel = op.kernel_into(&types, &op.infer(&types).unwrap());
                let mut out = [f64::into_storage(vec![0.0; 3 * [4, 3][axis]])];
                let got = kernel.unwrap()(&[&storage(&x), &i64::into_storage(raw)], &mut out);
                expect_error(
                    got,
                    ErrorKind::Index,
                    "take",
                    &[bad, &format!("axis {axis}")],
                );
            }
        }
    }

    #[test]
    fn take_errors_name_the_index_and_size() {
        let (cx, x) = (&mut EagerContext, iota(&[3, 4]));
        let r = take(cx, &x, &idx(vec![0, 3], &[2]), 0);
        expect_error(
            r,
            ErrorKind::Index,
            "take",
            &["index 3", "axis 0", "size 3"],
        );
        let r = take(cx, &x, &idx(vec![-5], &[1]), 1);
        expect_error(
            r,
            ErrorKind::Index,
            "take",
            &["index -5", "axis 1", "size 4"],
        );
        expect_error(
            take(cx, &x, &idx(vec![0], &[1]), 2),
            ErrorKind::Index,
            "take",
            &["axis 2", "[3, 4]"],
        );
        expect_error(
            take(cx, &x, &Tensor::scalar(0.0f64), 0),
            ErrorKind::DType,
            "take",
            &["float64"],
        );
        expect_error(
            take(cx, &iota(&[0]), &idx(vec![0], &[1]), 0),
            ErrorKind::Index,
            "take",
            &["size 0"],
        );
    }

    #[test]
    fn scatter_add_accumulates_duplicates() {
        let cx = &mut EagerContext;
        let y = scatter_add(cx, &iota(&[2, 3]), &idx(vec![1, -1, 0], &[3]), 1, 2).unwrap();
        // row r: out[r, 1] = u[r, 0] + u[r, 1], out[r, 0] = u[r, 2]
        assert_eq!(y.to_f64_vec(), [2.0, 1.0, 5.0, 7.0]);
        let u = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2]).unwrap();
        let y = scatter_add(cx, &u, &idx(vec![2, 2, 0, 2], &[2, 2]), 0, 3).unwrap();
        assert_eq!((y.shape(), y.to_f64_vec()), (&[3][..], vec![3.0, 0.0, 7.0]));
        assert_eq!(
            scatter_add(cx, &iota(&[0, 2]), &idx(vec![], &[0]), 0, 4)
                .unwrap()
                .to_f64_vec(),
            [0.0; 8]
        );
        let op = "scatter_add";
        let r = scatter_add(cx, &iota(&[2]), &idx(vec![0, 2], &[2]), 0, 2);
        expect_error(r, ErrorKind::Index, op, &["index 2", "size 2"]);
        let r = scatter_add(cx, &iota(&[2, 3]), &idx(vec![0, 1], &[2]), 1, 2);
        expect_error(r, ErrorKind::Shape, op, &["[2, 3]", "[2]"]);
        let b = Tensor::from_vec(vec![true], &[1]).unwrap();
        expect_error(
            scatter_add(cx, &b, &idx(vec![0], &[1]), 0, 1),
            ErrorKind::DType,
            op,
            &["bool"],
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        let i = idx(vec![2, 0, 2, -1], &[2, 2]);
        check_op_gradients(&|ctx, xs| take(ctx, &xs[0], &i, 1), &[ramp(&[2, 3, 2])]);
        check_op_gradients(
            &|ctx, xs| take(ctx, &xs[0], &Tensor::scalar(1i32), 0),
            &[ramp(&[3, 2])],
        );
        check_op_gradients(
            &|ctx, xs| scatter_add(ctx, &xs[0], &i, 1, 3),
            &[ramp(&[2, 2, 2, 2])],
        );
    }
}
