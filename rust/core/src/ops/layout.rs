//! Layout ops: they move or select elements without arithmetic. `reshape`, `transpose`,
//! `broadcast_to`, `concatenate`, `reverse` here; strided `slice` and zero `pad` (the gradient
//! of slice) in `slicing`, re-exported; builders `expand_dims`, `squeeze`, `stack`.
//!
//! Gradients: reshape reshapes back; transpose applies the inverse permutation; broadcast_to
//! sums back (`sum_to_shape`); concatenate slices g apart; slice pads g with zeros; pad slices;
//! reverse reverses. Every op here is any-dtype and maps 1:1 onto the StableHLO op of the same
//! name (`broadcast_to` onto `broadcast_in_dim`).

use ndarray::{ArrayViewD, Axis, IxDyn};
use smallvec::smallvec;

use super::rules::shape_str;
pub use super::slicing::{pad, slice, Pad, Slice};
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::dtype::Element;
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

/// A user shape with at most one -1, resolved against `numel` elements.
pub fn resolve_shape(numel_in: usize, shape: &[i64]) -> Result<Shape> {
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
        if known == 0 || numel_in % known != 0 {
            return Err(Error::shape(
                "reshape",
                format!("cannot reshape {numel_in} elements into shape {shape:?}"),
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

    fn saves(&self) -> Saves {
        Saves::NOTHING
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

/// numpy's transpose with an explicit permutation: output dimension `i` is input dimension
/// `perm[i]`. Shares nothing: the kernel copies into row-major order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transpose {
    pub perm: Vec<usize>,
}

impl OpDef for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("transpose", inputs, 1)?;
        let x = &inputs[0];
        let mut seen = vec![false; x.ndim()];
        let valid = self.perm.len() == x.ndim()
            && self
                .perm
                .iter()
                .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(Error::invalid(
                "transpose",
                format!(
                    "perm {:?} is not a permutation of the {} axes of a tensor of shape {}",
                    self.perm,
                    x.ndim(),
                    shape_str(x)
                ),
            ));
        }
        let shape: Shape = self.perm.iter().map(|&p| x.shape[p]).collect();
        Ok(smallvec![TensorType::new(x.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if self.perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            owned(x.view::<T>()?.permuted_axes(IxDyn(&self.perm)))
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        _: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None]);
        };
        let mut inverse = vec![0; self.perm.len()];
        for (i, &p) in self.perm.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(smallvec![Some(transpose(ctx, g, &inverse)?)])
    }
}

/// Joins `n >= 1` tensors of one dtype along `axis`; all other dimensions must agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concatenate {
    pub axis: usize,
}

impl OpDef for Concatenate {
    fn name(&self) -> &'static str {
        "concatenate"
    }

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
                return Err(Error::shape(
                    "concatenate",
                    format!("input {i} has shape {} but input 0 has shape {}: all dimensions except axis {axis} must match", shape_str(t), shape_str(first)),
                ));
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
}

/// Reverses the order of elements along each of `axes` (distinct).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reverse {
    pub axes: Vec<usize>,
}

impl OpDef for Reverse {
    fn name(&self) -> &'static str {
        "reverse"
    }

    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("reverse", inputs, 1)?;
        let x = &inputs[0];
        for (i, &a) in self.axes.iter().enumerate() {
            if a >= x.ndim() {
                return Err(Error::index(
                    "reverse",
                    format!(
                        "axis {a} is out of bounds for a tensor of shape {}",
                        shape_str(x)
                    ),
                ));
            }
            if self.axes[..i].contains(&a) {
                return Err(Error::invalid(
                    "reverse",
                    format!("axis {a} is repeated in {:?}", self.axes),
                ));
            }
        }
        Ok(smallvec![x.clone()])
    }

    fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let x = &inputs[0];
        if self.axes.is_empty() {
            return Ok(smallvec![x.with_new_id()]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            let mut v = x.view::<T>()?;
            for &a in &self.axes {
                v.invert_axis(Axis(a));
            }
            owned(v)
        });
        Ok(smallvec![out])
    }

    fn saves(&self) -> Saves {
        Saves::NOTHING
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        _: &Saved<V>,
        grads: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None]);
        };
        Ok(smallvec![Some(reverse(ctx, g, &self.axes)?)])
    }
}

// Kept for op families whose kernels are still being written (matmul): a placeholder that
// fails with an internal error instead of a panic.
#[allow(unused_macros)]
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
#[allow(unused_imports)]
pub(crate) use pending_op;

/// Permutes axes: output dimension `i` is input dimension `perm[i]`.
pub fn transpose<V: Value>(ctx: &mut dyn Context<V>, x: &V, perm: &[usize]) -> Result<V> {
    build::apply1(
        ctx,
        Transpose {
            perm: perm.to_vec(),
        },
        std::slice::from_ref(x),
    )
}

/// Joins `xs` (at least one) along `axis`.
pub fn concatenate<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    build::apply1(ctx, Concatenate { axis }, xs)
}

/// Reverses `x` along `axes` (absolute, distinct; any order).
pub fn reverse<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize]) -> Result<V> {
    let mut axes = axes.to_vec();
    axes.sort_unstable();
    build::apply1(ctx, Reverse { axes }, std::slice::from_ref(x))
}

pub fn expand_dims<V: Value>(ctx: &mut dyn Context<V>, x: &V, axis: usize) -> Result<V> {
    let mut shape: Shape = x.ty().shape.clone();
    shape.insert(axis.min(shape.len()), 1);
    reshape(ctx, x, &shape)
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

pub fn stack<V: Value>(ctx: &mut dyn Context<V>, xs: &[V], axis: usize) -> Result<V> {
    let expanded: Vec<V> = xs
        .iter()
        .map(|x| expand_dims(ctx, x, axis))
        .collect::<Result<_>>()?;
    concatenate(ctx, &expanded, axis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::EagerContext;
    use crate::ops::gradcheck::{check_op_gradients, ramp};
    use crate::ErrorKind;

    pub(crate) fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|v| v as f64).collect::<Vec<_>>(), shape).unwrap()
    }

    fn assert_err(err: Error, kind: ErrorKind, op: &str, needles: &[&str]) {
        assert_eq!(err.kind, kind, "{err}");
        assert!(err.to_string().starts_with(&format!("{op}:")), "{err}");
        for n in needles {
            assert!(err.to_string().contains(n), "{err} should mention {n}");
        }
    }

    #[test]
    fn transpose_permutes_axes() {
        let y = transpose(&mut EagerContext, &iota(&[2, 3, 4]), &[2, 0, 1]).unwrap();
        assert_eq!(y.shape(), &[4, 2, 3]);
        // y[k, i, j] = x[i, j, k] = 12 i + 4 j + k
        let want: Vec<f64> = (0..4)
            .flat_map(|k| {
                (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f64))
            })
            .collect();
        assert_eq!(y.to_f64_vec(), want);
        let empty = Tensor::from_vec(Vec::<i32>::new(), &[0, 3]).unwrap();
        let t = transpose(&mut EagerContext, &empty, &[1, 0]).unwrap();
        assert_eq!((t.shape(), t.dtype()), (&[3, 0][..], crate::DType::I32));
        for perm in [vec![0], vec![0, 0], vec![0, 2]] {
            let err = transpose(&mut EagerContext, &iota(&[2, 3]), &perm).unwrap_err();
            assert_err(
                err,
                ErrorKind::InvalidArgument,
                "transpose",
                &["[2, 3]", "permutation"],
            );
        }
    }

    #[test]
    fn concatenate_joins_along_an_axis() {
        let (a, b) = (iota(&[2, 1]), iota(&[2, 2]));
        let y = concatenate(&mut EagerContext, &[a.clone(), b.clone(), iota(&[2, 0])], 1).unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(y.to_f64_vec(), vec![0.0, 0.0, 1.0, 1.0, 2.0, 3.0]);
        assert_eq!(
            concatenate(&mut EagerContext, &[a.clone()], 0)
                .unwrap()
                .to_f64_vec(),
            vec![0.0, 1.0]
        );
        let ints = Tensor::from_vec(vec![1i64, 2], &[2, 1]).unwrap();
        let bools = Tensor::from_vec(vec![true, false], &[1, 2]).unwrap();
        assert_eq!(
            concatenate(&mut EagerContext, &[bools.clone(), bools], 0)
                .unwrap()
                .to_f64_vec(),
            vec![1.0, 0.0, 1.0, 0.0]
        );

        let err = concatenate(&mut EagerContext, &[a.clone(), b.clone()], 0).unwrap_err();
        assert_err(
            err,
            ErrorKind::Shape,
            "concatenate",
            &["[2, 2]", "[2, 1]", "axis 0"],
        );
        let err = concatenate(&mut EagerContext, &[a.clone(), ints], 1).unwrap_err();
        assert_err(err, ErrorKind::DType, "concatenate", &["int64", "float64"]);
        let err = concatenate(&mut EagerContext, &[a.clone()], 2).unwrap_err();
        assert_err(err, ErrorKind::Index, "concatenate", &["axis 2"]);
        let err = concatenate::<Tensor>(&mut EagerContext, &[], 0).unwrap_err();
        assert_err(
            err,
            ErrorKind::InvalidArgument,
            "concatenate",
            &["at least one"],
        );
        let err = stack(&mut EagerContext, &[a, iota(&[3])], 0).unwrap_err();
        assert_err(err, ErrorKind::Shape, "concatenate", &[]);
    }

    #[test]
    fn concatenate_tolerates_unknown_dims() {
        let c = Concatenate { axis: 0 };
        let ty = |s: &[usize]| TensorType::new(crate::DType::F32, s);
        let out = c.infer(&[ty(&[2, DYN]), ty(&[3, 4])]).unwrap();
        assert_eq!(out[0].shape.as_slice(), &[5, 4]);
        assert_eq!(
            c.infer(&[ty(&[DYN, 4]), ty(&[3, 4])]).unwrap()[0]
                .shape
                .as_slice(),
            &[DYN, 4]
        );
    }

    #[test]
    fn reverse_flips_axes() {
        let x = iota(&[2, 3]);
        assert_eq!(
            reverse(&mut EagerContext, &x, &[1]).unwrap().to_f64_vec(),
            vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]
        );
        assert_eq!(
            reverse(&mut EagerContext, &x, &[1, 0])
                .unwrap()
                .to_f64_vec(),
            vec![5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
        );
        assert_eq!(
            reverse(&mut EagerContext, &x, &[]).unwrap().to_f64_vec(),
            x.to_f64_vec()
        );
        assert_eq!(
            reverse(&mut EagerContext, &iota(&[0, 2]), &[0])
                .unwrap()
                .shape(),
            &[0, 2]
        );
        assert_err(
            reverse(&mut EagerContext, &x, &[2]).unwrap_err(),
            ErrorKind::Index,
            "reverse",
            &["axis 2", "[2, 3]"],
        );
        assert_err(
            reverse(&mut EagerContext, &x, &[0, 0]).unwrap_err(),
            ErrorKind::InvalidArgument,
            "reverse",
            &["repeated"],
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        check_op_gradients(
            &|ctx, xs| transpose(ctx, &xs[0], &[2, 0, 1]),
            &[ramp(&[2, 3, 2])],
        );
        check_op_gradients(
            &|ctx, xs| concatenate(ctx, xs, 1),
            &[ramp(&[2, 1]), ramp(&[2, 3]), ramp(&[2, 0])],
        );
        check_op_gradients(
            &|ctx, xs| concatenate(ctx, &[xs[0].clone(), xs[0].clone()], 0),
            &[ramp(&[3])],
        );
        check_op_gradients(&|ctx, xs| stack(ctx, xs, 1), &[ramp(&[2]), ramp(&[2])]);
        check_op_gradients(
            &|ctx, xs| reverse(ctx, &xs[0], &[0, 2]),
            &[ramp(&[2, 2, 3])],
        );
    }
}
