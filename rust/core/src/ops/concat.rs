//! `concatenate` (n >= 1 inputs of one dtype, joined along one axis) and the `stack` builder.
//! Any dtype. Gradient: g sliced apart at the inputs' offsets. MLIR: `stablehlo.concatenate`.

use ndarray::Axis;
use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::layout::{expand_dims, static_shape};
use super::rules::shape_str;
use super::slicing::slice;
use super::{build, dest, DestKernel, GatherTable, Grads, OpDef, Saved, Saves, Types, Values};
use super::{tangents, Tangents};
use crate::emit::{names_text, types_text, Emitter, MlirValue, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Joins `n >= 1` tensors of one dtype along `axis`; all other dimensions must agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concatenate {
    pub axis: usize,
}
op_attrs!(Concatenate = "concatenate" { axis });

impl OpDef for Concatenate {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        let Some(first) = inputs.first() else {
            return Err(Error::invalid(
                "concatenate",
                "expected at least one input, got none",
            ));
        };
        let axis = self.axis;
        if axis >= first.ndim() {
            return Err(Error::index(
                "concatenate",
                format!(
                    "axis {axis} is out of bounds for input 0 of shape {}",
                    shape_str(first)
                ),
            ));
        }
        let mut shape = first.shape.clone();
        for (i, t) in inputs.iter().enumerate().skip(1) {
            if t.dtype != first.dtype {
                return Err(Error::dtype(
                    "concatenate",
                    format!(
                        "input {i} is {t} but input 0 is {first}: all inputs must share a dtype"
                    ),
                ));
            }
            let fits = t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| {
                    d == axis || t.shape[d] == shape[d] || t.shape[d] == DYN || shape[d] == DYN
                });
            if !fits {
                let (got, want) = (shape_str(t), shape_str(first));
                let message = format!(
                    "input {i} has shape {got} but input 0 has shape {want}: \
                     all dimensions except axis {axis} must match"
                );
                return Err(Error::shape("concatenate", message));
            }
            for d in 0..t.ndim() {
                shape[d] = match (d == axis, shape[d], t.shape[d]) {
                    (true, DYN, _) | (true, _, DYN) => DYN,
                    (true, a, b) => a + b,
                    (false, DYN, b) => b,
                    (false, a, _) => a,
                };
            }
        }
        Ok(smallvec![TensorType::new(first.dtype, &shape)])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        let table = self.gather_table(inputs, &outputs[0])?;
        Some(dest::gather_kernel(outputs[0].dtype, table))
    }

    fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.shape[..]).collect();
        let out = &output.shape;
        let all = [&shapes[..], &[out]].concat();
        dest::table_fits(inputs.len(), &all).then(|| dest::concat_table(&shapes, self.axis, out))
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        if inputs.len() == 1 {
            return Ok(smallvec![inputs[0].with_new_id()]);
        }
        let out = crate::with_dtype!(inputs[0].dtype(), T, {
            let views = inputs
                .iter()
                .map(|t| t.view::<T>())
                .collect::<Result<Vec<_>>>()?;
            let joined = ndarray::concatenate(Axis(self.axis), &views)
                .map_err(|e| Error::internal("concatenate", e.to_string()))?;
            Tensor::from_array(joined)
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
        if let [x] = inputs {
            return Ok(smallvec![x.clone()]);
        }
        let out = &outputs[0];
        let body = format!(
            "stablehlo.concatenate {}, dim = {} : ({}) -> {}",
            names_text(inputs),
            self.axis,
            types_text(inputs.iter().map(|v| &v.ty)),
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
        let n = saved.input_types.len();
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None; n]);
        };
        if n == 1 {
            return Ok(smallvec![Some(g.clone())]);
        }
        let out_shape = static_shape("concatenate", &saved.output_types[0])?;
        let mut start = vec![0; out_shape.len()];
        let mut stop = out_shape.to_vec();
        let step = vec![1; out_shape.len()];
        let mut out = Grads::with_capacity(n);
        for (i, t) in saved.input_types.iter().enumerate() {
            stop[self.axis] = start[self.axis] + t.shape[self.axis];
            out.push(if needs[i] {
                Some(slice(ctx, g, &start, &stop, &step)?)
            } else {
                None
            });
            start[self.axis] = stop[self.axis];
        }
        Ok(out)
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        let op = Concatenate {
            axis: self.axis + 1,
        };
        batching::pointwise(ctx, op, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let all: Vec<usize> = (0..inputs.len()).collect();
        tangents::linear(ctx, self.clone(), inputs, outputs, tangents, &all)
    }
}

/// Joins `xs` (at least one) along `axis`.
pub fn concatenate<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    build::apply1(ctx, Concatenate { axis }, xs)
}

pub fn stack<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    if let Some(first) = xs.first() {
        let want = first.ty();
        if let Some((i, bad)) = xs.iter().enumerate().find(|(_, x)| x.ty() != want) {
            return Err(Error::shape(
                "stack",
                format!("all inputs must have the same shape and dtype: input 0 is {want} but input {i} is {}", bad.ty()),
            ));
        }
    }
    let expanded: Vec<V> = xs
        .iter()
        .map(|x| expand_dims(ctx, x, axis))
        .collect::<Result<_>>()?;
    concatenate(ctx, &expanded, axis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};
    use crate::ErrorKind;

    #[test]
    fn concatenate_joins_along_an_axis() {
        let (cx, a, b) = (&mut EagerContext, iota(&[2, 1]), iota(&[2, 2]));
        let y = concatenate(cx, &[a.clone(), b.clone(), iota(&[2, 0])], 1).unwrap();
        assert_eq!(
            (y.shape(), y.to_f64_vec()),
            (&[2, 3][..], vec![0.0, 0.0, 1.0, 1.0, 2.0, 3.0])
        );
        assert_eq!(
            concatenate(cx, std::slice::from_ref(&a), 0)
                .unwrap()
                .to_f64_vec(),
            [0.0, 1.0]
        );
        let bools = Tensor::from_vec(vec![true, false], &[1, 2]).unwrap();
        let y = concatenate(cx, &[bools.clone(), bools], 0).unwrap();
        assert_eq!(y.to_f64_vec(), [1.0, 0.0, 1.0, 0.0]);
        let y = stack(cx, &[a.clone(), a.clone()], 2).unwrap();
        assert_eq!(
            (y.shape(), y.to_f64_vec()),
            (&[2, 1, 2][..], vec![0.0, 0.0, 1.0, 1.0])
        );
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let (cx, a, b) = (&mut EagerContext, iota(&[2, 1]), iota(&[2, 2]));
        let needles = ["[2, 2]", "[2, 1]", "axis 0"];
        expect_error(
            concatenate(cx, &[a.clone(), b], 0),
            ErrorKind::Shape,
            "concatenate",
            &needles,
        );
        let ints = Tensor::from_vec(vec![1i64, 2], &[2, 1]).unwrap();
        let r = concatenate(cx, &[a.clone(), ints], 1);
        expect_error(r, ErrorKind::DType, "concatenate", &["int64", "float64"]);
        expect_error(
            concatenate(cx, std::slice::from_ref(&a), 2),
            ErrorKind::Index,
            "concatenate",
            &["axis 2"],
        );
        let r = concatenate::<Tensor>(cx, &[], 0);
        expect_error(
            r,
            ErrorKind::InvalidArgument,
            "concatenate",
            &["at least one"],
        );
        expect_error(
            stack(cx, &[a, iota(&[3])], 0),
            ErrorKind::Shape,
            "stack",
            &[],
        );
    }

    #[test]
    fn unknown_dims_are_tolerated() {
        let c = Concatenate { axis: 0 };
        let ty = |s: &[usize]| TensorType::new(crate::DType::F32, s);
        assert_eq!(
            c.infer(&[ty(&[2, DYN]), ty(&[3, 4])]).unwrap()[0]
                .shape
                .as_slice(),
            &[5, 4]
        );
        assert_eq!(
            c.infer(&[ty(&[DYN, 4]), ty(&[3, 4])]).unwrap()[0]
                .shape
                .as_slice(),
            &[DYN, 4]
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        let inputs = [ramp(&[2, 1]), ramp(&[2, 3]), ramp(&[2, 0])];
        check_op_gradients(&|ctx, xs| concatenate(ctx, xs, 1), &inputs);
        let twice = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            concatenate(ctx, &[xs[0].clone(), xs[0].clone()], 0)
        };
        check_op_gradients(&twice, &[ramp(&[3])]);
        check_op_gradients(&|ctx, xs| stack(ctx, xs, 1), &[ramp(&[2]), ramp(&[2])]);
    }
}
