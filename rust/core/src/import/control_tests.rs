//! Importer tests: control flow (`stablehlo.while` with captures, `scf.while` whose condition
//! region passes on computed values, `scf.index_switch`, inlined calls), gradients of imported
//! loops against central finite differences on the interpreter, and the errors.

use super::tests::{f64s, module, run};
use super::*;
use crate::error::ErrorKind;
use crate::graph::{verify, NodeKind};
use crate::interpret::{run_graph, RtValue};
use crate::tensor::Tensor;

/// `while x < 10: x = x * c + sin(x); n += 1`, returning `(x, n)`; the limit is a constant
/// defined outside the loop and `c` a value captured from outside.
const LOOP_BODY: &str = r#"    %c = "stablehlo.constant"() <{value = dense<1.000000e+01> : tensor<f64>}> : () -> tensor<f64>
    %0:2 = "stablehlo.while"(%arg0, %arg1) ({
    ^bb0(%x: tensor<f64>, %n: tensor<i64>):
      %p = "stablehlo.compare"(%x, %c) <{comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<f64>, tensor<f64>) -> tensor<i1>
      "stablehlo.return"(%p) : (tensor<i1>) -> ()
    }, {
    ^bb0(%x: tensor<f64>, %n: tensor<i64>):
      %m = "stablehlo.multiply"(%x, %arg2) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      %s = "stablehlo.sine"(%x) : (tensor<f64>) -> tensor<f64>
      %y = "stablehlo.add"(%m, %s) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      %one = "stablehlo.constant"() <{value = dense<1> : tensor<i64>}> : () -> tensor<i64>
      %n1 = "stablehlo.add"(%n, %one) : (tensor<i64>, tensor<i64>) -> tensor<i64>
      "stablehlo.return"(%y, %n1) : (tensor<f64>, tensor<i64>) -> ()
    }) : (tensor<f64>, tensor<i64>) -> (tensor<f64>, tensor<i64>) loc("-":3:8)"#;

const LOOP_PARAMS: [&str; 3] = ["tensor<f64>", "tensor<i64>", "tensor<f64>"];

fn grow(mut x: f64, c: f64) -> (f64, i64) {
    let mut n = 0;
    while x < 10.0 {
        x = x * c + x.sin();
        n += 1;
        assert!(n < 1000, "a fixed point below 10");
    }
    (x, n)
}

#[test]
fn while_loops_capture_outer_values_and_remake_constants() {
    let text = module(
        &LOOP_PARAMS,
        &["tensor<f64>", "tensor<i64>"],
        LOOP_BODY,
        &["%0#0", "%0#1"],
    );
    // c >= 1.3: smaller factors have fixed points below 10 (x * c + sin(x) = x).
    for (x, c) in [(1.0, 1.5), (0.3, 1.3), (12.0, 2.0)] {
        let args = [Tensor::scalar(x), Tensor::scalar(0i64), Tensor::scalar(c)];
        let out = run(&text, &args).unwrap();
        let (want_x, want_n) = grow(x, c);
        assert!((out[0].item_f64().unwrap() - want_x).abs() < 1e-12);
        assert_eq!(out[1].as_slice::<i64>().unwrap(), [want_n]);
    }
    let g = import_function(&parse_generic(&text).unwrap(), "main", "t").unwrap();
    let cond = g.library.iter().find(|f| f.name.contains("cond")).unwrap();
    // The limit is a constant of the condition, not a captured parameter (a loop variable).
    assert_eq!(cond.params.len(), 3, "{g}");
    assert!(
        cond.nodes
            .iter()
            .any(|n| matches!(n.kind, NodeKind::Const(_))),
        "{g}"
    );
}

/// Runs the entry of `g` on float64 scalars and an int64 zero at `int_at`.
fn call(g: &crate::graph::Graph, args: &[f64], int_at: usize) -> Vec<f64> {
    let values = args
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            RtValue::Tensor(if i == int_at {
                Tensor::scalar(v as i64)
            } else {
                Tensor::scalar(v)
            })
        })
        .collect();
    let out = run_graph(g, values).unwrap();
    out.into_iter()
        .flat_map(|v| v.into_tensor().unwrap().to_f64_vec())
        .collect()
}

#[test]
fn gradients_of_data_dependent_loops_match_finite_differences() {
    let text = module(&LOOP_PARAMS, &["tensor<f64>"], LOOP_BODY, &["%0#0"]);
    let g = import_function(&parse_generic(&text).unwrap(), "main", "t").unwrap();
    let grad = crate::trace::gradient_graph(&g, &[2, 0], "main_grad").unwrap();
    verify(&grad).unwrap();
    assert_eq!(grad.entry_function().unwrap().params.len(), 3);
    for (x, c) in [(1.0, 1.5), (0.6, 1.35), (2.5, 1.9)] {
        let got = call(&grad, &[x, 0.0, c], 1);
        let h = 1e-6;
        let f = |x: f64, c: f64| call(&g, &[x, 0.0, c], 1)[0];
        let dc = (f(x, c + h) - f(x, c - h)) / (2.0 * h);
        let dx = (f(x + h, c) - f(x - h, c)) / (2.0 * h);
        for (got, want, what) in [(got[0], dc, "d/dc"), (got[1], dx, "d/dx")] {
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{what} at {x}, {c}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn the_gradient_function_joins_the_module_with_cotangents_for_several_results() {
    let text = module(
        &LOOP_PARAMS,
        &["tensor<f64>", "tensor<i64>"],
        LOOP_BODY,
        &["%0#0", "%0#1"],
    );
    let out = gradient_module(
        &text,
        "main",
        &[0],
        "t.mlir",
        LoopGradients::default(),
        false,
    )
    .unwrap();
    let at = out.find("func.func @main_grad(%arg0: tensor<f64>, %arg1: tensor<i64>, %arg2: tensor<f64>, %arg3: tensor<f64>, %arg4: tensor<i64>) -> (tensor<f64>)");
    let at = at.unwrap_or_else(|| panic!("{out}"));
    assert!(out.starts_with(&text[..text.len() - 20]));
    assert!(at < out.rfind("}) : () -> ()").unwrap());
}

#[test]
fn scf_while_passing_computed_values_and_index_switch() {
    // v = x; loop { y = v * v; if !(y < 100) break y; v = y + 2 }
    let body = r#"    %r = "scf.while"(%arg0) ({
    ^bb0(%v: tensor<f64>):
      %y = "stablehlo.multiply"(%v, %v) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      %h = "stablehlo.constant"() <{value = dense<1.000000e+02> : tensor<f64>}> : () -> tensor<f64>
      %p = "stablehlo.compare"(%y, %h) <{comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<f64>, tensor<f64>) -> tensor<i1>
      %b = "tensor.extract"(%p) : (tensor<i1>) -> i1
      "scf.condition"(%b, %y) : (i1, tensor<f64>) -> ()
    }, {
    ^bb0(%y: tensor<f64>):
      %two = "stablehlo.constant"() <{value = dense<2.000000e+00> : tensor<f64>}> : () -> tensor<f64>
      %n = "stablehlo.add"(%y, %two) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      "scf.yield"(%n) : (tensor<f64>) -> ()
    }) : (tensor<f64>) -> tensor<f64>
    %s = "scf.index_switch"(%arg1) <{cases = array<i64: 5, 1>}> ({
      %d = "arith.constant"() <{value = 0.000000e+00 : f64}> : () -> f64
      "scf.yield"(%d) : (f64) -> ()
    }, {
      %a = "arith.constant"() <{value = 5.000000e+00 : f64}> : () -> f64
      "scf.yield"(%a) : (f64) -> ()
    }, {
      %a = "arith.constant"() <{value = 1.000000e+00 : f64}> : () -> f64
      "scf.yield"(%a) : (f64) -> ()
    }) : (index) -> f64"#;
    let text = module(
        &["tensor<f64>", "index"],
        &["tensor<f64>", "f64"],
        body,
        &["%r", "%s"],
    );
    let reference = |x: f64| {
        let mut v = x;
        loop {
            let y = v * v;
            if y >= 100.0 {
                return y;
            }
            v = y + 2.0;
        }
    };
    for (x, k, want_k) in [(1.5, 5, 5.0), (0.5, 1, 1.0), (20.0, 0, 0.0), (3.0, -3, 0.0)] {
        let out = run(&text, &[Tensor::scalar(x), Tensor::scalar(k as i64)]).unwrap();
        assert_eq!(out[0].item_f64().unwrap(), reference(x), "x = {x}");
        assert_eq!(out[1].item_f64().unwrap(), want_k, "k = {k}");
    }
}

/// A module whose `@main` calls `@twice` (SSA names that also exist in `@main`) on `%arg0`.
const CALLS: &str = r#""builtin.module"() ({
  "func.func"() <{function_type = (tensor<2xf64>) -> tensor<2xf64>, sym_name = "main"}> ({
  ^bb0(%arg0: tensor<2xf64>):
    %0 = "stablehlo.sine"(%arg0) : (tensor<2xf64>) -> tensor<2xf64>
    %1 = "func.call"(%0) <{callee = @twice}> : (tensor<2xf64>) -> tensor<2xf64>
    %2 = "stablehlo.add"(%1, %0) : (tensor<2xf64>, tensor<2xf64>) -> tensor<2xf64>
    "func.return"(%2) : (tensor<2xf64>) -> ()
  }) : () -> ()
  "func.func"() <{function_type = (tensor<2xf64>) -> tensor<2xf64>, sym_name = "twice", sym_visibility = "private"}> ({
  ^bb0(%arg0: tensor<2xf64>):
    %0 = "stablehlo.add"(%arg0, %arg0) : (tensor<2xf64>, tensor<2xf64>) -> tensor<2xf64>
    "func.return"(%0) : (tensor<2xf64>) -> ()
  }) : () -> ()
}) : () -> ()"#;

#[test]
fn calls_are_inlined_with_their_own_names() {
    let x = f64s(&[0.5, -1.0], &[2]);
    let out = run(CALLS, std::slice::from_ref(&x)).unwrap();
    let want: Vec<f64> = x.to_f64_vec().iter().map(|v| 3.0 * v.sin()).collect();
    assert_eq!(out[0].to_f64_vec(), want);
    let g = import_function(&parse_generic(CALLS).unwrap(), "main", "t").unwrap();
    assert_eq!(g.library.len(), 1, "{g}");
    let recursive = CALLS.replace(
        "\"stablehlo.add\"(%arg0, %arg0)",
        "\"func.call\"(%arg0) <{callee = @twice}>",
    );
    let err = run(&recursive, &[x]).unwrap_err();
    assert!(err.message.contains("recursion"), "{err}");
}

#[test]
fn errors_name_the_op_and_where_it_is() {
    let body = "    %0 = \"stablehlo.cbrt\"(%arg0) : (tensor<f64>) -> tensor<f64> loc(\"-\":7:12)";
    let text = module(&["tensor<f64>"], &["tensor<f64>"], body, &["%0"]);
    let err = run(&text, &[Tensor::scalar(1.0)]).unwrap_err();
    assert_eq!(
        (err.kind, err.op.as_ref()),
        (ErrorKind::Compile, "stablehlo.cbrt")
    );
    assert!(err.message.contains("test.mlir:7:12"), "{err}");
    // Inside a loop body, the enclosing ops are named too.
    let nested = LOOP_BODY.replace("\"stablehlo.sine\"", "\"stablehlo.cbrt\"");
    let text = module(&LOOP_PARAMS, &["tensor<f64>"], &nested, &["%0#0"]);
    let err = run(&text, &[]).unwrap_err();
    assert_eq!(err.op.as_ref(), "stablehlo.cbrt");
    assert!(
        err.message.contains("at stablehlo.while (test.mlir:3:8)"),
        "{err}"
    );
    let text = module(&["tensor<2xbf16>"], &["tensor<2xbf16>"], "", &["%arg0"]);
    let err = run(&text, &[]).unwrap_err();
    assert!(
        err.kind == ErrorKind::Compile && err.message.contains("bf16"),
        "{err}"
    );
    let m = parse_generic(CALLS).unwrap();
    let err = import_function(&m, "nope", "t").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("@main, @twice"), "{err}");
}

#[test]
fn gradient_requests_are_checked() {
    let text = module(&LOOP_PARAMS, &["tensor<f64>"], LOOP_BODY, &["%0#0"]);
    let err =
        gradient_module(&text, "main", &[1], "t", LoopGradients::default(), false).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Gradient);
    assert!(err.message.contains("argument 1"), "{err}");
    let err =
        gradient_module(&text, "main", &[3], "t", LoopGradients::default(), false).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Index);
    let clash = CALLS.replace("sym_name = \"twice\"", "sym_name = \"main_grad\"");
    let err =
        gradient_module(&clash, "main", &[0], "t", LoopGradients::default(), false).unwrap_err();
    assert!(err.message.contains("already defines @main_grad"), "{err}");
}
