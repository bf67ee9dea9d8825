//! Control flow as a table: one module per construct, each implementing every layer's trait
//! for it, the way `ops::OpDef` holds an op's rule, kernel, gradient and emission together.
//!
//! | construct | node kind | module |
//! |---|---|---|
//! | `gl.cond` | `If` | `if_else` |
//! | `gl.switch_case` | `Case` | `case` |
//! | `gl.while_loop` | `While` | `while_loop/` (with its loop-only helpers: trip plans, loop
//! variables IREE needs special-cased, the bound on a loop's stack pushes) |
//! | function calls, `custom_gradient` | `Call` | `call` |
//! | `gl.Variable` reads and writes | `Variable(VariableOp)` | `variables` |
//! | loop-gradient stacks | `Stack(StackOp)` | `stacks` |
//!
//! The node kinds are plain data in `graph::constructs`; each layer defines the trait it needs
//! and dispatches through one exhaustive match over `NodeKind` (one line per construct), so a
//! construct missing an implementation does not compile:
//!
//! - `graph::NodeRule` + `graph::ParseNode`: text keyword and attributes, callees, type rule;
//! - `passes::PassRules`: how variables its callees assign come back out of it (variable
//!   threading) and which callee a constant selector runs (dead-branch elimination);
//! - `trace::gradients::Differentiate`: its gradient (for `If`, `Case`, `While`, `Call`, an
//!   `Augment` program transform: a new forward node that also returns residuals, and the
//!   gradient node that takes them);
//! - `trace::tangents::Tangent`: its forward mode (for `If`, `Case`, `While`, `Call`, the same
//!   construct over the callees' tangent functions, tangents beside the values);
//! - `interpret::Interpret`: running a node in the reference interpreter;
//! - `dataflow::Lower`: its Switch/Merge/Enter/Exit/NextIteration form for the frame executor,
//!   and whether it repeats;
//! - `mlir::EmitMlir`: its MLIR (`scf` regions, inlined calls, stack buffers), what it tells
//!   compile policy (`ModuleFacts`) and how many values it pushes onto a stack (stack bounds);
//! - tracing: `emit_if`, `emit_case`, `emit_while`, `emit_custom_call`, what the bindings and
//!   the MLIR importer (`crate::import`, a front end above this module) call; the capture
//!   unification they share is `trace::captures`.
//!
//! `Construct` names the traits together, and a compile-time check holds every construct to it.
//!
//! Adding a construct: its data in `graph::constructs` and a `NodeKind` variant, one module
//! here implementing `Construct` (and its tracing function if Python builds it), and the
//! variant in each layer's dispatch (the compiler lists them).

mod branch_batching;
mod branches;
mod call;
mod case;
mod if_else;
mod stacks;
mod variables;
pub(crate) mod while_loop;

pub use call::{emit_custom_call, kernel_text, parse_kernel};
pub use case::emit_case;
pub use if_else::emit_if;
pub use while_loop::emit_while;

use crate::batch::BatchNode;
use crate::dataflow::Lower;
use crate::graph::{Call, Case, If, NodeRule, ParseNode, StackOp, VariableOp, While};
use crate::interpret::Interpret;
use crate::mlir::EmitMlir;
use crate::passes::PassRules;
use crate::trace::gradients::Differentiate;
use crate::trace::tangents::Tangent;

/// Everything a construct implements, one trait per layer.
pub(crate) trait Construct:
    NodeRule
    + ParseNode
    + PassRules
    + Differentiate
    + Tangent
    + BatchNode
    + Interpret
    + Lower
    + EmitMlir
{
}

impl<T> Construct for T where
    T: NodeRule
        + ParseNode
        + PassRules
        + Differentiate
        + Tangent
        + BatchNode
        + Interpret
        + Lower
        + EmitMlir
{
}

/// Fails to compile while any construct lacks a layer's implementation.
const _: fn() = || {
    fn complete<C: Construct>() {}
    complete::<If>();
    complete::<Case>();
    complete::<While>();
    complete::<Call>();
    complete::<VariableOp>();
    complete::<StackOp>();
};
