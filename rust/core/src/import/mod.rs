//! MLIR in: StableHLO modules (with `stablehlo.while` / `if` / `case` and their `scf` forms)
//! imported into the graph IR, and their gradient functions added back to the module.
//!
//! ```text
//!   generic MLIR ──parse_generic──► Operation tree ──import_function──► Graph (If/Case/While)
//!                                                                          │ gradient_graph
//!   module + func.func @main_grad ◄──emit_function + insert── Graph @main_grad (stacks for loops)
//! ```
//!
//! - Input is the *generic* form with local scope and locations (what the MLIR Python bindings
//!   print with `print_generic_op_form=True, use_local_scope=True, enable_debug_info=True`):
//!   one regular syntax for every dialect, so one small parser (`syntax`) reads it. Parsing and
//!   verifying the user's text is MLIR's own job (the Python layer does it first).
//! - `table` maps each supported op name to its conversion, once; importing walks a function
//!   through a `TraceContext` (`importer`), so regions become library functions with captures
//!   exactly as traced Python does, and the control-flow gradients apply unchanged.
//! - `func.call`s are inlined. An op that is not in the table is a `Compile` error naming the op
//!   and its location (`file:line:col`); so is a type gradloop lacks (bf16, unsigned, tuples).

mod attr;
mod contract;
mod control;
mod cursor;
mod elementwise;
mod gather;
mod importer;
mod layout;
mod point_gather;
mod point_scatter;
mod syntax;
mod table;
mod types;

#[cfg(test)]
mod control_tests;
#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod tests;

pub use attr::{Attribute, DenseElements};
pub use syntax::{parse_generic, Block, Loc, Operation, Region, ValueRef};
pub use table::supported_ops;
pub use types::Type;

use crate::error::{Error, Result};
use crate::graph::{Graph, ValueType};
use crate::interpret::{run_graph, RtValue};
use crate::tensor::Tensor;
use crate::trace::{gradient_graph_with, lock, Tracer};
use importer::{entry_block, import_error, symbol_name, Importer};

/// The function `function` of `module` (the parsed generic form) as a graph whose entry is
/// named after it. `source` names the text in locations where MLIR says `-` (text parsed from
/// memory).
pub fn import_function(module: &Operation, function: &str, source: &str) -> Result<Graph> {
    import_function_with(module, function, source, None)
}

/// `import_function`, with every loop's gradient keeping `checkpoints` snapshots (None:
/// stacks; see `While::checkpoints`).
pub fn import_function_with(
    module: &Operation,
    function: &str,
    source: &str,
    checkpoints: Option<u32>,
) -> Result<Graph> {
    let found =
        module_ops(module).find(|op| op.name == "func.func" && symbol_name(op) == Some(function));
    let Some(f) = found else {
        let names: Vec<String> = module_ops(module)
            .filter(|op| op.name == "func.func")
            .filter_map(symbol_name)
            .map(|n| format!("@{n}"))
            .collect();
        return Err(Error::invalid(
            "mlir import",
            format!(
                "no function @{function} in the module (functions: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ));
    };
    let block = entry_block(f, &format!("@{function}"))?;
    let mut params = Vec::with_capacity(block.args.len());
    for (i, (_, ty)) in block.args.iter().enumerate() {
        let t = ty.tensor_type().ok_or_else(|| {
            import_error(
                "func.func",
                format!(
                    "argument {i} of @{function} has type {ty}, which gradloop does not support \
                     (tensors of f32, f64, i32, i64 or i1)"
                ),
            )
        })?;
        params.push(ValueType::Tensor(t));
    }
    let (tracer, args) = Tracer::new(function, params);
    let mut importer = Importer::new(module, tracer.clone(), source);
    importer.checkpoints = checkpoints;
    let results = importer.block(block, &args)?;
    let traced = lock(&tracer).finish(&results)?;
    if !traced.captured_inputs.is_empty() {
        return Err(Error::internal(
            "mlir import",
            "an imported function captured a value",
        ));
    }
    Ok(traced.graph)
}

/// `function` of the generic-form module `text`, imported and run on the graph interpreter on
/// `args`: the reference semantics of a module, what a round trip through the emitter and the
/// importer is checked against.
pub fn run_reference(
    text: &str,
    function: &str,
    args: Vec<Tensor>,
    source: &str,
) -> Result<Vec<Tensor>> {
    let module = parse_generic(text)?;
    let graph = import_function(&module, function, source)?;
    let outputs = run_graph(&graph, args.into_iter().map(RtValue::Tensor).collect())?;
    outputs
        .into_iter()
        .map(|v| match v {
            RtValue::Tensor(t) => Ok(t),
            other => Err(Error::internal(
                "mlir import",
                format!("@{function} returned a {}", other.value_type()),
            )),
        })
        .collect()
}

/// The generic-form module `text` with a public `func.func @<function>_grad` added: it takes
/// `@function`'s arguments (then one cotangent per result when there are several results or a
/// non-scalar one) and returns the gradients with respect to the arguments `wrt`, in order.
/// With `checkpoints`, every loop's gradient keeps that many snapshots of its variables
/// instead of stacks (memory independent of the trip count, static shapes); with
/// `fixed_state` instead, each keeps fixed-size state of its own choosing (`fixed_state`
/// snapshots where nothing bounds it: `Tracer::fixed_state_loops`). With `pure_stablehlo` the
/// added function is `func` and `stablehlo` ops alone (`EmitOptions::pure_stablehlo`).
pub fn gradient_module(
    text: &str,
    function: &str,
    wrt: &[usize],
    source: &str,
    loops: LoopGradients,
    pure_stablehlo: bool,
) -> Result<String> {
    let derivation = Derivation {
        suffix: "grad",
        checkpoints: loops.checkpoints,
        pure_stablehlo,
    };
    derived_module(text, function, source, derivation, |graph, name| {
        gradient_graph_with(graph, wrt, name, loops.fixed_state)
    })
}

/// What the loops' gradients of `gradient_module` keep: the same `checkpoints` for every loop,
/// or fixed-size state each loop chooses (`fixed_state` snapshots where nothing bounds it), or
/// (both None) stacks.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopGradients {
    pub checkpoints: Option<u32>,
    pub fixed_state: Option<u32>,
}

/// The generic-form module `text` with a public `func.func @<function>_jvp` added: it takes
/// `@function`'s arguments, then one tangent per argument in `wrt`, and returns `@function`'s
/// results, then the tangent of each float result.
pub fn jvp_module(
    text: &str,
    function: &str,
    wrt: &[usize],
    source: &str,
    pure_stablehlo: bool,
) -> Result<String> {
    let derivation = Derivation {
        suffix: "jvp",
        checkpoints: None,
        pure_stablehlo,
    };
    derived_module(text, function, source, derivation, |graph, name| {
        crate::trace::jvp_graph(graph, wrt, name)
    })
}

/// How a derived function is named, imported and written.
struct Derivation {
    suffix: &'static str,
    checkpoints: Option<u32>,
    pure_stablehlo: bool,
}

/// `text` with `@<function>_<suffix>`, the function `derive` builds from `@function`'s graph.
fn derived_module(
    text: &str,
    function: &str,
    source: &str,
    derivation: Derivation,
    derive: impl FnOnce(&crate::graph::Graph, &str) -> Result<crate::graph::Graph>,
) -> Result<String> {
    let Derivation {
        suffix,
        checkpoints,
        pure_stablehlo,
    } = derivation;
    let module = parse_generic(text)?;
    let name = format!("{function}_{suffix}");
    if module_ops(&module).any(|op| symbol_name(op) == Some(name.as_str())) {
        return Err(Error::invalid(
            "mlir import",
            format!("the module already defines @{name}, the name of the {suffix} function"),
        ));
    }
    let graph = import_function_with(&module, function, source, checkpoints)?;
    // Values the derived function does not use (a gradient's forward result) are dropped here
    // rather than left to the compiler.
    let derived = crate::passes::eliminate_dead_code(&derive(&graph, &name)?)?;
    if derived.entry != name {
        return Err(Error::internal(
            "mlir import",
            format!("the {suffix} function is named @{}", derived.entry),
        ));
    }
    let options = crate::mlir::EmitOptions {
        pure_stablehlo,
        ..Default::default()
    };
    let func = crate::mlir::emit_function_with(&derived, options)?;
    // The text of the module's body ends at its region's closing brace; a text of bare
    // top-level ops (an implicit module) ends at the end.
    let at = match module.regions.first() {
        Some(r) if module.name == "builtin.module" && r.end > 0 => r.end,
        _ => text.len(),
    };
    Ok(format!("{}\n{func}{}", &text[..at], &text[at..]))
}

/// The ops directly in the module's body.
fn module_ops(module: &Operation) -> impl Iterator<Item = &Operation> {
    module
        .regions
        .iter()
        .flat_map(|r| &r.blocks)
        .flat_map(|b| &b.ops)
}
