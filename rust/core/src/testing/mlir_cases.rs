//! Graphs the MLIR tests emit: golden-text cases written as graph text (one per feature), and
//! traced programs with gradients. `check.rs` also compiles and runs them under IREE.

use crate::graph::{parse_graph, Graph};

/// `where(tanh(x * w + b) > b, tanh(..), b)`: numpy broadcasting of a matrix, a vector and a
/// scalar, with source locations.
pub(crate) const ELEMENTWISE: &str = r#"graph @main

func @main(%0: f32[2, 3], %1: f32[3], %2: f32[]) -> (f32[2, 3], bool[2, 3]) {
  %3 = mul(%0, %1) : f32[2, 3] loc("model.py":3)
  %4 = add(%3, %2) : f32[2, 3] loc("model.py":4)
  %5 = tanh(%4) : f32[2, 3] loc("model.py":4)
  %6 = greater(%5, %2) : bool[2, 3] loc("model.py":5)
  %7 = where(%6, %5, %2) : f32[2, 3] loc("model.py":5)
  return %7, %6
}
"#;

/// Broadcasting against a dimension only known at run time.
pub(crate) const DYNAMIC: &str = r#"graph @dyn

func @dyn(%0: f32[?, 3], %1: f32[3]) -> (f32[?, 3], f32[?, 1]) {
  %2 = add(%0, %1) : f32[?, 3] loc("model.py":7)
  %3 = fill_like(%2) {value=0.5} : f32[?, 3]
  %4 = mul(%2, %3) : f32[?, 3]
  %5 = sum(%4) {axes=[1], keepdims=true} : f32[?, 1] loc("model.py":8)
  return %4, %5
}
"#;

/// Sum, max with keepdims, min over all axes, and a mean (sum times 1/n).
pub(crate) const REDUCTION: &str = r#"graph @reduce

func @reduce(%0: f32[2, 3]) -> (f32[2], f32[1, 3], f32[], f32[2]) {
  %1 = sum(%0) {axes=[1], keepdims=false} : f32[2] loc("model.py":20)
  %2 = max(%0) {axes=[0], keepdims=true} : f32[1, 3] loc("model.py":21)
  %3 = min(%0) {axes=[0, 1], keepdims=false} : f32[]
  %4 = const() {value=[0.33333334]} : f32[]
  %5 = mul(%1, %4) : f32[2] loc("model.py":22)
  return %1, %2, %3, %5
}
"#;

/// A dense layer (`x @ w + b`), a batch against one matrix, and broadcast batches with a
/// transposed operand.
pub(crate) const MATMUL: &str = r#"graph @mm

func @mm(%0: f32[4, 3], %1: f32[3, 2], %2: f32[2], %3: f32[5, 4, 3], %4: f32[2, 1, 3, 4], %5: f32[5, 3, 2]) -> (f32[4, 2], f32[5, 4, 2], f32[2, 5, 4, 2]) {
  %6 = matmul(%0, %1) {transpose_a=false, transpose_b=false} : f32[4, 2] loc("model.py":30)
  %7 = add(%6, %2) : f32[4, 2] loc("model.py":30)
  %8 = matmul(%3, %1) {transpose_a=false, transpose_b=false} : f32[5, 4, 2] loc("model.py":31)
  %9 = matmul(%4, %5) {transpose_a=true, transpose_b=false} : f32[2, 5, 4, 2] loc("model.py":32)
  return %7, %8, %9
}
"#;

/// `sin(x) if p else cos(x) * 2`.
pub(crate) const IF: &str = r#"graph @cond

func @cond(%0: bool[], %1: f32[5]) -> (f32[5]) {
  %2 = if(%0, %1) {then=@cond_then, else=@cond_else} : f32[5] loc("model.py":40)
  return %2
}

func @cond_then(%0: f32[5]) -> (f32[5]) {
  %1 = sin(%0) : f32[5] loc("model.py":41)
  return %1
}

func @cond_else(%0: f32[5]) -> (f32[5]) {
  %1 = cos(%0) : f32[5] loc("model.py":43)
  %2 = const() {value=[2.0]} : f32[]
  %3 = mul(%1, %2) : f32[5] loc("model.py":43)
  return %3
}
"#;

/// `[neg, exp, sin][i](x)`; an index out of range (negative too) runs `sin`.
pub(crate) const CASE: &str = r#"graph @switch

func @switch(%0: i32[], %1: f32[5]) -> (f32[5]) {
  %2 = case(%0, %1) {branches=[@b_neg, @b_exp, @b_sin]} : f32[5] loc("model.py":50)
  return %2
}

func @b_neg(%0: f32[5]) -> (f32[5]) {
  %1 = neg(%0) : f32[5]
  return %1
}

func @b_exp(%0: f32[5]) -> (f32[5]) {
  %1 = exp(%0) : f32[5]
  return %1
}

func @b_sin(%0: f32[5]) -> (f32[5]) {
  %1 = sin(%0) : f32[5]
  return %1
}
"#;

/// `while i < n: x = x * 0.5 + 1; i += 1`, at most 10 trips.
pub(crate) const WHILE: &str = r#"graph @loop

func @loop(%0: f32[5], %1: i32[]) -> (f32[5], i32[]) {
  %2 = const() {value=[0]} : i32[]
  %3 = while(%2, %0, %1) {cond=@loop_cond, body=@loop_body, maximum_iterations=10, parallel_iterations=10} : (i32[], f32[5], i32[]) loc("model.py":60)
  return %3#1, %3#0
}

func @loop_cond(%0: i32[], %1: f32[5], %2: i32[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[] loc("model.py":60)
  return %3
}

func @loop_body(%0: i32[], %1: f32[5], %2: i32[]) -> (i32[], f32[5], i32[]) {
  %3 = const() {value=[1]} : i32[]
  %4 = add(%0, %3) : i32[] loc("model.py":63)
  %5 = const() {value=[0.5]} : f32[]
  %6 = mul(%1, %5) : f32[5] loc("model.py":62)
  %7 = const() {value=[1.0]} : f32[]
  %8 = add(%6, %7) : f32[5] loc("model.py":62)
  return %4, %8, %2
}
"#;

/// `for i < n: (for j < min(i, 5): x = x + sin(x))`: a loop (bounded by maximum_iterations)
/// in the body of another.
pub(crate) const NESTED: &str = r#"graph @nest

func @nest(%0: f32[5], %1: i32[]) -> (f32[5]) {
  %2 = const() {value=[0]} : i32[]
  %3 = while(%2, %0, %1) {cond=@outer_cond, body=@outer_body, parallel_iterations=10} : (i32[], f32[5], i32[]) loc("model.py":70)
  return %3#1
}

func @outer_cond(%0: i32[], %1: f32[5], %2: i32[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[]
  return %3
}

func @outer_body(%0: i32[], %1: f32[5], %2: i32[]) -> (i32[], f32[5], i32[]) {
  %3 = const() {value=[0]} : i32[]
  %4 = while(%3, %1, %0) {cond=@inner_cond, body=@inner_body, maximum_iterations=5, parallel_iterations=10} : (i32[], f32[5], i32[]) loc("model.py":71)
  %5 = const() {value=[1]} : i32[]
  %6 = add(%0, %5) : i32[]
  return %6, %4#1, %2
}

func @inner_cond(%0: i32[], %1: f32[5], %2: i32[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[]
  return %3
}

func @inner_body(%0: i32[], %1: f32[5], %2: i32[]) -> (i32[], f32[5], i32[]) {
  %3 = const() {value=[1]} : i32[]
  %4 = add(%0, %3) : i32[]
  %5 = sin(%1) : f32[5] loc("model.py":72)
  %6 = add(%1, %5) : f32[5] loc("model.py":72)
  return %4, %6, %2
}
"#;

/// A loop over a 2-vector (small: held as host scalars, see `emit::HOST_ELEMENTS`): its
/// elements swapped through slices and a concatenation, one of them through `sin`, plus their
/// sum broadcast back; the sum of the result after the loop.
pub(crate) const HOST_VECTOR: &str = r#"graph @vec

func @vec(%0: f32[2], %1: i32[]) -> (f32[2], f32[]) {
  %2 = const() {value=[0]} : i32[]
  %3 = while(%2, %0, %1) {cond=@vec_cond, body=@vec_body, parallel_iterations=1} : (i32[], f32[2], i32[]) loc("model.py":80)
  %4 = sum(%3#1) {axes=[0], keepdims=false} : f32[] loc("model.py":84)
  return %3#1, %4
}

func @vec_cond(%0: i32[], %1: f32[2], %2: i32[]) -> (bool[]) {
  %3 = less(%0, %2) : bool[]
  return %3
}

func @vec_body(%0: i32[], %1: f32[2], %2: i32[]) -> (i32[], f32[2], i32[]) {
  %3 = const() {value=[1]} : i32[]
  %4 = add(%0, %3) : i32[]
  %5 = slice(%1) {start=[1], stop=[2], step=[1]} : f32[1] loc("model.py":81)
  %6 = sin(%5) : f32[1] loc("model.py":81)
  %7 = slice(%1) {start=[0], stop=[1], step=[1]} : f32[1]
  %8 = concatenate(%6, %7) {axis=0} : f32[2] loc("model.py":82)
  %9 = sum(%1) {axes=[0], keepdims=true} : f32[1]
  %10 = const() {value=[0.25]} : f32[]
  %11 = mul(%9, %10) : f32[1]
  %12 = add(%8, %11) : f32[2] loc("model.py":83)
  return %4, %12, %2
}
"#;

/// A graph of the cases above, parsed.
pub(crate) fn graph(text: &str) -> Graph {
    parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}
