//! `FunctionBuilder`: appends nodes to a function in topological order, filling op output
//! types from the op table's own shape rules (`Op::infer`), so there is no second list of ops.

use super::ir::{Constant, Function, Location, Node, NodeId, NodeKind, Port, ValueType};
use super::library::Library;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::Op;
use crate::shape::TensorType;
use crate::tensor::Tensor;

/// Builds one function. Nodes can only refer to nodes already added, so what it builds is in
/// topological order by construction; `verify` checks everything else.
#[derive(Clone, Debug)]
pub struct FunctionBuilder {
    name: String,
    params: Vec<ValueType>,
    nodes: Vec<Node>,
    /// `(old, new)`: node `new` computes everything `old` does (its first outputs are `old`'s)
    /// and more; `finish` redirects `old`'s uses to `new` and drops `old`.
    superseded: Vec<(NodeId, NodeId)>,
}

fn graph_error(message: String) -> Error {
    Error::new(ErrorKind::Graph, "graph builder", message)
}

impl FunctionBuilder {
    /// A function `name(params...)`; returns the builder and one port per parameter.
    pub fn new(name: impl Into<String>, params: Vec<ValueType>) -> (Self, Vec<Port>) {
        let nodes = params
            .iter()
            .enumerate()
            .map(|(i, ty)| Node::new(NodeKind::Arg(i), vec![], vec![ty.clone()]))
            .collect();
        let ports = (0..params.len()).map(|i| Port::new(i, 0)).collect();
        let b = FunctionBuilder {
            name: name.into(),
            params,
            nodes,
            superseded: Vec::new(),
        };
        (b, ports)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames the function (before it joins a library).
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    pub fn params(&self) -> &[ValueType] {
        &self.params
    }

    /// The node `id` (added so far).
    pub fn node(&self, id: NodeId) -> Result<&Node> {
        let len = self.nodes.len();
        self.nodes
            .get(id)
            .ok_or_else(|| graph_error(format!("@{}: no node %{id} ({len} nodes)", self.name)))
    }

    /// Number of nodes added so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Appends a parameter (an `Arg` node) after nodes were added: captures found while
    /// tracing. `finish` moves every `Arg` to the front.
    pub fn add_param(&mut self, ty: ValueType) -> Port {
        let index = self.params.len();
        self.params.push(ty.clone());
        self.nodes
            .push(Node::new(NodeKind::Arg(index), vec![], vec![ty]));
        Port::new(self.nodes.len() - 1, 0)
    }

    /// Declares that `new` (a later node) computes what `old` computes, in its first outputs:
    /// `finish` sends `old`'s uses to `new`, drops `old` and restores topological order. This is
    /// how a gradient adds outputs to a forward `If`/`While` without editing it in place. `new`
    /// takes `old`'s place in program order: it gets `old`'s control inputs, not those it was
    /// added with (which may name stateful nodes that run after `old`: a cycle).
    pub fn supersede(&mut self, old: NodeId, new: NodeId) -> Result<()> {
        let (o, n) = (self.node(old)?, self.node(new)?);
        let prefix = o.outputs.len() <= n.outputs.len()
            && o.outputs
                .iter()
                .zip(&n.outputs)
                .all(|(a, b)| a.compatible(b));
        if !prefix || old >= new {
            return Err(graph_error(format!(
                "@{}: %{new} cannot stand for %{old}",
                self.name
            )));
        }
        let controls = self.node(old)?.control_inputs.clone();
        self.node_mut(new)?.control_inputs = controls;
        self.superseded.push((old, new));
        Ok(())
    }

    /// The type of `port`, or a `Graph` error if no node added so far has that output.
    pub fn port_type(&self, port: Port) -> Result<&ValueType> {
        self.nodes
            .get(port.node)
            .and_then(|n| n.outputs.get(port.output))
            .ok_or_else(|| {
                graph_error(format!(
                    "@{}: no value %{}#{} (the function has {} nodes)",
                    self.name,
                    port.node,
                    port.output,
                    self.nodes.len()
                ))
            })
    }

    /// Adds `op` applied to `inputs` (tensors); its output types come from `op.infer`, so a
    /// shape or dtype mistake fails here with the op's own error, as it would eagerly.
    pub fn add_op(
        &mut self,
        op: impl Into<Op>,
        inputs: &[Port],
        location: Option<Location>,
    ) -> Result<Vec<Port>> {
        let op = op.into();
        let types = self.tensor_types(op.name(), inputs)?;
        let outputs = op
            .infer(&types)?
            .into_iter()
            .map(ValueType::Tensor)
            .collect();
        let id = self.push(NodeKind::Op(op), inputs, outputs)?;
        self.nodes[id].location = location;
        Ok(self.ports(id))
    }

    /// `add_op` for an op with one output.
    pub fn add_op1(
        &mut self,
        op: impl Into<Op>,
        inputs: &[Port],
        location: Option<Location>,
    ) -> Result<Port> {
        let ports = self.add_op(op, inputs, location)?;
        match ports.as_slice() {
            [p] => Ok(*p),
            _ => Err(graph_error(format!(
                "expected an op with one output, it has {}",
                ports.len()
            ))),
        }
    }

    /// A constant node holding `value`.
    pub fn add_const(&mut self, value: Tensor) -> Port {
        let ty = ValueType::Tensor(value.ty().clone());
        let id = self.nodes.len();
        let node = Node::new(NodeKind::Const(Constant(value)), vec![], vec![ty]);
        self.nodes.push(node);
        Port::new(id, 0)
    }

    /// Adds a control-flow or stateful node with explicit output types.
    pub fn add_node(
        &mut self,
        kind: NodeKind,
        inputs: &[Port],
        outputs: Vec<ValueType>,
    ) -> Result<Vec<Port>> {
        let id = self.push(kind, inputs, outputs)?;
        Ok(self.ports(id))
    }

    /// Adds a construct's node (`If`, `While`, ...) with the output types its rule gives
    /// (`NodeRule::output_types`, read from the callees in `library`).
    pub fn add_call_node(
        &mut self,
        kind: NodeKind,
        inputs: &[Port],
        library: &Library,
    ) -> Result<Vec<Port>> {
        let ins: Vec<ValueType> = inputs
            .iter()
            .map(|&p| self.port_type(p).cloned())
            .collect::<Result<_>>()?;
        let ins: Vec<&ValueType> = ins.iter().collect();
        let outputs = match kind.construct() {
            Some(c) => c.output_types(library, &ins)?,
            None => {
                let name = kind.name();
                return Err(graph_error(format!("{name} is not a construct")));
            }
        };
        self.add_node(kind, inputs, outputs)
    }

    /// Makes `node` run after each of `deps` (earlier nodes).
    pub fn add_control_inputs(&mut self, node: NodeId, deps: &[NodeId]) -> Result<()> {
        if let Some(&bad) = deps.iter().find(|&&d| d >= node) {
            return Err(graph_error(format!(
                "%{node} cannot depend on %{bad}, which is not an earlier node"
            )));
        }
        let n = self.node_mut(node)?;
        n.control_inputs.extend_from_slice(deps);
        Ok(())
    }

    /// Sets the source location of `node`.
    pub fn set_location(&mut self, node: NodeId, location: Location) -> Result<()> {
        self.node_mut(node)?.location = Some(location);
        Ok(())
    }

    /// The function with `results` and `control_outputs` (side effects that must run).
    pub fn finish(self, results: &[Port], control_outputs: &[NodeId]) -> Result<Function> {
        for &p in results {
            self.port_type(p)?;
        }
        if let Some(&bad) = control_outputs.iter().find(|&&n| n >= self.nodes.len()) {
            return Err(graph_error(format!("@{}: no node %{bad}", self.name)));
        }
        let mut function = Function {
            name: self.name,
            params: self.params,
            nodes: self.nodes,
            results: results.to_vec(),
            control_outputs: control_outputs.to_vec(),
        };
        let args_first = function
            .nodes
            .iter()
            .enumerate()
            .all(|(i, n)| (i < function.params.len()) == matches!(n.kind, NodeKind::Arg(_)));
        if !self.superseded.is_empty() || !args_first {
            super::reorder::canonicalize(&mut function, &self.superseded)?;
        }
        Ok(function)
    }

    fn tensor_types(&self, op: &str, inputs: &[Port]) -> Result<Vec<TensorType>> {
        let mut types = Vec::with_capacity(inputs.len());
        for (i, &p) in inputs.iter().enumerate() {
            match self.port_type(p)? {
                ValueType::Tensor(t) => types.push(t.clone()),
                other => {
                    return Err(graph_error(format!(
                        "{op}: input {i} must be a tensor, got {other}"
                    )))
                }
            }
        }
        Ok(types)
    }

    fn push(&mut self, kind: NodeKind, inputs: &[Port], outputs: Vec<ValueType>) -> Result<NodeId> {
        for &p in inputs {
            self.port_type(p)?;
        }
        self.nodes.push(Node::new(kind, inputs.to_vec(), outputs));
        Ok(self.nodes.len() - 1)
    }

    fn ports(&self, id: NodeId) -> Vec<Port> {
        (0..self.nodes[id].outputs.len())
            .map(|i| Port::new(id, i))
            .collect()
    }

    fn node_mut(&mut self, node: NodeId) -> Result<&mut Node> {
        let name = &self.name;
        let len = self.nodes.len();
        self.nodes
            .get_mut(node)
            .ok_or_else(|| graph_error(format!("@{name}: no node %{node} ({len} nodes)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ops::{binary, reduce, unary};
    use crate::shape::DYN;

    fn f32s(shape: &[usize]) -> ValueType {
        ValueType::tensor(DType::F32, shape)
    }

    #[test]
    fn op_types_come_from_the_op_table_and_unknown_dims_flow() {
        let (mut b, args) = FunctionBuilder::new("f", vec![f32s(&[DYN, 3]), f32s(&[3])]);
        let s = b.add_op1(unary::Sin, &[args[0]], None).unwrap();
        let y = b.add_op1(binary::Add, &[s, args[1]], None).unwrap();
        let sum = reduce::Sum {
            axes: vec![1],
            keepdims: false,
        };
        let r = b.add_op1(sum, &[y], None).unwrap();
        assert_eq!(b.port_type(y).unwrap(), &f32s(&[DYN, 3]));
        assert_eq!(b.port_type(r).unwrap(), &f32s(&[DYN]));
        let f = b.finish(&[r], &[]).unwrap();
        assert_eq!(f.nodes.len(), 5);
        assert_eq!(f.nodes[0].kind, NodeKind::Arg(0));
    }

    #[test]
    fn rule_errors_keep_the_ops_kind_and_name() {
        let (mut b, args) = FunctionBuilder::new("f", vec![f32s(&[2]), f32s(&[3])]);
        let err = b.add_op(binary::Add, &args, None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Shape);
        assert!(err.to_string().starts_with("add:"), "{err}");
        let err = b.add_op(unary::Sin, &[Port::new(9, 0)], None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Graph);
        assert!(err.message.contains("%9#0"), "{err}");
        assert!(b.add_control_inputs(1, &[1]).is_err());
        assert!(b.clone().finish(&[Port::new(0, 1)], &[]).is_err());
        assert!(b.finish(&[], &[7]).is_err());
    }

    #[test]
    fn ops_reject_resource_inputs() {
        let res = ValueType::Resource(TensorType::new(DType::F32, &[2]));
        let (mut b, args) = FunctionBuilder::new("f", vec![res]);
        let err = b.add_op(unary::Neg, &args, None).unwrap_err();
        assert!(
            err.message.contains("neg: input 0 must be a tensor"),
            "{err}"
        );
    }
}
