//! Verifier tests: every example passes; each class of malformed graph is rejected with a
//! message naming the node and function and showing the text around it.

use super::builder::FunctionBuilder;
use super::ir::{Call, Case, If, VariableOp, While};
use super::ir::{Function, NodeKind, Port, ValueType};
use super::library::{Graph, Library};
use super::verify::{verify, verify_function};
use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::ops::{reduce, unary};
use crate::shape::TensorType;
use crate::testing::graphs::{self as examples, f32s, ty};

/// `g` with function `name` changed by `edit`.
fn mutate(mut g: Graph, name: &str, edit: impl FnOnce(&mut Function)) -> Graph {
    let mut f = g.library.get(name).unwrap().clone();
    edit(&mut f);
    g.library.replace(f).unwrap();
    g
}

/// Verifying `g` fails with a `Graph` error containing every needle.
fn rejects(g: &Graph, needles: &[&str]) -> String {
    let err = verify(g).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Graph);
    for needle in needles {
        assert!(
            err.message.contains(needle),
            "missing {needle:?} in:\n{}",
            err.message
        );
    }
    err.message
}

#[test]
fn every_example_verifies() {
    for (name, g) in examples::all() {
        verify(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn errors_show_the_function_text_around_the_bad_node() {
    let g = mutate(examples::elementwise(), "chain", |f| {
        f.nodes[4].inputs[0] = Port::new(6, 0)
    });
    let msg = rejects(
        &g,
        &["%4 in @chain: input 0 (%6) is not defined before this node"],
    );
    let lines: Vec<&str> = msg.lines().collect();
    assert_eq!(
        lines[1], "     func @chain(%0: f32[3], %1: f32[3]) -> (f32[3]) {",
        "{msg}"
    );
    assert_eq!(
        lines[2], "       %2 = sin(%0) : f32[3] loc(\"model.py\":3)",
        "{msg}"
    );
    assert_eq!(lines[4], "  >>   %4 = exp(%6) : f32[3]", "{msg}");
    assert_eq!(lines[7], "       return %6", "{msg}");
    assert_eq!(lines[8], "     ...", "{msg}");
    assert_eq!(lines.len(), 9, "{msg}");
}

#[test]
fn rejects_bad_edges_args_and_results() {
    let g = examples::elementwise();
    let bad_output = mutate(g.clone(), "chain", |f| {
        f.nodes[3].inputs[1] = Port::new(1, 2)
    });
    rejects(
        &bad_output,
        &["%3 in @chain: input 1 is output #2 of %1, which has 1 output(s)"],
    );
    let bad_ctrl = mutate(g.clone(), "chain", |f| f.nodes[3].control_inputs.push(5));
    rejects(
        &bad_ctrl,
        &["%3 in @chain: control input %5 is not an earlier node"],
    );
    let arg_type = mutate(g.clone(), "chain", |f| f.params[1] = f32s(&[4]));
    rejects(
        &arg_type,
        &["%1 in @chain: Arg(1) must have the parameter's type f32[4]"],
    );
    let extra_param = mutate(g.clone(), "chain", |f| f.params.push(f32s(&[3])));
    rejects(
        &extra_param,
        &["%2 in @chain: node 2 must be the Arg of parameter 2, found sin"],
    );
    let late_arg = mutate(g.clone(), "chain", |f| f.nodes[6].kind = NodeKind::Arg(0));
    rejects(&late_arg, &["%6 in @chain: Arg(0) must be node 0"]);
    let result = mutate(g.clone(), "chain", |f| f.results = vec![Port::new(99, 0)]);
    rejects(
        &result,
        &[
            "return of @chain: result 0 (%99#0) names no value",
            ">>   return %99",
        ],
    );
    let ctrl_out = mutate(g, "chain", |f| f.control_outputs = vec![42]);
    rejects(
        &ctrl_out,
        &["return of @chain: control output %42 names no node"],
    );
}

#[test]
fn rejects_op_types_that_disagree_with_the_op_table() {
    let g = examples::elementwise();
    let wrong = mutate(g.clone(), "chain", |f| {
        f.nodes[2].outputs = vec![f32s(&[4])]
    });
    rejects(
        &wrong,
        &["%2 in @chain: output types (f32[4]) do not match the expected (f32[3])"],
    );
    let count = mutate(g.clone(), "chain", |f| f.nodes[2].outputs.push(f32s(&[3])));
    rejects(&count, &["%2 in @chain: output types (f32[3], f32[3])"]);
    let arity = mutate(g, "chain", |f| f.nodes[2].inputs.push(Port::new(1, 0)));
    rejects(
        &arity,
        &["%2 in @chain: the rule of sin rejects its inputs: sin: expected 1 inputs, got 2"],
    );
    let body = mutate(examples::while_graph(), "w_body", |f| {
        f.nodes[4].inputs[1] = Port::new(1, 0)
    });
    rejects(
        &body,
        &["%4 in @w_body: the rule of add rejects its inputs: add:"],
    );
}

#[test]
fn rejects_bad_if_and_case_nodes() {
    let g = examples::if_graph();
    let pred = mutate(g.clone(), "if_main", |f| {
        f.params[0] = f32s(&[]);
        f.nodes[0].outputs = vec![f32s(&[])];
    });
    rejects(
        &pred,
        &["%2 in @if_main: the predicate must be a bool scalar, got f32[]"],
    );
    let missing = mutate(g.clone(), "if_main", |f| {
        f.nodes[2].kind = NodeKind::If(If {
            then_branch: "nope".into(),
            else_branch: "if_else".into(),
        });
    });
    rejects(
        &missing,
        &["%2 in @if_main: then branch @nope is not in the library"],
    );
    let disagree = mutate(g.clone(), "if_else", |f| {
        let sum = reduce::Sum {
            axes: vec![0],
            keepdims: false,
        };
        f.nodes.push(super::ir::Node::new(
            NodeKind::Op(sum.into()),
            vec![Port::new(3, 0)],
            vec![f32s(&[])],
        ));
        f.results = vec![Port::new(4, 0)];
    });
    rejects(&disagree, &["%2 in @if_main: then branch @if_then returns (f32[3]) but else branch @if_else returns (f32[])"]);
    let operands = mutate(g, "if_main", |f| f.nodes[2].inputs.push(Port::new(1, 0)));
    rejects(
        &operands,
        &["then branch @if_then takes 1 argument(s) but the node passes 2"],
    );
    let index = mutate(examples::case_graph(), "case_main", |f| {
        f.params[0] = ty(DType::I64, &[]);
        f.nodes[0].outputs = vec![ty(DType::I64, &[])];
    });
    rejects(
        &index,
        &["%2 in @case_main: the branch index must be a i32 scalar, got i64[]"],
    );
    let none = mutate(examples::case_graph(), "case_main", |f| {
        f.nodes[2].kind = NodeKind::Case(Case { branches: vec![] })
    });
    rejects(&none, &["case needs at least one branch"]);
}

#[test]
fn rejects_bad_while_and_call_nodes() {
    let g = examples::while_graph();
    let body = mutate(g.clone(), "w_body", |f| f.results.truncate(2));
    rejects(
        &body,
        &["%3 in @w_main: body @w_body returns 2 value(s) but the node has 3 output(s)"],
    );
    let cond = mutate(g.clone(), "w_cond", |f| f.results = vec![Port::new(0, 0)]);
    rejects(&cond, &["%3 in @w_main: cond @w_cond returns i32[] as result 0 but the node's output 0 is bool[]"]);
    let vars = mutate(g.clone(), "w_main", |f| f.nodes[3].inputs.swap(0, 1));
    let msg = rejects(
        &vars,
        &["%3 in @w_main: cond @w_cond parameter 0 is i32[] but the node passes f32[3]"],
    );
    assert!(msg.contains(">>   %3 = while(%0, %2, %1)"), "{msg}");
    let iters = mutate(g, "w_main", |f| {
        f.nodes[3].kind = NodeKind::While(While {
            cond: "w_cond".into(),
            body: "w_body".into(),
            maximum_iterations: Some(-1),
            parallel_iterations: 1,
            checkpoints: None,
        });
    });
    rejects(&iters, &["maximum_iterations must be >= 0"]);
    let (mut b, a) = FunctionBuilder::new("caller", vec![f32s(&[3])]);
    let out = b
        .add_node(
            NodeKind::Call(Call {
                function: "ghost".into(),
                ..Default::default()
            }),
            &a,
            vec![f32s(&[3])],
        )
        .unwrap();
    let caller = b.finish(&out, &[]).unwrap();
    let err = verify_function(&Library::new(), &caller).unwrap_err();
    assert!(
        err.message
            .starts_with("%1 in @caller: callee @ghost is not in the library"),
        "{err}"
    );
}

#[test]
fn errors_inside_nested_functions_name_that_function() {
    let g = mutate(examples::nested_graph(), "n_body", |f| {
        f.nodes[5].inputs[1] = Port::new(3, 0)
    });
    rejects(
        &g,
        &[
            "%5 in @n_body: the rule of mul rejects its inputs",
            ">>   %5 = mul(%1, %3) : f32[3]",
        ],
    );
    let g = mutate(examples::nested_graph(), "n_then", |f| {
        f.nodes[3].kind = NodeKind::While(While {
            cond: "n_cond".into(),
            body: "n_then".into(),
            maximum_iterations: None,
            parallel_iterations: 10,
            checkpoints: None,
        });
    });
    rejects(
        &g,
        &["%3 in @n_then: body @n_then takes 2 argument(s) but the node passes 3"],
    );
}

#[test]
fn rejects_recursion_and_a_missing_entry() {
    let (mut b, a) = FunctionBuilder::new("loop", vec![f32s(&[3])]);
    let out = b
        .add_node(
            NodeKind::Call(Call {
                function: "loop".into(),
                ..Default::default()
            }),
            &a,
            vec![f32s(&[3])],
        )
        .unwrap();
    let mut lib = Library::new();
    lib.add(b.finish(&out, &[]).unwrap()).unwrap();
    let g = Graph {
        library: lib,
        entry: "loop".into(),
    };
    rejects(&g, &["@loop calls itself: @loop -> @loop"]);
    let g = Graph {
        library: Library::new(),
        entry: "main".into(),
    };
    rejects(&g, &["entry: no function @main in the library"]);
}

#[test]
fn rejects_bad_variable_and_stack_nodes() {
    let g = examples::state_graph();
    let read = mutate(g.clone(), "state", |f| {
        f.nodes[2].inputs[0] = Port::new(1, 0)
    });
    rejects(
        &read,
        &["%2 in @state: input 0 must be a resource<...>, got f32[3]"],
    );
    let assign = mutate(g.clone(), "state", |f| {
        f.nodes[3].outputs = vec![f32s(&[3])]
    });
    rejects(
        &assign,
        &["%3 in @state: output types (f32[3]) do not match the expected ()"],
    );
    let pruned = mutate(g.clone(), "state", |f| f.control_outputs.clear());
    rejects(&pruned, &["%3 in @state: assign_add_variable has side effects but is not a control output of @state"]);
    let push = mutate(g.clone(), "state", |f| {
        f.nodes[5].inputs[1] = Port::new(4, 0)
    });
    rejects(
        &push,
        &["%5 in @state: pushed value (input 1) is stack<f32[3]> but f32[3] is expected"],
    );
    let pop = mutate(g.clone(), "state", |f| f.nodes[6].outputs.truncate(1));
    rejects(&pop, &["%6 in @state: output types (stack<f32[3]>) do not match the expected (stack<f32[3]>, f32[3])"]);
    let new = mutate(g, "state", |f| {
        f.nodes[4].outputs = vec![ValueType::Stack(TensorType::new(DType::F64, &[3]))]
    });
    rejects(&new, &["%4 in @state: output types (stack<f64[3]>)"]);
}

#[test]
fn calls_to_functions_with_side_effects_must_be_kept() {
    let res = ValueType::Resource(TensorType::new(DType::F32, &[3]));
    let (mut b, a) = FunctionBuilder::new("writer", vec![res.clone(), f32s(&[3])]);
    let w = b
        .add_node(NodeKind::Variable(VariableOp::Assign), &a, vec![])
        .unwrap();
    assert!(w.is_empty());
    let writer = b.finish(&[], &[2]).unwrap();
    let (mut b, a) = FunctionBuilder::new("main", vec![res, f32s(&[3])]);
    b.add_node(
        NodeKind::Call(Call {
            function: "writer".into(),
            ..Default::default()
        }),
        &a,
        vec![],
    )
    .unwrap();
    let y = b.add_op1(unary::Neg, &[a[1]], None).unwrap();
    let main = b.finish(&[y], &[]).unwrap();
    let mut lib = Library::new();
    lib.add(main).unwrap();
    lib.add(writer).unwrap();
    let g = Graph {
        library: lib,
        entry: "main".into(),
    };
    rejects(&g, &["%2 in @main: call has side effects"]);
    let kept = mutate(g, "main", |f| f.control_outputs = vec![2]);
    verify(&kept).unwrap();
}
