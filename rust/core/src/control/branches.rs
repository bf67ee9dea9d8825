//! The gradient of a node that calls one of several functions (`If`, `Case`, and `Call` with
//! one): each branch `B` is replayed under a tape into a new function `B_fwd`; its backward
//! function `B_bwd(cotangents)` is built in a frame above, so every forward value a gradient
//! rule uses is captured: those captures are the residuals. A NEW forward node calls the
//! `B_fwd`s, returning `results ++ residuals(B_1) ++ ... ++ residuals(B_n)` (each branch fills
//! the other branches' slots with a cheap zero-size or zero mirror); it supersedes the old node,
//! which the frame drops when it finishes. The gradient is the same kind of node over the
//! backward functions, taking the residuals.

use crate::error::Result;
use crate::graph::inline_into;
use crate::graph::{with_params, FunctionBuilder, Port, ValueType};
use crate::trace::gradients::{
    add_function, differentiate, function, is_differentiable, is_float_tensor, mirror, Built,
    ControlGradient,
};
use crate::trace::{TracerRef, Val};

/// Builds the forward and gradient nodes of a branching node: the same construct over the
/// forward functions and over the backward functions.
pub(crate) fn augment_branches(g: &ControlGradient, tracer: &TracerRef) -> Result<Built> {
    let sel = g.selector();
    let operands = &g.inputs[sel..];
    let cotangents: Vec<usize> = (0..g.outputs.len())
        .filter(|&i| is_float_tensor(&g.outputs[i].value_type()))
        .collect();
    let differentiable: Vec<usize> = (0..operands.len())
        .filter(|&i| is_differentiable(&operands[i].value_type()))
        .collect();
    let callees: Vec<String> = g.callees().iter().map(|s| s.to_string()).collect();
    let mut parts = Vec::new();
    for callee in &callees {
        let f = function(tracer, callee)?;
        parts.push(differentiate(tracer, &f, &cotangents, &differentiable)?);
    }
    // A residual that is a branch operand (a resource read in the branch, an input the
    // gradient reuses) is passed to the backward node from outside: every branch sees the
    // same operands, so it needs no slot, and a resource could not be mirrored in one.
    let mut operand_inputs: Vec<usize> = parts
        .iter()
        .flat_map(|p| p.residual_params.iter().flatten().copied())
        .collect();
    operand_inputs.sort_unstable();
    operand_inputs.dedup();
    // Residual slots: branch k's other residuals at offsets[k].
    let mut offsets = Vec::new();
    let mut slot_types: Vec<ValueType> = Vec::new();
    for p in &parts {
        offsets.push(slot_types.len());
        slot_types.extend(p.slot_residuals().map(|r| p.residual_types[r].clone()));
    }
    let n_out = g.outputs.len();
    let operand_types: Vec<ValueType> = operands.iter().map(Val::value_type).collect();
    let mut fwd_names = Vec::new();
    let mut bwd_names = Vec::new();
    for (k, p) in parts.iter().enumerate() {
        let fwd = function(tracer, &p.forward)?;
        let (mut b, args) = FunctionBuilder::new(&p.forward, operand_types.clone());
        let (res, effects) = inline_into(&mut b, &fwd, &args)?;
        let mut results: Vec<Port> = res[..n_out].to_vec();
        for (j, q) in parts.iter().enumerate() {
            for r in q.slot_residuals() {
                results.push(if j == k {
                    res[n_out + r]
                } else {
                    mirror(&mut b, &q.residual_types[r])?
                });
            }
        }
        fwd_names.push(add_function(tracer, b.finish(&results, &effects)?)?);
        // Backward: (cotangents, residual slots, operand residuals) -> gradients.
        let bwd = function(tracer, &p.backward)?;
        let n_cot = cotangents.len();
        let mut params: Vec<ValueType> = bwd.params[..n_cot].to_vec();
        params.extend(slot_types.iter().cloned());
        params.extend(operand_inputs.iter().map(|&i| operand_types[i].clone()));
        let mut mapping: Vec<usize> = (0..n_cot).collect();
        let mut slot = n_cot + offsets[k];
        for param in &p.residual_params {
            mapping.push(match param {
                Some(i) => {
                    let at = operand_inputs.binary_search(i).expect("collected above");
                    n_cot + slot_types.len() + at
                }
                None => {
                    slot += 1;
                    slot - 1
                }
            });
        }
        let g = with_params(&bwd, &p.backward, params, &mapping, &[])?;
        bwd_names.push(add_function(tracer, g)?);
    }
    let (forward, backward) = (g.with_callees(fwd_names), g.with_callees(bwd_names));
    Ok(Built {
        forward,
        forward_extra: Vec::new(),
        backward,
        backward_outputs: (n_out..n_out + slot_types.len()).collect(),
        backward_inputs: operand_inputs.iter().map(|i| sel + i).collect(),
        cotangents,
        differentiable,
    })
}

/// `Augment` for a construct whose gradient is the branch gradient above (`If`, `Case`, `Call`),
/// named `$api` in errors.
macro_rules! branch_gradient {
    ($construct:ty, $api:literal) => {
        impl $crate::trace::gradients::Augment for $construct {
            fn api_name(&self) -> &'static str {
                $api
            }

            fn augment(
                &self,
                g: &$crate::trace::gradients::ControlGradient,
                tracer: &$crate::trace::TracerRef,
                _grad_outputs: &[Option<$crate::trace::Val>],
                _needs: &[bool],
            ) -> $crate::error::Result<$crate::trace::gradients::Built> {
                $crate::control::branches::augment_branches(g, tracer)
            }
        }
    };
}
pub(crate) use branch_gradient;
