//! Variable nodes: `read_variable(resource<T>) -> T`, `assign_variable(resource<T>, T) -> ()`,
//! `assign_add_variable(resource<T>, T) -> ()` (`gl.Variable` inside a traced function).
//!
//! Writes are side effects: the tracer orders them by control inputs and lists them as
//! control outputs. A float variable's cotangent is a tensor of its value type, the sum of the
//! cotangents of every value read from it (TensorFlow's resource gradients).

use crate::batch::{BatchNode, NodeBatch};
use crate::ops::Values;
use std::sync::Arc;

use crate::graph::Node;
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::{Context, Grads};
use crate::tape::GradientFunction;
use crate::trace::gradients::{is_float_resource, Differentiate};
use crate::trace::Val;
use smallvec::{smallvec, SmallVec};
use std::iter::once;

use crate::dataflow::{DfKind, Lower, LowerNode, Lowered};
use crate::error::{Error, ErrorKind, Result};
use crate::executor::{input_reader, Kernel};
use crate::graph::verify_nodes::{expect_compatible, expect_outputs, fixed, inner};
use crate::graph::{
    AttrReader, Check, Library, NodeKind, NodeRule, ParseNode, ValueType, VariableOp,
};
use crate::interpret::nodes::input_tensor;
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::passes::{PassRules, Threading};
use crate::runtime_values::RtValue;
use crate::tensor::Tensor;

impl NodeRule for VariableOp {
    fn keyword(&self) -> &'static str {
        match self {
            VariableOp::Read => "read_variable",
            VariableOp::Assign => "assign_variable",
            VariableOp::AssignAdd => "assign_add_variable",
        }
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    fn callees(&self) -> Vec<&str> {
        Vec::new()
    }

    fn has_side_effect(&self) -> bool {
        match self {
            VariableOp::Read => false,
            VariableOp::Assign | VariableOp::AssignAdd => true,
        }
    }

    fn with_callees(&self, _names: Vec<String>) -> NodeKind {
        NodeKind::Variable(*self)
    }

    fn state(&self, _library: &Library) -> Result<(bool, bool)> {
        Ok((true, self.has_side_effect()))
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let expected = self.output_types(library, ins).map_err(|e| e.message)?;
        match self {
            VariableOp::Read => {}
            VariableOp::Assign | VariableOp::AssignAdd => {
                let [res, value] = fixed::<2>(ins)?;
                let t = inner(res, "resource", "input 0")?;
                let element = ValueType::Tensor(t.clone());
                expect_compatible("assigned value (input 1)", value, &element)?;
                if *self == VariableOp::AssignAdd && !t.dtype.is_numeric() {
                    return Err(format!(
                        "assign_add_variable needs a numeric variable, got {res}"
                    ));
                }
            }
        }
        expect_outputs(outs, &expected)
    }

    fn output_types(&self, _library: &Library, ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        let graph_error = |m: String| Error::new(ErrorKind::Graph, self.keyword(), m);
        match self {
            VariableOp::Read => {
                let [res] = fixed::<1>(ins).map_err(graph_error)?;
                let t = inner(res, "resource", "input 0").map_err(graph_error)?;
                Ok(vec![ValueType::Tensor(t.clone())])
            }
            VariableOp::Assign | VariableOp::AssignAdd => Ok(Vec::new()),
        }
    }
}

impl ParseNode for VariableOp {
    const KEYWORDS: &'static [&'static str] =
        &["read_variable", "assign_variable", "assign_add_variable"];

    fn parse(keyword: &str, _attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(match keyword {
            "read_variable" => VariableOp::Read,
            "assign_variable" => VariableOp::Assign,
            _ => VariableOp::AssignAdd,
        })
    }
}

impl Interpret for VariableOp {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        match self {
            VariableOp::Read => {
                let [var] = run.fixed()?;
                let value = var.into_resource()?.read();
                Ok(run.store(once(RtValue::Tensor(value))))
            }
            VariableOp::Assign => {
                let [var, value] = run.fixed()?;
                var.into_resource()?.assign(&input_tensor(value, 1)?)?;
                Ok(run.store(None))
            }
            VariableOp::AssignAdd => {
                let [var, delta] = run.fixed()?;
                var.into_resource()?.assign_add(&input_tensor(delta, 1)?)?;
                Ok(run.store(None))
            }
        }
    }
}

impl EmitMlir for VariableOp {
    /// None: `passes::functionalize_variables` turns variables into values first.
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        _node: &Node,
        _inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let name = self.keyword();
        Err(l
            .e
            .unsupported(format!("{name} is not supported by the MLIR emitter yet")))
    }

    fn module_facts(&self, _facts: &mut ModuleFacts) {}

    /// A stack's size does not flow through a variable: nothing known.
    fn stack_pushes(&self, _flow: &PushFlow<'_>, _ins: &[Pushes], n: usize) -> Option<Vec<Pushes>> {
        Some(vec![Pushes::Unbounded; n])
    }
}

/// A Variable holds values, not tangents: a write of a value with a tangent is refused (its
/// reads would lose it), and a read has none.
impl crate::trace::tangents::Tangent for VariableOp {
    fn tangent(
        &self,
        _ctx: &mut dyn Context<Val>,
        _inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        match self {
            VariableOp::Read => Ok(None),
            VariableOp::Assign | VariableOp::AssignAdd if tangents.iter().all(Option::is_none) => {
                Ok(None)
            }
            VariableOp::Assign | VariableOp::AssignAdd => Err(Error::gradient(
                "Variable.assign",
                "a value with a tangent is assigned to a Variable: forward mode (jvp, jacfwd, \
                 hessian) does not carry tangents through Variables; return the value instead",
            )),
        }
    }
}

impl BatchNode for VariableOp {
    fn batch(
        &self,
        _cx: &mut NodeBatch<'_>,
        _inputs: &[Val],
        _batched: &[bool],
    ) -> Result<Values<Val>> {
        Err(Error::invalid(
            self.keyword(),
            "a variable holds one value: it cannot be assigned a value that differs per lane inside vmap",
        ))
    }
}

impl Differentiate for VariableOp {
    /// A read of a float variable passes its cotangent to the variable; writes have none.
    fn gradient(
        &self,
        inputs: &[Val],
        _outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(match self {
            VariableOp::Read if is_float_resource(&inputs[0].value_type()) => {
                Some(Arc::new(ReadVariableGradient))
            }
            VariableOp::Read | VariableOp::Assign | VariableOp::AssignAdd => None,
        })
    }
}

/// `read_variable(resource) -> value`: the value's cotangent is the resource's.
struct ReadVariableGradient;

impl GradientFunction<Val> for ReadVariableGradient {
    fn compute(
        &self,
        _ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        Ok(smallvec![grad_outputs[0].clone()])
    }
}

impl Lower for VariableOp {
    fn is_loop(&self) -> bool {
        false
    }

    /// One node, run by the executor's kernel for it.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let (inputs, control) = (cx.inputs.clone(), cx.control.clone());
        Ok(cx
            .b
            .single(cx.scope, DfKind::Variable(*self), cx.node, inputs, control))
    }
}

impl Kernel for VariableOp {
    fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>> {
        let mut next = input_reader(self.keyword(), inputs);
        let var = next()?.into_resource()?;
        match self {
            VariableOp::Read => return Ok(smallvec![RtValue::Tensor(var.read())]),
            VariableOp::Assign => var.assign(&input_tensor(next()?, 1)?)?,
            VariableOp::AssignAdd => var.assign_add(&input_tensor(next()?, 1)?)?,
        }
        Ok(SmallVec::new())
    }
}

impl PassRules for VariableOp {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::NoCallees
    }

    fn constant_choice(&self, _selector: &Tensor) -> Result<Option<usize>> {
        Ok(None)
    }
}
