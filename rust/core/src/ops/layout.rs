//! Layout ops: they move or select elements without arithmetic. `reshape`, `transpose`,
//! `broadcast_to`, `concatenate`, `slice` (strided, positive steps), `pad` (zero padding, the
//! gradient of slice), `reverse`; builders `expand_dims`, `squeeze`, `stack`.
//!
//! Gradients: reshape reshapes back; transpose applies the inverse permutation; broadcast_to
//! sums back (`sum_to_shape`); concatenate slices g apart; slice pads g with zeros; pad slices;
//! reverse reverses.

use ndarray::IxDyn;
use smallvec::smallvec;

use super::rules::shape_str;
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shape::{broadcast_shapes, numel, Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Same elements, new shape (row-major order). Shares storage: no copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reshape {
    pub shape: Shape,
}

impl OpDef for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("reshape", inputs, 1)?;
        let x = &inputs[0];
        let (from, to) = (numel(&x.shape), numel(&self.shape));
        if from != DYN && to != DYN && from != to {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape a tensor of shape {} ({from} elements) into shape {} ({to} elements)",
                    shape_str(x),
                    ShapeDisplay(&self.shape)
                ),
            ));
        }
        Ok(smallvec![TensorType::new(x.dtype, &self.shape)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        Ok(smallvec![inputs[0].reshaped(&self.shape)?])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], _: &[bool]) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else { return Ok(smallvec![None]) };
        let shape = saved.input_types[0].shape.clone();
        Ok(smallvec![Some(reshape(ctx, g, &shape)?)])
    }
}

/// Reshape to an explicit shape (no -1: see `resolve_shape`).
pub fn reshape<V: Value>(ctx: &mut dyn Context<V>, x: &V, shape: &[usize]) -> Result<V> {
    build::apply1(ctx, Reshape { shape: shape.into() }, std::slice::from_ref(x))
}

/// A user shape with at most one -1, resolved against `numel` elements.
pub fn resolve_shape(numel_in: usize, shape: &[i64]) -> Result<Shape> {
    let unknown: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
    if unknown.len() > 1 || shape.iter().any(|&d| d < -1) {
        return Err(Error::invalid("reshape", format!("invalid shape {shape:?}: dimensions must be >= 0, with at most one -1")));
    }
    let known: usize = shape.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
    let mut out: Shape = shape.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(&i) = unknown.first() {
        if known == 0 || numel_in % known != 0 {
            return Err(Error::shape("reshape", format!("cannot reshape {numel_in} elements into shape {shape:?}")));
        }
        out[i] = numel_in / known;
    }
    Ok(out)
}

/// Repeats `x` along broadcast dimensions to reach `shape` (numpy's broadcast_to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BroadcastTo {
    pub shape: Shape,
}

impl OpDef for BroadcastTo {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("broadcast_to", inputs, 1)?;
        let x = &inputs[0];
        let joined = broadcast_shapes("broadcast_to", &x.shape, &self.shape)?;
        if joined.as_slice() != self.shape.as_slice() {
            return Err(Error::shape(
                "broadcast_to",
                format!("cannot broadcast a tensor of shape {} to shape {}", shape_str(x), ShapeDisplay(&self.shape)),
            ));
        }
        Ok(smallvec![TensorType::new(x.dtype, &self.shape)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if x.shape() == self.shape.as_slice() {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            let v = x.view::<T>()?;
            let b = v.broadcast(IxDyn(&self.shape)).ok_or_else(|| Error::internal("broadcast_to", "rule and kernel disagree"))?;
            Tensor::from_array(b.to_owned())
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn gradient<V: Value>(&self, ctx: &mut dyn Context<V>, saved: &Saved<V>, grads: &[Option<V>], _: &[bool]) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else { return Ok(smallvec![None]) };
        let shape = saved.input_types[0].shape.clone();
        Ok(smallvec![Some(build::sum_to_shape(ctx, g, &shape)?)])
    }
}

pub fn broadcast_to<V: Value>(ctx: &mut dyn Context<V>, x: &V, shape: &[usize]) -> Result<V> {
    build::apply1(ctx, BroadcastTo { shape: shape.into() }, std::slice::from_ref(x))
}

// ---- ops below are being written; each keeps its attribute layout ----

macro_rules! pending_op {
    ($name:ident, $opname:literal { $($field:ident: $ty:ty),* }) => {
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name { $(pub $field: $ty),* }
        impl OpDef for $name {
            fn name(&self) -> &'static str { $opname }
            fn infer(&self, _: &[TensorType]) -> Result<Types> { Err(Error::internal($opname, "not available yet")) }
            fn compute(&self, _: &[Tensor], _: &[TensorType]) -> Result<Values<Tensor>> { Err(Error::internal($opname, "not available yet")) }
            fn saves(&self) -> Saves { Saves::NOTHING }
            fn gradient<V: Value>(&self, _: &mut dyn Context<V>, _: &Saved<V>, _: &[Option<V>], _: &[bool]) -> Result<Grads<V>> { Err(Error::internal($opname, "not available yet")) }
        }
    };
}
pub(crate) use pending_op;

pending_op!(Transpose, "transpose" { perm: Vec<usize> });
pending_op!(Concatenate, "concatenate" { axis: usize });
pending_op!(Slice, "slice" { start: Vec<usize>, stop: Vec<usize>, step: Vec<usize> });
pending_op!(Pad, "pad" { low: Vec<usize>, high: Vec<usize>, interior: Vec<usize> });
pending_op!(Reverse, "reverse" { axes: Vec<usize> });

pub fn transpose<V: Value>(ctx: &mut dyn Context<V>, x: &V, perm: &[usize]) -> Result<V> {
    build::apply1(ctx, Transpose { perm: perm.to_vec() }, std::slice::from_ref(x))
}
pub fn concatenate<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    build::apply1(ctx, Concatenate { axis }, xs)
}
pub fn slice<V: Value>(ctx: &mut dyn Context<V>, x: &V, start: &[usize], stop: &[usize], step: &[usize]) -> Result<V> {
    build::apply1(ctx, Slice { start: start.to_vec(), stop: stop.to_vec(), step: step.to_vec() }, std::slice::from_ref(x))
}
pub fn pad<V: Value>(ctx: &mut dyn Context<V>, x: &V, low: &[usize], high: &[usize], interior: &[usize]) -> Result<V> {
    build::apply1(ctx, Pad { low: low.to_vec(), high: high.to_vec(), interior: interior.to_vec() }, std::slice::from_ref(x))
}
pub fn reverse<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize]) -> Result<V> {
    build::apply1(ctx, Reverse { axes: axes.to_vec() }, std::slice::from_ref(x))
}
pub fn expand_dims<V: Value>(ctx: &mut dyn Context<V>, x: &V, axis: usize) -> Result<V> {
    let mut shape: Shape = x.ty().shape.clone();
    shape.insert(axis.min(shape.len()), 1);
    reshape(ctx, x, &shape)
}
pub fn squeeze<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize]) -> Result<V> {
    let shape: Shape = x.ty().shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    reshape(ctx, x, &shape)
}
pub fn stack<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    let expanded: Vec<V> = xs.iter().map(|x| expand_dims(ctx, x, axis)).collect::<Result<_>>()?;
    concatenate(ctx, &expanded, axis)
}
