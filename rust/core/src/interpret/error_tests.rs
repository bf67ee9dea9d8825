//! Interpreter tests for errors: they keep their kind and name the node, function and source
//! line at every level; arguments and callee results are checked; bad graphs are typed errors.

use super::{run, Interpreter, RtValue, VariableRef, MAX_CALL_DEPTH};
use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::graph::{Call, Case};
use crate::graph::{Function, Library, Location, Node, NodeKind, Port, ValueType};
use crate::ops::{binary, layout};
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::testing::interpret::{if_kind, library, s, scalar_ty, ty, v, while_kind, B};

fn any_f32() -> ValueType {
    ty(DType::F32, &[DYN])
}

/// `@main(x: f32[?], y: f32[?], i: i32)` loops `x = x + y` (model.py:12) while `i < 3`, in a
/// `while` at model.py:10: shapes only meet at run time.
fn adding_loop() -> Library {
    let trio = vec![any_f32(), any_f32(), scalar_ty(DType::I32)];
    let mut cond = B::new("f_cond", trio.clone());
    let three = cond.konst(3i32);
    let c = cond.op(binary::Less, &[cond.args[2], three]);
    let mut body = B::new("f_body", trio.clone());
    let one = body.konst(1i32);
    let x = body.op(binary::Add, &[body.args[0], body.args[1]]);
    body.locate_last(12);
    let i = body.op(binary::Add, &[body.args[2], one]);
    let y = body.args[1];
    let mut lib = library(vec![cond.finish(&[c]), body.finish(&[x, y, i])]);
    let mut main = B::new("main", trio);
    let args = main.args.clone();
    let out = main.call(while_kind("f_cond", "f_body", None), &args, &lib);
    main.locate_last(10);
    lib.add(main.finish(&out[..1])).unwrap();
    lib
}

#[test]
fn errors_keep_their_kind_and_name_node_function_and_location_at_every_level() {
    let lib = adding_loop();
    let out = run(
        &lib,
        "main",
        vec![v(&[1.0f32, 2.0]), v(&[0.5f32, 0.5]), s(0i32)],
    )
    .unwrap();
    assert_eq!(crate::testing::interpret::f64s(&out[0]), [2.5, 3.5]);

    let err = run(
        &lib,
        "main",
        vec![v(&[1.0f32, 2.0]), v(&[1.0f32; 3]), s(0i32)],
    )
    .unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::Shape,
        "a shape error stays a shape error"
    );
    assert_eq!(err.op, "add");
    let lines: Vec<&str> = err.message.lines().collect();
    assert!(
        lines[0].contains("[2]") && lines[0].contains("[3]"),
        "{err}"
    );
    assert_eq!(
        &lines[1..],
        [
            "  at %4 = add(%0, %1) in @f_body (model.py:12)",
            "  in iteration 0",
            "  at %3 = while(%0, %1, %2) in @main (model.py:10)",
        ],
        "{err}"
    );
}

#[test]
fn argument_count_kind_dtype_and_shape_are_checked() {
    let lib = adding_loop();
    let interp = Interpreter::new(&lib);
    let err = interp.run("main", vec![v(&[1.0f32])]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        err.to_string().contains("@main takes 3 argument(s), got 1"),
        "{err}"
    );

    let cases: [(Vec<RtValue>, ErrorKind, &str); 3] = [
        (
            vec![v(&[1.0f32]), v(&[1.0f64]), s(0i32)],
            ErrorKind::DType,
            "@main: argument 1 is a f64[1], but parameter 1 is a f32[?]",
        ),
        (
            vec![v(&[1.0f32]), v(&[1.0f32]), v(&[0i32])],
            ErrorKind::Shape,
            "@main: argument 2 is a i32[1], but parameter 2 is a i32[]",
        ),
        (
            vec![
                VariableRef::new(Tensor::scalar(1.0f32)).into(),
                v(&[1.0f32]),
                s(0i32),
            ],
            ErrorKind::InvalidArgument,
            "@main: argument 0 is a resource<f32[]>, but parameter 0 is a f32[?]",
        ),
    ];
    for (args, kind, text) in cases {
        let err = interp.run("main", args).unwrap_err();
        assert_eq!(err.kind, kind, "{err}");
        assert!(err.to_string().contains(text), "{err}");
    }
    let err = interp.run("nope", vec![]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Graph);
    assert!(
        err.message.contains("@nope") && err.message.contains("@main"),
        "{err}"
    );
}

#[test]
fn predicates_and_indices_must_be_scalars_of_their_dtype() {
    let f32s = scalar_ty(DType::F32);
    let twice = B::new("same", vec![f32s.clone()]);
    let args = twice.args.clone();
    let mut lib = library(vec![twice.finish(&args)]);
    // The builder does not check the predicate's type (the verifier does): run-time checks.
    let mut main = B::new(
        "main",
        vec![ty(DType::Bool, &[2]), scalar_ty(DType::I64), f32s],
    );
    main.call(if_kind("same", "same"), &[main.args[0], main.args[2]], &lib);
    let case = NodeKind::Case(Case {
        branches: vec!["same".into()],
    });
    let r = main.call(case, &[main.args[1], main.args[2]], &lib);
    lib.add(main.finish(&r)).unwrap();
    let interp = Interpreter::new(&lib);
    let err = interp
        .run("main", vec![v(&[true, false]), s(0i64), s(1.0f32)])
        .unwrap_err();
    assert_eq!((err.kind, err.op.as_ref()), (ErrorKind::Shape, "if"));
    assert!(
        err.message
            .contains("the predicate must be a scalar, got bool[2]"),
        "{err}"
    );
    assert!(err.message.contains("at %3 = if(%0, %2) in @main"), "{err}");

    let mut lib2 = lib.clone();
    let mut main = lib.get("main").unwrap().clone();
    main.params[0] = scalar_ty(DType::Bool);
    main.nodes[0].outputs[0] = scalar_ty(DType::Bool);
    lib2.replace(main).unwrap();
    let err = run(&lib2, "main", vec![s(true), s(0i64), s(1.0f32)]).unwrap_err();
    assert_eq!((err.kind, err.op.as_ref()), (ErrorKind::DType, "case"));
    assert!(
        err.message
            .contains("the branch index must be a int32 scalar, got int64"),
        "{err}"
    );
}

#[test]
fn callee_results_that_do_not_fit_the_node_are_control_flow_errors() {
    // @grow(x: f32[2]) returns concat(x, x): f32[4], though a loop body must keep its types.
    let vec2 = ty(DType::F32, &[2]);
    let mut grow = B::new("grow", vec![vec2.clone()]);
    let g = grow.op(
        layout::Concatenate { axis: 0 },
        &[grow.args[0], grow.args[0]],
    );
    let mut yes = B::new("yes", vec![vec2.clone()]);
    let t = yes.konst(true);
    let mut lib = library(vec![grow.finish(&[g]), yes.finish(&[t])]);
    let mut main = B::new("main", vec![vec2]);
    let out = main.call(while_kind("yes", "grow", Some(5)), &[main.args[0]], &lib);
    lib.add(main.finish(&out)).unwrap();
    let err = run(&lib, "main", vec![v(&[1.0f32, 2.0])]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::ControlFlow);
    let msg = err.to_string();
    assert!(
        msg.contains("@grow returned a f32[4] as result 0; the node declares f32[2]"),
        "{msg}"
    );
    assert!(
        msg.contains("in iteration 0\n  at %1 = while(%0) in @main"),
        "{msg}"
    );

    // An `If` declaring f32[2] whose branch passes an f32[?] through, given 3 elements.
    let same = B::new("same", vec![any_f32()]);
    let args = same.args.clone();
    let mut lib = library(vec![same.finish(&args)]);
    let mut main = B::new("main", vec![scalar_ty(DType::Bool), any_f32()]);
    let r = main.node(
        if_kind("same", "same"),
        &[main.args[0], main.args[1]],
        vec![ty(DType::F32, &[2])],
    );
    lib.add(main.finish(&r)).unwrap();
    run(&lib, "main", vec![s(true), v(&[1.0f32, 2.0])]).unwrap();
    let err = run(&lib, "main", vec![s(false), v(&[1.0f32; 3])]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::ControlFlow, "{err}");
}

#[test]
fn negative_maximum_iterations_is_an_error() {
    let vec2 = ty(DType::F32, &[2]);
    let mut yes = B::new("yes", vec![vec2.clone()]);
    let t = yes.konst(true);
    let same = B::new("same", vec![vec2.clone()]);
    let args = same.args.clone();
    let mut lib = library(vec![yes.finish(&[t]), same.finish(&args)]);
    let mut main = B::new("main", vec![vec2]);
    let out = main.call(while_kind("yes", "same", Some(-1)), &[main.args[0]], &lib);
    lib.add(main.finish(&out)).unwrap();
    let err = run(&lib, "main", vec![v(&[1.0f32, 2.0])]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        err.message
            .contains("maximum_iterations must be at least 0, got -1"),
        "{err}"
    );
}

/// `@name(x: f32[]) = call @callee(x)`, written by hand (the builder needs the callee first).
fn calling(name: &str, callee: &str) -> Function {
    let f32s = scalar_ty(DType::F32);
    let call = NodeKind::Call(Call {
        function: callee.into(),
        ..Default::default()
    });
    let mut node = Node::new(call, vec![Port::new(0, 0)], vec![f32s.clone()]);
    node.location = Some(Location::new("rec.py", 3));
    Function {
        name: name.into(),
        params: vec![f32s.clone()],
        nodes: vec![Node::new(NodeKind::Arg(0), vec![], vec![f32s]), node],
        results: vec![Port::new(1, 0)],
        control_outputs: vec![],
    }
}

#[test]
fn runaway_recursion_and_missing_callees_are_errors_not_crashes() {
    let lib = library(vec![calling("forever", "forever")]);
    let err = run(&lib, "forever", vec![s(1.0f32)]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::ControlFlow);
    assert!(
        err.message
            .contains(&format!("more than {MAX_CALL_DEPTH} deep")),
        "{err}"
    );
    assert!(
        err.message
            .contains("at %1 = call(%0) in @forever (rec.py:3)"),
        "{err}"
    );

    let lib = library(vec![calling("main", "missing")]);
    let err = run(&lib, "main", vec![s(1.0f32)]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Graph);
    assert!(err.message.contains("no function @missing"), "{err}");
    let resource = ValueType::Resource(TensorType::scalar(DType::F32));
    assert!(RtValue::from(Tensor::scalar(1.0f32))
        .mismatch(&resource)
        .is_some());
}
