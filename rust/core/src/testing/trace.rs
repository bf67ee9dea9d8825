//! Test helpers shared by the tracing and MLIR emitter tests: loops traced from closures.

use crate::control::emit_while;
use crate::graph::ValueType;
use crate::ops::Context;
use crate::tensor::Tensor;
use crate::trace::{lock, Branch, LoopFunctions, TraceContext, Val};

/// A traced loop cond or body: loop variables in, results out.
pub(crate) type LoopFn<'a> = &'a dyn Fn(&mut dyn Context<Val>, &[Val]) -> Vec<Val>;

/// Emits `while cond(vars): vars = body(vars)` (at most `max` trips) with the closures traced
/// as functions.
pub(crate) fn while_loop(
    ctx: &mut dyn Context<Val>,
    vars: &[Val],
    max: Option<i64>,
    cond: LoopFn,
    body: LoopFn,
) -> Vec<Val> {
    let tracer = ctx.tracer().unwrap();
    let types: Vec<ValueType> = vars.iter().map(Val::value_type).collect();
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let params = lock(&tracer).push_function("cond", types.clone());
    let more = cond(&mut inner, &params);
    let cond = Branch::from(lock(&tracer).pop_function(&more).unwrap());
    let params = lock(&tracer).push_function("body", types);
    let next = body(&mut inner, &params);
    let body = Branch::from(lock(&tracer).pop_function(&next).unwrap());
    let functions = LoopFunctions {
        cond,
        body,
        maximum_iterations: max,
        parallel_iterations: 10,
        checkpoints: None,
    };
    emit_while(ctx, &functions, vars).unwrap()
}

/// An int64 scalar constant.
pub(crate) fn int(v: i64) -> Val {
    Val::Tensor(Tensor::scalar(v))
}
