//! Tracing: building graph functions by running code on symbolic values.
//!
//! `Val` is what the bindings and gradient rules hold: a concrete `Tensor` or a `Symbol` (a
//! value of a function under construction). `TraceContext` applies an op eagerly when every
//! input is concrete and adds a node to the active `Tracer` otherwise, so one program runs
//! eagerly or traces depending only on its inputs.
//!
//! A `Tracer` keeps a stack of frames, one per function being built (the traced function, then
//! branch and loop-body functions nested in it). Using a value of an enclosing frame, or a
//! concrete tensor, *captures* it: it becomes a new parameter of the inner frame, and the
//! caller passes the outer value in (for the outermost frame, a captured concrete tensor becomes
//! a captured input fed on every call; a scalar becomes a constant). The same mechanism finds
//! the residuals of gradients: the backward function of a branch is built in a frame above its
//! forward replay, so every forward value a gradient rule uses is captured, and the captures
//! are exactly the intermediates the gradient needs (see `gradients`).
//!
//! ```text
//!   frames:  [ @f (entry) | @cond_then | ... ]      innermost last; ops go to the top frame
//!   capture: value of @f used in @cond_then  ->  new param of @cond_then, operand of the If
//! ```

pub(crate) mod captures;
mod differentiate;
pub mod gradients;
pub mod lanes;
mod replay;
pub mod tangents;
mod tracer;
pub(crate) mod variables;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::graph::{NodeKind, Port, ValueType};
use crate::shape::TensorType;
use crate::tensor::{next_id, Tensor, TensorId};
use crate::value::Value;
use lanes::Lanes;

pub use crate::graph::join_types;
pub use captures::{Branch, CustomRules, LoopFunctions};
pub use differentiate::{
    finish_entry, gradient_graph, gradient_graph_with, jvp_graph, takes_cotangents, vjp_graph,
};
pub use gradients::{graph_registry, registry};
pub use replay::replay;
pub(crate) use tracer::escaped_lanes;
pub use tracer::{lock, Captured, FrameId, TraceContext, Traced, Tracer, TracerRef};

/// A value of a function under construction: its port in frame `frame`, with a tape identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Symbol {
    id: TensorId,
    ty: ValueType,
    pub frame: FrameId,
    pub port: Port,
}

impl Symbol {
    pub fn new(frame: FrameId, port: Port, ty: ValueType) -> Symbol {
        Symbol {
            id: next_id(),
            ty,
            frame,
            port,
        }
    }

    /// The full type (tensor, resource or stack).
    pub fn value_type(&self) -> &ValueType {
        &self.ty
    }
}

/// A concrete tensor, a symbolic value of a trace, or one lane of a batch (`vmap`).
#[derive(Clone, Debug)]
pub enum Val {
    Tensor(Tensor),
    Symbol(Symbol),
    Batched(Arc<Lanes>),
}

impl Val {
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Val::Tensor(t) => Some(t),
            Val::Symbol(_) | Val::Batched(_) => None,
        }
    }

    pub fn as_symbol(&self) -> Option<&Symbol> {
        match self {
            Val::Symbol(s) => Some(s),
            Val::Tensor(_) | Val::Batched(_) => None,
        }
    }

    pub fn as_lanes(&self) -> Option<&Lanes> {
        match self {
            Val::Batched(lanes) => Some(lanes),
            Val::Tensor(_) | Val::Symbol(_) => None,
        }
    }

    pub fn is_concrete(&self) -> bool {
        matches!(self, Val::Tensor(_))
    }

    /// The full type: a concrete value is always a tensor.
    pub fn value_type(&self) -> ValueType {
        match self {
            Val::Tensor(t) => ValueType::Tensor(t.ty().clone()),
            Val::Symbol(s) => s.ty.clone(),
            Val::Batched(lanes) => ValueType::Tensor(lanes.ty().clone()),
        }
    }
}

impl From<Tensor> for Val {
    fn from(t: Tensor) -> Self {
        Val::Tensor(t)
    }
}

impl From<Symbol> for Val {
    fn from(s: Symbol) -> Self {
        Val::Symbol(s)
    }
}

impl Value for Symbol {
    type Node = NodeKind;
    type Trace = TracerRef;

    fn id(&self) -> TensorId {
        self.id
    }

    fn ty(&self) -> &TensorType {
        self.ty.inner()
    }

    fn held_bytes(&self) -> usize {
        0
    }
}

impl Value for Val {
    type Node = NodeKind;
    type Trace = TracerRef;

    fn id(&self) -> TensorId {
        match self {
            Val::Tensor(t) => t.id(),
            Val::Symbol(s) => s.id,
            Val::Batched(lanes) => lanes.id(),
        }
    }

    fn ty(&self) -> &TensorType {
        match self {
            Val::Tensor(t) => t.ty(),
            Val::Symbol(s) => s.ty.inner(),
            Val::Batched(lanes) => lanes.ty(),
        }
    }

    fn is_unique(&self) -> bool {
        matches!(self, Val::Tensor(t) if t.is_unique())
    }

    fn held_bytes(&self) -> usize {
        match self {
            Val::Tensor(t) => t.held_bytes(),
            Val::Symbol(_) | Val::Batched(_) => 0,
        }
    }

    fn sum_node(&self) -> Option<NodeKind> {
        matches!(self.value_type(), ValueType::Stack(_))
            .then_some(NodeKind::Stack(crate::graph::StackOp::Add))
    }
}
