//! Strided `slice` and zero `pad`: each is the other's gradient. Attributes are absolute and
//! per dimension, with the semantics of `stablehlo.slice` and `stablehlo.pad` (pad value 0, no
//! negative padding), which the MLIR emitter maps them onto. Any dtype (bool pads with false).
//!
//! Negative steps and numpy's wrap-around bounds are resolved by the indexing builder
//! (`indexing::getitem`) into `reverse` + `slice`, so these ops never see them.

use ndarray::{ArrayD, IxDyn};
use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::layout::{owned, static_shape};
use super::rules::shape_str;
use super::{
    build, dest, expect_arity, DestKernel, GatherTable, Grads, OpDef, Saved, Saves, Types, Values,
};
use super::{tangents, Tangents};
use crate::emit::{Emitter, MlirValue, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Elements `start, start + step, ...` below `stop` of each dimension, where
/// `0 <= start <= stop <= dim` and `step >= 1`; output dimension `ceil((stop - start) / step)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub start: Vec<usize>,
    pub stop: Vec<usize>,
    pub step: Vec<usize>,
}
op_attrs!(Slice = "slice" { start, stop, step });

/// Every per-dimension attribute list must have one entry per dimension of `x`.
fn check_lengths(op: &'static str, x: &TensorType, attrs: &[(&str, &[usize])]) -> Result<()> {
    for (name, v) in attrs {
        if v.len() != x.ndim() {
            return Err(Error::invalid(
                op,
                format!(
                    "{name} has {} entries but the input has rank {} (shape {})",
                    v.len(),
                    x.ndim(),
                    shape_str(x)
                ),
            ));
        }
    }
    Ok(())
}

impl Slice {
    fn is_identity(&self, shape: &[usize]) -> bool {
        self.start.iter().all(|&a| a == 0)
            && self.stop.as_slice() == shape
            && self.step.iter().all(|&s| s == 1)
    }
}

impl OpDef for Slice {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("slice", inputs, 1)?;
        let x = &inputs[0];
        check_lengths(
            "slice",
            x,
            &[
                ("start", &self.start),
                ("stop", &self.stop),
                ("step", &self.step),
            ],
        )?;
        let mut shape = Shape::with_capacity(x.ndim());
        for d in 0..x.ndim() {
            let (a, b, s, n) = (self.start[d], self.stop[d], self.step[d], x.shape[d]);
            if s == 0 {
                return Err(Error::invalid(
                    "slice",
                    format!("step must be >= 1, got 0 in dimension {d}"),
                ));
            }
            if a > b || (n != DYN && b > n) {
                let shape = shape_str(x);
                let message = format!(
                    "dimension {d} of shape {shape}: need 0 <= start <= stop <= {n}, \
                     got start {a}, stop {b}"
                );
                return Err(Error::index("slice", message));
            }
            shape.push((b - a).div_ceil(s));
        }
        Ok(smallvec![TensorType::new(x.dtype, &shape)])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        let table = self.gather_table(inputs, &outputs[0])?;
        Some(dest::gather_kernel(inputs[0].dtype, table))
    }

    fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
        let (x, out) = (&inputs[0].shape, &output.shape);
        dest::table_fits(1, &[x, out]).then(|| dest::slice_table(x, &self.start, &self.step, out))
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if self.is_identity(x.shape()) {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            owned(x.view::<T>()?.slice_each_axis(|ax| {
                let d = ax.axis.index();
                ndarray::Slice::new(
                    self.start[d] as isize,
                    Some(self.stop[d] as isize),
                    self.step[d] as isize,
                )
            }))
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (x, out) = (&inputs[0], &outputs[0]);
        if self.stop.contains(&DYN) {
            return Err(e.unsupported(format!(
                "a slice with unknown stop {} has no StableHLO form",
                ShapeDisplay(&self.stop)
            )));
        }
        if x.ty.shape.as_slice() == self.stop.as_slice() && self.is_identity(&self.stop) {
            return Ok(smallvec![x.clone()]);
        }
        let ranges: Vec<String> = (0..x.ty.ndim())
            .map(|d| match self.step[d] {
                1 => format!("{}:{}", self.start[d], self.stop[d]),
                s => format!("{}:{}:{s}", self.start[d], self.stop[d]),
            })
            .collect();
        let body = format!(
            "stablehlo.slice {x} [{}] : ({}) -> {}",
            ranges.join(", "),
            TypeText(&x.ty),
            TypeText(out)
        );
        Ok(smallvec![e.op(&body, out)])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None]);
        };
        let dims = static_shape("slice", &saved.input_types[0])?;
        let out = &saved.output_types[0].shape;
        let interior: Vec<usize> = self.step.iter().map(|&s| s - 1).collect();
        // Zeros after the last element taken; an empty slice pads all of the dimension.
        let high: Vec<usize> = (0..dims.len())
            .map(|d| match out[d] {
                0 => dims[d] - self.start[d],
                k => dims[d] - (self.start[d] + (k - 1) * self.step[d] + 1),
            })
            .collect();
        Ok(smallvec![Some(pad(ctx, g, &self.start, &high, &interior)?)])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let lanes = inputs[0].ty().shape[0];
        let op = Slice {
            start: std::iter::once(0)
                .chain(self.start.iter().copied())
                .collect(),
            stop: std::iter::once(lanes)
                .chain(self.stop.iter().copied())
                .collect(),
            step: std::iter::once(1)
                .chain(self.step.iter().copied())
                .collect(),
        };
        batching::pointwise(ctx, op, inputs)
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

/// Zero padding: `low[d]` zeros before, `high[d]` after, `interior[d]` between neighbours, so
/// dimension `n` becomes `low + n + max(n - 1, 0) * interior + high`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pad {
    pub low: Vec<usize>,
    pub high: Vec<usize>,
    pub interior: Vec<usize>,
}
op_attrs!(Pad = "pad" { low, high, interior });

impl Pad {
    /// Extent the input's elements occupy in dimension `d` of the output (after `low`).
    fn span(&self, d: usize, n: usize) -> Option<usize> {
        match n {
            0 => Some(0),
            n => (n - 1).checked_mul(self.interior[d] + 1)?.checked_add(1),
        }
    }
}

impl OpDef for Pad {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("pad", inputs, 1)?;
        let x = &inputs[0];
        check_lengths(
            "pad",
            x,
            &[
                ("low", &self.low),
                ("high", &self.high),
                ("interior", &self.interior),
            ],
        )?;
        let mut shape = Shape::with_capacity(x.ndim());
        for d in 0..x.ndim() {
            let n = x.shape[d];
            let size = if n == DYN {
                Some(DYN)
            } else {
                self.span(d, n)
                    .and_then(|s| s.checked_add(self.low[d])?.checked_add(self.high[d]))
            };
            let size = size.ok_or_else(|| {
                Error::invalid(
                    "pad",
                    format!("padding dimension {d} of shape {} overflows", shape_str(x)),
                )
            })?;
            shape.push(size);
        }
        Ok(smallvec![TensorType::new(x.dtype, &shape)])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        let table = self.gather_table(inputs, &outputs[0])?;
        Some(dest::gather_kernel(inputs[0].dtype, table))
    }

    fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
        let (x, out) = (&inputs[0].shape, &output.shape);
        dest::table_fits(1, &[x, out]).then(|| dest::pad_table(x, &self.low, &self.interior, out))
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if outputs[0].shape.as_slice() == x.shape() {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            let mut out = ArrayD::<T>::default(IxDyn(&outputs[0].shape));
            out.slice_each_axis_mut(|ax| {
                let d = ax.axis.index();
                let span = self.span(d, x.shape()[d]).unwrap_or(0);
                ndarray::Slice::new(
                    self.low[d] as isize,
                    Some((self.low[d] + span) as isize),
                    (self.interior[d] + 1) as isize,
                )
            })
            .assign(&x.view::<T>()?);
            Tensor::from_array(out)
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let (x, out) = (&inputs[0], &outputs[0]);
        let pads = [&self.low, &self.high, &self.interior];
        if pads.iter().all(|p| p.iter().all(|&n| n == 0)) {
            return Ok(smallvec![x.clone()]);
        }
        let zero = e.scalar(x.ty.dtype, 0.0);
        let body = format!(
            "stablehlo.pad {x}, {zero}, low = {:?}, high = {:?}, interior = {:?} : ({}, {}) -> {}",
            self.low,
            self.high,
            self.interior,
            TypeText(&x.ty),
            TypeText(&zero.ty),
            TypeText(out)
        );
        Ok(smallvec![e.op(&body, out)])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None]);
        };
        let dims = static_shape("pad", &saved.input_types[0])?;
        let stop: Vec<usize> = (0..dims.len())
            .map(|d| self.low[d] + self.span(d, dims[d]).unwrap_or(0))
            .collect();
        let step: Vec<usize> = self.interior.iter().map(|&i| i + 1).collect();
        Ok(smallvec![Some(slice(ctx, g, &self.low, &stop, &step)?)])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let op = Pad {
            low: std::iter::once(0).chain(self.low.iter().copied()).collect(),
            high: std::iter::once(0)
                .chain(self.high.iter().copied())
                .collect(),
            interior: std::iter::once(0)
                .chain(self.interior.iter().copied())
                .collect(),
        };
        batching::pointwise(ctx, op, inputs)
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

/// `x[start:stop:step]` per dimension (absolute bounds, positive steps).
pub fn slice<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    start: &[usize],
    stop: &[usize],
    step: &[usize],
) -> Result<V> {
    build::apply1(
        ctx,
        Slice {
            start: start.to_vec(),
            stop: stop.to_vec(),
            step: step.to_vec(),
        },
        std::slice::from_ref(x),
    )
}

/// Zero padding (`low`, `high`, `interior` per dimension).
pub fn pad<V: Value>(
    ctx: &mut dyn Context<V>,
    x: &V,
    low: &[usize],
    high: &[usize],
    interior: &[usize],
) -> Result<V> {
    build::apply1(
        ctx,
        Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        },
        std::slice::from_ref(x),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};
    use crate::ErrorKind;

    #[test]
    fn slice_takes_strided_windows() {
        let (cx, x) = (&mut EagerContext, iota(&[3, 5]));
        let y = slice(cx, &x, &[1, 0], &[3, 5], &[1, 2]).unwrap();
        assert_eq!(
            (y.shape(), y.to_f64_vec()),
            (&[2, 3][..], vec![5.0, 7.0, 9.0, 10.0, 12.0, 14.0])
        );
        // stop need not be aligned with the step: ceil((4 - 1) / 2) = 2 elements
        assert_eq!(
            slice(cx, &iota(&[5]), &[1], &[4], &[2])
                .unwrap()
                .to_f64_vec(),
            [1.0, 3.0]
        );
        assert_eq!(
            slice(cx, &x, &[2, 5], &[2, 5], &[1, 3]).unwrap().shape(),
            &[0, 0]
        );
        assert_eq!(
            slice(cx, &iota(&[0, 2]), &[0, 1], &[0, 2], &[1, 1])
                .unwrap()
                .shape(),
            &[0, 1]
        );
        let b = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
        assert_eq!(
            slice(cx, &b, &[0], &[3], &[2]).unwrap().to_f64_vec(),
            [1.0, 1.0]
        );
    }

    #[test]
    fn slice_rejects_bad_bounds() {
        let (cx, x) = (&mut EagerContext, iota(&[3, 5]));
        let r = slice(cx, &x, &[0, 0], &[4, 5], &[1, 1]);
        expect_error(r, ErrorKind::Index, "slice", &["stop 4", "<= 3", "[3, 5]"]);
        expect_error(
            slice(cx, &x, &[2, 0], &[1, 5], &[1, 1]),
            ErrorKind::Index,
            "slice",
            &["start 2"],
        );
        let r = slice(cx, &x, &[0, 0], &[3, 5], &[1, 0]);
        expect_error(
            r,
            ErrorKind::InvalidArgument,
            "slice",
            &["step", "dimension 1"],
        );
        let r = slice(cx, &x, &[0], &[3], &[1]);
        expect_error(
            r,
            ErrorKind::InvalidArgument,
            "slice",
            &["start has 1", "[3, 5]"],
        );
    }

    #[test]
    fn pad_inserts_zeros() {
        let cx = &mut EagerContext;
        let y = pad(cx, &iota(&[3]), &[1], &[2], &[1]).unwrap();
        assert_eq!(y.to_f64_vec(), [0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0]);
        let y = pad(cx, &iota(&[2, 2]), &[0, 1], &[1, 0], &[0, 2]).unwrap();
        let want = [
            0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        assert_eq!(
            (y.shape(), y.to_f64_vec().as_slice()),
            (&[3, 5][..], &want[..])
        );
        assert_eq!(
            pad(cx, &iota(&[0]), &[2], &[1], &[5]).unwrap().to_f64_vec(),
            [0.0; 3]
        );
        let b = Tensor::from_vec(vec![true], &[1]).unwrap();
        assert_eq!(
            pad(cx, &b, &[1], &[0], &[0]).unwrap().to_f64_vec(),
            [0.0, 1.0]
        );
        let r = pad(cx, &iota(&[2]), &[0, 0], &[0], &[0]);
        expect_error(r, ErrorKind::InvalidArgument, "pad", &["low has 2", "[2]"]);
        let r = pad(cx, &iota(&[2]), &[usize::MAX], &[1], &[0]);
        expect_error(r, ErrorKind::InvalidArgument, "pad", &["overflows"]);
    }

    #[test]
    fn gradients_match_finite_differences() {
        check_op_gradients(
            &|ctx, xs| slice(ctx, &xs[0], &[1, 0], &[3, 5], &[1, 2]),
            &[ramp(&[3, 5])],
        );
        check_op_gradients(
            &|ctx, xs| slice(ctx, &xs[0], &[0, 1], &[4, 4], &[3, 2]),
            &[ramp(&[4, 5])],
        );
        check_op_gradients(
            &|ctx, xs| slice(ctx, &xs[0], &[2, 0], &[2, 5], &[1, 1]),
            &[ramp(&[3, 5])],
        );
        check_op_gradients(
            &|ctx, xs| pad(ctx, &xs[0], &[1, 0], &[0, 2], &[2, 1]),
            &[ramp(&[2, 3])],
        );
        check_op_gradients(&|ctx, xs| pad(ctx, &xs[0], &[1], &[2], &[1]), &[ramp(&[0])]);
    }
}
