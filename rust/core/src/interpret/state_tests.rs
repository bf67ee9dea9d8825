//! Interpreter tests for state: stacks threaded through loops, variables written in branches and
//! loops, and the value types themselves.

use crate::graph::{StackOp, VariableOp};
use std::time::Instant;

use super::{run, Interpreter, RtValue, StackValue, VariableRef};
use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::graph::{Library, NodeKind, ValueType};
use crate::ops::binary;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;
use crate::testing::interpret::{f64_of, f64s, if_kind, library, s, scalar_ty, v, while_kind, B};

fn i64s() -> ValueType {
    scalar_ty(DType::I64)
}

fn stack_i64() -> ValueType {
    ValueType::Stack(TensorType::scalar(DType::I64))
}

/// `@main(n)`: a first loop pushes 0..n onto a stack; a second pops them back, checking each
/// against a down-counter and folding `acc = acc * 10 + x`. Returns `(j, stack, acc, ok)`.
fn push_pop_library() -> Library {
    let trio = vec![i64s(), i64s(), stack_i64()];
    let mut cond = B::new("push_cond", trio.clone());
    let c = cond.op(binary::Less, &[cond.args[0], cond.args[1]]);
    let mut body = B::new("push_body", trio.clone());
    let one = body.konst(1i64);
    let i = body.op(binary::Add, &[body.args[0], one]);
    let pushed = body.node(
        NodeKind::Stack(StackOp::Push),
        &[body.args[2], body.args[0]],
        vec![stack_i64()],
    );
    let (n, push_cond) = (body.args[1], cond.finish(&[c]));
    let mut lib = library(vec![push_cond, body.finish(&[i, n, pushed[0]])]);

    let quad = vec![i64s(), stack_i64(), i64s(), scalar_ty(DType::Bool)];
    let mut cond = B::new("pop_cond", quad.clone());
    let zero = cond.konst(0i64);
    let c = cond.op(binary::Greater, &[cond.args[0], zero]);
    let mut body = B::new("pop_body", quad);
    let (one, ten) = (body.konst(1i64), body.konst(10i64));
    let j = body.op(binary::Sub, &[body.args[0], one]);
    let popped = body.node(
        NodeKind::Stack(StackOp::Pop),
        &[body.args[1]],
        vec![stack_i64(), i64s()],
    );
    let shifted = body.op(binary::Mul, &[body.args[2], ten]);
    let acc = body.op(binary::Add, &[shifted, popped[1]]);
    let same = body.op(binary::Equal, &[popped[1], j]);
    let ok = body.op(binary::LogicalAnd, &[body.args[3], same]);
    lib.add(cond.finish(&[c])).unwrap();
    lib.add(body.finish(&[j, popped[0], acc, ok])).unwrap();

    let mut main = B::new("main", vec![i64s()]);
    let kind = NodeKind::Stack(StackOp::New {
        element: TensorType::scalar(DType::I64),
    });
    let empty = main.node(kind, &[], vec![stack_i64()]);
    let zero = main.konst(0i64);
    let fwd = main.call(
        while_kind("push_cond", "push_body", None),
        &[zero, main.args[0], empty[0]],
        &lib,
    );
    let yes = main.konst(true);
    let bwd = main.call(
        while_kind("pop_cond", "pop_body", None),
        &[fwd[0], fwd[2], zero, yes],
        &lib,
    );
    lib.add(main.finish(&bwd)).unwrap();
    lib
}

#[test]
fn a_stack_pushed_by_one_loop_is_popped_in_reverse_by_another() {
    let out = run(&push_pop_library(), "main", vec![s(5i64)]).unwrap();
    assert_eq!(f64_of(&out[0]), 0.0, "the second loop counted down to 0");
    assert_eq!(
        f64_of(&out[2]),
        43210.0,
        "popped 4, 3, 2, 1, 0 in that order"
    );
    assert_eq!(f64_of(&out[3]), 1.0);
    assert!(out[1].clone().into_stack().unwrap().is_empty());
}

#[test]
fn pushing_and_popping_1e5_elements_takes_linear_time() {
    // A push that copied the stack would make this quadratic: 5e9 element copies, minutes.
    let lib = push_pop_library();
    let start = Instant::now();
    let out = run(&lib, "main", vec![s(100_000i64)]).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(f64_of(&out[0]), 0.0);
    assert_eq!(f64_of(&out[3]), 1.0, "every popped value matched its index");
    assert!(out[1].clone().into_stack().unwrap().is_empty());
    println!("1e5 pushes then 1e5 pops through two while loops: {elapsed:?}");
}

#[test]
fn popping_an_empty_stack_is_an_error_naming_the_node() {
    let mut main = B::new("main", vec![]);
    let kind = NodeKind::Stack(StackOp::New {
        element: TensorType::scalar(DType::F32),
    });
    let stack_f32 = ValueType::Stack(TensorType::scalar(DType::F32));
    let st = main.node(kind, &[], vec![stack_f32.clone()]);
    let popped = main.node(
        NodeKind::Stack(StackOp::Pop),
        &st,
        vec![stack_f32, scalar_ty(DType::F32)],
    );
    main.locate_last(31);
    let err = run(&library(vec![main.finish(&popped[1..])]), "main", vec![]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Index);
    assert_eq!(err.op, "stack_pop");
    let msg = err.to_string();
    assert!(msg.contains("pop from an empty stack<f32[]>"), "{msg}");
    assert!(
        msg.contains("at %1 = stack_pop(%0) in @main (model.py:31)"),
        "{msg}"
    );
}

#[test]
fn stacks_are_values_and_check_what_is_pushed() {
    let mut a = StackValue::new(TensorType::new(DType::F32, &[DYN]));
    a.push(Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap())
        .unwrap();
    let mut b = a.clone();
    assert!(b.shares_storage_with(&a), "a clone shares until it changes");
    b.push(Tensor::from_vec(vec![3.0f32], &[1]).unwrap())
        .unwrap();
    assert!(!b.shares_storage_with(&a));
    assert_eq!(
        (a.len(), b.len()),
        (1, 2),
        "pushing onto a copy leaves the original alone"
    );
    assert_eq!(b.pop().unwrap().to_f64_vec(), [3.0]);
    assert_eq!(a.item(0).unwrap().to_f64_vec(), [1.0, 2.0]);
    let err = a.push(Tensor::scalar(1i32)).unwrap_err();
    assert_eq!(
        (err.kind, err.op.as_ref()),
        (ErrorKind::DType, "stack_push")
    );
    assert!(
        err.message
            .contains("cannot push a i32[] onto a stack<f32[?]>"),
        "{err}"
    );
    assert_eq!(
        a.push(Tensor::scalar(1.0f32)).unwrap_err().kind,
        ErrorKind::Shape
    );
    assert!(StackValue::new(TensorType::scalar(DType::F32))
        .pop()
        .is_none());
}

#[test]
fn small_static_items_are_packed_and_come_back_with_their_bits() {
    use crate::dtype::{Element, Storage};
    use crate::runtime_values::Popped;
    // f32[3] items are packed (one buffer); f32[2000] items (8000 bytes) stay tensors.
    for n in [3usize, 2000] {
        let ty = TensorType::new(DType::F32, &[n]);
        let item = |k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| [-0.0, f32::NAN, 1.5][(i + k) % 3] + k as f32)
                .collect()
        };
        let mut a = StackValue::new(ty.clone());
        for k in 0..5 {
            a.push(Tensor::from_vec(item(k), &[n]).unwrap()).unwrap();
        }
        a.push_elements(&Storage::F32(item(5))).unwrap();
        let b = a.clone();
        assert!(b.shares_storage_with(&a));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut buffer = Storage::F32(vec![0.0; n]);
        for k in (3..6).rev() {
            match a.pop_into(&mut buffer).unwrap() {
                Popped::Copied => assert!(n == 3, "only packed items are copied out"),
                Popped::Tensor(t) => {
                    assert!(n == 2000);
                    buffer = Storage::F32(t.as_slice::<f32>().unwrap().to_vec());
                }
            }
            assert_eq!(
                bits(f32::slice(&buffer).unwrap()),
                bits(&item(k)),
                "item {k}"
            );
        }
        assert_eq!(
            (a.len(), b.len()),
            (3, 6),
            "popping a copy leaves the original"
        );
        for k in (0..3).rev() {
            let t = a.pop().unwrap();
            assert_eq!(t.shape(), [n]);
            assert_eq!(bits(t.as_slice::<f32>().unwrap()), bits(&item(k)));
        }
        assert!(a.pop().is_none() && a.pop_into(&mut buffer).is_none());
        assert_eq!(bits(b.item(4).unwrap().as_slice().unwrap()), bits(&item(4)));
        assert!(b.item(6).is_none());
        // A buffer of another size or dtype is not pushed; one of another size is popped
        // into as a tensor.
        let mut c = b.clone();
        assert!(c.push_elements(&Storage::F32(vec![0.0; n + 1])).is_err());
        assert!(c.push_elements(&Storage::F64(vec![0.0; n])).is_err());
        let mut other = Storage::F32(vec![0.0; n + 1]);
        assert!(matches!(c.pop_into(&mut other), Some(Popped::Tensor(_))));
        assert_eq!(c.len(), 5);
    }
}

fn resource_f32() -> ValueType {
    ValueType::Resource(TensorType::scalar(DType::F32))
}

#[test]
fn a_variable_written_in_a_branch_changes_only_when_that_branch_runs() {
    // @bump(v) adds 1 to v (a control output, since nothing reads it); @noop(v) does nothing.
    let mut bump = B::new("bump", vec![resource_f32()]);
    let one = bump.konst(1.0f32);
    bump.node(
        NodeKind::Variable(VariableOp::AssignAdd),
        &[bump.args[0], one],
        vec![],
    );
    let effect = bump.last();
    let bump = bump.finish_with_effects(&[], &[effect]);
    let mut lib = library(vec![bump, B::new("noop", vec![resource_f32()]).finish(&[])]);
    let mut main = B::new("main", vec![scalar_ty(DType::Bool), resource_f32()]);
    main.call(if_kind("bump", "noop"), &[main.args[0], main.args[1]], &lib);
    let branch = main.last();
    let read = main.node(
        NodeKind::Variable(VariableOp::Read),
        &[main.args[1]],
        vec![scalar_ty(DType::F32)],
    );
    main.after(&[branch]);
    lib.add(main.finish(&read)).unwrap();

    let interp = Interpreter::new(&lib);
    let var = VariableRef::new(Tensor::scalar(0.0f32));
    for (pred, want) in [(true, 1.0), (false, 1.0), (true, 2.0)] {
        let out = interp
            .run("main", vec![s(pred), var.clone().into()])
            .unwrap();
        assert_eq!(f64_of(&out[0]), want, "pred = {pred}");
        assert_eq!(var.read().item_f64().unwrap(), want);
    }
}

#[test]
fn a_variable_written_in_a_loop_body_changes_once_per_iteration() {
    // body(i, v, last): v += 2.5; last = read(v) after the write; i += 1. Four iterations.
    let trio = vec![scalar_ty(DType::I32), resource_f32(), scalar_ty(DType::F32)];
    let mut cond = B::new("cond", trio.clone());
    let four = cond.konst(4i32);
    let c = cond.op(binary::Less, &[cond.args[0], four]);
    let mut body = B::new("body", trio.clone());
    let (step, one) = (body.konst(2.5f32), body.konst(1i32));
    body.node(
        NodeKind::Variable(VariableOp::AssignAdd),
        &[body.args[1], step],
        vec![],
    );
    let write = body.last();
    let last = body.node(
        NodeKind::Variable(VariableOp::Read),
        &[body.args[1]],
        vec![scalar_ty(DType::F32)],
    );
    body.after(&[write]);
    let i = body.op(binary::Add, &[body.args[0], one]);
    let var = body.args[1];
    let body = body.finish_with_effects(&[i, var, last[0]], &[write]);
    let mut lib = library(vec![cond.finish(&[c]), body]);
    let mut main = B::new("main", vec![resource_f32()]);
    let (zero, nothing) = (main.konst(0i32), main.konst(0.0f32));
    let out = main.call(
        while_kind("cond", "body", None),
        &[zero, main.args[0], nothing],
        &lib,
    );
    lib.add(main.finish(&[out[0], out[2]])).unwrap();

    let var = VariableRef::new(Tensor::scalar(1.0f32));
    let out = run(&lib, "main", vec![var.clone().into()]).unwrap();
    assert_eq!((f64_of(&out[0]), f64_of(&out[1])), (4.0, 11.0));
    assert_eq!(var.read().item_f64().unwrap(), 11.0);
}

#[test]
fn variables_check_what_is_stored_and_give_each_write_a_new_identity() {
    let var = VariableRef::new(Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap());
    assert_eq!(
        var.read().id(),
        var.read().id(),
        "reads see the same tensor"
    );
    let value = Tensor::from_vec(vec![0.0f32; 3], &[3]).unwrap();
    var.assign(&value).unwrap();
    let first = var.read().id();
    var.assign(&value).unwrap();
    assert!(
        first != value.id() && var.read().id() != first,
        "every write is a new tensor"
    );
    var.assign_add(&Tensor::scalar(0.5f32)).unwrap();
    assert_eq!(
        var.read().to_f64_vec(),
        [0.5, 0.5, 0.5],
        "the delta broadcasts"
    );
    assert!(var.clone().same_variable(&var));

    let err = var.assign(&Tensor::scalar(1.0f64)).unwrap_err();
    assert_eq!(
        (err.kind, err.op.as_ref()),
        (ErrorKind::DType, "assign_variable")
    );
    assert!(
        err.message
            .contains("cannot store a f64[] in a variable of type f32[3]"),
        "{err}"
    );
    assert_eq!(
        var.assign(&Tensor::zeros(DType::F32, &[4]))
            .unwrap_err()
            .kind,
        ErrorKind::Shape
    );
    let err = var
        .assign_add(&Tensor::zeros(DType::F32, &[2, 3]))
        .unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::Shape,
        "a delta may not grow the variable: {err}"
    );
    assert_eq!(
        var.read().to_f64_vec(),
        [0.5, 0.5, 0.5],
        "a failed write changes nothing"
    );

    let any_len = TensorType::new(DType::F32, &[DYN]);
    let dynamic = VariableRef::with_type(any_len, Tensor::zeros(DType::F32, &[2])).unwrap();
    dynamic.assign(&Tensor::zeros(DType::F32, &[5])).unwrap();
    assert!(
        VariableRef::with_type(TensorType::scalar(DType::I32), Tensor::scalar(1.0f32)).is_err()
    );
    let value: RtValue = v(&[1.0f32]);
    assert_eq!(f64s(&value), [1.0]);
    assert!(value.into_resource().is_err());
}
