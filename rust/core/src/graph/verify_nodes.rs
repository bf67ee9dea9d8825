//! Per-kind rules of the verifier: op output types against the op table's `infer`, call
//! signatures of `If`/`Case`/`While`/`Call`, and operand kinds of variable and stack nodes.
//! Each returns a message; `verify` adds the node, function and surrounding text.

use super::ir::{Function, Node, NodeId, NodeKind, NodeRule, ValueType};
use super::library::Library;
use crate::dtype::DType;
use crate::ops::Op;
use crate::shape::TensorType;

pub use super::constructs::Check;

pub fn list(types: &[&ValueType]) -> String {
    let parts: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", parts.join(", "))
}

/// Checks `node` (at `id` in `f`) against the rules of its kind. Edges are already valid.
pub(crate) fn check_node(library: &Library, f: &Function, id: NodeId, node: &Node) -> Check {
    let ins: Vec<&ValueType> = node
        .inputs
        .iter()
        .map(|p| &f.nodes[p.node].outputs[p.output])
        .collect();
    if id < f.params.len() && !matches!(node.kind, NodeKind::Arg(_)) {
        return Err(format!(
            "node {id} must be the Arg of parameter {id}, found {}",
            node.kind.name()
        ));
    }
    let outs: Vec<&ValueType> = node.outputs.iter().collect();
    let (ins, outs) = (ins.as_slice(), outs.as_slice());
    match &node.kind {
        NodeKind::Arg(index) => check_arg(f, id, *index, node),
        NodeKind::Const(c) => {
            arity(ins, 0)?;
            expect_outputs(outs, &[ValueType::Tensor(c.0.ty().clone())])
        }
        NodeKind::Op(op) => check_op(op, ins, outs),
        NodeKind::If(c) => c.check(library, ins, outs),
        NodeKind::Case(c) => c.check(library, ins, outs),
        NodeKind::While(c) => c.check(library, ins, outs),
        NodeKind::Call(c) => c.check(library, ins, outs),
        NodeKind::Variable(c) => c.check(library, ins, outs),
        NodeKind::Stack(c) => c.check(library, ins, outs),
    }
}

fn check_arg(f: &Function, id: NodeId, index: usize, node: &Node) -> Check {
    if index != id || index >= f.params.len() {
        return Err(format!(
            "Arg({index}) must be node {index} of the {} parameter node(s) {}",
            f.params.len(),
            "at the start of the function"
        ));
    }
    if !node.inputs.is_empty() {
        return Err(format!("Arg({index}) takes no inputs"));
    }
    if node.outputs.as_slice() != [f.params[index].clone()] {
        return Err(format!(
            "Arg({index}) must have the parameter's type {}",
            f.params[index]
        ));
    }
    Ok(())
}

fn check_op(op: &Op, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
    let mut types: Vec<TensorType> = Vec::with_capacity(ins.len());
    for (k, t) in ins.iter().enumerate() {
        let t = t
            .as_tensor()
            .ok_or_else(|| format!("input {k} of {} must be a tensor, got {t}", op.name()))?;
        types.push(t.clone());
    }
    let inferred = op
        .infer(&types)
        .map_err(|e| format!("the rule of {} rejects its inputs: {e}", op.name()))?;
    let expected: Vec<ValueType> = inferred.into_iter().map(ValueType::Tensor).collect();
    expect_outputs(outs, &expected)
}

/// Branches of an `If`/`Case`: they must agree with each other, take the operands and return
/// the node's outputs.
pub fn check_branches(
    library: &Library,
    names: &[&String],
    roles: &[&str],
    operands: &[&ValueType],
    outs: &[&ValueType],
) -> Check {
    let mut first: Option<(&str, &String, Vec<ValueType>)> = None;
    for (name, role) in names.iter().zip(roles) {
        let g = library
            .get(name)
            .map_err(|_| format!("{role} @{name} is not in the library"))?;
        let results = g.result_types().map_err(|e| e.message)?;
        if let Some((role0, name0, r0)) = &first {
            let agree =
                r0.len() == results.len() && r0.iter().zip(&results).all(|(a, b)| a.compatible(b));
            if !agree {
                let (a, b) = (
                    list(&r0.iter().collect::<Vec<_>>()),
                    list(&results.iter().collect::<Vec<_>>()),
                );
                return Err(format!(
                    "{role0} @{name0} returns {a} but {role} @{name} returns {b}"
                ));
            }
        } else {
            first = Some((role, name, results));
        }
        check_call(library, role, name, operands, outs)?;
    }
    Ok(())
}

/// `name(operands) -> outs` must match the function's signature.
/// The parameters of `role` function `name` against the types the node passes.
pub fn check_params(role: &str, name: &str, params: &[ValueType], passed: &[&ValueType]) -> Check {
    if params.len() != passed.len() {
        return Err(format!(
            "{role} @{name} takes {} argument(s) but the node passes {}",
            params.len(),
            passed.len()
        ));
    }
    for (k, (p, a)) in params.iter().zip(passed).enumerate() {
        if !p.compatible(a) {
            return Err(format!(
                "{role} @{name} parameter {k} is {p} but the node passes {a}"
            ));
        }
    }
    Ok(())
}

pub fn check_call(
    library: &Library,
    role: &str,
    name: &str,
    operands: &[&ValueType],
    outs: &[&ValueType],
) -> Check {
    let g = library
        .get(name)
        .map_err(|_| format!("{role} @{name} is not in the library"))?;
    check_params(role, name, &g.params, operands)?;
    let results = g.result_types().map_err(|e| e.message)?;
    if results.len() != outs.len() {
        return Err(format!(
            "{role} @{name} returns {} value(s) but the node has {} output(s)",
            results.len(),
            outs.len()
        ));
    }
    for (k, (r, o)) in results.iter().zip(outs).enumerate() {
        if !r.compatible(o) {
            return Err(format!(
                "{role} @{name} returns {r} as result {k} but the node's output {k} is {o}"
            ));
        }
    }
    Ok(())
}

pub fn arity(ins: &[&ValueType], n: usize) -> Check {
    if ins.len() != n {
        return Err(format!("expected {n} input(s), got {}", ins.len()));
    }
    Ok(())
}

pub fn fixed<'a, const N: usize>(ins: &[&'a ValueType]) -> Result<[&'a ValueType; N], String> {
    arity(ins, N)?;
    let mut out = [ins[0]; N];
    out.copy_from_slice(ins);
    Ok(out)
}

/// The tensor type inside a `resource<T>` (or `stack<T>`) operand.
pub fn inner<'a>(t: &'a ValueType, kind: &str, what: &str) -> Result<&'a TensorType, String> {
    match (t, kind) {
        (ValueType::Resource(inner), "resource") | (ValueType::Stack(inner), "stack") => Ok(inner),
        _ => Err(format!("{what} must be a {kind}<...>, got {t}")),
    }
}

pub fn scalar(what: &str, t: &ValueType, dtype: DType) -> Check {
    match t {
        ValueType::Tensor(tt) if tt.dtype == dtype && tt.is_scalar() => Ok(()),
        _ => Err(format!(
            "the {what} must be a {} scalar, got {t}",
            crate::ops::attrs::dtype_short_name(dtype)
        )),
    }
}

pub fn expect_compatible(what: &str, actual: &ValueType, expected: &ValueType) -> Check {
    if actual.compatible(expected) {
        return Ok(());
    }
    Err(format!("{what} is {actual} but {expected} is expected"))
}

/// The node's output types must be compatible with `expected`, one for one.
pub fn expect_outputs(outs: &[&ValueType], expected: &[ValueType]) -> Check {
    let ok =
        outs.len() == expected.len() && outs.iter().zip(expected).all(|(a, b)| a.compatible(b));
    if ok {
        return Ok(());
    }
    Err(format!(
        "output types {} do not match the expected {}",
        list(outs),
        list(&expected.iter().collect::<Vec<_>>())
    ))
}
