//! The gradient of a bounded `While` whose every state fits its snapshots (`checkpoints = c`
//! with `maximum_iterations = m <= c`, which fixed-size state asks for up to
//! `ALL_STATES_UP_TO` trips): no schedule, each trip's state in its own row.
//!
//! ```text
//!   forward:  (vars, step, bufs) -> bufs[v][step] = x_step[v]; x_{step+1} = body(x_step)
//!   backward: (cotangents, g = trips, bufs, invariants) while g > 0:
//!               x = bufs[.][g - 1]; the body's forward and backward functions on x:
//!               cotangents of x_{g-1}; g -= 1
//! ```
//!
//! `checkpointed.rs` does the same with c < m rows through an online schedule whose integer
//! logic works on `[c]` vectors every trip (O(c) a trip) and an inner loop that advances from
//! the nearest snapshot. With a row per trip neither is needed: a trip of either loop is one
//! row written or read (a `dynamic_update_slice`, a `dynamic_slice`), what a scan's gradient
//! keeps, bar the body's forward pass run again in the backward trip.

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{inline_into, FunctionBuilder, Port, ValueType, While};
use crate::ops::binary;
use crate::shape::{TensorType, DYN};
use crate::trace::gradients::{add_function, function, Built, Differentiated, ExtraInput};
use crate::trace::TracerRef;

use super::checkpointed::Loop;
use super::schedule::{i64_type, Ir};

/// Builds the forward and backward `While` nodes of a loop of at most `rows` trips that keeps
/// every state.
pub(super) fn augment(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    rows: usize,
) -> Result<Built> {
    let n = lp.body.params.len();
    let types = &lp.body.params;
    let kept: Vec<usize> = (0..n).filter(|&i| !d.passthrough[i]).collect();
    let kept_types = kept
        .iter()
        .map(|&i| match &types[i] {
            ValueType::Tensor(t) if !t.shape.contains(&DYN) => Ok(t.clone()),
            other => Err(Error::new(
                ErrorKind::ControlFlow,
                "while_loop",
                format!(
                    "a loop gradient in fixed-size state keeps the loop variables the body \
                     changes, which must be tensors of static shape; loop variable {i} is {other}"
                ),
            )),
        })
        .collect::<Result<Vec<TensorType>>>()?;
    let invariant: Vec<usize> = (0..n).filter(|&i| d.passthrough[i]).collect();
    // a row even for a loop of no trips: the buffers' shapes stay valid for their writes
    let rows = rows.max(1);
    let buffer_types: Vec<ValueType> = kept_types
        .iter()
        .map(|t| {
            let mut shape = vec![rows];
            shape.extend_from_slice(&t.shape);
            ValueType::tensor(t.dtype, &shape)
        })
        .collect();
    let nk = kept.len();

    // Forward loop variables: (vars, step, bufs).
    let mut fparams = types.clone();
    fparams.push(i64_type(&[]));
    fparams.extend(buffer_types.iter().cloned());
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_dense_fwd", lp.body.name), fparams.clone());
    let (step, bufs) = (args[n], &args[n + 1..n + 1 + nk]);
    let mut ir = Ir { b: &mut b };
    let mut written: Vec<Port> = Vec::with_capacity(nk);
    for (k, &i) in kept.iter().enumerate() {
        written.push(ir.write_row(bufs[k], args[i], step, &kept_types[k])?);
    }
    let next = ir.add(step, 1)?;
    let (res, effects) = inline_into(&mut b, lp.body, &args[..n])?;
    let mut results: Vec<Port> = res[..n].to_vec();
    results.push(next);
    results.extend(written);
    let fwd_body = add_function(tracer, b.finish(&results, &effects)?)?;
    let (mut b, args) = FunctionBuilder::new(format!("{}_dense_fwd", lp.cond.name), fparams);
    let (res, _) = inline_into(&mut b, lp.cond, &args[..n])?;
    let fwd_cond = add_function(tracer, b.finish(&res, &[])?)?;

    // Backward loop variables: (cotangents, trips left, bufs, invariant vars).
    let bwd = function(tracer, &d.backward)?;
    let fwd = function(tracer, &d.forward)?;
    let nc = lp.carried.len();
    let mut bparams: Vec<ValueType> = bwd.params[..nc].to_vec();
    bparams.push(i64_type(&[]));
    bparams.extend(buffer_types.iter().cloned());
    bparams.extend(invariant.iter().map(|&i| types[i].clone()));
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_dense_grad", lp.body.name), bparams.clone());
    let trips = args[nc];
    let bufs = &args[nc + 1..nc + 1 + nk];
    let invariants = &args[nc + 1 + nk..];
    let mut ir = Ir { b: &mut b };
    let left = ir.add(trips, -1)?;
    let mut state: Vec<Option<Port>> = vec![None; n];
    for (k, &i) in kept.iter().enumerate() {
        state[i] = Some(ir.read_row(bufs[k], left, &kept_types[k])?);
    }
    for (j, &i) in invariant.iter().enumerate() {
        state[i] = Some(invariants[j]);
    }
    let x: Vec<Port> = state.into_iter().flatten().collect();
    let (replayed, _) = inline_into(&mut b, &fwd, &x)?;
    let mut bargs: Vec<Port> = args[..nc].to_vec();
    bargs.extend_from_slice(&replayed[n..]);
    let (grads, _) = inline_into(&mut b, &bwd, &bargs)?;
    let mut results: Vec<Port> = lp
        .carried
        .iter()
        .map(|i| {
            let k = lp.float_vars.iter().position(|v| v == i);
            k.map(|k| grads[k])
                .ok_or_else(|| Error::internal("while_loop", "a carried variable has no gradient"))
        })
        .collect::<Result<_>>()?;
    results.push(left);
    results.extend_from_slice(bufs);
    results.extend_from_slice(invariants);
    let grad_body = add_function(tracer, b.finish(&results, &[])?)?;
    let (mut b, args) = FunctionBuilder::new(format!("{}_dense_grad", lp.cond.name), bparams);
    let more = Ir { b: &mut b }.cmp(binary::Greater, args[nc], 0)?;
    let grad_cond = add_function(tracer, b.finish(&[more], &[])?)?;

    let mut forward_extra = vec![ExtraInput::Zero(DType::I64)];
    forward_extra.extend(
        buffer_types
            .iter()
            .map(|t| ExtraInput::Fill(t.inner().clone(), 0.0)),
    );
    Ok(Built {
        forward: While::stacked(
            fwd_cond,
            fwd_body,
            lp.maximum_iterations,
            lp.parallel_iterations,
        ),
        forward_extra,
        backward: While::stacked(grad_cond, grad_body, None, lp.parallel_iterations),
        backward_outputs: (n..n + 1 + nk).collect(),
        backward_inputs: invariant,
        cotangents: lp.carried.to_vec(),
        differentiable: lp.carried.to_vec(),
    })
}
