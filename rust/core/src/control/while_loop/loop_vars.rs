//! Which loop variables of a `While` body need their next value passed through the loop's
//! `stablehlo.optimization_barrier` (see `mlir/regions.rs` for why): IREE 3.13 rotates a loop into
//! do-while form and canonicalizes it, and a variable of one of these kinds then loses its
//! `before` or its `after` block argument, which crashes `iree-compile`:
//!
//! - **write-only**: the body never reads it (`x_prev = x`); after the rotation its `before`
//!   argument has no use and is removed.
//! - **invariant**: its next value depends on no variable that changes (a gradient accumulator
//!   reset to zero, a constant); the rotated condition forwards a value defined outside the
//!   loop, and the `after` argument is removed.
//! - **duplicate**: the body yields the same value for it as for an earlier variable; the
//!   rotated condition forwards it twice, and one `after` argument is removed.
//!
//! A variable passed through unchanged loses both arguments together, which is harmless.

use crate::error::Result;
use crate::graph::StackOp;
use crate::graph::{Function, NodeKind, Port, ValueType};
use crate::mlir::{Bound, Lowering};

/// One flag per loop variable of `body` (its parameters, which are also its results): whether
/// the variable is write-only, invariant or a duplicate (see the module doc).
pub(crate) fn exposed(body: &Function) -> Vec<bool> {
    let n = body.params.len();
    let passes_through = passes_through(body);
    let varying = varying_nodes(body, &passes_through);
    let read = read_args(body, n);
    (0..n)
        .map(|k| {
            let Some(&next) = body.results.get(k) else {
                return false;
            };
            let invariant = !passes_through[k] && !varying.get(next.node).copied().unwrap_or(true);
            let duplicate = body.results[..k].contains(&next);
            !read[k] || invariant || duplicate
        })
        .collect()
}

/// Per loop variable of `body`: whether the body pushes its incoming value onto a stack (the
/// buffer both carried by the loop and held by a list; see `distinct_inits` in `control.rs`).
pub(crate) fn pushed(body: &Function) -> Vec<bool> {
    let mut pushed = vec![false; body.params.len()];
    for node in &body.nodes {
        if let (NodeKind::Stack(StackOp::Push), Some(value)) = (&node.kind, node.inputs.get(1)) {
            if let Some(NodeKind::Arg(k)) = body.nodes.get(value.node).map(|n| &n.kind) {
                if let Some(flag) = pushed.get_mut(*k) {
                    *flag = true;
                }
            }
        }
    }
    pushed
}

/// Per loop variable of `body`: whether the body yields its parameter unchanged.
pub(crate) fn passes_through(body: &Function) -> Vec<bool> {
    (0..body.params.len())
        .map(|k| body.results.get(k) == Some(&Port::new(k, 0)))
        .collect()
}

/// Per node: whether its value can change from one trip to the next, i.e. whether it depends
/// on a loop variable that is not passed through unchanged.
fn varying_nodes(body: &Function, passes_through: &[bool]) -> Vec<bool> {
    let mut varying = Vec::with_capacity(body.nodes.len());
    for node in &body.nodes {
        let v = match node.kind {
            NodeKind::Arg(k) => !passes_through.get(k).copied().unwrap_or(false),
            _ => node
                .inputs
                .iter()
                .any(|p| varying.get(p.node).copied().unwrap_or(true)),
        };
        varying.push(v);
    }
    varying
}

/// Per parameter: whether a node that contributes to the results reads it, or a result is it.
fn read_args(body: &Function, n: usize) -> Vec<bool> {
    let mut live = vec![false; body.nodes.len()];
    for p in &body.results {
        if let Some(l) = live.get_mut(p.node) {
            *l = true;
        }
    }
    for id in (0..body.nodes.len()).rev() {
        if !live[id] {
            continue;
        }
        let node = &body.nodes[id];
        let sources = node.inputs.iter().map(|p| p.node);
        for src in sources.chain(node.control_inputs.iter().copied()) {
            if let Some(l) = live.get_mut(src) {
                *l = true;
            }
        }
    }
    let mut read = vec![false; n];
    for (id, node) in body.nodes.iter().enumerate() {
        if !live[id] || matches!(node.kind, NodeKind::Arg(_)) {
            continue;
        }
        for p in &node.inputs {
            if let Some(r) = read.get_mut(p.node) {
                *r = true;
            }
        }
    }
    for p in &body.results {
        if let Some(r) = read.get_mut(p.node) {
            *r = true;
        }
    }
    read
}

/// A loop's variables split by `split_invariants`: the passed-through ones' values (None for
/// the others), then the carried ones' values and types.
pub(super) type Split = (Vec<Option<Bound>>, Vec<Bound>, Vec<ValueType>);

/// The loop variables a trip carries: `next` without the `fixed` ones (`split_invariants`).
pub(super) fn carried_only(next: Vec<Bound>, fixed: &[Option<Bound>]) -> Vec<Bound> {
    next.into_iter()
        .zip(fixed)
        .filter_map(|(v, f)| f.is_none().then_some(v))
        .collect()
}

/// A tensor the body passes through unchanged is not carried: both regions and the loop's
/// result use its initial value (fewer block arguments). A rank-0 one is: read inside the
/// loop, IREE would copy it to the host on every trip. A small one (held as host scalars where
/// it is computed) is not: a device op reads it as it is instead of a tensor rebuilt from
/// scalars on every trip.
pub(super) fn split_invariants(
    l: &mut Lowering<'_>,
    body: &Function,
    inputs: Vec<Bound>,
    types: &[ValueType],
) -> Result<Split> {
    let mut through = passes_through(body);
    for (t, ty) in through.iter_mut().zip(types) {
        *t &= ty.as_tensor().is_none_or(|t| t.ndim() > 0);
    }
    if through.iter().all(|&t| t) {
        through.fill(false);
    }
    let (mut fixed, mut carried, mut ctypes) = (Vec::new(), Vec::new(), Vec::new());
    for ((v, t), &through) in inputs.into_iter().zip(types).zip(&through) {
        if through {
            fixed.push(Some(l.coerce(v, t)?));
        } else {
            fixed.push(None);
            carried.push(v);
            ctypes.push(t.clone());
        }
    }
    Ok((fixed, carried, ctypes))
}
