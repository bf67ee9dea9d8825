//! Ops that permute elements without changing their number: `transpose` (of axes) and
//! `reverse` (of positions along axes). Any dtype; both are their own kind of inverse, so each
//! gradient is the same op again (transpose with the inverse permutation). MLIR:
//! `stablehlo.transpose`, `stablehlo.reverse`.

use ndarray::{Axis, IxDyn};
use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::layout::owned;
use super::rules::shape_str;
use super::tiles::Tiled;
use super::{build, expect_arity, Grads, OpDef, Saved, Saves, Types, Values};
use super::{tangents, Tangents};
use crate::dtype::{DType, Element};
use crate::emit::{Emitter, MlirValue, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{Shape, TensorType};
use crate::tensor::Tensor;
use crate::value::Value;

/// numpy's transpose with an explicit permutation: output dimension `i` is input dimension
/// `perm[i]`. Shares nothing: the kernel copies into row-major order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transpose {
    pub perm: Vec<usize>,
}
op_attrs!(Transpose = "transpose" { perm });

impl OpDef for Transpose {
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
        if let Some(out) = swap_last_two_tiled(x, &self.perm)? {
            return Ok(smallvec![out]);
        }
        let out = crate::with_dtype!(x.dtype(), T, {
            owned(x.view::<T>()?.permuted_axes(IxDyn(&self.perm)))
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
        if self.perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(smallvec![x.clone()]);
        }
        let body = format!(
            "stablehlo.transpose {x}, dims = {:?} : ({}) -> {}",
            self.perm,
            TypeText(&x.ty),
            TypeText(out)
        );
        Ok(smallvec![e.op(&body, out)])
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

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let perm = std::iter::once(0)
            .chain(self.perm.iter().map(|p| p + 1))
            .collect();
        batching::pointwise(ctx, Transpose { perm }, inputs)
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

/// Reverses the order of elements along each of `axes` (distinct).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reverse {
    pub axes: Vec<usize>,
}
op_attrs!(Reverse = "reverse" { axes });

impl OpDef for Reverse {
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

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        _outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let x = &inputs[0];
        if self.axes.is_empty() {
            return Ok(smallvec![x.clone()]);
        }
        let body = format!(
            "stablehlo.reverse {x}, dims = {:?} : {}",
            self.axes,
            TypeText(&x.ty)
        );
        Ok(smallvec![e.op(&body, &x.ty)])
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

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let _ = batched;
        let op = Reverse {
            axes: batching::shifted(&self.axes),
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

/// Permutes axes: output dimension `i` is input dimension `perm[i]`.
/// A float transpose of the last two axes (the leading ones kept) through `Tiled`'s register
/// tiles, matrix by matrix (several times faster than the strided copy: `docs/notes.md`,
/// "Kernels"); None for any other permutation or dtype.
fn swap_last_two_tiled(x: &Tensor, perm: &[usize]) -> Result<Option<Tensor>> {
    let rank = perm.len();
    let swaps_last_two = rank >= 2
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
    if !swaps_last_two {
        return Ok(None);
    }
    fn tiled<T: Tiled + Element>(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
        let (rows, cols) = (x.shape()[shape.len() - 2], x.shape()[shape.len() - 1]);
        let src = x.as_slice::<T>()?;
        let mut out = src.to_vec();
        let matrix = rows * cols;
        if matrix > 0 {
            for (from, to) in src.chunks(matrix).zip(out.chunks_mut(matrix)) {
                T::transpose(from, rows, cols, to);
            }
        }
        Tensor::from_vec(out, shape)
    }
    let mut shape: Shape = x.shape().into();
    shape.swap(rank - 2, rank - 1);
    match x.dtype() {
        DType::F32 => tiled::<f32>(x, &shape).map(Some),
        DType::F64 => tiled::<f64>(x, &shape).map(Some),
        _ => Ok(None),
    }
}

pub fn transpose<V: Value>(ctx: &mut dyn Context<V>, x: &V, perm: &[usize]) -> Result<V> {
    build::apply1(
        ctx,
        Transpose {
            perm: perm.to_vec(),
        },
        std::slice::from_ref(x),
    )
}

/// Reverses `x` along `axes` (absolute, distinct; any order).
pub fn reverse<V: Value>(ctx: &mut dyn Context<V>, x: &V, axes: &[usize]) -> Result<V> {
    let mut axes = axes.to_vec();
    axes.sort_unstable();
    build::apply1(ctx, Reverse { axes }, std::slice::from_ref(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};
    use crate::ErrorKind;

    #[test]
    fn transpose_permutes_axes() {
        let cx = &mut EagerContext;
        let y = transpose(cx, &iota(&[2, 3, 4]), &[2, 0, 1]).unwrap();
        assert_eq!(y.shape(), &[4, 2, 3]);
        // y[k, i, j] = x[i, j, k] = 12 i + 4 j + k
        let want: Vec<f64> = (0..4)
            .flat_map(|k| {
                (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f64))
            })
            .collect();
        assert_eq!(y.to_f64_vec(), want);
        let empty = Tensor::from_vec(Vec::<i32>::new(), &[0, 3]).unwrap();
        let t = transpose(cx, &empty, &[1, 0]).unwrap();
        assert_eq!((t.shape(), t.dtype()), (&[3, 0][..], crate::DType::I32));
        for perm in [vec![0], vec![0, 0], vec![0, 2]] {
            let r = transpose(cx, &iota(&[2, 3]), &perm);
            expect_error(
                r,
                ErrorKind::InvalidArgument,
                "transpose",
                &["[2, 3]", "permutation"],
            );
        }
    }

    #[test]
    fn float_swaps_of_the_last_two_axes_match_the_strided_copy() {
        // The tiled path (float32, float64) against the strided copy (int64 of the same
        // values), at ragged and empty sizes, with and without leading axes.
        let cx = &mut EagerContext;
        for shape in [
            &[9, 17][..],
            &[3, 8, 8],
            &[2, 1, 13, 4],
            &[0, 5],
            &[2, 0, 3],
            &[1, 1],
        ] {
            let rank = shape.len();
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(rank - 2, rank - 1);
            let values: Vec<i64> = (0..shape.iter().product::<usize>() as i64).collect();
            let ints = Tensor::from_vec(values.clone(), shape).unwrap();
            let want = transpose(cx, &ints, &perm).unwrap();
            let floats = [
                Tensor::from_vec(values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape),
                Tensor::from_vec(values.iter().map(|&v| v as f64).collect::<Vec<_>>(), shape),
            ];
            for x in floats {
                let got = transpose(cx, &x.unwrap(), &perm).unwrap();
                assert_eq!(got.shape(), want.shape(), "{shape:?}");
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{shape:?}");
            }
        }
    }

    #[test]
    fn reverse_flips_axes() {
        let (cx, x) = (&mut EagerContext, iota(&[2, 3]));
        assert_eq!(
            reverse(cx, &x, &[1]).unwrap().to_f64_vec(),
            [2.0, 1.0, 0.0, 5.0, 4.0, 3.0]
        );
        assert_eq!(
            reverse(cx, &x, &[1, 0]).unwrap().to_f64_vec(),
            [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
        );
        assert_eq!(reverse(cx, &x, &[]).unwrap().to_f64_vec(), x.to_f64_vec());
        assert_eq!(reverse(cx, &iota(&[0, 2]), &[0]).unwrap().shape(), &[0, 2]);
        expect_error(
            reverse(cx, &x, &[2]),
            ErrorKind::Index,
            "reverse",
            &["axis 2", "[2, 3]"],
        );
        expect_error(
            reverse(cx, &x, &[0, 0]),
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
            &|ctx, xs| reverse(ctx, &xs[0], &[0, 2]),
            &[ramp(&[2, 2, 3])],
        );
    }
}
