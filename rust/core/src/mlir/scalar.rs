//! Detensoring: rank-0 values as MLIR scalars (`f64`, `i32`, `i1`, ...) instead of `tensor<..>`.
//!
//! IREE runs `scf` control flow on the host and every StableHLO op as a device dispatch, even on
//! a `tensor<f64>`: a loop whose counter, predicate and state are scalars pays a dispatch, a
//! fence and a read-back per op and iteration. Scalar `arith` /
//! `math` ops instead run in IREE's VM on the host, tens of nanoseconds each (IREE's own
//! detensoring pass is off by default since 3.x). So:
//!
//! * a rank-0 value crossing a region boundary (`scf.while` loop variables, `scf.if` results,
//!   block arguments) is always a scalar — see `function::flat_types`;
//! * an elementwise op whose inputs are all rank-0, one of them already a scalar, is emitted as
//!   the `arith` / `math` op the op table declares for it beside its StableHLO
//!   (`OpDef::scalar`, `emit::ScalarForm`), when it has one; any other op gets its rank-0
//!   operands back as tensors (`tensor.from_elements`), so its StableHLO is unchanged.
//!
//! Where control flow carries a rank-0 value (block arguments, `scf.yield`, `scf.condition`),
//! it is 64 bits wide: `f64` and `i64` as they are, `f32` as its bits in an `i64`, `i32` and
//! `i1` extended to `i64` (`carrier_type`, `widen`, `narrow`). IREE 3.13's VM register
//! allocator orders the moves of a branch's operands without seeing that a 64-bit register
//! pair overlaps a 32-bit register, so a loop carrying both an `f32` and an `i64` could read
//! one's bits as the other's (wrong numbers, or a stack popped past its end). With every carried
//! scalar the same width the moves cannot overlap; the casts cost a VM op each.
//!
use super::emitter::{element_type, scalar_literal, MlirValue, TypeText};
use super::function::{Bound, Lowering};
use crate::dtype::DType;
use crate::emit::ScalarForm as Form;
use crate::error::Result;
use crate::ops::Op;
use crate::shape::TensorType;

/// The scalar form of `op` on operands of dtype `dtype` (the op table's `OpDef::scalar`), if it
/// has one that IREE's VM runs: a cast it lacks (`host_cast`) stays a StableHLO convert.
fn form(op: &Op, dtype: DType) -> Option<Form> {
    match op.scalar(dtype)? {
        Form::Convert(to) if !host_cast(dtype, to) => None,
        form => Some(form),
    }
}

/// Whether IREE 3.13's VM has a cast from `from` to `to`: it has none from `f64` to an
/// integer or to `f32`, nor from `i32` or `i1` to `f64` ("failed to legalize arith.fptosi"),
/// so those stay StableHLO converts (a dispatch each).
fn host_cast(from: DType, to: DType) -> bool {
    use DType::*;
    !matches!((from, to), (F64, I32 | I64 | F32) | (I32 | Bool, F64))
}

/// `arith` conversion of a scalar from `from` to `to` (different dtypes).
fn conversion(from: DType, to: DType) -> &'static str {
    use DType::*;
    match (from, to) {
        (F32, F64) => "arith.extf",
        (F64, F32) => "arith.truncf",
        (I32 | I64, F32 | F64) => "arith.sitofp",
        (Bool, F32 | F64) => "arith.uitofp",
        (F32 | F64, I32 | I64) => "arith.fptosi",
        (I32, I64) => "arith.extsi",
        (Bool, I32 | I64) => "arith.extui",
        _ => "arith.trunci", // i64 -> i32
    }
}

/// Whether a rank-0 value of `dtype` is carried in a wider `i64` (see the module doc).
fn widened(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::I32 | DType::Bool)
}

/// The MLIR type control flow carries a rank-0 value of `dtype` as (see the module doc).
pub(crate) fn carrier_type(dtype: DType) -> &'static str {
    if widened(dtype) {
        "i64"
    } else {
        element_type(dtype)
    }
}

impl Lowering<'_> {
    /// The scalar `x` of `dtype` as control flow carries it.
    pub(crate) fn widen(&mut self, x: &str, dtype: DType) -> String {
        if let Some(carried) = self.narrowed.get(x) {
            return carried.clone();
        }
        let steps: &[&str] = match dtype {
            DType::F32 => &[
                "arith.bitcast {} : f32 to i32",
                "arith.extui {} : i32 to i64",
            ],
            DType::I32 => &["arith.extsi {} : i32 to i64"],
            DType::Bool => &["arith.extui {} : i1 to i64"],
            _ => &[],
        };
        self.chain(x, steps)
    }

    /// The scalar of `dtype` that `widen` carried as `x`.
    pub(crate) fn narrow(&mut self, x: &str, dtype: DType) -> String {
        let steps: &[&str] = match dtype {
            DType::F32 => &[
                "arith.trunci {} : i64 to i32",
                "arith.bitcast {} : i32 to f32",
            ],
            DType::I32 => &["arith.trunci {} : i64 to i32"],
            DType::Bool => &["arith.trunci {} : i64 to i1"],
            _ => &[],
        };
        let value = self.chain(x, steps);
        if value != x {
            self.narrowed.insert(value.clone(), x.to_string());
        }
        value
    }

    /// `x` through one-operand ops, each written with `{}` for its operand.
    fn chain(&mut self, x: &str, steps: &[&str]) -> String {
        let mut value = x.to_string();
        for step in steps {
            let name = self.e.fresh();
            let loc = self.e.loc();
            let body = step.replace("{}", &value);
            self.e.line(&format!("{name} = {body} {loc}"));
            value = name;
        }
        value
    }

    /// The operands of `op` as tensors for its StableHLO form. A cast the VM lacks
    /// (`host_cast`) of a scalar gets its operand through a `stablehlo.optimization_barrier`:
    /// IREE 3.13 otherwise folds `convert(from_elements(x))` back into the very `arith` cast
    /// its VM cannot run.
    pub(crate) fn tensor_operands(
        &mut self,
        op: &Op,
        inputs: Vec<Bound>,
    ) -> Result<Vec<MlirValue>> {
        // In pure StableHLO rank-0 values are tensors, and IREE's own detensoring makes the
        // same casts host `arith` ops its VM cannot run: the barrier keeps them on the device.
        let pure = self.e.options.pure_stablehlo;
        let device_cast = |b: &Bound| match (op, b) {
            (Op::Cast(c), Bound::Scalar(v)) => !host_cast(v.ty.dtype, c.to),
            (Op::Cast(c), Bound::Tensor(v)) if pure && v.ty.ndim() == 0 => {
                !host_cast(v.ty.dtype, c.to)
            }
            _ => false,
        };
        inputs
            .iter()
            .map(|b| {
                let t = self.tensor_input(b)?;
                if !device_cast(b) {
                    return Ok(t);
                }
                let body = format!("stablehlo.optimization_barrier {t} : {}", TypeText(&t.ty));
                Ok(self.e.op(&body, &t.ty))
            })
            .collect()
    }

    /// `op` on scalars when its inputs are all rank-0, at least one already a scalar, and the
    /// table has its form; `None` leaves it to the StableHLO path.
    pub(crate) fn try_scalar_op(
        &mut self,
        op: &Op,
        inputs: &[Bound],
        outputs: &[TensorType],
    ) -> Result<Option<Vec<Bound>>> {
        let rank0 = |b: &Bound| {
            matches!(b, Bound::Scalar(_)) || b.tensor_type().is_some_and(|t| t.ndim() == 0)
        };
        if self.e.options.pure_stablehlo {
            return Ok(None);
        }
        let any_scalar = inputs.iter().any(|b| matches!(b, Bound::Scalar(_)));
        // constants, and ops IREE folds to one (`fill`), are no device values
        let on_device = |b: &Bound| matches!(b, Bound::Tensor(v) if !self.e.is_constant(v));
        if self.device_rank0 && inputs.iter().any(on_device) {
            return Ok(None);
        }
        if !any_scalar || !inputs.iter().all(rank0) || outputs.len() != 1 || outputs[0].ndim() != 0
        {
            return Ok(None);
        }
        // select's operand dtype is that of its value operands, not the bool condition
        let operand = match op {
            Op::Select(_) => inputs.get(1),
            _ => inputs.first(),
        };
        let Some(dtype) = operand.and_then(Bound::tensor_type).map(|t| t.dtype) else {
            return Ok(None);
        };
        let Some(form) = form(op, dtype) else {
            return Ok(None);
        };
        let args = inputs
            .iter()
            .map(|b| self.scalar_input(b))
            .collect::<Result<Vec<String>>>()?;
        let out = &outputs[0];
        let ty = element_type(dtype);
        let body = match form {
            Form::Same => return Ok(Some(vec![Bound::Scalar(scalar_value(&args[0], out))])),
            Form::Op(mnemonic) => format!("{mnemonic} {} : {ty}", args.join(", ")),
            Form::Compare(mnemonic, predicate) => {
                format!("{mnemonic} {predicate}, {}, {} : {ty}", args[0], args[1])
            }
            Form::Select => format!("arith.select {}, {}, {} : {ty}", args[0], args[1], args[2]),
            Form::Not => {
                let t = self.scalar_constant(DType::Bool, 1.0);
                format!("arith.xori {}, {t} : i1", args[0])
            }
            Form::Convert(DType::Bool) => {
                let zero = self.scalar_constant(dtype, 0.0);
                let (mnemonic, predicate) = if dtype.is_float() {
                    ("arith.cmpf", "une")
                } else {
                    ("arith.cmpi", "ne")
                };
                format!("{mnemonic} {predicate}, {}, {zero} : {ty}", args[0])
            }
            Form::Convert(to) => format!(
                "{} {} : {ty} to {}",
                conversion(dtype, to),
                args[0],
                element_type(to)
            ),
        };
        let name = self.e.fresh();
        let loc = self.e.loc();
        self.e.line(&format!("{name} = {body} {loc}"));
        Ok(Some(vec![Bound::Scalar(scalar_value(&name, out))]))
    }

    /// `arith.constant` of a scalar.
    pub(crate) fn scalar_constant(&mut self, dtype: DType, value: f64) -> String {
        let name = self.e.fresh();
        let loc = self.e.loc();
        // A bool attribute takes no type suffix (`arith.constant true : i1` does not parse).
        let literal = match dtype {
            DType::Bool => scalar_literal(value, dtype),
            _ => format!("{} : {}", scalar_literal(value, dtype), element_type(dtype)),
        };
        self.e
            .line(&format!("{name} = arith.constant {literal} {loc}"));
        name
    }

    /// The host bool `n >= k` of an int64 scalar `n` (a loop's trip test).
    pub(crate) fn at_least(&mut self, n: &Bound, k: usize) -> Result<Bound> {
        let n = self.scalar_input(n)?;
        let k = self.scalar_constant(DType::I64, k as f64);
        let name = self.e.fresh();
        let loc = self.e.loc();
        self.e
            .line(&format!("{name} = arith.cmpi sge, {n}, {k} : i64 {loc}"));
        Ok(Bound::Scalar(scalar_value(
            &name,
            &TensorType::scalar(DType::Bool),
        )))
    }

    /// The scalar SSA name of a rank-0 value (`tensor.extract` of a rank-0 tensor).
    pub(crate) fn scalar_input(&mut self, b: &Bound) -> Result<String> {
        match b {
            Bound::Scalar(v) => Ok(v.name.clone()),
            Bound::Tensor(v) if v.ty.ndim() == 0 => Ok(self.e.extract_scalar(v)),
            _ => Err(self.e.bug(format!("{b:?} is not a rank-0 value"))),
        }
    }
}

fn scalar_value(name: &str, ty: &TensorType) -> MlirValue {
    MlirValue {
        name: name.to_string(),
        ty: ty.clone(),
    }
}
