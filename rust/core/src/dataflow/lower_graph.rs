//! `lower`: a graph's entry function as one dataflow graph.

use super::build::{Builder, Scope};
use super::{hoist_loop_constants, verify, DataflowGraph, DfKind};
use crate::error::Result;
use crate::graph::{Graph, Port};

/// The entry of `graph` lowered (see the module doc): every call inlined, every construct
/// turned into switch / merge / enter / exit / next_iteration, loop constants hoisted
/// (`hoist_loop_constants`), checked by `verify`.
pub fn lower(graph: &Graph) -> Result<DataflowGraph> {
    let entry = graph.entry_function()?;
    let mut b = Builder::new(&graph.library);
    let root = Scope {
        frame: 0,
        gate: None,
        origin: None,
    };
    let args: Vec<Port> = entry
        .params
        .iter()
        .enumerate()
        .map(|(k, ty)| b.add1(&root, DfKind::Arg(k), Vec::new(), ty.clone()))
        .collect();
    let lowered = b.lower_function(&entry.name, &args, &root)?;
    let mut g = b.finish(&entry.name, entry.params.clone(), lowered.results);
    hoist_loop_constants(&mut g);
    verify(&g)?;
    Ok(g)
}
