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
//! - The way in is `crate::import` (a front end above `control`): StableHLO / `scf` modules
//!   imported into the graph IR, their gradient functions emitted here (`emit_function`).

pub(crate) mod function;
pub(crate) mod regions;
mod scalar;
pub(crate) mod stack_bounds;
pub(crate) mod stacks;
pub(crate) mod work;

#[cfg(test)]
pub(crate) mod ops_tests;
#[cfg(test)]
mod tests;

use crate::emit::emitter;
pub use crate::emit::{
    element_type, float_literal, i64_array, names_text, string_literal, type_text, types_text,
    EmitOptions, Emitter, MlirValue, TypeText, YieldBarriers,
};
pub(crate) use function::{Bound, EmitMlir, Lowering};

use std::collections::BTreeSet;

use crate::error::Result;
use crate::graph::{verify, Graph, NodeKind, ValueType};
use crate::DType;

/// What compile policy needs to know of an emitted module, so that it never reads the text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleFacts {
    /// Element types of every tensor, stack and variable (IREE demotes f64 unless told not to;
    /// Vulkan has none).
    pub dtypes: BTreeSet<DType>,
    /// Stacks of tensors (not scalars): `EmitOptions::list_stacks` changes how they are written.
    pub tensor_stacks: bool,
    /// `scf` regions (`If`, `Case`, `While`): lowering to `cf` changes the module.
    pub regions: bool,
    /// The barriers `EmitOptions::yield_barriers` actually put on branch results (`None`: the
    /// option changed nothing).
    pub yield_barriers: YieldBarriers,
    /// A `While` loop: its trips step through IREE's VM, which synchronises with the host.
    pub loops: bool,
    /// A loop was written with several iterations per trip (`EmitOptions::unroll_loops`).
    pub unrolled_loops: bool,
    /// The largest work of any one op (`OpDef::work` on its static shapes: elements, or
    /// multiply-adds for products): whether a dispatch is worth spreading over threads.
    pub heaviest_op: usize,
}

/// The graph as MLIR text: a module with the entry function as a public `func.func` (see the
/// module doc). The graph is verified first; ops or nodes without an MLIR form are `Compile`
/// errors.
///
/// ```
/// let graph = gradloop::graph::parse_graph(
///     "graph @f\nfunc @f(%0: f32[3]) -> (f32[3]) {\n  %1 = sin(%0) : f32[3]\n  return %1\n}",
/// )?;
/// let text = gradloop::mlir::emit_module(&graph)?;
/// assert!(text.contains("stablehlo.sine %arg0 : tensor<3xf32>"));
/// # Ok::<(), gradloop::Error>(())
/// ```
pub fn emit_module(graph: &Graph) -> Result<String> {
    Ok(emit(graph, true, EmitOptions::default())?.0)
}

/// `emit_module` with `options`.
pub fn emit_module_with(graph: &Graph, options: EmitOptions) -> Result<String> {
    Ok(emit(graph, true, options)?.0)
}

/// `emit_module_with`, and the facts about the module that compile policy reads.
pub fn emit_module_facts(graph: &Graph, options: EmitOptions) -> Result<(String, ModuleFacts)> {
    emit(graph, true, options)
}

/// The entry function alone, as a public `func.func` (no module around it): what is added to
/// an existing module (`crate::import::gradient_module`). Everything it calls is inlined, so it
/// refers to no other symbol.
pub fn emit_function(graph: &Graph) -> Result<String> {
    emit_function_with(graph, EmitOptions::default())
}

/// `emit_function` with `options`.
pub fn emit_function_with(graph: &Graph, options: EmitOptions) -> Result<String> {
    Ok(emit(graph, false, options)?.0)
}

/// The facts that follow from the graph's types and nodes (the emitter adds the rest).
fn graph_facts(graph: &Graph) -> ModuleFacts {
    let mut facts = ModuleFacts::default();
    for f in graph.library.iter() {
        let types = f
            .params
            .iter()
            .chain(f.nodes.iter().flat_map(|n| &n.outputs));
        for ty in types {
            facts.dtypes.insert(ty.inner().dtype);
            facts.tensor_stacks |= matches!(ty, ValueType::Stack(t) if t.ndim() > 0);
        }
        for node in &f.nodes {
            if matches!(node.kind, NodeKind::Op(_)) {
                // an op of unknown size counts as heavy
                let work = f.op_work(node).unwrap_or(usize::MAX);
                facts.heaviest_op = facts.heaviest_op.max(work);
            }
            if let Some(construct) = function::construct_emitter(&node.kind) {
                construct.module_facts(&mut facts);
            }
        }
    }
    facts
}

fn emit(graph: &Graph, in_module: bool, options: EmitOptions) -> Result<(String, ModuleFacts)> {
    verify(graph)?;
    let graph = &crate::passes::functionalize_variables(graph)?;
    // Tracing repeats pure nodes (a batched value narrowed at each use, a gradient's rules
    // rebuilding what another built): one copy each keeps modules small for the compiler.
    let graph = &crate::passes::eliminate_common_subexpressions(graph)?;
    let graph = &crate::passes::elide_discarded_stand_ins(graph)?;
    let entry = graph.entry_function()?;
    let mut lowering = Lowering::new(&graph.library);
    lowering.e.options = options;
    if in_module {
        lowering.e.line("module {");
        lowering.e.indent();
    }
    let entered = lowering.entry(entry);
    lowering.e.check_budget()?;
    entered?;
    if in_module {
        lowering.e.dedent();
        lowering.e.line("}");
    }
    let mut facts = graph_facts(graph);
    facts.yield_barriers = lowering.e.yield_barriers;
    facts.unrolled_loops = lowering.unrolled_loops;
    Ok((lowering.e.finish(), facts))
}
