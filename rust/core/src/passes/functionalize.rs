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
//!
//! Tracing uses the same rewrite on each construct as it is built (`thread_variables`), before
//! any gradient exists, so there an assignment must keep eager mode's gradient semantics: the
//! value assigned gets no gradient through the variable, and a read after the assignment
//! credits the variable as every read does (`Assignments::Credited`).

use super::{threading, Threading};
use crate::graph::VariableOp;
use std::collections::{HashMap, HashSet};

use super::functionalize_rewrite::Rewrite;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{
    verify, Function, FunctionBuilder, Graph, Library, Node, NodeId, NodeKind, Port, ValueType,
};
use crate::shape::TensorType;

/// How the rewrite writes an assignment to a float variable.
#[derive(Clone, Debug, Default)]
pub enum Assignments {
    /// The value assigned becomes the variable's value (compiled programs, whose gradients
    /// were built before).
    #[default]
    Plain,
    /// The variable's new value is `helper(old, new)`, a `Call` of the helper for its type
    /// (`assigned_value_functions`, by variable type): its value is `new`, and its gradient
    /// goes to `old` alone. So the value assigned gets no gradient through the variable, and
    /// the cotangent of every read, after assignments too, reaches the variable's value on
    /// entry, whose read credits the variable: eager mode's semantics.
    Credited(HashMap<TensorType, (String, String)>),
}

/// The helper `Assignments::Credited` calls for variables of type `ty`:
/// `name(old, new) -> new`, and its custom gradient
/// `gradient(old, new, result, cotangent) -> cotangent` (a gradient for `old` alone).
pub fn assigned_value_functions(
    ty: &TensorType,
    name: &str,
    gradient: &str,
) -> Result<(Function, Function)> {
    let t = ValueType::Tensor(ty.clone());
    let (b, args) = FunctionBuilder::new(name, vec![t.clone(), t.clone()]);
    let value = b.finish(&[args[1]], &[])?;
    let (b, args) = FunctionBuilder::new(gradient, vec![t; 4]);
    let grad = b.finish(&[args[3]], &[])?;
    Ok((value, grad))
}

/// The functions `callees` of one construct being traced (an `If`'s or a `Case`'s branches,
/// or a `While`'s cond and body) with their variables as values (`Assignments::Credited`
/// with `helpers`). Returns the parameters some callee assigns, in order, and the rewritten
/// functions: the callees keep their names; branches return the final value of each of those
/// parameters after their own results, and a loop body in the loop variable that carried the
/// variable. A construct without such a form (a loop condition that assigns a variable) is a
/// `Compile` error.
pub fn thread_variables(
    library: &Library,
    callees: &[&str],
    is_loop: bool,
    helpers: HashMap<TensorType, (String, String)>,
) -> Result<(Vec<usize>, Vec<Function>)> {
    for callee in callees {
        let f = library.get(callee)?;
        for &id in &f.control_outputs {
            let node = &f.nodes[id];
            let rewritten = matches!(
                node.kind,
                NodeKind::Variable(VariableOp::Assign) | NodeKind::Variable(VariableOp::AssignAdd)
            ) || calls(&node.kind).is_some();
            if !rewritten {
                return Err(unsupported(
                    f,
                    id,
                    node,
                    "a side effect without a value form",
                ));
            }
        }
    }
    let mut pass = Pass::new(library);
    pass.assignments = Assignments::Credited(helpers);
    let mut written: Vec<usize> = Vec::new();
    for callee in callees {
        for (p, w) in pass.writes(callee)?.into_iter().enumerate() {
            if w && !written.contains(&p) {
                written.push(p);
            }
        }
    }
    written.sort_unstable();
    if is_loop {
        let [cond, body] = callees else {
            return Err(Error::internal(
                "thread_variables",
                "a loop has a cond and a body",
            ));
        };
        if pass.writes(cond)?.contains(&true) {
            return Err(Error::new(
                ErrorKind::Compile,
                "while_loop",
                "a while_loop condition that assigns a variable",
            ));
        }
        passes_variables_through(library.get(body)?)?;
        pass.rewrite(cond, &[])?;
        pass.rewrite(body, &[])?;
    } else {
        for callee in callees {
            pass.rewrite(callee, &written)?;
        }
    }
    Ok((written, pass.done))
}

/// A loop body returns each variable loop variable where it took it (tracing makes them loop
/// variables the body passes through), so the loop variable can carry its value.
pub(super) fn passes_variables_through(body: &Function) -> Result<()> {
    let roots = resource_roots(body)?;
    for (k, ty) in body.params.iter().enumerate() {
        let ValueType::Resource(_) = ty else { continue };
        if body.results.get(k).and_then(|r| roots.get(r)) != Some(&k) {
            return Err(Error::new(
                ErrorKind::Compile,
                "while_loop",
                "a while_loop body that does not return its variable loop variables unchanged",
            ));
        }
    }
    Ok(())
}

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
pub(super) fn value_type(ty: &ValueType) -> ValueType {
    match ty {
        ValueType::Resource(t) => ValueType::Tensor(t.clone()),
        other => other.clone(),
    }
}

pub(super) fn unsupported(f: &Function, id: NodeId, node: &Node, message: &str) -> Error {
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
pub(super) fn calls(kind: &NodeKind) -> Option<(usize, Vec<&str>)> {
    let construct = kind.construct()?;
    let callees = construct.callees();
    (!callees.is_empty()).then(|| (construct.operand_start(), callees))
}

/// The resource parameter every resource value of `f` stands for. A resource comes from a
/// parameter, or out of a `While` that carried it (the same variable).
pub(super) fn resource_roots(f: &Function) -> Result<HashMap<Port, usize>> {
    let mut roots = HashMap::new();
    for (id, node) in f.nodes.iter().enumerate() {
        for (k, ty) in node.outputs.iter().enumerate() {
            if !matches!(ty, ValueType::Resource(_)) {
                continue;
            }
            let root = match (&node.kind, node.inputs.get(k)) {
                (NodeKind::Arg(i), _) => *i,
                (kind, Some(input)) if matches!(threading(kind), Threading::Loop { .. }) => {
                    root_of(f, &roots, *input)?
                }
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

pub(super) fn root_of(f: &Function, roots: &HashMap<Port, usize>, port: Port) -> Result<usize> {
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

pub(super) struct Pass<'l> {
    pub(super) library: &'l Library,
    /// Per function: which parameters (variables) it, or a function it calls, assigns.
    writes: HashMap<String, Vec<bool>>,
    visiting: HashSet<String>,
    /// (function, threaded results) -> name of its rewrite.
    names: HashMap<(String, Vec<usize>), String>,
    done: Vec<Function>,
    pub(super) assignments: Assignments,
}

impl<'l> Pass<'l> {
    fn new(library: &'l Library) -> Self {
        Pass {
            library,
            writes: HashMap::new(),
            visiting: HashSet::new(),
            names: HashMap::new(),
            done: Vec::new(),
            assignments: Assignments::Plain,
        }
    }

    /// Parameters of `name` that it may assign, in order.
    fn assigned(&mut self, name: &str) -> Result<Vec<usize>> {
        let w = self.writes(name)?;
        Ok((0..w.len()).filter(|&i| w[i]).collect())
    }

    pub(super) fn writes(&mut self, name: &str) -> Result<Vec<bool>> {
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
                NodeKind::Variable(VariableOp::Assign)
                | NodeKind::Variable(VariableOp::AssignAdd) => {
                    w[root_of(f, &roots, node.inputs[0])?] = true;
                }
                kind => {
                    let Some((first, callees)) = calls(kind) else {
                        continue;
                    };
                    if let Threading::Loop { cond, .. } = threading(kind) {
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
    pub(super) fn rewrite(&mut self, name: &str, outs: &[usize]) -> Result<String> {
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
