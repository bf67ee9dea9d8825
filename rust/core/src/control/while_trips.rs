//! How many iterations of a `While` one trip of its emitted `scf.while` runs.
//!
//! A trip of an IREE loop costs about 2 µs on the host (fences, a queue submission, transient
//! buffers) whatever its dispatches compute, so loops of cheap iterations run several per trip,
//! recorded into the trip's one command buffer and submitted once. Two shapes:
//!
//! - **Predicated** (`iterations_per_trip`): a loop of ops only. Each iteration after a trip's
//!   first is computed from the one before and kept only where the condition holds
//!   (`Lowering::select`): once false it stays false, since the condition is a pure function of
//!   the vars. The last trip throws away at most all but one iteration, so the work per trip is
//!   bounded.
//! - **Exact** (`countdown`): a loop that runs exactly `n` more iterations, `n` a variable the
//!   condition tests `> 0` and the body decrements: the gradient loops of `While::augment`, which
//!   pop the forward loop's stacks. It becomes two loops, `k` iterations per trip while `n >= k`,
//!   then one per trip for the rest: nothing is computed twice or thrown away, and a stack is
//!   never popped past the iterations that pushed it (a predicated pop could be).

use crate::error::Result;
use crate::graph::{Function, NodeKind, Port, StackOp, ValueType, While};
use crate::mlir::Lowering;
use crate::ops::Op;

/// The most iterations per trip of a predicated loop.
const UNROLL: usize = 32;

/// Work (elements, or multiply-adds) one trip of a predicated loop may hold: a trip's fixed cost
/// in IREE is that of a few thousand elements of arithmetic.
const UNROLL_BUDGET: usize = 1 << 12;

/// The most iterations per trip of an exact loop: past 8, a trip's fixed cost is a few percent
/// of its iterations' (W6's gradient loop: 12.4, 10.3 and 8.8 µs per iteration at 1, 4 and 8).
const EXACT_UNROLL: usize = 8;

/// Work one trip of an exact loop may hold (nothing is wasted: the bound is on code size and
/// compile time, and beyond it the trip's fixed cost no longer matters).
const EXACT_BUDGET: usize = 1 << 18;

/// Ops, stack pops and pushes one trip of an exact loop may hold (compile time).
const EXACT_NODES: usize = 256;

/// Iterations one trip of a predicated loop runs: for a loop whose condition and body are ops
/// only (no stacks, no `maximum_iterations`; with `EmitOptions::unroll_loops`), as many as fit
/// `UNROLL_BUDGET` of work (`OpDef::work` summed over the ops), a power of two up to `UNROLL`;
/// 1 otherwise.
pub(crate) fn iterations_per_trip(
    l: &Lowering<'_>,
    w: &While,
    ctypes: &[ValueType],
) -> Result<usize> {
    if !l.e.options.unroll_loops
        || w.maximum_iterations.is_some()
        || ctypes.iter().any(|t| matches!(t, ValueType::Stack(_)))
    {
        return Ok(1);
    }
    let mut work = 1usize;
    for name in [&w.cond, &w.body] {
        match ops_work(l.library.get(name)?, false) {
            Some((w, _)) => work = work.saturating_add(w),
            None => return Ok(1),
        }
    }
    Ok(power_of_two((UNROLL_BUDGET / work).clamp(1, UNROLL)))
}

/// A loop that runs exactly `vars[count]` more iterations, unrolled `per_trip` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Countdown {
    pub count: usize,
    pub per_trip: usize,
}

/// The countdown shape of `w`, where it has one and unrolling pays (`EmitOptions::unroll_loops`):
/// its condition is `vars[count] > 0` on an int64 scalar, its body returns `vars[count] - 1`,
/// and its body is ops and stack pops and pushes; no `maximum_iterations`.
pub(crate) fn countdown(l: &Lowering<'_>, w: &While) -> Result<Option<Countdown>> {
    if !l.e.options.unroll_loops || w.maximum_iterations.is_some() {
        return Ok(None);
    }
    let (cond, body) = (l.library.get(&w.cond)?, l.library.get(&w.body)?);
    let Some(count) = tested_above_zero(cond) else {
        return Ok(None);
    };
    let decremented = body.results.get(count).is_some_and(|&r| {
        op_of_arg_and_const(body, r, Op::Sub(Default::default()), 1) == Some(count)
    });
    if !decremented || !cond.nodes.iter().all(|n| plain(&n.kind, false)) {
        return Ok(None);
    }
    let Some((work, nodes)) = ops_work(body, true) else {
        return Ok(None);
    };
    let per_trip = (EXACT_BUDGET / work.max(1))
        .min(EXACT_NODES / nodes.max(1))
        .clamp(1, EXACT_UNROLL);
    Ok((per_trip > 1).then(|| Countdown {
        count,
        per_trip: power_of_two(per_trip),
    }))
}

/// `k` where `f` returns `arg k > 0`, `arg k` an int64 scalar.
fn tested_above_zero(f: &Function) -> Option<usize> {
    let [result] = f.results[..] else {
        return None;
    };
    op_of_arg_and_const(f, result, Op::Greater(Default::default()), 0)
}

/// `k` where `port` is `op(arg k, c)`, `arg k` an int64 scalar and `c` the int64 scalar `value`.
fn op_of_arg_and_const(f: &Function, port: Port, op: Op, value: i64) -> Option<usize> {
    let node = f.nodes.get(port.node)?;
    if node.kind != NodeKind::Op(op) {
        return None;
    }
    let [a, c] = node.inputs[..] else {
        return None;
    };
    let NodeKind::Arg(k) = f.nodes.get(a.node)?.kind else {
        return None;
    };
    let NodeKind::Const(constant) = &f.nodes.get(c.node)?.kind else {
        return None;
    };
    let int64_scalar =
        |t: &crate::shape::TensorType| t.dtype == crate::dtype::DType::I64 && t.shape.is_empty();
    let arg_ok = f.params.get(k).is_some_and(|t| match t {
        ValueType::Tensor(t) => int64_scalar(t),
        _ => false,
    });
    let const_ok = int64_scalar(constant.0.ty()) && constant.0.to_f64_vec() == [value as f64];
    (arg_ok && const_ok).then_some(k)
}

/// Whether a node may be repeated in an unrolled trip: args, constants, ops and (`stacks`)
/// stack pushes and pops.
fn plain(kind: &NodeKind, stacks: bool) -> bool {
    match kind {
        NodeKind::Arg(_) | NodeKind::Const(_) | NodeKind::Op(_) => true,
        NodeKind::Stack(StackOp::Push | StackOp::Pop) => stacks,
        _ => false,
    }
}

/// The work of `f`'s ops summed (at least 1) and the number of its ops and stack nodes, where
/// every node is `plain` and every op's shapes are static.
fn ops_work(f: &Function, stacks: bool) -> Option<(usize, usize)> {
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

/// The largest power of two not above `n` (n >= 1).
fn power_of_two(n: usize) -> usize {
    1 << n.ilog2()
}
