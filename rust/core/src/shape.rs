//! Shapes, the static type of a value (`TensorType`), and the shape helpers every op rule uses.
//!
//! A dimension equal to `DYN` is unknown (graph mode: a loop may change it). Eager tensors never
//! hold `DYN`; shape rules treat it as "any size" so the same rule serves eager and traced code.

use smallvec::SmallVec;
use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Dimensions, outermost first. Inline for up to 4 dimensions: no allocation on the hot path.
pub type Shape = SmallVec<[usize; 4]>;

/// An unknown dimension (graph mode only).
pub const DYN: usize = usize::MAX;

/// Dtype and shape of a value: what shape rules consume and produce.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl Clone for TensorType {
    /// A copy of the dimensions (a memcpy, where the derived clone copies one by one: every
    /// tensor clone pays it).
    fn clone(&self) -> Self {
        TensorType {
            dtype: self.dtype,
            shape: Shape::from_slice(&self.shape),
        }
    }
}

impl TensorType {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Shape::new(),
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// Formats a shape as `[2, 3]`, with `?` for unknown dimensions.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if *d == DYN {
                f.write_str("?")?;
            } else {
                write!(f, "{d}")?;
            }
        }
        f.write_str("]")
    }
}

/// Number of elements (`DYN` if any dimension is unknown).
pub fn numel(shape: &[usize]) -> usize {
    if shape.contains(&DYN) {
        DYN
    } else {
        shape.iter().product()
    }
}

/// Row-major strides in elements.
pub fn strides(shape: &[usize]) -> Shape {
    let mut out: Shape = smallvec::smallvec![0; shape.len()];
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        out[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    out
}

/// numpy broadcasting of two shapes; the error names `op` and both shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Shape> {
    let n = a.len().max(b.len());
    let mut out: Shape = smallvec::smallvec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (DYN, y) => y,
            (x, DYN) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!(
                        "operands could not be broadcast together with shapes {} and {}",
                        ShapeDisplay(a),
                        ShapeDisplay(b)
                    ),
                ))
            }
        };
    }
    Ok(out)
}

/// A possibly negative axis made absolute for a value of rank `ndim`.
pub fn normalize_axis(op: &'static str, axis: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    if axis < -n || axis >= n {
        return Err(Error::index(
            op,
            format!("axis {axis} is out of bounds for a tensor of rank {ndim}"),
        ));
    }
    Ok(if axis < 0 {
        (axis + n) as usize
    } else {
        axis as usize
    })
}

/// Axes for a reduction: `None` means all; duplicates are an error; the result is sorted.
pub fn normalize_axes(op: &'static str, axes: Option<&[i64]>, ndim: usize) -> Result<Vec<usize>> {
    let Some(axes) = axes else {
        return Ok((0..ndim).collect());
    };
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = normalize_axis(op, a, ndim)?;
        if out.contains(&a) {
            return Err(Error::invalid(
                op,
                format!("axis {a} is repeated in {axes:?}"),
            ));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes("t", &[2, 1, 3], &[4, 1])
                .unwrap()
                .as_slice(),
            &[2, 4, 3]
        );
        assert_eq!(broadcast_shapes("t", &[], &[5]).unwrap().as_slice(), &[5]);
        assert_eq!(
            broadcast_shapes("t", &[0, 1], &[1, 7]).unwrap().as_slice(),
            &[0, 7]
        );
        let err = broadcast_shapes("add", &[2, 3], &[4]).unwrap_err();
        assert!(err.to_string().contains("add"));
        assert!(err.to_string().contains("[2, 3]") && err.to_string().contains("[4]"));
    }

    #[test]
    fn unknown_dims_broadcast_against_anything() {
        assert_eq!(
            broadcast_shapes("t", &[DYN, 3], &[4, 1])
                .unwrap()
                .as_slice(),
            &[4, 3]
        );
    }

    #[test]
    fn axes_are_normalized_and_checked() {
        assert_eq!(
            normalize_axes("sum", Some(&[-1, 0]), 3).unwrap(),
            vec![0, 2]
        );
        assert!(normalize_axes("sum", Some(&[3]), 3).is_err());
        assert!(normalize_axes("sum", Some(&[1, -2]), 3).is_err());
        assert_eq!(strides(&[2, 3, 4]).as_slice(), &[12, 4, 1]);
    }
}
