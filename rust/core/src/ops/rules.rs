//! Shape/dtype rule helpers shared by op families. Messages name the op, what it got and what
//! it expected.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{broadcast_shapes, TensorType};

/// Which dtypes an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    Float,
    Numeric,
    Bool,
    /// int32 and int64 (bitwise ops).
    Integer,
    Any,
}

impl Accepts {
    pub fn allows(self, dtype: DType) -> bool {
        match self {
            Accepts::Float => dtype.is_float(),
            Accepts::Numeric => dtype.is_numeric(),
            Accepts::Bool => dtype == DType::Bool,
            Accepts::Integer => matches!(dtype, DType::I32 | DType::I64),
            Accepts::Any => true,
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Accepts::Float => "a float tensor (float32 or float64)",
            Accepts::Numeric => "a numeric tensor (float32, float64, int32 or int64)",
            Accepts::Bool => "a bool tensor",
            Accepts::Integer => "an integer tensor (int32 or int64)",
            Accepts::Any => "a tensor",
        }
    }
}

/// Checks that `t` has a dtype the op accepts.
pub fn check_dtype(op: &'static str, accepts: Accepts, t: &TensorType) -> Result<()> {
    if accepts.allows(t.dtype) {
        return Ok(());
    }
    Err(Error::dtype(
        op,
        format!(
            "expected {}, got {} with shape {}",
            accepts.expected(),
            t.dtype,
            shape_str(t)
        ),
    ))
}

/// Both operands must have the same dtype (no implicit promotion).
pub fn check_same_dtype(op: &'static str, a: &TensorType, b: &TensorType) -> Result<()> {
    if a.dtype == b.dtype {
        return Ok(());
    }
    Err(Error::dtype(
        op,
        format!(
            "operands must have the same dtype, got {a} and {b}; cast one of them (gl.cast) first"
        ),
    ))
}

/// The type of a broadcasting binary op's result, with dtype `out` (None: the inputs' dtype).
pub fn broadcast_binary(
    op: &'static str,
    accepts: Accepts,
    inputs: &[TensorType],
    out: Option<DType>,
) -> Result<TensorType> {
    super::expect_arity(op, inputs, 2)?;
    let (a, b) = (&inputs[0], &inputs[1]);
    check_same_dtype(op, a, b)?;
    check_dtype(op, accepts, a)?;
    let shape = broadcast_shapes(op, &a.shape, &b.shape)?;
    Ok(TensorType {
        dtype: out.unwrap_or(a.dtype),
        shape,
    })
}

pub fn shape_str(t: &TensorType) -> String {
    crate::shape::ShapeDisplay(&t.shape).to_string()
}
