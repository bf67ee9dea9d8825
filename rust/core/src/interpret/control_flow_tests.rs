//! Interpreter tests: op chains against eager execution, If/Case/While/Call against plain Rust.

use crate::graph::{Call, Case};
use std::time::Instant;

use super::{run, run_graph, Interpreter, RtValue, StackValue, VariableRef};
use crate::dtype::DType;
use crate::graph::{Library, NodeKind, ValueType};
use crate::ops::EagerContext;
use crate::ops::{binary, build, unary};
use crate::shape::DYN;
use crate::tensor::Tensor;
use crate::testing::graphs as examples;
use crate::testing::interpret::{
    f64_of, f64s, if_kind, library, s, scalar_ty, ty, v, while_kind, B,
};

#[test]
fn an_interpreter_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Interpreter<'static>>();
    shareable::<RtValue>();
}

#[test]
fn elementwise_chain_matches_eager() {
    // f(x, y) = exp(sin(x) * y) + x - y * y; x is read three times, y twice.
    let vec3 = ty(DType::F32, &[3]);
    let mut f = B::new("f", vec![vec3.clone(), vec3]);
    let (x, y) = (f.args[0], f.args[1]);
    let sx = f.op(unary::Sin, &[x]);
    let m = f.op(binary::Mul, &[sx, y]);
    let e = f.op(unary::Exp, &[m]);
    let a = f.op(binary::Add, &[e, x]);
    let yy = f.op(binary::Mul, &[y, y]);
    let r = f.op(binary::Sub, &[a, yy]);
    let lib = library(vec![f.finish(&[r, x])]);

    let xs = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]).unwrap();
    let ys = Tensor::from_vec(vec![1.5f32, 0.25, -3.0], &[3]).unwrap();
    let out = run(&lib, "f", vec![xs.clone().into(), ys.clone().into()]).unwrap();

    let ctx = &mut EagerContext;
    let sx = build::sin(ctx, &xs).unwrap();
    let m = build::mul(ctx, &sx, &ys).unwrap();
    let e = build::exp(ctx, &m).unwrap();
    let a = build::add(ctx, &e, &xs).unwrap();
    let yy = build::mul(ctx, &ys, &ys).unwrap();
    let want = build::sub(ctx, &a, &yy).unwrap();
    assert_eq!(f64s(&out[0]), want.to_f64_vec());
    assert_eq!(f64s(&out[1]), xs.to_f64_vec(), "a parameter returned as is");
}

/// `@twice(x) = x * 2`, `@negate(x) = -x`, `@plus_one(x) = x + 1` over f32 scalars.
fn branch_functions() -> Vec<crate::graph::Function> {
    let mut fns = Vec::new();
    for (name, which) in [("twice", 0), ("negate", 1), ("plus_one", 2)] {
        let mut b = B::new(name, vec![scalar_ty(DType::F32)]);
        let x = b.args[0];
        let r = match which {
            0 => {
                let two = b.konst(2.0f32);
                b.op(binary::Mul, &[x, two])
            }
            1 => b.op(unary::Neg, &[x]),
            _ => {
                let one = b.konst(1.0f32);
                b.op(binary::Add, &[x, one])
            }
        };
        fns.push(b.finish(&[r]));
    }
    fns
}

#[test]
fn if_runs_the_branch_the_predicate_picks() {
    let mut lib = library(branch_functions());
    let mut main = B::new("main", vec![scalar_ty(DType::Bool), scalar_ty(DType::F32)]);
    let (p, x) = (main.args[0], main.args[1]);
    let r = main.call(if_kind("twice", "negate"), &[p, x], &lib);
    lib.add(main.finish(&r)).unwrap();
    for (pred, x, want) in [(true, 3.0f32, 6.0), (false, 3.0, -3.0)] {
        let out = run(&lib, "main", vec![s(pred), s(x)]).unwrap();
        assert_eq!(f64_of(&out[0]), want, "pred = {pred}");
    }
}

#[test]
fn case_out_of_range_and_negative_index_run_the_last_branch() {
    let mut lib = library(branch_functions());
    let mut main = B::new("main", vec![scalar_ty(DType::I32), scalar_ty(DType::F32)]);
    let branches = vec!["twice".into(), "negate".into(), "plus_one".into()];
    let r = main.call(
        NodeKind::Case(Case { branches }),
        &[main.args[0], main.args[1]],
        &lib,
    );
    lib.add(main.finish(&r)).unwrap();
    let interp = Interpreter::new(&lib);
    for (index, want) in [
        (0, 10.0),
        (1, -5.0),
        (2, 6.0),
        (3, 6.0),
        (99, 6.0),
        (-1, 6.0),
    ] {
        let out = interp.run("main", vec![s(index), s(5.0f32)]).unwrap();
        assert_eq!(f64_of(&out[0]), want, "index {index}");
    }
    let out = interp.run("main", vec![s(i32::MIN), s(5.0f32)]).unwrap();
    assert_eq!(f64_of(&out[0]), 6.0);
}

/// `@halve_cond(x, n) = x >= 1`, `@halve_body(x, n) = (x * 0.5, n + 1)` and
/// `@main(x, n) = while(x, n)` with `maximum_iterations`.
fn halving_library(maximum_iterations: Option<i64>) -> Library {
    let params = vec![scalar_ty(DType::F32), scalar_ty(DType::I32)];
    let mut cond = B::new("halve_cond", params.clone());
    let one = cond.konst(1.0f32);
    let c = cond.op(binary::GreaterEqual, &[cond.args[0], one]);
    let mut body = B::new("halve_body", params.clone());
    let (half, one) = (body.konst(0.5f32), body.konst(1i32));
    let x = body.op(binary::Mul, &[body.args[0], half]);
    let n = body.op(binary::Add, &[body.args[1], one]);
    let mut lib = library(vec![cond.finish(&[c]), body.finish(&[x, n])]);
    let mut main = B::new("main", params);
    let kind = while_kind("halve_cond", "halve_body", maximum_iterations);
    let r = main.call(kind, &[main.args[0], main.args[1]], &lib);
    lib.add(main.finish(&r)).unwrap();
    lib
}

#[test]
fn while_with_a_data_dependent_trip_count_matches_plain_rust() {
    let lib = halving_library(None);
    let interp = Interpreter::new(&lib);
    for x0 in [0.5f32, 1.0, 3.0, 1000.0, 1e30] {
        // Reference: while x >= 1: x, n = x * 0.5, n + 1
        let (mut x, mut n) = (x0, 0i32);
        while x >= 1.0 {
            (x, n) = (x * 0.5, n + 1);
        }
        let out = interp.run("main", vec![s(x0), s(0i32)]).unwrap();
        assert_eq!(
            (f64_of(&out[0]), f64_of(&out[1])),
            (f64::from(x), f64::from(n)),
            "x0 = {x0}"
        );
    }
}

#[test]
fn maximum_iterations_stops_the_loop_even_when_cond_holds() {
    for (max, want_n) in [
        (Some(0), 0.0),
        (Some(3), 3.0),
        (Some(50), 10.0),
        (None, 10.0),
    ] {
        let lib = halving_library(max);
        let out = run(&lib, "main", vec![s(1000.0f32), s(0i32)]).unwrap();
        assert_eq!(f64_of(&out[1]), want_n, "maximum_iterations = {max:?}");
    }
}

#[test]
fn if_inside_while_inside_if_recurses_normally() {
    // main(p, x) = p ? loop(x) : x, where loop runs 5 times: x = x > 10 ? x - 10 : x * 3.
    let i32s = scalar_ty(DType::I32);
    let mut minus = B::new("minus10", vec![i32s.clone()]);
    let ten = minus.konst(10i32);
    let m = minus.op(binary::Sub, &[minus.args[0], ten]);
    let mut triple = B::new("triple", vec![i32s.clone()]);
    let three = triple.konst(3i32);
    let t = triple.op(binary::Mul, &[triple.args[0], three]);
    let ident = B::new("ident", vec![i32s.clone()]);
    let id_args = ident.args.clone();
    let mut lib = library(vec![
        minus.finish(&[m]),
        triple.finish(&[t]),
        ident.finish(&id_args),
    ]);

    let pair = vec![i32s.clone(), i32s.clone()];
    let mut cond = B::new("cond", pair.clone());
    let five = cond.konst(5i32);
    let c = cond.op(binary::Less, &[cond.args[1], five]);
    let mut body = B::new("body", pair);
    let (ten, one) = (body.konst(10i32), body.konst(1i32));
    let big = body.op(binary::Greater, &[body.args[0], ten]);
    let x = body.call(if_kind("minus10", "triple"), &[big, body.args[0]], &lib);
    let k = body.op(binary::Add, &[body.args[1], one]);
    lib.add(cond.finish(&[c])).unwrap();
    lib.add(body.finish(&[x[0], k])).unwrap();
    let mut looper = B::new("loop", vec![i32s.clone()]);
    let zero = looper.konst(0i32);
    let r = looper.call(
        while_kind("cond", "body", None),
        &[looper.args[0], zero],
        &lib,
    );
    lib.add(looper.finish(&r[..1])).unwrap();
    let mut main = B::new("main", vec![scalar_ty(DType::Bool), i32s]);
    let r = main.call(
        if_kind("loop", "ident"),
        &[main.args[0], main.args[1]],
        &lib,
    );
    lib.add(main.finish(&r)).unwrap();

    let reference = |mut x: i32| {
        for _ in 0..5 {
            x = if x > 10 { x - 10 } else { x * 3 };
        }
        x
    };
    for x in [1, 7, 25, 100] {
        let out = run(&lib, "main", vec![s(true), s(x)]).unwrap();
        assert_eq!(f64_of(&out[0]), f64::from(reference(x)), "x = {x}");
        let out = run(&lib, "main", vec![s(false), s(x)]).unwrap();
        assert_eq!(f64_of(&out[0]), f64::from(x));
    }
}

#[test]
fn call_node_calls_its_function_and_vectors_flow_through() {
    let vec2 = ty(DType::F64, &[2]);
    let mut sq = B::new("square", vec![vec2.clone()]);
    let r = sq.op(binary::Mul, &[sq.args[0], sq.args[0]]);
    let mut lib = library(vec![sq.finish(&[r])]);
    let mut main = B::new("main", vec![vec2]);
    let kind = NodeKind::Call(Call {
        function: "square".into(),
        ..Default::default()
    });
    let once = main.call(kind.clone(), &[main.args[0]], &lib);
    let twice = main.call(kind, &once, &lib);
    lib.add(main.finish(&twice)).unwrap();
    let out = run(&lib, "main", vec![v(&[2.0f64, -3.0])]).unwrap();
    assert_eq!(f64s(&out[0]), [16.0, 81.0]);
}

/// `@count(i, n) = while i < n: i += 1`, over i64 scalars.
fn counting_library() -> Library {
    let pair = vec![scalar_ty(DType::I64), scalar_ty(DType::I64)];
    let mut cond = B::new("count_cond", pair.clone());
    let c = cond.op(binary::Less, &[cond.args[0], cond.args[1]]);
    let mut body = B::new("count_body", pair.clone());
    let one = body.konst(1i64);
    let i = body.op(binary::Add, &[body.args[0], one]);
    let n = body.args[1];
    let mut lib = library(vec![cond.finish(&[c]), body.finish(&[i, n])]);
    let mut main = B::new("count", pair);
    let r = main.call(
        while_kind("count_cond", "count_body", None),
        &main.args.clone(),
        &lib,
    );
    lib.add(main.finish(&r[..1])).unwrap();
    lib
}

#[test]
fn a_long_loop_runs_in_constant_stack_depth() {
    // A 256 KiB stack would overflow long before 10^5 nested frames: the loop must be flat.
    let handle = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let lib = counting_library();
            run(&lib, "count", vec![s(0i64), s(100_000i64)]).map(|out| f64_of(&out[0]))
        })
        .unwrap();
    assert_eq!(handle.join().unwrap().unwrap(), 100_000.0);
}

#[test]
fn interpret_timing_of_a_tiny_while_loop() {
    // Not an assertion: prints the cost of one iteration (cond: a comparison; body: an
    // increment) so `cargo test --release -p gradloop interpret -- --nocapture` shows it.
    let lib = counting_library();
    let interp = Interpreter::new(&lib);
    let n = if cfg!(debug_assertions) {
        20_000i64
    } else {
        1_000_000
    };
    let args = || vec![s(0i64), s(n)];
    interp.run("count", args()).unwrap(); // warm: plans built, allocator primed
    let start = Instant::now();
    let out = interp.run("count", args()).unwrap();
    let per_iter = start.elapsed().as_secs_f64() / n as f64;
    assert_eq!(f64_of(&out[0]), n as f64);
    let mode = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "interpreter while loop ({mode}): {:.0} ns per iteration over {n}",
        per_iter * 1e9
    );
}

#[test]
fn every_example_graph_of_the_ir_runs() {
    // Arguments of ones (unknown dimensions as 2): every example loop terminates on them.
    let arg = |param: &ValueType| -> RtValue {
        let shape: Vec<usize> = param
            .inner()
            .shape
            .iter()
            .map(|&d| if d == DYN { 2 } else { d })
            .collect();
        let ones = Tensor::ones(param.inner().dtype, &shape);
        match param {
            ValueType::Tensor(_) => ones.into(),
            ValueType::Resource(_) => VariableRef::new(ones).into(),
            ValueType::Stack(t) => StackValue::new(t.clone()).into(),
        }
    };
    for (name, graph) in examples::all() {
        let entry = graph.entry_function().unwrap();
        let args = entry.params.iter().map(arg).collect();
        let out = run_graph(&graph, args).unwrap_or_else(|e| panic!("{name}: {e}"));
        let types = entry.result_types().unwrap();
        assert_eq!(out.len(), types.len(), "{name}");
        for (value, ty) in out.iter().zip(&types) {
            assert_eq!(
                value.mismatch(ty),
                None,
                "{name}: {:?} for {ty}",
                value.value_type()
            );
        }
    }
}
