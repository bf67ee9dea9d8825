//! The simplification passes against the interpreter: each result equals the original's, the
//! text shows what was simplified, and lazy semantics survive.

use super::{eliminate_common_subexpressions, eliminate_dead_branches, fold_constants};
use crate::graph::{parse_graph, verify, Graph};
use crate::interpret::{run_graph, RtValue};
use crate::tensor::Tensor;

fn run(g: &Graph, x: &[f64]) -> crate::error::Result<Vec<Vec<f64>>> {
    verify(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    let args = vec![RtValue::Tensor(Tensor::from_vec(x.to_vec(), &[x.len()])?)];
    Ok(run_graph(g, args)?
        .into_iter()
        .map(|r| r.into_tensor().unwrap().to_f64_vec())
        .collect())
}

fn entry_text(g: &Graph) -> String {
    let text = g.to_string();
    text.split("\nfunc @")
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

const FOLDABLE: &str = r#"graph @main

func @main(%0: f64[2]) -> (f64[2], f64[2]) {
  %1 = const() {value=[1.5, 2.0]} : f64[2]
  %2 = const() {value=[0.5, -1.0]} : f64[2]
  %3 = add(%1, %2) : f64[2]
  %4 = mul(%3, %3) : f64[2]
  %5 = mul(%0, %4) : f64[2]
  %6 = sin(%0) : f64[2]
  %7 = sin(%0) : f64[2]
  %8 = add(%6, %7) : f64[2]
  return %5, %8
}
"#;

#[test]
fn folding_evaluates_constant_ops_and_keeps_the_results() {
    let g = parse_graph(FOLDABLE).unwrap();
    let folded = fold_constants(&g).unwrap();
    let x = [0.3, -2.0];
    assert_eq!(run(&folded, &x).unwrap(), run(&g, &x).unwrap());
    let text = entry_text(&folded);
    assert!(text.contains("value=[4.0, 1.0]"), "{text}");
    assert_eq!(
        text.matches("mul(").count(),
        1,
        "only the op over %0 stays: {text}"
    );
}

#[test]
fn cse_merges_equal_pure_nodes_only() {
    let g = parse_graph(FOLDABLE).unwrap();
    let merged = eliminate_common_subexpressions(&g).unwrap();
    let x = [0.3, -2.0];
    assert_eq!(run(&merged, &x).unwrap(), run(&g, &x).unwrap());
    let text = entry_text(&merged);
    assert_eq!(text.matches("sin(").count(), 1, "{text}");
    assert_eq!(
        text.matches("mul(").count(),
        2,
        "different inputs stay apart: {text}"
    );
}

const BRANCHES: &str = r#"graph @main

func @main(%0: f64[2]) -> (f64[2], f64[2]) {
  %1 = const() {value=[false]} : bool[]
  %2 = if(%1, %0) {then=@bad, else=@twice} : f64[2]
  %3 = const() {value=[7]} : i32[]
  %4 = case(%3, %0) {branches=[@bad, @twice, @square]} : f64[2]
  return %2, %4
}

func @bad(%0: f64[2]) -> (f64[2]) {
  %1 = const() {value=[5]} : i64[1]
  %2 = const() {value=[1.0, 2.0]} : f64[2]
  %3 = take(%2, %1) {axis=0} : f64[1]
  %4 = broadcast_to(%3) {shape=[2]} : f64[2]
  %5 = add(%0, %4) : f64[2]
  return %5
}

func @twice(%0: f64[2]) -> (f64[2]) {
  %1 = add(%0, %0) : f64[2]
  return %1
}

func @square(%0: f64[2]) -> (f64[2]) {
  %1 = mul(%0, %0) : f64[2]
  return %1
}
"#;

#[test]
fn dead_branches_become_calls_of_the_branch_taken() {
    let g = parse_graph(BRANCHES).unwrap_or_else(|e| panic!("{e}"));
    let x = [0.3, -2.0];
    let expected = run(&g, &x).unwrap();
    assert_eq!(expected, vec![vec![0.6, -4.0], vec![0.09, 4.0]]);
    let pruned = eliminate_dead_branches(&g).unwrap();
    assert_eq!(run(&pruned, &x).unwrap(), expected);
    let text = entry_text(&pruned);
    assert!(!text.contains("if(") && !text.contains("case("), "{text}");
    assert!(text.contains("{function=@twice}") && text.contains("{function=@square}"));
}

#[test]
fn an_op_that_would_fail_is_not_folded() {
    // @bad indexes row 5 of 2 constants: it fails when it runs, so folding must leave it to
    // run (never, here: the branch is not taken).
    let g = parse_graph(BRANCHES).unwrap();
    let folded = fold_constants(&g).unwrap();
    assert!(folded.to_string().contains("take("));
    let called = eliminate_dead_branches(&g).unwrap().to_string();
    let bad_run = called.replace("{function=@twice}", "{function=@bad}");
    let bad = parse_graph(&bad_run).unwrap();
    let err = run(&fold_constants(&bad).unwrap(), &[0.3, -2.0]).unwrap_err();
    assert_eq!(err.kind, crate::error::ErrorKind::Index, "{err}");
    let x = [0.3, -2.0];
    assert_eq!(run(&folded, &x).unwrap(), run(&g, &x).unwrap());
}
