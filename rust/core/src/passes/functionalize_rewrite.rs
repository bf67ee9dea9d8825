//! The rewrite of one function by `functionalize_variables` (see `functionalize.rs`): nodes in
//! order, the current value of each variable parameter kept, reads and assignments turned into
//! that value, control flow passed and given back the values it may change.

use super::Threading;
use crate::graph::{Call, VariableOp};
use std::collections::HashMap;

use super::functionalize::{
    calls, passes_variables_through, resource_roots, root_of, unsupported, value_type, Assignments,
    Pass,
};
use crate::error::{Error, Result};
use crate::graph::{Function, FunctionBuilder, Node, NodeId, NodeKind, Port, ValueType};
use crate::ops::{binary, layout};
use crate::shape::DYN;

/// One function being rewritten: the new builder, where each old value went, and the current
/// value of each variable parameter.
pub(super) struct Rewrite<'f> {
    f: &'f Function,
    roots: HashMap<Port, usize>,
    b: FunctionBuilder,
    ports: Vec<Vec<Port>>,
    current: Vec<Port>,
}

impl<'f> Rewrite<'f> {
    pub(super) fn new(f: &'f Function, name: &str) -> Result<Self> {
        let params = f.params.iter().map(value_type).collect();
        let (b, args) = FunctionBuilder::new(name, params);
        Ok(Rewrite {
            f,
            roots: resource_roots(f)?,
            b,
            ports: Vec::with_capacity(f.nodes.len()),
            current: args,
        })
    }

    pub(super) fn run(mut self, pass: &mut Pass<'_>, outs: &[usize]) -> Result<Function> {
        let f = self.f;
        for (id, node) in f.nodes.iter().enumerate() {
            let out = match &node.kind {
                NodeKind::Arg(k) => vec![self.current[*k]],
                NodeKind::Variable(VariableOp::Read) => {
                    vec![self.current[self.root(node.inputs[0])?]]
                }
                NodeKind::Variable(VariableOp::Assign) => {
                    let value = self.port(node.inputs[1])?;
                    self.store(pass, node, value)?;
                    Vec::new()
                }
                NodeKind::Variable(VariableOp::AssignAdd) => {
                    let old = self.current[self.root(node.inputs[0])?];
                    let delta = self.port(node.inputs[1])?;
                    let sum = self
                        .b
                        .add_op1(binary::Add, &[old, delta], node.location.clone())?;
                    self.store(pass, node, sum)?;
                    Vec::new()
                }
                kind => match calls(kind) {
                    // Tracing keeps the library: a call without variables stays as it is (a
                    // custom gradient included).
                    Some(_)
                        if matches!(pass.assignments, Assignments::Credited(_))
                            && !self.takes_variables(node)? =>
                    {
                        self.copy(node)?
                    }
                    Some((first, callees)) => self.call(pass, id, node, first, &callees)?,
                    None => self.copy(node)?,
                },
            };
            self.ports.push(out);
        }
        let mut results = f
            .results
            .iter()
            .map(|&p| self.operand(p))
            .collect::<Result<Vec<_>>>()?;
        results.extend(outs.iter().map(|&p| self.current[p]));
        self.b.finish(&results, &[])
    }

    fn takes_variables(&self, node: &Node) -> Result<bool> {
        for &p in &node.inputs {
            if matches!(self.f.port_type(p)?, ValueType::Resource(_)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn root(&self, port: Port) -> Result<usize> {
        root_of(self.f, &self.roots, port)
    }

    /// Where an old tensor value went.
    fn port(&self, port: Port) -> Result<Port> {
        self.ports
            .get(port.node)
            .and_then(|p| p.get(port.output))
            .copied()
            .ok_or_else(|| {
                Error::internal(
                    "functionalize_variables",
                    format!(
                        "@{}: %{}#{} used before it is defined",
                        self.f.name, port.node, port.output
                    ),
                )
            })
    }

    /// An old value as passed on: a variable's current value, or where a tensor went.
    fn operand(&self, port: Port) -> Result<Port> {
        match self.f.port_type(port)? {
            ValueType::Resource(_) => Ok(self.current[self.root(port)?]),
            _ => self.port(port),
        }
    }

    /// A node's inputs as passed on (see `operand`).
    fn operands(&self, node: &Node) -> Result<Vec<Port>> {
        node.inputs.iter().map(|&p| self.operand(p)).collect()
    }

    /// `value` becomes the current value of the variable `node` (an assignment) writes. A value
    /// whose static shape is less known than the variable's is reshaped to it, so every read
    /// has exactly the variable's type; see `Assignments` for the rest.
    fn store(&mut self, pass: &Pass<'_>, node: &Node, value: Port) -> Result<()> {
        let root = self.root(node.inputs[0])?;
        let var = self.f.params[root].inner().clone();
        let ty = self.b.port_type(value)?.inner().clone();
        let value = if ty != var && !var.shape.contains(&DYN) {
            let reshape = layout::Reshape {
                shape: var.shape.clone(),
            };
            self.b.add_op1(reshape, &[value], node.location.clone())?
        } else {
            value
        };
        let value = match &pass.assignments {
            Assignments::Credited(helpers) if var.dtype.is_float() => {
                let (function, gradient) = helpers.get(&var).ok_or_else(|| {
                    Error::internal(
                        "functionalize_variables",
                        format!("no assignment helper for a variable of type {var}"),
                    )
                })?;
                let kind = NodeKind::Call(Call {
                    function: function.clone(),
                    gradient: Some(gradient.clone()),
                    ..Default::default()
                });
                let old = self.current[root];
                let outputs = vec![ValueType::Tensor(var)];
                self.add(kind, node, &[old, value], outputs)?[0]
            }
            _ => value,
        };
        self.current[root] = value;
        Ok(())
    }

    /// A node without variables or calls, copied.
    fn copy(&mut self, node: &Node) -> Result<Vec<Port>> {
        let inputs = node
            .inputs
            .iter()
            .map(|&p| self.port(p))
            .collect::<Result<Vec<_>>>()?;
        self.add(node.kind.clone(), node, &inputs, node.outputs.clone())
    }

    fn add(
        &mut self,
        kind: NodeKind,
        node: &Node,
        inputs: &[Port],
        outputs: Vec<ValueType>,
    ) -> Result<Vec<Port>> {
        let out = self.b.add_node(kind, inputs, outputs)?;
        if let Some(l) = &node.location {
            self.b.set_location(self.b.len() - 1, l.clone())?;
        }
        Ok(out)
    }

    /// An `If` / `Case` / `Call` / `While` node, with variables passed as values (module doc).
    fn call(
        &mut self,
        pass: &mut Pass<'_>,
        id: NodeId,
        node: &Node,
        first: usize,
        callees: &[&str],
    ) -> Result<Vec<Port>> {
        let f = self.f;
        // Positions (among the operands) of variables some callee assigns.
        let mut written: Vec<usize> = Vec::new();
        for callee in callees {
            for (p, w) in pass.writes(callee)?.into_iter().enumerate() {
                if w && !written.contains(&p) {
                    written.push(p);
                }
            }
        }
        written.sort_unstable();
        self.check_no_aliasing(id, node, first, &written)?;
        let construct = node
            .kind
            .construct()
            .ok_or_else(|| unsupported(f, id, node, "a node calling no function"))?;
        match super::threading(&node.kind) {
            Threading::Loop { body, .. } => {
                self.check_passed_through(pass, id, node, body)?;
                let renamed = callees
                    .iter()
                    .map(|c| pass.rewrite(c, &[]))
                    .collect::<Result<Vec<_>>>()?;
                let outputs = node.outputs.iter().map(value_type).collect();
                let inputs = self.operands(node)?;
                let out = self.add(construct.with_callees(renamed), node, &inputs, outputs)?;
                for &p in &written {
                    let root = self.root(node.inputs[p])?;
                    self.current[root] = out[p];
                }
                return Ok(out);
            }
            Threading::AfterResults => {}
            Threading::NoCallees => {
                return Err(unsupported(f, id, node, "a node calling no function"));
            }
        }
        if node
            .outputs
            .iter()
            .any(|t| matches!(t, ValueType::Resource(_)))
        {
            return Err(unsupported(
                f,
                id,
                node,
                "a variable handle returned by a node",
            ));
        }
        let custom = matches!(
            node.kind,
            NodeKind::Call(Call {
                gradient: Some(_),
                ..
            })
        );
        if custom && matches!(pass.assignments, Assignments::Credited(_)) {
            // its gradient function takes the variables' resources, not values
            return Err(unsupported(
                f,
                id,
                node,
                "a custom gradient taking a variable",
            ));
        }
        let inputs = self.operands(node)?;
        let renamed = callees
            .iter()
            .map(|c| pass.rewrite(c, &written))
            .collect::<Result<Vec<_>>>()?;
        // A custom gradient no longer fits the re-signed callee (`with_callees` drops it);
        // gradients were built before this pass runs.
        let kind = construct.with_callees(renamed);
        let mut outputs = node.outputs.clone();
        for &p in &written {
            outputs.push(value_type(f.port_type(node.inputs[first + p])?));
        }
        let n = node.outputs.len();
        let out = self.add(kind, node, &inputs, outputs)?;
        for (j, &p) in written.iter().enumerate() {
            let root = self.root(node.inputs[first + p])?;
            self.current[root] = out[n + j];
        }
        Ok(out[..n].to_vec())
    }

    /// See `passes_variables_through`; the error names this node.
    fn check_passed_through(
        &self,
        pass: &Pass<'_>,
        id: NodeId,
        node: &Node,
        body: &str,
    ) -> Result<()> {
        passes_variables_through(pass.library.get(body)?)
            .map_err(|e| unsupported(self.f, id, node, &e.message))
    }

    /// A variable passed twice to a function that assigns it would need both parameters to
    /// see each other's writes: refused (tracing never passes one twice).
    fn check_no_aliasing(
        &self,
        id: NodeId,
        node: &Node,
        first: usize,
        written: &[usize],
    ) -> Result<()> {
        if written.is_empty() {
            return Ok(());
        }
        let mut positions: HashMap<usize, Vec<usize>> = HashMap::new();
        for (p, &port) in node.inputs[first..].iter().enumerate() {
            if matches!(self.f.port_type(port)?, ValueType::Resource(_)) {
                positions.entry(self.root(port)?).or_default().push(p);
            }
        }
        let aliased_and_written = positions
            .values()
            .any(|ps| ps.len() > 1 && ps.iter().any(|p| written.contains(p)));
        if aliased_and_written {
            let why = "a variable passed twice to a function that assigns it";
            return Err(unsupported(self.f, id, node, why));
        }
        Ok(())
    }
}
