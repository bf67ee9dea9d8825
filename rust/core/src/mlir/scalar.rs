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
//! Small tensors of static shape (at most `emit::HOST_ELEMENTS` elements: an ODE's 2-state, a
//! position, a quaternion) are held the same way, one scalar per element (`Bound::Elements`):
//! carried through regions as that many scalars, pushed onto host lists (`stacks.rs`), and
//! computed on the host where an op's inputs and result are all rank-0 or small and one input
//! is already there: elementwise ops element by element (broadcasting as the op does), ops
//! that move elements (`OpDef::same_elements`, `OpDef::gather_table`: reshapes, slices, pads,
//! concatenations, broadcasts) by renaming, reductions (`OpDef::fold`) as chains of their
//! combining op. W11, an adaptive ODE solve whose float64[2] state went through a dispatch and
//! a read-back per op, ran several times faster so (`docs/notes.md`). Pure StableHLO keeps
//! every tensor.
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
use super::function::{host_value, Bound, Lowering};
use crate::dtype::DType;
use crate::emit::ScalarForm as Form;
use crate::emit::{broadcast_sources, host_elements};
use crate::error::Result;
use crate::ops::Op;
use crate::shape::{numel, TensorType};

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
            (Op::Cast(c), Bound::Elements { ty, .. }) => !host_cast(ty.dtype, c.to),
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

    /// `op` on host scalars when its inputs and result are rank-0 or small (`host_elements`),
    /// at least one input is already on the host, and the op has a host form: elementwise
    /// (its `ScalarForm` per element, broadcasting as the op does), moving elements (a reshape,
    /// a gather table) or folding them (a reduction). `None` leaves it to the StableHLO path.
    pub(crate) fn try_scalar_op(
        &mut self,
        op: &Op,
        inputs: &[Bound],
        outputs: &[TensorType],
    ) -> Result<Option<Vec<Bound>>> {
        let small = |t: &TensorType| t.ndim() == 0 || host_elements(t);
        if self.e.options.pure_stablehlo || !inputs.iter().any(Bound::on_host) {
            return Ok(None);
        }
        let [out] = outputs else {
            return Ok(None);
        };
        if !small(out) || !inputs.iter().all(|b| b.tensor_type().is_some_and(small)) {
            return Ok(None);
        }
        // constants, and ops IREE folds to one (`fill`), are no device values
        let on_device = |b: &Bound| matches!(b, Bound::Tensor(v) if !self.e.is_constant(v));
        if self.device_rank0 && inputs.iter().any(on_device) {
            return Ok(None);
        }
        let types: Vec<TensorType> = inputs
            .iter()
            .filter_map(Bound::tensor_type)
            .cloned()
            .collect();
        // select's operand dtype is that of its value operands, not the bool condition
        let operand = match op {
            Op::Select(_) => types.get(1),
            _ => types.first(),
        };
        let Some(dtype) = operand.map(|t| t.dtype) else {
            return Ok(None);
        };
        let names = if let Some(form) = form(op, dtype) {
            let sources: Vec<Vec<usize>> = types
                .iter()
                .map(|t| broadcast_sources(&t.shape, &out.shape))
                .collect();
            let elements = self.all_elements(inputs)?;
            let mut names = Vec::with_capacity(numel(&out.shape));
            for j in 0..numel(&out.shape) {
                let args: Vec<String> = elements
                    .iter()
                    .zip(&sources)
                    .map(|(xs, at)| xs[at[j]].clone())
                    .collect();
                names.push(self.scalar_line(form, &args, dtype)?);
            }
            names
        } else if op.same_elements() {
            self.element_inputs(&inputs[0])?
        } else if let Some(table) = op.gather_table(&types, out) {
            let elements = self.all_elements(inputs)?;
            let mut zero = None;
            let mut names = Vec::with_capacity(table.len());
            for entry in table {
                names.push(match entry {
                    Some((i, k)) => elements[i as usize][k as usize].clone(),
                    None => zero
                        .get_or_insert_with(|| self.scalar_constant(out.dtype, 0.0))
                        .clone(),
                });
            }
            names
        } else if let Some((form, axes)) = op.fold(dtype) {
            let xs = self.element_inputs(&inputs[0])?;
            let shape = &types[0].shape;
            let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
            let mut groups: Vec<Option<String>> = vec![None; numel(&out.shape)];
            for (k, x) in xs.iter().enumerate() {
                let index = unravel(k, shape);
                let g = kept.iter().fold(0, |g, &d| g * shape[d] + index[d]);
                groups[g] = Some(match groups[g].take() {
                    None => x.clone(),
                    Some(acc) => self.scalar_line(form, &[acc, x.clone()], dtype)?,
                });
            }
            let names: Option<Vec<String>> = groups.into_iter().collect();
            let Some(names) = names else {
                return Ok(None); // a group of no elements: the StableHLO has its identity
            };
            names
        } else {
            return Ok(None);
        };
        Ok(Some(vec![host_value(names, out.clone())]))
    }

    /// The elements of each of `inputs` as host scalars.
    fn all_elements(&mut self, inputs: &[Bound]) -> Result<Vec<Vec<String>>> {
        inputs.iter().map(|b| self.element_inputs(b)).collect()
    }

    /// One host op of `form` on the scalars `args` (of dtype `dtype`): the name of its result.
    fn scalar_line(&mut self, form: Form, args: &[String], dtype: DType) -> Result<String> {
        let ty = element_type(dtype);
        let body = match form {
            Form::Same => return Ok(args[0].clone()),
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
        Ok(name)
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

    /// The elements of a rank-0 or small value as host scalars, row-major (`tensor.extract`s
    /// of a tensor: a constant's fold away, a device value's wait for it).
    pub(crate) fn element_inputs(&mut self, b: &Bound) -> Result<Vec<String>> {
        match b {
            Bound::Elements { names, .. } => Ok(names.clone()),
            Bound::Tensor(v) if v.ty.ndim() > 0 && host_elements(&v.ty) => {
                let loc = self.e.loc();
                let mut names = Vec::with_capacity(numel(&v.ty.shape));
                for k in 0..numel(&v.ty.shape) {
                    let at: Vec<String> = unravel(k, &v.ty.shape)
                        .into_iter()
                        .map(|i| self.index(i))
                        .collect();
                    let name = self.e.fresh();
                    self.e.line(&format!(
                        "{name} = tensor.extract {v}[{}] : {} {loc}",
                        at.join(", "),
                        TypeText(&v.ty)
                    ));
                    names.push(name);
                }
                Ok(names)
            }
            other => Ok(vec![self.scalar_input(other)?]),
        }
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

/// The index of flat element `k` of a row-major tensor of `shape`.
fn unravel(mut k: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        index[d] = k % shape[d];
        k /= shape[d];
    }
    index
}

fn scalar_value(name: &str, ty: &TensorType) -> MlirValue {
    MlirValue {
        name: name.to_string(),
        ty: ty.clone(),
    }
}
