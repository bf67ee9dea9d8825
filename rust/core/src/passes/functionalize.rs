//! `functionalize_variables`: variables become plain values threaded through the program, so a
//! compiled function takes each variable's value on entry and returns its value on exit, and
//! the MLIR emitter never sees a variable.
//!
//! ```text
//!   func @f(%x: f32[], %v: resource<f32[]>)       func @f(%x: f32[], %v: f32[])
//!     %a = read_variable(%v)                         (uses of %a use %v)
//!     assign_variable(%v, %x)              ──►       %y = if(%p, %x, %x) ...
//!     %y = if(%p, %v, ...) {then=@t ...}               @t gets the value, returns its final
//!     return %a                                      return %v, %y#1   (%v on entry: %a)
//! ```
//!
//! Walking each function's nodes in order (the trace order: program order of stateful nodes),
//! the pass keeps the current value of every resource parameter: a read is that value, an
//! assignment replaces it (`assign_add_variable` becomes an `add`). Control flow threads it:
//! - `If` / `Case` / `Call`: the callees take the value as a tensor parameter in the resource's
//!   place and return the final value of every variable that ANY of them assigns, after their
//!   own results (a branch that does not assign it returns it unchanged);
//! - `While`: a resource loop variable becomes a tensor loop variable, which the body returns
//!   with its final value (bodies already pass their resources through). A condition that
//!   assigns a variable has no such form: a `Compile` error.
//!
//! Functions are rewritten per (function, threaded results), so a branch shared by nodes that
//! need different results is rewritten once for each. The entry keeps its parameters in order
//! (a variable's value in its resource's place) and returns, after its own results, the final
//! value of each assigned variable in parameter order: `assigned_variables` lists them.

use std::collections::{HashMap, HashSet};

use crate::error::{Error, ErrorKind, Result};
use crate::graph::{
    verify, Function, FunctionBuilder, Graph, Library, Node, NodeId, NodeKind, Port, ValueType,
};
use crate::ops::{binary, layout};
use crate::shape::DYN;

/// The graph without variables (see the module doc).
pub fn functionalize_variables(graph: &Graph) -> Result<Graph> {
    if !graph.library.iter().any(has_resource_params) {
        return Ok(graph.clone());
    }
    let mut pass = Pass::new(&graph.library);
    let outs = pass.assigned(&graph.entry)?;
    let entry = pass.rewrite(&graph.entry, &outs)?;
    let mut library = Library::new();
    let (first, rest): (Vec<Function>, Vec<Function>) =
        pass.done.into_iter().partition(|f| f.name == entry);
    for f in first.into_iter().chain(rest) {
        library.add(f)?;
    }
    let out = Graph::new(library, entry)?;
    verify(&out)?;
    Ok(out)
}

/// Entry parameters (variables) whose final values `functionalize_variables` returns after the
/// entry's own results, in that order: the variables the program may assign.
pub fn assigned_variables(graph: &Graph) -> Result<Vec<usize>> {
    Pass::new(&graph.library).assigned(&graph.entry)
}

fn has_resource_params(f: &Function) -> bool {
    f.params.iter().any(|p| matches!(p, ValueType::Resource(_)))
}

/// A variable's value type (what its resource becomes).
fn value_type(ty: &ValueType) -> ValueType {
    match ty {
        ValueType::Resource(t) => ValueType::Tensor(t.clone()),
        other => other.clone(),
    }
}

fn unsupported(f: &Function, id: NodeId, node: &Node, message: &str) -> Error {
    let at = node
        .location
        .as_ref()
        .map(|l| format!(" ({}:{})", l.file, l.line))
        .unwrap_or_default();
    Error::new(
        ErrorKind::Compile,
        node.kind.name(),
        format!("{message}: %{id} in @{}{at}", f.name),
    )
}

/// The index of the first operand and the functions that take the operands, for the nodes
/// that call functions.
fn calls(kind: &NodeKind) -> Option<(usize, Vec<&str>)> {
    match kind {
        NodeKind::If { .. } | NodeKind::Case { .. } => Some((1, kind.callees())),
        NodeKind::Call { .. } | NodeKind::While { .. } => Some((0, kind.callees())),
        NodeKind::Arg(_)
        | NodeKind::Const(_)
        | NodeKind::Op(_)
        | NodeKind::ReadVariable
        | NodeKind::AssignVariable
        | NodeKind::AssignAddVariable
        | NodeKind::StackNew { .. }
        | NodeKind::StackPush
        | NodeKind::StackPop => None,
    }
}

/// The resource parameter every resource value of `f` stands for. A resource comes from a
/// parameter, or out of a `While` that carried it (the same variable).
fn resource_roots(f: &Function) -> Result<HashMap<Port, usize>> {
    let mut roots = HashMap::new();
    for (id, node) in f.nodes.iter().enumerate() {
        for (k, ty) in node.outputs.iter().enumerate() {
            if !matches!(ty, ValueType::Resource(_)) {
                continue;
            }
            let root = match (&node.kind, node.inputs.get(k)) {
                (NodeKind::Arg(i), _) => *i,
                (NodeKind::While { .. }, Some(input)) => root_of(f, &roots, *input)?,
                _ => {
                    return Err(unsupported(
                        f,
                        id,
                        node,
                        "a variable handle returned by a node",
                    ))
                }
            };
            roots.insert(Port::new(id, k), root);
        }
    }
    Ok(roots)
}

fn root_of(f: &Function, roots: &HashMap<Port, usize>, port: Port) -> Result<usize> {
    roots.get(&port).copied().ok_or_else(|| {
        Error::internal(
            "functionalize_variables",
            format!(
                "@{}: %{}#{} is not a variable",
                f.name, port.node, port.output
            ),
        )
    })
}

struct Pass<'l> {
    library: &'l Library,
    /// Per function: which parameters (variables) it, or a function it calls, assigns.
    writes: HashMap<String, Vec<bool>>,
    visiting: HashSet<String>,
    /// (function, threaded results) -> name of its rewrite.
    names: HashMap<(String, Vec<usize>), String>,
    done: Vec<Function>,
}

impl<'l> Pass<'l> {
    fn new(library: &'l Library) -> Self {
        Pass {
            library,
            writes: HashMap::new(),
            visiting: HashSet::new(),
            names: HashMap::new(),
            done: Vec::new(),
        }
    }

    /// Parameters of `name` that it may assign, in order.
    fn assigned(&mut self, name: &str) -> Result<Vec<usize>> {
        let w = self.writes(name)?;
        Ok((0..w.len()).filter(|&i| w[i]).collect())
    }

    fn writes(&mut self, name: &str) -> Result<Vec<bool>> {
        if let Some(w) = self.writes.get(name) {
            return Ok(w.clone());
        }
        if !self.visiting.insert(name.to_string()) {
            return Err(Error::new(
                ErrorKind::Graph,
                "functionalize_variables",
                format!("@{name} calls itself"),
            ));
        }
        let f = self.library.get(name)?;
        let roots = resource_roots(f)?;
        let mut w = vec![false; f.params.len()];
        for (id, node) in f.nodes.iter().enumerate() {
            match &node.kind {
                NodeKind::AssignVariable | NodeKind::AssignAddVariable => {
                    w[root_of(f, &roots, node.inputs[0])?] = true;
                }
                kind => {
                    let Some((first, callees)) = calls(kind) else {
                        continue;
                    };
                    if let NodeKind::While { cond, .. } = kind {
                        if self.writes(cond)?.contains(&true) {
                            let why = "a while_loop condition that assigns a variable cannot be \
                                       compiled (assign it in the body)";
                            return Err(unsupported(f, id, node, why));
                        }
                    }
                    for callee in callees {
                        for (p, written) in self.writes(callee)?.into_iter().enumerate() {
                            if written {
                                w[root_of(f, &roots, node.inputs[first + p])?] = true;
                            }
                        }
                    }
                }
            }
        }
        self.visiting.remove(name);
        self.writes.insert(name.to_string(), w.clone());
        Ok(w)
    }

    /// The name of `name` rewritten to return, after its results, the final values of its
    /// parameters `outs`; rewritten on first use.
    fn rewrite(&mut self, name: &str, outs: &[usize]) -> Result<String> {
        let key = (name.to_string(), outs.to_vec());
        if let Some(found) = self.names.get(&key) {
            return Ok(found.clone());
        }
        let taken = |n: &str, names: &HashMap<_, String>| names.values().any(|v| v == n);
        let mut new_name = name.to_string();
        let mut k = 1;
        while taken(&new_name, &self.names)
            || (new_name != name && self.library.contains(&new_name))
        {
            new_name = format!("{name}_vars{k}");
            k += 1;
        }
        self.names.insert(key, new_name.clone());
        let f = self.library.get(name)?;
        let function = Rewrite::new(f, &new_name)?.run(self, outs)?;
        self.done.push(function);
        Ok(new_name)
    }
}

/// One function being rewritten: the new builder, where each old value went, and the current
/// value of each variable parameter.
struct Rewrite<'f> {
    f: &'f Function,
    roots: HashMap<Port, usize>,
    b: FunctionBuilder,
    ports: Vec<Vec<Port>>,
    current: Vec<Port>,
}

impl<'f> Rewrite<'f> {
    fn new(f: &'f Function, name: &str) -> Result<Self> {
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

    fn run(mut self, pass: &mut Pass<'_>, outs: &[usize]) -> Result<Function> {
        let f = self.f;
        for (id, node) in f.nodes.iter().enumerate() {
            let out = match &node.kind {
                NodeKind::Arg(k) => vec![self.current[*k]],
                NodeKind::ReadVariable => vec![self.current[self.root(node.inputs[0])?]],
                NodeKind::AssignVariable => {
                    let value = self.port(node.inputs[1])?;
                    self.store(node, value)?;
                    Vec::new()
                }
                NodeKind::AssignAddVariable => {
                    let old = self.current[self.root(node.inputs[0])?];
                    let delta = self.port(node.inputs[1])?;
                    let sum = self
                        .b
                        .add_op1(binary::Add, &[old, delta], node.location.clone())?;
                    self.store(node, sum)?;
                    Vec::new()
                }
                kind => match calls(kind) {
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
    /// has exactly the variable's type.
    fn store(&mut self, node: &Node, value: Port) -> Result<()> {
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
        if let NodeKind::While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
        } = &node.kind
        {
            self.check_passed_through(pass, id, node, body)?;
            let kind = NodeKind::While {
                cond: pass.rewrite(cond, &[])?,
                body: pass.rewrite(body, &[])?,
                maximum_iterations: *maximum_iterations,
                parallel_iterations: *parallel_iterations,
            };
            let outputs = node.outputs.iter().map(value_type).collect();
            let inputs = self.operands(node)?;
            let out = self.add(kind, node, &inputs, outputs)?;
            for &p in &written {
                let root = self.root(node.inputs[p])?;
                self.current[root] = out[p];
            }
            return Ok(out);
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
        let inputs = self.operands(node)?;
        let renamed = callees
            .iter()
            .map(|c| pass.rewrite(c, &written))
            .collect::<Result<Vec<_>>>()?;
        let kind = match &node.kind {
            NodeKind::If { .. } => NodeKind::If {
                then_branch: renamed[0].clone(),
                else_branch: renamed[1].clone(),
            },
            NodeKind::Case { .. } => NodeKind::Case { branches: renamed },
            _ => NodeKind::Call {
                function: renamed[0].clone(),
            },
        };
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

    /// A loop body returns each variable loop variable where it took it (tracing makes them
    /// loop variables the body passes through), so the loop variable can carry its value.
    fn check_passed_through(
        &self,
        pass: &Pass<'_>,
        id: NodeId,
        node: &Node,
        body: &str,
    ) -> Result<()> {
        let body = pass.library.get(body)?;
        let roots = resource_roots(body)?;
        for (k, ty) in body.params.iter().enumerate() {
            let ValueType::Resource(_) = ty else { continue };
            let passed = body.results.get(k).and_then(|r| roots.get(r)) == Some(&k);
            if !passed {
                let why = "a while_loop body that does not return its variable loop variables \
                           unchanged";
                return Err(unsupported(self.f, id, node, why));
            }
        }
        Ok(())
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
