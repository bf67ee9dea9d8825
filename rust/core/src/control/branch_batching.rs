//! The batching rule of a node that calls one of several functions by a selector (`If`,
//! `Case`), shared by both.
//!
//! - The same selector in every lane: the node over the branches made functions over lanes,
//!   every branch giving the same results over lanes (those any branch gives over lanes).
//! - A selector that differs per lane: each branch runs once over every lane, the lanes that do
//!   not take it computing on stand-ins (copies of a lane that does), inside an `If` that skips
//!   it when no lane takes it; each lane then keeps its own branch's results (a select). No
//!   value of a branch a lane does not take reaches that lane's results or gradients, and a
//!   branch no lane takes does not run: unlike a select over every branch, a NaN of an untaken
//!   branch cannot reach a gradient.

use crate::batch::{select_lanes, NodeBatch, Want};
use crate::error::Result;
use crate::graph::{If, NodeKind, NodeRule};
use crate::ops::Values;
use crate::trace::Val;

/// `construct` (selector input first) over lanes; `masks(cx, selector)` gives, for a selector
/// that differs per lane, each branch's lanes (bool over lanes, one lane in exactly one).
pub(crate) fn batch_branches(
    cx: &mut NodeBatch<'_>,
    construct: &dyn NodeRule,
    inputs: &[Val],
    batched: &[bool],
    masks: impl FnOnce(&mut NodeBatch<'_>, &Val, usize) -> Result<Vec<Val>>,
) -> Result<Values<Val>> {
    let callees: Vec<String> = construct.callees().iter().map(|s| s.to_string()).collect();
    let operands = &batched[1..];
    if !batched[0] {
        let mut over_lanes: Vec<bool> = Vec::new();
        for c in &callees {
            let f = cx.function(c, operands, &|_| Want::AsItComes)?;
            over_lanes.resize(f.batched.len(), false);
            for (u, b) in over_lanes.iter_mut().zip(&f.batched) {
                *u |= b;
            }
        }
        let want = |k: usize| match over_lanes.get(k) {
            Some(true) => Want::Lanes,
            _ => Want::AsItComes,
        };
        let mut names = Vec::with_capacity(callees.len());
        for c in &callees {
            names.push(cx.function(c, operands, &want)?.name);
        }
        let outputs = cx.ctx.apply_node(&construct.with_callees(names), inputs)?;
        return cx.wrap_all(outputs, &over_lanes);
    }
    let masks = masks(cx, &inputs[0], callees.len())?;
    let mut results: Vec<Values<Val>> = Vec::with_capacity(callees.len());
    for (c, mask) in callees.iter().zip(&masks) {
        let (stand_in, any) = cx.stand_ins(mask, construct.keyword())?;
        let mut args = vec![any];
        for (v, &b) in inputs[1..].iter().zip(operands) {
            args.push(if b {
                stand_in.of(cx.ctx, v)?
            } else {
                v.clone()
            });
        }
        let branch = cx.function(c, operands, &|_| Want::Lanes)?;
        let idle = cx.zeros_like_results(&branch.name)?;
        let node = NodeKind::If(If {
            then_branch: branch.name,
            else_branch: idle,
        });
        results.push(cx.ctx.apply_node(&node, &args)?);
    }
    let mut stitched = results.pop().unwrap_or_default();
    for (mask, taken) in masks.iter().zip(results).rev() {
        stitched = taken
            .iter()
            .zip(&stitched)
            .map(|(a, b)| select_lanes(cx.ctx, mask, a, b))
            .collect::<Result<_>>()?;
    }
    let all = vec![true; stitched.len()];
    cx.wrap_all(stitched, &all)
}
