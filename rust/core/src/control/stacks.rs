//! Stack nodes: `stack_new() -> stack<T>`, `stack_push(stack<T>, T) -> stack<T>`,
//! `stack_pop(stack<T>) -> (stack<T>, T)`. A stack is a value threaded functionally (a loop
//! carries it as a loop variable): the loop gradient's residuals. Push and pop are each
//! other's transpose, so a gradient loop differentiates again.

use std::iter::once;

use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::TypeText;
use crate::graph::verify_nodes::{arity, expect_compatible, expect_outputs, fixed, inner};
use crate::graph::{AttrReader, Check, Library, NodeRule, ParseNode, StackOp, ValueType};
use crate::interpret::nodes::input_tensor;
use crate::interpret::{Interpret, NodeRun};
use crate::runtime_values::{RtValue, StackValue};

impl NodeRule for StackOp {
    fn keyword(&self) -> &'static str {
        match self {
            StackOp::New { .. } => "stack_new",
            StackOp::Push => "stack_push",
            StackOp::Pop => "stack_pop",
        }
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        match self {
            StackOp::New { element } => vec![("element", TypeText(element).to_string())],
            StackOp::Push | StackOp::Pop => Vec::new(),
        }
    }

    fn callees(&self) -> Vec<&str> {
        Vec::new()
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let expected = self.output_types(library, ins).map_err(|e| e.message)?;
        if let StackOp::Push = self {
            let [stack, value] = fixed::<2>(ins)?;
            let element = ValueType::Tensor(inner(stack, "stack", "input 0")?.clone());
            expect_compatible("pushed value (input 1)", value, &element)?;
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
        }
    }
}

impl ParseNode for StackOp {
    const KEYWORDS: &'static [&'static str] = &["stack_new", "stack_push", "stack_pop"];

    fn parse(keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(match keyword {
            "stack_new" => StackOp::New {
                element: attrs.tensor_type("element")?,
            },
            "stack_push" => StackOp::Push,
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
                let mut stack = stack.into_stack()?;
                stack.push(input_tensor(value, 1)?)?;
                Ok(run.store(once(RtValue::Stack(stack))))
            }
            StackOp::Pop => {
                let [stack] = run.fixed()?;
                let mut stack = stack.into_stack()?;
                let top = stack.pop().ok_or_else(|| {
                    let ty = ValueType::Stack(stack.element().clone());
                    Error::index("stack_pop", format!("pop from an empty {ty}"))
                })?;
                Ok(run.store([RtValue::Stack(stack), RtValue::Tensor(top)]))
            }
        }
    }
}
