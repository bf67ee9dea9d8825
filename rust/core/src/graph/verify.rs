//! The verifier: checks a graph's structure and types, as jax's `check_jaxpr` and tinygrad's
//! spec do, and reports the first problem as a `Graph` error naming the node and function
//! (`%7 in @body`) followed by the function's text around it, the bad line marked `>>`.
//!
//! Checked here: `Arg` nodes, edges (inputs and control inputs name earlier nodes and existing
//! outputs), results and control outputs, that every side effect stays reachable from the
//! results or control outputs (so no pass prunes it), and that no function calls itself.
//! Per-kind rules (op types, call signatures, variables, stacks) are in `verify_nodes`.

use std::collections::HashSet;

use super::ir::{Function, NodeId, NodeKind};
use super::library::{Graph, Library};
use super::text::listing;
use super::verify_nodes::check_node;
use crate::error::{Error, ErrorKind, Result};

/// Lines shown before and after the bad one.
const CONTEXT_LINES: usize = 3;

/// Checks every function of `graph`, that its entry exists, and that calls do not recurse.
pub fn verify(graph: &Graph) -> Result<()> {
    graph
        .library
        .get(&graph.entry)
        .map_err(|e| graph_error(format!("entry: {}", e.message)))?;
    for f in graph.library.iter() {
        verify_function(&graph.library, f)?;
    }
    check_recursion(&graph.library)
}

/// Checks one function; functions it calls are looked up in `library` for their signatures.
pub fn verify_function(library: &Library, f: &Function) -> Result<()> {
    if f.nodes.len() < f.params.len() {
        let n = f.params.len();
        return Err(at_return(
            f,
            format!(
                "{n} parameters need {n} Arg nodes, found only {}",
                f.nodes.len()
            ),
        ));
    }
    for (id, node) in f.nodes.iter().enumerate() {
        check_edges(f, id).map_err(|m| at_node(f, id, m))?;
        check_node(library, f, id, node).map_err(|m| at_node(f, id, m))?;
    }
    check_results(f)?;
    check_side_effects(library, f)
}

fn graph_error(message: String) -> Error {
    Error::new(ErrorKind::Graph, "verify", message)
}

/// An error at node `id` of `f`, with the text around it.
pub(crate) fn at_node(f: &Function, id: NodeId, message: String) -> Error {
    let l = listing(f);
    let line = l.node_lines.get(id).copied().flatten().unwrap_or(0);
    let excerpt = excerpt(&l.lines, line);
    graph_error(format!("%{id} in @{}: {message}\n{excerpt}", f.name))
}

fn at_return(f: &Function, message: String) -> Error {
    let l = listing(f);
    let excerpt = excerpt(&l.lines, l.return_line);
    graph_error(format!("return of @{}: {message}\n{excerpt}", f.name))
}

/// Lines around `target`, marked with `>>`.
fn excerpt(lines: &[String], target: usize) -> String {
    let lo = target.saturating_sub(CONTEXT_LINES);
    let hi = (target + CONTEXT_LINES + 1).min(lines.len());
    let mut out = Vec::new();
    if lo > 0 {
        out.push("     ...".to_string());
    }
    for (i, line) in lines.iter().enumerate().take(hi).skip(lo) {
        let mark = if i == target { ">>" } else { "  " };
        out.push(format!("  {mark} {line}"));
    }
    if hi < lines.len() {
        out.push("     ...".to_string());
    }
    out.join("\n")
}

/// Inputs name outputs of earlier nodes; control inputs name earlier nodes.
fn check_edges(f: &Function, id: NodeId) -> Result<(), String> {
    let node = &f.nodes[id];
    for (k, p) in node.inputs.iter().enumerate() {
        if p.node >= id {
            return Err(format!(
                "input {k} (%{}) is not defined before this node ({})",
                p.node, "nodes must be in topological order"
            ));
        }
        let n = f.nodes[p.node].outputs.len();
        if p.output >= n {
            return Err(format!(
                "input {k} is output #{} of %{}, which has {n} output(s)",
                p.output, p.node
            ));
        }
    }
    match node.control_inputs.iter().find(|&&c| c >= id) {
        Some(c) => Err(format!("control input %{c} is not an earlier node")),
        None => Ok(()),
    }
}

fn check_results(f: &Function) -> Result<()> {
    for (k, &p) in f.results.iter().enumerate() {
        if f.port_type(p).is_err() {
            return Err(at_return(
                f,
                format!("result {k} (%{}#{}) names no value", p.node, p.output),
            ));
        }
    }
    match f.control_outputs.iter().find(|&&c| c >= f.nodes.len()) {
        Some(c) => Err(at_return(f, format!("control output %{c} names no node"))),
        None => Ok(()),
    }
}

/// Whether running `kind` has an effect beyond its outputs.
fn has_side_effect(library: &Library, kind: &NodeKind) -> bool {
    kind.has_side_effect()
        || kind
            .callees()
            .iter()
            .any(|c| library.get(c).is_ok_and(|g| !g.control_outputs.is_empty()))
}

/// Every side effect is a control output or an ancestor of one or of a result.
fn check_side_effects(library: &Library, f: &Function) -> Result<()> {
    let mut kept: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = f.results.iter().map(|p| p.node).collect();
    stack.extend(&f.control_outputs);
    while let Some(n) = stack.pop() {
        if n < f.nodes.len() && kept.insert(n) {
            let node = &f.nodes[n];
            stack.extend(node.inputs.iter().map(|p| p.node));
            stack.extend(&node.control_inputs);
        }
    }
    for (id, node) in f.nodes.iter().enumerate() {
        if !kept.contains(&id) && has_side_effect(library, &node.kind) {
            let what = node.kind.name();
            return Err(at_node(
                f,
                id,
                format!(
                    "{what} has side effects but is not a control output of @{} {}",
                    f.name, "(nor an ancestor of one or of a result), so passes would prune it"
                ),
            ));
        }
    }
    Ok(())
}

/// Fails if any function reaches itself through the functions its nodes call.
fn check_recursion(library: &Library) -> Result<()> {
    let mut done: HashSet<&str> = HashSet::new();
    for f in library.iter() {
        let mut path = Vec::new();
        visit(library, &f.name, &mut path, &mut done)?;
    }
    Ok(())
}

fn visit<'a>(
    library: &'a Library,
    name: &'a str,
    path: &mut Vec<&'a str>,
    done: &mut HashSet<&'a str>,
) -> Result<()> {
    if let Some(start) = path.iter().position(|&p| p == name) {
        let cycle: Vec<String> = path[start..]
            .iter()
            .chain([&name])
            .map(|n| format!("@{n}"))
            .collect();
        return Err(graph_error(format!(
            "@{name} calls itself: {}",
            cycle.join(" -> ")
        )));
    }
    if done.contains(name) {
        return Ok(());
    }
    let Ok(f) = library.get(name) else {
        return Ok(()); // a missing callee is reported by the node that calls it
    };
    path.push(name);
    for node in &f.nodes {
        for callee in node.kind.callees() {
            visit(library, callee, path, done)?;
        }
    }
    path.pop();
    done.insert(name);
    Ok(())
}
