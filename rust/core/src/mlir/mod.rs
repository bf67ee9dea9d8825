//! The MLIR emitter: a graph becomes an MLIR module of StableHLO ops inside `scf` control flow,
//! the input IREE compiles (`--iree-input-type=stablehlo`). All MLIR text is produced here, in
//! one seam.
//!
//! ```text
//!   Graph ──emit_module──► module {
//!                            func.func @entry(%arg0: tensor<3xf32>, ...) -> (...) {
//!                              %0 = stablehlo.sine %arg0 : tensor<3xf32> loc("model.py":3:0)
//!                              %1:2 = scf.while (...) { <cond inlined> } do { <body inlined> }
//!                              return ...
//!                            }
//!                          }
//! ```
//!
//! - The entry function becomes a public `func.func`; the functions it calls are inlined into
//!   the `scf` regions of `If`/`Case`/`While` and in place of `Call` (`function`, `control`).
//! - Each op writes its own StableHLO through `OpDef::emit`, beside its shape rule, kernel and
//!   gradient in the op table: there is no list of ops here. Ops get an `Emitter` (`emitter`)
//!   with SSA naming, constants, `loc`, and the shared shape helpers (`shapes`): the op
//!   table's implicit numpy broadcasting is made explicit with `broadcast_in_dim`.
//! - Types: a tensor is `tensor<2x?xf32>` (`DYN` is `?`; bool is `i1`).
//! - Every op carries `loc("file":line:0)` from its node's source location, or `loc(unknown)`.
//! - Stacks (loop-gradient intermediates) are a `tensor<? x element>` buffer with doubling
//!   capacity and an `index` size, carried through loops like any value, or with
//!   `EmitOptions::list_stacks` a `!util.list<?>` of buffer views (`stacks`).
//! - Rank-0 values cross regions as MLIR scalars and scalar ops run as `arith`/`math` on the
//!   host (`scalar`); stacks of scalars are host-side `!util.list`s (`stacks`).
//! - Variables are made values first (`passes::functionalize_variables`). What has no MLIR
//!   form yet (reshapes to unknown shapes, ...) is a `Compile` error naming the op, its node,
//!   function and source line.
//! - `import` is the way in: StableHLO / `scf` modules (in MLIR's generic form) imported into
//!   the graph IR, and their gradient functions emitted back into them (`emit_function`).

mod control;
mod emitter;
mod function;
pub mod import;
mod loop_vars;
mod scalar;
mod shapes;
mod stack_bounds;
mod stacks;

#[cfg(test)]
mod cases;
#[cfg(test)]
mod check;
#[cfg(test)]
mod filecheck;
#[cfg(test)]
mod ops_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod traced;

pub use emitter::{
    element_type, float_literal, names_text, string_literal, type_text, types_text, Emitter,
    MlirValue, TypeText,
};
pub use shapes::i64_array;

use crate::error::Result;
use crate::graph::{verify, Graph};
use function::Lowering;

/// Choices in how a module is written (see `stacks.rs`); the defaults run on every target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmitOptions {
    /// Tensor stacks as `!util.list<?>`s of buffer views (O(1) per push in IREE) instead of
    /// growable buffers (which IREE copies on every trip).
    pub list_stacks: bool,
    /// A branch yields a tensor it yields twice, or one equal to another once IREE folds
    /// constants, through an optimization barrier (`Terminator::BranchYield` in `control.rs`).
    pub distinct_yields: bool,
}

/// The graph as MLIR text: a module with the entry function as a public `func.func` (see the
/// module doc). The graph is verified first; ops or nodes without an MLIR form are `Compile`
/// errors.
pub fn emit_module(graph: &Graph) -> Result<String> {
    emit(graph, true, EmitOptions::default())
}

/// `emit_module` with `options`.
pub fn emit_module_with(graph: &Graph, options: EmitOptions) -> Result<String> {
    emit(graph, true, options)
}

/// The entry function alone, as a public `func.func` (no module around it): what is added to
/// an existing module (`import::gradient_module`). Everything it calls is inlined, so it
/// refers to no other symbol.
pub fn emit_function(graph: &Graph) -> Result<String> {
    emit(graph, false, EmitOptions::default())
}

fn emit(graph: &Graph, in_module: bool, options: EmitOptions) -> Result<String> {
    verify(graph)?;
    let graph = &crate::passes::functionalize_variables(graph)?;
    let entry = graph.entry_function()?;
    let mut lowering = Lowering::new(&graph.library);
    lowering.e.options = options;
    if in_module {
        lowering.e.line("module {");
        lowering.e.indent();
    }
    lowering.entry(entry)?;
    if in_module {
        lowering.e.dedent();
        lowering.e.line("}");
    }
    Ok(lowering.e.finish())
}
