//! An op node's static types, where every dimension is known: inputs of exactly these types
//! passed the op's rule when the graph was built, so its kernel runs without checking again.

use crate::dataflow::{DfKind, DfNode};
use crate::graph::{NodeId, ValueType};
use crate::ops::Types;
use crate::shape::{TensorType, DYN};

/// An op's static input and output types.
#[derive(Clone, Debug)]
pub(crate) struct CheckedTypes {
    pub inputs: Vec<TensorType>,
    pub outputs: Types,
}

/// The static types of op node `id` (`None` for other nodes, or any unknown dimension).
pub(crate) fn checked_types(nodes: &[DfNode], id: NodeId) -> Option<Box<CheckedTypes>> {
    let node = &nodes[id];
    if !matches!(node.kind, DfKind::Op(_)) {
        return None;
    }
    let tensor = |ty: &ValueType| ty.as_tensor().filter(|t| !t.shape.contains(&DYN)).cloned();
    let inputs = node
        .inputs
        .iter()
        .map(|p| nodes.get(p.node)?.outputs.get(p.output).and_then(tensor))
        .collect::<Option<Vec<_>>>()?;
    let outputs = node.outputs.iter().map(tensor).collect::<Option<Types>>()?;
    Some(Box::new(CheckedTypes { inputs, outputs }))
}
