//! The control-flow and stateful node kinds as data, and the graph layer's face of a construct:
//! its text keyword and attributes, the functions it calls, and its type rule.
//!
//! Each construct's behaviour lives in one module of `crate::control` (`control::while_loop`
//! for `While`, ...), which implements this trait beside the ones the higher layers define
//! (gradient, interpretation, MLIR emission); `control` documents the rule for adding one.
//! The graph layer reaches a construct only through `NodeKind::construct`, an exhaustive match.

use super::ir::ValueType;
use super::library::Library;
use super::parse_attrs::AttrReader;
use crate::error::Result;
use crate::shape::TensorType;

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
}

/// `(operands...) -> function(operands...)`. With `gradient` (a `custom_gradient` traced in
/// graph mode), its gradient is `gradient(operands, results, result cotangents)`, which returns
/// one gradient for each of the first k operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub function: String,
    pub gradient: Option<String>,
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
/// `Pop(stack<T>) -> (stack<T>, T)`.
#[derive(Clone, Debug, PartialEq)]
pub enum StackOp {
    New { element: TensorType },
    Push,
    Pop,
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

    /// Whether the node itself writes state (it must stay ordered and reachable from the
    /// control outputs); a call of a function with control outputs is not counted here.
    fn has_side_effect(&self) -> bool {
        false
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
