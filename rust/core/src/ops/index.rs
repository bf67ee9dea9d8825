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

use smallvec::smallvec;

pub use super::gather::{scatter_add, take, ScatterAdd, Take};
use super::layout::{owned, static_shape};
use super::rules::shape_str;
use super::{build, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Checks that `starts` are one scalar int32/int64 tensor per dimension of a rank-`rank`
/// operand; `first` is the input position of the first start (for messages).
fn check_starts(op: &'static str, starts: &[TensorType], rank: usize, first: usize) -> Result<()> {
    if starts.len() != rank {
        return Err(Error::invalid(
            op,
            format!(
                "expected {rank} start indices (one per dimension of the operand), got {}",
                starts.len()
            ),
        ));
    }
    for (i, s) in starts.iter().enumerate() {
        if !s.dtype.is_int() {
            return Err(Error::dtype(
                op,
                format!(
                    "start index {i} (input {}) must be int32 or int64, got {s}",
                    first + i
                ),
            ));
        }
        if !s.is_scalar() {
            return Err(Error::shape(
                op,
                format!(
                    "start index {i} (input {}) must be a scalar, got {s}",
                    first + i
                ),
            ));
        }
    }
    Ok(())
}

/// The single value of an integer tensor.
pub(crate) fn int_scalar(op: &'static str, t: &Tensor) -> Result<i64> {
    let v = match t.dtype() {
        DType::I32 => t.as_slice::<i32>()?.first().map(|&v| i64::from(v)),
        DType::I64 => t.as_slice::<i64>()?.first().copied(),
        other => {
            return Err(Error::internal(
                op,
                format!("index of dtype {other} reached the kernel"),
            ))
        }
    };
    v.ok_or_else(|| Error::internal(op, "empty index tensor reached the kernel"))
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
    // `Saves` masks hold 8 inputs; the starts of higher-rank operands are not kept.
    if saved.input_types.len() > 8 {
        let rank = saved.input_types.len() - first;
        return Err(Error::gradient(
            op,
            format!(
                "gradients of {op} support operands of rank <= {}, got rank {rank}",
                8 - first
            ),
        ));
    }
    (first..saved.input_types.len())
        .map(|i| saved.input(i).cloned())
        .collect()
}

/// A window of `sizes` read at clamped start positions: inputs `x, start_0, ..., start_{r-1}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicSlice {
    pub sizes: Vec<usize>,
}

impl OpDef for DynamicSlice {
    fn name(&self) -> &'static str {
        "dynamic_slice"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        let Some((x, starts)) = inputs.split_first() else {
            return Err(Error::invalid(
                "dynamic_slice",
                "expected an operand and one start index per dimension, got no inputs",
            ));
        };
        if self.sizes.len() != x.ndim() {
            return Err(Error::invalid(
                "dynamic_slice",
                format!(
                    "sizes {:?} has {} entries but the operand has shape {}",
                    self.sizes,
                    self.sizes.len(),
                    shape_str(x)
                ),
            ));
        }
        check_starts("dynamic_slice", starts, x.ndim(), 1)?;
        if let Some(d) = (0..x.ndim()).find(|&d| x.shape[d] != DYN && self.sizes[d] > x.shape[d]) {
            return Err(Error::shape(
                "dynamic_slice",
                format!(
                    "sizes {:?} exceed the operand's shape {} in dimension {d}",
                    self.sizes,
                    shape_str(x)
                ),
            ));
        }
        Ok(smallvec![TensorType::new(x.dtype, &self.sizes)])
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
        Saves::inputs(0xfe)
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
}

/// The operand with `update` written at clamped start positions: inputs
/// `operand, update, start_0, ..., start_{r-1}`; `update` has the operand's rank and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicUpdateSlice {}

impl OpDef for DynamicUpdateSlice {
    fn name(&self) -> &'static str {
        "dynamic_update_slice"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        let [x, u, starts @ ..] = inputs else {
            return Err(Error::invalid(
                "dynamic_update_slice",
                format!("expected an operand, an update and one start index per dimension, got {} inputs", inputs.len()),
            ));
        };
        if u.dtype != x.dtype {
            return Err(Error::dtype(
                "dynamic_update_slice",
                format!("the update is {u} but the operand is {x}: dtypes must match"),
            ));
        }
        let fits = u.ndim() == x.ndim()
            && (0..x.ndim())
                .all(|d| x.shape[d] == DYN || u.shape[d] == DYN || u.shape[d] <= x.shape[d]);
        if !fits {
            return Err(Error::shape(
                "dynamic_update_slice",
                format!(
                    "an update of shape {} does not fit in an operand of shape {}",
                    shape_str(u),
                    shape_str(x)
                ),
            ));
        }
        check_starts("dynamic_update_slice", starts, x.ndim(), 2)?;
        Ok(smallvec![x.clone()])
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
        Saves::inputs(0xfc)
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
    use crate::context::EagerContext;
    use crate::ops::gradcheck::{check_op_gradients, ramp};
    use crate::ErrorKind;

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|v| v as f64).collect::<Vec<_>>(), shape).unwrap()
    }

    fn check_err(r: Result<Tensor>, kind: ErrorKind, op: &str, needle: &str) {
        let err = r.unwrap_err();
        assert_eq!(err.kind, kind, "{err}");
        assert!(
            err.to_string().starts_with(&format!("{op}:")) && err.to_string().contains(needle),
            "{err}"
        );
    }

    fn starts(a: i32, b: i64) -> Vec<Tensor> {
        vec![Tensor::scalar(a), Tensor::scalar(b)]
    }

    #[test]
    fn dynamic_slice_reads_a_clamped_window() {
        let x = iota(&[4, 5]);
        let y = dynamic_slice(&mut EagerContext, &x, &starts(1, 3), &[2, 2]).unwrap();
        assert_eq!(y.to_f64_vec(), vec![8.0, 9.0, 13.0, 14.0]);
        // (3, -2) is clamped to (4 - 2, 0)
        let y = dynamic_slice(&mut EagerContext, &x, &starts(3, -2), &[2, 2]).unwrap();
        assert_eq!(y.to_f64_vec(), vec![10.0, 11.0, 15.0, 16.0]);
        let y = dynamic_slice(&mut EagerContext, &x, &starts(9, 9), &[0, 5]).unwrap();
        assert_eq!(y.shape(), &[0, 5]);
        let s = Tensor::scalar(7i64);
        assert_eq!(
            dynamic_slice(&mut EagerContext, &iota(&[0]), &[s], &[0])
                .unwrap()
                .shape(),
            &[0]
        );
    }

    #[test]
    fn dynamic_slice_errors_name_the_problem() {
        let x = iota(&[4, 5]);
        check_err(
            dynamic_slice(&mut EagerContext, &x, &starts(0, 0), &[5, 1]),
            ErrorKind::Shape,
            "dynamic_slice",
            "[4, 5]",
        );
        check_err(
            dynamic_slice(&mut EagerContext, &x, &starts(0, 0), &[1]),
            ErrorKind::InvalidArgument,
            "dynamic_slice",
            "sizes",
        );
        check_err(
            dynamic_slice(&mut EagerContext, &x, &starts(0, 0)[..1], &[1, 1]),
            ErrorKind::InvalidArgument,
            "dynamic_slice",
            "2 start",
        );
        let bad = [Tensor::scalar(0i32), Tensor::scalar(1.0f32)];
        check_err(
            dynamic_slice(&mut EagerContext, &x, &bad, &[1, 1]),
            ErrorKind::DType,
            "dynamic_slice",
            "float32",
        );
        let bad = [
            Tensor::scalar(0i32),
            Tensor::from_vec(vec![1i32], &[1]).unwrap(),
        ];
        check_err(
            dynamic_slice(&mut EagerContext, &x, &bad, &[1, 1]),
            ErrorKind::Shape,
            "dynamic_slice",
            "scalar",
        );
    }

    #[test]
    fn dynamic_update_slice_writes_a_clamped_window() {
        let x = Tensor::zeros(crate::DType::F64, &[3, 4]);
        let u = Tensor::ones(crate::DType::F64, &[2, 2]);
        let y = dynamic_update_slice(&mut EagerContext, &x, &u, &starts(2, 1)).unwrap();
        let want = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        assert_eq!(y.to_f64_vec(), want);
        let e = Tensor::zeros(crate::DType::F64, &[0, 4]);
        assert_eq!(
            dynamic_update_slice(&mut EagerContext, &x, &e, &starts(5, 5))
                .unwrap()
                .to_f64_vec(),
            vec![0.0; 12]
        );
        let ints = Tensor::zeros(crate::DType::I32, &[2, 2]);
        check_err(
            dynamic_update_slice(&mut EagerContext, &x, &ints, &starts(0, 0)),
            ErrorKind::DType,
            "dynamic_update_slice",
            "int32",
        );
        let big = Tensor::zeros(crate::DType::F64, &[4, 1]);
        check_err(
            dynamic_update_slice(&mut EagerContext, &x, &big, &starts(0, 0)),
            ErrorKind::Shape,
            "dynamic_update_slice",
            "[4, 1]",
        );
        check_err(
            dynamic_update_slice(&mut EagerContext, &x, &u, &[]),
            ErrorKind::InvalidArgument,
            "dynamic_update_slice",
            "start",
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        check_op_gradients(
            &|ctx, xs| dynamic_slice(ctx, &xs[0], &starts(1, 7), &[2, 3]),
            &[ramp(&[4, 5])],
        );
        check_op_gradients(
            &|ctx, xs| dynamic_update_slice(ctx, &xs[0], &xs[1], &starts(-1, 2)),
            &[ramp(&[3, 4]), ramp(&[2, 2])],
        );
        // an operand that only the update reaches, and the reverse
        check_op_gradients(
            &|ctx, xs| {
                let zeros = build::zeros_like(ctx, &xs[0])?;
                dynamic_update_slice(ctx, &zeros, &xs[1], &starts(0, 1))
            },
            &[ramp(&[3, 4]), ramp(&[2, 2])],
        );
    }

    #[test]
    fn high_rank_gradients_say_why_they_fail() {
        let x = ramp(&[1; 8]);
        let s: Vec<Tensor> = (0..8).map(|_| Tensor::scalar(0i32)).collect();
        let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let y = dynamic_slice(ctx, &xs[0], &s, &[1; 8])?;
            crate::ops::gradcheck::smooth_loss(ctx, &y)
        };
        let err = crate::ops::gradcheck::tape_gradients(&mut EagerContext, &f, &[x]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Gradient, "{err}");
        assert!(
            err.to_string().starts_with("dynamic_slice:") && err.to_string().contains("rank 8"),
            "{err}"
        );
    }
}
