//! Traced float64 programs for the emitter tests: a cond, a switch_case, a data-dependent loop
//! and nested loops, each with its value and (optionally) gradients, built the way
//! `gl.function` and `gl.grad` build them (tracer, tape, symbolic gradients).

use crate::control::{emit_case, emit_if};
use crate::graph::{Graph, ValueType};
use crate::ops::build;
use crate::ops::Context;
use crate::tape::{compute_gradient, Tape, TapeContext, TapeRef};
use crate::testing::trace::{int, while_loop};
use crate::trace::{graph_registry, lock, Branch, TraceContext, Tracer, Val};
use crate::value::Value;
use crate::DType;

type Program = dyn Fn(&mut dyn Context<Val>, &[Val]) -> Val;

fn f64s(n: usize) -> ValueType {
    ValueType::tensor(DType::F64, &[n])
}

/// The graph of `(y, dy/dx...)` for `order` 1 (every float parameter), of `(y, d/dx sum(dy/dx0))`
/// for order 2, or of `y` alone for order 0. Nothing may be captured from outside.
pub(crate) fn trace(params: Vec<ValueType>, order: usize, body: &Program) -> Graph {
    let (tracer, xs) = Tracer::new("f", params);
    let registry = graph_registry();
    let mut base = TraceContext::new(Some(tracer.clone()));
    let outer: TapeRef<Val> = Tape::new_ref(false);
    let inner: TapeRef<Val> = Tape::new_ref(false);
    let floats: Vec<Val> = xs
        .iter()
        .filter(|v| v.ty().dtype.is_float())
        .cloned()
        .collect();
    for t in [&outer, &inner] {
        let mut t = t.lock().unwrap();
        floats.iter().for_each(|v| t.watch(v).unwrap());
    }
    let both = [outer.clone(), inner.clone()];
    let mut taped = TapeContext {
        inner: &mut base,
        tapes: &both,
        registry: &registry,
    };
    let y = body(&mut taped, &xs);
    let mut results = vec![y.clone()];
    if order > 0 {
        let only_outer = [outer.clone()];
        let mut ctx = TapeContext {
            inner: &mut base,
            tapes: &only_outer,
            registry: &registry,
        };
        let grads = compute_gradient(&inner, &mut ctx, &[y], &floats, None).unwrap();
        let grads: Vec<Val> = grads.into_iter().map(|g| g.expect("a gradient")).collect();
        if order == 1 {
            results.extend(grads);
        } else {
            let s = build::sum(&mut ctx, &grads[0], &[], false).unwrap();
            let gg = compute_gradient(&outer, &mut base, &[s], &floats, None).unwrap();
            results.extend(gg.into_iter().map(|g| g.expect("a second-order gradient")));
        }
    }
    let traced = lock(&tracer).finish(&results).unwrap();
    assert!(traced.captured_inputs.is_empty(), "{}", traced.graph);
    traced.graph
}

/// Traces `f` as a branch function with no own parameters.
fn branch(ctx: &mut dyn Context<Val>, f: &dyn Fn(&mut dyn Context<Val>) -> Val) -> Branch {
    let tracer = ctx.tracer().unwrap();
    lock(&tracer).push_function("branch", vec![]);
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let out = f(&mut inner);
    let popped = lock(&tracer).pop_function(&[out]).unwrap();
    Branch::from(popped)
}

/// `sum(x * x * c) if p else sum(sin(x) + c)`; params `(p: bool[], x: f64[2], c: f64[2])`.
pub(crate) fn cond(order: usize) -> Graph {
    let params = vec![ValueType::tensor(DType::Bool, &[]), f64s(2), f64s(2)];
    trace(params, order, &|ctx, v| {
        let (x, c) = (&v[1], &v[2]);
        let t = branch(ctx, &|ctx| {
            let a = build::mul(ctx, x, x).unwrap();
            let a = build::mul(ctx, &a, c).unwrap();
            build::sum(ctx, &a, &[], false).unwrap()
        });
        let e = branch(ctx, &|ctx| {
            let b = build::sin(ctx, x).unwrap();
            let b = build::add(ctx, c, &b).unwrap();
            build::sum(ctx, &b, &[], false).unwrap()
        });
        emit_if(ctx, &v[0], &t, &e).unwrap().remove(0)
    })
}

/// `sum([x * c, sin(x), exp(c) * x][k])`; params `(k: i32[], x: f64[2], c: f64[2])`.
pub(crate) fn switch(order: usize) -> Graph {
    let params = vec![ValueType::tensor(DType::I32, &[]), f64s(2), f64s(2)];
    trace(params, order, &|ctx, v| {
        let (x, c) = (&v[1], &v[2]);
        let branches = [
            branch(ctx, &|ctx| build::mul(ctx, x, c).unwrap()),
            branch(ctx, &|ctx| build::sin(ctx, x).unwrap()),
            branch(ctx, &|ctx| {
                let e = build::exp(ctx, c).unwrap();
                build::mul(ctx, &e, x).unwrap()
            }),
        ];
        let y = emit_case(ctx, &v[0], &branches).unwrap().remove(0);
        build::sum(ctx, &y, &[], false).unwrap()
    })
}

/// `while i < n: x = sin(x) * c + x; i += 1`, then `sum(x)`; params `(x, c: f64[2], n: i64[])`.
pub(crate) fn while_sin(order: usize) -> Graph {
    while_sin_bounded(order, None)
}

/// `while_sin` with `maximum_iterations`.
pub(crate) fn while_sin_bounded(order: usize, maximum_iterations: Option<i64>) -> Graph {
    while_sin_of(2, order, maximum_iterations)
}

/// `while_sin_bounded` on vectors of `width` elements (more than `emit::HOST_ELEMENTS`: the
/// MLIR emitter keeps them on the device).
pub(crate) fn while_sin_of(width: usize, order: usize, maximum_iterations: Option<i64>) -> Graph {
    let params = vec![f64s(width), f64s(width), ValueType::tensor(DType::I64, &[])];
    trace(params, order, &move |ctx, v| {
        let (x, c, n) = (&v[0], &v[1], &v[2]);
        let i0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
        let out = while_loop(
            ctx,
            &[i0, x.clone()],
            maximum_iterations,
            &|ctx, w| vec![build::less(ctx, &w[0], n).unwrap()],
            &|ctx, w| {
                let s = build::sin(ctx, &w[1]).unwrap();
                let s = build::mul(ctx, &s, c).unwrap();
                let x = build::add(ctx, &s, &w[1]).unwrap();
                vec![build::add(ctx, &w[0], &int(1)).unwrap(), x]
            },
        );
        build::sum(ctx, &out[1], &[], false).unwrap()
    })
}

/// `for i < n: (for j < i (at most 3 trips): x = tanh(x * c) + x)`, then `sum(x)`; params
/// `(x, c: f64[2], n: i64[])`.
pub(crate) fn nested_loops(order: usize) -> Graph {
    nested_loops_bounded(order, None)
}

/// `nested_loops` with `maximum_iterations` on the outer loop.
pub(crate) fn nested_loops_bounded(order: usize, maximum_iterations: Option<i64>) -> Graph {
    nested_loops_of(2, order, maximum_iterations)
}

/// `nested_loops_bounded` on vectors of `width` elements (see `while_sin_of`).
pub(crate) fn nested_loops_of(
    width: usize,
    order: usize,
    maximum_iterations: Option<i64>,
) -> Graph {
    let params = vec![f64s(width), f64s(width), ValueType::tensor(DType::I64, &[])];
    trace(params, order, &move |ctx, v| {
        let (x, c, n) = (&v[0], &v[1], &v[2]);
        let i0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
        let out = while_loop(
            ctx,
            &[i0, x.clone()],
            maximum_iterations,
            &|ctx, w| vec![build::less(ctx, &w[0], n).unwrap()],
            &|ctx, w| {
                let j0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
                let limit = w[0].clone();
                let inner = while_loop(
                    ctx,
                    &[j0, w[1].clone()],
                    Some(3),
                    &|ctx, u| vec![build::less(ctx, &u[0], &limit).unwrap()],
                    &|ctx, u| {
                        let t = build::mul(ctx, &u[1], c).unwrap();
                        let t = build::tanh(ctx, &t).unwrap();
                        let x = build::add(ctx, &t, &u[1]).unwrap();
                        vec![build::add(ctx, &u[0], &int(1)).unwrap(), x]
                    },
                );
                vec![build::add(ctx, &w[0], &int(1)).unwrap(), inner[1].clone()]
            },
        );
        build::sum(ctx, &out[1], &[], false).unwrap()
    })
}
