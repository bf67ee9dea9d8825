//! The gradient of a `While` with `checkpoints = c`: c snapshots of the loop variables instead
//! of a stack per residual, so its memory does not depend on the trip count.
//!
//! ```text
//!   forward:  (vars, step, bufs, steps, placement) -> before each trip, the placement picks
//!             a slot (or none) for the state x_step: bufs[v][slot] = x_step[v]; steps[slot] = step
//!   backward: (cotangents, g = trips, bufs, steps, invariants) while g > 0:
//!               x = the kept state x_at with the greatest at < g
//!               advance (an inner While): x = body(x) until at = g - 1, keeping states in
//!                 free slots where treeverse says (halfway, or every one when they suffice)
//!               the body's forward and backward functions on x_{g-1}: cotangents of x_{g-1}
//!               g -= 1; slots of states at or past g are freed
//! ```
//!
//! The placement is Stumm and Walther's online Algorithm I up to (c+1)(c+2)/2 - 1 trips, then
//! the dynamic checkpointing of Wang, Moin and Iaccarino (levels, dispensable slots); the
//! backward pass is Griewank's treeverse. `py/gradloop/_checkpoints.py` holds the same schedule
//! in plain Python, with the proofs of its bounds as tests; `schedule.rs` builds it as graph
//! IR of scalar and `[c]` integer ops, so the executor, the interpreter, the MLIR emitter and
//! the tape all run it as they run any program (its own gradient, for second derivatives, uses
//! stacks).
//!
//! Every snapshot buffer has c + 1 rows: a state the forward loop does not keep goes to row
//! c, so that loop has no branch and every shape is static (the backward's rarer stores are an
//! `If`). Loop variables the body passes through
//! unchanged are not kept: the backward node takes them from the loop's inputs.

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{inline_into, Function, FunctionBuilder, If, NodeKind, Port, ValueType, While};
use crate::ops::binary;
use crate::shape::{TensorType, DYN};
use crate::trace::gradients::{add_function, function, Built, Differentiated, ExtraInput};
use crate::trace::TracerRef;

use super::schedule::{i64_type, Ir, Placement, Schedule};

/// The loop being differentiated, as `Augment for While` found it.
pub(super) struct Loop<'a> {
    pub cond: &'a Function,
    pub body: &'a Function,
    /// Loop variables whose cotangents the backward loop carries (sorted).
    pub carried: &'a [usize],
    /// Loop variables the body's backward function returns gradients for, in its order.
    pub float_vars: &'a [usize],
    pub maximum_iterations: Option<i64>,
    pub parallel_iterations: u32,
}

impl Loop<'_> {
    /// The forward loop's condition `{cond}_{suffix}`: the loop's own, on the loop variables
    /// first among `params`.
    pub(super) fn forward_cond(
        &self,
        tracer: &TracerRef,
        suffix: &str,
        params: Vec<ValueType>,
    ) -> Result<String> {
        let n = self.body.params.len();
        let (mut b, args) = FunctionBuilder::new(format!("{}_{suffix}", self.cond.name), params);
        let (res, _) = inline_into(&mut b, self.cond, &args[..n])?;
        add_function(tracer, b.finish(&res, &[])?)
    }

    /// The backward loop's condition `{cond}_{suffix}`: trips are left (`params[count]`, the
    /// trips left, is above zero).
    pub(super) fn countdown_cond(
        &self,
        tracer: &TracerRef,
        suffix: &str,
        params: Vec<ValueType>,
        count: usize,
    ) -> Result<String> {
        let (mut b, args) = FunctionBuilder::new(format!("{}_{suffix}", self.cond.name), params);
        let more = Ir { b: &mut b }.cmp(binary::Greater, args[count], 0)?;
        add_function(tracer, b.finish(&[more], &[])?)
    }

    /// The gradients of the carried loop variables among `grads` (the body's backward
    /// function's results, one per float variable).
    pub(super) fn carried_gradients(&self, grads: &[Port]) -> Result<Vec<Port>> {
        self.carried
            .iter()
            .map(|i| {
                let k = self.float_vars.iter().position(|v| v == i);
                k.map(|k| grads[k]).ok_or_else(|| {
                    Error::internal("while_loop", "a carried variable has no gradient")
                })
            })
            .collect()
    }
}

/// Builds the forward and backward `While` nodes of a loop checkpointed with `c` snapshots.
pub(super) fn augment(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    c: u32,
) -> Result<Built> {
    let n = lp.body.params.len();
    let s = Snapshots::of(lp, d, c)?;
    let (fwd_cond, fwd_body) = forward_loop(tracer, lp, &s)?;
    let (grad_cond, grad_body) = backward_loop(tracer, lp, d, &s)?;
    let mut forward_extra = vec![ExtraInput::Zero(DType::I64)];
    forward_extra.extend((s.buffer_types.iter()).map(|t| ExtraInput::Fill(t.inner().clone(), 0.0)));
    forward_extra.push(ExtraInput::Fill(TensorType::new(DType::I64, &[s.c]), -1.0));
    forward_extra.extend(Placement::initial(s.c));
    Ok(Built {
        forward: While::stacked(
            fwd_cond,
            fwd_body,
            lp.maximum_iterations,
            lp.parallel_iterations,
        ),
        forward_extra,
        backward: While::stacked(grad_cond, grad_body, None, lp.parallel_iterations),
        backward_outputs: (n..n + 2 + s.kept.len()).collect(),
        backward_inputs: s.invariant,
        cotangents: lp.carried.to_vec(),
        differentiable: lp.carried.to_vec(),
    })
}

/// What the checkpointed loop keeps: the loop variables the body changes (snapshots of static
/// shape, in `[c + 1, ...]` buffers) and those it passes through, and the schedule of `c`
/// slots.
struct Snapshots {
    c: usize,
    schedule: Schedule,
    kept: Vec<usize>,
    kept_types: Vec<TensorType>,
    buffer_types: Vec<ValueType>,
    invariant: Vec<usize>,
}

impl Snapshots {
    fn of(lp: &Loop<'_>, d: &Differentiated, c: u32) -> Result<Snapshots> {
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
                        "checkpoints={c} keeps snapshots of the loop variables the body \
                         changes, which must be tensors of static shape; loop variable {i} is \
                         {other}"
                    ),
                )),
            })
            .collect::<Result<Vec<TensorType>>>()?;
        let c = c as usize;
        let buffer_types = (kept_types.iter())
            .map(|t| {
                let mut shape = vec![c + 1];
                shape.extend_from_slice(&t.shape);
                ValueType::tensor(t.dtype, &shape)
            })
            .collect();
        Ok(Snapshots {
            c,
            schedule: Schedule::new(c),
            kept,
            kept_types,
            buffer_types,
            invariant: (0..n).filter(|&i| d.passthrough[i]).collect(),
        })
    }
}

/// The forward loop's condition and body over (vars, step, bufs, steps, placement): each trip
/// places its state in a slot by the schedule, writes it there, and runs the body.
fn forward_loop(tracer: &TracerRef, lp: &Loop<'_>, s: &Snapshots) -> Result<(String, String)> {
    let n = lp.body.params.len();
    let nk = s.kept.len();
    let mut fparams = lp.body.params.clone();
    fparams.push(i64_type(&[]));
    fparams.extend(s.buffer_types.iter().cloned());
    fparams.push(i64_type(&[s.c]));
    fparams.extend(Placement::types(s.c));
    let (mut b, args) = FunctionBuilder::new(format!("{}_ckpt_fwd", lp.body.name), fparams.clone());
    let step = args[n];
    let (bufs, steps) = (&args[n + 1..n + 1 + nk], args[n + 1 + nk]);
    let placement = Placement::from_ports(&args[n + 2 + nk..]);
    let mut ir = Ir { b: &mut b };
    let name = format!("{}_ckpt", lp.body.name);
    let mut add = |f| add_function(tracer, f);
    let (slot, placement) = s
        .schedule
        .place(&mut ir, step, steps, &placement, &name, &mut add)?;
    let row = s.schedule.row(&mut ir, slot)?;
    let mut results_after: Vec<Port> = Vec::new();
    for (k, &i) in s.kept.iter().enumerate() {
        results_after.push(ir.write_row(bufs[k], args[i], row, &s.kept_types[k])?);
    }
    let steps = s.schedule.record(&mut ir, steps, slot, step)?;
    let next = ir.add(step, 1)?;
    let (res, effects) = inline_into(&mut b, lp.body, &args[..n])?;
    let mut results: Vec<Port> = res[..n].to_vec();
    results.push(next);
    results.extend(results_after);
    results.push(steps);
    results.extend(placement.ports());
    let fwd_body = add_function(tracer, b.finish(&results, &effects)?)?;
    let fwd_cond = lp.forward_cond(tracer, "ckpt_fwd", fparams)?;
    Ok((fwd_cond, fwd_body))
}

/// The backward loop's condition and body over (cotangents, trips left, bufs, steps,
/// invariant vars): each trip reads the latest snapshot below the trip to reverse, advances
/// from it (keeping snapshots on the way: `advance_loop`), replays that trip and runs its
/// backward function.
fn backward_loop(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    s: &Snapshots,
) -> Result<(String, String)> {
    let n = lp.body.params.len();
    let nk = s.kept.len();
    let bwd = function(tracer, &d.backward)?;
    let fwd = function(tracer, &d.forward)?;
    let nc = lp.carried.len();
    let mut bparams: Vec<ValueType> = bwd.params[..nc].to_vec();
    bparams.push(i64_type(&[]));
    bparams.extend(s.buffer_types.iter().cloned());
    bparams.push(i64_type(&[s.c]));
    bparams.extend(s.invariant.iter().map(|&i| lp.body.params[i].clone()));
    let advance = advance_loop(
        tracer,
        lp,
        &s.schedule,
        &s.kept,
        &s.kept_types,
        &s.buffer_types,
    )?;
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_ckpt_grad", lp.body.name), bparams.clone());
    let trips = args[nc];
    let (bufs, steps) = (&args[nc + 1..nc + 1 + nk], args[nc + 1 + nk]);
    let invariants = &args[nc + 2 + nk..];
    let mut ir = Ir { b: &mut b };
    let (at, slot) = s.schedule.latest_below(&mut ir, steps, trips)?;
    let mut state: Vec<Option<Port>> = vec![None; n];
    for (k, &i) in s.kept.iter().enumerate() {
        state[i] = Some(ir.read_row(bufs[k], slot, &s.kept_types[k])?);
    }
    for (j, &i) in s.invariant.iter().enumerate() {
        state[i] = Some(invariants[j]);
    }
    let free = s.schedule.free(&mut ir, steps)?;
    let target = s.schedule.next_keep(&mut ir, at, trips, free)?;
    let mut adv_inputs: Vec<Port> = state.into_iter().flatten().collect();
    adv_inputs.extend([at, target, free, trips]);
    adv_inputs.extend_from_slice(bufs);
    adv_inputs.push(steps);
    let adv_types = function(tracer, &advance.body)?.params;
    let advanced = b.add_node(
        While::stacked(advance.cond, advance.body, None, lp.parallel_iterations),
        &adv_inputs,
        adv_types,
    )?;
    let x = &advanced[..n];
    let (bufs, steps) = (&advanced[n + 4..n + 4 + nk], advanced[n + 4 + nk]);
    let (replayed, _) = inline_into(&mut b, &fwd, x)?;
    let mut bargs: Vec<Port> = args[..nc].to_vec();
    bargs.extend_from_slice(&replayed[n..]);
    let (grads, _) = inline_into(&mut b, &bwd, &bargs)?;
    let mut results = lp.carried_gradients(&grads)?;
    let mut ir = Ir { b: &mut b };
    let left = ir.add(trips, -1)?;
    let steps = s.schedule.free_from(&mut ir, steps, left)?;
    results.push(left);
    results.extend_from_slice(bufs);
    results.push(steps);
    results.extend_from_slice(invariants);
    let grad_body = add_function(tracer, b.finish(&results, &[])?)?;
    let grad_cond = lp.countdown_cond(tracer, "ckpt_grad", bparams, nc)?;
    Ok((grad_cond, grad_body))
}

struct Advance {
    cond: String,
    body: String,
}

/// The inner loop of a backward trip: `(vars, at, target, free, g, bufs, steps)`, running the
/// body from x_at while at + 1 < g and keeping x_at in a free slot when at reaches target.
/// One loop, although a loop of stores around a loop of the body alone runs 30% faster in
/// graph mode: IREE's compile time grows steeply with loop depth (a random program with
/// checkpointed loops nested two deep, differentiated twice, compiled for over 5 minutes).
fn advance_loop(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    schedule: &Schedule,
    kept: &[usize],
    kept_types: &[TensorType],
    buffer_types: &[ValueType],
) -> Result<Advance> {
    let n = lp.body.params.len();
    let nk = kept.len();
    let c = schedule.c;
    let mut params = lp.body.params.clone();
    params.extend(std::iter::repeat_n(i64_type(&[]), 4));
    params.extend(buffer_types.iter().cloned());
    params.push(i64_type(&[c]));
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_ckpt_advance", lp.body.name), params.clone());
    let (at, target, free, trips) = (args[n], args[n + 1], args[n + 2], args[n + 3]);
    let (bufs, steps) = (&args[n + 4..n + 4 + nk], args[n + 4 + nk]);
    let (x, _) = inline_into(&mut b, lp.body, &args[..n])?;
    let mut ir = Ir { b: &mut b };
    let at = ir.add(at, 1)?;
    let store = ir.op(binary::Equal, &[at, target])?;
    // The store in a branch: most trips keep nothing, and under `gl.jit` the free slot's
    // search (a reduction) would otherwise be read back to the host on every trip.
    let branches = store_branches(tracer, &lp.body.name, schedule, kept_types, buffer_types)?;
    let mut inputs = vec![store];
    inputs.extend_from_slice(bufs);
    inputs.extend([steps, free, at]);
    inputs.extend(kept.iter().map(|&i| x[i]));
    let mut types = buffer_types.to_vec();
    types.extend([i64_type(&[c]), i64_type(&[])]);
    let stored = b.add_node(NodeKind::If(branches), &inputs, types)?;
    let (new_bufs, steps, free) = (&stored[..nk], stored[nk], stored[nk + 1]);
    let mut ir = Ir { b: &mut b };
    let next = schedule.next_keep(&mut ir, at, trips, free)?;
    let target = ir.select(store, next, target)?;
    let mut results = x[..n].to_vec();
    results.extend([at, target, free, trips]);
    results.extend_from_slice(new_bufs);
    results.push(steps);
    let body = add_function(tracer, b.finish(&results, &[])?)?;
    let (mut b, args) = FunctionBuilder::new(format!("{}_ckpt_advance_cond", lp.body.name), params);
    let mut ir = Ir { b: &mut b };
    let next = ir.add(args[n], 1)?;
    let more = ir.op(binary::Less, &[next, args[n + 3]])?;
    let cond = add_function(tracer, b.finish(&[more], &[])?)?;
    Ok(Advance { cond, body })
}

/// The branches of an advance trip's store: `(bufs, steps, free, at, kept vars) -> (bufs,
/// steps, free)`, keeping x_at in the first free slot, or nothing.
fn store_branches(
    tracer: &TracerRef,
    name: &str,
    schedule: &Schedule,
    kept_types: &[TensorType],
    buffer_types: &[ValueType],
) -> Result<If> {
    let nk = kept_types.len();
    let mut params = buffer_types.to_vec();
    params.extend([i64_type(&[schedule.c]), i64_type(&[]), i64_type(&[])]);
    params.extend(kept_types.iter().map(|t| ValueType::Tensor(t.clone())));
    let (mut b, args) = FunctionBuilder::new(format!("{name}_ckpt_store"), params.clone());
    let (steps, free, at) = (args[nk], args[nk + 1], args[nk + 2]);
    let mut ir = Ir { b: &mut b };
    let first = schedule.first_free(&mut ir, steps)?;
    let mut results = Vec::with_capacity(nk + 2);
    for (k, ty) in kept_types.iter().enumerate() {
        results.push(ir.write_row(args[k], args[nk + 3 + k], first, ty)?);
    }
    results.push(schedule.record(&mut ir, steps, first, at)?);
    results.push(ir.add(free, -1)?);
    let then_branch = add_function(tracer, b.finish(&results, &[])?)?;
    let (b, args) = FunctionBuilder::new(format!("{name}_ckpt_keep"), params);
    let else_branch = add_function(tracer, b.finish(&args[..nk + 2], &[])?)?;
    Ok(If {
        then_branch,
        else_branch,
    })
}
