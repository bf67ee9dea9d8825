//! Data-dependent indexing: `dynamic_slice` and `dynamic_update_slice` here (start positions
//! are tensors, so a loop body can index with its counter); `take` (gather) and `scatter_add`
//! (its gradient) in `gather`, re-exported.
//!
//! Start indices are scalar int32/int64 tensors, one per dimension, CLAMPED so the window fits
//! (`stablehlo.dynamic_slice` / `dynamic_update_slice`, `jax.lax.dynamic_slice`): an index out
//! of range never fails, which keeps traced loops free of data-dependent errors.
//!
//! Gradients: dynamic_slice writes g into zeros at the same starts; dynamic_update_slice sends
//! g minus the window to the operand and the window to the update. Starts get none.
//!
//! MLIR: `stablehlo.dynamic_slice` / `stablehlo.dynamic_update_slice`, which clamp the same
//! way; mixed int32/int64 starts are converted to int64 (StableHLO wants one index type).

use smallvec::smallvec;

use super::attrs::op_attrs;
pub use super::gather::{scatter_add, take, ScatterAdd, Take};
use super::layout::{owned, static_shape};
use super::rules::shape_str;
use super::{build, dest, DestKernel, Grads, OpDef, Saved, Saves, Types, Values};
use super::{tangents, Tangents};
use crate::dtype::{DType, Storage};
use crate::emit::{names_text, types_text, Emitter, MlirValue, TypeText};
use crate::error::{Error, ErrorKind, Result};
use crate::ops::Context;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Checks that `starts` are one scalar int32/int64 tensor per dimension of a rank-`rank`
/// operand; `first` is the input position of the first start (for messages).
fn check_starts(op: &'static str, starts: &[TensorType], rank: usize, first: usize) -> Result<()> {
    if starts.len() != rank {
        let message = format!(
            "expected {rank} start indices (one per operand dimension), got {}",
            starts.len()
        );
        return Err(Error::invalid(op, message));
    }
    for (i, s) in starts.iter().enumerate() {
        let kind = match (s.dtype.is_int(), s.is_scalar()) {
            (true, true) => continue,
            (false, _) => ErrorKind::DType,
            (true, false) => ErrorKind::Shape,
        };
        let message = format!(
            "start index {i} (input {}) must be an int32 or int64 scalar, got {s}",
            first + i
        );
        return Err(Error::new(kind, op, message));
    }
    Ok(())
}

/// The single value of an integer tensor.
fn int_scalar(op: &'static str, t: &Tensor) -> Result<i64> {
    let v = match t.dtype() {
        DType::I32 => t.as_slice::<i32>()?.first().map(|&v| i64::from(v)),
        DType::I64 => t.as_slice::<i64>()?.first().copied(),
        other => {
            return Err(Error::internal(
                op,
                format!("an index of dtype {other} reached the kernel"),
            ))
        }
    };
    v.ok_or_else(|| Error::internal(op, "an empty index tensor reached the kernel"))
}

/// Whether every start index is a scalar i32 or i64 (what the destination kernels read).
fn scalar_indices(starts: &[TensorType]) -> bool {
    starts
        .iter()
        .all(|t| t.shape.is_empty() && matches!(t.dtype, DType::I32 | DType::I64))
}

/// Start positions clamped to `[0, dim - size]`, so that the window lies inside the operand.
fn clamped_starts(
    op: &'static str,
    starts: &[Tensor],
    dims: &[usize],
    sizes: &[usize],
) -> Result<Vec<usize>> {
    starts
        .iter()
        .zip(dims.iter().zip(sizes))
        .map(|(s, (&n, &k))| Ok(int_scalar(op, s)?.clamp(0, n.saturating_sub(k) as i64) as usize))
        .collect()
}

/// The saved start tensors, inputs `first..`.
fn saved_starts<V: Value>(op: &'static str, saved: &Saved<V>, first: usize) -> Result<Vec<V>> {
    // `Saves` masks hold 32 inputs; the starts of higher-rank operands are not kept.
    if saved.input_types.len() > 32 {
        let rank = saved.input_types.len() - first;
        return Err(Error::gradient(
            op,
            format!(
                "gradients of {op} support operands of rank <= {}, got rank {rank}",
                32 - first
            ),
        ));
    }
    (first..saved.input_types.len())
        .map(|i| saved.input(i).cloned())
        .collect()
}

/// Start indices of one integer type: int64 when they mix int32 and int64.
fn uniform_starts(e: &mut Emitter, starts: &[MlirValue]) -> Result<Vec<MlirValue>> {
    let first = starts.first().map(|s| s.ty.dtype);
    if starts.iter().all(|s| Some(s.ty.dtype) == first) {
        return Ok(starts.to_vec());
    }
    starts.iter().map(|s| e.convert(s, DType::I64)).collect()
}

/// A window of `sizes` read at clamped start positions: inputs `x, start_0, ..., start_{r-1}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicSlice {
    pub sizes: Vec<usize>,
}
op_attrs!(DynamicSlice = "dynamic_slice" { sizes });

impl OpDef for DynamicSlice {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        let op = "dynamic_slice";
        let Some((x, starts)) = inputs.split_first() else {
            return Err(Error::invalid(
                op,
                "expected an operand and one start index per dimension, got no inputs",
            ));
        };
        let sizes = &self.sizes;
        if sizes.len() != x.ndim() {
            let message = format!(
                "sizes {sizes:?} has {} entries but the operand has shape {}",
                sizes.len(),
                shape_str(x)
            );
            return Err(Error::invalid(op, message));
        }
        check_starts(op, starts, x.ndim(), 1)?;
        if let Some(d) = (0..x.ndim()).find(|&d| x.shape[d] != DYN && sizes[d] > x.shape[d]) {
            let message = format!(
                "sizes {sizes:?} exceed the operand's shape {} in dimension {d}",
                shape_str(x)
            );
            return Err(Error::shape(op, message));
        }
        Ok(smallvec![TensorType::new(x.dtype, sizes)])
    }

    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        let x = &inputs[0];
        if !scalar_indices(&inputs[1..]) {
            return None;
        }
        let window = dest::Window::new(&x.shape, &self.sizes)?;
        crate::with_dtype!(x.dtype, T, {
            Some(Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
                let xs = dest::input::<T>(ins, 0)?;
                let base = window.base(&ins[1..])?;
                let ys = dest::output::<T>(outs, 0)?;
                for (y, &k) in ys.iter_mut().zip(window.offsets()) {
                    *y = xs[base + k as usize];
                }
                Ok(())
            }))
        })
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        let starts = clamped_starts("dynamic_slice", &inputs[1..], x.shape(), &self.sizes)?;
        let out = crate::with_dtype!(x.dtype(), T, {
            owned(x.view::<T>()?.slice_each_axis(|ax| {
                let d = ax.axis.index();
                ndarray::Slice::from(starts[d]..starts[d] + self.sizes[d])
            }))
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::inputs(!0b1)
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (x, out) = (&inputs[0], &outputs[0]);
        if x.ty.ndim() == 0 {
            return Ok(smallvec![x.clone()]);
        }
        let starts = uniform_starts(e, &inputs[1..])?;
        let body = format!(
            "stablehlo.dynamic_slice {x}, {}, sizes = {:?} : ({}, {}) -> {}",
            names_text(&starts),
            self.sizes,
            TypeText(&x.ty),
            types_text(starts.iter().map(|s| &s.ty)),
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
        let mut out: Grads<V> = smallvec![None; saved.input_types.len()];
        let Some(g) = grads[0].as_ref() else {
            return Ok(out);
        };
        if needs[0] {
            let xt = &saved.input_types[0];
            let zeros = build::fill(ctx, xt.dtype, &static_shape("dynamic_slice", xt)?, 0.0)?;
            let starts = saved_starts("dynamic_slice", saved, 1)?;
            out[0] = Some(dynamic_update_slice(ctx, &zeros, g, &starts)?);
        }
        Ok(out)
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        super::index_batching::dynamic_slice(ctx, self, inputs, batched)
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

/// The operand with `update` written at clamped start positions: inputs
/// `operand, update, start_0, ..., start_{r-1}`; `update` has the operand's rank and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicUpdateSlice {}
op_attrs!(DynamicUpdateSlice = "dynamic_update_slice" {});

/// `dynamic_update_slice` for a caller whose output buffer already holds the operand (read for
/// the last time: the executor moved its buffer to the output): the kernel reads the update
/// and the starts (`ins`) and writes the window alone, the same elements as `kernel_into`.
pub(crate) fn update_slice_in_place(inputs: &[TensorType]) -> Option<DestKernel> {
    let [x, u, starts @ ..] = inputs else {
        return None;
    };
    if x.shape.contains(&DYN) || u.shape.contains(&DYN) {
        return None;
    }
    update_kernel(x, u, starts, true)
}

/// `dynamic_update_slice`'s destination kernel: its inputs are (operand, update, starts...),
/// or (update, starts...) `in_place`, where the output already holds the operand.
fn update_kernel(
    x: &TensorType,
    u: &TensorType,
    starts: &[TensorType],
    in_place: bool,
) -> Option<DestKernel> {
    if !scalar_indices(starts) {
        return None;
    }
    let window = dest::Window::new(&x.shape, &u.shape)?;
    let update = usize::from(!in_place);
    crate::with_dtype!(x.dtype, T, {
        Some(Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
            let us = dest::input::<T>(ins, update)?;
            let base = window.base(&ins[update + 1..])?;
            let ys = dest::output::<T>(outs, 0)?;
            if !in_place {
                ys.copy_from_slice(dest::input::<T>(ins, 0)?);
            }
            for (&v, &k) in us.iter().zip(window.offsets()) {
                ys[base + k as usize] = v;
            }
            Ok(())
        }))
    })
}

impl OpDef for DynamicUpdateSlice {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        let op = "dynamic_update_slice";
        let [x, u, starts @ ..] = inputs else {
            let message = format!(
                "expected an operand, an update and one start per dimension, got {} inputs",
                inputs.len()
            );
            return Err(Error::invalid(op, message));
        };
        if u.dtype != x.dtype {
            return Err(Error::dtype(
                op,
                format!("the update is {u} but the operand is {x}: dtypes must match"),
            ));
        }
        let fits = u.ndim() == x.ndim()
            && (0..x.ndim())
                .all(|d| x.shape[d] == DYN || u.shape[d] == DYN || u.shape[d] <= x.shape[d]);
        if !fits {
            let message = format!(
                "an update of shape {} does not fit in an operand of shape {}",
                shape_str(u),
                shape_str(x)
            );
            return Err(Error::shape(op, message));
        }
        check_starts(op, starts, x.ndim(), 2)?;
        Ok(smallvec![x.clone()])
    }

    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        update_kernel(&inputs[0], &inputs[1], &inputs[2..], false)
    }

    /// The window's elements: written in place, a row written each trip of a loop costs the
    /// row, not the buffer (`compute_owned`), so such a loop stays fused.
    fn work(&self, inputs: &[&[usize]], _outputs: &[&[usize]]) -> usize {
        inputs.get(1).map_or(0, |u| u.iter().product())
    }

    /// Writes the window into the operand's buffer when the operand is its only holder (a
    /// loop-carried buffer read for the last time): no copy of the rest.
    fn compute_owned(
        &self,
        inputs: &mut Vec<Tensor>,
        outputs: &[TensorType],
    ) -> Result<Values<Tensor>> {
        let op = "dynamic_update_slice";
        if inputs.len() >= 2 && inputs[0].is_unique() && inputs[0].ty() == &outputs[0] {
            let shape = inputs[0].shape().to_vec();
            let starts = clamped_starts(op, &inputs[2..], &shape, inputs[1].shape())?;
            let update = inputs[1].clone();
            let written = crate::with_dtype!(update.dtype(), T, {
                let u = update.view::<T>()?;
                match inputs[0].unique_slice_mut::<T>() {
                    Some(xs) => {
                        let mut x = ndarray::ArrayViewMut::from_shape(shape.as_slice(), xs)
                            .map_err(|e| Error::internal(op, e.to_string()))?;
                        x.slice_each_axis_mut(|ax| {
                            let d = ax.axis.index();
                            ndarray::Slice::from(starts[d]..starts[d] + u.shape()[d])
                        })
                        .assign(&u);
                        true
                    }
                    None => false,
                }
            });
            if written {
                return Ok(smallvec![inputs.swap_remove(0).renewed()]);
            }
        }
        self.compute(inputs, outputs)
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (x, u) = (&inputs[0], &inputs[1]);
        let starts = clamped_starts("dynamic_update_slice", &inputs[2..], x.shape(), u.shape())?;
        let out = crate::with_dtype!(x.dtype(), T, {
            let mut out = x.view::<T>()?.to_owned();
            out.slice_each_axis_mut(|ax| {
                let d = ax.axis.index();
                ndarray::Slice::from(starts[d]..starts[d] + u.shape()[d])
            })
            .assign(&u.view::<T>()?);
            Tensor::from_array(out)
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::inputs(!0b11)
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (x, u, out) = (&inputs[0], &inputs[1], &outputs[0]);
        if x.ty.ndim() == 0 {
            return Ok(smallvec![e.cast(u, out)]);
        }
        let starts = uniform_starts(e, &inputs[2..])?;
        let body = format!(
            "stablehlo.dynamic_update_slice {x}, {u}, {} : ({}, {}, {}) -> {}",
            names_text(&starts),
            TypeText(&x.ty),
            TypeText(&u.ty),
            types_text(starts.iter().map(|s| &s.ty)),
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
        let mut out: Grads<V> = smallvec![None; saved.input_types.len()];
        let Some(g) = grads[0].as_ref() else {
            return Ok(out);
        };
        if !needs[0] && !needs[1] {
            return Ok(out);
        }
        let starts = saved_starts("dynamic_update_slice", saved, 2)?;
        let ut = &saved.input_types[1];
        let ushape = static_shape("dynamic_update_slice", ut)?;
        if needs[0] {
            let zeros = build::fill(ctx, ut.dtype, &ushape, 0.0)?;
            out[0] = Some(dynamic_update_slice(ctx, g, &zeros, &starts)?);
        }
        if needs[1] {
            out[1] = Some(dynamic_slice(ctx, g, &starts, &ushape)?);
        }
        Ok(out)
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        super::index_batching::dynamic_update_slice(ctx, inputs, batched)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        tangents::linear(ctx, self.clone(), inputs, outputs, tangents, &[0, 1])
    }
}

/// The window of `sizes` of `x` at `starts` (scalar int tensors, clamped to fit).
pub fn dynamic_slice<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    starts: &[V],
    sizes: &[usize],
) -> Result<V> {
    let mut inputs = vec![x.clone()];
    inputs.extend_from_slice(starts);
    build::apply1(
        ctx,
        DynamicSlice {
            sizes: sizes.to_vec(),
        },
        &inputs,
    )
}

/// `x` with `update` written at `starts` (scalar int tensors, clamped to fit).
pub fn dynamic_update_slice<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    update: &V,
    starts: &[V],
) -> Result<V> {
    let mut inputs = vec![x.clone(), update.clone()];
    inputs.extend_from_slice(starts);
    build::apply1(ctx, DynamicUpdateSlice {}, &inputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp, smooth_loss};

    /// Mixed int32 / int64 starts: both are accepted together.
    fn at(a: i32, b: i64) -> Vec<Tensor> {
        vec![Tensor::scalar(a), Tensor::scalar(b)]
    }

    #[test]
    fn dynamic_slice_reads_a_clamped_window() {
        let (cx, x) = (&mut EagerContext, iota(&[4, 5]));
        let y = dynamic_slice(cx, &x, &at(1, 3), &[2, 2]).unwrap();
        assert_eq!(y.to_f64_vec(), [8.0, 9.0, 13.0, 14.0]);
        // (3, -2) is clamped to (4 - 2, 0)
        let y = dynamic_slice(cx, &x, &at(3, -2), &[2, 2]).unwrap();
        assert_eq!(y.to_f64_vec(), [10.0, 11.0, 15.0, 16.0]);
        assert_eq!(
            dynamic_slice(cx, &x, &at(9, 9), &[0, 5]).unwrap().shape(),
            &[0, 5]
        );
        let y = dynamic_slice(cx, &iota(&[0]), &[Tensor::scalar(7i64)], &[0]).unwrap();
        assert_eq!(y.shape(), &[0]);
    }

    #[test]
    fn dynamic_slice_errors_name_the_problem() {
        let (cx, x) = (&mut EagerContext, iota(&[4, 5]));
        let op = "dynamic_slice";
        expect_error(
            dynamic_slice(cx, &x, &at(0, 0), &[5, 1]),
            ErrorKind::Shape,
            op,
            &["[4, 5]", "[5, 1]"],
        );
        expect_error(
            dynamic_slice(cx, &x, &at(0, 0), &[1]),
            ErrorKind::InvalidArgument,
            op,
            &["sizes"],
        );
        let r = dynamic_slice(cx, &x, &at(0, 0)[..1], &[1, 1]);
        expect_error(
            r,
            ErrorKind::InvalidArgument,
            op,
            &["expected 2 start indices", "got 1"],
        );
        let r = dynamic_slice(
            cx,
            &x,
            &[Tensor::scalar(0i32), Tensor::scalar(1.0f32)],
            &[1, 1],
        );
        expect_error(
            r,
            ErrorKind::DType,
            op,
            &["start index 1", "int32 or int64", "float32"],
        );
        let vector = Tensor::from_vec(vec![1i32], &[1]).unwrap();
        let r = dynamic_slice(cx, &x, &[Tensor::scalar(0i32), vector], &[1, 1]);
        expect_error(r, ErrorKind::Shape, op, &["start index 1", "scalar"]);
    }

    #[test]
    fn dynamic_update_slice_writes_a_clamped_window() {
        let cx = &mut EagerContext;
        let x = Tensor::zeros(crate::DType::F64, &[3, 4]);
        let u = Tensor::ones(crate::DType::F64, &[2, 2]);
        let y = dynamic_update_slice(cx, &x, &u, &at(2, 1)).unwrap();
        let want = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        assert_eq!(y.to_f64_vec(), want);
        let empty = Tensor::zeros(crate::DType::F64, &[0, 4]);
        assert_eq!(
            dynamic_update_slice(cx, &x, &empty, &at(5, 5))
                .unwrap()
                .to_f64_vec(),
            [0.0; 12]
        );
        let op = "dynamic_update_slice";
        let ints = Tensor::zeros(crate::DType::I32, &[2, 2]);
        expect_error(
            dynamic_update_slice(cx, &x, &ints, &at(0, 0)),
            ErrorKind::DType,
            op,
            &["int32"],
        );
        let big = Tensor::zeros(crate::DType::F64, &[4, 1]);
        let r = dynamic_update_slice(cx, &x, &big, &at(0, 0));
        expect_error(r, ErrorKind::Shape, op, &["[4, 1]", "[3, 4]"]);
        expect_error(
            dynamic_update_slice(cx, &x, &u, &[]),
            ErrorKind::InvalidArgument,
            op,
            &["start"],
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        check_op_gradients(
            &|ctx, xs| dynamic_slice(ctx, &xs[0], &at(1, 7), &[2, 3]),
            &[ramp(&[4, 5])],
        );
        let both = [ramp(&[3, 4]), ramp(&[2, 2])];
        check_op_gradients(
            &|ctx, xs| dynamic_update_slice(ctx, &xs[0], &xs[1], &at(-1, 2)),
            &both,
        );
        // an operand that only the update reaches
        let update_only = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let zeros = build::zeros_like(ctx, &xs[0])?;
            dynamic_update_slice(ctx, &zeros, &xs[1], &at(0, 1))
        };
        check_op_gradients(&update_only, &both);
    }

    #[test]
    fn gradients_work_beyond_rank_eight() {
        // Every start index must be saved, however many there are.
        let starts: Vec<Tensor> = (0..10).map(|i| Tensor::scalar(i32::from(i == 0))).collect();
        let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let y = dynamic_slice(ctx, &xs[0], &starts, &[1; 10])?;
            smooth_loss(ctx, &y)
        };
        let mut shape = [1usize; 10];
        shape[0] = 2;
        crate::testing::gradcheck::check_gradients(&f, &[ramp(&shape)]);
    }

    #[test]
    fn high_rank_gradients_say_why_they_fail() {
        let starts: Vec<Tensor> = (0..32).map(|_| Tensor::scalar(0i32)).collect();
        let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let y = dynamic_slice(ctx, &xs[0], &starts, &[1; 32])?;
            smooth_loss(ctx, &y)
        };
        let r = crate::testing::gradcheck::tape_gradients(&mut EagerContext, &f, &[ramp(&[1; 32])]);
        expect_error(r, ErrorKind::Gradient, "dynamic_slice", &["rank 32"]);
    }
}
