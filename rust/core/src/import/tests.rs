//! Importer tests: the elementwise rows of the mapping table run on the interpreter against
//! Rust's own functions, and what the other test files share (layout and contractions in
//! `layout_tests.rs`; control flow, gradients and errors in `control_tests.rs`).

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

pub(super) fn assert_all_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

/// One op of `name` on operands of `types` (the result of type `result`), run on `args`.
pub(super) fn one_op(
    name: &str,
    types: &[&str],
    result: &str,
    attrs: &str,
    args: &[Tensor],
) -> Tensor {
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

/// An op name and its definition.
type UnaryRow = (&'static str, fn(f64) -> f64);
type BinaryRow = (&'static str, fn(f64, f64) -> f64);

#[test]
fn unary_ops_match_their_definitions() {
    let logistic = |v: f64| 1.0 / (1.0 + (-v).exp());
    let rows: &[UnaryRow] = &[
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
        ("chlo.asin", |v| (v / 3.0).asin()),
        ("chlo.acos", |v| (v / 3.0).acos()),
        ("chlo.atan", f64::atan),
        ("chlo.sinh", f64::sinh),
        ("chlo.cosh", f64::cosh),
        ("chlo.tan", f64::tan),
        ("chlo.asinh", f64::asinh),
        ("chlo.acosh", |v| (v + 1.0).acosh()),
        ("chlo.atanh", |v| (v / 3.0).atanh()),
        // erf(0.3), erf(1.2), erf(2.5) from tables
        ("chlo.erf", |v| {
            [
                (0.3, 0.328_626_759_459_127_4),
                (1.2, 0.910_313_978_229_635_4),
                (2.5, 0.999_593_047_982_555),
            ]
            .iter()
            .find(|(x, _)| *x == v)
            .map_or(f64::NAN, |(_, y)| *y)
        }),
    ];
    let x = [0.3, 1.2, 2.5];
    let ty = "tensor<3xf64>";
    for (name, f) in rows {
        // The rows for functions of a restricted domain read x moved into it (the closure
        // gives the definition at x itself).
        let moved: Vec<f64> = match *name {
            "chlo.asin" | "chlo.acos" | "chlo.atanh" => x.iter().map(|v| v / 3.0).collect(),
            "chlo.acosh" => x.iter().map(|v| v + 1.0).collect(),
            _ => x.to_vec(),
        };
        let y = one_op(name, &[ty], ty, "", &[f64s(&moved, &[3])]);
        let want: Vec<f64> = x.iter().map(|&v| f(v)).collect();
        assert_all_close(&y.to_f64_vec(), &want, name);
    }
    let y = one_op("stablehlo.logistic", &[ty], ty, "", &[f64s(&x, &[3])]);
    assert_all_close(&y.to_f64_vec(), &x.map(logistic), "logistic");
}

#[test]
fn binary_ops_match_their_definitions() {
    let rows: &[BinaryRow] = &[
        ("stablehlo.add", |a, b| a + b),
        ("stablehlo.subtract", |a, b| a - b),
        ("stablehlo.multiply", |a, b| a * b),
        ("stablehlo.divide", |a, b| a / b),
        ("stablehlo.power", f64::powf),
        ("stablehlo.maximum", f64::max),
        ("stablehlo.minimum", f64::min),
        ("stablehlo.remainder", |a, b| a % b),
        ("stablehlo.atan2", f64::atan2),
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
    // nextafter's trick: the bits of 1.0 plus one are the next float up
    let bits = one_op(
        "stablehlo.bitcast_convert",
        &["tensor<1xf64>"],
        "tensor<1xi64>",
        "",
        &[f64s(&[1.0], &[1])],
    );
    assert_eq!(bits.as_slice::<i64>().unwrap(), [1.0f64.to_bits() as i64]);
    let up = Tensor::from_vec(vec![1.0f64.to_bits() as i64 + 1], &[1]).unwrap();
    let next = one_op(
        "stablehlo.bitcast_convert",
        &["tensor<1xi64>"],
        "tensor<1xf64>",
        "",
        &[up],
    );
    assert_eq!(next.to_f64_vec(), [1.0 + f64::EPSILON]);
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

#[test]
fn rounding_and_finiteness() {
    let ty = "tensor<5xf64>";
    let x = f64s(&[-1.5, -0.2, 0.0, 2.7, 3.0], &[5]);
    let y = one_op("stablehlo.floor", &[ty], ty, "", std::slice::from_ref(&x));
    assert_eq!(y.to_f64_vec(), [-2.0, -1.0, 0.0, 2.0, 3.0]);
    let y = one_op("stablehlo.ceil", &[ty], ty, "", &[x]);
    assert_eq!(y.to_f64_vec(), [-1.0, 0.0, 0.0, 3.0, 3.0]);
    // Beyond int64, and non-finite: as they are (a cast through int64 got these wrong).
    let big = f64s(
        &[1e19, -3.5e20, f64::INFINITY, f64::NEG_INFINITY, 0.5],
        &[5],
    );
    let y = one_op("stablehlo.floor", &[ty], ty, "", std::slice::from_ref(&big));
    assert_eq!(
        y.to_f64_vec(),
        [1e19, -3.5e20, f64::INFINITY, f64::NEG_INFINITY, 0.0]
    );
    let y = one_op("stablehlo.ceil", &[ty], ty, "", std::slice::from_ref(&big));
    assert_eq!(
        y.to_f64_vec(),
        [1e19, -3.5e20, f64::INFINITY, f64::NEG_INFINITY, 1.0]
    );
    let nan = f64s(&[f64::NAN, -0.5, 1.5, 2.5, -2.5], &[5]);
    let y = one_op("stablehlo.floor", &[ty], ty, "", std::slice::from_ref(&nan));
    assert!(y.to_f64_vec()[0].is_nan());
    let y = one_op("stablehlo.round_nearest_even", &[ty], ty, "", &[nan]);
    let y = y.to_f64_vec();
    assert!(y[0].is_nan());
    assert_eq!(y[1..], [-0.0, 2.0, 2.0, -2.0]);
    let x = f64s(
        &[1.0, f64::INFINITY, f64::NAN, f64::NEG_INFINITY, -2.0],
        &[5],
    );
    let y = one_op("stablehlo.is_finite", &[ty], "tensor<5xi1>", "", &[x]);
    assert_eq!(
        y.as_slice::<bool>().unwrap(),
        [true, false, false, false, true]
    );
}
