//! The gradient of a loop in fixed-size state that no bound sizes (no `maximum_iterations`
//! within `super::ALL_STATES_UP_TO`, no `checkpoints` of the user's): a row per trip while the trips
//! fit R rows, checkpoints only for a loop that outgrows them.
//!
//! ```text
//!   forward:  dense.rs's forward loop with R rows (a trip past R writes into the last row,
//!             as dynamic_update_slice clamps: those rows are never read)
//!   backward: call (cotangents, trips, rows, x0):
//!               g = dense.rs's backward loop over the rows, for trips <= R ? trips : 0 trips
//!               if trips <= R: g
//!               else:          checkpointed.rs's forward loop from x0 with c snapshots, then
//!                              its backward loop
//! ```
//!
//! A loop that fits runs as a scan's gradient: no schedule, no `[c]` integer logic per trip,
//! no advance loop. One that does not pays one more forward pass than the checkpointed form
//! alone. R fills `ROW_BUDGET_BYTES` of rows, at most `ROWS_UP_TO`; a loop whose rows
//! would be fewer than its snapshots, or whose body holds loops of its own (whose gradients
//! would be built twice at every order), keeps the checkpointed form alone.

use crate::error::{Error, Result};
use crate::graph::{Call, Function, FunctionBuilder, If, NodeKind, Port, ValueType};
use crate::ops::{binary, creation};
use crate::trace::gradients::{add_function, function, Built, Differentiated, ExtraInput};
use crate::trace::TracerRef;

use super::checkpointed::{self, Loop};
use super::dense;
use super::schedule::Ir;

/// The memory a loop gradient in fixed-size state may give its rows before checkpointing
/// (about 1,300 trips of a 64-float RNN's three residuals), and the most rows it takes (2,048
/// trips of a small state). Every call fills the rows first, so the budget is kept to a small
/// share of what a thousand RNN trips cost. A loop that tells its bound
/// (`maximum_iterations` up to `ALL_STATES_UP_TO`) gets exactly that many rows.
pub const ROW_BUDGET_BYTES: usize = 1 << 20;
pub const ROWS_UP_TO: usize = 2048;

/// How many rows a loop of `c` snapshots gets, or None where the checkpointed form alone
/// serves it better.
pub(super) fn rows(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    c: u32,
) -> Result<Option<usize>> {
    if contains_loop(tracer, lp.body)? {
        return Ok(None);
    }
    let bytes = dense::row_bytes(lp, d, true)?.max(1);
    let mut rows = (ROW_BUDGET_BYTES / bytes).min(ROWS_UP_TO);
    if let Some(m) = lp.maximum_iterations {
        rows = rows.min(usize::try_from(m).unwrap_or(0));
    }
    Ok((rows > c as usize).then_some(rows))
}

/// Whether `f` or a function it calls holds a `While`.
fn contains_loop(tracer: &TracerRef, f: &Function) -> Result<bool> {
    let mut pending: Vec<String> = vec![f.name.clone()];
    let mut seen: Vec<String> = Vec::new();
    while let Some(name) = pending.pop() {
        if seen.contains(&name) {
            continue;
        }
        let g = if name == f.name {
            f.clone()
        } else {
            function(tracer, &name)?
        };
        for node in &g.nodes {
            if matches!(node.kind, NodeKind::While(_)) {
                return Ok(true);
            }
            pending.extend(node.kind.callees().into_iter().map(str::to_string));
        }
        seen.push(name);
    }
    Ok(false)
}

/// Builds the forward node (rows) and the backward call (rows, else checkpoints).
pub(super) fn augment(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    rows: usize,
    c: u32,
) -> Result<Built> {
    let dense = dense::augment(tracer, lp, d, rows, true)?;
    let ckpt = checkpointed::augment(tracer, lp, d, c)?;
    let n = lp.body.params.len();
    let nc = lp.carried.len();
    let (NodeKind::While(dense_bwd), NodeKind::While(ckpt_fwd), NodeKind::While(ckpt_bwd)) =
        (&dense.backward, &ckpt.forward, &ckpt.backward)
    else {
        return Err(Error::internal(
            "while_loop",
            "a loop gradient is not made of loops",
        ));
    };
    let dense_bwd_types = function(tracer, &dense_bwd.body)?.params;
    let ckpt_fwd_types = function(tracer, &ckpt_fwd.body)?.params;
    let ckpt_bwd_types = function(tracer, &ckpt_bwd.body)?.params;
    let gradient_types: Vec<ValueType> = dense_bwd_types[..nc].to_vec();
    let dense_saved = dense.backward_outputs.len();
    // the dense backward loop takes the forward's trip count and rows after the cotangents
    let saved_types: Vec<ValueType> = dense_bwd_types[nc..nc + dense_saved].to_vec();

    // The call: (cotangents, trips, rows, x0) -> gradients. The rows' backward loop runs at
    // the top (none of its trips when the rows did not hold them): XLA runs a loop inside a
    // conditional op by op, several times slower for a small body. The branches take
    // (the rows' gradients, cotangents, x0): the first passes the gradients on, the second
    // recomputes them from x0 with checkpoints.
    let name = &lp.body.name;
    let mut branch_params: Vec<ValueType> = gradient_types.clone();
    branch_params.extend(gradient_types.iter().cloned());
    branch_params.extend(lp.body.params.iter().cloned());

    let (b, args) = FunctionBuilder::new(format!("{name}_rows_grad"), branch_params.clone());
    let then_branch = add_function(tracer, b.finish(&args[..nc], &[])?)?;

    let else_branch = from_start(
        tracer,
        lp,
        &ckpt,
        branch_params,
        ckpt_fwd_types,
        ckpt_bwd_types,
    )?;

    let branches = NodeKind::If(If {
        then_branch,
        else_branch,
    });
    let types = LoopTypes {
        gradients: gradient_types,
        saved: saved_types,
        dense_backward: dense_bwd_types,
    };
    let call = rows_or_checkpoints(tracer, lp, &dense, types, branches, rows)?;

    Ok(Built {
        forward: dense.forward,
        forward_extra: dense.forward_extra,
        backward: NodeKind::Call(Call {
            function: call,
            ..Default::default()
        }),
        backward_outputs: dense.backward_outputs,
        backward_inputs: (0..n).collect(),
        cotangents: dense.cotangents,
        differentiable: dense.differentiable,
    })
}

/// The branch that recomputes the gradients from x0 with checkpoints: over (the rows'
/// gradients, cotangents, x0), the checkpointed forward loop from x0, then its backward loop.
fn from_start(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    ckpt: &Built,
    branch_params: Vec<ValueType>,
    ckpt_fwd_types: Vec<ValueType>,
    ckpt_bwd_types: Vec<ValueType>,
) -> Result<String> {
    let name = &lp.body.name;
    let nc = lp.carried.len();
    let (mut b, args) = FunctionBuilder::new(format!("{name}_ckpt_grad_from_start"), branch_params);
    let cotangents = &args[nc..2 * nc];
    let x0 = &args[2 * nc..];
    let mut inputs: Vec<Port> = x0.to_vec();
    let mut ir = Ir { b: &mut b };
    for extra in &ckpt.forward_extra {
        let (dtype, shape, value) = match extra {
            ExtraInput::Zero(dtype) => (*dtype, vec![], 0.0),
            ExtraInput::Fill(t, value) => (t.dtype, t.shape.to_vec(), *value),
            ExtraInput::EmptyStack(_) => {
                return Err(Error::internal(
                    "while_loop",
                    "a checkpointed loop with stacks",
                ))
            }
        };
        let fill = creation::Fill {
            dtype,
            shape: shape.into(),
            value,
        };
        inputs.push(ir.op(fill, &[])?);
    }
    let forward = b.add_node(ckpt.forward.clone(), &inputs, ckpt_fwd_types)?;
    let mut inputs: Vec<Port> = cotangents.to_vec();
    inputs.extend(ckpt.backward_outputs.iter().map(|&i| forward[i]));
    inputs.extend(ckpt.backward_inputs.iter().map(|&i| x0[i]));
    let out = b.add_node(ckpt.backward.clone(), &inputs, ckpt_bwd_types)?;
    add_function(tracer, b.finish(&out[..nc], &[])?)
}

/// The types `rows_or_checkpoints` needs: the gradients', the rows' the forward loop saved, the
/// dense backward loop's parameters.
struct LoopTypes {
    gradients: Vec<ValueType>,
    saved: Vec<ValueType>,
    dense_backward: Vec<ValueType>,
}

/// The gradient's call, (cotangents, trips, rows, x0) -> gradients: the rows' backward loop
/// (none of its trips when the rows did not hold them), then `branches` on whether they did.
fn rows_or_checkpoints(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    dense: &Built,
    types: LoopTypes,
    branches: NodeKind,
    rows: usize,
) -> Result<String> {
    let nc = lp.carried.len();
    let dense_saved = dense.backward_outputs.len();
    let name = &lp.body.name;
    let mut params: Vec<ValueType> = types.gradients.clone();
    params.extend(types.saved);
    params.extend(lp.body.params.iter().cloned());
    let (mut b, args) = FunctionBuilder::new(format!("{name}_rows_or_ckpt_grad"), params);
    let trips = args[nc];
    let x0 = &args[nc + dense_saved..];
    let mut ir = Ir { b: &mut b };
    let fits = ir.cmp(binary::LessEqual, trips, rows as i64)?;
    let none = ir.i64(0);
    let row_trips = ir.select(fits, trips, none)?;
    let mut inputs: Vec<Port> = args[..nc].to_vec();
    inputs.push(row_trips);
    inputs.extend_from_slice(&args[nc + 1..nc + dense_saved]);
    inputs.extend(dense.backward_inputs.iter().map(|&i| x0[i]));
    let rows_grads = b.add_node(dense.backward.clone(), &inputs, types.dense_backward)?;
    let mut inputs = vec![fits];
    inputs.extend_from_slice(&rows_grads[..nc]);
    inputs.extend_from_slice(&args[..nc]);
    inputs.extend_from_slice(x0);
    let out = b.add_node(branches, &inputs, types.gradients)?;
    add_function(tracer, b.finish(&out, &[])?)
}
