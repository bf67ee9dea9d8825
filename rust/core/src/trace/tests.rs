//! Tracing, capture, control-flow emission and control-flow gradients, checked against eager
//! computation and central finite differences through the interpreter.

use super::*;
use crate::control::{emit_case, emit_if, emit_while};
use crate::graph::{verify, NodeKind, ValueType};
use crate::graph::{If, StackOp, VariableOp};
use crate::interpret::{run_graph, RtValue};
use crate::ops::build;
use crate::ops::Context;
use crate::tape::{compute_gradient, Tape, TapeContext, TapeRef};
use crate::tensor::Tensor;
use crate::testing::trace::{int, while_loop};
use crate::DType;

fn f64_ty(shape: &[usize]) -> ValueType {
    ValueType::tensor(DType::F64, shape)
}

fn f64s(values: &[f64]) -> Tensor {
    Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

fn scalar(v: f64) -> Tensor {
    Tensor::scalar(v)
}

/// Runs a finished trace on `args` (captured inputs appended) and returns tensor results.
fn call(traced: &Traced, args: &[Tensor]) -> Vec<Tensor> {
    verify(&traced.graph).unwrap_or_else(|e| panic!("{e}\n{}", traced.graph));
    // Every traced graph prints and parses back to itself.
    let text = traced.graph.to_string();
    assert_eq!(
        crate::graph::parse_graph(&text).unwrap(),
        traced.graph,
        "{text}"
    );
    let mut values: Vec<RtValue> = args.iter().cloned().map(RtValue::Tensor).collect();
    values.extend(traced.captured_inputs.iter().map(Captured::runtime_value));
    run_graph(&traced.graph, values)
        .unwrap_or_else(|e| panic!("{e}\n{}", traced.graph))
        .into_iter()
        .map(|v| v.into_tensor().unwrap())
        .collect()
}

fn watch(tape: &TapeRef<Val>, vals: &[Val]) {
    let mut t = tape.lock().unwrap();
    for v in vals.iter().filter(|v| v.ty().dtype.is_float()) {
        t.watch(v).unwrap();
    }
}

/// Traces `body(ctx, params)` with `order` nested tapes watching the params; returns the
/// function computing `(value, d value / d params...)` (first order) or the second-order
/// gradient of sum(first-order gradient w.r.t. param 0) w.r.t. every param.
fn trace_gradient(
    params: Vec<ValueType>,
    order: usize,
    body: impl Fn(&mut dyn Context<Val>, &[Val]) -> Val,
) -> Traced {
    let (tracer, xs) = Tracer::new("f", params);
    let registry = graph_registry();
    let mut base = TraceContext::new(Some(tracer.clone()));
    let outer: TapeRef<Val> = Tape::new_ref(false);
    let inner: TapeRef<Val> = Tape::new_ref(false);
    watch(&outer, &xs);
    watch(&inner, &xs);
    let both = [outer.clone(), inner.clone()];
    let y = body(
        &mut TapeContext {
            inner: &mut base,
            tapes: &both,
            registry: &registry,
        },
        &xs,
    );
    let only_outer = [outer.clone()];
    let mut ctx = TapeContext {
        inner: &mut base,
        tapes: &only_outer,
        registry: &registry,
    };
    let xs: Vec<Val> = xs.into_iter().filter(|v| v.ty().dtype.is_float()).collect();
    let grads = compute_gradient(&inner, &mut ctx, std::slice::from_ref(&y), &xs, None).unwrap();
    let mut results = vec![y];
    if order == 1 {
        results.extend(grads.into_iter().map(|g| g.expect("a gradient")));
    } else {
        let g0 = grads[0].clone().expect("a gradient");
        let s = build::sum(&mut ctx, &g0, &[], false).unwrap();
        let gg = compute_gradient(&outer, &mut base, &[s], &xs, None).unwrap();
        results.extend(gg.into_iter().map(|g| g.expect("a second-order gradient")));
    }
    let traced = lock(&tracer).finish(&results).unwrap();
    traced
}

/// Central difference of output 0 of `traced` w.r.t. element `j` of argument `i`.
fn finite_difference(traced: &Traced, args: &[Tensor], i: usize, j: usize, out: usize) -> f64 {
    let h = 1e-6;
    let shifted = |delta: f64| {
        let mut a = args.to_vec();
        let mut v = a[i].to_f64_vec();
        v[j] += delta;
        a[i] = Tensor::from_vec(v, a[i].shape()).unwrap();
        call(traced, &a)[out].to_f64_vec().iter().sum::<f64>()
    };
    (shifted(h) - shifted(-h)) / (2.0 * h)
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
        "{what}: got {got}, want {want}"
    );
}

/// Checks every gradient output of a first-order trace (one per float argument) against
/// finite differences.
fn check_first_order(traced: &Traced, args: &[Tensor]) {
    let out = call(traced, args);
    let floats = args
        .iter()
        .enumerate()
        .filter(|(_, a)| a.dtype().is_float());
    for (k, (i, _)) in floats.enumerate() {
        let g = out[1 + k].to_f64_vec();
        for (j, gj) in g.iter().enumerate() {
            let fd = finite_difference(traced, args, i, j, 0);
            assert_close(*gj, fd, &format!("d out / d arg{i}[{j}]"));
        }
    }
}

#[test]
fn straight_line_code_traces_runs_and_differentiates() {
    let traced = trace_gradient(vec![f64_ty(&[3])], 1, |ctx, xs| {
        let s = build::sin(ctx, &xs[0]).unwrap();
        let p = build::mul(ctx, &s, &xs[0]).unwrap();
        build::sum(ctx, &p, &[0], false).unwrap()
    });
    check_first_order(&traced, &[f64s(&[0.3, -1.2, 2.5])]);
}

#[test]
fn concrete_tensors_are_captured_and_scalars_become_constants() {
    let w = f64s(&[1.0, 2.0, 3.0]);
    let (tracer, xs) = Tracer::new("f", vec![f64_ty(&[3])]);
    let mut ctx = TraceContext::new(Some(tracer.clone()));
    let y = build::mul(&mut ctx, &xs[0], &Val::Tensor(w.clone())).unwrap();
    let y = build::add(&mut ctx, &y, &Val::Tensor(scalar(0.5))).unwrap();
    // Concrete-only work runs eagerly even while tracing.
    let z = build::mul(&mut ctx, &Val::Tensor(w.clone()), &Val::Tensor(scalar(2.0))).unwrap();
    assert!(z.is_concrete());
    let traced = lock(&tracer).finish(&[y]).unwrap();
    assert_eq!(traced.num_params, 1);
    assert_eq!(traced.captured_inputs.len(), 1);
    let got = call(&traced, &[f64s(&[1.0, 1.0, 1.0])]);
    assert_eq!(got[0].to_f64_vec(), vec![1.5, 2.5, 3.5]);
}

/// cond(p, x * x * c, sin(x) + c) with x, c captured by both branches in different orders.
fn traced_cond(ctx: &mut dyn Context<Val>, p: &Val, x: &Val, c: &Val) -> Val {
    let tracer = ctx.tracer().unwrap();
    lock(&tracer).push_function("then", vec![]);
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let a = build::mul(&mut inner, x, x).unwrap();
    let a = build::mul(&mut inner, &a, c).unwrap();
    let a = build::sum(&mut inner, &a, &[], false).unwrap();
    let then_b = Branch::from(lock(&tracer).pop_function(&[a]).unwrap());
    lock(&tracer).push_function("else", vec![]);
    let b = build::sin(&mut inner, x).unwrap();
    let b = build::add(&mut inner, c, &b).unwrap();
    let b = build::sum(&mut inner, &b, &[], false).unwrap();
    let else_b = Branch::from(lock(&tracer).pop_function(&[b]).unwrap());
    emit_if(ctx, p, &then_b, &else_b).unwrap().remove(0)
}

#[test]
fn gradients_flow_through_if_both_ways_and_to_second_order() {
    let params = vec![
        ValueType::tensor(DType::Bool, &[]),
        f64_ty(&[2]),
        f64_ty(&[2]),
    ];
    for order in [1, 2] {
        let traced = trace_gradient(params.clone(), order, |ctx, xs| {
            traced_cond(ctx, &xs[0], &xs[1], &xs[2])
        });
        for p in [true, false] {
            let args = [Tensor::scalar(p), f64s(&[0.7, -1.3]), f64s(&[0.4, 2.0])];
            if order == 1 {
                check_first_order(&traced, &args);
            } else {
                // d/dx_j sum(grad_x f) = sum_k d2f/dx_k dx_j: differentiate the first-order
                // gradient numerically.
                let first = trace_gradient(params.clone(), 1, |ctx, xs| {
                    traced_cond(ctx, &xs[0], &xs[1], &xs[2])
                });
                let got = call(&traced, &args);
                for (i, g) in got.iter().enumerate().skip(1) {
                    for j in 0..2 {
                        let fd = finite_difference(&first, &args, i, j, 1);
                        assert_close(g.to_f64_vec()[j], fd, "second order");
                    }
                }
            }
        }
        // The old forward If was superseded: one forward If remains per gradient order.
        let entry = traced.graph.entry_function().unwrap();
        let ifs = entry
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::If(If { .. })))
            .count();
        assert_eq!(ifs, 2 * order, "{}", traced.graph);
    }
}

/// while i < n: x = sin(x) * c + x; i += 1  (n data-dependent), returning sum(x).
fn traced_loop(ctx: &mut dyn Context<Val>, x: &Val, c: &Val, n: &Val) -> Val {
    let tracer = ctx.tracer().unwrap();
    let i0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
    let types = vec![ValueType::tensor(DType::I64, &[]), x.value_type()];
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let vars = lock(&tracer).push_function("cond", types.clone());
    let more = build::less(&mut inner, &vars[0], n).unwrap();
    let cond = Branch::from(lock(&tracer).pop_function(&[more]).unwrap());
    let vars = lock(&tracer).push_function("body", types);
    let one = Val::Tensor(Tensor::scalar(1i64));
    let i = build::add(&mut inner, &vars[0], &one).unwrap();
    let s = build::sin(&mut inner, &vars[1]).unwrap();
    let s = build::mul(&mut inner, &s, c).unwrap();
    let next = build::add(&mut inner, &s, &vars[1]).unwrap();
    let body = Branch::from(lock(&tracer).pop_function(&[i, next]).unwrap());
    let functions = LoopFunctions {
        cond,
        body,
        maximum_iterations: None,
        parallel_iterations: 10,
        checkpoints: None,
    };
    let out = emit_while(ctx, &functions, &[i0, x.clone()]).unwrap();
    build::sum(ctx, &out[1], &[], false).unwrap()
}

#[test]
fn gradients_flow_through_a_data_dependent_while() {
    let params = vec![
        f64_ty(&[2]),
        f64_ty(&[2]),
        ValueType::tensor(DType::I64, &[]),
    ];
    let traced = trace_gradient(params, 1, |ctx, xs| {
        traced_loop(ctx, &xs[0], &xs[1], &xs[2])
    });
    for n in [0i64, 1, 5] {
        let args = [f64s(&[0.3, -0.8]), f64s(&[0.5, 0.2]), Tensor::scalar(n)];
        check_first_order(&traced, &args);
    }
    // The forward loop pushes only what the gradient needs: sin's rule needs x, mul's needs
    // sin(x) and c; c is loop invariant (a loop variable, not stacked), the counter is not
    // needed at all.
    let pushes = traced
        .graph
        .library
        .iter()
        .flat_map(|f| &f.nodes)
        .filter(|n| matches!(n.kind, NodeKind::Stack(StackOp::Push)))
        .count();
    assert_eq!(pushes, 2, "{}", traced.graph);
}

#[test]
fn second_derivatives_through_a_while() {
    let params = vec![
        f64_ty(&[2]),
        f64_ty(&[2]),
        ValueType::tensor(DType::I64, &[]),
    ];
    let second = trace_gradient(params.clone(), 2, |ctx, xs| {
        traced_loop(ctx, &xs[0], &xs[1], &xs[2])
    });
    let first = trace_gradient(params, 1, |ctx, xs| {
        traced_loop(ctx, &xs[0], &xs[1], &xs[2])
    });
    for n in [0i64, 3] {
        let args = [f64s(&[0.3, -0.8]), f64s(&[0.5, 0.2]), Tensor::scalar(n)];
        let got = call(&second, &args);
        for i in 0..2 {
            for j in 0..2 {
                let fd = finite_difference(&first, &args, i, j, 1);
                assert_close(
                    got[1 + i].to_f64_vec()[j],
                    fd,
                    &format!("n={n} d2/dx{i}[{j}]"),
                );
            }
        }
    }
}

type BranchFn<'a> = dyn Fn(&mut dyn Context<Val>) -> Val + 'a;

/// Emits `branches[index]()` as a `Case`.
fn switch(ctx: &mut dyn Context<Val>, index: &Val, branches: &[&BranchFn<'_>]) -> Val {
    let tracer = ctx.tracer().unwrap();
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let mut traced = Vec::new();
    for b in branches {
        lock(&tracer).push_function("branch", vec![]);
        let out = b(&mut inner);
        traced.push(Branch::from(lock(&tracer).pop_function(&[out]).unwrap()));
    }
    emit_case(ctx, index, &traced).unwrap().remove(0)
}

/// for i < n: j = 0; while j < i: x = tanh(x * c) + x; j += 1   (inner trip count = i)
fn nested_loops(ctx: &mut dyn Context<Val>, x: &Val, c: &Val, n: &Val) -> Val {
    let i0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
    let out = while_loop(
        ctx,
        &[i0, x.clone()],
        None,
        &|ctx, v| vec![build::less(ctx, &v[0], n).unwrap()],
        &|ctx, v| {
            let j0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
            let limit = v[0].clone();
            let inner = while_loop(
                ctx,
                &[j0, v[1].clone()],
                None,
                &|ctx, w| vec![build::less(ctx, &w[0], &limit).unwrap()],
                &|ctx, w| {
                    let t = build::mul(ctx, &w[1], c).unwrap();
                    let t = build::tanh(ctx, &t).unwrap();
                    let x = build::add(ctx, &t, &w[1]).unwrap();
                    vec![build::add(ctx, &w[0], &int(1)).unwrap(), x]
                },
            );
            vec![build::add(ctx, &v[0], &int(1)).unwrap(), inner[1].clone()]
        },
    );
    build::sum(ctx, &out[1], &[], false).unwrap()
}

#[test]
fn nested_loops_with_data_dependent_inner_trip_counts_to_second_order() {
    let params = vec![
        f64_ty(&[2]),
        f64_ty(&[2]),
        ValueType::tensor(DType::I64, &[]),
    ];
    let first = trace_gradient(params.clone(), 1, |ctx, xs| {
        nested_loops(ctx, &xs[0], &xs[1], &xs[2])
    });
    let second = trace_gradient(params, 2, |ctx, xs| {
        nested_loops(ctx, &xs[0], &xs[1], &xs[2])
    });
    for n in [0i64, 1, 4] {
        let args = [f64s(&[0.3, -0.2]), f64s(&[0.5, -0.4]), Tensor::scalar(n)];
        check_first_order(&first, &args);
        let got = call(&second, &args);
        for i in 0..2 {
            for j in 0..2 {
                let fd = finite_difference(&first, &args, i, j, 1);
                assert_close(
                    got[1 + i].to_f64_vec()[j],
                    fd,
                    &format!("n={n} d2/dx{i}[{j}]"),
                );
            }
        }
    }
}

/// switch_case(k, [x * c, sin(x), exp(c) * x]) summed; an out-of-range k runs the last.
fn traced_switch(ctx: &mut dyn Context<Val>, k: &Val, x: &Val, c: &Val) -> Val {
    let y = switch(
        ctx,
        k,
        &[
            &|ctx| build::mul(ctx, x, c).unwrap(),
            &|ctx| build::sin(ctx, x).unwrap(),
            &|ctx| {
                let e = build::exp(ctx, c).unwrap();
                build::mul(ctx, &e, x).unwrap()
            },
        ],
    );
    build::sum(ctx, &y, &[], false).unwrap()
}

#[test]
fn gradients_flow_through_case_to_second_order() {
    let params = vec![
        ValueType::tensor(DType::I32, &[]),
        f64_ty(&[2]),
        f64_ty(&[2]),
    ];
    let first = trace_gradient(params.clone(), 1, |ctx, xs| {
        traced_switch(ctx, &xs[0], &xs[1], &xs[2])
    });
    let second = trace_gradient(params, 2, |ctx, xs| {
        traced_switch(ctx, &xs[0], &xs[1], &xs[2])
    });
    for k in [0i32, 1, 2, 7, -1] {
        let args = [Tensor::scalar(k), f64s(&[0.3, -0.2]), f64s(&[0.5, -0.4])];
        check_first_order(&first, &args);
        let got = call(&second, &args);
        for (i, g) in got.iter().enumerate().skip(1) {
            for j in 0..2 {
                let fd = finite_difference(&first, &args, i, j, 1);
                assert_close(g.to_f64_vec()[j], fd, &format!("k={k} d2/dx{i}[{j}]"));
            }
        }
    }
}

/// while i < n: x = cond(sum(x) > 0, x * c, sin(x) - c); i += 1
fn cond_in_loop(ctx: &mut dyn Context<Val>, x: &Val, c: &Val, n: &Val) -> Val {
    let i0 = build::fill(ctx, DType::I64, &[], 0.0).unwrap();
    let out = while_loop(
        ctx,
        &[i0, x.clone()],
        None,
        &|ctx, v| vec![build::less(ctx, &v[0], n).unwrap()],
        &|ctx, v| {
            let s = build::sum(ctx, &v[1], &[0], false).unwrap();
            let zero = Val::Tensor(Tensor::scalar(0.0f64));
            let p = build::greater(ctx, &s, &zero).unwrap();
            let x = v[1].clone();
            let k = build::cast(ctx, &p, DType::I32).unwrap();
            let y = switch(
                ctx,
                &k,
                &[
                    &|ctx| {
                        let s = build::sin(ctx, &x).unwrap();
                        build::sub(ctx, &s, c).unwrap()
                    },
                    &|ctx| build::mul(ctx, &x, c).unwrap(),
                ],
            );
            vec![build::add(ctx, &v[0], &int(1)).unwrap(), y]
        },
    );
    build::sum(ctx, &out[1], &[], false).unwrap()
}

#[test]
fn branches_inside_loops_differentiate_twice() {
    let params = vec![
        f64_ty(&[2]),
        f64_ty(&[2]),
        ValueType::tensor(DType::I64, &[]),
    ];
    let first = trace_gradient(params.clone(), 1, |ctx, xs| {
        cond_in_loop(ctx, &xs[0], &xs[1], &xs[2])
    });
    let second = trace_gradient(params, 2, |ctx, xs| {
        cond_in_loop(ctx, &xs[0], &xs[1], &xs[2])
    });
    for n in [0i64, 2, 5] {
        let args = [f64s(&[0.3, -0.9]), f64s(&[0.7, 1.1]), Tensor::scalar(n)];
        check_first_order(&first, &args);
        let got = call(&second, &args);
        for i in 0..2 {
            for j in 0..2 {
                let fd = finite_difference(&first, &args, i, j, 1);
                assert_close(
                    got[1 + i].to_f64_vec()[j],
                    fd,
                    &format!("n={n} d2/dx{i}[{j}]"),
                );
            }
        }
    }
}

#[test]
fn variables_in_branches_and_loops_change_only_when_they_run() {
    use crate::interpret::VariableRef;
    let counter = VariableRef::new(Tensor::scalar(0.0f64));
    let (tracer, xs) = Tracer::new(
        "f",
        vec![
            ValueType::tensor(DType::Bool, &[]),
            ValueType::tensor(DType::I64, &[]),
        ],
    );
    let mut ctx = TraceContext::new(Some(tracer.clone()));
    let resource = lock(&tracer).capture_variable(&counter);
    let bump = |ctx: &mut dyn Context<Val>, by: f64| {
        ctx.apply_node(
            &NodeKind::Variable(VariableOp::AssignAdd),
            &[resource.clone(), Val::Tensor(Tensor::scalar(by))],
        )
        .unwrap();
    };
    // cond(p, bump by 1, bump by 100); then `n` iterations each bumping by 10.
    lock(&tracer).push_function("then", vec![]);
    let mut inner = TraceContext::new(Some(tracer.clone()));
    bump(&mut inner, 1.0);
    let z = build::fill(&mut inner, DType::F64, &[], 0.0).unwrap();
    let then_b = Branch::from(lock(&tracer).pop_function(&[z]).unwrap());
    lock(&tracer).push_function("else", vec![]);
    bump(&mut inner, 100.0);
    let z = build::fill(&mut inner, DType::F64, &[], 0.0).unwrap();
    let else_b = Branch::from(lock(&tracer).pop_function(&[z]).unwrap());
    emit_if(&mut ctx, &xs[0], &then_b, &else_b).unwrap();
    let n = xs[1].clone();
    let i0 = build::fill(&mut ctx, DType::I64, &[], 0.0).unwrap();
    while_loop(
        &mut ctx,
        &[i0],
        None,
        &|ctx, v| vec![build::less(ctx, &v[0], &n).unwrap()],
        &|ctx, v| {
            bump(ctx, 10.0);
            vec![build::add(ctx, &v[0], &int(1)).unwrap()]
        },
    );
    let read = ctx
        .apply_node(
            &NodeKind::Variable(VariableOp::Read),
            std::slice::from_ref(&resource),
        )
        .unwrap()
        .remove(0);
    let traced = lock(&tracer).finish(&[read]).unwrap();
    // Every write is reachable from the entry's control outputs (nothing may prune it).
    assert_eq!(
        traced.graph.entry_function().unwrap().control_outputs.len(),
        2
    );
    for (p, n, want) in [(true, 0i64, 1.0), (false, 3, 130.0), (true, 2, 21.0)] {
        let before = counter.read().to_f64_vec()[0];
        let got = call(&traced, &[Tensor::scalar(p), Tensor::scalar(n)]);
        assert_eq!(got[0].to_f64_vec()[0], before + want, "p={p} n={n}");
    }
}

#[test]
fn values_of_finished_functions_cannot_escape() {
    let (tracer, xs) = Tracer::new("f", vec![f64_ty(&[2])]);
    let mut ctx = TraceContext::new(Some(tracer.clone()));
    lock(&tracer).push_function("branch", vec![]);
    let inside = build::sin(&mut ctx, &xs[0]).unwrap();
    lock(&tracer)
        .pop_function(std::slice::from_ref(&inside))
        .unwrap();
    let err = build::cos(&mut ctx, &inside).unwrap_err();
    assert_eq!(err.kind, crate::ErrorKind::ControlFlow);
    assert!(err.message.contains("cannot be used outside"), "{err}");
}
