//! `take` (numpy's gather along one axis) and `scatter_add` (its gradient, and take's
//! transpose). Indices are int32/int64 tensors of any shape; negative indices wrap as in numpy;
//! an index still out of range is an `Error::index` in eager execution (unlike the clamped
//! dynamic slices: a gather of a whole index array is not a loop counter, and silently reading
//! the wrong row would hide bugs).
//!
//! Gradients: take -> scatter_add of g at the same indices; scatter_add -> take of g. Both are
//! linear, so higher orders alternate between the two. MLIR: `stablehlo.gather` /
//! `stablehlo.scatter` with an add region.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Zip};
use smallvec::smallvec;

use super::kernels::Arith;
use super::layout::static_shape;
use super::rules::{check_dtype, shape_str, Accepts};
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

fn check_indices(op: &'static str, indices: &TensorType) -> Result<()> {
    if indices.dtype.is_int() {
        return Ok(());
    }
    Err(Error::dtype(op, format!("indices must be int32 or int64, got {indices}")))
}

/// Indices made non-negative (numpy's wrap-around); any still outside `[0, n)` is an error.
fn wrapped_indices(op: &'static str, t: &Tensor, n: usize, axis: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match t.dtype() {
        DType::I32 => t.as_slice::<i32>()?.iter().map(|&v| i64::from(v)).collect(),
        DType::I64 => t.as_slice::<i64>()?.to_vec(),
        other => return Err(Error::internal(op, format!("indices of dtype {other} reached the kernel"))),
    };
    let size = n as i64;
    raw.into_iter()
        .map(|i| {
            let j = if i < 0 { i + size } else { i };
            if (0..size).contains(&j) {
                Ok(j as usize)
            } else {
                Err(Error::index(op, format!("index {i} is out of bounds for axis {axis} with size {n}")))
            }
        })
        .collect()
}

/// Gathers along `axis`: output shape `x.shape[:axis] + indices.shape + x.shape[axis+1:]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Take {
    pub axis: usize,
}

impl OpDef for Take {
    fn name(&self) -> &'static str {
        "take"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("take", inputs, 2)?;
        let (x, idx) = (&inputs[0], &inputs[1]);
        check_indices("take", idx)?;
        if self.axis >= x.ndim() {
            return Err(Error::index("take", format!("axis {} is out of bounds for a tensor of shape {}", self.axis, shape_str(x))));
        }
        let mut shape: Shape = x.shape[..self.axis].into();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&x.shape[self.axis + 1..]);
        Ok(smallvec![TensorType::new(x.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (x, idx) = (&inputs[0], &inputs[1]);
        let idx = wrapped_indices("take", idx, x.shape()[self.axis], self.axis)?;
        let out = crate::with_dtype!(x.dtype(), T, { Tensor::from_array(x.view::<T>()?.select(Axis(self.axis), &idx)) });
        Ok(smallvec![out.reshaped(&outputs[0].shape)?])
    }

    fn saves(&self) -> Saves {
        Saves::inputs(0b10)
    }

    fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], needs: &[bool]) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref().filter(|_| needs[0]) else { return Ok(smallvec![None, None]) };
        let dim_size = static_shape("take", &saved.input_types[0])?[self.axis];
        Ok(smallvec![Some(scatter_add(ctx, g, saved.input(1)?, self.axis, dim_size)?), None])
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

impl OpDef for ScatterAdd {
    fn name(&self) -> &'static str {
        "scatter_add"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("scatter_add", inputs, 2)?;
        let (u, idx) = (&inputs[0], &inputs[1]);
        check_dtype("scatter_add", Accepts::Numeric, u)?;
        check_indices("scatter_add", idx)?;
        let (axis, k) = (self.axis, idx.ndim());
        let fits = u.ndim() >= axis + k
            && u.shape[axis..axis + k].iter().zip(&idx.shape).all(|(&a, &b)| a == b || a == DYN || b == DYN);
        if !fits {
            return Err(Error::shape(
                "scatter_add",
                format!(
                    "updates of shape {} do not match indices of shape {} at axis {axis}: expected {axis} leading dimensions, then {}, then any",
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
        // Updates seen as prefix + [number of indices] + suffix: one slab per index.
        let mut flat: Shape = u.shape()[..self.axis].into();
        flat.push(idx.len());
        flat.extend_from_slice(&u.shape()[self.axis + idx_t.ndim()..]);
        let axis = Axis(self.axis);
        let out = crate::with_numeric!(u.dtype(), T, {
            let updates = ArrayViewD::from_shape(IxDyn(&flat), u.as_slice::<T>()?).map_err(|e| Error::internal("scatter_add", e.to_string()))?;
            let mut out = ArrayD::<T>::from_elem(IxDyn(&outputs[0].shape), <T as Arith>::zero());
            for (j, &i) in idx.iter().enumerate() {
                Zip::from(out.index_axis_mut(axis, i)).and(updates.index_axis(axis, j)).for_each(|o, &v| *o = o.wadd(v));
            }
            Tensor::from_array(out)
        }, return Err(Error::internal("scatter_add", "bool reached the kernel")));
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::inputs(0b10)
    }

    fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], needs: &[bool]) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref().filter(|_| needs[0]) else { return Ok(smallvec![None, None]) };
        Ok(smallvec![Some(take(ctx, g, saved.input(1)?, self.axis)?), None])
    }
}

/// numpy's `take(x, indices, axis)` (absolute axis).
pub fn take<V: Value>(ctx: &mut dyn Context<V>, x: &V, indices: &V, axis: usize) -> Result<V> {
    build::apply1(ctx, Take { axis }, &[x.clone(), indices.clone()])
}

/// Zeros with `dim_size` along `axis`, `updates` summed in at `indices`.
pub fn scatter_add<V: Value>(ctx: &mut dyn Context<V>, updates: &V, indices: &V, axis: usize, dim_size: usize) -> Result<V> {
    build::apply1(ctx, ScatterAdd { axis, dim_size }, &[updates.clone(), indices.clone()])
}
