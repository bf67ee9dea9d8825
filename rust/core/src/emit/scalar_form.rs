//! How an op is written on rank-0 values as host scalars (`arith`/`math` ops the VM runs instead
//! of a device dispatch each; `mlir/scalar.rs` says why). Each op of the table declares its form
//! beside its StableHLO emission (`OpDef::scalar`); only forms with exactly the op's semantics
//! are declared (wrapping integer arithmetic, NaN-propagating maximum/minimum, ordered float
//! comparisons except `!=`, which is unordered, as `stablehlo.compare NE` is).

use crate::dtype::DType;
use crate::shape::{numel, TensorType, DYN};

/// An op's scalar form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarForm {
    /// `%r = <mnemonic> %a[, %b] : T`.
    Op(&'static str),
    /// `%r = arith.cmpf/cmpi <predicate>, %a, %b : T` (the result is `i1`).
    Compare(&'static str, &'static str),
    /// `%r = arith.select %c, %a, %b : T`.
    Select,
    /// `%r = arith.xori %a, true : i1`.
    Not,
    /// The operand itself (identity, stop_gradient, a cast to the same dtype).
    Same,
    /// A cast to another dtype (the emitter knows which casts the VM has).
    Convert(DType),
}

impl ScalarForm {
    /// `float` on floats, `int` on i32/i64, none on bools.
    pub fn arith(dtype: DType, float: &'static str, int: &'static str) -> Option<Self> {
        match dtype {
            DType::F32 | DType::F64 => Some(ScalarForm::Op(float)),
            DType::I32 | DType::I64 => Some(ScalarForm::Op(int)),
            DType::Bool => None,
        }
    }

    /// `float` on floats only.
    pub fn float(dtype: DType, float: &'static str) -> Option<Self> {
        dtype.is_float().then_some(ScalarForm::Op(float))
    }

    /// `op` on bools only.
    pub fn logical(dtype: DType, op: &'static str) -> Option<Self> {
        (dtype == DType::Bool).then_some(ScalarForm::Op(op))
    }

    /// A comparison: `arith.cmpf float` on floats, `arith.cmpi int` on integers and bools.
    pub fn compare(dtype: DType, float: &'static str, int: &'static str) -> Option<Self> {
        Some(if dtype.is_float() {
            ScalarForm::Compare("arith.cmpf", float)
        } else {
            ScalarForm::Compare("arith.cmpi", int)
        })
    }

    /// An ordering comparison, on numbers only.
    pub fn order(dtype: DType, float: &'static str, int: &'static str) -> Option<Self> {
        (dtype != DType::Bool)
            .then(|| Self::compare(dtype, float, int))
            .flatten()
    }
}

/// The most elements a statically shaped tensor has for the MLIR emitter to hold it as host
/// scalars, one per element (`mlir/scalar.rs`): a 2-, 3- or 4-vector (an ODE's state, a
/// position, a quaternion) costs a VM op per element and op, where a dispatch and the wait
/// for its result cost microseconds; a larger one (W5's 16 lanes) is cheaper as one dispatch.
pub const HOST_ELEMENTS: usize = 4;

/// Whether a tensor of type `t` of rank 1 or more is held as host scalars (see
/// `HOST_ELEMENTS`; rank-0 values always are).
pub fn host_elements(t: &TensorType) -> bool {
    t.ndim() > 0 && !t.shape.contains(&DYN) && (1..=HOST_ELEMENTS).contains(&numel(&t.shape))
}

/// For each element of a result of shape `out` (row-major), the flat index of the element of
/// an operand of shape `from` that implicit broadcasting reads for it.
pub fn broadcast_sources(from: &[usize], out: &[usize]) -> Vec<usize> {
    let offset = out.len() - from.len();
    let strides = crate::shape::strides(from);
    (0..numel(out))
        .map(|flat| {
            let mut rest = flat;
            let mut at = 0;
            for d in (0..out.len()).rev() {
                let i = rest % out[d];
                rest /= out[d];
                if d >= offset && from[d - offset] != 1 {
                    at += i * strides[d - offset];
                }
            }
            at
        })
        .collect()
}
