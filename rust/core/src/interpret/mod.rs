//! The reference interpreter: runs a graph function directly, node by node, with `If`, `Case`
//! and `While` calling their functions (the semantics are those documented in `graph`).
//!
//! ```text
//!   run(library, "main", args)
//!     └─ call @main: check args against params, fetch @main's plan (built once, cached)
//!          └─ for each node in order: take its inputs from the value table (MOVE at the last
//!             use, clone otherwise), run it, store the outputs somebody reads
//!               if/case/call ──► call the chosen function (recursion = nesting depth only)
//!               while        ──► a Rust loop: cond(vars.clone()), vars = body(vars)
//! ```
//!
//! Execution is strict and sequential: a node runs after all nodes before it, so control inputs
//! (which always point at earlier nodes) are satisfied by the order itself, and every node runs,
//! side effects included — nothing is pruned. A `While` is a loop in Rust, not a recursion, so
//! 10^5 iterations take constant stack depth; nested functions recurse once per nesting level.
//! `parallel_iterations` is ignored here. This is the reference semantics other modes are tested
//! against; graph functions run on the frame executor (`crate::executor`: lowered dataflow, lazy
//! pruned execution, overlapping loop iterations), which agrees with it on every value and
//! error, except that it never runs what no result or side effect needs.
//!
//! Errors keep their kind (a shape error stays a shape error); each function frame they cross
//! adds a line naming the node, its function and its source location:
//! `add: operands could not be broadcast ...` / `  at %5 = add(%1, %4) in @body (model.py:12)` /
//! `  in iteration 3` / `  at %3 = while(%1, %2) in @main (model.py:10)`.

mod frame;
pub mod nodes;
mod plan;

#[cfg(test)]
mod control_flow_tests;
#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod state_tests;

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::node_site;
use crate::graph::{Function, Graph, Library, Node, NodeId};
pub use crate::runtime_values::{RtValue, StackValue, VariableRef};
pub use frame::check_params;
use frame::{check_args, Frame};
pub use nodes::{Interpret, NodeRun};
use plan::Plan;

/// How deep calls may nest: far beyond real programs (If in While in If ... is a handful), and
/// low enough that a runaway recursive graph becomes an error, not a stack overflow.
pub const MAX_CALL_DEPTH: usize = 200;

/// Runs `function` of `library` on `args` (see the module doc).
pub fn run(library: &Library, function: &str, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
    Interpreter::new(library).run(function, args)
}

/// Runs the entry function of `graph` on `args`.
///
/// ```
/// use gradloop::interpret::{run_graph, RtValue};
/// use gradloop::Tensor;
///
/// // while i < n: i = i + 1 (so it returns max(n, 0))
/// let graph = gradloop::graph::parse_graph(r#"graph @count
/// func @count(%0: i64[]) -> (i64[]) {
///   %1 = const() {value=[0]} : i64[]
///   %2 = while(%1, %0) {cond=@more, body=@step, parallel_iterations=10} : (i64[], i64[])
///   return %2#0
/// }
/// func @more(%0: i64[], %1: i64[]) -> (bool[]) {
///   %2 = less(%0, %1) : bool[]
///   return %2
/// }
/// func @step(%0: i64[], %1: i64[]) -> (i64[], i64[]) {
///   %2 = const() {value=[1]} : i64[]
///   %3 = add(%0, %2) : i64[]
///   return %3, %1
/// }"#)?;
/// let out = run_graph(&graph, vec![RtValue::from(Tensor::scalar(5i64))])?;
/// assert_eq!(out[0].as_tensor().unwrap().item_f64()?, 5.0);
/// # Ok::<(), gradloop::Error>(())
/// ```
pub fn run_graph(graph: &Graph, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
    run(&graph.library, &graph.entry, args)
}

/// An interpreter over one library: plans are built the first time a function is called and
/// reused by every later call (a loop body's plan serves all its iterations). Keep one
/// interpreter to run a library many times. It is `Sync`: runs on several threads share plans.
#[derive(Debug)]
pub struct Interpreter<'l> {
    library: &'l Library,
    functions: Vec<&'l Function>,
    positions: HashMap<&'l str, usize>,
    plans: Vec<OnceLock<Result<Plan>>>,
}

impl<'l> Interpreter<'l> {
    pub fn new(library: &'l Library) -> Self {
        let functions: Vec<&Function> = library.iter().collect();
        let positions = functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.as_str(), i))
            .collect();
        let plans = functions.iter().map(|_| OnceLock::new()).collect();
        Interpreter {
            library,
            functions,
            positions,
            plans,
        }
    }

    pub fn library(&self) -> &'l Library {
        self.library
    }

    /// Calls `function` with `args`. The argument count and each argument's kind, dtype and
    /// shape are checked against the parameters (errors name the function and the index).
    pub fn run(&self, function: &str, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
        let f = self.position(function)?;
        self.call(f, args, 0)
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.positions.get(name).copied().ok_or_else(|| {
            // The library's own lookup error lists the functions that do exist.
            self.library.get(name).err().unwrap_or_else(|| {
                Error::internal("interpret", format!("@{name} is missing from the index"))
            })
        })
    }

    fn function(&self, f: usize) -> Result<&'l Function> {
        self.functions.get(f).copied().ok_or_else(|| {
            Error::internal("interpret", format!("no function at library position {f}"))
        })
    }

    fn plan(&self, f: usize) -> Result<&Plan> {
        let function = self.function(f)?;
        let slot = self.plans.get(f).ok_or_else(|| {
            Error::internal("interpret", format!("no plan slot for @{}", function.name))
        })?;
        let plan = slot.get_or_init(|| Plan::build(function, |name| self.position(name)));
        plan.as_ref().map_err(Clone::clone)
    }

    /// Calls the function at library position `f`; `depth` is how many calls enclose this one.
    fn call(&self, f: usize, args: Vec<RtValue>, depth: usize) -> Result<Vec<RtValue>> {
        let function = self.function(f)?;
        if depth > MAX_CALL_DEPTH {
            return Err(Error::new(
                ErrorKind::ControlFlow,
                "interpret",
                format!(
                    "calling @{} nests calls more than {MAX_CALL_DEPTH} deep (a recursive graph?)",
                    function.name
                ),
            ));
        }
        check_args(function, &args)?;
        let plan = self.plan(f)?;
        self.run_frame(function, plan, args, depth)
    }

    /// Runs the nodes of `function` in order over a fresh frame.
    fn run_frame(
        &self,
        function: &Function,
        plan: &Plan,
        args: Vec<RtValue>,
        depth: usize,
    ) -> Result<Vec<RtValue>> {
        let mut frame = Frame::new(plan, args);
        for (id, (node, np)) in function.nodes.iter().zip(&plan.nodes).enumerate() {
            self.exec_node(node, np, &mut frame, depth)
                .and_then(|produced| check_output_count(node, produced))
                .map_err(|e| with_node_context(e, function, id))?;
        }
        frame.results(plan)
    }
}

fn check_output_count(node: &Node, produced: usize) -> Result<()> {
    if produced == node.outputs.len() {
        return Ok(());
    }
    let want = node.outputs.len();
    let msg = format!("produced {produced} values; the node declares {want} outputs");
    Err(Error::new(ErrorKind::Graph, node.kind.name(), msg))
}

/// Adds the line `  at %7 = mul(%3, %5) in @f (model.py:12)` to `e`, keeping its kind and op.
fn with_node_context(mut e: Error, function: &Function, id: NodeId) -> Error {
    e.message.push_str("\n  ");
    e.message.push_str(&node_site(function, id));
    e
}
