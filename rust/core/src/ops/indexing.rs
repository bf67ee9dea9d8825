//! numpy basic indexing (`t[...]` in Python) as a composition of existing ops: `reverse` (for
//! negative steps), `slice`, `dynamic_slice` (for tensor indices) and `reshape` (to drop
//! integer-indexed axes and insert new ones). No kernel or gradient of its own: gradients, to
//! any order, and MLIR come from those ops.
//!
//! Semantics are numpy's for ints (negative wrap, out of range is an error), slices (any
//! nonzero step, bounds clipped), `None` and one `...`. A scalar integer tensor index selects
//! one element of its axis at a position known only at run time (`xs[t]` in a loop body): as in
//! JAX, a negative value wraps once and the position is then clamped into range, never an error.

use super::build;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::Context;
use crate::shape::{Shape, ShapeDisplay, DYN};
use crate::value::Value;

/// One entry of an index expression.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexItem<V> {
    /// Picks one position; the axis is dropped.
    Int(i64),
    /// `start:stop:step`, `None` meaning the numpy default for the step's direction.
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
    },
    /// Inserts an axis of size 1.
    NewAxis,
    /// As many full slices as the other entries leave axes.
    Ellipsis,
    /// A scalar int32/int64 tensor: a data-dependent position; the axis is dropped.
    Tensor(V),
}

/// What the index does to one input axis: an optional reversal, then a positive-step slice,
/// then (for a tensor index) a dynamic window of size 1.
struct AxisPlan<V> {
    reverse: bool,
    start: usize,
    stop: usize,
    step: usize,
    dynamic: Option<V>,
}

impl<V> AxisPlan<V> {
    fn range(start: usize, stop: usize, step: usize) -> Self {
        AxisPlan {
            reverse: false,
            start,
            stop,
            step,
            dynamic: None,
        }
    }
}

/// numpy's `slice.indices(n)` and length: (start, step, len) over positions
/// `start + k * step`, `k < len`.
fn resolve_slice(bounds: [Option<i64>; 3], axis: usize, n: usize) -> Result<(i64, i64, usize)> {
    let [start, stop, step] = bounds;
    let step = step.unwrap_or(1);
    if step == 0 {
        return Err(Error::invalid(
            "getitem",
            format!("slice step cannot be zero (axis {axis})"),
        ));
    }
    let n = n as i64;
    let (lower, upper) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let clip = |v: Option<i64>, default: i64| match v {
        None => default,
        Some(v) if v < 0 => (v + n).max(lower),
        Some(v) => v.min(upper),
    };
    let (first, last) = if step > 0 {
        (lower, upper)
    } else {
        (upper, lower)
    };
    let (start, stop) = (clip(start, first), clip(stop, last));
    let distance = if step > 0 { stop - start } else { start - stop };
    let len = if distance > 0 {
        (distance - 1) / step.abs() + 1
    } else {
        0
    };
    Ok((start, step, len as usize))
}

/// One slice entry for an axis of size `n` as reverse + positive slice, and its length.
fn slice_plan<V>(bounds: [Option<i64>; 3], axis: usize, n: usize) -> Result<(AxisPlan<V>, usize)> {
    if n == DYN {
        return Ok((AxisPlan::range(0, n, 1), n));
    }
    let (first, step, len) = resolve_slice(bounds, axis, n)?;
    if len == 0 {
        return Ok((AxisPlan::range(0, 0, 1), 0));
    }
    // A negative step walks the reversed axis forwards, from the mirrored first position.
    let reverse = step < 0;
    let first = if reverse {
        n - 1 - first as usize
    } else {
        first as usize
    };
    let step = step.unsigned_abs() as usize;
    let plan = AxisPlan {
        reverse,
        ..AxisPlan::range(first, first + (len - 1) * step + 1, step)
    };
    Ok((plan, len))
}

fn int_plan<V>(i: i64, axis: usize, n: usize) -> Result<AxisPlan<V>> {
    let j = if i < 0 { i + n as i64 } else { i };
    if j < 0 || j >= n as i64 {
        let message = format!("index {i} is out of bounds for axis {axis} with size {n}");
        return Err(Error::index("getitem", message));
    }
    Ok(AxisPlan::range(j as usize, j as usize + 1, 1))
}

fn tensor_plan<V: Value>(t: &V, axis: usize, n: usize) -> Result<AxisPlan<V>> {
    let ty = t.ty();
    if !ty.dtype.is_int() || !ty.is_scalar() {
        let kind = if ty.dtype.is_int() {
            ErrorKind::Index
        } else {
            ErrorKind::DType
        };
        let message = format!(
            "a tensor index must be an int32 or int64 scalar, got {ty} (axis {axis}); \
             use take() to gather with an array of indices"
        );
        return Err(Error::new(kind, "getitem", message));
    }
    if n == 0 {
        let message = format!("a tensor index cannot select from axis {axis}: its size is 0");
        return Err(Error::index("getitem", message));
    }
    Ok(AxisPlan {
        dynamic: Some(t.clone()),
        ..AxisPlan::range(0, n, 1)
    })
}

/// Per-axis plans and the result's shape.
fn plan<V: Value>(shape: &[usize], items: &[IndexItem<V>]) -> Result<(Vec<AxisPlan<V>>, Shape)> {
    let ndim = shape.len();
    let count = |f: fn(&IndexItem<V>) -> bool| items.iter().filter(|it| f(it)).count();
    let ellipses = count(|it| matches!(it, IndexItem::Ellipsis));
    if ellipses > 1 {
        let message = format!("an index can only have a single ellipsis ('...'), got {ellipses}");
        return Err(Error::index("getitem", message));
    }
    let used = count(|it| !matches!(it, IndexItem::Ellipsis | IndexItem::NewAxis));
    if used > ndim {
        let message = format!(
            "too many indices for a tensor of shape {}: {used} were given",
            ShapeDisplay(shape)
        );
        return Err(Error::index("getitem", message));
    }
    let (mut plans, mut out) = (Vec::with_capacity(ndim), Shape::new());
    for item in items {
        let axis = plans.len();
        let whole = matches!(
            item,
            IndexItem::Slice {
                start: None,
                stop: None,
                step: None | Some(1)
            }
        );
        if axis < ndim
            && shape[axis] == DYN
            && !whole
            && !matches!(item, IndexItem::NewAxis | IndexItem::Ellipsis)
        {
            let message =
                format!("axis {axis} has a size unknown until run time: only ':' can index it");
            return Err(Error::shape("getitem", message));
        }
        match item {
            IndexItem::Int(i) => plans.push(int_plan(*i, axis, shape[axis])?),
            IndexItem::Tensor(t) => plans.push(tensor_plan(t, axis, shape[axis])?),
            IndexItem::Slice { start, stop, step } => {
                let (p, len) = slice_plan([*start, *stop, *step], axis, shape[axis])?;
                plans.push(p);
                out.push(len);
            }
            IndexItem::NewAxis => out.push(1),
            IndexItem::Ellipsis => {
                plans.extend(
                    shape[axis..axis + ndim - used]
                        .iter()
                        .map(|&n| AxisPlan::range(0, n, 1)),
                );
                out.extend_from_slice(&shape[axis..axis + ndim - used]);
            }
        }
    }
    out.extend_from_slice(&shape[plans.len()..]);
    plans.extend(
        shape[plans.len()..]
            .iter()
            .map(|&n| AxisPlan::range(0, n, 1)),
    );
    Ok((plans, out))
}

/// A tensor index wrapped once if negative (JAX's normalisation): `t < 0 ? t + n : t`.
fn wrap_negative<V: Value>(ctx: &mut dyn Context<V>, t: &V, n: usize) -> Result<V> {
    let dtype = t.ty().dtype;
    let zero = build::scalar(ctx, dtype, 0.0)?;
    let negative = build::less(ctx, t, &zero)?;
    let size = build::scalar(ctx, dtype, n as f64)?;
    let wrapped = build::add(ctx, t, &size)?;
    build::select(ctx, &negative, &wrapped, t)
}

/// `x[items]` with numpy basic-indexing semantics (see the module docs).
pub fn getitem<V: Value>(ctx: &mut dyn Context<V>, x: &V, items: &[IndexItem<V>]) -> Result<V> {
    let shape = x.ty().shape.clone();
    let (plans, out_shape) = plan(&shape, items)?;
    let mut y = x.clone();
    let reversed: Vec<usize> = (0..plans.len()).filter(|&d| plans[d].reverse).collect();
    if !reversed.is_empty() {
        y = build::reverse(ctx, &y, &reversed)?;
    }
    let start: Vec<usize> = plans.iter().map(|p| p.start).collect();
    let stop: Vec<usize> = plans.iter().map(|p| p.stop).collect();
    let step: Vec<usize> = plans.iter().map(|p| p.step).collect();
    if start.iter().any(|&a| a != 0)
        || stop.as_slice() != shape.as_slice()
        || step.iter().any(|&s| s != 1)
    {
        y = build::slice(ctx, &y, &start, &stop, &step)?;
    }
    if let Some(dtype) = plans
        .iter()
        .find_map(|p| p.dynamic.as_ref().map(|t| t.ty().dtype))
    {
        let mut sizes = y.ty().shape.to_vec();
        let mut starts = Vec::with_capacity(plans.len());
        for (d, p) in plans.iter().enumerate() {
            starts.push(match &p.dynamic {
                Some(t) => {
                    sizes[d] = 1;
                    wrap_negative(ctx, t, shape[d])?
                }
                None => build::scalar(ctx, dtype, 0.0)?,
            });
        }
        y = build::dynamic_slice(ctx, &y, &starts, &sizes)?;
    }
    if y.ty().shape != out_shape {
        y = build::reshape(ctx, &y, &out_shape)?;
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::IndexItem::{Ellipsis, Int, NewAxis};
    use super::*;
    use crate::ops::EagerContext;
    use crate::tensor::Tensor;
    use crate::testing::gradcheck::{check_op_gradients, expect_error, iota, ramp};

    type Item = IndexItem<Tensor>;

    fn s(start: Option<i64>, stop: Option<i64>, step: Option<i64>) -> Item {
        IndexItem::Slice { start, stop, step }
    }

    fn ti(v: i32) -> Item {
        IndexItem::Tensor(Tensor::scalar(v))
    }

    fn get(x: &Tensor, items: &[Item]) -> Result<Tensor> {
        getitem(&mut EagerContext, x, items)
    }

    #[test]
    fn one_dimensional_slices_match_python() {
        // (len, start, stop, step, list(range(len))[start:stop:step]), generated with CPython.
        type Case = (usize, Option<i64>, Option<i64>, Option<i64>, &'static [i64]);
        let cases: &[Case] = &[
            (5, Some(0), Some(9), Some(-1), &[]),
            (0, Some(2), Some(-3), Some(-2), &[]),
            (6, Some(-3), Some(1), Some(-1), &[3, 2]),
            (1, Some(1), Some(-1), Some(1), &[]),
            (6, Some(-5), Some(-5), None, &[]),
            (5, Some(-8), Some(-1), Some(2), &[0, 2]),
            (5, None, Some(0), Some(-3), &[4, 1]),
            (6, None, Some(4), Some(-3), &[5]),
            (5, Some(-1), None, Some(3), &[4]),
            (5, Some(-5), Some(-8), Some(-2), &[0]),
            (1, Some(-1), Some(2), Some(1), &[0]),
            (6, None, Some(-3), Some(-2), &[5]),
            (5, Some(-1), Some(2), Some(-2), &[4]),
            (6, Some(-5), None, Some(-2), &[1]),
            (6, Some(-8), Some(-5), Some(3), &[0]),
            (5, Some(-5), None, Some(-3), &[0]),
            (5, Some(2), Some(-1), Some(2), &[2]),
            (6, Some(4), Some(-5), Some(-2), &[4, 2]),
            (6, Some(-1), Some(4), Some(-3), &[5]),
            (5, Some(0), Some(9), Some(2), &[0, 2, 4]),
            (5, Some(1), Some(0), Some(-3), &[1]),
            (5, None, Some(-3), Some(1), &[0, 1]),
            (6, Some(5), Some(9), Some(1), &[5]),
            (6, None, None, Some(-1), &[5, 4, 3, 2, 1, 0]),
        ];
        for &(n, a, b, st, want) in cases {
            let y = get(&iota(&[n]), &[s(a, b, st)]).unwrap();
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert_eq!(y.to_f64_vec(), want, "[{a:?}:{b:?}:{st:?}] of {n}");
            assert_eq!(y.shape(), &[want.len()]);
        }
    }

    #[test]
    fn mixed_indices_match_numpy() {
        let x = iota(&[2, 3, 4]);
        let all = s(None, None, None);
        // (index, numpy's result shape, numpy's result for np.arange(24.).reshape(2, 3, 4))
        type Case<'a> = (Vec<Item>, &'a [usize], Vec<f64>);
        let cases: Vec<Case> = vec![
            (
                vec![Int(-1), s(None, None, Some(-2)), s(Some(1), Some(3), None)],
                &[2, 2],
                vec![21.0, 22.0, 13.0, 14.0],
            ),
            (
                vec![Ellipsis, NewAxis, Int(-1)],
                &[2, 3, 1],
                vec![3.0, 7.0, 11.0, 15.0, 19.0, 23.0],
            ),
            (
                vec![all.clone(), s(Some(5), Some(1), Some(-1))],
                &[2, 1, 4],
                vec![8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0],
            ),
            (
                vec![s(None, None, Some(-1)), all, s(None, None, Some(3))],
                &[2, 3, 2],
                vec![
                    12.0, 15.0, 16.0, 19.0, 20.0, 23.0, 0.0, 3.0, 4.0, 7.0, 8.0, 11.0,
                ],
            ),
            (
                vec![NewAxis, Ellipsis, s(Some(0), Some(0), None)],
                &[1, 2, 3, 0],
                vec![],
            ),
            (
                vec![s(Some(1), None, None), Int(-2)],
                &[1, 4],
                vec![16.0, 17.0, 18.0, 19.0],
            ),
            (
                vec![Int(0), s(Some(10), None, None), s(Some(-10), Some(2), None)],
                &[0, 2],
                vec![],
            ),
            (vec![Int(1), Int(2), Int(3)], &[], vec![23.0]),
            (vec![], &[2, 3, 4], x.to_f64_vec()),
        ];
        for (items, shape, want) in cases {
            let y = get(&x, &items).unwrap();
            assert_eq!((y.shape(), y.to_f64_vec()), (shape, want), "{items:?}");
        }
    }

    #[test]
    fn bad_indices_are_errors_naming_getitem() {
        let (x, vector) = (
            iota(&[2, 3]),
            Tensor::from_vec(vec![0i32, 1], &[2]).unwrap(),
        );
        let cases: Vec<(Vec<Item>, ErrorKind, &[&str])> = vec![
            (
                vec![Int(0), Int(0), Int(0)],
                ErrorKind::Index,
                &["too many indices", "[2, 3]"],
            ),
            (
                vec![Ellipsis, Int(0), Ellipsis],
                ErrorKind::Index,
                &["single ellipsis"],
            ),
            (
                vec![Int(0), Int(-4)],
                ErrorKind::Index,
                &["index -4", "axis 1", "size 3"],
            ),
            (
                vec![Int(2)],
                ErrorKind::Index,
                &["index 2", "axis 0", "size 2"],
            ),
            (
                vec![s(None, None, Some(0))],
                ErrorKind::InvalidArgument,
                &["step", "zero"],
            ),
            (
                vec![IndexItem::Tensor(Tensor::scalar(1.0f32))],
                ErrorKind::DType,
                &["float32"],
            ),
            (
                vec![IndexItem::Tensor(vector)],
                ErrorKind::Index,
                &["int32[2]", "scalar", "take"],
            ),
        ];
        for (items, kind, needles) in cases {
            expect_error(get(&x, &items), kind, "getitem", needles);
        }
        let r = get(&iota(&[2, 0]), &[Int(0), ti(0)]);
        expect_error(r, ErrorKind::Index, "getitem", &["axis 1", "size is 0"]);
    }

    #[test]
    fn tensor_indices_wrap_once_then_clamp() {
        let x = iota(&[3, 4]);
        let row = |t: Tensor| get(&x, &[IndexItem::Tensor(t)]).unwrap().to_f64_vec();
        assert_eq!(row(Tensor::scalar(1i32)), [4.0, 5.0, 6.0, 7.0]);
        assert_eq!(row(Tensor::scalar(-1i64)), [8.0, 9.0, 10.0, 11.0]);
        assert_eq!(row(Tensor::scalar(7i32)), [8.0, 9.0, 10.0, 11.0]);
        assert_eq!(row(Tensor::scalar(-9i32)), [0.0, 1.0, 2.0, 3.0]);
        let y = get(&x, &[s(Some(1), None, None), ti(-2)]).unwrap();
        assert_eq!((y.shape(), y.to_f64_vec()), (&[2][..], vec![6.0, 10.0]));
        assert_eq!(
            get(&x, &[Ellipsis, ti(0), NewAxis]).unwrap().shape(),
            &[3, 1]
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        let items = [
            Int(-1),
            s(None, None, Some(-2)),
            s(Some(1), Some(3), None),
            NewAxis,
        ];
        check_op_gradients(&|ctx, xs| getitem(ctx, &xs[0], &items), &[ramp(&[2, 3, 4])]);
        let items = [s(Some(-1), None, Some(-3)), ti(-3)];
        check_op_gradients(&|ctx, xs| getitem(ctx, &xs[0], &items), &[ramp(&[5, 3])]);
    }
}
