//! The graph IR: functions of nodes over a library, with functional control flow.
//!
//! A `Graph` is a `Library` of `Function`s and the name of its entry. A function has typed
//! parameters, nodes in topological order (its first nodes are one `Arg` per parameter), result
//! ports, and control outputs. A node has a `NodeKind`, data inputs (`Port` = node and output
//! index), control inputs (nodes that must run first), output `ValueType`s and an optional
//! source `Location`. Values are tensors, variable handles (`Resource`) or stacks (`Stack`).
//!
//! ```text
//!   func @f(%0: bool[], %1: f32[3]) -> (f32[3]) {      %0, %1: Arg nodes
//!     %2 = sin(%1) : f32[3]                            an op of the op table
//!     %3 = if(%0, %2) {then=@t, else=@e} : f32[3]      calls @t(%2) or @e(%2)
//!     return %3
//!   }                     ┌──────────── @t(%0: f32[3]) -> (f32[3])
//!   %0 ─pred─┐            │
//!   %2 ──────┴─► if ──────┤  one of the two runs, with the same operands
//!                         └──────────── @e(%0: f32[3]) -> (f32[3])
//! ```
//!
//! Semantics of the node kinds (inputs -> outputs):
//!
//! - `Op(op)`: a primitive op; output types are what the op's `infer` gives for the inputs, so
//!   every op that runs eagerly also works in a graph, with `DYN` dimensions flowing through.
//! - `If {then_branch, else_branch}`: `(pred: bool[], operands...) -> results`; calls
//!   `then_branch(operands...)` when pred is true, else `else_branch(operands...)`. Both
//!   branches take the operands' types and return the node's output types.
//! - `Case {branches}`: `(index: i32[], operands...) -> results`; calls
//!   `branches[index](operands...)`; an index out of range (negative too) runs the LAST branch.
//! - `While {cond, body, maximum_iterations, parallel_iterations}`: `(vars...) -> vars`; as
//!   `while cond(vars): vars = body(vars)` where `cond(vars) -> bool[]`, `body(vars) -> vars`.
//!   `maximum_iterations` stops the loop after that many trips even if cond holds;
//!   `parallel_iterations` bounds how many iterations the executor may run at once.
//! - `Call {function}`: `(operands...) -> function(operands...)`.
//! - Variables: `ReadVariable(resource<T>) -> T`, `AssignVariable(resource<T>, T) -> ()`,
//!   `AssignAddVariable(resource<T>, T) -> ()`.
//! - Stacks: `StackNew() -> stack<T>`, `StackPush(stack<T>, T) -> stack<T>`,
//!   `StackPop(stack<T>) -> (stack<T>, T)`, `StackAdd(stack<T>, stack<T>) -> stack<T>` (two
//!   cotangents of one stack summed). A stack is a value threaded functionally (a loop
//!   carries it as a loop var); the interpreter shares storage so a push is amortised O(1).
//!
//! Stateful nodes (variable reads and writes) are ordered by control inputs in program order,
//! and every write is listed as (or is an ancestor of) a control output of its function, so no
//! pass prunes it. A node calling a function that has control outputs has side effects too.
//!
//! Text form (`text`, `parse`): see `text.rs`; `print(parse(print(g))) == print(g)` and
//! `parse(print(g)) == g`. `verify` checks a graph and reports errors with the surrounding text.

pub mod builder;
pub mod constructs;
mod cursor;
pub mod ir;
mod lexer;
pub mod library;
pub mod parse;
mod parse_attrs;
mod reorder;
pub mod rewrite;
pub mod text;
pub mod verify;
pub mod verify_nodes;

#[cfg(test)]
mod text_tests;
#[cfg(test)]
mod verify_tests;

pub use builder::FunctionBuilder;
pub use constructs::{join_types, joined_results, Check};
pub(crate) use ir::construct_as;
pub use ir::{builtin_names, Call, Case, If, NodeRule, ParseNode, StackOp, VariableOp, While};
pub use ir::{
    tensor_types_compatible, Constant, Function, Location, Node, NodeId, NodeKind, Port, ValueType,
};
pub use library::{Graph, Library};
pub use parse::{parse_function, parse_graph};
pub use parse_attrs::AttrReader;
pub use rewrite::{inline_into, with_params};
pub use verify::{verify, verify_function};
