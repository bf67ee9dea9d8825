//! Ops that create values or change only their dtype or identity: `fill`, `arange`, `cast`,
//! `stop_gradient`.
//!
//! Gradients: fill and arange have no inputs; cast's gradient casts back (float to float only);
//! stop_gradient has none, by definition.
//!
//! MLIR: fill is a splat `stablehlo.constant` (fill_like broadcasts a scalar constant to its
//! input's run-time shape when that has unknown dimensions); arange is `stablehlo.iota`, scaled
//! and shifted; cast is `stablehlo.convert` (to bool: `!= 0`); stop_gradient and identity emit
//! nothing (their value is their input's).

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::rules::{check_dtype, Accepts};
use super::{
    build, dest, expect_arity, kernels, DestKernel, Grads, OpDef, Saved, Saves, Types, Values,
};
use super::{tangents, Tangents};
use crate::dtype::{DType, Element};
use crate::emit::{Emitter, MlirValue, ScalarForm, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{Shape, TensorType};
use crate::tensor::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;

/// A tensor of `shape` filled with `value` (converted to `dtype`). MLIR: a splat constant.
#[derive(Clone, Debug, PartialEq)]
pub struct Fill {
    pub dtype: DType,
    pub shape: Shape,
    pub value: f64,
}
op_attrs!(Fill = "fill" { dtype, shape, value });

impl OpDef for Fill {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("fill", inputs, 0)?;
        Ok(smallvec![TensorType::new(self.dtype, &self.shape)])
    }

    fn compute(&self, _inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        Ok(smallvec![Tensor::filled(
            self.dtype,
            &self.shape,
            self.value
        )])
    }

    fn kernel_into(&self, _inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        Some(dest::fill_to(&outputs[0], self.value))
    }

    fn saves(&self) -> Saves {
        Saves::NotDifferentiable("fill has no inputs")
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![e.splat(self.dtype, &self.shape, self.value)?])
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(Grads::new())
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = (ctx, inputs, batched);
        batching::no_inputs("fill")
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let _ = (ctx, inputs, tangents);
        tangents::none(outputs)
    }
}

/// A tensor of `shape`, every element `value`.
pub fn fill<V: Value>(
    ctx: &mut dyn Context<V>,
    dtype: DType,
    shape: &[usize],
    value: f64,
) -> Result<V> {
    build::apply1(
        ctx,
        Fill {
            dtype,
            shape: shape.into(),
            value,
        },
        &[],
    )
}

/// A tensor of the input's dtype and (run-time) shape, every element `value`: `fill` for
/// shapes only known when the graph runs (loop-carried values with unknown dimensions).
#[derive(Clone, Debug, PartialEq)]
pub struct FillLike {
    pub value: f64,
}
op_attrs!(FillLike = "fill_like" { value });

impl OpDef for FillLike {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        same_type("fill_like", inputs)
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        Ok(smallvec![Tensor::filled(x.dtype(), x.shape(), self.value)])
    }

    fn kernel_into(&self, _inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        Some(dest::fill_to(&outputs[0], self.value))
    }

    fn saves(&self) -> Saves {
        Saves::NotDifferentiable("fill_like depends on its input's shape only")
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![e.splat_like(&inputs[0], self.value)?])
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(smallvec![None])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        batching::pointwise(ctx, self.clone(), inputs)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let _ = (ctx, inputs, tangents);
        tangents::none(outputs)
    }
}

/// A tensor shaped like `like`, every element `value` (a constant when the shape is static).
pub fn fill_like<V: Value>(ctx: &mut dyn Context<V>, like: &V, value: f64) -> Result<V> {
    let ty = like.ty().clone();
    if ty.shape.contains(&crate::shape::DYN) {
        return build::apply1(ctx, FillLike { value }, std::slice::from_ref(like));
    }
    fill(ctx, ty.dtype, &ty.shape, value)
}

pub fn zeros_like<V: Value>(ctx: &mut dyn Context<V>, like: &V) -> Result<V> {
    fill_like(ctx, like, 0.0)
}

pub fn ones_like<V: Value>(ctx: &mut dyn Context<V>, like: &V) -> Result<V> {
    fill_like(ctx, like, 1.0)
}

/// `start, start + step, ...` (`len` values). MLIR: iota, scaled and shifted.
#[derive(Clone, Debug, PartialEq)]
pub struct Arange {
    pub dtype: DType,
    pub start: f64,
    pub step: f64,
    pub len: usize,
}
op_attrs!(Arange = "arange" { dtype, start, step, len });

impl OpDef for Arange {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("arange", inputs, 0)?;
        check_dtype("arange", Accepts::Numeric, &TensorType::scalar(self.dtype))?;
        Ok(smallvec![TensorType::new(self.dtype, &[self.len])])
    }

    fn compute(&self, _inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let out = crate::with_dtype!(self.dtype, T, {
            let data: Vec<T> = (0..self.len)
                .map(|i| T::from_f64(self.start + self.step * i as f64))
                .collect();
            Tensor::from_vec(data, &[self.len])?
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NotDifferentiable("arange has no inputs")
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![self.emit_iota(e, &outputs[0])?])
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(Grads::new())
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = (ctx, inputs, batched);
        batching::no_inputs("arange")
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let _ = (ctx, inputs, tangents);
        tangents::none(outputs)
    }
}

impl Arange {
    /// `start + step * iota`, computed in the result's dtype when that is exact (integer
    /// start and step), else in float64 and converted (an integer arange with a fractional
    /// step truncates each element, as the kernel does).
    fn emit_iota(&self, e: &mut Emitter, out: &TensorType) -> Result<MlirValue> {
        let integral = |v: f64| v.fract() == 0.0 && v.abs() < 2f64.powi(31);
        let work = if self.dtype.is_int() && !(integral(self.start) && integral(self.step)) {
            DType::F64
        } else {
            self.dtype
        };
        let ty = out.with_dtype(work);
        let mut v = e.op(&format!("stablehlo.iota dim = 0 : {}", TypeText(&ty)), &ty);
        if self.step != 1.0 {
            let step = e.splat(work, &ty.shape, self.step)?;
            v = e.elementwise("stablehlo.multiply", &[&v, &step], &ty);
        }
        if self.start != 0.0 {
            let start = e.splat(work, &ty.shape, self.start)?;
            v = e.elementwise("stablehlo.add", &[&v, &start], &ty);
        }
        e.convert(&v, self.dtype)
    }
}

/// numpy's `arange(start, stop, step)`: values in [start, stop) spaced by `step`.
/// numpy's `arange(stop)` / `arange(start, stop, step)` on Python numbers: int32 when every
/// argument is an int, float32 otherwise, unless `dtype` says.
pub fn arange_of<V: Value>(
    ctx: &mut dyn Context<V>,
    start: Scalar,
    stop: Option<Scalar>,
    step: Option<Scalar>,
    dtype: Option<DType>,
) -> Result<V> {
    let given = [Some(start), stop, step];
    let all_int = given.iter().flatten().all(|s| matches!(s, Scalar::Int(_)));
    let (a, b) = match stop {
        None => (0.0, start.as_f64()),
        Some(stop) => (start.as_f64(), stop.as_f64()),
    };
    let step = step.map_or(1.0, Scalar::as_f64);
    let default = if all_int { DType::I32 } else { DType::F32 };
    arange(ctx, a, b, step, dtype.unwrap_or(default))
}

pub fn arange<V: Value>(
    ctx: &mut dyn Context<V>,
    start: f64,
    stop: f64,
    step: f64,
    dtype: DType,
) -> Result<V> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return Err(Error::invalid(
            "arange",
            format!("need finite start, stop and a non-zero step, got ({start}, {stop}, {step})"),
        ));
    }
    let len = ((stop - start) / step).ceil().max(0.0) as usize;
    build::apply1(
        ctx,
        Arange {
            dtype,
            start,
            step,
            len,
        },
        &[],
    )
}

/// Converts elements to another dtype (floats to ints truncate toward zero; to bool: != 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Cast {
    pub to: DType,
}
op_attrs!(Cast = "cast" { to });

fn convert<T: Element, U: Element>(x: &Tensor) -> Result<Tensor> {
    kernels::map::<T, U>(x, |v| U::from_f64(v.to_f64()))
}

impl OpDef for Cast {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("cast", inputs, 1)?;
        Ok(smallvec![inputs[0].with_dtype(self.to)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if x.dtype() == self.to {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = match (x.dtype(), self.to) {
            (DType::I64, DType::I32) => kernels::map::<i64, i32>(x, |v| v as i32)?,
            (DType::I32, DType::I64) => kernels::map::<i32, i64>(x, |v| v as i64)?,
            (from, to) => crate::with_dtype!(from, T, {
                crate::with_dtype!(to, U, { convert::<T, U>(x)? })
            }),
        };
        Ok(smallvec![out])
    }

    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        Some(match (inputs[0].dtype, self.to) {
            (from, to) if from == to => crate::with_dtype!(from, T, { dest::copy_to::<T>() }),
            (DType::I64, DType::I32) => dest::map_to::<i64, i32>(|v| v as i32),
            (DType::I32, DType::I64) => dest::map_to::<i32, i64>(|v| v as i64),
            (from, to) => crate::with_dtype!(from, T, {
                crate::with_dtype!(to, U, { dest::map_to::<T, U>(|v| U::from_f64(v.to_f64())) })
            }),
        })
    }

    fn saves(&self) -> Saves {
        if self.to.is_float() {
            Saves::NOTHING
        } else {
            Saves::NotDifferentiable("its output is not a float")
        }
    }

    fn scalar(&self, dtype: DType) -> Option<ScalarForm> {
        Some(if self.to == dtype {
            ScalarForm::Same
        } else {
            ScalarForm::Convert(self.to)
        })
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![e.convert(&inputs[0], self.to)?])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        let from = saved.input_types[0].dtype;
        match &grads[0] {
            Some(g) if from.is_float() => Ok(smallvec![Some(cast(ctx, g, from)?)]),
            _ => Ok(smallvec![None]),
        }
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        batching::pointwise(ctx, self.clone(), inputs)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        if !inputs[0].ty().dtype.is_float() {
            return tangents::none(outputs);
        }
        tangents::linear(ctx, self.clone(), inputs, outputs, tangents, &[0])
    }
}

pub fn cast<V: Value>(ctx: &mut dyn Context<V>, x: &V, to: DType) -> Result<V> {
    build::apply1(ctx, Cast { to }, std::slice::from_ref(x))
}

/// The same bits read as another dtype of the same width (`float64` <-> `int64`, `float32` <->
/// `int32`): StableHLO's `bitcast_convert`, what `nextafter` and float tricks are written with.
/// Bit patterns have no derivative: a float read from an integer has none, and an integer
/// output carries none.
#[derive(Clone, Debug, PartialEq)]
pub struct BitcastConvert {
    pub to: DType,
}
op_attrs!(BitcastConvert = "bitcast_convert" { to });

impl OpDef for BitcastConvert {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("bitcast_convert", inputs, 1)?;
        let from = inputs[0].dtype;
        let width = |d: DType| match d {
            DType::F64 | DType::I64 => Some(8),
            DType::F32 | DType::I32 => Some(4),
            DType::Bool => None,
        };
        if width(from).is_none() || width(from) != width(self.to) {
            return Err(Error::dtype(
                "bitcast_convert",
                format!(
                    "{from} and {} are not of one width (float64/int64, float32/int32)",
                    self.to
                ),
            ));
        }
        Ok(smallvec![inputs[0].with_dtype(self.to)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        let out = match (x.dtype(), self.to) {
            (from, to) if from == to => x.with_new_id(),
            (DType::F64, DType::I64) => kernels::map::<f64, i64>(x, |v| v.to_bits() as i64)?,
            (DType::I64, DType::F64) => kernels::map::<i64, f64>(x, |v| f64::from_bits(v as u64))?,
            (DType::F32, DType::I32) => kernels::map::<f32, i32>(x, |v| v.to_bits() as i32)?,
            (DType::I32, DType::F32) => kernels::map::<i32, f32>(x, |v| f32::from_bits(v as u32))?,
            (from, to) => {
                return Err(Error::internal(
                    "bitcast_convert",
                    format!("{from} to {to} (the rule should have refused it)"),
                ))
            }
        };
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
        let x = &inputs[0];
        if x.ty.dtype == self.to {
            return Ok(smallvec![x.clone()]);
        }
        let body = format!(
            "stablehlo.bitcast_convert {x} : ({}) -> {}",
            TypeText(&x.ty),
            TypeText(&outputs[0])
        );
        Ok(smallvec![e.op(&body, &outputs[0])])
    }

    fn gradient<V: Value>(
        &self,
        _ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        // the same dtype is the identity; across dtypes one side is an integer
        let same = saved.input_types[0].dtype == self.to;
        Ok(smallvec![if same { grads[0].clone() } else { None }])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        batching::pointwise(ctx, self.clone(), inputs)
    }

    fn tangent<V: Value>(
        &self,
        _ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        if inputs[0].ty().dtype == self.to {
            return Ok(smallvec![tangents[0].clone()]);
        }
        tangents::none(outputs)
    }
}

pub fn bitcast_convert<V: Value>(ctx: &mut dyn Context<V>, x: &V, to: DType) -> Result<V> {
    build::apply1(ctx, BitcastConvert { to }, std::slice::from_ref(x))
}

/// Identity whose gradient is nothing: values pass, gradients stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StopGradient;
op_attrs!(StopGradient = "stop_gradient" {});

/// Rule of the identity-like ops: one input, same type out.
fn same_type(op: &'static str, inputs: &[TensorType]) -> Result<Types> {
    expect_arity(op, inputs, 1)?;
    Ok(smallvec![inputs[0].clone()])
}

/// Kernel of the identity-like ops: the input's storage under a new identity (no copy).
fn renamed(inputs: &[Tensor]) -> Result<Values<Tensor>> {
    Ok(smallvec![inputs[0].with_new_id()])
}

impl OpDef for StopGradient {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        same_type("stop_gradient", inputs)
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        renamed(inputs)
    }

    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        Some(crate::with_dtype!(inputs[0].dtype, T, {
            dest::copy_to::<T>()
        }))
    }

    fn same_elements(&self) -> bool {
        true
    }

    fn saves(&self) -> Saves {
        Saves::NotDifferentiable("stop_gradient blocks gradients by definition")
    }

    fn scalar(&self, _dtype: DType) -> Option<ScalarForm> {
        Some(ScalarForm::Same)
    }

    fn emit(
        &self,
        _e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![inputs[0].clone()])
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(smallvec![None])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        batching::pointwise(ctx, *self, inputs)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        let _ = (ctx, inputs, tangents);
        tangents::none(outputs)
    }
}

pub fn stop_gradient<V: Value>(ctx: &mut dyn Context<V>, x: &V) -> Result<V> {
    build::apply1(ctx, StopGradient, std::slice::from_ref(x))
}

/// The same value under a new identity (no copy); the gradient passes through. Used where a
/// value must be distinct for the tape (a Variable's stored value, custom-gradient outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Identity;
op_attrs!(Identity = "identity" {});

impl OpDef for Identity {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        same_type("identity", inputs)
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        renamed(inputs)
    }

    fn kernel_into(&self, inputs: &[TensorType], _outputs: &[TensorType]) -> Option<DestKernel> {
        Some(crate::with_dtype!(inputs[0].dtype, T, {
            dest::copy_to::<T>()
        }))
    }

    fn same_elements(&self) -> bool {
        true
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn scalar(&self, _dtype: DType) -> Option<ScalarForm> {
        Some(ScalarForm::Same)
    }

    fn emit(
        &self,
        _e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![inputs[0].clone()])
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(smallvec![grads[0].clone()])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        batching::pointwise(ctx, *self, inputs)
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        tangents::linear(ctx, *self, inputs, outputs, tangents, &[0])
    }
}

pub fn identity<V: Value>(ctx: &mut dyn Context<V>, x: &V) -> Result<V> {
    build::apply1(ctx, Identity, std::slice::from_ref(x))
}

#[cfg(test)]
mod arange_tests {
    use super::*;
    use crate::ops::EagerContext;

    #[test]
    fn arange_is_int32_when_every_argument_is_an_int() {
        let cx = &mut EagerContext;
        let ints: Tensor = arange_of(cx, Scalar::Int(5), None, None, None).unwrap();
        assert_eq!(
            (ints.dtype(), ints.to_f64_vec()),
            (DType::I32, vec![0., 1., 2., 3., 4.])
        );
        let floats: Tensor = arange_of(
            cx,
            Scalar::Int(1),
            Some(Scalar::Int(2)),
            Some(Scalar::Float(0.5)),
            None,
        )
        .unwrap();
        assert_eq!(
            (floats.dtype(), floats.to_f64_vec()),
            (DType::F32, vec![1.0, 1.5])
        );
        let given: Tensor = arange_of(cx, Scalar::Int(3), None, None, Some(DType::F64)).unwrap();
        assert_eq!(given.dtype(), DType::F64);
    }
}
