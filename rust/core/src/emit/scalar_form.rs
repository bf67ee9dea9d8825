//! How an op is written on rank-0 values as host scalars (`arith`/`math` ops the VM runs instead
//! of a device dispatch each; `mlir/scalar.rs` says why). Each op of the table declares its form
//! beside its StableHLO emission (`OpDef::scalar`); only forms with exactly the op's semantics
//! are declared (wrapping integer arithmetic, NaN-propagating maximum/minimum, ordered float
//! comparisons except `!=`, which is unordered, as `stablehlo.compare NE` is).

use crate::dtype::DType;

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
