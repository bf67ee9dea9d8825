//! The loop's gradient: the body replayed and differentiated, residuals stacked (or kept in
//! checkpoints: `checkpointed`, `dense`, `hybrid`), the backward loop popping them.

use super::{checkpointed, dense, hybrid, ALL_STATES_UP_TO};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{inline_into, Function, FunctionBuilder, NodeKind, Port, StackOp};
use crate::graph::{ValueType, While};
use crate::ops::binary;
use crate::tape::GradientFunction;
use crate::tensor::Tensor;
use crate::trace::gradients::{
    add_function, carries_cotangent, differentiate, function, is_differentiable, is_float_resource,
    is_float_stack, Augment, Built, ControlGradient, Differentiate, Differentiated, ExtraInput,
};
use crate::trace::{TracerRef, Val};
use std::sync::Arc;

impl Differentiate for While {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(ControlGradient::boxed(self.clone(), inputs, outputs)))
    }
}

/// The body is replayed and differentiated; residuals that are loop invariant (variables the
/// body passes through) stay loop variables and every other residual gets a stack. Captured
/// outer tensors are loop variables, so their gradients accumulate through the cotangent chain.
impl Augment for While {
    fn api_name(&self) -> &'static str {
        "while_loop"
    }

    fn augment(
        &self,
        _g: &ControlGradient,
        tracer: &TracerRef,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Built> {
        let While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
            checkpoints,
        } = self;
        let body_fn = function(tracer, body)?;
        let cond_fn = function(tracer, cond)?;
        let n = body_fn.params.len();
        let (carried, float_vars, d) = carried_vars(tracer, &body_fn, needs, grad_outputs)?;
        // the user's checkpoints bound the memory in states; fixed-size state asks for a size
        let residuals_allowed = checkpoints.is_none();
        let checkpoints =
            checkpoints.or_else(|| fixed_state(tracer, &body_fn, *maximum_iterations));
        if let Some(c) = checkpoints {
            let lp = checkpointed::Loop {
                cond: &cond_fn,
                body: &body_fn,
                carried: &carried,
                float_vars: &float_vars,
                maximum_iterations: *maximum_iterations,
                parallel_iterations: *parallel_iterations,
            };
            // every state fits: a row per trip, no schedule
            if let Some(m) = maximum_iterations.filter(|&m| m <= i64::from(c)) {
                let rows = usize::try_from(m).unwrap_or(0);
                return dense::augment(tracer, &lp, &d, rows, residuals_allowed);
            }
            // fixed-size state with no bound: rows while the trips fit them
            if residuals_allowed {
                if let Some(rows) = hybrid::rows(tracer, &lp, &d, c)? {
                    return hybrid::augment(tracer, &lp, &d, rows, c);
                }
            }
            return checkpointed::augment(tracer, &lp, &d, c);
        }
        let residuals = Residuals::of(&d);
        let (fwd_cond, fwd_body) =
            self.stacked_forward(tracer, &body_fn, &cond_fn, &d, &residuals)?;
        let (grad_cond, grad_body) =
            self.stacked_backward(tracer, &d, &residuals, &carried, &float_vars)?;
        let mut forward_extra = vec![ExtraInput::Zero(DType::I64)];
        forward_extra.extend(
            (residuals.stack_types.iter()).map(|t| ExtraInput::EmptyStack(t.inner().clone())),
        );
        let (stacked, invariant) = (&residuals.stacked, &residuals.invariant);
        Ok(Built {
            forward: While::stacked(
                fwd_cond,
                fwd_body,
                *maximum_iterations,
                *parallel_iterations,
            ),
            forward_extra,
            backward: While::stacked(grad_cond, grad_body, None, *parallel_iterations),
            backward_outputs: (n..n + 1 + stacked.len()).collect(),
            backward_inputs: invariant.iter().map(|&(_, i)| i).collect(),
            cotangents: carried.clone(),
            differentiable: carried,
        })
    }
}

/// The variables the backward loop carries a cotangent for, the float variables, and the
/// body differentiated with those. A variable carries a cotangent once one reaches it: from
/// the node's outputs, or through the body from another (a fixed point). One that none
/// reaches (a running sum read only by the condition) keeps no residuals for its own
/// derivative.
fn carried_vars(
    tracer: &TracerRef,
    body_fn: &Function,
    needs: &[bool],
    grad_outputs: &[Option<Val>],
) -> Result<(Vec<usize>, Vec<usize>, Differentiated)> {
    let n = body_fn.params.len();
    let types = &body_fn.params;
    let wanted = wanted_vars(body_fn, needs);
    let mut carried: Vec<usize> = (0..n)
        .filter(|&i| {
            wanted[i]
                && (is_float_resource(&types[i])
                    || (carries_cotangent(&types[i])
                        && grad_outputs.get(i).is_some_and(Option::is_some)))
        })
        .collect();
    let float_vars: Vec<usize> = (0..n)
        .filter(|&i| wanted[i] && (is_differentiable(&types[i]) || is_float_stack(&types[i])))
        .collect();
    loop {
        let d = differentiate(tracer, body_fn, &carried, &float_vars)?;
        let grown: Vec<usize> = (float_vars.iter().zip(&d.nonzero))
            .filter(|(i, nz)| **nz && !carried.contains(i))
            .map(|(&i, _)| i)
            .collect();
        if grown.is_empty() {
            return Ok((carried, float_vars, d));
        }
        carried.extend(grown);
        carried.sort_unstable();
    }
}

/// Which residuals of the body are stacked (one stack each, of these types) and which are
/// loop invariant (a variable the body passes through: `(residual, var)`).
struct Residuals {
    stacked: Vec<usize>,
    stack_types: Vec<ValueType>,
    invariant: Vec<(usize, usize)>,
}

impl Residuals {
    fn of(d: &Differentiated) -> Residuals {
        let mut stacked: Vec<usize> = Vec::new();
        let mut invariant: Vec<(usize, usize)> = Vec::new();
        for (r, param) in d.residual_params.iter().enumerate() {
            match param {
                Some(i) if d.passthrough[*i] => invariant.push((r, *i)),
                _ => stacked.push(r),
            }
        }
        let stack_types = (stacked.iter())
            .map(|&r| ValueType::Stack(d.residual_types[r].inner().clone()))
            .collect();
        Residuals {
            stacked,
            stack_types,
            invariant,
        }
    }
}

impl While {
    /// The forward loop's condition and body: loop variables, a trip count and a stack per
    /// stacked residual; the body runs the body, counts, and pushes the residuals.
    fn stacked_forward(
        &self,
        tracer: &TracerRef,
        body_fn: &Function,
        cond_fn: &Function,
        d: &Differentiated,
        residuals: &Residuals,
    ) -> Result<(String, String)> {
        let (body, cond) = (&self.body, &self.cond);
        let n = body_fn.params.len();
        let mut aug_params = body_fn.params.clone();
        aug_params.push(ValueType::tensor(DType::I64, &[]));
        aug_params.extend(residuals.stack_types.iter().cloned());
        let fwd = function(tracer, &d.forward)?;
        let (mut b, args) = FunctionBuilder::new(format!("{body}_fwd"), aug_params.clone());
        let (res, effects) = inline_into(&mut b, &fwd, &args[..n])?;
        let one = b.add_const(Tensor::scalar(1i64));
        let count = b.add_op1(binary::Add, &[args[n], one], None)?;
        let mut results: Vec<Port> = res[..n].to_vec();
        results.push(count);
        for (k, &r) in residuals.stacked.iter().enumerate() {
            let pushed = b.add_node(
                NodeKind::Stack(StackOp::Push),
                &[args[n + 1 + k], res[n + r]],
                vec![residuals.stack_types[k].clone()],
            )?;
            results.push(pushed[0]);
        }
        let fwd_body = add_function(tracer, b.finish(&results, &effects)?)?;
        let (mut b, args) = FunctionBuilder::new(format!("{cond}_fwd"), aug_params);
        let (res, _) = inline_into(&mut b, cond_fn, &args[..n])?;
        let fwd_cond = add_function(tracer, b.finish(&res, &[])?)?;
        Ok((fwd_cond, fwd_body))
    }

    /// The backward loop's condition and body, over (cotangents of `carried`, count, stacks,
    /// invariants): the body pops the residuals, runs the body's backward function and counts
    /// down; the loop runs while the count is above zero.
    fn stacked_backward(
        &self,
        tracer: &TracerRef,
        d: &Differentiated,
        residuals: &Residuals,
        carried: &[usize],
        float_vars: &[usize],
    ) -> Result<(String, String)> {
        let (body, cond) = (&self.body, &self.cond);
        let Residuals {
            stacked,
            stack_types,
            invariant,
        } = residuals;
        let bwd = function(tracer, &d.backward)?;
        let nc = carried.len();
        let mut bparams: Vec<ValueType> = bwd.params[..nc].to_vec();
        bparams.push(ValueType::tensor(DType::I64, &[]));
        bparams.extend(stack_types.iter().cloned());
        bparams.extend(invariant.iter().map(|&(r, _)| d.residual_types[r].clone()));
        let (mut b, args) = FunctionBuilder::new(format!("{body}_grad"), bparams.clone());
        let mut residual_ports: Vec<Option<Port>> = vec![None; d.residual_types.len()];
        let mut stacks_out = Vec::new();
        for (k, &r) in stacked.iter().enumerate() {
            let item = ValueType::Tensor(stack_types[k].inner().clone());
            let types = vec![stack_types[k].clone(), item];
            let popped = b.add_node(NodeKind::Stack(StackOp::Pop), &[args[nc + 1 + k]], types)?;
            stacks_out.push(popped[0]);
            residual_ports[r] = Some(popped[1]);
        }
        let invariants = &args[nc + 1 + stacked.len()..];
        for (j, &(r, _)) in invariant.iter().enumerate() {
            residual_ports[r] = Some(invariants[j]);
        }
        let mut bargs: Vec<Port> = args[..nc].to_vec();
        bargs.extend((residual_ports.into_iter()).map(|p| p.expect("every residual is bound")));
        let (grads, _) = inline_into(&mut b, &bwd, &bargs)?;
        // `grads` follow `float_vars`; the new cotangents follow `carried`.
        let position = |i: &usize| float_vars.iter().position(|v| v == i);
        let mut results: Vec<Port> = (carried.iter())
            .map(|i| grads[position(i).expect("carried vars are float")])
            .collect();
        let one = b.add_const(Tensor::scalar(1i64));
        results.push(b.add_op1(binary::Sub, &[args[nc], one], None)?);
        results.extend(stacks_out);
        results.extend(invariants.iter().take(invariant.len()).copied());
        let grad_body = add_function(tracer, b.finish(&results, &[])?)?;
        let (mut b, args) = FunctionBuilder::new(format!("{cond}_grad"), bparams);
        let zero = b.add_const(Tensor::scalar(0i64));
        let more = b.add_op1(binary::Greater, &[args[nc], zero], None)?;
        let grad_cond = add_function(tracer, b.finish(&[more], &[])?)?;
        Ok((grad_cond, grad_body))
    }
}

/// Per loop variable of `body`: whether the backward loop needs its cotangent. A float tensor
/// variable whose gradient `needs` asks for does, and so does every float variable whose next
/// value depends on one that does (its cotangent flows into theirs); float stacks always may.
/// The others (a loop-invariant input nobody differentiates) are left out, with the
/// residuals only their gradients would use (the RFC's `skip_input_indices`).
fn wanted_vars(body: &Function, needs: &[bool]) -> Vec<bool> {
    let n = body.params.len();
    let float = |i: usize| is_differentiable(&body.params[i]) || is_float_stack(&body.params[i]);
    let mut wanted: Vec<bool> = (0..n)
        .map(|i| {
            is_float_stack(&body.params[i]) || (float(i) && needs.get(i).copied().unwrap_or(true))
        })
        .collect();
    let deps = result_dependencies(body);
    let mut changed = true;
    while changed {
        changed = false;
        for j in 0..n {
            let depends = deps
                .get(j)
                .is_some_and(|d| (0..n).any(|i| wanted[i] && d[i]));
            if !wanted[j] && float(j) && depends {
                wanted[j] = true;
                changed = true;
            }
        }
    }
    wanted
}

/// Per result of `f`: which of its parameters it depends on (through any node: a node's
/// outputs all depend on all its inputs).
fn result_dependencies(f: &Function) -> Vec<Vec<bool>> {
    let n = f.params.len();
    let mut deps: Vec<Vec<bool>> = Vec::with_capacity(f.nodes.len());
    for node in &f.nodes {
        let mut d = vec![false; n];
        if let NodeKind::Arg(k) = node.kind {
            if let Some(x) = d.get_mut(k) {
                *x = true;
            }
        }
        for p in &node.inputs {
            if let Some(from) = deps.get(p.node) {
                for (x, y) in d.iter_mut().zip(from) {
                    *x |= *y;
                }
            }
        }
        deps.push(d);
    }
    f.results
        .iter()
        .map(|p| deps.get(p.node).cloned().unwrap_or_else(|| vec![true; n]))
        .collect()
}

/// The snapshots a loop's gradient keeps where the trace asks for fixed-size state
/// (`Tracer::fixed_state_loops`, as pure StableHLO needs) and the loop names none: one per
/// possible trip when `maximum_iterations` bounds it by at most `ALL_STATES_UP_TO` (every
/// state kept, nothing recomputed), else the trace's default. A body that assigns a Variable
/// cannot be recomputed: it keeps stacks (which such an export then refuses, naming them).
fn fixed_state(
    tracer: &TracerRef,
    body: &Function,
    maximum_iterations: Option<i64>,
) -> Option<u32> {
    let default = crate::trace::lock(tracer).fixed_state_loops?;
    if !body.control_outputs.is_empty() {
        return None;
    }
    match maximum_iterations {
        Some(m) if m <= ALL_STATES_UP_TO => u32::try_from(m.max(1)).ok(),
        _ => Some(default),
    }
}
