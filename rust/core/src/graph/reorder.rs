//! Restores a function's canonical form after tracing: superseded nodes replaced by the nodes
//! that stand for them, `Arg` nodes first (in parameter order), the rest in a topological order
//! that keeps the original order wherever dependencies allow (stateful program order survives).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::ir::{Function, NodeId, NodeKind, Port};
use crate::error::{Error, ErrorKind, Result};

fn graph_error(message: String) -> Error {
    Error::new(ErrorKind::Graph, "graph builder", message)
}

/// See the module doc. `superseded` pairs are `(old, new)`; chains resolve transitively.
pub(super) fn canonicalize(f: &mut Function, superseded: &[(NodeId, NodeId)]) -> Result<()> {
    let replaced: HashMap<NodeId, NodeId> = superseded.iter().copied().collect();
    let resolve = |mut id: NodeId| {
        let mut hops = 0;
        while let Some(&next) = replaced.get(&id) {
            id = next;
            hops += 1;
            if hops > replaced.len() {
                break;
            }
        }
        id
    };
    let redirect = |p: Port| Port::new(resolve(p.node), p.output);
    for node in &mut f.nodes {
        for p in &mut node.inputs {
            *p = redirect(*p);
        }
        for c in &mut node.control_inputs {
            *c = resolve(*c);
        }
    }
    for p in &mut f.results {
        *p = redirect(*p);
    }
    for c in &mut f.control_outputs {
        *c = resolve(*c);
    }
    f.control_outputs.sort_unstable();
    f.control_outputs.dedup();
    for node in &mut f.nodes {
        node.control_inputs.sort_unstable();
        node.control_inputs.dedup();
    }

    let n = f.nodes.len();
    let live: Vec<bool> = (0..n).map(|i| !replaced.contains_key(&i)).collect();
    let mut dependents: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for (i, node) in f.nodes.iter().enumerate().filter(|(i, _)| live[*i]) {
        let mut deps: Vec<NodeId> = node.inputs.iter().map(|p| p.node).collect();
        deps.extend(&node.control_inputs);
        deps.sort_unstable();
        deps.dedup();
        for d in deps {
            if !live[d] {
                return Err(graph_error(format!(
                    "@{}: %{i} still uses replaced %{d}",
                    f.name
                )));
            }
            dependents[d].push(i);
            pending[i] += 1;
        }
    }
    let mut order: Vec<NodeId> = Vec::with_capacity(n);
    let mut args: Vec<(usize, NodeId)> = f
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| match node.kind {
            NodeKind::Arg(index) => Some((index, i)),
            _ => None,
        })
        .collect();
    args.sort_unstable();
    let mut ready: BinaryHeap<Reverse<NodeId>> = BinaryHeap::new();
    let release = |i: NodeId, ready: &mut BinaryHeap<Reverse<NodeId>>, pending: &mut [usize]| {
        for &d in &dependents[i] {
            pending[d] -= 1;
            if pending[d] == 0 {
                ready.push(Reverse(d));
            }
        }
    };
    for i in 0..n {
        if live[i] && pending[i] == 0 && !matches!(f.nodes[i].kind, NodeKind::Arg(_)) {
            ready.push(Reverse(i));
        }
    }
    for &(_, i) in &args {
        order.push(i);
        release(i, &mut ready, &mut pending);
    }
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        release(i, &mut ready, &mut pending);
    }
    let live_count = live.iter().filter(|&&l| l).count();
    if order.len() != live_count {
        return Err(graph_error(format!("@{}: the nodes form a cycle", f.name)));
    }
    let mut position = vec![usize::MAX; n];
    for (new, &old) in order.iter().enumerate() {
        position[old] = new;
    }
    let renumber = |p: Port| Port::new(position[p.node], p.output);
    let mut old_nodes: Vec<Option<super::ir::Node>> =
        std::mem::take(&mut f.nodes).into_iter().map(Some).collect();
    for &old in &order {
        let mut node = old_nodes[old].take().expect("each node is placed once");
        for p in &mut node.inputs {
            *p = renumber(*p);
        }
        for c in &mut node.control_inputs {
            *c = position[*c];
        }
        f.nodes.push(node);
    }
    for p in &mut f.results {
        *p = renumber(*p);
    }
    for c in &mut f.control_outputs {
        *c = position[*c];
    }
    Ok(())
}
