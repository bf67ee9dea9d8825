//! Elementwise ops that native code computes itself: those whose scalar form (`OpDef::scalar`,
//! declared beside each op's kernel with exactly its semantics) is one or a few machine
//! instructions, on tensors of static types read as they are or broadcast from one element.
//! Runs of ops over the same lanes are computed in one pass (`fused`); an op outside a run is
//! unrolled over a small tensor and calls its kernel over a larger one.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, InstBuilder, Type, Value};
use cranelift_frontend::FunctionBuilder;
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::emit::ScalarForm;
use crate::executor::tiers::{fused_passes, UNROLL_AT_MOST};
use crate::ops::dest::Source;
use crate::ops::Op;
use crate::shape::{numel, TensorType};

/// An op computed inline: its form, operand and result dtypes, elements, and per operand
/// whether it is one element broadcast to all.
#[derive(Clone, Debug)]
pub(crate) struct Elementwise {
    pub form: ScalarForm,
    pub operands: SmallVec<[DType; 3]>,
    pub result: DType,
    pub elements: usize,
    pub broadcast: SmallVec<[bool; 3]>,
}

impl Elementwise {
    /// `op` on `inputs` giving `output`, when native code computes it inline.
    pub fn of(op: &Op, inputs: &[TensorType], output: &TensorType) -> Option<Elementwise> {
        let elements = numel(&output.shape);
        if inputs.is_empty() || elements == 0 {
            return None;
        }
        // `where`'s form is declared on its value operands' dtype.
        let dtype = inputs[inputs.len() - 1].dtype;
        let form = op.scalar(dtype)?;
        let broadcast = inputs
            .iter()
            .map(|t| match Source::of(&t.shape, &output.shape)? {
                Source::Same => Some(false),
                Source::One => Some(true),
                Source::Table(_) => None,
            })
            .collect::<Option<SmallVec<_>>>()?;
        let e = Elementwise {
            form,
            operands: inputs.iter().map(|t| t.dtype).collect(),
            result: output.dtype,
            elements,
            broadcast,
        };
        e.lowers().then_some(e)
    }

    /// Whether it may join a fused run (`runs::run_at`): over enough lanes.
    pub fn fuses(&self) -> bool {
        self.elements >= fused_passes().from_elements
    }

    /// Whether, outside a fused run, it runs inline, unrolled (else it calls its kernel).
    pub fn unrolls(&self) -> bool {
        self.elements <= UNROLL_AT_MOST
    }

    /// Whether `apply` has this form for these dtypes.
    fn lowers(&self) -> bool {
        let arity = self.operands.len();
        match self.form {
            ScalarForm::Op(name) => op_arity(name) == Some(arity) && self.operands_are(self.result),
            ScalarForm::Compare(_, predicate) => {
                arity == 2
                    && self.result == DType::Bool
                    && self.operands[0] == self.operands[1]
                    && compare_code(self.operands[0], predicate).is_some()
            }
            ScalarForm::Select => {
                arity == 3
                    && self.operands[0] == DType::Bool
                    && self.operands[1] == self.result
                    && self.operands[2] == self.result
            }
            ScalarForm::Not => arity == 1 && self.operands_are(DType::Bool),
            ScalarForm::Same => arity == 1 && self.operands_are(self.result),
            ScalarForm::Convert(_) => false,
        }
    }

    fn operands_are(&self, dtype: DType) -> bool {
        self.operands.iter().all(|&d| d == dtype)
    }

    /// Lanes per 16-byte vector where the form is one vector instruction, else 1.
    pub fn lanes(&self) -> usize {
        let vector = match self.form {
            ScalarForm::Op(name) => match self.result {
                DType::F32 | DType::F64 => matches!(
                    name,
                    "arith.addf"
                        | "arith.subf"
                        | "arith.mulf"
                        | "arith.divf"
                        | "arith.negf"
                        | "math.absf"
                        | "math.sqrt"
                ),
                DType::I32 => matches!(name, "arith.addi" | "arith.subi" | "arith.muli"),
                DType::I64 => matches!(name, "arith.addi" | "arith.subi"),
                DType::Bool => false,
            },
            ScalarForm::Same => true,
            _ => false,
        };
        if vector {
            16 / self.result.size()
        } else {
            1
        }
    }
}

/// The machine type of one element of `dtype` (a bool is a byte, 0 or 1).
pub fn scalar_type(dtype: DType) -> Type {
    match dtype {
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::Bool => types::I8,
    }
}

/// `lanes` elements of `dtype` as one value.
pub fn value_type(dtype: DType, lanes: usize) -> Type {
    let scalar = scalar_type(dtype);
    if lanes == 1 {
        scalar
    } else {
        scalar.by(lanes as u32).unwrap_or(scalar)
    }
}

fn op_arity(name: &str) -> Option<usize> {
    match name {
        "arith.addf" | "arith.subf" | "arith.mulf" | "arith.divf" | "arith.maximumf"
        | "arith.minimumf" | "arith.addi" | "arith.subi" | "arith.muli" | "arith.maxsi"
        | "arith.minsi" | "arith.andi" | "arith.ori" => Some(2),
        "arith.negf" | "math.absf" | "math.absi" | "math.sqrt" | "math.floor" | "math.ceil"
        | "math.roundeven" => Some(1),
        _ => None,
    }
}

enum Code {
    Float(FloatCC),
    Int(IntCC),
}

fn compare_code(dtype: DType, predicate: &str) -> Option<Code> {
    if dtype.is_float() {
        Some(Code::Float(match predicate {
            "oeq" => FloatCC::Equal,
            // Unordered or unequal: NaN != x, as `x != y` in Rust.
            "une" => FloatCC::NotEqual,
            "olt" => FloatCC::LessThan,
            "ole" => FloatCC::LessThanOrEqual,
            "ogt" => FloatCC::GreaterThan,
            "oge" => FloatCC::GreaterThanOrEqual,
            _ => return None,
        }))
    } else {
        Some(Code::Int(match predicate {
            "eq" => IntCC::Equal,
            "ne" => IntCC::NotEqual,
            "slt" => IntCC::SignedLessThan,
            "sle" => IntCC::SignedLessThanOrEqual,
            "sgt" => IntCC::SignedGreaterThan,
            "sge" => IntCC::SignedGreaterThanOrEqual,
            _ => return None,
        }))
    }
}

/// The form applied to `args` (scalars, or vectors where `lanes` said so); `None` where
/// `lowers` would have refused it.
pub fn apply(b: &mut FunctionBuilder, e: &Elementwise, args: &[Value]) -> Option<Value> {
    Some(match e.form {
        ScalarForm::Op(name) => {
            // A unary form never reads `y`.
            let (x, y) = (args[0], args.get(1).copied().unwrap_or(args[0]));
            let y = || y;
            match name {
                "arith.addf" => b.ins().fadd(x, y()),
                "arith.subf" => b.ins().fsub(x, y()),
                "arith.mulf" => b.ins().fmul(x, y()),
                "arith.divf" => b.ins().fdiv(x, y()),
                "arith.addi" => b.ins().iadd(x, y()),
                "arith.subi" => b.ins().isub(x, y()),
                "arith.muli" => b.ins().imul(x, y()),
                "arith.maxsi" => b.ins().smax(x, y()),
                "arith.minsi" => b.ins().smin(x, y()),
                "arith.andi" => b.ins().band(x, y()),
                "arith.ori" => b.ins().bor(x, y()),
                // The kernels' `x >= y || x is NaN ? x : y` (numpy's maximum, -0 against +0
                // included), not the machine's max.
                "arith.maximumf" | "arith.minimumf" => {
                    let order = if name == "arith.maximumf" {
                        FloatCC::GreaterThanOrEqual
                    } else {
                        FloatCC::LessThanOrEqual
                    };
                    let keep = b.ins().fcmp(order, x, y());
                    let nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                    let keep = b.ins().bor(keep, nan);
                    b.ins().select(keep, x, y())
                }
                "arith.negf" => b.ins().fneg(x),
                "math.absf" => b.ins().fabs(x),
                "math.absi" => b.ins().iabs(x),
                "math.sqrt" => b.ins().sqrt(x),
                "math.floor" => b.ins().floor(x),
                "math.ceil" => b.ins().ceil(x),
                "math.roundeven" => b.ins().nearest(x),
                _ => return None,
            }
        }
        ScalarForm::Compare(_, predicate) => match compare_code(e.operands[0], predicate)? {
            Code::Float(cc) => b.ins().fcmp(cc, args[0], args[1]),
            Code::Int(cc) => b.ins().icmp(cc, args[0], args[1]),
        },
        ScalarForm::Select => b.ins().select(args[0], args[1], args[2]),
        ScalarForm::Not => b.ins().bxor_imm_u(args[0], 1),
        ScalarForm::Same => args[0],
        ScalarForm::Convert(_) => return None,
    })
}
