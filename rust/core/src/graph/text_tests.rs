//! Text form tests: golden text, exact round trips of every example and of random op chains,
//! hand-written text, and parse errors with their positions.

use super::builder::FunctionBuilder;
use super::ir::{Function, Location, Node, NodeKind, Port};
use super::library::{Graph, Library};
use super::parse::{parse_function, parse_graph};
use super::verify::verify;
use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::ops::{binary, creation, layout, reduce, unary, Op};
use crate::shape::{numel, TensorType, DYN};
use crate::tensor::Tensor;
use crate::testing::graphs::{self as examples, f32s};

/// parse(print(g)) == g and print(parse(print(g))) == print(g).
fn assert_round_trip(g: &Graph) {
    let text = g.to_string();
    let back = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n--- text:\n{text}"));
    assert_eq!(&back, g, "structure changed through\n{text}");
    assert_eq!(back.to_string(), text);
}

#[test]
fn every_example_round_trips() {
    for (name, g) in examples::all() {
        verify(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_round_trip(&g);
    }
}

#[test]
fn golden_elementwise_and_if() {
    let chain = "\
graph @chain

func @chain(%0: f32[3], %1: f32[3]) -> (f32[3]) {
  %2 = sin(%0) : f32[3] loc(\"model.py\":3)
  %3 = mul(%2, %1) : f32[3] loc(\"model.py\":3)
  %4 = exp(%0) : f32[3]
  %5 = add(%3, %4) : f32[3] loc(\"model.py\":4)
  %6 = tanh(%5) : f32[3]
  return %6
}
";
    assert_eq!(examples::elementwise().to_string(), chain);
    let if_text = "\
graph @if_main

func @if_main(%0: bool[], %1: f32[3]) -> (f32[3]) {
  %2 = if(%0, %1) {then=@if_then, else=@if_else} : f32[3]
  return %2
}

func @if_then(%0: f32[3]) -> (f32[3]) {
  %1 = sin(%0) : f32[3]
  return %1
}

func @if_else(%0: f32[3]) -> (f32[3]) {
  %1 = cos(%0) : f32[3]
  %2 = const() {value=[2.0]} : f32[]
  %3 = mul(%1, %2) : f32[3]
  return %3
}
";
    assert_eq!(examples::if_graph().to_string(), if_text);
}

#[test]
fn golden_state_reduction_and_constants() {
    let state = examples::state_graph().to_string();
    for line in [
        "func @state(%0: resource<f32[3]>, %1: f32[3]) -> (f32[3]) {",
        "  %3 = assign_add_variable(%0, %1) ctrl(%2) : () loc(\"dir/\\\"odd\\\" file.py\":7)",
        "  %4 = stack_new() {element=f32[3]} : stack<f32[3]>",
        "  %6 = stack_pop(%5) : (stack<f32[3]>, f32[3])",
        "  return %6#1 ctrl(%3)",
    ] {
        assert!(state.contains(line), "missing {line:?} in\n{state}");
    }
    let red = examples::reduction().to_string();
    assert!(
        red.contains("%1 = sum(%0) {axes=[1], keepdims=true} : f32[?, 1]"),
        "{red}"
    );
    assert!(red.contains("-> (f32[?, 1], f32[])"), "{red}");
    let consts = examples::constants_graph().to_string();
    for part in [
        "graph @\"consts <lambda>\"",
        "{value=[0.1, -0.0, 1e-7, NaN, inf, 3.0]} : f32[2, 3]",
        "{value=[-2147483648, 7]} : i32[2]",
        "{value=[true, false]} : bool[2]",
        "fill() {dtype=f64, shape=[2, 3], value=0.1} : f64[2, 3]",
        "cast(%0) {to=f64}",
    ] {
        assert!(consts.contains(part), "missing {part:?} in\n{consts}");
    }
    let w = examples::while_graph().to_string();
    assert!(w.contains("{cond=@w_cond, body=@w_body, maximum_iterations=100, parallel_iterations=10} : (i32[], f32[3], i32[])"), "{w}");
    assert!(w.contains("return %3#1"), "{w}");
}

#[test]
fn every_op_kind_round_trips_through_text() {
    let ops = crate::ops::attrs::tests::samples();
    let nodes = ops
        .into_iter()
        .map(|op| Node::new(NodeKind::Op(op), vec![], vec![]));
    let f = Function {
        name: "ops".into(),
        params: vec![],
        nodes: nodes.collect(),
        results: vec![],
        control_outputs: vec![],
    };
    let text = f.to_string();
    assert!(
        text.contains("scatter_add() {axis=1, dim_size=?} : ()"),
        "{text}"
    );
    assert!(
        text.contains("arange() {dtype=f32, start=-0.0, step=1e-300, len=4}"),
        "{text}"
    );
    let back = parse_function(&text).unwrap();
    assert_eq!(back, f);
    assert_eq!(back.to_string(), text);
}

#[test]
fn hand_written_text_with_names_and_comments_prints_canonically() {
    let src = "
// a comment
graph @main
func @main(%p: bool[], %x: f32[3]) -> (f32[3]) {
  %s = sin(%x) : f32[3]
  %r = if(%p, %s) {else=@b, then=@a} : f32[3]   // attributes in any order
  return %r
}
func @a(%v: f32[3]) -> (f32[3]) { return %v }
func @b(%v: f32[3]) -> (f32[3]) {
  %n = neg(%v) : f32[3]
  return %n
}
";
    let g = parse_graph(src).unwrap();
    verify(&g).unwrap();
    let text = g.to_string();
    assert!(
        text.contains("  %3 = if(%0, %2) {then=@a, else=@b} : f32[3]\n  return %3\n"),
        "{text}"
    );
    assert!(
        text.contains("func @a(%0: f32[3]) -> (f32[3]) {\n  return %0\n}"),
        "{text}"
    );
    assert_round_trip(&g);
}

#[test]
fn located_args_print_as_explicit_nodes_and_round_trip() {
    let (mut b, a) = FunctionBuilder::new("located", vec![f32s(&[3])]);
    b.set_location(a[0].node, Location::new("m.py", 1)).unwrap();
    let f = b.finish(&[], &[a[0].node]).unwrap();
    let text = f.to_string();
    assert!(text.starts_with("func @located(f32[3]) -> () {\n  %0 = arg() {index=0} : f32[3] loc(\"m.py\":1)\n  return ctrl(%0)\n"), "{text}");
    assert_eq!(parse_function(&text).unwrap(), f);
}

/// xorshift64: deterministic randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random op for a value of type `t`, with `other` as a possible second operand.
fn random_op(rng: &mut Rng, t: &TensorType) -> (Op, usize) {
    let unary: [Op; 7] = [
        unary::Neg.into(),
        unary::Exp.into(),
        unary::Sin.into(),
        unary::Tanh.into(),
        unary::Sigmoid.into(),
        unary::Relu.into(),
        unary::Abs.into(),
    ];
    let binary: [Op; 6] = [
        binary::Add.into(),
        binary::Sub.into(),
        binary::Mul.into(),
        binary::Div.into(),
        binary::Maximum.into(),
        binary::Less.into(),
    ];
    match rng.below(6) {
        0 | 1 => (unary[rng.below(unary.len())].clone(), 1),
        2 => (binary[rng.below(binary.len())].clone(), 2),
        3 => {
            let axes = (0..t.ndim()).filter(|_| rng.below(2) == 0).collect();
            (
                reduce::Sum {
                    axes,
                    keepdims: rng.below(2) == 0,
                }
                .into(),
                1,
            )
        }
        4 if numel(&t.shape) != DYN => (
            layout::Reshape {
                shape: [numel(&t.shape)].as_slice().into(),
            }
            .into(),
            1,
        ),
        4 => (
            layout::Transpose {
                perm: (0..t.ndim()).rev().collect(),
            }
            .into(),
            1,
        ),
        _ => {
            let value = f64::from_bits(rng.next());
            let value = if value.is_nan() { 0.25 } else { value };
            (
                creation::Fill {
                    dtype: DType::F32,
                    shape: t.shape.clone(),
                    value,
                }
                .into(),
                0,
            )
        }
    }
}

/// A function of random chains of ops (ops whose rule rejects the operands are skipped).
fn random_function(rng: &mut Rng) -> Graph {
    let (mut b, args) =
        FunctionBuilder::new("random", vec![f32s(&[DYN, 3]), f32s(&[2, 3]), f32s(&[3])]);
    let mut pool: Vec<Port> = args;
    for _ in 0..16 {
        if rng.below(8) == 0 {
            let bits = rng.next() as u32;
            pool.push(
                b.add_const(
                    Tensor::from_vec(vec![f32::from_bits(bits), 0.5], &[2])
                        .unwrap_or_else(|e| panic!("{e}")),
                ),
            );
            continue;
        }
        let x = pool[rng.below(pool.len())];
        let Some(t) = b.port_type(x).ok().and_then(|t| t.as_tensor().cloned()) else {
            continue;
        };
        let (op, arity) = random_op(rng, &t);
        let inputs: Vec<Port> = [x, pool[rng.below(pool.len())]][..arity].to_vec();
        if let Ok(p) = b.add_op(op, &inputs, None) {
            pool.extend(p);
        }
    }
    let results = [pool[pool.len() - 1], pool[pool.len() / 2]];
    let mut lib = Library::new();
    lib.add(b.finish(&results, &[]).unwrap()).unwrap();
    Graph::new(lib, "random").unwrap()
}

#[test]
fn random_op_chains_round_trip_and_verify() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..200 {
        let g = random_function(&mut rng);
        verify(&g).unwrap_or_else(|e| panic!("{e}"));
        assert_round_trip(&g);
    }
}

/// Parsing `src` fails with a `Graph` error whose message starts with `start`.
fn parse_error(src: &str, start: &str) -> String {
    let err = parse_graph(src).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Graph);
    assert!(
        err.message.starts_with(start),
        "expected {start:?}, got:\n{}",
        err.message
    );
    err.message
}

fn in_function(body: &str) -> String {
    format!("graph @f\nfunc @f(%x: f32[3]) -> (f32[3]) {{\n{body}\n  return %y\n}}\n")
}

#[test]
fn parse_errors_name_line_column_and_what_was_expected() {
    let msg = parse_error(
        &in_function("  %y sin(%x) : f32[3]"),
        "line 3, column 6: expected `=`, found `sin`",
    );
    assert!(
        msg.ends_with("\n    %y sin(%x) : f32[3]\n       ^"),
        "{msg}"
    );
    parse_error(
        &in_function("  %y = sin(%z) : f32[3]"),
        "line 3, column 12: undefined value %z",
    );
    parse_error(
        &in_function("  %y = sinn(%x) : f32[3]"),
        "line 3, column 8: op: unknown op `sinn`",
    );
    parse_error(
        &in_function("  %y = sum(%x) {axes=[0]} : f32[]"),
        "line 3, column 8: sum: missing attribute `keepdims`",
    );
    parse_error(
        &in_function("  %y = sin(%x) : f33[3]"),
        "line 3, column 18: expected a type such as `f32[2, 3]`, found `f33`",
    );
    parse_error(
        &in_function("  %y = sin(%x) : f32[3]\n  %y = cos(%x) : f32[3]"),
        "line 4, column 3: value %y is defined twice",
    );
    parse_error(
        &in_function("  %y = const() {value=[1.0, 2.0]} : f32[3]"),
        "line 3, column 23: const: 2 elements cannot have shape [3]",
    );
    parse_error(
        &in_function("  %y = const() {value=[1.5]} : i32[]"),
        "line 3, column 24: expected an element of dtype int32",
    );
    parse_error(
        &in_function("  %y = sin(%x) : f32[3] loc(\"a.py:1)"),
        "line 3, column 29: unterminated string",
    );
    parse_error(
        &in_function("  %y = if(%x) {then=@a, else=@b, foo=1} : f32[3]"),
        "line 3, column 34: if: unknown attribute `foo`",
    );
    parse_error(
        &in_function("  %y = transpose(%x) {perm=[0], perm=[0]} : f32[3]"),
        "line 3, column 33: attribute `perm` is given twice",
    );
    parse_error(
        "graph @f\nfunc @f(%x: f32[3]) -> (f32[2]) {\n  return %x\n}",
        "line 2, column 25: declared result type f32[2], but %0#0 is f32[3]",
    );
    parse_error(
        "graph @f\nfunc @f() -> () {\n",
        "line 3, column 1: expected a value `%name`, found end of input",
    );
}

#[test]
fn graph_level_parse_errors() {
    let f = "func @f() -> () {\n  return\n}\n";
    parse_error(
        &format!("graph @f\n{f}{f}"),
        "line 5, column 1: function @f is already defined",
    );
    parse_error(
        &format!("graph @g\n{f}"),
        "line 1, column 1: no function @g in the library (defined: @f)",
    );
    parse_error(f, "line 1, column 1: expected `graph`, found `func`");
    let err = parse_function(&format!("{f}extra")).unwrap_err();
    assert!(
        err.message
            .starts_with("line 4, column 1: expected end of input, found `extra`"),
        "{err}"
    );
}

/// A call with a custom gradient function (`gl.custom_gradient` traced in graph mode).
const CUSTOM: &str = "\
graph @main

func @main(%0: f32[3]) -> (f32[3]) {
  %1 = call(%0) {function=@square, gradient=@square_grad} : f32[3]
  return %1
}

func @square(%0: f32[3]) -> (f32[3]) {
  %1 = mul(%0, %0) : f32[3]
  return %1
}

func @square_grad(%0: f32[3], %1: f32[3], %2: f32[3]) -> (f32[3]) {
  %3 = const() {value=[3.0]} : f32[]
  %4 = mul(%2, %3) : f32[3]
  return %4
}
";

#[test]
fn a_custom_gradient_call_round_trips_and_verifies() {
    let g = parse_graph(CUSTOM).unwrap();
    verify(&g).unwrap();
    assert_eq!(g.to_string(), CUSTOM);
}

/// `CUSTOM` with a custom tangent function and the reason it has no derivative
/// (`gl.custom_jvp` traced in graph mode): both round-trip, a string escaped.
fn custom_tangent() -> String {
    let call = "gradient=@square_grad}";
    let refused = r#"refused="its rule failed: \"x\"\n""#;
    CUSTOM.replace(
        call,
        &format!("gradient=@square_grad, tangent=@square_jvp, {refused}}}"),
    ) + "\nfunc @square_jvp(%0: f32[3], %1: f32[3], %2: f32[3]) -> (f32[3]) {\n  \
           %3 = mul(%0, %2) : f32[3]\n  return %3\n}\n"
}

#[test]
fn a_custom_tangent_call_round_trips_verifies_and_checks_its_signature() {
    let text = custom_tangent();
    let g = parse_graph(&text).unwrap();
    verify(&g).unwrap();
    assert_eq!(g.to_string(), text);
    // The tangent returns one value per result, typed like it: here an f64 for an f32.
    let bad = text
        .replace(
            "%3 = mul(%0, %2) : f32[3]\n  return %3",
            "%3 = cast(%2) {to=f64} : f64[3]\n  return %3",
        )
        .replace(
            "func @square_jvp(%0: f32[3], %1: f32[3], %2: f32[3]) -> (f32[3])",
            "func @square_jvp(%0: f32[3], %1: f32[3], %2: f32[3]) -> (f64[3])",
        );
    let err = verify(&parse_graph(&bad).unwrap()).unwrap_err();
    assert!(
        err.message
            .contains("tangent @square_jvp returns f64[3] for result 0, which is f32[3]"),
        "{err}"
    );
}

#[test]
fn a_custom_gradient_of_the_wrong_signature_is_rejected() {
    // The gradient takes (operands, results, cotangents): here the cotangent is missing.
    let bad = CUSTOM.replace(", %2: f32[3]) -> (f32[3]) {", ") -> (f32[3]) {");
    let bad = bad.replace("mul(%2, %3)", "mul(%1, %3)");
    let g = parse_graph(&bad).unwrap();
    let err = verify(&g).unwrap_err();
    assert!(
        err.message
            .contains("gradient @square_grad takes 2 argument(s) but the node passes 3"),
        "{err}"
    );
}
