//! `functionalize_variables` checked against the interpreter: each graph runs with real
//! variables, then functionalized with their values passed in, and the results and final
//! variable values must be the same.

use super::{assigned_variables, functionalize_variables};
use crate::error::ErrorKind;
use crate::graph::Call;
use crate::graph::{parse_graph, verify, Graph};
use crate::interpret::{run_graph, RtValue, VariableRef};
use crate::tensor::Tensor;

/// An argument: a tensor, or a variable holding this initial value.
enum In {
    T(Tensor),
    V(Tensor),
}

fn f64s(xs: &[f64]) -> Tensor {
    Tensor::from_vec(xs.to_vec(), &[xs.len()]).unwrap()
}

fn parse(text: &str) -> Graph {
    let g = parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    g
}

fn values(out: Vec<RtValue>) -> Vec<Vec<f64>> {
    out.into_iter()
        .map(|v| v.into_tensor().unwrap().to_f64_vec())
        .collect()
}

/// Runs `g` on `args` with variables, and its functionalized form with their values; asserts
/// both agree on the results and on every variable's final value. Returns the new graph.
fn check(g: &Graph, args: &[In]) -> Graph {
    let vars: Vec<Option<VariableRef>> = args
        .iter()
        .map(|a| match a {
            In::T(_) => None,
            In::V(t) => Some(VariableRef::new(t.clone())),
        })
        .collect();
    let with_vars = args
        .iter()
        .zip(&vars)
        .map(|(a, v)| match (a, v) {
            (In::T(t), _) => RtValue::Tensor(t.clone()),
            (In::V(_), Some(v)) => RtValue::Resource(v.clone()),
            (In::V(_), None) => unreachable!("a variable per In::V"),
        })
        .collect();
    let want = values(run_graph(g, with_vars).unwrap_or_else(|e| panic!("{e}\n{g}")));

    let f = functionalize_variables(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    verify(&f).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let text = f.to_string();
    assert!(
        !text.contains("resource<") && !text.contains("variable("),
        "{text}"
    );
    let plain = args
        .iter()
        .map(|a| match a {
            In::T(t) | In::V(t) => RtValue::Tensor(t.clone()),
        })
        .collect();
    let got = values(run_graph(&f, plain).unwrap_or_else(|e| panic!("{e}\n{f}")));

    let assigned = assigned_variables(g).unwrap();
    assert_eq!(got.len(), want.len() + assigned.len(), "{f}");
    assert_eq!(got[..want.len()], want[..], "results differ\n{f}");
    for (k, v) in vars.iter().enumerate() {
        let Some(v) = v else { continue };
        let fin = v.read().to_f64_vec();
        match assigned.iter().position(|&p| p == k) {
            Some(j) => assert_eq!(got[want.len() + j], fin, "variable {k}\n{f}"),
            None => match &args[k] {
                In::V(initial) => assert_eq!(initial.to_f64_vec(), fin, "unassigned {k} changed"),
                In::T(_) => unreachable!(),
            },
        }
    }
    f
}

const ORDER: &str = r#"graph @order

func @order(%0: f64[2], %1: resource<f64[2]>) -> (f64[2], f64[2]) {
  %2 = read_variable(%1) : f64[2]
  %3 = assign_variable(%1, %0) ctrl(%2) : ()
  %4 = read_variable(%1) ctrl(%3) : f64[2]
  %5 = assign_add_variable(%1, %2) ctrl(%4) : ()
  return %2, %4 ctrl(%5)
}
"#;

#[test]
fn reads_and_writes_keep_program_order() {
    let g = parse(ORDER);
    let f = check(&g, &[In::T(f64s(&[5.0, 6.0])), In::V(f64s(&[1.0, 2.0]))]);
    assert_eq!(assigned_variables(&g).unwrap(), vec![1]);
    assert_eq!(f.entry_function().unwrap().results.len(), 3);
}

const BRANCH: &str = r#"graph @branch

func @branch(%0: bool[], %1: f64[2], %2: resource<f64[2]>, %3: resource<f64[]>) -> (f64[2]) {
  %4 = if(%0, %1, %2, %3) {then=@grow, else=@peek} : f64[2]
  %5 = read_variable(%2) ctrl(%4) : f64[2]
  %6 = add(%4, %5) : f64[2]
  return %6 ctrl(%4)
}

func @grow(%0: f64[2], %1: resource<f64[2]>, %2: resource<f64[]>) -> (f64[2]) {
  %3 = read_variable(%2) : f64[]
  %4 = mul(%0, %3) : f64[2]
  %5 = assign_add_variable(%1, %4) ctrl(%3) : ()
  %6 = sin(%4) : f64[2]
  return %6 ctrl(%5)
}

func @peek(%0: f64[2], %1: resource<f64[2]>, %2: resource<f64[]>) -> (f64[2]) {
  %3 = read_variable(%1) : f64[2]
  %4 = sub(%0, %3) : f64[2]
  return %4
}
"#;

#[test]
fn only_the_branch_taken_assigns() {
    let g = parse(BRANCH);
    assert_eq!(assigned_variables(&g).unwrap(), vec![2], "@peek only reads");
    for pred in [true, false] {
        check(
            &g,
            &[
                In::T(Tensor::scalar(pred)),
                In::T(f64s(&[0.5, -1.5])),
                In::V(f64s(&[1.0, 2.0])),
                In::V(Tensor::scalar(3.0f64)),
            ],
        );
    }
}

const COUNT: &str = r#"graph @count

func @count(%0: f64[], %1: resource<i32[]>, %2: resource<i32[]>, %3: resource<f64[]>) -> (f64[]) {
  %4 = while(%0, %1, %2, %3) {cond=@count_cond, body=@count_body, parallel_iterations=10} : (f64[], resource<i32[]>, resource<i32[]>, resource<f64[]>)
  %5 = read_variable(%1) ctrl(%4) : i32[]
  %6 = cast(%5) {to=f64} : f64[]
  %7 = add(%4#0, %6) : f64[]
  return %7 ctrl(%4)
}

func @count_cond(%0: f64[], %1: resource<i32[]>, %2: resource<i32[]>, %3: resource<f64[]>) -> (bool[]) {
  %4 = read_variable(%1) : i32[]
  %5 = read_variable(%2) ctrl(%4) : i32[]
  %6 = less(%4, %5) : bool[]
  return %6
}

func @count_body(%0: f64[], %1: resource<i32[]>, %2: resource<i32[]>, %3: resource<f64[]>) -> (f64[], resource<i32[]>, resource<i32[]>, resource<f64[]>) {
  %4 = const() {value=[1]} : i32[]
  %5 = assign_add_variable(%1, %4) : ()
  %6 = read_variable(%3) ctrl(%5) : f64[]
  %7 = mul(%0, %6) : f64[]
  %8 = const() {value=[0.25]} : f64[]
  %9 = add(%6, %8) : f64[]
  %10 = assign_variable(%3, %9) ctrl(%6) : ()
  return %7, %1, %2, %3 ctrl(%10)
}
"#;

#[test]
fn a_loop_assigns_once_per_iteration_and_its_condition_reads() {
    let g = parse(COUNT);
    assert_eq!(
        assigned_variables(&g).unwrap(),
        vec![1, 3],
        "the limit is only read"
    );
    for (start, limit) in [(0i32, 4i32), (3, 3), (5, 2)] {
        check(
            &g,
            &[
                In::T(Tensor::scalar(1.0f64)),
                In::V(Tensor::scalar(start)),
                In::V(Tensor::scalar(limit)),
                In::V(Tensor::scalar(1.5f64)),
            ],
        );
    }
}

const SHARED: &str = r#"graph @shared

func @shared(%0: i32[], %1: resource<f64[]>, %2: resource<f64[]>) -> (f64[], f64[]) {
  %3 = case(%0, %1, %2) {branches=[@inc_a, @keep, @inc_b]} : f64[]
  %4 = const() {value=[0]} : i32[]
  %5 = greater(%0, %4) : bool[]
  %6 = if(%5, %1, %2) {then=@inc_a, else=@keep} ctrl(%3) : f64[]
  return %3, %6 ctrl(%3, %6)
}

func @inc_a(%0: resource<f64[]>, %1: resource<f64[]>) -> (f64[]) {
  %2 = const() {value=[1.0]} : f64[]
  %3 = assign_add_variable(%0, %2) : ()
  %4 = read_variable(%0) ctrl(%3) : f64[]
  return %4 ctrl(%3)
}

func @inc_b(%0: resource<f64[]>, %1: resource<f64[]>) -> (f64[]) {
  %2 = const() {value=[10.0]} : f64[]
  %3 = assign_add_variable(%1, %2) : ()
  %4 = read_variable(%1) ctrl(%3) : f64[]
  return %4 ctrl(%3)
}

func @keep(%0: resource<f64[]>, %1: resource<f64[]>) -> (f64[]) {
  %2 = read_variable(%0) : f64[]
  %3 = read_variable(%1) ctrl(%2) : f64[]
  %4 = add(%2, %3) : f64[]
  return %4
}
"#;

#[test]
fn a_branch_shared_by_nodes_threading_different_variables_is_rewritten_for_each() {
    let g = parse(SHARED);
    for k in [-1, 0, 1, 2, 5] {
        let f = check(
            &g,
            &[
                In::T(Tensor::scalar(k)),
                In::V(Tensor::scalar(0.5f64)),
                In::V(Tensor::scalar(0.25f64)),
            ],
        );
        let names: Vec<String> = f.library.iter().map(|f| f.name.clone()).collect();
        assert_eq!(
            names[0], "shared",
            "the entry comes first and keeps its name"
        );
        assert!(names.contains(&"inc_a_vars1".to_string()), "{names:?}");
    }
}

#[test]
fn graphs_without_variables_are_unchanged() {
    let g = crate::testing::graphs::while_graph();
    assert_eq!(functionalize_variables(&g).unwrap(), g);
    assert!(assigned_variables(&g).unwrap().is_empty());
}

#[test]
fn a_loop_condition_that_assigns_is_a_compile_error() {
    let text = COUNT.replace(
        "  %6 = less(%4, %5) : bool[]\n  return %6\n",
        "  %6 = less(%4, %5) : bool[]\n  %7 = assign_variable(%1, %5) ctrl(%5) : ()\n  return %6 ctrl(%7)\n",
    );
    let g = parse(&text);
    let e = functionalize_variables(&g).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Compile);
    assert!(
        e.message.contains("condition") && e.message.contains("@count"),
        "{e}"
    );
}

/// A cond whose then-branch assigns the variable and reads it back, the way tracing builds it.
const TRACED_IF: &str = r#"graph @main

func @main(%0: bool[], %1: f64[2], %2: resource<f64[2]>) -> (f64[2]) {
  %3 = if(%0, %1, %2) {then=@t, else=@e} : f64[2]
  return %3
}

func @t(%0: f64[2], %1: resource<f64[2]>) -> (f64[2]) {
  %2 = assign_variable(%1, %0) : ()
  %3 = read_variable(%1) ctrl(%2) : f64[2]
  return %3 ctrl(%2)
}

func @e(%0: f64[2], %1: resource<f64[2]>) -> (f64[2]) {
  %2 = read_variable(%1) : f64[2]
  return %2
}
"#;

#[test]
fn tracing_threads_a_constructs_variables_through_assignment_helpers() {
    use super::{assigned_value_functions, thread_variables};
    use crate::graph::NodeKind;
    use crate::shape::TensorType;

    let mut g = parse(TRACED_IF);
    let ty = TensorType::new(crate::DType::F64, &[2]);
    let (value, grad) = assigned_value_functions(&ty, "assigned", "assigned_grad").unwrap();
    g.library.add(value).unwrap();
    g.library.add(grad).unwrap();
    let helpers = [(ty, ("assigned".to_string(), "assigned_grad".to_string()))].into();
    let (written, functions) = thread_variables(&g.library, &["t", "e"], false, helpers).unwrap();
    assert_eq!(written, vec![1]);
    let names: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["t", "e"]);
    // each branch returns the variable's final value after its result; the assignment is a
    // call of the helper on (old, new), whose custom gradient goes to the old value alone
    let t = &functions[0];
    assert_eq!(t.results.len(), 2);
    let call = &t.nodes[t.results[1].node];
    assert_eq!(
        call.kind,
        NodeKind::Call(Call {
            function: "assigned".into(),
            gradient: Some("assigned_grad".into()),
            ..Default::default()
        })
    );
    assert_eq!(
        t.results[0], t.results[1],
        "the read after it is the assigned value"
    );
    assert_eq!(
        call.inputs,
        [crate::graph::Port::new(1, 0), crate::graph::Port::new(0, 0)]
    );
    let e = &functions[1];
    assert_eq!(
        e.results,
        [crate::graph::Port::new(1, 0); 2],
        "read and kept: the value in"
    );
    // a loop whose condition assigns has no such form
    let cond_assigns = parse(
        r#"graph @main

func @main(%0: f64[2], %1: resource<f64[2]>) -> (f64[2]) {
  %2 = while(%0, %1) {cond=@c, body=@b, parallel_iterations=10} : (f64[2], resource<f64[2]>)
  return %2#0
}

func @c(%0: f64[2], %1: resource<f64[2]>) -> (bool[]) {
  %2 = assign_add_variable(%1, %0) : ()
  %3 = const() {value=[false]} : bool[]
  return %3 ctrl(%2)
}

func @b(%0: f64[2], %1: resource<f64[2]>) -> (f64[2], resource<f64[2]>) {
  return %0, %1
}
"#,
    );
    let err =
        thread_variables(&cond_assigns.library, &["c", "b"], true, Default::default()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Compile, "{err}");
}
