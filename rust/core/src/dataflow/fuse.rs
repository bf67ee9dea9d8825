//! `fuse_frames`: a loop frame whose every node is cheap becomes one `loop` node, which an
//! executor runs as a sequential program (one iteration after another, nodes in a fixed order,
//! dead flags instead of queued tokens).
//!
//! Tokens, frames and iteration windows exist so that independent work can run concurrently.
//! For a frame of nodes too small to be worth another thread they only cost: the frame's work
//! runs under the run's lock on one thread either way. Fusing keeps the semantics: a node with
//! a dead input does not run, a merge passes its first live input, a dead `next_iteration`
//! ends the loop, and the node is dead when any entry is (a dead frame). Inner frames fuse
//! first, so a loop nest of cheap nodes becomes one node.
//!
//! ```text
//!   %2 = enter(%0) {frame=1}               %9 = loop(%0, %1) {frame=1, nodes=12}
//!   %3 = enter(%1) {frame=1, constant}       (%2..%8 and the exits, in one program)
//!   ...                                ->
//!   %8 = exit(%6) [frame 1]
//!   %10 = add(%8, %8)                      %10 = add(%9, %9)
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::{verify, DataflowGraph, DfKind, DfNode, FusedFrame};
use crate::error::Result;
use crate::graph::{NodeId, Port};

/// `graph` with every frame fused whose nodes `cheap` accepts (and whose inner frames fused),
/// innermost first; nodes nothing needs are dropped. Checked by `verify`.
pub fn fuse_frames(
    graph: &DataflowGraph,
    cheap: impl Fn(&DataflowGraph, NodeId) -> bool,
) -> Result<DataflowGraph> {
    let mut g = graph.clone();
    let mut alive = g.needed();
    // A frame's id is greater than its parent's: children come first from the end.
    for frame in (1..g.frames.len()).rev() {
        if let Some(fused) = plan_fusion(&g, &alive, frame, &cheap) {
            apply(&mut g, &mut alive, fused);
        }
    }
    let g = compact(g, &alive);
    verify(&g)?;
    Ok(g)
}

/// What fusing one frame changes.
struct Fusion {
    members: Vec<NodeId>,
    enters: Vec<NodeId>,
    /// The frame's exits, in the fused node's output order.
    exits: Vec<NodeId>,
    node: DfNode,
}

/// The fused node of `frame`, or `None` when a node is not cheap, an inner frame did not
/// fuse, or something outside the frame reads more than its exits.
fn plan_fusion(
    g: &DataflowGraph,
    alive: &[bool],
    frame: usize,
    cheap: &impl Fn(&DataflowGraph, NodeId) -> bool,
) -> Option<Fusion> {
    let live = |id: &NodeId| alive[*id];
    let members: Vec<NodeId> = (0..g.nodes.len())
        .filter(|&id| live(&id) && g.nodes[id].frame == frame)
        .collect();
    let enters: Vec<NodeId> = (0..g.nodes.len())
        .filter(|&id| {
            live(&id) && matches!(g.nodes[id].kind, DfKind::Enter { frame: f, .. } if f == frame)
        })
        .collect();
    if members.is_empty() || enters.is_empty() {
        return None;
    }
    let fusible = |id: NodeId| {
        !matches!(g.nodes[id].kind, DfKind::Arg(_) | DfKind::Enter { .. }) && cheap(g, id)
    };
    if !members.iter().all(|&id| fusible(id)) {
        return None;
    }
    let inside: HashSet<NodeId> = enters.iter().chain(&members).copied().collect();
    let is_exit = |id: NodeId| matches!(g.nodes[id].kind, DfKind::Exit);
    for (id, node) in g.nodes.iter().enumerate() {
        if !alive[id] || inside.contains(&id) {
            continue;
        }
        let data_ok = node
            .inputs
            .iter()
            .all(|p| !inside.contains(&p.node) || is_exit(p.node));
        let control_ok = node.control_inputs.iter().all(|c| !inside.contains(c));
        if !data_ok || !control_ok {
            return None;
        }
    }
    // A loop merge alone reads an entry that is not constant (in iteration 0) and a
    // `next_iteration` (from the iteration before): the program keeps no other copies.
    for &id in &members {
        for (slot, p) in g.nodes[id].inputs.iter().enumerate() {
            let from = &g.nodes[p.node].kind;
            let carried = matches!(
                from,
                DfKind::NextIteration
                    | DfKind::Enter {
                        constant: false,
                        ..
                    }
            );
            let merge = matches!(g.nodes[id].kind, DfKind::Merge { loop_merge: true });
            if carried && !(merge && slot == usize::from(matches!(from, DfKind::NextIteration))) {
                return None;
            }
        }
    }
    let order = schedule(g, &members)?;

    // Inner numbering: the entries as args, then the schedule.
    let mut local: HashMap<NodeId, usize> = HashMap::new();
    let mut nodes: Vec<DfNode> = Vec::new();
    for (k, &e) in enters.iter().enumerate() {
        local.insert(e, k);
        let enter = &g.nodes[e];
        nodes.push(DfNode {
            kind: DfKind::Arg(k),
            inputs: Vec::new(),
            control_inputs: Vec::new(),
            outputs: enter.outputs.clone(),
            frame: 0,
            origin: enter.origin.clone(),
        });
    }
    for &id in &order {
        local.insert(id, nodes.len());
        nodes.push(g.nodes[id].clone());
    }
    for node in &mut nodes[enters.len()..] {
        node.frame = 0;
        for p in &mut node.inputs {
            p.node = *local.get(&p.node)?;
        }
        for c in &mut node.control_inputs {
            *c = *local.get(c)?;
        }
    }
    let exits: Vec<NodeId> = order.iter().filter(|&&id| is_exit(id)).copied().collect();
    let invariant = enters
        .iter()
        .map(|&e| matches!(g.nodes[e].kind, DfKind::Enter { constant: true, .. }))
        .collect();
    let mut control_inputs: Vec<NodeId> = Vec::new();
    for &e in &enters {
        for &c in &g.nodes[e].control_inputs {
            if !control_inputs.contains(&c) {
                control_inputs.push(c);
            }
        }
    }
    let node = DfNode {
        kind: DfKind::Loop(Arc::new(FusedFrame {
            frame,
            repeats: true,
            invariant,
            nodes,
            results: exits.iter().map(|e| Port::new(local[e], 0)).collect(),
        })),
        inputs: enters.iter().map(|&e| g.nodes[e].inputs[0]).collect(),
        control_inputs,
        outputs: exits
            .iter()
            .map(|&e| g.nodes[e].outputs[0].clone())
            .collect(),
        frame: g.frames[frame].parent,
        origin: g.nodes[enters[0]].origin.clone(),
    };
    Some(Fusion {
        members,
        enters,
        exits,
        node,
    })
}

/// The root frame of `graph` (after `fuse_frames`) as one program, when `cheap` accepts every
/// node it needs: a run is then one pass over it, without tokens or a queue.
pub fn fuse_root(
    graph: &DataflowGraph,
    cheap: impl Fn(&DataflowGraph, NodeId) -> bool,
) -> Option<FusedFrame> {
    let needed = graph.needed();
    let is_arg = |id: NodeId| matches!(graph.nodes[id].kind, DfKind::Arg(_));
    let members: Vec<NodeId> = (0..graph.nodes.len())
        .filter(|&id| needed[id] && graph.nodes[id].frame == 0 && !is_arg(id))
        .collect();
    if !members.iter().all(|&id| cheap(graph, id)) {
        return None;
    }
    let order = schedule(graph, &members)?;
    let mut local: HashMap<NodeId, usize> = HashMap::new();
    let mut nodes: Vec<DfNode> = graph
        .params
        .iter()
        .enumerate()
        .map(|(k, ty)| DfNode {
            kind: DfKind::Arg(k),
            inputs: Vec::new(),
            control_inputs: Vec::new(),
            outputs: vec![ty.clone()],
            frame: 0,
            origin: None,
        })
        .collect();
    for (id, node) in graph.nodes.iter().enumerate() {
        if let (true, DfKind::Arg(k)) = (needed[id], &node.kind) {
            local.insert(id, *k);
        }
    }
    for &id in &order {
        local.insert(id, nodes.len());
        nodes.push(graph.nodes[id].clone());
    }
    let args = graph.params.len();
    for node in &mut nodes[args..] {
        for p in &mut node.inputs {
            p.node = *local.get(&p.node)?;
        }
        for c in &mut node.control_inputs {
            *c = *local.get(c)?;
        }
    }
    let results = graph
        .results
        .iter()
        .map(|p| Some(Port::new(*local.get(&p.node)?, p.output)))
        .collect::<Option<_>>()?;
    Some(FusedFrame {
        frame: 0,
        repeats: false,
        invariant: vec![false; args],
        nodes,
        results,
    })
}

/// The frame's nodes in an order where each follows what it reads (a loop merge's
/// `next_iteration` excepted), loop merges first; `None` on a cycle.
fn schedule(g: &DataflowGraph, members: &[NodeId]) -> Option<Vec<NodeId>> {
    let loop_merge = |id: NodeId| matches!(g.nodes[id].kind, DfKind::Merge { loop_merge: true });
    let mut waiting: HashMap<NodeId, usize> = HashMap::new();
    let mut readers: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &id in members {
        let node = &g.nodes[id];
        let sources: Vec<NodeId> = if loop_merge(id) {
            Vec::new()
        } else {
            node.inputs
                .iter()
                .map(|p| p.node)
                .chain(node.control_inputs.iter().copied())
                .filter(|s| members.binary_search(s).is_ok())
                .collect()
        };
        waiting.insert(id, sources.len());
        for s in sources {
            readers.entry(s).or_default().push(id);
        }
    }
    let mut ready: VecDeque<NodeId> = members
        .iter()
        .copied()
        .filter(|&id| loop_merge(id))
        .collect();
    ready.extend(
        members
            .iter()
            .copied()
            .filter(|&id| !loop_merge(id) && waiting[&id] == 0),
    );
    let mut order = Vec::with_capacity(members.len());
    while let Some(id) = ready.pop_front() {
        order.push(id);
        for &r in readers.get(&id).map_or(&[][..], Vec::as_slice) {
            let w = waiting.get_mut(&r)?;
            *w -= 1;
            if *w == 0 {
                ready.push_back(r);
            }
        }
    }
    (order.len() == members.len()).then_some(order)
}

/// Appends the fused node, points the exits' readers at it, and retires the frame's nodes.
fn apply(g: &mut DataflowGraph, alive: &mut Vec<bool>, fusion: Fusion) {
    let id = g.nodes.len();
    let exits: HashMap<NodeId, usize> = fusion
        .exits
        .iter()
        .enumerate()
        .map(|(k, &e)| (e, k))
        .collect();
    let redirect = |p: &mut Port| {
        if let Some(&k) = exits.get(&p.node) {
            *p = Port::new(id, k);
        }
    };
    for node in &mut g.nodes {
        node.inputs.iter_mut().for_each(redirect);
    }
    g.results.iter_mut().for_each(redirect);
    let members = &fusion.members;
    let had_target = g.targets.iter().any(|t| members.contains(t));
    g.targets.retain(|t| !members.contains(t));
    if had_target {
        g.targets.push(id);
    }
    for &m in members.iter().chain(&fusion.enters) {
        alive[m] = false;
    }
    g.nodes.push(fusion.node);
    alive.push(true);
}

/// Keeps the nodes marked alive, renumbered in order.
fn compact(mut g: DataflowGraph, alive: &[bool]) -> DataflowGraph {
    let mut new_id = vec![usize::MAX; g.nodes.len()];
    let mut next = 0;
    for (id, &a) in alive.iter().enumerate() {
        if a {
            new_id[id] = next;
            next += 1;
        }
    }
    let nodes = std::mem::take(&mut g.nodes);
    g.nodes = nodes
        .into_iter()
        .zip(alive)
        .filter(|(_, &a)| a)
        .map(|(mut node, _)| {
            node.inputs.iter_mut().for_each(|p| p.node = new_id[p.node]);
            node.control_inputs.iter_mut().for_each(|c| *c = new_id[*c]);
            node
        })
        .collect();
    g.results.iter_mut().for_each(|p| p.node = new_id[p.node]);
    g.targets.iter_mut().for_each(|t| *t = new_id[*t]);
    g
}
