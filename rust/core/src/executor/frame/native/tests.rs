//! Every op that machine code computes inline, on the values where machine instructions and
//! Rust's operators could part (NaN, signed zeros, infinities, integer overflow), against the
//! reference interpreter bit for bit. The crate's tests run in check mode, so each run is also
//! compared with the frame's interpreted program.

use crate::dtype::DType;
use crate::executor::tiers::fused_passes;
use crate::executor::{Executor, FrameCounts};
use crate::graph::parse_graph;
use crate::interpret::{run_graph, RtValue};
use crate::ops::attrs::dtype_short_name;
use crate::tensor::Tensor;

use crate::executor::frame::steps::{same_bits, Steps};
use crate::executor::tests::compiled_steps;

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

/// A loop of three trips whose carried result is `op` of its (unchanging) operands, passed
/// through three ops that return it unchanged (so that over many lanes the four form a run).
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
  %{f} = {same}(%{e}, %{e}) : {result_ty}
  %{g} = {same}(%{f}, %{e}) : {result_ty}
  %{h} = {same}(%{g}, %{f}) : {result_ty}
  return %{d}, %{h}, {args}
}}"#,
        params = params.join(", "),
        args = args.join(", "),
        c = count,
        d = count + 1,
        e = count + 2,
        f = count + 3,
        g = count + 4,
        h = count + 5,
        same = if result == DType::Bool {
            "logical_and"
        } else {
            "maximum"
        },
        body = body_operands.join(", "),
    )
}

fn check(op: &str, operands: &[(DType, bool)], result: DType) {
    for n in [1, 5, 9, 67, 130] {
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
        let fused = n >= fused_passes().from_elements;
        assert_eq!(fused_runs(&exec), usize::from(fused), "{op} on {n}: runs");
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

/// The ops whose kernels are `Lanes` maps: machine code calls the map on the elements
/// (`map_lanes`), which must give the kernel's bits, far arguments, NaN and infinities
/// included, in place of the op's boxed kernel.
#[test]
fn lane_functions_called_from_machine_code_agree_with_their_kernels() {
    for dtype in [DType::F32, DType::F64] {
        for op in ["exp", "log", "sin", "cos", "tanh", "sigmoid"] {
            for n in [1, 9, 16, 67] {
                let text = graph_of(op, &[(dtype, false)], dtype, n);
                let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                let args = vec![
                    RtValue::from(Tensor::scalar(0i32)),
                    RtValue::from(values(dtype, n, 0)),
                    RtValue::from(values(dtype, n, 3)),
                ];
                let want = run_graph(&graph, args.clone()).unwrap();
                let exec = Executor::new(&graph).unwrap();
                let got = exec.run(args).unwrap();
                assert_eq!(exec.frame_counts().native, 1, "{op} on {n}: machine code");
                let direct = compiled_steps(&exec)
                    .into_iter()
                    .filter(|(frame, step)| super::emit::lane_map_elements(frame, step) == Some(n))
                    .count();
                assert_eq!(direct, 1, "{op} on {n}: called directly");
                assert!(
                    same_bits(&got[0], &want[0]),
                    "{op} on {n}: {:?} against {:?}",
                    got[0],
                    want[0]
                );
            }
        }
    }
}

/// How many runs of steps native code computes as one pass (`runs::run_at`).
fn fused_runs(exec: &Executor) -> usize {
    let mut frames: Vec<&Steps> = compiled_steps(exec).into_iter().map(|(f, _)| f).collect();
    frames.dedup_by(|a, b| std::ptr::eq(*a, *b));
    frames.iter().map(|f| super::runs::count(&f.steps)).sum()
}

/// Newton's iteration for x^3 = a over `n` lanes, as a batched loop runs it: each lane's
/// update kept where it is live, its trips counted per lane, its own stop (f64, i32 and bool
/// lanes, a broadcast tolerance, constants, a scalar trip count beside them).
fn newton_lanes(n: usize) -> String {
    format!(
        r#"graph @main
func @main(%0: f64[{n}], %1: f64[]) -> (f64[{n}], i32[{n}], bool[{n}]) {{
  %2 = const() {{value=[0]}} : i32[]
  %3 = fill() {{dtype=i32, shape=[{n}], value=0.0}} : i32[{n}]
  %4 = fill() {{dtype=bool, shape=[{n}], value=1.0}} : bool[{n}]
  %5 = while(%2, %0, %3, %4, %0, %1) {{cond=@more, body=@step, parallel_iterations=10}} : (i32[], f64[{n}], i32[{n}], bool[{n}], f64[{n}], f64[])
  return %5#1, %5#2, %5#3
}}
func @more(%0: i32[], %1: f64[{n}], %2: i32[{n}], %3: bool[{n}], %4: f64[{n}], %5: f64[]) -> (bool[]) {{
  %6 = const() {{value=[40]}} : i32[]
  %7 = less(%0, %6) : bool[]
  return %7
}}
func @step(%0: i32[], %1: f64[{n}], %2: i32[{n}], %3: bool[{n}], %4: f64[{n}], %5: f64[]) -> (i32[], f64[{n}], i32[{n}], bool[{n}], f64[{n}], f64[]) {{
  %6 = const() {{value=[1]}} : i32[]
  %7 = add(%0, %6) : i32[]
  %8 = mul(%1, %1) : f64[{n}]
  %9 = mul(%8, %1) : f64[{n}]
  %10 = sub(%9, %4) : f64[{n}]
  %11 = const() {{value=[3.0]}} : f64[]
  %12 = mul(%11, %8) : f64[{n}]
  %13 = div(%10, %12) : f64[{n}]
  %14 = sub(%1, %13) : f64[{n}]
  %15 = where(%3, %14, %1) : f64[{n}]
  %16 = add(%2, %6) : i32[{n}]
  %17 = where(%3, %16, %2) : i32[{n}]
  %18 = mul(%15, %15) : f64[{n}]
  %19 = mul(%18, %15) : f64[{n}]
  %20 = sub(%19, %4) : f64[{n}]
  %21 = abs(%20) : f64[{n}]
  %22 = mul(%5, %4) : f64[{n}]
  %23 = greater(%21, %22) : bool[{n}]
  %24 = logical_and(%3, %23) : bool[{n}]
  return %7, %15, %17, %24, %4, %5
}}"#
    )
}

#[test]
fn a_batched_loop_body_runs_as_one_pass_over_its_lanes_bit_for_bit() {
    for n in [130, 1001] {
        let graph = parse_graph(&newton_lanes(n)).unwrap();
        let a: Vec<f64> = (0..n)
            .map(|k| 10f64.powf(-2.0 + 4.0 * k as f64 / n as f64))
            .collect();
        let args = || {
            vec![
                RtValue::from(Tensor::from_vec(a.clone(), &[n]).unwrap()),
                RtValue::from(Tensor::scalar(1e-12f64)),
            ]
        };
        let want = run_graph(&graph, args()).unwrap();
        let exec = Executor::new(&graph).unwrap();
        let got = exec.run(args()).unwrap();
        assert_eq!(exec.frame_counts().native, 1, "{n} lanes: machine code");
        assert_eq!(fused_runs(&exec), 1, "{n} lanes: one run");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                same_bits(g, w),
                "{n} lanes, result {k}: {g:?} against {w:?}"
            );
        }
    }
}

/// A loop that takes one branch for two trips and the other for three, each a chain of ops over `n` lanes: the
/// untaken branch's run has dead inputs and takes the step-by-step path.
fn alternating_branches(n: usize) -> String {
    format!(
        r#"graph @main
func @main(%0: f64[{n}]) -> (f64[{n}]) {{
  %1 = const() {{value=[0]}} : i32[]
  %2 = while(%1, %0) {{cond=@more, body=@step, parallel_iterations=10}} : (i32[], f64[{n}])
  return %2#1
}}
func @more(%0: i32[], %1: f64[{n}]) -> (bool[]) {{
  %2 = const() {{value=[5]}} : i32[]
  %3 = less(%0, %2) : bool[]
  return %3
}}
func @step(%0: i32[], %1: f64[{n}]) -> (i32[], f64[{n}]) {{
  %2 = const() {{value=[2]}} : i32[]
  %5 = less(%0, %2) : bool[]
  %6 = if(%5, %1) {{then=@halve, else=@square}} : f64[{n}]
  %7 = const() {{value=[1]}} : i32[]
  %8 = add(%0, %7) : i32[]
  return %8, %6
}}
func @halve(%0: f64[{n}]) -> (f64[{n}]) {{
  %1 = const() {{value=[0.5]}} : f64[]
  %2 = mul(%0, %1) : f64[{n}]
  %3 = add(%2, %1) : f64[{n}]
  %4 = mul(%3, %3) : f64[{n}]
  %5 = sub(%4, %2) : f64[{n}]
  return %5
}}
func @square(%0: f64[{n}]) -> (f64[{n}]) {{
  %1 = mul(%0, %0) : f64[{n}]
  %2 = neg(%1) : f64[{n}]
  %3 = sqrt(%1) : f64[{n}]
  %4 = sub(%3, %2) : f64[{n}]
  return %4
}}"#
    )
}

#[test]
fn a_run_in_an_untaken_branch_stays_dead() {
    let n = 99;
    let graph = parse_graph(&alternating_branches(n)).unwrap();
    let args = || vec![RtValue::from(values(DType::F64, n, 5))];
    let want = run_graph(&graph, args()).unwrap();
    let exec = Executor::new(&graph).unwrap();
    let got = exec.run(args()).unwrap();
    assert_eq!(exec.frame_counts().native, 1, "machine code");
    assert_eq!(fused_runs(&exec), 2, "a run per branch");
    assert!(
        same_bits(&got[0], &want[0]),
        "{:?} against {:?}",
        got[0],
        want[0]
    );
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
