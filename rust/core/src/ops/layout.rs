//! Layout ops: they move or select elements without arithmetic. `reshape`, `broadcast_to` and
//! the builders `expand_dims`, `squeeze` here; re-exported from their own files: `transpose`
//! and `reverse` (`permute`), `concatenate` and `stack` (`concat`), strided `slice` and zero
//! `pad` (`slicing`).
//!
//! Gradients: reshape reshapes back; transpose applies the inverse permutation; broadcast_to
//! sums back (`sum_to_shape`); concatenate slices g apart; slice pads g with zeros; pad slices;
//! reverse reverses. Every op here is any-dtype and maps 1:1 onto the StableHLO op of the same
//! name (`broadcast_to` onto `broadcast_in_dim`).

use ndarray::{ArrayViewD, IxDyn};
use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
pub use super::concat::{concatenate, stack, Concatenate};
pub use super::permute::{reverse, transpose, Reverse, Transpose};
use super::rules::shape_str;
pub use super::slicing::{pad, slice, Pad, Slice};
use super::{
    build, dest, expect_arity, DestKernel, GatherTable, Grads, OpDef, Saved, Saves, Types, Values,
};
use super::{tangents, Tangents};
use crate::dtype::Element;
use crate::emit::{Emitter, MlirValue};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{broadcast_shapes, numel, Shape, ShapeDisplay, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// Same elements, new shape (row-major order). Shares storage: no copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reshape {
    pub shape: Shape,
}
op_attrs!(Reshape = "reshape" { shape });

impl OpDef for Reshape {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
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

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Ok(smallvec![e.reshape(&inputs[0], &self.shape)?])
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
        let shape = saved.input_types[0].shape.clone();
        Ok(smallvec![Some(reshape(ctx, g, &shape)?)])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let lanes = inputs[0].ty().shape[0];
        let shape: Shape = std::iter::once(lanes)
            .chain(self.shape.iter().copied())
            .collect();
        batching::pointwise(ctx, Reshape { shape }, inputs)
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

/// Reshape to an explicit shape (no -1: see `resolve_shape`).
pub fn reshape<V: Value>(ctx: &mut dyn Context<V>, x: &V, shape: &[usize]) -> Result<V> {
    build::apply1(
        ctx,
        Reshape {
            shape: shape.into(),
        },
        std::slice::from_ref(x),
    )
}

/// A user shape with at most one -1, resolved for an input of shape `from`.
pub fn resolve_shape(from: &[usize], shape: &[i64]) -> Result<Shape> {
    let numel_in = crate::shape::numel(from);
    let unknown: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
    if unknown.len() > 1 || shape.iter().any(|&d| d < -1) {
        return Err(Error::invalid(
            "reshape",
            format!("invalid shape {shape:?}: dimensions must be >= 0, with at most one -1"),
        ));
    }
    let known: usize = shape
        .iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as usize)
        .product();
    let mut out: Shape = shape.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(&i) = unknown.first() {
        if numel_in == crate::shape::DYN {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot infer the -1 in {shape:?} from shape {}, whose size is only known \
                     when the graph runs: give every dimension",
                    ShapeDisplay(from)
                ),
            ));
        }
        if known == 0 || !numel_in.is_multiple_of(known) {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape a tensor of shape {} ({numel_in} elements) into shape {shape:?}",
                    ShapeDisplay(from)
                ),
            ));
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
op_attrs!(BroadcastTo = "broadcast_to" { shape });

impl OpDef for BroadcastTo {
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        super::output_work(inputs, outputs)
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("broadcast_to", inputs, 1)?;
        let x = &inputs[0];
        let joined = broadcast_shapes("broadcast_to", &x.shape, &self.shape)?;
        if joined.as_slice() != self.shape.as_slice() {
            return Err(Error::shape(
                "broadcast_to",
                format!(
                    "cannot broadcast a tensor of shape {} to shape {}",
                    shape_str(x),
                    ShapeDisplay(&self.shape)
                ),
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
            let b = v
                .broadcast(IxDyn(&self.shape))
                .ok_or_else(|| Error::internal("broadcast_to", "rule and kernel disagree"))?;
            Tensor::from_array(b.to_owned())
        });
        Ok(smallvec![out])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        crate::with_dtype!(inputs[0].dtype, T, {
            dest::broadcast_to::<T>(&inputs[0], &outputs[0])
        })
    }

    fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
        let (x, out) = (&inputs[0].shape, &output.shape);
        if x.contains(&DYN) || out.contains(&DYN) || !dest::table_fits(1, &[x, out]) {
            return None;
        }
        let sources = crate::emit::broadcast_sources(x, out);
        Some(sources.into_iter().map(|k| Some((0, k as u32))).collect())
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let x = &inputs[0];
        Ok(smallvec![e.broadcast_to(x, &self.shape, inputs)?])
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
        let shape = saved.input_types[0].shape.clone();
        Ok(smallvec![Some(build::sum_to_shape(ctx, g, &shape)?)])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let x = batching::lift_rank(ctx, &inputs[0], self.shape.len())?;
        let lanes = x.ty().shape[0];
        let shape: Shape = std::iter::once(lanes)
            .chain(self.shape.iter().copied())
            .collect();
        batching::pointwise(ctx, BroadcastTo { shape }, &[x])
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

pub fn broadcast_to<V: Value>(ctx: &mut dyn Context<V>, x: &V, shape: &[usize]) -> Result<V> {
    build::apply1(
        ctx,
        BroadcastTo {
            shape: shape.into(),
        },
        std::slice::from_ref(x),
    )
}

/// A row-major tensor copied out of any ndarray view (permuted, strided, reversed).
pub(crate) fn owned<T: Element>(v: ArrayViewD<'_, T>) -> Tensor {
    Tensor::from_array(v.as_standard_layout().into_owned())
}

/// The static shape of `ty`; gradients that must place values at fixed offsets need it.
pub(crate) fn static_shape(op: &'static str, ty: &TensorType) -> Result<Shape> {
    if ty.shape.contains(&DYN) {
        return Err(Error::gradient(
            op,
            format!("the gradient of {op} needs a static shape, got {ty}"),
        ));
    }
    Ok(ty.shape.clone())
}

pub fn expand_dims<V: Value>(ctx: &mut dyn Context<V>, x: &V, axis: usize) -> Result<V> {
    let mut shape: Shape = x.ty().shape.clone();
    shape.insert(axis.min(shape.len()), 1);
    reshape(ctx, x, &shape)
}

/// numpy's `squeeze(x, axis)`: the size-1 axes `axis` (any sign) removed, or all of them when
/// `axis` is None; an axis of another size, or of a size unknown until run time, is a `Shape`
/// error.
pub fn squeeze_axes<V: Value>(ctx: &mut dyn Context<V>, x: &V, axis: Option<&[i64]>) -> Result<V> {
    let shape = x.ty().shape.to_vec();
    let axes: Vec<usize> = match axis {
        None => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
        Some(axis) => {
            let axes = axis
                .iter()
                .map(|&a| crate::shape::normalize_axis("squeeze", a, shape.len()))
                .collect::<Result<Vec<_>>>()?;
            if let Some(&bad) = axes.iter().find(|&&a| shape[a] != 1) {
                let why = match shape[bad] {
                    DYN => format!("cannot squeeze axis {bad}: its size is unknown until run time"),
                    n => format!("cannot squeeze axis {bad} of size {n}"),
                };
                return Err(Error::shape(
                    "squeeze",
                    format!("{why} (shape {})", ShapeDisplay(&shape)),
                ));
            }
            axes
        }
    };
    squeeze(ctx, x, &axes)
}

pub fn squeeze<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize]) -> Result<V> {
    let shape: Shape = x
        .ty()
        .shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    reshape(ctx, x, &shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};
    use crate::ErrorKind;

    #[test]
    fn squeeze_takes_numpys_axis_argument() {
        let cx = &mut EagerContext;
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2, 1]).unwrap();
        assert_eq!(squeeze_axes(cx, &x, None).unwrap().shape(), &[2]);
        assert_eq!(squeeze_axes(cx, &x, Some(&[-1])).unwrap().shape(), &[1, 2]);
        let e = squeeze_axes(cx, &x, Some(&[1])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert!(e
            .to_string()
            .contains("cannot squeeze axis 1 of size 2 (shape [1, 2, 1])"));
        let e = squeeze_axes(cx, &x, Some(&[3])).unwrap_err();
        assert!(e.to_string().starts_with("squeeze"), "{e}");
    }

    #[test]
    fn reshape_and_broadcast_forward() {
        let (cx, x) = (&mut EagerContext, iota(&[2, 3]));
        let y = reshape(cx, &x, &[3, 1, 2]).unwrap();
        assert_eq!(
            (y.shape(), y.to_f64_vec()),
            (&[3, 1, 2][..], x.to_f64_vec())
        );
        let y = broadcast_to(cx, &iota(&[2, 1]), &[3, 2, 2]).unwrap();
        assert_eq!(y.to_f64_vec(), [0.0, 0.0, 1.0, 1.0].repeat(3));
        let e = expand_dims(cx, &x, 1).unwrap();
        assert_eq!(e.shape(), &[2, 1, 3]);
        assert_eq!(squeeze(cx, &e, &[1]).unwrap().shape(), &[2, 3]);
        expect_error(
            reshape(cx, &x, &[4]),
            ErrorKind::Shape,
            "reshape",
            &["[2, 3]", "[4]"],
        );
        expect_error(
            broadcast_to(cx, &x, &[3]),
            ErrorKind::Shape,
            "broadcast_to",
            &["[2, 3]", "[3]"],
        );
        // A -1 cannot be inferred from a size only known at run time.
        let err = resolve_shape(&[crate::shape::DYN, 3], &[-1, 3]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Shape);
        assert!(err.message.contains("give every dimension"), "{err}");
        assert_eq!(resolve_shape(&[2, 3], &[-1]).unwrap().as_slice(), &[6]);
    }

    #[test]
    fn gradients_match_finite_differences() {
        check_op_gradients(&|ctx, xs| reshape(ctx, &xs[0], &[3, 2]), &[ramp(&[2, 3])]);
        check_op_gradients(
            &|ctx, xs| broadcast_to(ctx, &xs[0], &[2, 3, 2]),
            &[ramp(&[3, 1])],
        );
    }
}
