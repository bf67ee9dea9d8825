//! Every op that machine code computes inline, on the values where machine instructions and
//! Rust's operators could part (NaN, signed zeros, infinities, integer overflow), against the
//! reference interpreter bit for bit. The crate's tests run in check mode, so each run is also
//! compared with the frame's interpreted program.

use crate::dtype::DType;
use crate::executor::{Executor, FrameCounts};
use crate::graph::parse_graph;
use crate::interpret::{run_graph, RtValue};
use crate::ops::attrs::dtype_short_name;
use crate::tensor::Tensor;

use crate::executor::frame::steps::same_bits;

const FLOATS: [f64; 9] = [
    f64::NAN,
    -0.0,
    0.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1.5,
    -2.5,
    1e30,
    2.5,
];
const INTS: [i64; 9] = [i32::MAX as i64, i32::MIN as i64, -1, 0, 7, 3, -3, 1, 2];

/// `n` values of `dtype`, starting `shift` into the table (so two operands differ).
fn values(dtype: DType, n: usize, shift: usize) -> Tensor {
    let at = |k: usize| (k + shift) % FLOATS.len();
    match dtype {
        DType::F32 => Tensor::from_vec((0..n).map(|k| FLOATS[at(k)] as f32).collect(), &[n]),
        DType::F64 => Tensor::from_vec((0..n).map(|k| FLOATS[at(k)]).collect(), &[n]),
        DType::I32 => Tensor::from_vec((0..n).map(|k| INTS[at(k)] as i32).collect(), &[n]),
        DType::I64 => Tensor::from_vec((0..n).map(|k| INTS[at(k)]).collect(), &[n]),
        DType::Bool => Tensor::from_vec((0..n).map(|k| at(k) % 3 == 0).collect(), &[n]),
    }
    .unwrap()
}

/// A loop of three trips whose carried result is `op` of its (unchanging) operands.
fn graph_of(op: &str, operands: &[(DType, bool)], result: DType, n: usize) -> String {
    let ty = |d: DType, scalar: bool| {
        if scalar {
            format!("{}[]", dtype_short_name(d))
        } else {
            format!("{}[{n}]", dtype_short_name(d))
        }
    };
    let result_ty = ty(result, false);
    let operand_tys: Vec<String> = operands.iter().map(|&(d, s)| ty(d, s)).collect();
    let loop_tys = format!("i32[], {result_ty}, {}", operand_tys.join(", "));
    let params: Vec<String> = operand_tys
        .iter()
        .enumerate()
        .map(|(k, t)| format!("%{}: {t}", k + 2))
        .collect();
    let args: Vec<String> = (0..operands.len()).map(|k| format!("%{}", k + 2)).collect();
    let count = 2 + operands.len();
    let body_operands: Vec<String> = (0..operands.len()).map(|k| format!("%{}", k + 2)).collect();
    format!(
        r#"graph @main
func @main(%0: i32[], %1: {result_ty}, {params}) -> ({result_ty}) {{
  %{count} = while(%0, %1, {args}) {{cond=@more, body=@step, parallel_iterations=10}} : ({loop_tys})
  return %{count}#1
}}
func @more(%0: i32[], %1: {result_ty}, {params}) -> (bool[]) {{
  %{c} = const() {{value=[3]}} : i32[]
  %{d} = less(%0, %{c}) : bool[]
  return %{d}
}}
func @step(%0: i32[], %1: {result_ty}, {params}) -> ({loop_tys}) {{
  %{c} = const() {{value=[1]}} : i32[]
  %{d} = add(%0, %{c}) : i32[]
  %{e} = {op}({body}) : {result_ty}
  return %{d}, %{e}, {args}
}}"#,
        params = params.join(", "),
        args = args.join(", "),
        c = count,
        d = count + 1,
        e = count + 2,
        body = body_operands.join(", "),
    )
}

fn check(op: &str, operands: &[(DType, bool)], result: DType) {
    for n in [1, 5, 9] {
        let text = graph_of(op, operands, result, n);
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut args = vec![
            RtValue::from(Tensor::scalar(0i32)),
            RtValue::from(values(result, n, 0)),
        ];
        for (k, &(dtype, scalar)) in operands.iter().enumerate() {
            let t = if scalar {
                values(dtype, 1, 4 * k + 1).reshaped(&[]).unwrap()
            } else {
                values(dtype, n, 4 * k + 1)
            };
            args.push(RtValue::from(t));
        }
        let want = run_graph(&graph, args.clone()).unwrap();
        let exec = Executor::new(&graph).unwrap();
        let got = exec.run(args).unwrap();
        assert_eq!(
            exec.frame_counts().native,
            1,
            "{op} on {n} ran as machine code"
        );
        assert!(
            same_bits(&got[0], &want[0]),
            "{op} on {n}: {:?} against {:?}",
            got[0],
            want[0]
        );
    }
}

#[test]
fn inline_arithmetic_agrees_with_the_kernels_bit_for_bit() {
    for dtype in [DType::F32, DType::F64] {
        for op in ["add", "sub", "mul", "div", "maximum", "minimum"] {
            check(op, &[(dtype, false), (dtype, false)], dtype);
            check(op, &[(dtype, false), (dtype, true)], dtype);
            check(op, &[(dtype, true), (dtype, false)], dtype);
        }
        for op in ["neg", "abs", "sqrt", "floor", "ceil", "round"] {
            check(op, &[(dtype, false)], dtype);
        }
    }
    for dtype in [DType::I32, DType::I64] {
        for op in ["add", "sub", "mul", "maximum", "minimum"] {
            check(op, &[(dtype, false), (dtype, false)], dtype);
            check(op, &[(dtype, false), (dtype, true)], dtype);
        }
        check("abs", &[(dtype, false)], dtype);
    }
}

#[test]
fn inline_comparisons_and_logic_agree_with_the_kernels() {
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for op in [
            "equal",
            "not_equal",
            "less",
            "less_equal",
            "greater",
            "greater_equal",
        ] {
            check(op, &[(dtype, false), (dtype, false)], DType::Bool);
            check(op, &[(dtype, false), (dtype, true)], DType::Bool);
        }
        check(
            "where",
            &[(DType::Bool, false), (dtype, false), (dtype, true)],
            dtype,
        );
    }
    for op in ["logical_and", "logical_or", "equal", "not_equal"] {
        check(
            op,
            &[(DType::Bool, false), (DType::Bool, false)],
            DType::Bool,
        );
    }
    check("logical_not", &[(DType::Bool, false)], DType::Bool);
}

/// A loop whose body is a chain of `adds` scalar additions.
fn long_loop(adds: usize) -> String {
    let mut body = String::from("  %3 = const() {value=[1]} : i32[]\n  %4 = add(%0, %3) : i32[]\n");
    let mut last = 1;
    for k in 0..adds {
        let id = 5 + k;
        body.push_str(&format!("  %{id} = add(%{last}, %2) : f64[]\n"));
        last = id;
    }
    format!(
        r#"graph @main
func @main(%0: f64[], %1: f64[]) -> (f64[]) {{
  %2 = const() {{value=[0]}} : i32[]
  %3 = while(%2, %0, %1) {{cond=@more, body=@step, parallel_iterations=10}} : (i32[], f64[], f64[])
  return %3#1
}}
func @more(%0: i32[], %1: f64[], %2: f64[]) -> (bool[]) {{
  %3 = const() {{value=[3]}} : i32[]
  %4 = less(%0, %3) : bool[]
  return %4
}}
func @step(%0: i32[], %1: f64[], %2: f64[]) -> (i32[], f64[], f64[]) {{
{body}  return %4, %{last}, %2
}}"#
    )
}

#[test]
fn a_frame_past_the_step_budget_keeps_its_stepped_form() {
    let args = || {
        vec![
            RtValue::from(Tensor::scalar(0.5f64)),
            RtValue::from(Tensor::scalar(0.25f64)),
        ]
    };
    for (adds, native) in [(200, 1), (super::emit::MAX_STEPS, 0)] {
        let graph = parse_graph(&long_loop(adds)).unwrap();
        let want = run_graph(&graph, args()).unwrap();
        let exec = Executor::new(&graph).unwrap();
        let FrameCounts {
            compiled, total, ..
        } = exec.frame_counts();
        assert_eq!(compiled, total, "{adds} adds: compiled to buffers");
        let got = exec.run(args()).unwrap();
        assert!(same_bits(&got[0], &want[0]), "{adds} adds");
        assert_eq!(exec.frame_counts().native, native, "{adds} adds");
    }
}
