//! `inline_calls`: function calls replaced by their bodies.

use crate::graph::Call;
use std::collections::HashSet;

use crate::error::{Error, ErrorKind, Result};
use crate::graph::inline_into;
use crate::graph::{Function, FunctionBuilder, Graph, Library, NodeKind, Port};

/// The graph with every `Call` node (in every function) replaced by its callee's nodes. Functions
/// only reached through calls are dropped.
pub fn inline_calls(graph: &Graph) -> Result<Graph> {
    let mut library = Library::new();
    for f in graph.library.iter() {
        library.add(inline_function(&graph.library, f, &mut Vec::new())?)?;
    }
    let called: HashSet<String> = library
        .iter()
        .flat_map(|f| f.nodes.iter())
        .flat_map(|n| n.kind.referenced())
        .map(str::to_string)
        .collect();
    let mut kept = Library::new();
    for f in library.iter() {
        if f.name == graph.entry || called.contains(&f.name) {
            kept.add(f.clone())?;
        }
    }
    Graph::new(kept, graph.entry.clone())
}

fn inline_function(library: &Library, f: &Function, stack: &mut Vec<String>) -> Result<Function> {
    if !f
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Call(Call { .. })))
    {
        return Ok(f.clone());
    }
    if stack.contains(&f.name) {
        return Err(Error::new(
            ErrorKind::Graph,
            "inline",
            format!("@{} calls itself (through {})", f.name, stack.join(" -> ")),
        ));
    }
    stack.push(f.name.clone());
    let (mut b, params) = FunctionBuilder::new(&f.name, f.params.clone());
    let mut ports: Vec<Vec<Port>> = Vec::with_capacity(f.nodes.len());
    let mut ids: Vec<Option<usize>> = Vec::with_capacity(f.nodes.len());
    let mut effects = Vec::new();
    let control_outputs: HashSet<usize> = f.control_outputs.iter().copied().collect();
    for (i, node) in f.nodes.iter().enumerate() {
        let inputs: Vec<Port> = node
            .inputs
            .iter()
            .map(|p| ports[p.node][p.output])
            .collect();
        let control: Vec<usize> = node.control_inputs.iter().filter_map(|&c| ids[c]).collect();
        match &node.kind {
            NodeKind::Arg(k) => {
                ports.push(vec![params[*k]]);
                ids.push(None);
            }
            NodeKind::Call(Call { function, .. }) => {
                let callee = inline_function(library, library.get(function)?, stack)?;
                let first = b.len();
                let (results, callee_effects) = inline_into(&mut b, &callee, &inputs)?;
                // Ordering: the callee's first node runs after this call's control inputs.
                if let (Some(_), false) = (b.node(first).ok(), control.is_empty()) {
                    b.add_control_inputs(first, &control)?;
                }
                if control_outputs.contains(&i) {
                    effects.extend(callee_effects);
                }
                ports.push(results);
                ids.push(b.len().checked_sub(1));
            }
            kind => {
                let out = b.add_node(kind.clone(), &inputs, node.outputs.clone())?;
                let id = b.len() - 1;
                if let Some(l) = &node.location {
                    b.set_location(id, l.clone())?;
                }
                if !control.is_empty() {
                    b.add_control_inputs(id, &control)?;
                }
                if control_outputs.contains(&i) {
                    effects.push(id);
                }
                ports.push(out);
                ids.push(Some(id));
            }
        }
    }
    stack.pop();
    let results: Vec<Port> = f.results.iter().map(|p| ports[p.node][p.output]).collect();
    b.finish(&results, &effects)
}
