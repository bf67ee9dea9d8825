//! Running one node of each kind. Inputs arrive owned (moved out of the value table at their
//! last use), so a stack handed to `StackPush`/`StackPop` is usually uniquely owned and is
//! changed in place.

use std::iter::once;

use super::frame::Frame;
use super::plan::{NodePlan, Use};
use super::Interpreter;
use crate::dtype::Element;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{Function, Node, NodeKind, ValueType};
use crate::ops::execute;
use crate::runtime_values::{RtValue, StackValue};
use crate::tensor::Tensor;

impl Interpreter<'_> {
    /// Runs `node`, reading its inputs from `frame` and storing its outputs there; returns how
    /// many outputs it produced.
    pub(super) fn exec_node(
        &self,
        node: &Node,
        np: &NodePlan,
        frame: &mut Frame,
        depth: usize,
    ) -> Result<usize> {
        let name = node.kind.name();
        let values = match &node.kind {
            NodeKind::Arg(i) => {
                let arg = frame.take_arg(*i).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Graph,
                        name,
                        format!("argument {i} is read twice"),
                    )
                })?;
                return Ok(frame.store(np, once(arg)));
            }
            NodeKind::Const(c) => return Ok(frame.store(np, once(RtValue::Tensor(c.0.clone())))),
            NodeKind::Op(op) => {
                let outs = frame.with_tensors(&np.inputs, |ts| execute(op, ts))?;
                return Ok(frame.store(np, outs.into_iter().map(RtValue::Tensor)));
            }
            NodeKind::If { .. } => {
                let (pred, operands) = split_first(np, name)?;
                let pred = scalar::<bool>(frame.take(pred)?, name, "predicate")?;
                let args = frame.take_all(operands)?;
                self.call_node(callee(np, usize::from(!pred))?, args, node, depth)?
            }
            NodeKind::Case { .. } => {
                let (index, operands) = split_first(np, name)?;
                let index = scalar::<i32>(frame.take(index)?, name, "branch index")?;
                // Out of range, negative included, runs the last branch (the default).
                let last = np.callees.len().checked_sub(1).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Graph,
                        name,
                        "a case node needs at least one branch",
                    )
                })?;
                let branch = usize::try_from(index).map_or(last, |i| i.min(last));
                let args = frame.take_all(operands)?;
                self.call_node(callee(np, branch)?, args, node, depth)?
            }
            NodeKind::While {
                maximum_iterations, ..
            } => {
                let vars = frame.take_all(&np.inputs)?;
                self.run_while(node, np, vars, *maximum_iterations, depth)?
            }
            NodeKind::Call { .. } => {
                let args = frame.take_all(&np.inputs)?;
                self.call_node(callee(np, 0)?, args, node, depth)?
            }
            NodeKind::ReadVariable => {
                let [var] = fixed(np, name)?;
                let value = frame.take(var)?.into_resource()?.read();
                return Ok(frame.store(np, once(RtValue::Tensor(value))));
            }
            NodeKind::AssignVariable => {
                let [var, value] = fixed(np, name)?;
                let var = frame.take(var)?.into_resource()?;
                var.assign(&input_tensor(frame.take(value)?, 1)?)?;
                Vec::new()
            }
            NodeKind::AssignAddVariable => {
                let [var, delta] = fixed(np, name)?;
                let var = frame.take(var)?.into_resource()?;
                var.assign_add(&input_tensor(frame.take(delta)?, 1)?)?;
                Vec::new()
            }
            NodeKind::StackNew { element } => {
                let [] = fixed(np, name)?;
                let stack = RtValue::Stack(StackValue::new(element.clone()));
                return Ok(frame.store(np, once(stack)));
            }
            NodeKind::StackPush => {
                let [stack, value] = fixed(np, name)?;
                let mut stack = frame.take(stack)?.into_stack()?;
                stack.push(input_tensor(frame.take(value)?, 1)?)?;
                return Ok(frame.store(np, once(RtValue::Stack(stack))));
            }
            NodeKind::StackPop => {
                let [stack] = fixed(np, name)?;
                let mut stack = frame.take(stack)?.into_stack()?;
                let top = stack.pop().ok_or_else(|| {
                    let ty = ValueType::Stack(stack.element().clone());
                    Error::index(name, format!("pop from an empty {ty}"))
                })?;
                [RtValue::Stack(stack), RtValue::Tensor(top)].into()
            }
        };
        Ok(frame.store(np, values))
    }

    /// `while cond(vars): vars = body(vars)`, stopping after `maximum_iterations` trips. A loop
    /// in Rust: each iteration is two calls that return before the next, so the stack stays
    /// flat however many iterations run. Once the maximum is reached `cond` is not called.
    fn run_while(
        &self,
        node: &Node,
        np: &NodePlan,
        mut vars: Vec<RtValue>,
        maximum_iterations: Option<i64>,
        depth: usize,
    ) -> Result<Vec<RtValue>> {
        let (cond, body) = (callee(np, 0)?, callee(np, 1)?);
        if let Some(m) = maximum_iterations.filter(|&m| m < 0) {
            let msg = format!("maximum_iterations must be at least 0, got {m}");
            return Err(Error::invalid("while", msg));
        }
        let mut trip: i64 = 0;
        while maximum_iterations.is_none_or(|m| trip < m) {
            // The condition gets clones; its frame is gone before the body runs, so the body
            // again holds the only handle to each stack it carries.
            let go = self
                .call(cond, vars.clone(), depth + 1)
                .and_then(|r| single(r).and_then(|c| scalar::<bool>(c, "while", "condition")))
                .map_err(|e| in_iteration(e, trip))?;
            if !go {
                break;
            }
            vars = self
                .call(body, vars, depth + 1)
                .map_err(|e| in_iteration(e, trip))?;
            check_results(&vars, &node.outputs, self.function(body)?)
                .map_err(|e| in_iteration(e, trip))?;
            trip += 1;
        }
        Ok(vars)
    }

    /// Calls `callee` for an `If`/`Case`/`Call` node and checks what it returns against the
    /// node's declared outputs.
    fn call_node(
        &self,
        callee: usize,
        args: Vec<RtValue>,
        node: &Node,
        depth: usize,
    ) -> Result<Vec<RtValue>> {
        let results = self.call(callee, args, depth + 1)?;
        check_results(&results, &node.outputs, self.function(callee)?)?;
        Ok(results)
    }
}

fn callee(np: &NodePlan, i: usize) -> Result<usize> {
    np.callees
        .get(i)
        .copied()
        .ok_or_else(|| Error::internal("interpret", format!("the node has no callee {i}")))
}

fn input_tensor(value: RtValue, i: usize) -> Result<Tensor> {
    value.into_tensor().map_err(|mut e| {
        e.message = format!("input {i}: {}", e.message);
        e
    })
}

/// The node's inputs as exactly `N` uses, or a `Graph` error (a verified graph never has
/// another count).
fn fixed<const N: usize>(np: &NodePlan, name: &'static str) -> Result<[Use; N]> {
    <[Use; N]>::try_from(np.inputs.as_slice()).map_err(|_| {
        let got = np.inputs.len();
        Error::new(
            ErrorKind::Graph,
            name,
            format!("takes {N} input(s), got {got}"),
        )
    })
}

/// The first input (a predicate or index) and the operands after it.
fn split_first<'p>(np: &'p NodePlan, name: &'static str) -> Result<(Use, &'p [Use])> {
    match np.inputs.split_first() {
        Some((&first, rest)) => Ok((first, rest)),
        None => Err(Error::new(
            ErrorKind::Graph,
            name,
            "takes at least one input, got 0",
        )),
    }
}

/// The one result of a `While` condition function.
fn single(mut results: Vec<RtValue>) -> Result<RtValue> {
    match (results.pop(), results.is_empty()) {
        (Some(value), true) => Ok(value),
        _ => {
            let msg = format!(
                "the condition returned {} values; it must return one",
                results.len() + 1
            );
            Err(Error::new(ErrorKind::ControlFlow, "while", msg))
        }
    }
}

/// The element of a scalar tensor of dtype `T` (an `If` predicate, a `Case` index, a `While`
/// condition); another dtype or a non-scalar shape is an error naming `what`.
fn scalar<T: Element>(value: RtValue, op: &'static str, what: &str) -> Result<T> {
    let t = value.into_tensor()?;
    if t.dtype() != T::DTYPE {
        let msg = format!(
            "the {what} must be a {} scalar, got {}",
            T::DTYPE,
            t.dtype()
        );
        return Err(Error::dtype(op, msg));
    }
    if !t.shape().is_empty() {
        let ty = ValueType::Tensor(t.ty().clone());
        return Err(Error::shape(
            op,
            format!("the {what} must be a scalar, got {ty}"),
        ));
    }
    t.as_slice::<T>()?
        .first()
        .copied()
        .ok_or_else(|| Error::internal(op, format!("the {what} holds no element")))
}

/// What a called function returned must fit the calling node's declared outputs: a branch or
/// loop body whose results differ in number, dtype or shape is a `ControlFlow` error.
fn check_results(values: &[RtValue], declared: &[ValueType], callee: &Function) -> Result<()> {
    let name = &callee.name;
    if values.len() != declared.len() {
        let (got, want) = (values.len(), declared.len());
        let msg = format!("@{name} returned {got} value(s); the node has {want} output(s)");
        return Err(Error::new(ErrorKind::ControlFlow, "interpret", msg));
    }
    for (i, (v, ty)) in values.iter().zip(declared).enumerate() {
        if v.mismatch(ty).is_some() {
            let got = v.value_type();
            let msg = format!("@{name} returned a {got} as result {i}; the node declares {ty}");
            return Err(Error::new(ErrorKind::ControlFlow, "interpret", msg));
        }
    }
    Ok(())
}

fn in_iteration(mut e: Error, trip: i64) -> Error {
    e.message.push_str(&format!("\n  in iteration {trip}"));
    e
}
