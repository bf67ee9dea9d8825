//! Running one node: `Arg`, `Const` and `Op` here, every construct through its `Interpret`
//! implementation (in `crate::control`). Inputs arrive owned (moved out of the value table at
//! their last use), so a stack handed to a push or pop is usually uniquely owned and is
//! changed in place.

use std::iter::once;

use super::frame::Frame;
use super::plan::{NodePlan, Use};
use super::Interpreter;
use crate::dtype::Element;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{Function, Node, NodeKind, ValueType};
use crate::ops::execute;
use crate::runtime_values::RtValue;
use crate::tensor::Tensor;

/// How the reference interpreter runs a construct's node.
pub trait Interpret {
    /// Runs the node: takes its inputs from `run` and stores its outputs with `run.store`,
    /// returning what that returns.
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize>;
}

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
        let mut run = NodeRun {
            interpreter: self,
            node,
            np,
            frame,
            depth,
        };
        match &node.kind {
            NodeKind::Arg(i) => {
                let arg = run.frame.take_arg(*i).ok_or_else(|| {
                    let msg = format!("argument {i} is read twice");
                    Error::new(ErrorKind::Graph, "arg", msg)
                })?;
                Ok(run.store(once(arg)))
            }
            NodeKind::Const(c) => Ok(run.store(once(RtValue::Tensor(c.0.clone())))),
            NodeKind::Op(op) => {
                let outs = run.frame.with_tensors(&np.inputs, |ts| execute(op, ts))?;
                Ok(run.store(outs.into_iter().map(RtValue::Tensor)))
            }
            NodeKind::If(c) => c.interpret(&mut run),
            NodeKind::Case(c) => c.interpret(&mut run),
            NodeKind::While(c) => c.interpret(&mut run),
            NodeKind::Call(c) => c.interpret(&mut run),
            NodeKind::Variable(c) => c.interpret(&mut run),
            NodeKind::Stack(c) => c.interpret(&mut run),
        }
    }
}

/// One node being run: its inputs in the frame, its callees, and where its outputs go.
pub struct NodeRun<'i, 'f> {
    interpreter: &'i Interpreter<'i>,
    node: &'i Node,
    np: &'i NodePlan,
    frame: &'f mut Frame,
    depth: usize,
}

impl NodeRun<'_, '_> {
    /// The node's name (for errors).
    pub fn name(&self) -> &'static str {
        self.node.kind.name()
    }

    /// The node's declared output types.
    pub fn outputs(&self) -> &[ValueType] {
        &self.node.outputs
    }

    /// All inputs, in order.
    pub fn take_all(&mut self) -> Result<Vec<RtValue>> {
        self.frame.take_all(&self.np.inputs)
    }

    /// Exactly `N` inputs, or a `Graph` error (a verified graph never has another count).
    pub fn fixed<const N: usize>(&mut self) -> Result<[RtValue; N]> {
        let uses = <[Use; N]>::try_from(self.np.inputs.as_slice()).map_err(|_| {
            let got = self.np.inputs.len();
            let msg = format!("takes {N} input(s), got {got}");
            Error::new(ErrorKind::Graph, self.name(), msg)
        })?;
        // No vector in between: stack pushes and pops run once per loop iteration.
        let mut failed = None;
        let values = uses.map(|u| match self.frame.take(u) {
            Ok(v) => Some(v),
            Err(e) => {
                failed.get_or_insert(e);
                None
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(values.map(|v| v.unwrap_or_else(|| unreachable!("every take succeeded")))),
        }
    }

    /// The first input (a predicate or index) and the operands after it.
    pub fn split_first(&mut self) -> Result<(RtValue, Vec<RtValue>)> {
        let Some((&first, rest)) = self.np.inputs.split_first() else {
            let msg = "takes at least one input, got 0";
            return Err(Error::new(ErrorKind::Graph, self.name(), msg));
        };
        let first = self.frame.take(first)?;
        Ok((first, self.frame.take_all(rest)?))
    }

    /// How many functions the node calls.
    pub fn callee_count(&self) -> usize {
        self.np.callees.len()
    }

    /// The library position of callee `i` (in `NodeRule::callees` order).
    pub fn callee(&self, i: usize) -> Result<usize> {
        self.np
            .callees
            .get(i)
            .copied()
            .ok_or_else(|| Error::internal("interpret", format!("the node has no callee {i}")))
    }

    /// The function at library position `f`.
    pub fn function(&self, f: usize) -> Result<&Function> {
        self.interpreter.function(f)
    }

    /// Calls the function at library position `f` one level deeper.
    pub fn call(&self, f: usize, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
        self.interpreter.call(f, args, self.depth + 1)
    }

    /// Calls callee `i` and checks what it returns against the node's declared outputs.
    pub fn call_callee(&self, i: usize, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
        let f = self.callee(i)?;
        let results = self.call(f, args)?;
        check_results(&results, self.outputs(), self.function(f)?)?;
        Ok(results)
    }

    /// Stores the node's outputs; returns how many there were.
    pub fn store(&mut self, outputs: impl IntoIterator<Item = RtValue>) -> usize {
        self.frame.store(self.np, outputs)
    }
}

/// Input `i` as a tensor (an error naming the input otherwise).
pub fn input_tensor(value: RtValue, i: usize) -> Result<Tensor> {
    value.into_tensor().map_err(|mut e| {
        e.message = format!("input {i}: {}", e.message);
        e
    })
}

/// The element of a scalar tensor of dtype `T` (an `If` predicate, a `Case` index, a `While`
/// condition); another dtype or a non-scalar shape is an error naming `what`.
pub fn scalar<T: Element>(value: RtValue, op: &'static str, what: &str) -> Result<T> {
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
pub fn check_results(values: &[RtValue], declared: &[ValueType], callee: &Function) -> Result<()> {
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
