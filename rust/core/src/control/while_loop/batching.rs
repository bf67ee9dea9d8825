//! The batching rule of `While`: each lane makes its own trips.
//!
//! - A condition the same in every lane (it reads only variables that are): the loop over its
//!   cond and body made functions over lanes, the variables any trip makes differ per lane
//!   over lanes from the start.
//! - A condition that differs per lane: one loop over every lane's variables and a live mask.
//!   Each trip, the lanes still running step; a lane that is done keeps its values and computes
//!   the trip on a stand-in (a running lane's values) whose result is discarded, so nothing it
//!   would compute reaches its results or gradients. The loop ends when no lane runs: each lane
//!   makes exactly its own trips, and the loop's bound, checkpoints and gradient are those of a
//!   loop like any other.

use crate::batch::{select_lanes, stand_ins, BatchNode, NodeBatch, Want};
use crate::error::Result;
use crate::graph::{NodeRule, ValueType, While};
use crate::ops::{build, Values};
use crate::trace::Val;

impl BatchNode for While {
    fn batch(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>> {
        // The variables over lanes: those given so, and those a trip makes so (a fixed point).
        let mut over = batched.to_vec();
        loop {
            let body = cx.function(&self.body, &over, &|_| Want::AsItComes)?;
            let wider: Vec<bool> = over
                .iter()
                .zip(&body.batched)
                .map(|(&a, &b)| a || b)
                .collect();
            if wider == over {
                break;
            }
            over = wider;
        }
        let cond = cx.function(&self.cond, &over, &|_| Want::AsItComes)?;
        if !cond.batched[0] {
            let want = |k: usize| {
                if over[k] {
                    Want::Lanes
                } else {
                    Want::AsItComes
                }
            };
            let body = cx.function(&self.body, &over, &want)?;
            let vars = lanes_where(cx, inputs, batched, &over)?;
            let node = self.with_callees(vec![cond.name, body.name]);
            let outputs = cx.ctx.apply_node(&node, &vars)?;
            return cx.wrap_all(outputs, &over);
        }
        self.live_lanes(cx, inputs, batched)
    }
}

impl While {
    /// The loop over every lane's variables and a live mask (the module's doc).
    fn live_lanes(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>> {
        let n = cx.count();
        let all = vec![true; inputs.len()];
        let cond = cx.function(&self.cond, &all, &|_| Want::Lanes)?.name;
        let step = cx.function(&self.body, &all, &|_| Want::Lanes)?.name;
        let mut vars = lanes_where(cx, inputs, batched, &all)?;
        let live = NodeBatch::inline(cx.ctx, &cond, &vars)?.remove(0);
        let mut types: Vec<ValueType> = vars.iter().map(Val::value_type).collect();
        types.push(live.value_type());
        let going = cx.build_function(
            &format!("{}_any_lane", self.cond),
            types.clone(),
            &mut |ctx, p| {
                let live = p.last().expect("the live mask");
                let as_int = build::cast(ctx, live, crate::dtype::DType::I32)?;
                let most = build::reduce_max(ctx, &as_int, &[0], false)?;
                let zero = build::scalar(ctx, crate::dtype::DType::I32, 0.0)?;
                Ok(vec![build::greater(ctx, &most, &zero)?])
            },
        )?;
        let trip = cx.build_function(
            &format!("{}_live_lanes", self.body),
            types,
            &mut |ctx, p| {
                let (values, live) = p.split_at(p.len() - 1);
                let (stand_in, _) = stand_ins(ctx, &live[0], n, "while_loop")?;
                let on_rows = values
                    .iter()
                    .map(|v| stand_in.of(ctx, v))
                    .collect::<Result<Vec<_>>>()?;
                let stepped = NodeBatch::inline(ctx, &step, &on_rows)?;
                let mut kept = stepped
                    .iter()
                    .zip(values)
                    .map(|(new, old)| select_lanes(ctx, &live[0], new, old))
                    .collect::<Result<Vec<_>>>()?;
                let more = NodeBatch::inline(ctx, &cond, &kept)?.remove(0);
                kept.push(build::logical_and(ctx, &live[0], &more)?);
                Ok(kept)
            },
        )?;
        vars.push(live);
        let node = self.with_callees(vec![going, trip]);
        let mut outputs = cx.ctx.apply_node(&node, &vars)?;
        outputs.pop();
        cx.wrap_all(outputs, &all)
    }
}

/// `inputs` over lanes where `want` says (each given over lanes where `batched` says).
fn lanes_where(
    cx: &mut NodeBatch<'_>,
    inputs: &[Val],
    batched: &[bool],
    want: &[bool],
) -> Result<Vec<Val>> {
    inputs
        .iter()
        .zip(batched.iter().zip(want))
        .map(|(v, (&b, &w))| if w { cx.lanes(v, b) } else { Ok(v.clone()) })
        .collect()
}
