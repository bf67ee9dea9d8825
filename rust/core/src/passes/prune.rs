//! `prune`: nodes the fetches and side effects do not need are dropped.

use crate::error::{Error, ErrorKind, Result};
use crate::graph::{Function, FunctionBuilder, Graph, Library, NodeKind, Port};

/// The graph whose entry returns the entry's results at `fetches` (indices) and keeps only the
/// nodes those results, or a side effect, need. Other functions are pruned of dead code too.
pub fn prune(graph: &Graph, fetches: &[usize]) -> Result<Graph> {
    let entry = graph.entry_function()?;
    let results = fetches
        .iter()
        .map(|&i| {
            entry.results.get(i).copied().ok_or_else(|| {
                Error::new(
                    ErrorKind::Index,
                    "prune",
                    format!(
                        "fetch {i} is out of range: @{} has {} results",
                        entry.name,
                        entry.results.len()
                    ),
                )
            })
        })
        .collect::<Result<Vec<Port>>>()?;
    let mut library = Library::new();
    for f in graph.library.iter() {
        let wanted = if f.name == entry.name {
            results.clone()
        } else {
            f.results.clone()
        };
        library.add(keep_needed(f, &wanted)?)?;
    }
    Graph::new(library, graph.entry.clone())
}

/// Every function without the nodes its results and side effects do not need.
pub fn eliminate_dead_code(graph: &Graph) -> Result<Graph> {
    let entry = graph.entry_function()?;
    let all: Vec<usize> = (0..entry.results.len()).collect();
    prune(graph, &all)
}

fn keep_needed(f: &Function, results: &[Port]) -> Result<Function> {
    let mut needed = vec![false; f.nodes.len()];
    let mut todo: Vec<usize> = results.iter().map(|p| p.node).collect();
    todo.extend(&f.control_outputs);
    while let Some(i) = todo.pop() {
        if !std::mem::replace(&mut needed[i], true) {
            todo.extend(f.nodes[i].inputs.iter().map(|p| p.node));
            todo.extend(&f.nodes[i].control_inputs);
        }
    }
    let (mut b, params) = FunctionBuilder::new(&f.name, f.params.clone());
    let mut ports: Vec<Vec<Port>> = Vec::with_capacity(f.nodes.len());
    let mut ids: Vec<Option<usize>> = Vec::with_capacity(f.nodes.len());
    for (i, node) in f.nodes.iter().enumerate() {
        if let NodeKind::Arg(k) = node.kind {
            ports.push(vec![params[k]]);
            ids.push(Some(k));
            continue;
        }
        if !needed[i] {
            ports.push(Vec::new());
            ids.push(None);
            continue;
        }
        let inputs: Vec<Port> = node
            .inputs
            .iter()
            .map(|p| ports[p.node][p.output])
            .collect();
        let out = b.add_node(node.kind.clone(), &inputs, node.outputs.clone())?;
        let id = b.len() - 1;
        if let Some(l) = &node.location {
            b.set_location(id, l.clone())?;
        }
        let control: Vec<usize> = node.control_inputs.iter().filter_map(|&c| ids[c]).collect();
        if !control.is_empty() {
            b.add_control_inputs(id, &control)?;
        }
        ports.push(out);
        ids.push(Some(id));
    }
    let results: Vec<Port> = results.iter().map(|p| ports[p.node][p.output]).collect();
    let effects: Vec<usize> = f.control_outputs.iter().filter_map(|&c| ids[c]).collect();
    b.finish(&results, &effects)
}
