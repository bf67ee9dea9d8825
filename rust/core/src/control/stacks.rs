//! Stack nodes: `stack_new() -> stack<T>`, `stack_push(stack<T>, T) -> stack<T>`,
//! `stack_pop(stack<T>) -> (stack<T>, T)`. A stack is a value threaded functionally (a loop
//! carries it as a loop variable): the loop gradient's residuals. Push and pop are each
//! other's transpose, so a gradient loop differentiates again.

use crate::batch::{BatchNode, NodeBatch};
use crate::ops::Values;
use std::sync::Arc;

use crate::graph::Node;
use crate::graph::NodeKind;
use crate::mlir::function::{one, two};
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::{build, Context, Grads};
use crate::tape::GradientFunction;
use crate::trace::gradients::Differentiate;
use crate::trace::Val;
use crate::value::Value;
use smallvec::{smallvec, SmallVec};
use std::iter::once;

use crate::dataflow::{DfKind, Lower, LowerNode, Lowered};
use crate::error::{Error, ErrorKind, Result};
use crate::executor::{input_reader, Kernel};
use crate::graph::text::TypeText;
use crate::graph::verify_nodes::{arity, expect_compatible, expect_outputs, fixed, inner};
use crate::graph::{AttrReader, Check, Library, NodeRule, ParseNode, StackOp, ValueType};
use crate::interpret::nodes::input_tensor;
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::passes::{PassRules, Threading};
use crate::runtime_values::{RtValue, StackValue};
use crate::tensor::Tensor;

impl NodeRule for StackOp {
    fn keyword(&self) -> &'static str {
        match self {
            StackOp::New { .. } => "stack_new",
            StackOp::Push => "stack_push",
            StackOp::Pop => "stack_pop",
            StackOp::Add => "stack_add",
        }
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        match self {
            StackOp::New { element } => vec![("element", TypeText(element).to_string())],
            StackOp::Push | StackOp::Pop | StackOp::Add => Vec::new(),
        }
    }

    fn callees(&self) -> Vec<&str> {
        Vec::new()
    }

    fn with_callees(&self, _names: Vec<String>) -> NodeKind {
        NodeKind::Stack(self.clone())
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let expected = self.output_types(library, ins).map_err(|e| e.message)?;
        if let StackOp::Push = self {
            let [stack, value] = fixed::<2>(ins)?;
            let element = ValueType::Tensor(inner(stack, "stack", "input 0")?.clone());
            expect_compatible("pushed value (input 1)", value, &element)?;
        }
        if let StackOp::Add = self {
            let [a, b] = fixed::<2>(ins)?;
            expect_compatible("stack_add input 1", b, a)?;
        }
        expect_outputs(outs, &expected)
    }

    fn output_types(&self, _library: &Library, ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        let graph_error = |m: String| Error::new(ErrorKind::Graph, self.keyword(), m);
        match self {
            StackOp::New { element } => {
                arity(ins, 0).map_err(graph_error)?;
                Ok(vec![ValueType::Stack(element.clone())])
            }
            StackOp::Push => {
                let [stack, _] = fixed::<2>(ins).map_err(graph_error)?;
                inner(stack, "stack", "input 0").map_err(graph_error)?;
                Ok(vec![stack.clone()])
            }
            StackOp::Pop => {
                let [stack] = fixed::<1>(ins).map_err(graph_error)?;
                let t = inner(stack, "stack", "input 0").map_err(graph_error)?;
                Ok(vec![stack.clone(), ValueType::Tensor(t.clone())])
            }
            StackOp::Add => {
                let [a, b] = fixed::<2>(ins).map_err(graph_error)?;
                inner(a, "stack", "input 0").map_err(graph_error)?;
                inner(b, "stack", "input 1").map_err(graph_error)?;
                Ok(vec![a.clone()])
            }
        }
    }
}

impl ParseNode for StackOp {
    const KEYWORDS: &'static [&'static str] =
        &["stack_new", "stack_push", "stack_pop", "stack_add"];

    fn parse(keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(match keyword {
            "stack_new" => StackOp::New {
                element: attrs.tensor_type("element")?,
            },
            "stack_push" => StackOp::Push,
            "stack_add" => StackOp::Add,
            _ => StackOp::Pop,
        })
    }
}

impl Interpret for StackOp {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        match self {
            StackOp::New { element } => {
                let [] = run.fixed()?;
                let stack = RtValue::Stack(StackValue::new(element.clone()));
                Ok(run.store(once(stack)))
            }
            StackOp::Push => {
                let [stack, value] = run.fixed()?;
                Ok(run.store(once(push(stack, value)?)))
            }
            StackOp::Pop => {
                let [stack] = run.fixed()?;
                Ok(run.store(pop(stack)?))
            }
            StackOp::Add => {
                let [a, b] = run.fixed()?;
                Ok(run.store(once(add(a, b)?)))
            }
        }
    }
}

impl EmitMlir for StackOp {
    /// A growable buffer and a size, or a `!util.list` (`mlir::stacks`).
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        match self {
            StackOp::New { element } => Ok(vec![l.stack_new(element)?]),
            StackOp::Push => {
                let [stack, value] = two(l, inputs)?;
                Ok(vec![l.stack_push(stack, value)?])
            }
            StackOp::Pop => {
                let element = node.outputs.get(1).map(ValueType::inner).cloned();
                let element = element.ok_or_else(|| l.e.bug("stack_pop has two outputs"))?;
                let [stack] = one(l, inputs)?;
                Ok(l.stack_pop(stack, &element)?.to_vec())
            }
            StackOp::Add => {
                let element = node.outputs.first().map(ValueType::inner).cloned();
                let element = element.ok_or_else(|| l.e.bug("stack_add has an output"))?;
                let [a, b] = two(l, inputs)?;
                Ok(vec![l.stack_add(a, b, &element)?])
            }
        }
    }

    fn module_facts(&self, _facts: &mut ModuleFacts) {}

    fn stack_pushes(&self, _flow: &PushFlow<'_>, ins: &[Pushes], n: usize) -> Option<Vec<Pushes>> {
        Some(match self {
            StackOp::Push => vec![ins.first()?.plus(Some(1))],
            StackOp::Pop => vec![*ins.first()?, Pushes::Unrelated],
            StackOp::New { .. } | StackOp::Add => vec![Pushes::Unbounded; n],
        })
    }
}

/// Pushes and pops carry a stack of tangents beside the stack: the tangent of a push is the
/// push of the value's tangent, of a pop the pop of the tangent stack.
impl crate::trace::tangents::Tangent for StackOp {
    fn tangent(
        &self,
        ctx: &mut dyn Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        use crate::trace::tangents::or_zero;
        let kind = NodeKind::Stack(self.clone());
        match self {
            StackOp::New { .. } => Ok(None),
            StackOp::Push => {
                let outputs = ctx.apply_node(&kind, inputs)?;
                let stack = or_zero(ctx, &tangents[0], &inputs[0])?;
                let value = or_zero(ctx, &tangents[1], &inputs[1])?;
                let pushed = ctx.apply_node(&kind, &[stack, value])?;
                Ok(Some((outputs, smallvec![Some(pushed[0].clone())])))
            }
            StackOp::Pop => {
                let Some(stack) = tangents[0].clone() else {
                    return Ok(None);
                };
                let outputs = ctx.apply_node(&kind, inputs)?;
                let popped = ctx.apply_node(&kind, &[stack])?;
                let t = popped.into_iter().map(Some).collect();
                Ok(Some((outputs, t)))
            }
            // linear: the sum of the tangents
            StackOp::Add => {
                let outputs = ctx.apply_node(&kind, inputs)?;
                let a = or_zero(ctx, &tangents[0], &inputs[0])?;
                let b = or_zero(ctx, &tangents[1], &inputs[1])?;
                let sum = ctx.apply_node(&kind, &[a, b])?;
                Ok(Some((outputs, smallvec![Some(sum[0].clone())])))
            }
        }
    }
}

impl BatchNode for StackOp {
    fn batch(
        &self,
        _cx: &mut NodeBatch<'_>,
        _inputs: &[Val],
        _batched: &[bool],
    ) -> Result<Values<Val>> {
        Err(Error::invalid(
            self.keyword(),
            "a gradient stack cannot hold values that differ per lane",
        ))
    }
}

impl Differentiate for StackOp {
    /// Push and pop are each other's transpose; a new stack has no inputs.
    fn gradient(
        &self,
        _inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(match self {
            StackOp::New { .. } => None,
            StackOp::Push => Some(Arc::new(StackPushGradient)),
            StackOp::Pop => Some(Arc::new(StackPopGradient {
                value: outputs[1].clone(),
            })),
            StackOp::Add => Some(Arc::new(StackAddGradient)),
        })
    }
}

/// `push(stack, value) -> stack'`: the cotangent stack pops to give both gradients.
struct StackPushGradient;

impl GradientFunction<Val> for StackPushGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        match &grad_outputs[0] {
            None => Ok(smallvec![None, None]),
            Some(ds) => {
                let out =
                    ctx.apply_node(&NodeKind::Stack(StackOp::Pop), std::slice::from_ref(ds))?;
                Ok(smallvec![Some(out[0].clone()), Some(out[1].clone())])
            }
        }
    }
}

/// `add(a, b) -> c`: `c`'s cotangent is both inputs'. Longer than a shorter input, its extra
/// bottom is never popped: the input's readers pop at most its own length.
struct StackAddGradient;

impl GradientFunction<Val> for StackAddGradient {
    fn compute(
        &self,
        _ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        let g = grad_outputs[0].clone();
        Ok(smallvec![g.clone(), g])
    }
}

/// `pop(stack) -> (stack', value)`: the value's cotangent is pushed back on the stack's.
struct StackPopGradient {
    value: Val,
}

impl GradientFunction<Val> for StackPopGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        let (ds, dv) = (&grad_outputs[0], &grad_outputs.get(1).cloned().flatten());
        if ds.is_none() && dv.is_none() {
            return Ok(smallvec![None]);
        }
        let ds = match ds {
            Some(ds) => ds.clone(),
            None => ctx
                .apply_node(
                    &NodeKind::Stack(StackOp::New {
                        element: self.value.ty().clone(),
                    }),
                    &[],
                )?
                .remove(0),
        };
        let dv = match dv {
            Some(dv) => dv.clone(),
            None => build::zeros_like(ctx, &self.value)?,
        };
        let out = ctx.apply_node(&NodeKind::Stack(StackOp::Push), &[ds, dv])?;
        Ok(smallvec![Some(out[0].clone())])
    }
}

impl Lower for StackOp {
    fn is_loop(&self) -> bool {
        false
    }

    /// One node, run by the executor's kernel for it.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let (inputs, control) = (cx.inputs.clone(), cx.control.clone());
        Ok(cx.b.single(
            cx.scope,
            DfKind::Stack(self.clone()),
            cx.node,
            inputs,
            control,
        ))
    }
}

/// `stack_push`: the stack with `value` on top (in place when the stack is not shared).
fn push(stack: RtValue, value: RtValue) -> Result<RtValue> {
    let mut stack = stack.into_stack()?;
    stack.push(input_tensor(value, 1)?)?;
    Ok(RtValue::Stack(stack))
}

/// `stack_add`: top elements added to top elements; the longer stack's bottom kept.
fn add(a: RtValue, b: RtValue) -> Result<RtValue> {
    let (a, b) = (a.into_stack()?, b.into_stack()?);
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let offset = long.len() - short.len();
    let mut sum = StackValue::new(long.element().clone());
    let item = |s: &StackValue, k: usize| {
        s.item(k)
            .ok_or_else(|| Error::internal("stack_add", "an item past the top"))
    };
    for k in 0..long.len() {
        let x = item(&long, k)?;
        let item = match k.checked_sub(offset) {
            Some(j) => {
                let op = crate::ops::Op::Add(Default::default());
                let out = crate::ops::execute(&op, &[x, item(&short, j)?])?;
                out.into_iter()
                    .next()
                    .ok_or_else(|| Error::internal("stack_add", "add gave no output"))?
            }
            None => x,
        };
        sum.push(item)?;
    }
    Ok(RtValue::Stack(sum))
}

/// `stack_pop`: the stack without its top, and the top.
fn pop(stack: RtValue) -> Result<[RtValue; 2]> {
    let mut stack = stack.into_stack()?;
    let top = stack.pop().ok_or_else(|| {
        let ty = ValueType::Stack(stack.element().clone());
        Error::index("stack_pop", format!("pop from an empty {ty}"))
    })?;
    Ok([RtValue::Stack(stack), RtValue::Tensor(top)])
}

impl Kernel for StackOp {
    fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>> {
        let mut next = input_reader(self.keyword(), inputs);
        Ok(match self {
            StackOp::New { element } => smallvec![RtValue::Stack(StackValue::new(element.clone()))],
            StackOp::Push => smallvec![push(next()?, next()?)?],
            StackOp::Pop => SmallVec::from_buf(pop(next()?)?),
            StackOp::Add => smallvec![add(next()?, next()?)?],
        })
    }
}

impl PassRules for StackOp {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::NoCallees
    }

    fn constant_choice(&self, _selector: &Tensor) -> Result<Option<usize>> {
        Ok(None)
    }
}
