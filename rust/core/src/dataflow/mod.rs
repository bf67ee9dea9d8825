//! Lowered dataflow: one flat graph of ops and the five control primitives of the dataflow
//! control-flow design (`Switch`, `Merge`, `Enter`, `Exit`, `NextIteration`), which the frame
//! executor runs.
//!
//! `lower` inlines every call from the entry down and turns each construct into primitives
//! through its `Lower` implementation (in `crate::control`):
//!
//! ```text
//!   If(p, xs)        p' = switch(p, p); pivots identity(p'#0), identity(p'#1)
//!                    each x: switch(x, p) -> #0 to the else branch, #1 to the then branch
//!                    each result: merge(else result, then result)
//!   Case(i, xs)      the same with an n-way switch (an index out of range picks the last)
//!   While(vs)        per variable v: enter(v) -> merge(enter, next_iteration) -> cond ->
//!                    switch(merge, cond) -> #1 body -> next_iteration;  #0 -> exit
//!                    a variable the body returns unchanged is a constant enter (an invariant)
//!   Call(xs)         the callee's nodes, gated by the call's control inputs
//! ```
//!
//! Values carry a liveness: the untaken side of a `Switch` is *dead*, and a node with a dead
//! input does not run; it passes the dead token on, so an untaken branch's ops never run (and
//! never fail). `Merge` passes on its first live input. Nodes with no data inputs (constants)
//! take a control input from their context's *gate* (a branch's pivot, a loop's), so they are
//! dead with it. Each `While` gets a frame: the nodes of its condition and body run once per
//! iteration, `Enter` moves a value into iteration 0 of a new frame, `NextIteration` into the
//! next iteration, `Exit` back to the enclosing frame.
//!
//! Control edges keep side effects ordered; the graph's `targets` are the side effects, which
//! execution keeps beside the fetched results (nothing else unneeded runs).

mod build;
mod fuse;
mod hoist;
mod lower_graph;
mod text;
mod verify;

use std::sync::Arc;

use crate::graph::{Constant, NodeId, Port, StackOp, ValueType, VariableOp};
use crate::ops::Op;

pub use build::{Builder, FunctionLowered, Lower, LowerNode, Lowered, Scope};
pub use fuse::{fuse_frames, fuse_root};
pub use hoist::hoist_loop_constants;
pub use lower_graph::lower;
pub use verify::verify;

/// Index of a frame in `DataflowGraph::frames`; frame 0 is the root (the entry's own nodes).
pub type FrameId = usize;

/// A loop's frame: where its iterations run.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameInfo {
    /// The enclosing frame (the root's parent is itself).
    pub parent: FrameId,
    /// How many iterations may be in flight at once.
    pub parallel_iterations: u32,
    /// Whether some node of the frame (or a frame inside it) touches a variable: its
    /// iterations then run one after another, in order.
    pub stateful: bool,
}

/// What a lowered node does.
#[derive(Clone, Debug, PartialEq)]
pub enum DfKind {
    /// Argument `index` of the entry function.
    Arg(usize),
    Const(Constant),
    Op(Op),
    /// Its input, unchanged (a branch pivot, an input gated by control inputs).
    Identity,
    /// `(data, selector)`: the data goes to output `selector` (a bool picks 0 = false or
    /// 1 = true; an i32 out of `0..outputs` picks the last); the other outputs are dead.
    Switch {
        outputs: usize,
    },
    /// Its first live input; dead when every input is dead. A loop's merge (`loop_merge`)
    /// takes one token per iteration: from the `Enter` in iteration 0, else `NextIteration`.
    Merge {
        loop_merge: bool,
    },
    /// Moves its input into iteration 0 of `frame` (every iteration when `constant`).
    Enter {
        frame: FrameId,
        constant: bool,
    },
    /// Moves its input out of the frame to the enclosing one (only a live value, or the dead
    /// token of a loop that never ran).
    Exit,
    /// Moves its input to the next iteration (a dead token ends the loop there).
    NextIteration,
    /// Waits for its inputs; produces nothing (what control edges hang on).
    NoOp,
    Variable(VariableOp),
    Stack(StackOp),
    /// A loop's frame run as one node (`fuse_frames`): its inputs are the loop's entries, its
    /// outputs the loop's exits; dead when any input is.
    Loop(Arc<FusedFrame>),
}

impl DfKind {
    /// The node's name in the lowered text.
    pub fn name(&self) -> &'static str {
        match self {
            DfKind::Arg(_) => "arg",
            DfKind::Const(_) => "const",
            DfKind::Op(op) => op.name(),
            DfKind::Identity => "identity",
            DfKind::Switch { .. } => "switch",
            DfKind::Merge { .. } => "merge",
            DfKind::Enter { .. } => "enter",
            DfKind::Exit => "exit",
            DfKind::NextIteration => "next_iteration",
            DfKind::NoOp => "no_op",
            DfKind::Variable(v) => crate::graph::NodeRule::keyword(v),
            DfKind::Stack(s) => crate::graph::NodeRule::keyword(s),
            DfKind::Loop(_) => "loop",
        }
    }

    /// Writes a variable: kept by execution though no fetch needs it.
    pub fn has_side_effect(&self) -> bool {
        matches!(
            self,
            DfKind::Variable(VariableOp::Assign | VariableOp::AssignAdd)
        )
    }
}

/// The nodes of one frame as a sequential program (see `fuse_frames` and `fuse_root`).
///
/// `nodes` starts with one `arg` per input (a loop's entries, the root's parameters), then the
/// frame's nodes in an order where each follows its inputs and control inputs, except that a
/// loop merge reads its `next_iteration` from the previous iteration; loop merges come first.
/// Ports and control inputs index `nodes`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedFrame {
    /// The frame it replaces.
    pub frame: FrameId,
    /// Whether the nodes run once per iteration of a loop (else once: the root).
    pub repeats: bool,
    /// Per input: whether it is a constant entry (an invariant every iteration reads).
    pub invariant: Vec<bool>,
    pub nodes: Vec<DfNode>,
    /// What it returns: a loop's exits, the root's results.
    pub results: Vec<Port>,
}

/// Where a lowered node came from, for errors: the site of the original node
/// (`at %5 = add(%1, %4) in @body (model.py:12)`), then the sites of the calls, branches and
/// loops it was lowered through.
#[derive(Debug, PartialEq)]
pub struct Origin {
    pub site: String,
    /// Whether the site is a `While`: errors below it say which iteration failed.
    pub is_loop: bool,
    pub parent: Option<Arc<Origin>>,
}

/// One lowered node.
#[derive(Clone, Debug, PartialEq)]
pub struct DfNode {
    pub kind: DfKind,
    pub inputs: Vec<Port>,
    /// Nodes that must complete first; a dead one makes this node dead too.
    pub control_inputs: Vec<NodeId>,
    pub outputs: Vec<ValueType>,
    /// The frame the node runs in (an `Enter` runs in the enclosing frame, an `Exit` in the
    /// loop's own).
    pub frame: FrameId,
    pub origin: Option<Arc<Origin>>,
}

/// A lowered program: the entry function as one dataflow graph (not in topological order:
/// a loop's `merge` reads its `next_iteration`).
#[derive(Clone, Debug, PartialEq)]
pub struct DataflowGraph {
    /// The entry function's name.
    pub name: String,
    pub params: Vec<ValueType>,
    pub nodes: Vec<DfNode>,
    pub frames: Vec<FrameInfo>,
    pub results: Vec<Port>,
    /// Side effects that run whether or not a result needs them.
    pub targets: Vec<NodeId>,
}

impl DataflowGraph {
    /// How many nodes of `name` (`"switch"`, `"merge"`, an op name, ...) the graph has.
    pub fn count(&self, name: &str) -> usize {
        self.nodes.iter().filter(|n| n.kind.name() == name).count()
    }

    /// The nodes the results and targets reach back to, through data and control inputs:
    /// what a lazy run executes.
    pub fn needed(&self) -> Vec<bool> {
        let mut needed = vec![false; self.nodes.len()];
        let mut todo: Vec<NodeId> = self.results.iter().map(|p| p.node).collect();
        todo.extend(&self.targets);
        while let Some(n) = todo.pop() {
            if !std::mem::replace(&mut needed[n], true) {
                let node = &self.nodes[n];
                todo.extend(node.inputs.iter().map(|p| p.node));
                todo.extend(&node.control_inputs);
            }
        }
        needed
    }
}
