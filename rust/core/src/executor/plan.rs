//! The executor's plan: built once per lowered graph and shared by every run. It keeps only
//! the nodes the results and side effects need, numbers each node within its frame (the index
//! of its pending count and first input slot in an iteration's state), and lists where each
//! output goes.

use std::sync::Arc;

use smallvec::SmallVec;

use super::checked::{checked_types, CheckedTypes};
use super::frame::{FusedLoop, FusedLoops};

use crate::dataflow::{DataflowGraph, DfKind, DfNode};
use crate::error::{Error, Result};

/// Where one output goes: an input slot of a node (in the frame the output is delivered to),
/// or a result of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Input { node: u32, slot: u32 },
    Result(u32),
}

/// What a run needs about one node.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodePlan {
    /// Index within its frame (pending counts, dead flags).
    pub local: u32,
    /// First input slot within its frame.
    pub slot_base: u32,
    /// Per output, its consumers.
    pub outputs: SmallVec<[SmallVec<[Target; 2]>; 1]>,
    /// Nodes with a control input on this one.
    pub control_out: SmallVec<[u32; 2]>,
    /// Whether the node only passes its one input on (identity, enter, exit, next_iteration,
    /// a loop's merge, without control inputs): it is run where its token arrives, never
    /// queued.
    pub forward: bool,
    /// For an op whose input and output types are all static: those types. Inputs of exactly
    /// these types passed the op's rule when the graph was built, so the kernel runs without
    /// checking it again.
    pub checked: Option<Box<CheckedTypes>>,
    /// For a fused loop: the loop, compiled.
    pub fused: Option<Arc<FusedLoop>>,
}

/// What a run needs about one frame.
#[derive(Clone, Debug, Default)]
pub(crate) struct FramePlan {
    /// Iterations in flight at once (1 for a stateful loop: its iterations run in order).
    pub window: usize,
    /// Initial pending count of each node of the frame, by local index.
    pub pending: Vec<u32>,
    /// Input slots of all its nodes.
    pub slots: usize,
    /// Needed `enter` nodes into the frame: a frame's first iteration is complete only when
    /// each has delivered.
    pub enters: usize,
}

/// The immutable plan of a lowered graph.
#[derive(Debug)]
pub(crate) struct Plan {
    pub graph: DataflowGraph,
    pub nodes: Vec<NodePlan>,
    pub frames: Vec<FramePlan>,
    /// Root nodes with nothing to wait for: they start a run.
    pub sources: Vec<u32>,
}

impl Plan {
    /// Plans `graph`; its fused loops come from `loops` (compiled there once, shared with
    /// whoever else runs them).
    pub fn build(graph: DataflowGraph, loops: &mut FusedLoops) -> Result<Plan> {
        let needed = graph.needed();
        let mut frames: Vec<FramePlan> = graph
            .frames
            .iter()
            .map(|f| FramePlan {
                window: if f.stateful {
                    1
                } else {
                    f.parallel_iterations.max(1) as usize
                },
                ..FramePlan::default()
            })
            .collect();
        let mut nodes: Vec<NodePlan> = vec![NodePlan::default(); graph.nodes.len()];
        let mut sources = Vec::new();
        for (id, node) in graph.nodes.iter().enumerate() {
            if !needed[id] {
                continue;
            }
            let frame = &mut frames[node.frame];
            let pending = match node.kind {
                DfKind::Merge { loop_merge: true } => 1,
                _ => (node.inputs.len() + node.control_inputs.len()) as u32,
            };
            if pending == 0 {
                if node.frame != 0 {
                    let msg = format!("%{id} in frame {} waits for nothing", node.frame);
                    return Err(Error::internal("executor", msg));
                }
                sources.push(id as u32);
            }
            nodes[id] = NodePlan {
                local: frame.pending.len() as u32,
                slot_base: frame.slots as u32,
                outputs: node.outputs.iter().map(|_| SmallVec::new()).collect(),
                control_out: SmallVec::new(),
                forward: forwards(node),
                checked: checked_types(&graph.nodes, id),
                fused: match &node.kind {
                    DfKind::Loop(fused) => Some(loops.compile(fused)?),
                    _ => None,
                },
            };
            frame.pending.push(pending);
            frame.slots += node.inputs.len();
            if let DfKind::Enter { frame: inner, .. } = node.kind {
                frames[inner].enters += 1;
            }
        }
        for (id, node) in graph.nodes.iter().enumerate() {
            if !needed[id] {
                continue;
            }
            for (k, p) in node.inputs.iter().enumerate() {
                let target = Target::Input {
                    node: id as u32,
                    slot: k as u32,
                };
                nodes[p.node].outputs[p.output].push(target);
            }
            for &c in &node.control_inputs {
                nodes[c].control_out.push(id as u32);
            }
        }
        for (i, p) in graph.results.iter().enumerate() {
            nodes[p.node].outputs[p.output].push(Target::Result(i as u32));
        }
        Ok(Plan {
            graph,
            nodes,
            frames,
            sources,
        })
    }
}

/// Whether `node` only passes its single input on (see `NodePlan::forward`).
fn forwards(node: &DfNode) -> bool {
    let single = node.inputs.len() == 1 && node.control_inputs.is_empty();
    match node.kind {
        DfKind::Merge { loop_merge: true } => true,
        DfKind::Identity | DfKind::Enter { .. } | DfKind::Exit | DfKind::NextIteration => single,
        _ => false,
    }
}
