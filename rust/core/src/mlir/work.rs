//! How much work a function's ops do, for the emitter's budgets: the iterations an unrolled
//! trip runs (`control::while_loop::trips`) and the branches run as selects (`control::if_else`).

use crate::graph::{Function, NodeKind, StackOp};

/// Whether a node may be repeated in an unrolled trip or run whether or not its branch is
/// taken: args, constants, ops and (`stacks`) stack pushes and pops.
pub(crate) fn plain(kind: &NodeKind, stacks: bool) -> bool {
    match kind {
        NodeKind::Arg(_) | NodeKind::Const(_) | NodeKind::Op(_) => true,
        NodeKind::Stack(StackOp::Push | StackOp::Pop) => stacks,
        _ => false,
    }
}

/// The work of `f`'s ops summed (at least 1) and the number of its ops and stack nodes, where
/// every node is `plain` and every op's shapes are static.
pub(crate) fn ops_work(f: &Function, stacks: bool) -> Option<(usize, usize)> {
    let (mut work, mut nodes) = (1usize, 0usize);
    for node in &f.nodes {
        if !plain(&node.kind, stacks) {
            return None;
        }
        match node.kind {
            NodeKind::Op(_) => {
                work = work.saturating_add(f.op_work(node)?);
                nodes += 1;
            }
            NodeKind::Stack(_) => nodes += 1,
            _ => {}
        }
    }
    Some((work, nodes))
}
