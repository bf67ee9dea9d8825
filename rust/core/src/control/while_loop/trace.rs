//! The loop traced: `emit_while`, what `gl.while_loop` records.

use crate::error::{Error, ErrorKind, Result};
use crate::graph::NodeKind;
use crate::graph::While;
use crate::ops::Context;
use crate::trace::captures::{tracer_of, unify, union, LoopFunctions};
use crate::trace::variables::{thread_variables, Carrier};
use crate::trace::{TracerRef, Val};

/// `While(vars..., captures...)`; cond and body were traced with the loop variables as
/// parameters. Captures become extra loop variables the body passes through. Returns the
/// final loop variables (without the captures).
pub fn emit_while(
    ctx: &mut dyn Context<Val>,
    functions: &LoopFunctions,
    vars: &[Val],
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "while_loop")?;
    let mut captures = union(&[&functions.cond, &functions.body]);
    let cond = unify(&tracer, &[&functions.cond], vars.len(), &captures, false)?;
    let body = unify(&tracer, &[&functions.body], vars.len(), &captures, true)?;
    if let Some(c) = functions.checkpoints {
        refuse_side_effects(&tracer, &body[0], c)?;
    }
    let names = [cond[0].clone(), body[0].clone()];
    let threaded = thread_variables(
        ctx,
        &tracer,
        &names,
        vars.len(),
        Carrier::Loop,
        &mut captures,
    )?;
    let kind = NodeKind::While(While {
        cond: cond[0].clone(),
        body: body[0].clone(),
        maximum_iterations: functions.maximum_iterations,
        parallel_iterations: functions.parallel_iterations,
        checkpoints: functions.checkpoints,
    });
    let mut inputs = vars.to_vec();
    inputs.extend(captures);
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, vars.len(), Carrier::Loop)
}

/// A checkpointed loop runs its body again to recompute states: a body with side effects
/// (a Variable assigned) would repeat them.
fn refuse_side_effects(tracer: &TracerRef, body: &str, c: u32) -> Result<()> {
    let effects = !crate::trace::lock(tracer)
        .library()
        .get(body)?
        .control_outputs
        .is_empty();
    if effects {
        let msg = format!(
            "checkpoints={c} runs the loop body again to recompute the states its gradient \
             needs, which would repeat the body's side effects: it assigns a Variable (reading \
             one is fine); assign outside the loop, or leave checkpoints=None"
        );
        return Err(Error::new(ErrorKind::ControlFlow, "while_loop", msg));
    }
    Ok(())
}
