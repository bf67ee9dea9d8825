//! Small graphs built with `FunctionBuilder`, shared by the text and verifier tests: one per
//! feature of the IR (elementwise chain, reduction, If, While, Case, While nested in If,
//! variables and stacks, constants of every dtype).

use crate::dtype::DType;
use crate::graph::FunctionBuilder;
use crate::graph::{Case, If, StackOp, VariableOp, While};
use crate::graph::{Function, Location, NodeKind, Port, ValueType};
use crate::graph::{Graph, Library};
use crate::ops::{binary, creation, reduce, unary, Op};
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;

pub(crate) fn ty(dtype: DType, shape: &[usize]) -> ValueType {
    ValueType::tensor(dtype, shape)
}

pub(crate) fn f32s(shape: &[usize]) -> ValueType {
    ty(DType::F32, shape)
}

fn op1(b: &mut FunctionBuilder, op: impl Into<Op>, inputs: &[Port]) -> Port {
    b.add_op1(op, inputs, None).unwrap()
}

fn graph(functions: Vec<Function>) -> Graph {
    let entry = functions[0].name.clone();
    let mut lib = Library::new();
    for f in functions {
        lib.add(f).unwrap();
    }
    Graph::new(lib, entry).unwrap()
}

/// `tanh(sin(x) * y + exp(x))`, with source locations.
pub(crate) fn elementwise() -> Graph {
    let (mut b, a) = FunctionBuilder::new("chain", vec![f32s(&[3]), f32s(&[3])]);
    let loc = |line| Some(Location::new("model.py", line));
    let s = b.add_op1(unary::Sin, &[a[0]], loc(3)).unwrap();
    let m = b.add_op1(binary::Mul, &[s, a[1]], loc(3)).unwrap();
    let e = op1(&mut b, unary::Exp, &[a[0]]);
    let add = b.add_op1(binary::Add, &[m, e], loc(4)).unwrap();
    let t = op1(&mut b, unary::Tanh, &[add]);
    graph(vec![b.finish(&[t], &[]).unwrap()])
}

/// Sum and max over an axis of a matrix whose first dimension is unknown.
pub(crate) fn reduction() -> Graph {
    let (mut b, a) = FunctionBuilder::new("reduce", vec![f32s(&[DYN, 4])]);
    let sum = reduce::Sum {
        axes: vec![1],
        keepdims: true,
    };
    let s = op1(&mut b, sum, &[a[0]]);
    let max = reduce::ReduceMax {
        axes: vec![0, 1],
        keepdims: false,
    };
    let m = op1(&mut b, max, &[s]);
    graph(vec![b.finish(&[s, m], &[]).unwrap()])
}

/// A function of one f32[3] that applies `op`.
fn unary_fn(name: &str, op: impl Into<Op>) -> Function {
    let (mut b, a) = FunctionBuilder::new(name, vec![f32s(&[3])]);
    let y = op1(&mut b, op, &[a[0]]);
    b.finish(&[y], &[]).unwrap()
}

/// `sin(x) if p else cos(x) * 2`.
pub(crate) fn if_graph() -> Graph {
    let then_f = unary_fn("if_then", unary::Sin);
    let (mut b, a) = FunctionBuilder::new("if_else", vec![f32s(&[3])]);
    let c = op1(&mut b, unary::Cos, &[a[0]]);
    let two = b.add_const(Tensor::scalar(2.0f32));
    let y = op1(&mut b, binary::Mul, &[c, two]);
    let else_f = b.finish(&[y], &[]).unwrap();
    let lib = library(vec![then_f, else_f]);
    let (mut b, a) = FunctionBuilder::new("if_main", vec![ty(DType::Bool, &[]), f32s(&[3])]);
    let kind = NodeKind::If(If {
        then_branch: "if_then".into(),
        else_branch: "if_else".into(),
    });
    let out = b.add_call_node(kind, &[a[0], a[1]], &lib).unwrap();
    let main = b.finish(&out, &[]).unwrap();
    graph(vec![
        main,
        lib.get("if_then").unwrap().clone(),
        lib.get("if_else").unwrap().clone(),
    ])
}

fn library(functions: Vec<Function>) -> Library {
    let mut lib = Library::new();
    for f in functions {
        lib.add(f).unwrap();
    }
    lib
}

/// `cond(i, x) = i < n`, `body(i, x, n) = (i + 1, x * x, n)`, prefixed with `prefix`.
fn loop_functions(prefix: &str) -> (Function, Function) {
    let vars = vec![ty(DType::I32, &[]), f32s(&[3]), ty(DType::I32, &[])];
    let (mut b, a) = FunctionBuilder::new(format!("{prefix}cond"), vars.clone());
    let lt = op1(&mut b, binary::Less, &[a[0], a[2]]);
    let cond = b.finish(&[lt], &[]).unwrap();
    let (mut b, a) = FunctionBuilder::new(format!("{prefix}body"), vars);
    let one = b.add_const(Tensor::scalar(1i32));
    let i = op1(&mut b, binary::Add, &[a[0], one]);
    let x = op1(&mut b, binary::Mul, &[a[1], a[1]]);
    let body = b.finish(&[i, x, a[2]], &[]).unwrap();
    (cond, body)
}

fn while_kind(prefix: &str, maximum_iterations: Option<i64>) -> NodeKind {
    NodeKind::While(While {
        cond: format!("{prefix}cond"),
        body: format!("{prefix}body"),
        maximum_iterations,
        parallel_iterations: 10,
        checkpoints: None,
    })
}

/// Squares `x` `n` times: a While with cond and body.
pub(crate) fn while_graph() -> Graph {
    let (cond, body) = loop_functions("w_");
    let lib = library(vec![cond.clone(), body.clone()]);
    let (mut b, a) = FunctionBuilder::new("w_main", vec![f32s(&[3]), ty(DType::I32, &[])]);
    let zero = b.add_const(Tensor::scalar(0i32));
    let out = b
        .add_call_node(while_kind("w_", Some(100)), &[zero, a[0], a[1]], &lib)
        .unwrap();
    let main = b.finish(&[out[1]], &[]).unwrap();
    graph(vec![main, cond, body])
}

/// `[neg, exp, sin][i](x)` (out of range: sin).
pub(crate) fn case_graph() -> Graph {
    let branches = vec![
        unary_fn("case_neg", unary::Neg),
        unary_fn("case_exp", unary::Exp),
        unary_fn("case_sin", unary::Sin),
    ];
    let lib = library(branches.clone());
    let (mut b, a) = FunctionBuilder::new("case_main", vec![ty(DType::I32, &[]), f32s(&[3])]);
    let names = branches.iter().map(|f| f.name.clone()).collect();
    let out = b
        .add_call_node(NodeKind::Case(Case { branches: names }), &a, &lib)
        .unwrap();
    let main = b.finish(&out, &[]).unwrap();
    let mut all = vec![main];
    all.extend(branches);
    graph(all)
}

/// `if p: loop(x, n) else: x` — a While inside a branch function.
pub(crate) fn nested_graph() -> Graph {
    let (cond, body) = loop_functions("n_");
    let lib = library(vec![cond.clone(), body.clone()]);
    let branch_params = vec![f32s(&[3]), ty(DType::I32, &[])];
    let (mut b, a) = FunctionBuilder::new("n_then", branch_params.clone());
    let zero = b.add_const(Tensor::scalar(0i32));
    let out = b
        .add_call_node(while_kind("n_", None), &[zero, a[0], a[1]], &lib)
        .unwrap();
    let then_f = b.finish(&[out[1]], &[]).unwrap();
    let (b, a) = FunctionBuilder::new("n_else", branch_params);
    let else_f = b.finish(&[a[0]], &[]).unwrap();
    let lib = library(vec![then_f.clone(), else_f.clone()]);
    let params = vec![ty(DType::Bool, &[]), f32s(&[3]), ty(DType::I32, &[])];
    let (mut b, a) = FunctionBuilder::new("n_main", params);
    let kind = NodeKind::If(If {
        then_branch: "n_then".into(),
        else_branch: "n_else".into(),
    });
    let out = b.add_call_node(kind, &a, &lib).unwrap();
    let main = b.finish(&out, &[]).unwrap();
    graph(vec![main, then_f, else_f, cond, body])
}

/// Reads a variable, adds `x` to it (ordered after the read), and round-trips the value
/// through a stack.
pub(crate) fn state_graph() -> Graph {
    let elem = TensorType::new(DType::F32, &[3]);
    let params = vec![ValueType::Resource(elem.clone()), f32s(&[3])];
    let (mut b, a) = FunctionBuilder::new("state", params);
    let r = b
        .add_node(
            NodeKind::Variable(VariableOp::Read),
            &[a[0]],
            vec![f32s(&[3])],
        )
        .unwrap()[0];
    b.add_node(
        NodeKind::Variable(VariableOp::AssignAdd),
        &[a[0], a[1]],
        vec![],
    )
    .unwrap();
    let assign = r.node + 1;
    b.add_control_inputs(assign, &[r.node]).unwrap();
    b.set_location(assign, Location::new("dir/\"odd\" file.py", 7))
        .unwrap();
    let stack_ty = ValueType::Stack(elem.clone());
    let kind = NodeKind::Stack(StackOp::New { element: elem });
    let s = b.add_node(kind, &[], vec![stack_ty.clone()]).unwrap()[0];
    let s = b
        .add_node(
            NodeKind::Stack(StackOp::Push),
            &[s, r],
            vec![stack_ty.clone()],
        )
        .unwrap()[0];
    let popped = b
        .add_node(
            NodeKind::Stack(StackOp::Pop),
            &[s],
            vec![stack_ty, f32s(&[3])],
        )
        .unwrap();
    graph(vec![b.finish(&[popped[1]], &[assign]).unwrap()])
}

/// Constants of every dtype (with floats that need every digit) and attributed ops, in a
/// function whose name must be quoted.
pub(crate) fn constants_graph() -> Graph {
    let (mut b, _) = FunctionBuilder::new("consts <lambda>", vec![]);
    let f = Tensor::from_vec(
        vec![0.1f32, -0.0, 1e-7, f32::NAN, f32::INFINITY, 3.0],
        &[2, 3],
    );
    let f = b.add_const(f.unwrap());
    let d = b.add_const(Tensor::from_vec(vec![0.1f64, 1e300, -2.5], &[3]).unwrap());
    b.add_const(Tensor::from_vec(vec![i32::MIN, 7], &[2]).unwrap());
    b.add_const(Tensor::scalar(i64::MAX));
    b.add_const(Tensor::from_vec(vec![true, false], &[2]).unwrap());
    let fill = creation::Fill {
        dtype: DType::F64,
        shape: [2, 3].as_slice().into(),
        value: 0.1,
    };
    let filled = op1(&mut b, fill, &[]);
    let cast = op1(&mut b, creation::Cast { to: DType::F64 }, &[f]);
    let y = op1(&mut b, binary::Add, &[filled, cast]);
    graph(vec![b.finish(&[y, d], &[]).unwrap()])
}

/// Every example, named.
pub(crate) fn all() -> Vec<(&'static str, Graph)> {
    vec![
        ("elementwise", elementwise()),
        ("reduction", reduction()),
        ("if", if_graph()),
        ("while", while_graph()),
        ("case", case_graph()),
        ("nested", nested_graph()),
        ("state", state_graph()),
        ("constants", constants_graph()),
    ]
}
