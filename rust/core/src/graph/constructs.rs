//! The control-flow and stateful node kinds as data, and the graph layer's face of a construct:
//! its text keyword and attributes, the functions it calls, and its type rule.
//!
//! Each construct's behaviour lives in one module of `crate::control` (`control::while_loop`
//! for `While`, ...), which implements this trait beside the ones the higher layers define
//! (gradient, interpretation, MLIR emission); `control` documents the rule for adding one.
//! The graph layer reaches a construct only through `NodeKind::construct`, an exhaustive match.

use super::ir::NodeKind;
use super::ir::ValueType;
use super::library::Library;
use super::parse_attrs::AttrReader;
use crate::error::{Error, ErrorKind, Result};
use crate::shape::{TensorType, DYN};
use std::sync::atomic::{AtomicU64, Ordering};

/// `(pred: bool[], operands...) -> results`: calls `then_branch(operands)` when pred is true,
/// else `else_branch(operands)`.
#[derive(Clone, Debug, PartialEq)]
pub struct If {
    pub then_branch: String,
    pub else_branch: String,
}

/// `(index: i32[], operands...) -> results`: calls `branches[index](operands)`; an index out of
/// range (negative too) runs the last branch.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub branches: Vec<String>,
}

/// `(vars...) -> vars`: `while cond(vars): vars = body(vars)`, stopping after
/// `maximum_iterations` trips when set; `parallel_iterations` bounds how many iterations an
/// executor may run at once.
#[derive(Clone, Debug, PartialEq)]
pub struct While {
    pub cond: String,
    pub body: String,
    pub maximum_iterations: Option<i64>,
    pub parallel_iterations: u32,
    /// With `Some(c)`, the gradient keeps c snapshots of the loop variables and recomputes
    /// trips from them (`control::while_loop::checkpointed`) instead of stacking residuals.
    pub checkpoints: Option<u32>,
}

/// The trips every `While` of the process has run, in the interpreter and in each of the
/// executor's tiers (in check mode a fused loop runs on two tiers and counts twice).
static WHILE_TRIPS: AtomicU64 = AtomicU64::new(0);

impl While {
    /// The trips every `While` of the process has run since it started. Tests read it to see
    /// that every runner runs a loop gradient's checkpoint schedule alike.
    pub fn trips_run() -> u64 {
        WHILE_TRIPS.load(Ordering::Relaxed)
    }

    /// Adds `trips` to `trips_run`.
    pub(crate) fn count_trips(trips: i64) {
        WHILE_TRIPS.fetch_add(trips.max(0) as u64, Ordering::Relaxed);
    }
}

/// `(operands...) -> function(operands...)`. With `gradient` (a `custom_gradient` traced in
/// graph mode), its gradient is `gradient(operands, results, result cotangents)`, which returns
/// one gradient for each of the first k operands; with `tangent` (a `custom_jvp` rule, or the
/// forward mode of a `recompute_grad` function), its tangents are `tangent(operands, results,
/// operand tangents)`, one per result the function computes for its caller. `refused` says why
/// the derivatives that have no rule here have none (a rule failed as it was traced): asking
/// for one raises it, running the call does not. With `kernel` it is a composite: the callee
/// defines it (for compilers, derivatives and the reference interpreter) and the frame
/// executor runs the kernel, an op of the table computing the same values (a factorisation
/// written as a loop in the callee and as faer's blocked algorithm in the kernel).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub function: String,
    pub gradient: Option<String>,
    pub tangent: Option<String>,
    pub refused: Option<String>,
    pub kernel: Option<crate::ops::Op>,
}

/// Reads and writes of a variable: `Read(resource<T>) -> T`, `Assign(resource<T>, T) -> ()`,
/// `AssignAdd(resource<T>, T) -> ()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VariableOp {
    Read,
    Assign,
    AssignAdd,
}

/// Stacks threaded as values: `New() -> stack<T>`, `Push(stack<T>, T) -> stack<T>`,
/// `Pop(stack<T>) -> (stack<T>, T)`, and `Add(stack<T>, stack<T>) -> stack<T>`, the sum of two
/// cotangent stacks (a stack two loops read has a cotangent from each): top elements added to
/// top elements, the longer stack's bottom kept as it is (a cotangent stack shorter than its
/// stack stands for zeros below).
#[derive(Clone, Debug, PartialEq)]
pub enum StackOp {
    New { element: TensorType },
    Push,
    Pop,
    Add,
}

/// A type rule's verdict: a message, to which the verifier adds the node and its function.
pub type Check = std::result::Result<(), String>;

/// What the graph layer needs of a construct (object safe, so `NodeKind::construct` can hand
/// out any of them).
pub trait NodeRule {
    /// The node's keyword in graph text.
    fn keyword(&self) -> &'static str;

    /// Attributes as `(name, text)` pairs in their fixed order (parsed back by `ParseNode`).
    fn attrs(&self) -> Vec<(&'static str, String)>;

    /// Functions the node calls, in attribute order.
    fn callees(&self) -> Vec<&str>;

    /// Functions the node names: its callees and any other (a custom gradient).
    fn referenced(&self) -> Vec<&str> {
        self.callees()
    }

    /// How many leading inputs are not operands passed to the callees (a predicate, an index).
    fn operand_start(&self) -> usize {
        0
    }

    /// The same node over other functions, one per callee in order (a custom gradient, which
    /// fits only the old callee, is dropped); a node that calls none is returned as it is.
    fn with_callees(&self, names: Vec<String>) -> NodeKind;

    /// Whether the node itself writes state (it must stay ordered and reachable from the
    /// control outputs); a call of a function with control outputs is not counted here.
    fn has_side_effect(&self) -> bool {
        false
    }

    /// `(stateful, side effect)`: whether the node touches variables (it is ordered among the
    /// stateful nodes) and whether it writes one (its function's control outputs keep it). A
    /// node calling functions has both when a callee has control outputs.
    fn state(&self, library: &Library) -> Result<(bool, bool)> {
        let mut effects = false;
        for callee in self.callees() {
            effects |= !library.get(callee)?.control_outputs.is_empty();
        }
        Ok((effects, effects))
    }

    /// The type rule: `ins` and `outs` against the construct's signature and its callees'.
    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check;

    /// The output types a node of this construct has for inputs of types `ins` (read from
    /// its callees where it calls functions).
    fn output_types(&self, library: &Library, ins: &[&ValueType]) -> Result<Vec<ValueType>>;
}

/// Reading a construct back from graph text.
pub trait ParseNode: Sized {
    /// The keywords it answers to.
    const KEYWORDS: &'static [&'static str];

    /// The node written `keyword(...) {attrs}`; every attribute it does not take is an error.
    fn parse(keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self>;
}

/// Types that describe the values of both `a` and `b` (dimensions that differ become unknown).
pub fn join_types(op: &str, a: &[ValueType], b: &[ValueType]) -> Result<Vec<ValueType>> {
    if a.len() != b.len() {
        return Err(Error::invalid(
            op.to_string(),
            format!("branches return {} and {} values", a.len(), b.len()),
        ));
    }
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| {
            let (tx, ty) = (x.inner(), y.inner());
            let same_kind = std::mem::discriminant(x) == std::mem::discriminant(y);
            if !same_kind || tx.dtype != ty.dtype || tx.shape.len() != ty.shape.len() {
                return Err(Error::new(
                    ErrorKind::ControlFlow,
                    op.to_string(),
                    format!("branch results {i} differ: {x} vs {y}"),
                ));
            }
            let shape: Vec<usize> = tx
                .shape
                .iter()
                .zip(&ty.shape)
                .map(|(&p, &q)| if p == q { p } else { DYN })
                .collect();
            let t = TensorType::new(tx.dtype, &shape);
            Ok(match x {
                ValueType::Tensor(_) => ValueType::Tensor(t),
                ValueType::Resource(_) => ValueType::Resource(t),
                ValueType::Stack(_) => ValueType::Stack(t),
            })
        })
        .collect()
}

/// The joined result types of `callees` (branches of one node), `join_types` pairwise.
pub fn joined_results(op: &str, library: &Library, callees: &[&str]) -> Result<Vec<ValueType>> {
    let mut joined: Option<Vec<ValueType>> = None;
    for callee in callees {
        let types = library.get(callee)?.result_types()?;
        joined = Some(match joined {
            None => types,
            Some(prev) => join_types(op, &prev, &types)?,
        });
    }
    Ok(joined.unwrap_or_default())
}
