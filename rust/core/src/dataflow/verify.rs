//! The lowered graph's structural rules: ports name outputs, every edge stays in its frame
//! (only `enter`, `exit` and `next_iteration` cross), loop merges pair an `enter` with a
//! `next_iteration`, and the results and targets sit in the root frame.

use super::{DataflowGraph, DfKind, FrameId};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Port;

fn bad(id: usize, message: String) -> Error {
    Error::new(ErrorKind::Graph, "dataflow", format!("%{id}: {message}"))
}

/// The frame a node's outputs are delivered to.
pub(crate) fn destination_frame(graph: &DataflowGraph, node: usize) -> FrameId {
    let n = &graph.nodes[node];
    match n.kind {
        DfKind::Enter { frame, .. } => frame,
        DfKind::Exit => graph.frames.get(n.frame).map_or(0, |f| f.parent),
        _ => n.frame,
    }
}

/// Checks the rules of the module doc; the error names the first node that breaks one.
pub fn verify(graph: &DataflowGraph) -> Result<()> {
    let n = graph.nodes.len();
    let output = |p: Port| {
        graph
            .nodes
            .get(p.node)
            .is_some_and(|m| p.output < m.outputs.len())
    };
    for (id, frame) in graph.frames.iter().enumerate().skip(1) {
        if frame.parent >= id {
            return Err(bad(
                id,
                format!(
                    "frame {id} has parent {} (not an earlier frame)",
                    frame.parent
                ),
            ));
        }
    }
    for (id, node) in graph.nodes.iter().enumerate() {
        if node.frame >= graph.frames.len() {
            return Err(bad(
                id,
                format!("runs in frame {}, which does not exist", node.frame),
            ));
        }
        for &p in &node.inputs {
            if !output(p) {
                return Err(bad(
                    id,
                    format!("reads %{}#{}, which is no output", p.node, p.output),
                ));
            }
            let from = destination_frame(graph, p.node);
            if from != node.frame {
                return Err(bad(
                    id,
                    format!(
                        "in frame {} reads %{} delivered to frame {from}",
                        node.frame, p.node
                    ),
                ));
            }
        }
        for &c in &node.control_inputs {
            let ok = c < n
                && graph.nodes[c].frame == node.frame
                && !matches!(
                    graph.nodes[c].kind,
                    DfKind::Enter { .. }
                        | DfKind::Exit
                        | DfKind::NextIteration
                        | DfKind::Switch { .. }
                );
            if !ok {
                return Err(bad(
                    id,
                    format!("control input %{c} is not a node of the same frame"),
                ));
            }
        }
        match &node.kind {
            DfKind::Enter { frame, .. }
                if graph
                    .frames
                    .get(*frame)
                    .is_none_or(|f| f.parent != node.frame || *frame == 0) =>
            {
                return Err(bad(
                    id,
                    format!("enters frame {frame} from frame {}", node.frame),
                ));
            }
            DfKind::Exit | DfKind::NextIteration if node.frame == 0 => {
                return Err(bad(id, format!("{} in the root frame", node.kind.name())));
            }
            DfKind::Merge { loop_merge: true } => {
                let kinds: Vec<&DfKind> = node
                    .inputs
                    .iter()
                    .map(|p| &graph.nodes[p.node].kind)
                    .collect();
                if !matches!(
                    kinds.as_slice(),
                    [DfKind::Enter { .. }, DfKind::NextIteration]
                ) {
                    return Err(bad(
                        id,
                        "a loop merge reads an enter and a next_iteration".into(),
                    ));
                }
            }
            DfKind::Merge { loop_merge: false } if node.inputs.is_empty() => {
                return Err(bad(id, "a merge needs inputs".into()));
            }
            DfKind::Switch { outputs } if node.inputs.len() != 2 || *outputs < 2 => {
                return Err(bad(
                    id,
                    "a switch takes (data, selector) and has 2 or more outputs".into(),
                ));
            }
            _ => {}
        }
    }
    for &p in &graph.results {
        if !output(p) || destination_frame(graph, p.node) != 0 {
            return Err(bad(
                p.node,
                "a result must be an output in the root frame".into(),
            ));
        }
    }
    for &t in &graph.targets {
        if graph.nodes.get(t).is_none_or(|m| m.frame == usize::MAX) {
            return Err(bad(t, "a target names no node".into()));
        }
    }
    Ok(())
}
