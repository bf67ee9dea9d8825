//! `elide_discarded_stand_ins` against the interpreter: a stand-in is bypassed only where every
//! value computed from it is discarded by a select on its mask, and results never change.

use super::elide_discarded_stand_ins;
use crate::graph::{parse_graph, verify, Graph};
use crate::interpret::{run_graph, RtValue};
use crate::tensor::Tensor;

/// `x > 0` as the live lanes, lane 0 the stand-in's source; `{tail}` uses `%7 = log(%6)`, the
/// body on the stand-ins (NaN on a finished lane's own negative value).
fn program(tail: &str, results: &str) -> Graph {
    let text = format!(
        r#"graph @main

func @main(%0: f64[4]) -> ({results}) {{
  %1 = const() {{value=[0.0]}} : f64[]
  %2 = greater(%0, %1) : bool[4]
  %3 = const() {{value=[0]}} : i64[1]
  %4 = take(%0, %3) {{axis=0}} : f64[1]
  %5 = stop_gradient(%4) : f64[1]
  %6 = where(%2, %0, %5) : f64[4]
  %7 = log(%6) : f64[4]
{tail}
}}
"#
    );
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&g).unwrap();
    g
}

fn run(g: &Graph) -> Vec<Vec<f64>> {
    let x = Tensor::from_vec(vec![2.0, -1.0, 3.0, -4.0], &[4]).unwrap();
    run_graph(g, vec![RtValue::Tensor(x)])
        .unwrap()
        .into_iter()
        .map(|r| r.into_tensor().unwrap().to_f64_vec())
        .collect()
}

fn bypassed(g: &Graph) -> bool {
    let elided = elide_discarded_stand_ins(g).unwrap();
    verify(&elided).unwrap();
    let (before, after) = (run(g), run(&elided));
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "the results changed:\n{elided}"
        );
    }
    let text = elided.to_string();
    assert_ne!(text.contains("log(%0)"), text.contains("log(%6)"), "{text}");
    text.contains("log(%0)")
}

#[test]
fn a_stand_in_whose_lanes_a_select_discards_is_bypassed() {
    let kept = "  %8 = mul(%7, %7) : f64[4]\n  %9 = where(%2, %8, %0) : f64[4]\n  return %9";
    assert!(bypassed(&program(kept, "f64[4]")));
    // a mask reshaped to select, as a traced loop's trip does
    let reshaped =
        "  %8 = reshape(%2) {shape=[4]} : bool[4]\n  %9 = where(%8, %7, %0) : f64[4]\n  return %9";
    assert!(bypassed(&program(reshaped, "f64[4]")));
}

#[test]
fn a_stand_in_is_kept_where_its_lanes_reach_anything_else() {
    let cases = [
        // a result of the function
        ("  %8 = where(%2, %7, %0) : f64[4]\n  return %8, %7", "f64[4], f64[4]"),
        // a reduction over the lanes
        ("  %8 = sum(%7) {axes=[0], keepdims=false} : f64[]\n  return %8", "f64[]"),
        // the value a select keeps where the mask is false
        ("  %8 = where(%2, %0, %7) : f64[4]\n  return %8", "f64[4]"),
        // a select on another mask
        (
            "  %8 = less(%0, %1) : bool[4]\n  %9 = where(%8, %7, %0) : f64[4]\n  return %9",
            "f64[4]",
        ),
        // an op that is not lane by lane (a gather)
        (
            "  %8 = take(%7, %3) {axis=0} : f64[1]\n  %9 = where(%2, %7, %0) : f64[4]\n  return %9, %8",
            "f64[4], f64[1]",
        ),
        // a sum of two paths, one of them not through the select
        ("  %8 = where(%2, %7, %0) : f64[4]\n  %9 = add(%8, %7) : f64[4]\n  return %9", "f64[4]"),
    ];
    for (tail, results) in cases {
        assert!(!bypassed(&program(tail, results)), "{tail}");
    }
}

#[test]
fn a_stand_in_is_kept_where_a_lane_of_its_own_could_trap() {
    // An integer remainder by a finished lane's own zero need not be guarded by a compiled
    // target: the stand-in (a running lane's nonzero value) stays.
    let text = r#"graph @main

func @main(%0: i64[4]) -> (i64[4]) {
  %1 = const() {value=[0]} : i64[]
  %2 = greater(%0, %1) : bool[4]
  %3 = const() {value=[0]} : i64[1]
  %4 = take(%0, %3) {axis=0} : i64[1]
  %5 = stop_gradient(%4) : i64[1]
  %6 = where(%2, %0, %5) : i64[4]
  %7 = const() {value=[7]} : i64[]
  %8 = rem(%7, %6) : i64[4]
  %9 = where(%2, %8, %0) : i64[4]
  return %9
}
"#;
    let g = parse_graph(text).unwrap();
    let elided = elide_discarded_stand_ins(&g).unwrap();
    assert!(elided.to_string().contains("rem(%7, %6)"), "{elided}");
}

/// Newton's method under `vmap` as graph mode traces it (`gl.function(gl.vmap(newton))` on four
/// lanes, source locations dropped): each trip on stand-ins for the lanes that are done.
const VMAP_NEWTON: &str = include_str!("../../examples/vmap_newton.graph");

#[test]
fn a_traced_batched_trip_runs_on_its_own_lanes_after_the_executors_passes() {
    let g = parse_graph(VMAP_NEWTON).unwrap();
    let optimized = crate::executor::optimize(&g).unwrap();
    let needed = crate::passes::eliminate_dead_code(&optimized).unwrap();
    let text = needed.to_string();
    let body = text
        .split("\nfunc @")
        .find(|f| f.starts_with("while_body_1"))
        .unwrap();
    // the stand-ins' search for a running lane and their gathers no longer run
    for gone in ["take(", "min(", "stop_gradient("] {
        assert!(!body.contains(gone), "{gone} in\n{body}");
    }
    // lanes of 0, 6, 8 and 16 trips: each root and trip count as the interpreter gives them
    let roots = Tensor::from_vec(vec![1.0, 8.0, 1000.0, 0.5], &[4]).unwrap();
    let trips = Tensor::from_vec(vec![0i32; 4], &[4]).unwrap();
    let args = vec![RtValue::Tensor(roots), RtValue::Tensor(trips)];
    let want = run_graph(&g, args.clone()).unwrap();
    let got = crate::executor::Executor::new(&g)
        .unwrap()
        .run(args)
        .unwrap();
    for (w, g) in want.into_iter().zip(got) {
        let (w, g) = (w.into_tensor().unwrap(), g.into_tensor().unwrap());
        assert_eq!(w.to_f64_vec(), g.to_f64_vec());
    }
}
