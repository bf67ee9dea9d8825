//! Importer tests: the generic-form parser, and every row of the mapping table run on the
//! interpreter against its definition (elementwise ops against Rust's own functions, layout
//! and contractions against index arithmetic). Control flow, gradients and errors are in
//! `control_tests.rs`.

use super::*;
use crate::error::Result;
use crate::graph::verify;
use crate::interpret::{run_graph, RtValue};
use crate::tensor::Tensor;

/// A generic-form module whose `@main(params) -> results` runs `body` and returns `ret`.
pub(super) fn module(params: &[&str], results: &[&str], body: &str, ret: &[&str]) -> String {
    let args: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{i}: {t} loc(\"-\":1:{i})"))
        .collect();
    format!(
        "\"builtin.module\"() ({{\n  \"func.func\"() <{{function_type = ({p}) -> ({r}), \
         sym_name = \"main\"}}> ({{\n  ^bb0({a}):\n{body}\n    \"func.return\"({ret}) : ({r}) -> \
         () loc(\"-\":99:1)\n  }}) : () -> ()\n}}) : () -> ()\n",
        p = params.join(", "),
        r = results.join(", "),
        a = args.join(", "),
        ret = ret.join(", "),
    )
}

/// Imports `@main` of `text` and runs it on the interpreter.
pub(super) fn run(text: &str, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let m = parse_generic(text)?;
    let g = import_function(&m, "main", "test.mlir")?;
    verify(&g)?;
    let values = args.iter().cloned().map(RtValue::Tensor).collect();
    run_graph(&g, values)?
        .into_iter()
        .map(RtValue::into_tensor)
        .collect()
}

pub(super) fn f64s(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn assert_all_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

/// One op of `name` on operands of `types` (the result of type `result`), run on `args`.
fn one_op(name: &str, types: &[&str], result: &str, attrs: &str, args: &[Tensor]) -> Tensor {
    let operands: Vec<String> = (0..types.len()).map(|i| format!("%arg{i}")).collect();
    let body = format!(
        "    %0 = \"{name}\"({}) {attrs} : ({}) -> {result} loc(\"-\":2:5)",
        operands.join(", "),
        types.join(", ")
    );
    let text = module(types, &[result], &body, &["%0"]);
    let mut out = run(&text, args).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
    out.remove(0)
}

#[test]
fn the_generic_form_parses_into_ops_regions_and_locations() {
    let text = r#"#loc3 = loc("m.py":1:1)
"builtin.module"() <{sym_name = "jit_f"}> ({
  "func.func"() <{function_type = (tensor<f32>) -> tensor<f32>, sym_name = "main"}> ({
  ^bb0(%arg0: tensor<f32> loc("-":2:26)):
    %0:2 = "stablehlo.while"(%arg0, %arg0) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %1 = "stablehlo.compare"(%a, %b) <{comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<f32>, tensor<f32>) -> tensor<i1> loc("f"("m.py":7:3))
      "stablehlo.return"(%1) : (tensor<i1>) -> () loc(#loc3)
    }, {
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      "stablehlo.return"(%b, %a) : (tensor<f32>, tensor<f32>) -> ()
    }) : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>) loc(callsite("g"("x.py":3:4) at "y.py":5:6))
    "func.return"(%0#1) : (tensor<f32>) -> () loc(unknown)
  }) {jax.uses_shape_polymorphism = false} : () -> ()
}) {mhlo.num_partitions = 1 : i32} : () -> ()
"#;
    let m = parse_generic(text).unwrap();
    assert_eq!(m.attr("sym_name"), Some(&Attribute::Str("jit_f".into())));
    assert_eq!(m.attr("mhlo.num_partitions"), Some(&Attribute::Int(1)));
    let f = &m.regions[0].blocks[0].ops[0];
    assert_eq!(
        f.attr("jax.uses_shape_polymorphism"),
        Some(&Attribute::Bool(false))
    );
    let body = &f.regions[0].blocks[0];
    assert_eq!(body.args[0].0, "%arg0");
    let w = &body.ops[0];
    assert_eq!(
        (w.name.as_str(), w.results.clone()),
        ("stablehlo.while", vec![("%0".to_string(), 2)])
    );
    assert_eq!(w.regions.len(), 2);
    assert_eq!(w.loc.to_string(), "x.py:3:4");
    let cmp = &w.regions[0].blocks[0].ops[0];
    assert_eq!(cmp.loc.to_string(), "m.py:7:3");
    assert_eq!(
        cmp.attr("comparison_direction")
            .and_then(Attribute::enum_value),
        Some("LT")
    );
    assert_eq!(w.regions[0].blocks[0].ops[1].loc.to_string(), "loc(#loc3)");
    let ret = &body.ops[1];
    assert_eq!(
        ret.operands[0],
        ValueRef {
            name: "%0".into(),
            index: 1
        }
    );
    assert_eq!(ret.loc.to_string(), "loc(unknown)");
    assert_eq!(&text[m.regions[0].end..m.regions[0].end + 2], "})");
    let err = parse_generic("%0 = stablehlo.add %a, %b : tensor<f32>").unwrap_err();
    assert!(err.message.contains("generic form"), "{err}");
}

#[test]
fn unary_ops_match_their_definitions() {
    let logistic = |v: f64| 1.0 / (1.0 + (-v).exp());
    let rows: &[(&str, fn(f64) -> f64)] = &[
        ("stablehlo.abs", f64::abs),
        ("stablehlo.cosine", f64::cos),
        ("stablehlo.exponential", f64::exp),
        ("stablehlo.exponential_minus_one", f64::exp_m1),
        ("stablehlo.log", f64::ln),
        ("stablehlo.log_plus_one", f64::ln_1p),
        ("stablehlo.negate", |v| -v),
        ("stablehlo.rsqrt", |v| 1.0 / v.sqrt()),
        ("stablehlo.sign", f64::signum),
        ("stablehlo.sine", f64::sin),
        ("stablehlo.sqrt", f64::sqrt),
        ("stablehlo.tan", f64::tan),
        ("stablehlo.tanh", f64::tanh),
    ];
    let x = [0.3, 1.2, 2.5];
    let ty = "tensor<3xf64>";
    for (name, f) in rows {
        let y = one_op(name, &[ty], ty, "", &[f64s(&x, &[3])]);
        let want: Vec<f64> = x.iter().map(|&v| f(v)).collect();
        assert_all_close(&y.to_f64_vec(), &want, name);
    }
    let y = one_op("stablehlo.logistic", &[ty], ty, "", &[f64s(&x, &[3])]);
    assert_all_close(&y.to_f64_vec(), &x.map(logistic), "logistic");
}

#[test]
fn binary_ops_match_their_definitions() {
    let rows: &[(&str, fn(f64, f64) -> f64)] = &[
        ("stablehlo.add", |a, b| a + b),
        ("stablehlo.subtract", |a, b| a - b),
        ("stablehlo.multiply", |a, b| a * b),
        ("stablehlo.divide", |a, b| a / b),
        ("stablehlo.power", f64::powf),
        ("stablehlo.maximum", f64::max),
        ("stablehlo.minimum", f64::min),
        ("stablehlo.remainder", |a, b| a % b),
    ];
    let (a, b) = ([0.3, 1.2, 2.5], [0.7, -0.5, 1.1]);
    let ty = "tensor<3xf64>";
    let args = [f64s(&a, &[3]), f64s(&b, &[3])];
    for (name, f) in rows {
        let y = one_op(name, &[ty, ty], ty, "", &args);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        assert_all_close(&y.to_f64_vec(), &want, name);
    }
}

#[test]
fn integer_division_remainder_and_conversions_truncate() {
    let ty = "tensor<4xi32>";
    let a = Tensor::from_vec(vec![-7i32, 7, -8, 9], &[4]).unwrap();
    let b = Tensor::from_vec(vec![2i32, -2, 3, 4], &[4]).unwrap();
    let q = one_op(
        "stablehlo.divide",
        &[ty, ty],
        ty,
        "",
        &[a.clone(), b.clone()],
    );
    assert_eq!(q.as_slice::<i32>().unwrap(), [-3, -3, -2, 2]);
    let r = one_op("stablehlo.remainder", &[ty, ty], ty, "", &[a, b]);
    assert_eq!(r.as_slice::<i32>().unwrap(), [-1, 1, -2, 1]);
    let x = f64s(&[-1.7, 2.9], &[2]);
    let c = one_op(
        "stablehlo.convert",
        &["tensor<2xf64>"],
        "tensor<2xi32>",
        "",
        &[x],
    );
    assert_eq!(c.as_slice::<i32>().unwrap(), [-1, 2]);
}

#[test]
fn comparisons_selects_clamps_and_logic() {
    let (a, b) = (f64s(&[1.0, 2.0, 3.0], &[3]), f64s(&[2.0, 2.0, 2.0], &[3]));
    let (ty, out) = ("tensor<3xf64>", "tensor<3xi1>");
    for (dir, want) in [
        ("EQ", [false, true, false]),
        ("NE", [true, false, true]),
        ("LT", [true, false, false]),
        ("LE", [true, true, false]),
        ("GT", [false, false, true]),
        ("GE", [false, true, true]),
    ] {
        let attrs = format!(
            "{{comparison_direction = #stablehlo<comparison_direction {dir}>, \
             compare_type = #stablehlo<comparison_type FLOAT>}}"
        );
        let y = one_op(
            "stablehlo.compare",
            &[ty, ty],
            out,
            &attrs,
            &[a.clone(), b.clone()],
        );
        assert_eq!(y.as_slice::<bool>().unwrap(), want, "{dir}");
    }
    let p = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    let y = one_op(
        "stablehlo.select",
        &[out, ty, ty],
        ty,
        "",
        &[p.clone(), a.clone(), b.clone()],
    );
    assert_eq!(y.to_f64_vec(), [1.0, 2.0, 3.0]);
    let (lo, hi) = (Tensor::scalar(1.5), Tensor::scalar(2.5));
    let y = one_op(
        "stablehlo.clamp",
        &["tensor<f64>", ty, "tensor<f64>"],
        ty,
        "",
        &[lo, a, hi],
    );
    assert_eq!(y.to_f64_vec(), [1.5, 2.0, 2.5]);
    let q = Tensor::from_vec(vec![true, true, false], &[3]).unwrap();
    let args = [p.clone(), q];
    let and = one_op("stablehlo.and", &[out, out], out, "", &args);
    assert_eq!(and.as_slice::<bool>().unwrap(), [true, false, false]);
    let or = one_op("stablehlo.or", &[out, out], out, "", &args);
    assert_eq!(or.as_slice::<bool>().unwrap(), [true, true, true]);
    let xor = one_op("stablehlo.xor", &[out, out], out, "", &args);
    assert_eq!(xor.as_slice::<bool>().unwrap(), [false, true, true]);
    let not = one_op("stablehlo.not", &[out], out, "", &[p]);
    assert_eq!(not.as_slice::<bool>().unwrap(), [false, true, false]);
}

/// `0, 1, 2, ...` of `shape`.
fn iota(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    f64s(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), shape)
}

#[test]
fn layout_ops_move_elements_as_stablehlo_says() {
    // broadcast_in_dim with unsorted dimensions: y[i, j, k] = x[j, i].
    let x = iota(&[2, 3]);
    let attrs = "{broadcast_dimensions = array<i64: 1, 0>}";
    let y = one_op(
        "stablehlo.broadcast_in_dim",
        &["tensor<2x3xf64>"],
        "tensor<3x2x4xf64>",
        attrs,
        &[x.clone()],
    );
    let want: Vec<f64> = (0..3)
        .flat_map(|i| (0..2).flat_map(move |j| (0..4).map(move |_| (3 * j + i) as f64)))
        .collect();
    assert_eq!(y.to_f64_vec(), want);
    let y = one_op(
        "stablehlo.iota",
        &[],
        "tensor<2x3xi32>",
        "{iota_dimension = 1 : i64}",
        &[],
    );
    assert_eq!(y.as_slice::<i32>().unwrap(), [0, 1, 2, 0, 1, 2]);
    let y = one_op(
        "stablehlo.transpose",
        &["tensor<2x3xf64>"],
        "tensor<3x2xf64>",
        "{permutation = array<i64: 1, 0>}",
        &[x.clone()],
    );
    assert_eq!(y.to_f64_vec(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let y = one_op(
        "stablehlo.reshape",
        &["tensor<2x3xf64>"],
        "tensor<6xf64>",
        "",
        &[x.clone()],
    );
    assert_eq!(y.shape(), [6]);
    let attrs = "{start_indices = array<i64: 0, 1>, limit_indices = array<i64: 2, 3>, strides = array<i64: 1, 2>}";
    let y = one_op(
        "stablehlo.slice",
        &["tensor<2x3xf64>"],
        "tensor<2x1xf64>",
        attrs,
        &[x.clone()],
    );
    assert_eq!(y.to_f64_vec(), [1.0, 4.0]);
    let y = one_op(
        "stablehlo.concatenate",
        &["tensor<2x3xf64>", "tensor<2x3xf64>"],
        "tensor<2x6xf64>",
        "{dimension = 1 : i64}",
        &[x.clone(), x.clone()],
    );
    assert_eq!(y.to_f64_vec()[..6], [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    let y = one_op(
        "stablehlo.reverse",
        &["tensor<2x3xf64>"],
        "tensor<2x3xf64>",
        "{dimensions = array<i64: 1>}",
        &[x.clone()],
    );
    assert_eq!(y.to_f64_vec(), [2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
    let attrs = "{edge_padding_low = array<i64: 1>, edge_padding_high = array<i64: 0>, interior_padding = array<i64: 1>}";
    let y = one_op(
        "stablehlo.pad",
        &["tensor<2xf64>", "tensor<f64>"],
        "tensor<4xf64>",
        attrs,
        &[f64s(&[5.0, 6.0], &[2]), Tensor::scalar(-1.0)],
    );
    assert_eq!(y.to_f64_vec(), [-1.0, 5.0, -1.0, 6.0]);
    let i = Tensor::scalar(1i64);
    let y = one_op(
        "stablehlo.dynamic_slice",
        &["tensor<2x3xf64>", "tensor<i64>", "tensor<i64>"],
        "tensor<1x2xf64>",
        "{slice_sizes = array<i64: 1, 2>}",
        &[x.clone(), i.clone(), i.clone()],
    );
    assert_eq!(y.to_f64_vec(), [4.0, 5.0]);
    let u = f64s(&[9.0, 9.0], &[1, 2]);
    let y = one_op(
        "stablehlo.dynamic_update_slice",
        &[
            "tensor<2x3xf64>",
            "tensor<1x2xf64>",
            "tensor<i64>",
            "tensor<i64>",
        ],
        "tensor<2x3xf64>",
        "",
        &[x, u, i.clone(), i],
    );
    assert_eq!(y.to_f64_vec(), [0.0, 1.0, 2.0, 3.0, 9.0, 9.0]);
}

#[test]
fn dot_general_is_one_batched_matrix_product() {
    // Batch 0, contract lhs 1 with rhs 2: out[b, i, j] = sum_k a[b, k, i] * c[b, j, k].
    let (a, c) = (iota(&[2, 3, 4]), iota(&[2, 5, 3]));
    let attrs = "{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], \
                 rhs_batching_dimensions = [0], lhs_contracting_dimensions = [1], \
                 rhs_contracting_dimensions = [2]>}";
    let types = ["tensor<2x3x4xf64>", "tensor<2x5x3xf64>"];
    let y = one_op(
        "stablehlo.dot_general",
        &types,
        "tensor<2x4x5xf64>",
        attrs,
        &[a.clone(), c.clone()],
    );
    let (av, cv) = (a.to_f64_vec(), c.to_f64_vec());
    let mut want = Vec::new();
    for b in 0..2 {
        for i in 0..4 {
            for j in 0..5 {
                want.push(
                    (0..3)
                        .map(|k| av[b * 12 + k * 4 + i] * cv[b * 15 + j * 3 + k])
                        .sum(),
                );
            }
        }
    }
    assert_all_close(&y.to_f64_vec(), &want, "dot_general");
    let m = iota(&[2, 3]);
    let v = f64s(&[1.0, -1.0, 2.0], &[3]);
    let y = one_op(
        "stablehlo.dot",
        &["tensor<2x3xf64>", "tensor<3xf64>"],
        "tensor<2xf64>",
        "",
        &[m, v],
    );
    assert_eq!(y.to_f64_vec(), [3.0, 9.0]);
}

/// A `reduce` over `dims` whose region applies `combiner` (of `element` type).
fn reduce(
    combiner: &str,
    element: &str,
    ty: &str,
    out: &str,
    dims: &str,
    args: &[Tensor],
) -> Tensor {
    let dims = if dims.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {dims}>")
    };
    let body = format!(
        "    %0 = \"stablehlo.reduce\"(%arg0, %arg1) <{{dimensions = {dims}}}> ({{\n    \
         ^bb0(%a: {element}, %b: {element}):\n      %s = \"{combiner}\"(%a, %b) : ({element}, \
         {element}) -> {element}\n      \"stablehlo.return\"(%s) : ({element}) -> ()\n    }}) : \
         ({ty}, {element}) -> {out}"
    );
    let text = module(&[ty, element], &[out], &body, &["%0"]);
    run(&text, args)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .remove(0)
}

#[test]
fn reductions_combine_their_initial_value() {
    let x = iota(&[2, 3]);
    let e = "tensor<f64>";
    let y = reduce(
        "stablehlo.add",
        e,
        "tensor<2x3xf64>",
        "tensor<2xf64>",
        "1",
        &[x.clone(), Tensor::scalar(10.0)],
    );
    assert_eq!(y.to_f64_vec(), [13.0, 22.0]);
    let y = reduce(
        "stablehlo.maximum",
        e,
        "tensor<2x3xf64>",
        "tensor<3xf64>",
        "0",
        &[x.clone(), Tensor::scalar(f64::NEG_INFINITY)],
    );
    assert_eq!(y.to_f64_vec(), [3.0, 4.0, 5.0]);
    let y = reduce(
        "stablehlo.minimum",
        e,
        "tensor<2x3xf64>",
        "tensor<f64>",
        "0, 1",
        &[x.clone(), Tensor::scalar(-2.0)],
    );
    assert_eq!(y.to_f64_vec(), [-2.0]);
    let y = reduce(
        "stablehlo.add",
        e,
        "tensor<2x3xf64>",
        "tensor<2x3xf64>",
        "",
        &[x, Tensor::scalar(1.0)],
    );
    assert_eq!(y.to_f64_vec(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = Tensor::from_vec(vec![true, false, true, true], &[2, 2]).unwrap();
    let (bt, i1) = ("tensor<2x2xi1>", "tensor<i1>");
    let y = reduce(
        "stablehlo.and",
        i1,
        bt,
        "tensor<2xi1>",
        "1",
        &[b.clone(), Tensor::scalar(true)],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), [false, true]);
    let y = reduce(
        "stablehlo.or",
        i1,
        bt,
        "tensor<2xi1>",
        "0",
        &[b, Tensor::scalar(false)],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), [true, true]);
}
