//! Golden tests of emitted MLIR: each case of `cases.rs` with FileCheck-style checks beside it
//! (`{{*}}` matches anything within a line). `check.rs` additionally parses, compiles and runs
//! these modules with IREE.

use super::*;
use crate::error::ErrorKind;
use crate::testing::filecheck::filecheck;
use crate::testing::mlir_cases::{self as cases, graph};

fn emit(text: &str) -> String {
    emit_module(&graph(text)).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn elementwise_ops_broadcast_explicitly_and_carry_locations() {
    filecheck(
        &emit(cases::ELEMENTWISE),
        r#"
        CHECK: module {
        CHECK-NEXT: func.func @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>, %arg2: tensor<f32>) -> (tensor<2x3xf32>, tensor<2x3xi1>) {
        CHECK-NEXT: %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32> loc("model.py":3:0)
        CHECK-NEXT: %1 = stablehlo.multiply %arg0, %0 : tensor<2x3xf32> loc("model.py":3:0)
        CHECK-NEXT: %2 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<2x3xf32> loc("model.py":4:0)
        CHECK-NEXT: %3 = stablehlo.add %1, %2 : tensor<2x3xf32> loc("model.py":4:0)
        CHECK-NEXT: %4 = stablehlo.tanh %3 : tensor<2x3xf32> loc("model.py":4:0)
        CHECK: %6 = stablehlo.compare GT, %4, %5, FLOAT : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1> loc("model.py":5:0)
        CHECK: %8 = stablehlo.select %6, %4, %7 : tensor<2x3xi1>, tensor<2x3xf32> loc("model.py":5:0)
        CHECK-NEXT: return %8, %6 : tensor<2x3xf32>, tensor<2x3xi1>
        "#,
    );
}

#[test]
fn unknown_dimensions_broadcast_with_run_time_sizes() {
    filecheck(
        &emit(cases::DYNAMIC),
        r#"
        CHECK: func.func @dyn(%arg0: tensor<?x3xf32>, %arg1: tensor<3xf32>) -> (tensor<?x3xf32>, tensor<?x1xf32>)
        CHECK-NEXT: %0 = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?x3xf32>) -> tensor<i32>
        CHECK: %3 = stablehlo.concatenate %1, %2, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
        CHECK-NEXT: %4 = stablehlo.dynamic_broadcast_in_dim %arg1, %3, dims = [1] {known_expanding_dimensions = array<i64>, known_nonexpanding_dimensions = array<i64: 0>} : (tensor<3xf32>, tensor<2xi32>) -> tensor<?x3xf32> loc("model.py":7:0)
        CHECK-NEXT: %5 = stablehlo.add %arg0, %4 : tensor<?x3xf32>
        fill_like: a scalar broadcast to the run-time shape of its input
        CHECK: %6 = stablehlo.constant dense<0.5> : tensor<f32>
        CHECK: stablehlo.dynamic_broadcast_in_dim %6, {{*}} -> tensor<?x3xf32>
        keepdims: the reduced value gets its unit axis back by a broadcast (no dynamic reshape)
        CHECK: stablehlo.reduce({{*}}) across dimensions = [1] : (tensor<?x3xf32>, tensor<f32>) -> tensor<?xf32>
        CHECK: stablehlo.dynamic_broadcast_in_dim %14, %21, dims = [0] {{*}} -> tensor<?x1xf32> loc("model.py":8:0)
        CHECK-NOT: dynamic_reshape
        CHECK: return %12, %22 : tensor<?x3xf32>, tensor<?x1xf32>
        "#
        .lines()
        .filter(|l| l.trim().starts_with("CHECK"))
        .collect::<Vec<_>>()
        .join("\n")
        .as_str(),
    );
}

#[test]
fn reductions_have_a_region_and_identities() {
    filecheck(
        &emit(cases::REDUCTION),
        r#"
        CHECK: %0 = stablehlo.constant dense<0.0> : tensor<f32> loc("model.py":20:0)
        CHECK-NEXT: %1 = stablehlo.reduce(%arg0 init: %0) across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
        CHECK-NEXT: reducer(%2: tensor<f32>, %3: tensor<f32>) {
        CHECK-NEXT: %4 = stablehlo.add %2, %3 : tensor<f32> loc("model.py":20:0)
        CHECK-NEXT: stablehlo.return %4 : tensor<f32>
        CHECK-NEXT: } loc("model.py":20:0)
        CHECK: %5 = stablehlo.constant dense<0xFF800000> : tensor<f32>
        CHECK: across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
        CHECK: stablehlo.maximum
        CHECK: %10 = stablehlo.broadcast_in_dim %6, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32> loc("model.py":21:0)
        CHECK: stablehlo.constant dense<0x7F800000> : tensor<f32>
        CHECK: across dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
        CHECK: stablehlo.minimum
        CHECK: stablehlo.constant dense<0.33333334> : tensor<f32>
        CHECK: stablehlo.multiply %1, %17 : tensor<2xf32> loc("model.py":22:0)
        CHECK: return %1, %10, %12, %18 : tensor<2xf32>, tensor<1x3xf32>, tensor<f32>, tensor<2xf32>
        "#,
    );
}

#[test]
fn matmul_is_dot_general_with_explicit_batches() {
    filecheck(
        &emit(cases::MATMUL),
        r#"
        CHECK: %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32> loc("model.py":30:0)
        CHECK-NEXT: stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
        CHECK-NEXT: stablehlo.add %0, %1 : tensor<4x2xf32>
        CHECK-NEXT: %3 = stablehlo.dot_general %arg3, %arg1, contracting_dims = [2] x [0] : (tensor<5x4x3xf32>, tensor<3x2xf32>) -> tensor<5x4x2xf32> loc("model.py":31:0)
        CHECK-NEXT: %4 = stablehlo.broadcast_in_dim %arg4, dims = [0, 1, 2, 3] : (tensor<2x1x3x4xf32>) -> tensor<2x5x3x4xf32>
        CHECK-NEXT: %5 = stablehlo.broadcast_in_dim %arg5, dims = [1, 2, 3] : (tensor<5x3x2xf32>) -> tensor<2x5x3x2xf32>
        CHECK-NEXT: %6 = stablehlo.dot_general %4, %5, batching_dims = [0, 1] x [0, 1], contracting_dims = [2] x [2] : (tensor<2x5x3x4xf32>, tensor<2x5x3x2xf32>) -> tensor<2x5x4x2xf32> loc("model.py":32:0)
        "#,
    );
}

#[test]
fn if_becomes_scf_if_with_inlined_branches() {
    filecheck(
        &emit(cases::IF),
        r#"
        CHECK: func.func @cond(%arg0: tensor<i1>, %arg1: tensor<5xf32>) -> (tensor<5xf32>) {
        CHECK-NEXT: %0 = tensor.extract %arg0[] : tensor<i1> loc("model.py":40:0)
        CHECK-NEXT: %1 = scf.if %0 -> (tensor<5xf32>) {
        CHECK-NEXT: %2 = stablehlo.sine %arg1 : tensor<5xf32> loc("model.py":41:0)
        CHECK-NEXT: scf.yield %2 : tensor<5xf32>
        CHECK-NEXT: } else {
        CHECK-NEXT: %3 = stablehlo.cosine %arg1 : tensor<5xf32> loc("model.py":43:0)
        CHECK: %6 = stablehlo.multiply %3, %5 : tensor<5xf32> loc("model.py":43:0)
        CHECK-NEXT: scf.yield %6 : tensor<5xf32>
        CHECK-NEXT: } loc("model.py":40:0)
        CHECK-NEXT: return %1 : tensor<5xf32>
        CHECK-NOT: func.func
        "#,
    );
}

#[test]
fn case_becomes_a_chain_of_scf_if_ending_in_the_last_branch() {
    filecheck(
        &emit(cases::CASE),
        r#"
        CHECK: %0 = tensor.extract %arg0[] : tensor<i32> loc("model.py":50:0)
        CHECK-NEXT: %1 = arith.constant 0 : i32
        CHECK-NEXT: %2 = arith.cmpi eq, %0, %1 : i32
        CHECK-NEXT: %3 = scf.if %2 -> (tensor<5xf32>) {
        CHECK-NEXT: stablehlo.negate %arg1
        CHECK: } else {
        CHECK-NEXT: %5 = arith.constant 1 : i32
        CHECK-NEXT: %6 = arith.cmpi eq, %0, %5 : i32
        CHECK-NEXT: %7 = scf.if %6 -> (tensor<5xf32>) {
        CHECK-NEXT: stablehlo.exponential %arg1
        CHECK: } else {
        CHECK-NEXT: %9 = stablehlo.sine %arg1
        CHECK-NEXT: scf.yield %9 : tensor<5xf32>
        CHECK-NEXT: } loc("model.py":50:0)
        CHECK-NEXT: scf.yield %7 : tensor<5xf32>
        CHECK-NEXT: } loc("model.py":50:0)
        CHECK-NOT: scf.index_switch
        CHECK: return %3 : tensor<5xf32>
        "#,
    );
}

#[test]
fn while_becomes_scf_while_with_an_iteration_counter() {
    // rank-0 loop variables are carried as 64-bit scalars (see scalar.rs); one passed through
    // unchanged (the bound, %16) is yielded as the block argument itself
    filecheck(
        &emit(cases::WHILE),
        r#"
        CHECK: %0 = stablehlo.constant dense<0> : tensor<i32>
        CHECK-NEXT: %1 = tensor.extract %0[] : tensor<i32>
        CHECK-NEXT: %2 = arith.extsi %1 : i32 to i64
        CHECK-NEXT: %3 = tensor.extract %arg1[] : tensor<i32>
        CHECK-NEXT: %4 = arith.extsi %3 : i32 to i64
        CHECK-NEXT: %5 = arith.constant 0 : i64 loc("model.py":60:0)
        CHECK-NEXT: %6 = arith.constant 10 : i64 loc("model.py":60:0)
        CHECK-NEXT: %7 = arith.constant 1 : i64 loc("model.py":60:0)
        CHECK-NEXT: %8:4 = scf.while (%9 = %5, %10 = %2, %11 = %arg0, %12 = %4) : (i64, i64, tensor<5xf32>, i64) -> (i64, i64, tensor<5xf32>, i64) {
        CHECK-NEXT: %17 = arith.trunci %10 : i64 to i32
        CHECK-NEXT: %18 = arith.trunci %12 : i64 to i32
        CHECK-NEXT: %19 = arith.cmpi slt, %17, %18 : i32 loc("model.py":60:0)
        CHECK-NEXT: %20 = arith.cmpi slt, %9, %6 : i64
        CHECK-NEXT: %21 = arith.andi %19, %20 : i1
        CHECK-NEXT: scf.condition(%21) %9, %10, %11, %12 : i64, i64, tensor<5xf32>, i64
        CHECK-NEXT: } do {
        CHECK-NEXT: ^bb0(%13: i64, %14: i64, %15: tensor<5xf32>, %16: i64):
        CHECK-NEXT: %22 = arith.trunci %14 : i64 to i32
        CHECK: %26 = arith.addi %22, %25 : i32 loc("model.py":63:0)
        CHECK: %29 = stablehlo.multiply %15, %28 : tensor<5xf32> loc("model.py":62:0)
        CHECK: %32 = stablehlo.add %29, %31 : tensor<5xf32> loc("model.py":62:0)
        CHECK-NEXT: %33 = arith.extsi %26 : i32 to i64
        CHECK-NEXT: %34 = arith.addi %13, %7 : i64
        CHECK-NEXT: scf.yield %34, %33, %32, %16 : i64, i64, tensor<5xf32>, i64
        CHECK-NEXT: } loc("model.py":60:0)
        CHECK-NEXT: %35 = arith.trunci %8#1 : i64 to i32
        CHECK: %37 = tensor.from_elements %35 : tensor<i32>
        CHECK-NEXT: return %8#2, %37 : tensor<5xf32>, tensor<i32>
        "#,
    );
}

#[test]
fn small_vectors_are_host_scalars_through_loops_slices_and_sums() {
    // f32[2] is carried as two scalars (each in an i64, as rank-0 f32s are); the body's slices,
    // concatenation and broadcast only move names, sin and the sums are VM ops: no dispatch,
    // and no read-back, inside the loop. The entry's argument is read once before it.
    let text = emit(cases::HOST_VECTOR);
    filecheck(
        &text,
        r#"
        CHECK: func.func @vec(%arg0: tensor<2xf32>, %arg1: tensor<i32>) -> (tensor<2xf32>, tensor<f32>) {
        CHECK: = tensor.extract %arg0[%{{*}}] : tensor<2xf32>
        CHECK: = tensor.extract %arg0[%{{*}}] : tensor<2xf32>
        CHECK: scf.while ({{*}}) : (i64, i64, i64, i64) -> (i64, i64, i64, i64) {
        CHECK: } do {
        CHECK: = math.sin %{{*}} : f32 loc("model.py":81:0)
        CHECK: = arith.addf %{{*}}, %{{*}} : f32
        CHECK: = arith.mulf %{{*}}, %{{*}} : f32
        CHECK: scf.yield
        CHECK: = arith.addf %{{*}}, %{{*}} : f32 loc("model.py":84:0)
        CHECK: = tensor.from_elements %{{*}}, %{{*}} : tensor<2xf32>
        CHECK: return
        "#,
    );
    let body = &text[text.find("} do {").unwrap()..text.find("scf.yield").unwrap()];
    // only constants (which IREE folds into the VM ops that read them) are tensors there
    let device = body.lines().filter(|l| {
        let constant = l.contains("stablehlo.constant") || l.contains("tensor.extract");
        (l.contains("stablehlo.") || l.contains("tensor.")) && !constant
    });
    assert_eq!(device.count(), 0, "{body}");
    let constants = body.matches("stablehlo.constant").count();
    assert_eq!(body.matches("tensor.extract").count(), constants, "{body}");
    // the sum of 2 adds once, the broadcast of the sum to both elements computes it once
    assert_eq!(body.matches("arith.addf").count(), 3, "{body}");
    assert_eq!(body.matches("arith.mulf").count(), 1, "{body}");
    // pure StableHLO keeps every tensor a tensor
    let options = EmitOptions {
        pure_stablehlo: true,
        ..Default::default()
    };
    let (pure, _) = emit_module_facts(&graph(cases::HOST_VECTOR), options).unwrap();
    assert!(
        !pure.contains("math.sin") && pure.contains("stablehlo.sine"),
        "{pure}"
    );
}

#[test]
fn nested_loops_nest_scf_while_regions() {
    filecheck(
        &emit(cases::NESTED),
        r#"
        CHECK: %5:3 = scf.while (%6 = %2, %7 = %arg0, %8 = %4) : (i64, tensor<5xf32>, i64) -> (i64, tensor<5xf32>, i64) {
        CHECK: %14 = arith.cmpi slt, %12, %13 : i32
        CHECK-NEXT: scf.condition(%14) %6, %7, %8
        CHECK-NEXT: } do {
        CHECK-NEXT: ^bb0(%9: i64, %10: tensor<5xf32>, %11: i64):
        the inner loop carries the outer body's values: x = %10, its bound i = %9
        CHECK: %23:4 = scf.while (%24 = %20, %25 = %19, %26 = %10, %27 = %9) : (i64, i64, tensor<5xf32>, i64) -> (i64, i64, tensor<5xf32>, i64) {
        CHECK: arith.cmpi slt, %24, %21 : i64
        CHECK: } do {
        CHECK: %42 = stablehlo.sine %30 : tensor<5xf32> loc("model.py":72:0)
        CHECK: scf.yield %45, %44, %43, %31
        CHECK-NEXT: } loc("model.py":71:0)
        CHECK: scf.yield %51, %23#2, %11 : i64, tensor<5xf32>, i64
        CHECK-NEXT: } loc("model.py":70:0)
        CHECK: return %5#1 : tensor<5xf32>
        "#
        .lines()
        .filter(|l| l.trim().starts_with("CHECK"))
        .collect::<Vec<_>>()
        .join("\n")
        .as_str(),
    );
}

#[test]
fn traced_gradients_of_branches_emit_as_one_function() {
    // The first- and second-order gradients of a cond and a switch_case: the forward If/Case
    // gains the intermediates as outputs, the backward one reads them (see `trace`).
    for g in [
        crate::testing::traced::cond(2),
        crate::testing::traced::switch(2),
    ] {
        let text = emit_module(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
        assert_eq!(text.matches("func.func").count(), 1, "{text}");
        filecheck(
            &text,
            "CHECK: func.func @f(%arg0: {{*}}, %arg1: tensor<2xf64>, %arg2: tensor<2xf64>)\n\
             CHECK: scf.if\nCHECK: scf.if\nCHECK: return",
        );
    }
}

#[test]
fn loop_gradients_carry_stacks_as_growable_buffers() {
    // d/dx of `while i < n: x = sin(x) * c + x`: the forward loop pushes sin(x) and x, the
    // backward loop pops them (see `stacks.rs`). The second stack starts with another
    // capacity, so IREE cannot merge the two buffers. Both loops read c (%arg1), which they
    // pass through, directly; the bound n (rank 0) is carried.
    let text = emit_module(&crate::testing::traced::while_sin_of(5, 1, None)).unwrap();
    let checks = r#"
        CHECK: %2 = arith.constant 16 : index
        CHECK-NEXT: %3 = tensor.empty(%2) : tensor<?x5xf64>
        CHECK-NEXT: %4 = arith.constant 0 : index
        CHECK-NEXT: %5 = arith.constant 17 : index
        CHECK-NEXT: %6 = tensor.empty(%5) : tensor<?x5xf64>
        CHECK: scf.while ({{*}}, %16 = %3, %17 = %4, %18 = %6, %19 = %7) : ({{*}}, tensor<?x5xf64>, index, tensor<?x5xf64>, index) -> (
        CHECK: } do {
        CHECK: %29 = stablehlo.sine %21 : tensor<5xf64>
        CHECK-NEXT: %30 = stablehlo.multiply %29, %arg1 : tensor<5xf64>
        CHECK: %38 = tensor.dim %24, %37 : tensor<?x5xf64>
        CHECK-NEXT: %39 = arith.cmpi eq, %25, %38 : index
        CHECK-NEXT: %40 = scf.if %39 -> (tensor<?x5xf64>) {
        CHECK-NEXT: %41 = arith.addi %38, %38 : index
        CHECK-NEXT: %42 = tensor.empty(%41) : tensor<?x5xf64>
        CHECK-NEXT: %43 = tensor.insert_slice %24 into %42[%37, 0][%38, 5][1, 1] : tensor<?x5xf64> into tensor<?x5xf64>
        CHECK-NEXT: scf.yield %43 : tensor<?x5xf64>
        CHECK-NEXT: } else {
        CHECK-NEXT: scf.yield %24 : tensor<?x5xf64>
        CHECK: %44 = tensor.insert_slice %29 into %40[%25, 0][1, 5][1, 1] : tensor<5xf64> into tensor<?x5xf64>
        CHECK: %46 = arith.addi %25, %45 : index
        CHECK: scf.yield {{*}}, %44, %46, %54, %56 : {{*}}, tensor<?x5xf64>, index, tensor<?x5xf64>, index
        CHECK: scf.while ({{*}}, %61 = %11#3, %62 = %11#4, %63 = %11#5, %64 = %11#6, %65 = %11#7)
        CHECK: } do {
        CHECK: %77 = arith.subi %70, %76 : index
        CHECK-NEXT: %78 = tensor.extract_slice %69[%77, 0][1, 5][1, 1] : tensor<?x5xf64> to tensor<5xf64>
        CHECK: %82 = stablehlo.multiply %66, %arg1 : tensor<5xf64>
        CHECK: scf.yield {{*}}, %69, %77, %71, %80 : {{*}}
        "#;
    filecheck(&text, checks);
}

#[test]
fn variables_become_parameters_and_results() {
    // `passes::functionalize_variables`: the variable's value on entry is a parameter in its
    // resource's place; its final value (it is assigned) follows the results.
    let g = crate::testing::graphs::state_graph();
    let text = emit_module(&g).unwrap();
    assert!(
        text.contains(
            "func.func @state(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>)"
        ),
        "{text}"
    );
    assert!(text.contains("stablehlo.add %arg0, %arg1"), "{text}");
}

#[test]
fn errors_name_the_node_and_every_enclosing_call() {
    let g = graph(
        r#"graph @outer

func @outer(%0: f32[3]) -> (f32[3]) {
  %1 = call(%0) {function=@inner} : f32[3] loc("model.py":90)
  return %1
}

func @inner(%0: f32[3]) -> (f32[3]) {
  %1 = stack_new() {element=f32[?]} : stack<f32[?]> loc("model.py":91)
  %2 = sin(%0) : f32[3]
  return %2
}
"#,
    );
    let err = emit_module(&g).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Compile, "{err}");
    let msg = err.to_string();
    let want = "stack_new: a stack of elements with unknown dimensions [?] is not supported by \
                the MLIR emitter\n  at %1 = stack_new in @inner (model.py:91)\n  \
                at %1 = call in @outer (model.py:90)";
    assert_eq!(msg, want);
}

#[test]
fn function_names_that_are_not_identifiers_are_quoted() {
    let text = emit_module(&crate::testing::graphs::constants_graph()).unwrap();
    filecheck(
        &text,
        r#"
        CHECK: func.func @"consts <lambda>"() -> (tensor<2x3xf64>, tensor<3xf64>) {
        CHECK-NEXT: stablehlo.constant dense<[[0.1, -0.0, 1.0e-7], [0x7FC00000, 0x7F800000, 3.0]]> : tensor<2x3xf32>
        CHECK-NEXT: stablehlo.constant dense<[0.1, 1.0e300, -2.5]> : tensor<3xf64>
        CHECK-NEXT: stablehlo.constant dense<[-2147483648, 7]> : tensor<2xi32>
        CHECK-NEXT: stablehlo.constant dense<9223372036854775807> : tensor<i64>
        CHECK-NEXT: stablehlo.constant dense<[true, false]> : tensor<2xi1>
        CHECK-NEXT: stablehlo.constant dense<0.1> : tensor<2x3xf64>
        "#,
    );
}

#[test]
fn control_flow_without_values_or_trips_emits() {
    let texts = [
        r#"graph @e1

func @e1(%0: bool[], %1: i32[]) -> () {
  %2 = if(%0) {then=@none, else=@none} : ()
  %3 = case(%1) {branches=[@none]} : ()
  return
}

func @none() -> () {
  return
}
"#,
        r#"graph @e2

func @e2(%0: f32[5]) -> (f32[5]) {
  %1 = while(%0) {cond=@c, body=@b, maximum_iterations=0, parallel_iterations=1} : f32[5]
  return %1
}

func @c(%0: f32[5]) -> (bool[]) {
  %1 = const() {value=[true]} : bool[]
  return %1
}

func @b(%0: f32[5]) -> (f32[5]) {
  %1 = sin(%0) : f32[5]
  return %1
}
"#,
    ];
    // No results: `scf.if` without types, a one-branch case is its branch inlined.
    filecheck(
        &emit(texts[0]),
        "CHECK: func.func @e1(%arg0: tensor<i1>, %arg1: tensor<i32>) {\n\
         CHECK-NEXT: tensor.extract %arg0[]\nCHECK-NEXT: scf.if %0 {\nCHECK-NEXT: scf.yield\n\
         CHECK-NEXT: } else {\nCHECK-NEXT: scf.yield\nCHECK: return",
    );
    // maximum_iterations = 0: the counter test fails before the first trip.
    filecheck(
        &emit(texts[1]),
        "CHECK: %1 = arith.constant 0 : i64\nCHECK: arith.cmpi slt, %4, %1 : i64",
    );
}

#[test]
fn a_bounded_loop_gets_its_stacks_made_full_size() {
    // maximum_iterations = 1000, one push per trip onto each stack: each buffer is made with
    // 1000 rows before the loop (or the next capacity no other stack of the module has), and
    // the pushes never grow it
    let text = emit_module(&crate::testing::traced::while_sin_of(5, 1, Some(1000))).unwrap();
    let checks = r#"
        CHECK: %2 = arith.constant 16 : index
        CHECK-NEXT: %3 = tensor.empty(%2) : tensor<?x5xf64>
        CHECK: %8 = arith.constant 1000 : index
        CHECK-NEXT: %9 = tensor.empty(%8) : tensor<?x5xf64>
        CHECK-NEXT: %10 = arith.constant 1001 : index
        CHECK-NEXT: %11 = tensor.empty(%10) : tensor<?x5xf64>
        CHECK: scf.while ({{*}}, %{{*}} = %9, %{{*}} = %4, %{{*}} = %11, %{{*}} = %7) : (
        CHECK: stablehlo.sine
        CHECK-NOT: scf.if
        CHECK: tensor.insert_slice
        CHECK-NOT: scf.if
        CHECK: tensor.insert_slice
        CHECK-NOT: scf.if
        CHECK: return
        "#;
    filecheck(&text, checks);
}

#[test]
fn nested_bounded_loops_need_no_growth_checks() {
    // outer at most 4 trips, inner at most 3 (the gradient reruns the inner loop in the
    // backward one, with stacks of its own): every stack is made full size up front
    let bounded = emit_module(&crate::testing::traced::nested_loops_of(5, 1, Some(4))).unwrap();
    assert!(!bounded.contains("scf.if"), "{bounded}");
    // an unbounded outer loop: the stacks keep growing as needed
    let unbounded = emit_module(&crate::testing::traced::nested_loops_of(5, 1, None)).unwrap();
    assert!(unbounded.contains("scf.if"), "{unbounded}");
}

#[test]
fn list_stacks_keep_tensors_as_buffer_views() {
    // EmitOptions::list_stacks: a push exports the value into the list, a pop imports it back
    let options = super::EmitOptions {
        list_stacks: true,
        ..Default::default()
    };
    let text = super::emit_module_with(&crate::testing::traced::while_sin_of(5, 1, None), options)
        .unwrap();
    let checks = r#"
        CHECK: %{{*}} = util.list.create %{{*}} : !util.list<?>
        CHECK: %{{*}} = util.list.create %{{*}} : !util.list<?>
        CHECK: scf.while
        CHECK: = hal.tensor.export %{{*}} : tensor<5xf64> -> !hal.buffer_view
        CHECK: util.list.set %{{*}}[%{{*}}], %{{*}} : !hal.buffer_view -> !util.list<?>
        CHECK: scf.while
        CHECK: = util.list.get %{{*}}[%{{*}}] : !util.list<?> -> !hal.buffer_view
        CHECK-NEXT: = hal.tensor.import %{{*}} : !hal.buffer_view -> tensor<5xf64>
        CHECK: return
        "#;
    filecheck(&text, checks);
    assert!(!text.contains("insert_slice"), "{text}");
}

#[test]
fn an_unrolled_gradient_loop_pops_every_iteration_before_its_first_dispatch() {
    // A pop between a trip's dispatches splits IREE's one submission per trip.
    let options = super::EmitOptions {
        list_stacks: true,
        unroll_loops: true,
        ..Default::default()
    };
    let text = super::emit_module_with(&crate::testing::traced::while_sin_of(5, 1, None), options)
        .unwrap();
    let backward = text.match_indices("scf.while").nth(1).map(|(at, _)| at);
    let trip = backward
        .and_then(|at| text[at..].find("} do {").map(|d| at + d))
        .expect("a gradient loop");
    let end = trip + text[trip..].find("scf.yield").expect("its trip's end");
    let body = &text[trip..end];
    let gets: Vec<usize> = body
        .match_indices("util.list.get")
        .map(|(at, _)| at)
        .collect();
    let first_dispatch = body.find("stablehlo.").expect("the trip computes");
    assert!(gets.len() >= 8, "{body}");
    assert!(gets.iter().all(|&g| g < first_dispatch), "{body}");
}

/// A branch yielding a value twice and two equal zeros; the other branch, distinct values.
const REPEATS: &str = r#"graph @rep

func @rep(%0: bool[], %1: f32[5]) -> (f32[5], f32[5], f32[5], f32[5]) {
  %2 = if(%0, %1) {then=@rep_then, else=@rep_else} : (f32[5], f32[5], f32[5], f32[5])
  return %2#0, %2#1, %2#2, %2#3
}

func @rep_then(%0: f32[5]) -> (f32[5], f32[5], f32[5], f32[5]) {
  %1 = sin(%0) : f32[5]
  %2 = fill_like(%0) {value=0.0} : f32[5]
  %3 = fill_like(%0) {value=0.0} : f32[5]
  return %1, %1, %2, %3
}

func @rep_else(%0: f32[5]) -> (f32[5], f32[5], f32[5], f32[5]) {
  %1 = sin(%0) : f32[5]
  %2 = cos(%0) : f32[5]
  %3 = exp(%0) : f32[5]
  %4 = neg(%0) : f32[5]
  return %1, %2, %3, %4
}
"#;

#[test]
fn cheap_branches_run_as_selects_in_the_fast_form() {
    let emit = |text: &str, unroll_loops: bool| {
        let options = EmitOptions {
            unroll_loops,
            ..Default::default()
        };
        emit_module_facts(&graph(text), options).unwrap().0
    };
    // both branches run, each result selected on the device: nothing waits for the predicate
    let text = emit(REPEATS, true);
    assert_eq!(text.matches("scf.if").count(), 0, "{text}");
    assert_eq!(text.matches("stablehlo.select").count(), 4, "{text}");
    assert_eq!(text.matches("tensor.extract").count(), 0, "{text}");
    assert!(text.contains("stablehlo.cosine") && text.contains("stablehlo.exponential"));
    // the plain form keeps the region
    assert_eq!(emit(REPEATS, false).matches("scf.if").count(), 1);
    // branches past the budget keep it too
    let big = REPEATS.replace("f32[5]", "f32[4096]");
    let text = emit(&big, true);
    assert_eq!(text.matches("scf.if").count(), 1, "{text}");
    assert_eq!(text.matches("stablehlo.select").count(), 0, "{text}");
}

#[test]
fn yield_barriers_put_the_chosen_branch_results_through_barriers() {
    let g = graph(REPEATS);
    let barriers = |kind: YieldBarriers| {
        let options = EmitOptions {
            yield_barriers: kind,
            ..Default::default()
        };
        let (text, facts) = emit_module_facts(&g, options).unwrap();
        let count = text.matches("stablehlo.optimization_barrier").count();
        (text, facts.yield_barriers, count)
    };
    // then-branch: sin twice (a repeat), two equal zeros (a constant repeat); else: 4 distinct
    assert_eq!(barriers(YieldBarriers::None).1, YieldBarriers::None);
    assert_eq!(barriers(YieldBarriers::None).2, 0);
    assert_eq!(barriers(YieldBarriers::Repeats).2, 1);
    assert_eq!(barriers(YieldBarriers::Constants).2, 2);
    assert_eq!(barriers(YieldBarriers::All).2, 8);
    assert_eq!(barriers(YieldBarriers::All).1, YieldBarriers::All);
}

#[test]
fn loops_of_cheap_ops_unroll_into_predicated_iterations() {
    let loop_of = |attrs: &str, width: usize| {
        let text = format!(
            "graph @f\n\nfunc @f(%0: f32[{width}]) -> (f32[{width}]) {{\n  \
             %1 = while(%0) {{cond=@c, body=@b{attrs}, parallel_iterations=1}} : f32[{width}]\n  \
             return %1\n}}\n\nfunc @c(%0: f32[{width}]) -> (bool[]) {{\n  \
             %1 = sum(%0) {{axes=[0], keepdims=false}} : f32[]\n  \
             %2 = const() {{value=[10.0]}} : f32[]\n  %3 = less(%1, %2) : bool[]\n  return %3\n}}\n\n\
             func @b(%0: f32[{width}]) -> (f32[{width}]) {{\n  %1 = sin(%0) : f32[{width}]\n  \
             %2 = add(%0, %1) : f32[{width}]\n  return %2\n}}\n"
        );
        let options = EmitOptions {
            unroll_loops: true,
            ..Default::default()
        };
        emit_module_facts(&graph(&text), options).unwrap()
    };
    // 8 elements (4 or fewer are host scalars): 8 + 8 + 8 of work per iteration and 8 of
    // condition, so 32 iterations a trip, each after the first kept only where the condition
    // (on the device) holds.
    let (text, facts) = loop_of("", 8);
    assert!(facts.unrolled_loops && facts.loops);
    assert_eq!(text.matches("stablehlo.sine").count(), 32, "{text}");
    assert_eq!(text.matches("stablehlo.select").count(), 31, "{text}");
    // A body of 32768-element ops fits one iteration per budget: not unrolled.
    let (text, facts) = loop_of("", 32768);
    assert!(!facts.unrolled_loops);
    assert_eq!(text.matches("stablehlo.sine").count(), 1);
    // 1024 elements (sin counts for several elements of work): 8 a trip.
    let (text, _) = loop_of("", 1024);
    assert_eq!(text.matches("stablehlo.sine").count(), 8, "{text}");
    // maximum_iterations with a condition the device decides (a reduction): unrolled, each
    // iteration also tested against the bound, its counter on the host and the number of
    // iterations kept read back once a trip.
    let (text, facts) = loop_of(", maximum_iterations=100", 8);
    assert!(facts.unrolled_loops);
    assert_eq!(text.matches("stablehlo.sine").count(), 32, "{text}");
    assert_eq!(text.matches("arith.cmpi slt").count(), 32, "{text}");
}

#[test]
fn unrolling_stops_when_the_modules_budget_is_spent() {
    // Twelve loops one after another, each of 4 nodes an iteration (sum and less, sin and
    // add) and cheap enough for 32 iterations a trip alone.
    const LOOPS: usize = 12;
    let mut text = String::from("graph @f\n\nfunc @f(%0: f32[5]) -> (f32[5]) {\n");
    for k in 0..LOOPS {
        text += &format!(
            "  %{} = while(%{k}) {{cond=@c, body=@b, parallel_iterations=1}} : f32[5]\n",
            k + 1
        );
    }
    text += &format!(
        "  return %{LOOPS}\n}}\n\nfunc @c(%0: f32[5]) -> (bool[]) {{\n  \
         %1 = sum(%0) {{axes=[0], keepdims=false}} : f32[]\n  \
         %2 = const() {{value=[10.0]}} : f32[]\n  %3 = less(%1, %2) : bool[]\n  return %3\n}}\n\n\
         func @b(%0: f32[5]) -> (f32[5]) {{\n  %1 = sin(%0) : f32[5]\n  \
         %2 = add(%0, %1) : f32[5]\n  return %2\n}}\n"
    );
    let options = EmitOptions {
        unroll_loops: true,
        ..Default::default()
    };
    let (text, facts) = emit_module_facts(&graph(&text), options).unwrap();
    assert!(facts.unrolled_loops);
    let loops: Vec<usize> = text
        .split("scf.while")
        .skip(1)
        .map(|trip| trip.matches("stablehlo.sine").count())
        .collect();
    assert_eq!(loops.len(), LOOPS, "{text}");
    // the first loops unrolled in full, the last not at all, and the iterations past each
    // trip's first within the budget
    assert_eq!(loops[0], 32, "{loops:?}");
    assert_eq!(loops[LOOPS - 1], 1, "{loops:?}");
    let added: usize = loops.iter().map(|n| (n - 1) * 4).sum();
    assert!(
        added <= crate::control::while_loop::trips::UNROLL_MODULE_NODES,
        "{loops:?}"
    );
    assert!(loops.windows(2).all(|w| w[0] >= w[1]), "{loops:?}");
}

#[test]
fn a_host_condition_chooses_a_trips_tensors_by_one_upload() {
    // W5's shape: `while i < n: i, x = i + 1, x + sin(x)`, the condition on the host. The
    // iterations run on from each other and the trip's end chooses `x` by the number kept,
    // uploaded once: a predicate uploaded per iteration made IREE record a command each.
    let text = "graph @f\n\nfunc @f(%0: f32[16], %1: i32[]) -> (f32[16]) {\n  \
                %2 = const() {value=[0]} : i32[]\n  \
                %3 = while(%2, %0, %1) {cond=@c, body=@b, parallel_iterations=1} \
                : (i32[], f32[16], i32[])\n  return %3#1\n}\n\n\
                func @c(%0: i32[], %1: f32[16], %2: i32[]) -> (bool[]) {\n  \
                %3 = less(%0, %2) : bool[]\n  return %3\n}\n\n\
                func @b(%0: i32[], %1: f32[16], %2: i32[]) -> (i32[], f32[16], i32[]) {\n  \
                %3 = const() {value=[1]} : i32[]\n  %4 = add(%0, %3) : i32[]\n  \
                %5 = sin(%1) : f32[16]\n  %6 = add(%1, %5) : f32[16]\n  \
                return %4, %6, %2\n}\n";
    let options = EmitOptions {
        unroll_loops: true,
        ..Default::default()
    };
    let (text, facts) = emit_module_facts(&graph(text), options).unwrap();
    assert!(facts.unrolled_loops);
    assert_eq!(text.matches("stablehlo.sine").count(), 32, "{text}");
    assert_eq!(text.matches("tensor.from_elements").count(), 1, "{text}");
    assert_eq!(text.matches("stablehlo.select").count(), 31, "{text}");
    // each iteration's sine reads the one before's sum, not a selected value
    let first_select = text.find("stablehlo.select").unwrap();
    assert!(
        text.rfind("stablehlo.sine").unwrap() < first_select,
        "{text}"
    );
}

#[test]
fn countdown_loops_unroll_exactly_then_finish_one_iteration_per_trip() {
    // `while n > 0: n, x = n - step, sin(x)`, the shape of a loop gradient's countdown.
    let loop_of = |step: i64, attrs: &str| {
        let text = format!(
            "graph @f\n\nfunc @f(%0: i64[], %1: f32[5]) -> (i64[], f32[5]) {{\n  \
             %2 = while(%0, %1) {{cond=@c, body=@b{attrs}, parallel_iterations=1}} \
             : (i64[], f32[5])\n  return %2#0, %2#1\n}}\n\n\
             func @c(%0: i64[], %1: f32[5]) -> (bool[]) {{\n  \
             %2 = const() {{value=[0]}} : i64[]\n  %3 = greater(%0, %2) : bool[]\n  \
             return %3\n}}\n\n\
             func @b(%0: i64[], %1: f32[5]) -> (i64[], f32[5]) {{\n  \
             %2 = const() {{value=[{step}]}} : i64[]\n  %3 = sub(%0, %2) : i64[]\n  \
             %4 = sin(%1) : f32[5]\n  return %3, %4\n}}\n"
        );
        let options = EmitOptions {
            unroll_loops: true,
            ..Default::default()
        };
        emit_module_facts(&graph(&text), options).unwrap()
    };
    // 8 iterations a trip while n >= 8, none predicated; then one a trip.
    let (text, facts) = loop_of(1, "");
    assert!(facts.unrolled_loops && facts.loops);
    assert_eq!(text.matches("scf.while").count(), 2, "{text}");
    assert_eq!(text.matches("arith.cmpi sge").count(), 1, "{text}");
    assert_eq!(text.matches("stablehlo.sine").count(), 9, "{text}");
    assert_eq!(text.matches("stablehlo.select").count(), 0, "{text}");
    // A body that steps by 2 is not a countdown (it is predicated instead).
    let (text, _) = loop_of(2, "");
    assert_eq!(text.matches("scf.while").count(), 1, "{text}");
    assert_eq!(text.matches("arith.cmpi sge").count(), 0, "{text}");
    // maximum_iterations: not a countdown, but the condition is computed on the host, so
    // predicated: each later iteration also within the bound, the counter advanced by the
    // iterations kept.
    let (text, facts) = loop_of(1, ", maximum_iterations=100");
    assert!(facts.unrolled_loops);
    assert_eq!(text.matches("arith.cmpi sge").count(), 0, "{text}");
    assert_eq!(text.matches("stablehlo.sine").count(), 32, "{text}");
    assert_eq!(text.matches("arith.cmpi slt").count(), 1 + 31, "{text}");
}

#[test]
fn pure_stablehlo_writes_stablehlo_control_flow_and_refuses_what_it_cannot_express() {
    let pure = EmitOptions {
        pure_stablehlo: true,
        ..Default::default()
    };
    // a loop's gradient with stacks: growable state has no StableHLO form
    let stacked = crate::testing::traced::while_sin_of(5, 1, None);
    let err = emit_module_with(&stacked, pure).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Compile);
    assert!(err.message.contains("growable stacks"), "{}", err.message);
    // a loop alone: stablehlo.while, its rank-0 state a tensor, no scf, arith or tensor ops
    let graph = graph(cases::WHILE);
    let text = emit_module_with(&graph, pure).unwrap();
    assert!(text.contains("\"stablehlo.while\""), "{text}");
    assert!(text.contains("stablehlo.compare LT"), "{text}"); // the counter's test
    for foreign in ["scf.", "arith.", "tensor.", "util."] {
        assert!(!text.contains(foreign), "{foreign} in {text}");
    }
    // a dimension known only at run time
    let dynamic =
        crate::graph::parse_graph("graph @f\nfunc @f(%0: f32[?]) -> (f32[?]) {\n  return %0\n}")
            .unwrap();
    let err = emit_module_with(&dynamic, pure).unwrap_err();
    assert!(err.message.contains("static shapes"), "{}", err.message);
}
