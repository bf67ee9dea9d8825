//! Control flow as a table: one module per construct, each implementing every layer's trait
//! for it, the way `ops::OpDef` holds an op's rule, kernel, gradient and emission together.
//!
//! | construct | node kind | module |
//! |---|---|---|
//! | `gl.cond` | `If` | `if_else` |
//! | `gl.switch_case` | `Case` | `case` |
//! | `gl.while_loop` | `While` | `while_loop` |
//! | function calls, `custom_gradient` | `Call` | `call` |
//! | `gl.Variable` reads and writes | `Variable(VariableOp)` | `variables` |
//! | loop-gradient stacks | `Stack(StackOp)` | `stacks` |
//!
//! The node kinds are plain data in `graph::constructs`; each layer defines the trait it needs
//! and dispatches through one exhaustive match over `NodeKind`, so a construct missing an
//! implementation does not compile:
//!
//! - `graph::NodeRule` + `graph::ParseNode`: text keyword and attributes, callees, type rule;
//! - `trace::gradients::Differentiate`: its gradient (for `If`, `Case`, `While`, `Call`, an
//!   `Augment` program transform: a new forward node that also returns residuals, and the
//!   gradient node that takes them);
//! - `trace::tangents::Tangent`: its forward mode (for `If`, `Case`, `While`, `Call`, the same
//!   construct over the callees' tangent functions, tangents beside the values);
//! - `interpret::Interpret`: running a node in the reference interpreter;
//! - `mlir::EmitMlir`: its MLIR (`scf` regions, inlined calls, stack buffers);
//!
//! `Construct` names them together, and a compile-time check holds every construct to it.
//!
//! Tracing a construct from Python callbacks (`trace::emit_if`, ...: captures unified into one
//! signature) stays in `trace`: the MLIR importer, below this module, traces through it too.
//!
//! Adding a construct: its data in `graph::constructs` and a `NodeKind` variant, one module
//! here implementing `Construct`, and the variant in each layer's match (the compiler lists
//! them).

mod branches;
mod call;
mod case;
mod if_else;
mod stacks;
mod variables;
mod while_loop;
mod while_trips;

use crate::dataflow::Lower;
use crate::graph::{Call, Case, If, NodeRule, ParseNode, StackOp, VariableOp, While};
use crate::interpret::Interpret;
use crate::mlir::EmitMlir;
use crate::trace::gradients::Differentiate;
use crate::trace::tangents::Tangent;

/// Everything a construct implements, one trait per layer.
pub(crate) trait Construct:
    NodeRule + ParseNode + Differentiate + Tangent + Interpret + Lower + EmitMlir
{
}

impl<T: NodeRule + ParseNode + Differentiate + Tangent + Interpret + Lower + EmitMlir> Construct
    for T
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
