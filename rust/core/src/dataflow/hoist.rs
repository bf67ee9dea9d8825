//! `hoist_loop_constants`: a constant inside a loop becomes a constant of the root frame entered
//! into the loop as an invariant, delivered to every iteration without running a node there.
//!
//! Only where laziness is kept: each node that reads the constant is an op that also reads
//! something that is not a constant, so it still runs only when its branch or iteration does (a
//! merge, which passes on its first live input, keeps its gated constant).

use std::collections::HashMap;

use super::{DataflowGraph, DfKind, DfNode, FrameId};
use crate::graph::{NodeId, Port};

/// Rewrites `graph` in place (the constants left behind are read by nothing; execution skips
/// them).
pub fn hoist_loop_constants(graph: &mut DataflowGraph) {
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); graph.nodes.len()];
    for (id, node) in graph.nodes.iter().enumerate() {
        for p in &node.inputs {
            readers[p.node].push(id);
        }
    }
    let is_const = |g: &DataflowGraph, n: NodeId| matches!(g.nodes[n].kind, DfKind::Const(_));
    let hoistable: Vec<NodeId> = (0..graph.nodes.len())
        .filter(|&c| {
            let node = &graph.nodes[c];
            node.frame != 0
                && is_const(graph, c)
                && !readers[c].is_empty()
                && readers[c].iter().all(|&r| {
                    let reader = &graph.nodes[r];
                    matches!(reader.kind, DfKind::Op(_))
                        && reader.inputs.iter().any(|p| !is_const(graph, p.node))
                })
        })
        .collect();
    // (root constant, frame) -> the port delivering it in that frame.
    let mut entered: HashMap<(NodeId, FrameId), Port> = HashMap::new();
    for c in hoistable {
        let frame = graph.nodes[c].frame;
        let mut root = graph.nodes[c].clone();
        root.frame = 0;
        root.control_inputs.clear();
        graph.nodes.push(root);
        let root_id = graph.nodes.len() - 1;
        let port = enter(graph, &mut entered, root_id, frame);
        for &r in &readers[c] {
            for p in graph.nodes[r].inputs.iter_mut() {
                if p.node == c {
                    *p = port;
                }
            }
        }
    }
}

/// The port that delivers root node `root`'s value in `frame`: a constant `enter` per frame
/// level from the root down, shared by every constant hoisted into the same frame.
fn enter(
    graph: &mut DataflowGraph,
    entered: &mut HashMap<(NodeId, FrameId), Port>,
    root: NodeId,
    frame: FrameId,
) -> Port {
    if frame == 0 {
        return Port::new(root, 0);
    }
    if let Some(&p) = entered.get(&(root, frame)) {
        return p;
    }
    let parent = graph.frames[frame].parent;
    let outer = enter(graph, entered, root, parent);
    let template = &graph.nodes[root];
    let node = DfNode {
        kind: DfKind::Enter {
            frame,
            constant: true,
        },
        inputs: vec![outer],
        control_inputs: Vec::new(),
        outputs: template.outputs.clone(),
        frame: parent,
        origin: template.origin.clone(),
    };
    graph.nodes.push(node);
    let p = Port::new(graph.nodes.len() - 1, 0);
    entered.insert((root, frame), p);
    p
}
