//! The lowered graph's text: one line per node, in node order (a loop's `merge` names its
//! `next_iteration`, a later node), each tagged with its frame when it runs inside a loop.
//!
//! A fused loop's nodes follow its line, indented and numbered within the loop (its inputs
//! first, as `arg`s).
//!
//! ```text
//! dataflow @count(i64[]) -> (i64[])
//!   frame 1 in 0 {parallel_iterations=10}
//!   %0 = arg 0 : i64[]
//!   %2 = enter(%1) {frame=1} : i64[]
//!   %3 = merge(%2, %9) {loop} : i64[] [frame 1]
//!   ...
//!   return %10
//! ```

use std::fmt;

use super::{DataflowGraph, DfKind, DfNode};
use crate::graph::text::const_text;
use crate::graph::{NodeRule, Port};

impl fmt::Display for DataflowGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let types = |ts: &[crate::graph::ValueType]| {
            ts.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(f, "dataflow @{}({})", self.name, types(&self.params))?;
        for (id, frame) in self.frames.iter().enumerate().skip(1) {
            let stateful = if frame.stateful { ", stateful" } else { "" };
            writeln!(
                f,
                "  frame {id} in {} {{parallel_iterations={}{stateful}}}",
                frame.parent, frame.parallel_iterations
            )?;
        }
        write_nodes(f, self, "  ")?;
        let results: Vec<String> = self.results.iter().map(|&p| port(self, p)).collect();
        write!(f, "  return {}", results.join(", "))?;
        if !self.targets.is_empty() {
            let ids: Vec<String> = self.targets.iter().map(|t| format!("%{t}")).collect();
            write!(f, " targets({})", ids.join(", "))?;
        }
        writeln!(f)
    }
}

/// One line per node, a fused loop's nodes indented below it.
fn write_nodes(f: &mut fmt::Formatter<'_>, graph: &DataflowGraph, indent: &str) -> fmt::Result {
    for (id, node) in graph.nodes.iter().enumerate() {
        writeln!(f, "{indent}{}", NodeLine { graph, id, node })?;
        if let DfKind::Loop(l) = &node.kind {
            let body = DataflowGraph {
                name: String::new(),
                params: Vec::new(),
                nodes: l.nodes.clone(),
                frames: Vec::new(),
                results: Vec::new(),
                targets: Vec::new(),
            };
            write_nodes(f, &body, &format!("{indent}    "))?;
        }
    }
    Ok(())
}

fn port(graph: &DataflowGraph, p: Port) -> String {
    match graph.nodes.get(p.node) {
        Some(n) if n.outputs.len() == 1 && p.output == 0 => format!("%{}", p.node),
        _ => format!("%{}#{}", p.node, p.output),
    }
}

struct NodeLine<'a> {
    graph: &'a DataflowGraph,
    id: usize,
    node: &'a DfNode,
}

impl fmt::Display for NodeLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self.node;
        let inputs: Vec<String> = node.inputs.iter().map(|&p| port(self.graph, p)).collect();
        match &node.kind {
            DfKind::Arg(i) => write!(f, "%{} = arg {i}", self.id)?,
            kind => write!(f, "%{} = {}({})", self.id, kind.name(), inputs.join(", "))?,
        }
        let attrs: Vec<String> = match &node.kind {
            DfKind::Const(c) => vec![format!("value={}", const_text(c))],
            DfKind::Op(op) => op
                .attrs()
                .into_iter()
                .map(|(n, a)| format!("{n}={a}"))
                .collect(),
            DfKind::Enter { frame, constant } => {
                let mut a = vec![format!("frame={frame}")];
                if *constant {
                    a.push("constant".into());
                }
                a
            }
            DfKind::Merge { loop_merge: true } => vec!["loop".into()],
            DfKind::Loop(l) => vec![
                format!("frame={}", l.frame),
                format!("nodes={}", l.nodes.len() - l.invariant.len()),
            ],
            DfKind::Stack(s) => s
                .attrs()
                .into_iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect(),
            _ => Vec::new(),
        };
        if !attrs.is_empty() {
            write!(f, " {{{}}}", attrs.join(", "))?;
        }
        if !node.control_inputs.is_empty() {
            let ids: Vec<String> = node
                .control_inputs
                .iter()
                .map(|c| format!("%{c}"))
                .collect();
            write!(f, " ctrl({})", ids.join(", "))?;
        }
        match node.outputs.as_slice() {
            [] => write!(f, " : ()")?,
            [one] => write!(f, " : {one}")?,
            many => {
                let types: Vec<String> = many.iter().map(ToString::to_string).collect();
                write!(f, " : ({})", types.join(", "))?;
            }
        }
        if node.frame != 0 {
            write!(f, " [frame {}]", node.frame)?;
        }
        Ok(())
    }
}
