//! Helpers for the interpreter's tests: types, scalar values and a terse function builder.

use crate::dtype::{DType, Element};
use crate::graph::{Function, FunctionBuilder, Library, Location, NodeKind, Port, ValueType};
use crate::graph::{If, While};
use crate::interpret::RtValue;
use crate::ops::Op;
use crate::tensor::Tensor;

pub(crate) fn ty(dtype: DType, shape: &[usize]) -> ValueType {
    ValueType::tensor(dtype, shape)
}

pub(crate) fn scalar_ty(dtype: DType) -> ValueType {
    ValueType::tensor(dtype, &[])
}

/// A scalar tensor value.
pub(crate) fn s<T: Element>(x: T) -> RtValue {
    RtValue::Tensor(Tensor::scalar(x))
}

/// A vector tensor value.
pub(crate) fn v<T: Element>(xs: &[T]) -> RtValue {
    RtValue::Tensor(Tensor::from_vec(xs.to_vec(), &[xs.len()]).unwrap())
}

/// The elements of a tensor value as f64.
pub(crate) fn f64s(value: &RtValue) -> Vec<f64> {
    value.as_tensor().expect("a tensor").to_f64_vec()
}

/// The single element of a tensor value as f64.
pub(crate) fn f64_of(value: &RtValue) -> f64 {
    value.as_tensor().expect("a tensor").item_f64().unwrap()
}

/// A library holding `functions` (callees first is fine: order does not matter to the lookup).
pub(crate) fn library(functions: Vec<Function>) -> Library {
    let mut lib = Library::new();
    for f in functions {
        lib.add(f).unwrap();
    }
    lib
}

/// A `FunctionBuilder` with short, panicking helpers (tests only).
pub(crate) struct B {
    pub b: FunctionBuilder,
    pub args: Vec<Port>,
    /// Nodes added so far: the id of the next node (nodes without outputs have no port).
    pub len: usize,
}

impl B {
    pub fn new(name: &str, params: Vec<ValueType>) -> Self {
        let len = params.len();
        let (b, args) = FunctionBuilder::new(name, params);
        B { b, args, len }
    }

    pub fn op(&mut self, op: impl Into<Op>, inputs: &[Port]) -> Port {
        self.len += 1;
        self.b.add_op1(op, inputs, None).unwrap()
    }

    pub fn konst<T: Element>(&mut self, x: T) -> Port {
        self.len += 1;
        self.b.add_const(Tensor::scalar(x))
    }

    /// An `If`/`Case`/`While`/`Call` node; output types come from `lib`.
    pub fn call(&mut self, kind: NodeKind, inputs: &[Port], lib: &Library) -> Vec<Port> {
        self.len += 1;
        self.b.add_call_node(kind, inputs, lib).unwrap()
    }

    /// A node with explicit output types.
    pub fn node(&mut self, kind: NodeKind, inputs: &[Port], outputs: Vec<ValueType>) -> Vec<Port> {
        self.len += 1;
        self.b.add_node(kind, inputs, outputs).unwrap()
    }

    /// Id of the node added last.
    pub fn last(&self) -> usize {
        self.len - 1
    }

    /// Gives the node added last the source location `model.py:line`.
    pub fn locate_last(&mut self, line: u32) {
        let id = self.last();
        self.b
            .set_location(id, Location::new("model.py", line))
            .unwrap();
    }

    /// Makes the node added last run after `deps`.
    pub fn after(&mut self, deps: &[usize]) {
        let id = self.last();
        self.b.add_control_inputs(id, deps).unwrap();
    }

    pub fn finish(self, results: &[Port]) -> Function {
        self.b.finish(results, &[]).unwrap()
    }

    pub fn finish_with_effects(self, results: &[Port], effects: &[usize]) -> Function {
        self.b.finish(results, effects).unwrap()
    }
}

/// A `While` node kind without an iteration bound.
pub(crate) fn while_kind(cond: &str, body: &str, maximum_iterations: Option<i64>) -> NodeKind {
    NodeKind::While(While {
        cond: cond.into(),
        body: body.into(),
        maximum_iterations,
        parallel_iterations: 10,
        checkpoints: None,
    })
}

pub(crate) fn if_kind(then_branch: &str, else_branch: &str) -> NodeKind {
    NodeKind::If(If {
        then_branch: then_branch.into(),
        else_branch: else_branch.into(),
    })
}
