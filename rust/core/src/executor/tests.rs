//! The executor against the reference interpreter (values, variables, errors), and the lazy
//! semantics only the executor has.

use std::sync::Arc;

use super::frame::{same_bits, BufferAction, BufferStep, FusedLoop, Steps};
use super::{Executor, FrameCounts, Loops};
use crate::dataflow::lower;
use crate::dataflow::DfKind;
use crate::dtype::DType;
use crate::graph::{parse_graph, Graph, ValueType};
use crate::interpret::{run_graph, RtValue, VariableRef};
use crate::tensor::Tensor;
use crate::testing::graphs as examples;

/// Deterministic arguments for `params` (variables start from the same values each call).
fn args_for(params: &[ValueType], seed: f64) -> Vec<RtValue> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let t = p.inner();
            let shape: Vec<usize> = t
                .shape
                .iter()
                .map(|&d| if d == crate::DYN { 3 } else { d })
                .collect();
            let n: usize = shape.iter().product();
            let xs: Vec<f64> = (0..n)
                .map(|k| ((k + i) as f64 * 0.37 + seed).sin() * 2.0)
                .collect();
            let tensor = match t.dtype {
                DType::F32 => Tensor::from_vec(xs.iter().map(|&x| x as f32).collect(), &shape),
                DType::F64 => Tensor::from_vec(xs, &shape),
                DType::I32 => {
                    Tensor::from_vec(xs.iter().map(|&x| (x * 2.0) as i32).collect(), &shape)
                }
                DType::I64 => Tensor::from_vec(
                    xs.iter().map(|&x| (x * 3.0).abs() as i64 + 2).collect(),
                    &shape,
                ),
                DType::Bool => Tensor::from_vec(xs.iter().map(|&x| x > 0.0).collect(), &shape),
            }
            .unwrap();
            match p {
                ValueType::Resource(_) => RtValue::Resource(VariableRef::new(tensor)),
                _ => RtValue::Tensor(tensor),
            }
        })
        .collect()
}

/// Results as numbers, and the final value of every variable argument.
fn observe(args: &[RtValue], results: &[RtValue]) -> Vec<Vec<f64>> {
    let mut seen: Vec<Vec<f64>> = results
        .iter()
        .map(|r| r.as_tensor().expect("a tensor result").to_f64_vec())
        .collect();
    for a in args {
        if let RtValue::Resource(v) = a {
            seen.push(v.read().to_f64_vec());
        }
    }
    seen
}

fn same(a: &[Vec<f64>], b: &[Vec<f64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(p, q)| p == q || (p.is_nan() && q.is_nan()))
        })
}

/// The executor of `graph` with loops fused and with every loop a frame of tokens, each on
/// 1, 2 and 4 threads.
fn executors(graph: &Graph) -> Vec<(String, Executor)> {
    let mut all = Vec::new();
    for loops in [Loops::Fused, Loops::Frames] {
        for threads in [1, 2, 4] {
            let exec = Executor::with_loops(graph, loops)
                .unwrap_or_else(|e| panic!("{loops:?}: {e}"))
                .with_threads(threads);
            all.push((format!("{loops:?} loops, {threads} threads"), exec));
        }
    }
    all
}

/// Runs `graph` on the interpreter and on every executor: same results, same variables.
fn check_against_interpreter(name: &str, graph: &Graph) {
    let params = graph.entry_function().unwrap().params.clone();
    for seed in [0.0, 1.3] {
        let args = args_for(&params, seed);
        let want = run_graph(graph, args.clone()).map(|r| observe(&args, &r));
        for (how, exec) in executors(graph) {
            let args = args_for(&params, seed);
            let got = exec.run(args.clone()).map(|r| observe(&args, &r));
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert!(same(w, g), "{name} ({how}): {g:?} != {w:?}"),
                (Err(w), Err(g)) => assert_eq!(w.message, g.message, "{name} ({how})"),
                _ => panic!("{name} ({how}): interpreter {want:?}, executor {got:?}"),
            }
        }
    }
}

#[test]
fn examples_match_the_interpreter() {
    for (name, graph) in examples::all() {
        check_against_interpreter(name, &graph);
    }
}

const COUNT: &str = r#"graph @count
func @count(%0: i64[]) -> (i64[], i64[]) {
  %1 = const() {value=[0]} : i64[]
  %2 = while(%1, %0) {cond=@more, body=@step, parallel_iterations=10} : (i64[], i64[])
  return %2#0, %2#1
}
func @more(%0: i64[], %1: i64[]) -> (bool[]) {
  %2 = less(%0, %1) : bool[]
  return %2
}
func @step(%0: i64[], %1: i64[]) -> (i64[], i64[]) {
  %2 = const() {value=[1]} : i64[]
  %3 = add(%0, %2) : i64[]
  return %3, %1
}"#;

#[test]
fn a_loop_lowers_to_the_five_primitives_and_counts() {
    let graph = parse_graph(COUNT).unwrap();
    let lowered = lower(&graph).unwrap();
    let text = lowered.to_string();
    for name in ["switch", "merge", "enter", "exit", "next_iteration"] {
        assert!(lowered.count(name) > 0, "no {name} in\n{text}");
    }
    assert!(
        text.contains("{frame=1, constant}"),
        "the bound is an invariant:\n{text}"
    );
    // The body's constant 1 is hoisted: a root constant entered as an invariant too.
    assert_eq!(text.matches("{frame=1, constant}").count(), 2, "{text}");
    for n in [0i64, 1, 7, 1000] {
        let out = Executor::new(&graph)
            .unwrap()
            .run(vec![RtValue::from(Tensor::scalar(n))])
            .unwrap();
        assert_eq!(out[0].as_tensor().unwrap().item_f64().unwrap(), n as f64);
        assert_eq!(out[1].as_tensor().unwrap().item_f64().unwrap(), n as f64);
    }
    check_against_interpreter("count", &graph);
}

/// Nested loops, a loop inside a branch, `maximum_iterations`, a stack threaded through a
/// loop (pushes, then pops in a second loop), and a three-way case.
const MIXED: &str = r#"graph @main
func @main(%0: f64[3], %1: i64[], %2: i32[]) -> (f64[3], i64[], f64[3], f64[3]) {
  %3 = const() {value=[0]} : i64[]
  %4 = while(%0, %3, %1) {cond=@outer_more, body=@outer_step, maximum_iterations=5, parallel_iterations=4} : (f64[3], i64[], i64[])
  %5 = const() {value=[true]} : bool[]
  %6 = less(%3, %1) : bool[]
  %7 = if(%6, %0, %1) {then=@looping, else=@plain} : f64[3]
  %8 = case(%2, %0) {branches=[@b0, @b1, @b2]} : f64[3]
  return %4#0, %4#1, %7, %8
}
func @outer_more(%0: f64[3], %1: i64[], %2: i64[]) -> (bool[]) {
  %3 = less(%1, %2) : bool[]
  return %3
}
func @outer_step(%0: f64[3], %1: i64[], %2: i64[]) -> (f64[3], i64[], i64[]) {
  %3 = const() {value=[0]} : i64[]
  %4 = while(%0, %3, %1) {cond=@inner_more, body=@inner_step, parallel_iterations=10} : (f64[3], i64[], i64[])
  %5 = const() {value=[1]} : i64[]
  %6 = add(%1, %5) : i64[]
  return %4#0, %6, %2
}
func @inner_more(%0: f64[3], %1: i64[], %2: i64[]) -> (bool[]) {
  %3 = less_equal(%1, %2) : bool[]
  return %3
}
func @inner_step(%0: f64[3], %1: i64[], %2: i64[]) -> (f64[3], i64[], i64[]) {
  %3 = sin(%0) : f64[3]
  %4 = const() {value=[0.5]} : f64[]
  %5 = add(%3, %4) : f64[3]
  %6 = const() {value=[1]} : i64[]
  %7 = add(%1, %6) : i64[]
  return %5, %7, %2
}
func @looping(%0: f64[3], %1: i64[]) -> (f64[3]) {
  %2 = stack_new() {element=f64[3]} : stack<f64[3]>
  %3 = const() {value=[0]} : i64[]
  %4 = while(%0, %2, %3, %1) {cond=@push_more, body=@push_step, parallel_iterations=10} : (f64[3], stack<f64[3]>, i64[], i64[])
  %5 = while(%4#0, %4#1, %4#2) {cond=@pop_more, body=@pop_step, parallel_iterations=10} : (f64[3], stack<f64[3]>, i64[])
  return %5#0
}
func @push_more(%0: f64[3], %1: stack<f64[3]>, %2: i64[], %3: i64[]) -> (bool[]) {
  %4 = less(%2, %3) : bool[]
  return %4
}
func @push_step(%0: f64[3], %1: stack<f64[3]>, %2: i64[], %3: i64[]) -> (f64[3], stack<f64[3]>, i64[], i64[]) {
  %4 = stack_push(%1, %0) : stack<f64[3]>
  %5 = cos(%0) : f64[3]
  %6 = const() {value=[1]} : i64[]
  %7 = add(%2, %6) : i64[]
  return %5, %4, %7, %3
}
func @pop_more(%0: f64[3], %1: stack<f64[3]>, %2: i64[]) -> (bool[]) {
  %3 = const() {value=[0]} : i64[]
  %4 = greater(%2, %3) : bool[]
  return %4
}
func @pop_step(%0: f64[3], %1: stack<f64[3]>, %2: i64[]) -> (f64[3], stack<f64[3]>, i64[]) {
  %3 = stack_pop(%1) : (stack<f64[3]>, f64[3])
  %4 = mul(%0, %3#1) : f64[3]
  %5 = const() {value=[1]} : i64[]
  %6 = sub(%2, %5) : i64[]
  return %4, %3#0, %6
}
func @plain(%0: f64[3], %1: i64[]) -> (f64[3]) {
  %2 = neg(%0) : f64[3]
  return %2
}
func @b0(%0: f64[3]) -> (f64[3]) {
  %1 = exp(%0) : f64[3]
  return %1
}
func @b1(%0: f64[3]) -> (f64[3]) {
  return %0
}
func @b2(%0: f64[3]) -> (f64[3]) {
  %1 = const() {value=[2.0]} : f64[]
  %2 = mul(%0, %1) : f64[3]
  return %2
}"#;

#[test]
fn nested_loops_branches_stacks_and_cases_match_the_interpreter() {
    let graph = parse_graph(MIXED).unwrap();
    for (n, index) in [(0i64, 0i32), (1, 1), (3, 2), (8, -1), (2, 7)] {
        let x = Tensor::from_vec(vec![0.1f64, -0.4, 1.2], &[3]).unwrap();
        let args = vec![
            RtValue::from(x),
            RtValue::from(Tensor::scalar(n)),
            RtValue::from(Tensor::scalar(index)),
        ];
        let want = run_graph(&graph, args.clone()).unwrap();
        for (how, exec) in executors(&graph) {
            let got = exec.run(args.clone()).unwrap();
            assert!(
                same(&observe(&[], &want), &observe(&[], &got)),
                "n={n} index={index} ({how})"
            );
        }
    }
}

/// `%5` pops an empty stack, which fails; nothing needs its result.
const UNNEEDED_FAILURE: &str = r#"graph @main
func @main(%0: f64[2], %1: bool[]) -> (f64[2]) {
  %2 = stack_new() {element=f64[2]} : stack<f64[2]>
  %3 = stack_pop(%2) : (stack<f64[2]>, f64[2])
  %4 = if(%1, %0) {then=@fails, else=@fine} : f64[2]
  return %4
}
func @fails(%0: f64[2]) -> (f64[2]) {
  %1 = stack_new() {element=f64[2]} : stack<f64[2]>
  %2 = stack_pop(%1) : (stack<f64[2]>, f64[2])
  %3 = add(%0, %2#1) : f64[2]
  return %3
}
func @fine(%0: f64[2]) -> (f64[2]) {
  %1 = neg(%0) : f64[2]
  return %1
}"#;

#[test]
fn ops_nothing_needs_and_untaken_branches_never_run() {
    let graph = parse_graph(UNNEEDED_FAILURE).unwrap();
    let x = RtValue::from(Tensor::from_vec(vec![1.0f64, -2.0], &[2]).unwrap());
    let no = RtValue::from(Tensor::scalar(false));
    let yes = RtValue::from(Tensor::scalar(true));
    assert!(
        run_graph(&graph, vec![x.clone(), no.clone()]).is_err(),
        "the interpreter is strict"
    );
    let exec = Executor::new(&graph).unwrap();
    let out = exec.run(vec![x.clone(), no]).unwrap();
    assert_eq!(out[0].as_tensor().unwrap().to_f64_vec(), [-1.0, 2.0]);
    let err = exec.run(vec![x, yes]).unwrap_err();
    assert!(err.message.contains("pop from an empty"), "{err}");
    assert!(err.message.contains("in @fails"), "{err}");
}

/// A branch that writes a variable, ordered before a read of it.
const EFFECTS: &str = r#"graph @main
func @main(%0: resource<f64[]>, %1: bool[], %2: f64[]) -> (f64[]) {
  %3 = if(%1, %0, %2) {then=@bump, else=@nothing} : f64[]
  %4 = read_variable(%0) ctrl(%3) : f64[]
  return %2 ctrl(%3)
}
func @bump(%0: resource<f64[]>, %1: f64[]) -> (f64[]) {
  %2 = assign_add_variable(%0, %1) : ()
  return %1 ctrl(%2)
}
func @nothing(%0: resource<f64[]>, %1: f64[]) -> (f64[]) {
  return %1
}"#;

#[test]
fn side_effects_run_exactly_once_and_only_in_the_taken_branch() {
    let graph = parse_graph(EFFECTS).unwrap();
    let exec = Executor::new(&graph).unwrap();
    for (taken, want) in [(true, 1.5), (false, 0.0)] {
        let v = VariableRef::new(Tensor::scalar(0.0f64));
        let args = vec![
            RtValue::from(v.clone()),
            RtValue::from(Tensor::scalar(taken)),
            RtValue::from(Tensor::scalar(1.5f64)),
        ];
        exec.run(args).unwrap();
        assert_eq!(v.read().item_f64().unwrap(), want, "taken={taken}");
    }
}

/// A stack popped once per iteration, empty from iteration 2 on.
const FAILS_IN_ITERATION: &str = r#"graph @main
func @main(%0: f64[]) -> (f64[]) {
  %1 = stack_new() {element=f64[]} : stack<f64[]>
  %2 = stack_push(%1, %0) : stack<f64[]>
  %3 = stack_push(%2, %0) : stack<f64[]>
  %4 = while(%0, %3) {cond=@always, body=@pop, parallel_iterations=10} : (f64[], stack<f64[]>) loc("model.py":10)
  return %4#0
}
func @always(%0: f64[], %1: stack<f64[]>) -> (bool[]) {
  %2 = const() {value=[true]} : bool[]
  return %2
}
func @pop(%0: f64[], %1: stack<f64[]>) -> (f64[], stack<f64[]>) {
  %2 = stack_pop(%1) : (stack<f64[]>, f64[]) loc("model.py":12)
  %3 = add(%0, %2#1) : f64[]
  return %3, %2#0
}"#;

#[test]
fn errors_name_the_node_the_iteration_and_the_loop_as_the_interpreter_does() {
    let graph = parse_graph(FAILS_IN_ITERATION).unwrap();
    let args = vec![RtValue::from(Tensor::scalar(1.0f64))];
    let want = run_graph(&graph, args.clone()).unwrap_err();
    assert!(want.message.contains("in iteration 2"), "{want}");
    for (how, exec) in executors(&graph) {
        let got = exec.run(args.clone()).unwrap_err();
        assert_eq!(got.kind, want.kind, "{how}");
        assert_eq!(got.message, want.message, "{how}");
    }
    let fused = Executor::new(&graph).unwrap();
    assert!(fused.run(args).is_err());
    assert_eq!(
        fused.frame_counts().native,
        1,
        "the pop failed inside machine code"
    );
}

/// A stack of five threaded through two loops; the inner one pops twice per outer trip, so
/// the pop fails in iteration 1 of the inner loop, in iteration 2 of the outer one.
const FAILS_IN_NESTED_ITERATION: &str = r#"graph @main
func @main(%0: f64[]) -> (f64[]) {
  %1 = stack_new() {element=f64[]} : stack<f64[]>
  %2 = stack_push(%1, %0) : stack<f64[]>
  %3 = stack_push(%2, %0) : stack<f64[]>
  %4 = stack_push(%3, %0) : stack<f64[]>
  %5 = stack_push(%4, %0) : stack<f64[]>
  %6 = stack_push(%5, %0) : stack<f64[]>
  %7 = const() {value=[0]} : i64[]
  %8 = while(%7, %0, %6) {cond=@outer_more, body=@outer, parallel_iterations=10} : (i64[], f64[], stack<f64[]>) loc("model.py":20)
  return %8#1
}
func @outer_more(%0: i64[], %1: f64[], %2: stack<f64[]>) -> (bool[]) {
  %3 = const() {value=[5]} : i64[]
  %4 = less(%0, %3) : bool[]
  return %4
}
func @outer(%0: i64[], %1: f64[], %2: stack<f64[]>) -> (i64[], f64[], stack<f64[]>) {
  %3 = const() {value=[0]} : i64[]
  %4 = while(%3, %1, %2) {cond=@inner_more, body=@inner, parallel_iterations=10} : (i64[], f64[], stack<f64[]>) loc("model.py":22)
  %5 = const() {value=[1]} : i64[]
  %6 = add(%0, %5) : i64[]
  return %6, %4#1, %4#2
}
func @inner_more(%0: i64[], %1: f64[], %2: stack<f64[]>) -> (bool[]) {
  %3 = const() {value=[2]} : i64[]
  %4 = less(%0, %3) : bool[]
  return %4
}
func @inner(%0: i64[], %1: f64[], %2: stack<f64[]>) -> (i64[], f64[], stack<f64[]>) {
  %3 = stack_pop(%2) : (stack<f64[]>, f64[]) loc("model.py":24)
  %4 = add(%1, %3#1) : f64[]
  %5 = const() {value=[1]} : i64[]
  %6 = add(%0, %5) : i64[]
  return %6, %4, %3#0
}"#;

#[test]
fn errors_in_fused_loop_nests_name_every_iteration_as_the_interpreter_does() {
    let graph = parse_graph(FAILS_IN_NESTED_ITERATION).unwrap();
    let fused = Executor::new(&graph).unwrap();
    let FrameCounts {
        compiled, total, ..
    } = fused.frame_counts();
    assert!(
        compiled == total && total >= 2,
        "the nest runs compiled: {compiled} of {total}"
    );
    assert_eq!(
        fused.graph().count("loop"),
        1,
        "one node for the nest:\n{}",
        fused.graph()
    );
    assert_eq!(fused.graph().count("enter"), 0, "{}", fused.graph());
    let args = vec![RtValue::from(Tensor::scalar(1.0f64))];
    let want = run_graph(&graph, args.clone()).unwrap_err();
    assert!(want.message.contains("in iteration 1\n"), "{want}");
    assert!(want.message.contains("in iteration 2\n"), "{want}");
    for (how, exec) in executors(&graph) {
        let got = exec.run(args.clone()).unwrap_err();
        assert_eq!(got.kind, want.kind, "{how}");
        assert_eq!(got.message, want.message, "{how}");
    }
    assert!(fused.run(args).is_err());
    assert_eq!(
        fused.frame_counts().native,
        2,
        "both loops ran as machine code"
    );
}

#[test]
fn cheap_loops_fuse_and_loops_of_large_products_stay_frames() {
    let count = parse_graph(COUNT).unwrap();
    let fused = Executor::new(&count).unwrap();
    let text = fused.graph().to_string();
    assert_eq!(fused.graph().count("loop"), 1, "{text}");
    for name in ["switch", "merge", "enter", "exit", "next_iteration"] {
        assert_eq!(fused.graph().count(name), 0, "{name} in\n{text}");
    }
    let frames = Executor::with_loops(&count, Loops::Frames).unwrap();
    assert_eq!(frames.graph().count("loop"), 0);
    assert!(frames.graph().count("enter") > 0);
    assert!(fused.is_one_program(), "every node is cheap: one pass");
    assert!(!frames.is_one_program());
    let product = parse_graph(MATMUL_LOOP).unwrap();
    let exec = Executor::new(&product).unwrap();
    assert_eq!(exec.graph().count("loop"), 0, "{}", exec.graph());
    assert!(!exec.is_one_program());
    assert_eq!(exec.graph().count("matmul"), 1);
    check_against_interpreter("count", &count);
    check_against_interpreter("matmul loop", &product);
}

/// A loop of 256x256 products: worth threads, so it stays a frame.
const MATMUL_LOOP: &str = r#"graph @main
func @main(%0: f32[256,256], %1: i64[]) -> (f32[256,256]) {
  %2 = const() {value=[0]} : i64[]
  %3 = while(%2, %0, %1) {cond=@more, body=@step, parallel_iterations=10} : (i64[], f32[256,256], i64[])
  return %3#1
}
func @more(%0: i64[], %1: f32[256,256], %2: i64[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[]
  return %3
}
func @step(%0: i64[], %1: f32[256,256], %2: i64[]) -> (i64[], f32[256,256], i64[]) {
  %3 = const() {value=[1]} : i64[]
  %4 = add(%0, %3) : i64[]
  %5 = matmul(%1, %1) {transpose_a=false, transpose_b=false} : f32[256,256]
  %6 = const() {value=[0.001]} : f32[]
  %7 = mul(%5, %6) : f32[256,256]
  return %4, %7, %2
}"#;

/// `%2#1` is the loop's invariant: what reads it need not wait for the loop.
const INVARIANT_READER: &str = r#"graph @main
func @main(%0: i64[], %1: f64[]) -> (i64[], f64[]) {
  %2 = while(%0, %1) {cond=@more, body=@step, parallel_iterations=10} : (i64[], f64[])
  %3 = exp(%2#1) : f64[]
  return %2#0, %3
}
func @more(%0: i64[], %1: f64[]) -> (bool[]) {
  %2 = const() {value=[100]} : i64[]
  %3 = less(%0, %2) : bool[]
  return %3
}
func @step(%0: i64[], %1: f64[]) -> (i64[], f64[]) {
  %2 = const() {value=[1]} : i64[]
  %3 = add(%0, %2) : i64[]
  return %3, %1
}"#;

#[test]
fn a_node_after_a_loop_starts_when_its_inputs_are_ready() {
    let graph = parse_graph(INVARIANT_READER).unwrap();
    let lowered = lower(&graph).unwrap();
    let exp = lowered
        .nodes
        .iter()
        .position(|n| n.kind.name() == "exp")
        .unwrap();
    let exp_input = lowered.nodes[exp].inputs[0].node;
    assert_eq!(
        lowered.nodes[exp_input].kind.name(),
        "arg",
        "exp reads the loop's input"
    );
    let exec = Executor::from_dataflow(lowered).unwrap().with_threads(1);
    let out = exec
        .run(vec![
            RtValue::from(Tensor::scalar(0i64)),
            RtValue::from(Tensor::scalar(0.5f64)),
        ])
        .unwrap();
    assert_eq!(out[0].as_tensor().unwrap().item_f64().unwrap(), 100.0);
    assert_eq!(
        out[1].as_tensor().unwrap().item_f64().unwrap(),
        0.5f64.exp()
    );
}

#[test]
fn parallel_iterations_and_threads_do_not_change_results() {
    let graph =
        parse_graph(&MIXED.replace("parallel_iterations=10", "parallel_iterations=1")).unwrap();
    check_against_interpreter("mixed, one iteration at a time", &graph);
    let graph = parse_graph(MIXED).unwrap();
    check_against_interpreter("mixed", &graph);
}

/// The inner loop runs no trip; its invariant (`%6`, only the body reads it) arrives after the
/// inner frame's first iteration has nothing left to do, and the outer loop runs one
/// iteration at a time, so it waits for the inner frame to be complete.
const LATE_INVARIANT: &str = r#"graph @main
func @main(%0: f64[], %1: i64[]) -> (f64[], i64[]) {
  %2 = const() {value=[0]} : i64[]
  %3 = while(%0, %2, %1) {cond=@outer_more, body=@outer_step, parallel_iterations=1} : (f64[], i64[], i64[])
  return %3#0, %3#1
}
func @outer_more(%0: f64[], %1: i64[], %2: i64[]) -> (bool[]) {
  %3 = less(%1, %2) : bool[]
  return %3
}
func @outer_step(%0: f64[], %1: i64[], %2: i64[]) -> (f64[], i64[], i64[]) {
  %3 = sin(%0) : f64[]
  %4 = cos(%3) : f64[]
  %5 = exp(%4) : f64[]
  %6 = tanh(%5) : f64[]
  %7 = const() {value=[0]} : i64[]
  %8 = while(%0, %7, %6) {cond=@never, body=@inner_step, parallel_iterations=10} : (f64[], i64[], f64[])
  %9 = const() {value=[1]} : i64[]
  %10 = add(%1, %9) : i64[]
  %11 = add(%8#0, %6) : f64[]
  return %11, %10, %2
}
func @never(%0: f64[], %1: i64[], %2: f64[]) -> (bool[]) {
  %3 = const() {value=[0]} : i64[]
  %4 = less(%1, %3) : bool[]
  return %4
}
func @inner_step(%0: f64[], %1: i64[], %2: f64[]) -> (f64[], i64[], f64[]) {
  %3 = mul(%0, %2) : f64[]
  %4 = const() {value=[1]} : i64[]
  %5 = add(%1, %4) : i64[]
  return %3, %5, %2
}"#;

#[test]
fn a_frame_completes_when_its_last_enter_arrives_after_its_work() {
    let graph = parse_graph(LATE_INVARIANT).unwrap();
    check_against_interpreter("late invariant", &graph);
    let args = vec![
        RtValue::from(Tensor::scalar(0.3f64)),
        RtValue::from(Tensor::scalar(4i64)),
    ];
    for (how, exec) in executors(&graph) {
        let out = exec.run(args.clone()).unwrap();
        assert_eq!(
            out[1].as_tensor().unwrap().item_f64().unwrap(),
            4.0,
            "{how}"
        );
    }
}

#[test]
fn relu_grad_passes_g_where_x_is_positive_writing_into_g() {
    use crate::ops::{binary, Op};
    let x: Vec<f64> = (0..40).map(|k| f64::from(k % 5) - 2.0).collect();
    let mut x_nan = x.clone();
    x_nan[3] = f64::NAN;
    let g: Vec<f64> = (0..40).map(|k| f64::from(k) + 0.5).collect();
    let want: Vec<f64> = x_nan
        .iter()
        .zip(&g)
        .map(|(&x, &g)| if x > 0.0 { g } else { 0.0 })
        .collect();
    let (x, g) = (
        Tensor::from_vec(x_nan, &[40]).unwrap(),
        Tensor::from_vec(g, &[40]).unwrap(),
    );
    let op = Op::from(binary::ReluGrad);
    let out = [g.ty().clone()];
    assert_eq!(
        op.compute(&[x.clone(), g.clone()], &out).unwrap()[0].to_f64_vec(),
        want
    );
    let owned = Tensor::from_vec(g.to_f64_vec(), &[40]).unwrap();
    let ptr = owned.as_slice::<f64>().unwrap().as_ptr();
    // x is saved for the backward pass, so held elsewhere: the result goes into g's buffer.
    let got = op
        .compute_owned(&mut vec![x.clone(), owned], &out)
        .unwrap()
        .remove(0);
    assert_eq!(got.to_f64_vec(), want);
    assert_eq!(
        got.as_slice::<f64>().unwrap().as_ptr(),
        ptr,
        "written into g"
    );
    assert!(x.to_f64_vec()[3].is_nan(), "x keeps its values");
    let xi = Tensor::from_vec(vec![-1i32, 0, 2], &[3]).unwrap();
    let gi = Tensor::from_vec(vec![5i32, 6, 7], &[3]).unwrap();
    let got = op.compute(&[xi, gi.clone()], &[gi.ty().clone()]).unwrap();
    assert_eq!(got[0].to_f64_vec(), vec![0.0, 0.0, 7.0]);
}

#[test]
fn elementwise_ops_write_into_uniquely_held_inputs_only() {
    use crate::ops::{binary, unary, Op};
    // Larger than the inline buffer: its elements are shared by `Arc`.
    let values: Vec<f64> = (0..40).map(|k| f64::from(k) - 2.5).collect();
    let a = || Tensor::from_vec(values.clone(), &[40]).unwrap();
    assert!(!a().is_small());
    let b = Tensor::scalar(0.5f64);
    let mul = Op::from(binary::Mul);
    let out = [a().ty().clone()];
    let want = mul.compute(&[a(), b.clone()], &out).unwrap()[0].to_f64_vec();
    // Uniquely held: written in place, under a new identity.
    let owned = a();
    let (id, ptr) = (owned.id(), owned.as_slice::<f64>().unwrap().as_ptr());
    let got = mul
        .compute_owned(&mut vec![owned, b.clone()], &out)
        .unwrap()
        .remove(0);
    assert_eq!(got.to_f64_vec(), want);
    assert_eq!(
        got.as_slice::<f64>().unwrap().as_ptr(),
        ptr,
        "the buffer is reused"
    );
    assert_ne!(got.id(), id);
    // Shared (a scalar first operand broadcast into the other, too): the other holder keeps
    // its values.
    let shared = a();
    let keep = shared.clone();
    let got = mul
        .compute_owned(&mut vec![b.clone(), shared], &out)
        .unwrap()
        .remove(0);
    assert_eq!(got.to_f64_vec(), want);
    assert_eq!(keep.to_f64_vec(), values);
    let sin = Op::from(unary::Sin);
    let got = sin.compute_owned(&mut vec![a()], &out).unwrap().remove(0);
    assert_eq!(
        got.to_f64_vec(),
        sin.compute(&[a()], &out).unwrap()[0].to_f64_vec()
    );
}

/// Two cotangent stacks summed: tops added to tops, the longer stack's bottom kept.
const STACK_SUM: &str = r#"graph @main
func @main(%0: f64[2], %1: f64[2], %2: f64[2]) -> (f64[2], f64[2], f64[2], f64[2]) {
  %3 = stack_new() {element=f64[2]} : stack<f64[2]>
  %4 = stack_push(%3, %0) : stack<f64[2]>
  %5 = stack_push(%4, %1) : stack<f64[2]>
  %6 = stack_push(%5, %2) : stack<f64[2]>
  %7 = stack_new() {element=f64[2]} : stack<f64[2]>
  %8 = stack_push(%7, %2) : stack<f64[2]>
  %9 = stack_add(%6, %8) : stack<f64[2]>
  %10 = stack_pop(%9) : (stack<f64[2]>, f64[2])
  %11 = stack_pop(%10#0) : (stack<f64[2]>, f64[2])
  %12 = stack_pop(%11#0) : (stack<f64[2]>, f64[2])
  %13 = stack_add(%7, %8) : stack<f64[2]>
  %14 = stack_pop(%13) : (stack<f64[2]>, f64[2])
  return %10#1, %11#1, %12#1, %14#1
}"#;

#[test]
fn a_stack_sum_adds_tops_and_keeps_the_longer_bottom() {
    let graph = parse_graph(STACK_SUM).unwrap();
    assert_eq!(
        parse_graph(&graph.to_string()).unwrap().to_string(),
        graph.to_string()
    );
    let row = |a: f64, b: f64| RtValue::from(Tensor::from_vec(vec![a, b], &[2]).unwrap());
    let args = || vec![row(1.0, 2.0), row(3.0, 4.0), row(5.0, 6.0)];
    let want = [
        vec![10.0, 12.0],
        vec![3.0, 4.0],
        vec![1.0, 2.0],
        vec![5.0, 6.0],
    ];
    let exec = Executor::new(&graph).unwrap();
    for outs in [
        run_graph(&graph, args()).unwrap(),
        exec.run(args()).unwrap(),
    ] {
        for (out, want) in outs.into_iter().zip(&want) {
            assert_eq!(&out.into_tensor().unwrap().to_f64_vec(), want);
        }
    }
}

/// W5's loop: a float32 vector and an int32 counter (the `executor_loop` example's).
const TINY_LOOP: &str = include_str!("../../examples/tiny_loop.graph");

#[test]
fn frames_of_static_types_compile_and_agree_with_their_programs_bit_for_bit() {
    // In check mode (the crate's tests' default) every compiled frame's run is compared with
    // its program's, bits and errors, and a difference fails the run; `make test` runs these
    // tests again as production runs them (`GRADLOOP_COMPILED_FRAMES=on`).
    for text in [TINY_LOOP, COUNT, INVARIANT_READER] {
        let graph = parse_graph(text).unwrap();
        let FrameCounts {
            compiled, total, ..
        } = Executor::new(&graph).unwrap().frame_counts();
        assert!(
            total > 0 && compiled == total,
            "{compiled} of {total}:\n{text}"
        );
    }
    let graph = parse_graph(TINY_LOOP).unwrap();
    let exec = Executor::new(&graph).unwrap();
    let x: Vec<f32> = (0..16).map(|k| 0.1 + 0.1 * k as f32).collect();
    let args = || {
        vec![
            RtValue::from(Tensor::from_vec(x.clone(), &[16]).unwrap()),
            RtValue::from(Tensor::scalar(300i32)),
        ]
    };
    let want = run_graph(&graph, args()).unwrap();
    assert_eq!(
        exec.frame_counts().native,
        0,
        "machine code is made at a frame's first run"
    );
    let got = exec.run(args()).unwrap();
    assert!(same_bits(&got[0], &want[0]));
    assert_eq!(
        exec.frame_counts().native,
        1,
        "the loop ran as machine code"
    );
    // Run again on the kept buffers, and with inputs of another shape (the program runs them).
    assert!(same_bits(&exec.run(args()).unwrap()[0], &want[0]));
    let mut mismatched = args();
    mismatched[1] = RtValue::from(Tensor::from_vec(vec![3i32], &[1]).unwrap());
    assert!(
        exec.run(mismatched).is_err(),
        "the parameters are checked first"
    );
}

/// A loop over a vector of unknown length.
const DOUBLING: &str = r#"graph @main
func @main(%0: f64[?], %1: i64[]) -> (f64[?]) {
  %2 = const() {value=[0]} : i64[]
  %3 = while(%2, %0, %1) {cond=@more, body=@step, parallel_iterations=10} : (i64[], f64[?], i64[])
  return %3#1
}
func @more(%0: i64[], %1: f64[?], %2: i64[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[]
  return %3
}
func @step(%0: i64[], %1: f64[?], %2: i64[]) -> (i64[], f64[?], i64[]) {
  %3 = const() {value=[1]} : i64[]
  %4 = add(%0, %3) : i64[]
  %5 = add(%1, %1) : f64[?]
  return %4, %5, %2
}"#;

#[test]
fn frames_with_stacks_or_unknown_shapes_keep_their_programs() {
    let graph = parse_graph(DOUBLING).unwrap();
    let compiled = Executor::new(&graph).unwrap().frame_counts().compiled;
    assert_eq!(compiled, 0);
    check_against_interpreter("doubling", &graph);
    for (name, graph) in examples::all() {
        let exec = Executor::new(&graph).unwrap();
        let text = exec.graph().to_string();
        let FrameCounts {
            compiled, total, ..
        } = exec.frame_counts();
        if text.contains("stack") || text.contains('?') {
            continue;
        }
        assert_eq!(
            compiled, total,
            "{name}: every frame of static types compiles\n{text}"
        );
    }
}

#[test]
fn check_mode_reports_a_compiled_frame_that_parts_from_its_program() {
    let one = RtValue::from(Tensor::scalar(1.0f32));
    let nan = |bits: u32| RtValue::from(Tensor::scalar(f32::from_bits(bits)));
    assert!(same_bits(&one, &one.clone()));
    assert!(same_bits(&nan(0x7fc0_0000), &nan(0x7fc0_0000)));
    assert!(
        !same_bits(&nan(0x7fc0_0000), &nan(0x7fc0_0001)),
        "NaN payloads count"
    );
    assert!(!same_bits(&one, &RtValue::from(Tensor::scalar(1.0f64))));
    assert!(!same_bits(
        &RtValue::from(Tensor::scalar(0.0f32)),
        &RtValue::from(Tensor::scalar(-0.0f32))
    ));
}

/// An RNN's backward loop in small: two accumulated outer products (the product on either
/// side of the add), the vector they share also read between a product and its add.
const RANK_ONE: &str = r#"graph @main
func @main(%0: f32[3, 4], %1: f32[4, 3], %2: f32[1, 3], %3: f32[1, 4], %4: f32[4, 4]) -> (f32[3, 4], f32[4, 3], f32[1, 4]) {
  %5 = const() {value=[0]} : i64[]
  %6 = while(%5, %0, %1, %2, %3, %4, %3) {cond=@more, body=@step, parallel_iterations=10} : (i64[], f32[3, 4], f32[4, 3], f32[1, 3], f32[1, 4], f32[4, 4], f32[1, 4])
  return %6#1, %6#2, %6#6
}
func @more(%0: i64[], %1: f32[3, 4], %2: f32[4, 3], %3: f32[1, 3], %4: f32[1, 4], %5: f32[4, 4], %6: f32[1, 4]) -> (bool[]) {
  %7 = const() {value=[5]} : i64[]
  %8 = less(%0, %7) : bool[]
  return %8
}
func @step(%0: i64[], %1: f32[3, 4], %2: f32[4, 3], %3: f32[1, 3], %4: f32[1, 4], %5: f32[4, 4], %6: f32[1, 4]) -> (i64[], f32[3, 4], f32[4, 3], f32[1, 3], f32[1, 4], f32[4, 4], f32[1, 4]) {
  %7 = const() {value=[1]} : i64[]
  %8 = add(%0, %7) : i64[]
  %9 = matmul(%3, %4) {transpose_a=true, transpose_b=false} : f32[3, 4]
  %10 = matmul(%4, %5) {transpose_a=false, transpose_b=true} : f32[1, 4]
  %11 = add(%1, %9) : f32[3, 4]
  %12 = matmul(%4, %3) {transpose_a=true, transpose_b=false} : f32[4, 3]
  %13 = add(%12, %2) : f32[4, 3]
  %14 = tanh(%10) : f32[1, 4]
  %15 = add(%6, %14) : f32[1, 4]
  return %8, %11, %13, %3, %4, %5, %15
}"#;

/// `RANK_ONE`'s inputs, the accumulator `%0` given.
fn rank_one_args(first: Vec<f32>) -> Vec<RtValue> {
    let tensor = |v: Vec<f32>, shape: &[usize]| RtValue::from(Tensor::from_vec(v, shape).unwrap());
    vec![
        tensor(first, &[3, 4]),
        tensor((0..12).map(|k| [-0.0, 1.5, -2.0][k % 3]).collect(), &[4, 3]),
        tensor(vec![0.0, -0.5, 3.0], &[1, 3]),
        tensor(vec![-1.0, 0.0, 0.25, -0.0], &[1, 4]),
        tensor((0..16).map(|k| (k as f32 - 7.5) * 0.1).collect(), &[4, 4]),
    ]
}

/// Runs `graph` twice through `exec` (in check mode, which also compares the compiled frame
/// with its program) and compares every output bit for bit with the interpreter's.
fn runs_bit_for_bit(exec: &Executor, graph: &Graph, args: impl Fn() -> Vec<RtValue>) {
    let want = run_graph(graph, args()).unwrap();
    for _ in 0..2 {
        let got = exec.run(args()).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(same_bits(g, w), "{g:?} != {w:?}");
        }
    }
}

#[test]
fn accumulated_outer_products_run_as_rank_one_updates_bit_for_bit() {
    let graph = parse_graph(RANK_ONE).unwrap();
    let exec = Executor::new(&graph).unwrap();
    // Both adds take their products; both accumulators are read for the last time there, so
    // both are updated in place.
    assert_eq!(rank_one_updates(&exec), [2, 2]);
    // Signed zeros: -0 + 0 * -1 stays -0 only if the product is rounded on its own and then
    // added, as the unfused ops compute it (a product added to +0 would make it +0).
    runs_bit_for_bit(&exec, &graph, || rank_one_args(vec![-0.0; 12]));
    assert_eq!(
        exec.frame_counts().native,
        1,
        "the loop ran as machine code"
    );
    check_against_interpreter("rank one", &graph);
}

#[test]
fn an_accumulator_read_after_its_update_is_not_updated_in_place() {
    // %2 is read again after its update: that add writes a buffer of its own.
    let text = RANK_ONE
        .replace(
            "  %13 = add(%12, %2) : f32[4, 3]\n",
            "  %13 = add(%12, %2) : f32[4, 3]\n  %16 = sub(%13, %2) : f32[4, 3]\n",
        )
        .replace("return %8, %11, %13,", "return %8, %11, %16,");
    let graph = parse_graph(&text).unwrap();
    let exec = Executor::new(&graph).unwrap();
    assert_eq!(rank_one_updates(&exec), [2, 1]);
    runs_bit_for_bit(&exec, &graph, || {
        rank_one_args((0..12).map(|k| k as f32 * 0.5 - 2.0).collect())
    });
    check_against_interpreter("rank one, accumulator read after", &graph);
}

/// Pushes `x` (scaled each time) while the counter is below `%1`, then pops `%2` items into
/// a sum: more pops than pushes fail. `ITEM` is the stack's item type.
const PUSH_THEN_POP: &str = r#"graph @main
func @main(%0: ITEM, %1: i64[], %2: i64[]) -> (ITEM, ITEM) {
  %3 = stack_new() {element=ITEM} : stack<ITEM>
  %4 = const() {value=[0]} : i64[]
  %5 = while(%4, %1, %0, %3) {cond=@more, body=@push, parallel_iterations=10} : (i64[], i64[], ITEM, stack<ITEM>)
  %6 = sub(%0, %0) : ITEM
  %7 = while(%2, %5#3, %6) {cond=@left, body=@pop, parallel_iterations=10} : (i64[], stack<ITEM>, ITEM)
  return %5#2, %7#2
}
func @more(%0: i64[], %1: i64[], %2: ITEM, %3: stack<ITEM>) -> (bool[]) {
  %4 = less(%0, %1) : bool[]
  return %4
}
func @push(%0: i64[], %1: i64[], %2: ITEM, %3: stack<ITEM>) -> (i64[], i64[], ITEM, stack<ITEM>) {
  %4 = const() {value=[1]} : i64[]
  %5 = add(%0, %4) : i64[]
  %6 = mul(%2, %2) : ITEM
  %7 = sub(%6, %2) : ITEM
  %8 = stack_push(%3, %7) : stack<ITEM>
  return %5, %1, %7, %8
}
func @left(%0: i64[], %1: stack<ITEM>, %2: ITEM) -> (bool[]) {
  %3 = const() {value=[0]} : i64[]
  %4 = greater(%0, %3) : bool[]
  return %4
}
func @pop(%0: i64[], %1: stack<ITEM>, %2: ITEM) -> (i64[], stack<ITEM>, ITEM) {
  %3 = const() {value=[1]} : i64[]
  %4 = sub(%0, %3) : i64[]
  %5 = stack_pop(%1) : (stack<ITEM>, ITEM)
  %6 = add(%2, %5#1) : ITEM
  return %4, %5#0, %6
}"#;

#[test]
fn machine_code_pushes_and_pops_in_place_and_falls_back_for_tensor_items_and_empty_stacks() {
    // 4 float64s are packed; 1024 (8 KiB) are kept as tensors, which the general step pushes.
    for n in [4usize, 1024] {
        let graph = parse_graph(&PUSH_THEN_POP.replace("ITEM", &format!("f64[{n}]"))).unwrap();
        let exec = Executor::new(&graph).unwrap();
        let args = |pops: i64| {
            let x: Vec<f64> = (0..n).map(|k| 0.5 + (k % 7) as f64 * 0.25).collect();
            vec![
                RtValue::from(Tensor::from_vec(x, &[n]).unwrap()),
                RtValue::from(Tensor::scalar(5i64)),
                RtValue::from(Tensor::scalar(pops)),
            ]
        };
        runs_bit_for_bit(&exec, &graph, || args(5));
        runs_bit_for_bit(&exec, &graph, || args(3));
        let want = run_graph(&graph, args(6)).unwrap_err();
        assert!(want.message.contains("pop from an empty"), "{want}");
        for _ in 0..2 {
            let got = exec.run(args(6)).unwrap_err();
            assert_eq!(
                (got.kind, &got.message),
                (want.kind, &want.message),
                "n={n}"
            );
        }
        assert_eq!(
            exec.frame_counts().native,
            3,
            "n={n}: the root and both loops ran as machine code"
        );
        check_against_interpreter(&format!("push then pop, f64[{n}]"), &graph);
    }
}

/// A loop writing rows of a buffer it carries, nested in a loop that reads a row of it before
/// the inner loop and passes it on: the inner loop's buffer moves in and out of its frame, and
/// its row writes update in place.
const ROW_WRITES: &str = r#"graph @main
func @main(%0: f32[4, 3], %1: f32[3]) -> (f32[4, 3], f32[3]) {
  %2 = const() {value=[0]} : i64[]
  %3 = while(%2, %0, %1) {cond=@outer_more, body=@outer, parallel_iterations=10} : (i64[], f32[4, 3], f32[3])
  return %3#1, %3#2
}
func @outer_more(%0: i64[], %1: f32[4, 3], %2: f32[3]) -> (bool[]) {
  %3 = const() {value=[3]} : i64[]
  %4 = less(%0, %3) : bool[]
  return %4
}
func @outer(%0: i64[], %1: f32[4, 3], %2: f32[3]) -> (i64[], f32[4, 3], f32[3]) {
  %3 = const() {value=[1]} : i64[]
  %4 = add(%0, %3) : i64[]
  %5 = const() {value=[0]} : i64[]
  %6 = dynamic_slice(%1, %0, %5) {sizes=[1, 3]} : f32[1, 3]
  %7 = reshape(%6) {shape=[3]} : f32[3]
  %8 = while(%5, %1, %7) {cond=@inner_more, body=@inner, parallel_iterations=10} : (i64[], f32[4, 3], f32[3])
  %9 = add(%2, %8#2) : f32[3]
  return %4, %8#1, %9
}
func @inner_more(%0: i64[], %1: f32[4, 3], %2: f32[3]) -> (bool[]) {
  %3 = const() {value=[2]} : i64[]
  %4 = less(%0, %3) : bool[]
  return %4
}
func @inner(%0: i64[], %1: f32[4, 3], %2: f32[3]) -> (i64[], f32[4, 3], f32[3]) {
  %3 = const() {value=[1]} : i64[]
  %4 = add(%0, %3) : i64[]
  %5 = mul(%2, %2) : f32[3]
  %6 = reshape(%5) {shape=[1, 3]} : f32[1, 3]
  %7 = const() {value=[0]} : i64[]
  %8 = dynamic_update_slice(%1, %6, %4, %7) : f32[4, 3]
  return %4, %8, %5
}"#;

#[test]
fn nested_loops_move_their_buffers_and_update_rows_in_place_bit_for_bit() {
    let graph = parse_graph(ROW_WRITES).unwrap();
    let exec = Executor::new(&graph).unwrap();
    assert_eq!(slice_updates_in_place(&exec), 1);
    let args = || {
        let buffer = (0..12).map(|k| k as f32 * 0.25 - 1.0).collect();
        vec![
            RtValue::from(Tensor::from_vec::<f32>(buffer, &[4, 3]).unwrap()),
            RtValue::from(Tensor::from_vec(vec![0.5f32, -1.5, 2.0], &[3]).unwrap()),
        ]
    };
    runs_bit_for_bit(&exec, &graph, args);
    check_against_interpreter("row writes", &graph);
}

#[test]
fn a_loop_is_compiled_once_and_shared_by_whoever_runs_it() {
    let graph = parse_graph(ROW_WRITES).unwrap();
    let exec = Executor::new(&graph).unwrap();
    let root = exec.root.as_ref().expect("every node is cheap: one pass");
    // The plan's loop nodes hold the root's own nested loops, not copies.
    let planned: Vec<&Arc<FusedLoop>> = exec.plan.nodes.iter().flat_map(|n| &n.fused).collect();
    assert_eq!(planned.len(), 1);
    assert_eq!(root.nested().len(), 1);
    assert!(Arc::ptr_eq(planned[0], &root.nested()[0]));
    // A buffer frame runs its nested loops' own buffer frames: one per loop in all.
    fn shares(fused: &FusedLoop) -> usize {
        let frame = fused.buffers().expect("static types: compiled");
        assert_eq!(frame.nested_frames().len(), fused.nested().len());
        let pairs = frame.nested_frames().iter().zip(fused.nested());
        for (frame, inner) in pairs {
            assert!(Arc::ptr_eq(frame, inner.buffers().expect("compiled")));
        }
        1 + fused
            .nested()
            .iter()
            .map(|inner| shares(inner))
            .sum::<usize>()
    }
    assert_eq!(shares(root), 3, "the root, the loop, the loop inside it");
    assert_eq!(exec.frame_counts().total, 3);
}

/// A loop whose body factors a matrix (`lu_factor`: three outputs, no destination kernel of its
/// own) and solves with the factors.
const FACTOR_LOOP: &str = r#"graph @main
func @main(%0: f64[3, 3], %1: f64[3], %2: i32[]) -> (f64[3]) {
  %3 = const() {value=[0]} : i32[]
  %4 = while(%3, %0, %1, %2) {cond=@more, body=@step, parallel_iterations=10} : (i32[], f64[3, 3], f64[3], i32[])
  return %4#2
}
func @more(%0: i32[], %1: f64[3, 3], %2: f64[3], %3: i32[]) -> (bool[]) {
  %4 = less(%0, %3) : bool[]
  return %4
}
func @step(%0: i32[], %1: f64[3, 3], %2: f64[3], %3: i32[]) -> (i32[], f64[3, 3], f64[3], i32[]) {
  %4 = const() {value=[1]} : i32[]
  %5 = add(%0, %4) : i32[]
  %6 = lu_factor(%1) : (f64[3, 3], i32[3], i32[3])
  %7 = reshape(%2) {shape=[3, 1]} : f64[3, 1]
  %8 = lu_solve(%6#0, %6#2, %7) {trans=false} : f64[3, 1]
  %9 = reshape(%8) {shape=[3]} : f64[3]
  %10 = add(%9, %2) : f64[3]
  return %5, %1, %10, %3
}"#;

#[test]
fn ops_without_destination_kernels_and_with_several_outputs_run_in_machine_code() {
    let graph = parse_graph(FACTOR_LOOP).unwrap();
    let exec = Executor::new(&graph).unwrap();
    let FrameCounts {
        compiled, total, ..
    } = exec.frame_counts();
    assert!(total > 0 && compiled == total, "{compiled} of {total}");
    let a = vec![4.0, 1.0, 0.5, 2.0, 5.0, 1.0, 0.3, 1.5, 3.0];
    let args = || {
        vec![
            RtValue::from(Tensor::from_vec(a.clone(), &[3, 3]).unwrap()),
            RtValue::from(Tensor::from_vec(vec![1.0, -2.0, 0.5], &[3]).unwrap()),
            RtValue::from(Tensor::scalar(7i32)),
        ]
    };
    let want = run_graph(&graph, args()).unwrap();
    for _ in 0..2 {
        let got = exec.run(args()).unwrap();
        assert!(same_bits(&got[0], &want[0]));
    }
    assert_eq!(
        exec.frame_counts().native,
        1,
        "the loop ran as machine code"
    );
}

/// Each step of the buffer frames of `exec`'s fused loops (and of the loops nested in them,
/// each once), with the steps it is in: what the tests below count.
pub(crate) fn compiled_steps(exec: &Executor) -> Vec<(&Steps, &BufferStep)> {
    fn of_loop<'a>(fused: &'a FusedLoop, out: &mut Vec<(&'a Steps, &'a BufferStep)>) {
        if let Some(frame) = fused.buffers() {
            let steps = frame.steps();
            out.extend(steps.steps.iter().map(|step| (steps, step)));
        }
        for inner in fused.nested() {
            of_loop(inner, out);
        }
    }
    let mut out = Vec::new();
    for fused in exec.fused_loops() {
        of_loop(fused, &mut out);
    }
    out
}

fn is_add(steps: &Steps, step: &BufferStep) -> bool {
    matches!(&steps.fused.nodes[step.node].kind, DfKind::Op(op) if op.name() == "add")
}

/// How many rank-one updates `exec`'s compiled frames run (`rank_one`), and how many of them
/// in place.
fn rank_one_updates(exec: &Executor) -> [usize; 2] {
    let counts = compiled_steps(exec).into_iter().map(|(frame, step)| {
        let fused = usize::from(step.reads.len() == 3 && is_add(frame, step));
        match &step.action {
            BufferAction::Kernel(_) => [fused, 0],
            BufferAction::Update(_) => [fused, fused],
            _ => [0, 0],
        }
    });
    counts.fold([0, 0], |s, c| [s[0] + c[0], s[1] + c[1]])
}

/// How many steps of `exec`'s compiled frames update a slice in place (`in_place`).
fn slice_updates_in_place(exec: &Executor) -> usize {
    let steps = compiled_steps(exec).into_iter();
    steps
        .filter(|(frame, step)| {
            matches!(step.action, BufferAction::Update(_)) && !is_add(frame, step)
        })
        .count()
}
