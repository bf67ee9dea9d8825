//! `Value`: what contexts, tapes and gradient rules pass around — a concrete `Tensor` in eager
//! mode, a symbolic graph value when tracing. Rules are generic over it, so one rule serves both.

use std::fmt;

use crate::shape::TensorType;
use crate::tensor::{Tensor, TensorId};

pub trait Value: Clone + fmt::Debug + Send + Sync + 'static {
    /// The nodes other than ops (control flow, stacks, variables) that a context over this
    /// value may apply: the graph's `NodeKind` for symbolic values, none for tensors. An
    /// associated type, so that contexts and tapes name no graph module.
    type Node: NodeName;
    /// The handle of the trace a context over this value adds nodes to (none for tensors).
    type Trace: Clone;

    /// Identity the tape tracks.
    fn id(&self) -> TensorId;
    /// Static dtype and shape.
    fn ty(&self) -> &TensorType;

    /// Whether every handle of this value but this one is gone (false when it cannot tell):
    /// forward mode forgets the tangents of such values.
    fn is_unique(&self) -> bool {
        false
    }

    /// Bytes of memory this value holds (0 for a symbolic value): what a tape that keeps it
    /// alive counts.
    fn held_bytes(&self) -> usize {
        self.ty().shape.iter().product::<usize>() * self.ty().dtype.size()
    }

    /// The node that sums two gradients of this value where no op does (a stack's, which two
    /// loops that read it both give); None where `add` does.
    fn sum_node(&self) -> Option<Self::Node> {
        None
    }
}

/// A node's name in messages and on the tape.
pub trait NodeName {
    fn name(&self) -> &'static str;
}

/// No node and no trace: what a context over concrete tensors has (no value of it exists).
#[derive(Clone, Copy, Debug)]
pub enum Nothing {}

impl NodeName for Nothing {
    fn name(&self) -> &'static str {
        match *self {}
    }
}

impl Value for Tensor {
    type Node = Nothing;
    type Trace = Nothing;

    fn id(&self) -> TensorId {
        Tensor::id(self)
    }

    fn ty(&self) -> &TensorType {
        Tensor::ty(self)
    }

    fn is_unique(&self) -> bool {
        Tensor::is_unique(self)
    }
}
