//! `While`: `(vars...) -> vars`, running `while cond(vars): vars = body(vars)` (`gl.while_loop`),
//! stopping after `maximum_iterations` trips when set; `parallel_iterations` bounds the
//! iterations an executor may run at once.
//!
//! - Type rule: `cond(vars) -> bool[]`, `body(vars) -> vars`; the outputs are the loop vars.
//! - Gradient: the body is replayed and differentiated; loop-invariant residuals stay loop
//!   variables and every other residual gets a stack. The forward loop carries `(vars, trip
//!   count, stacks)` and pushes each iteration; the gradient loop carries `(cotangents, count,
//!   stacks, invariants)`, pops, and runs the body's backward function until the count reaches
//!   zero. Stack pushes and pops have gradients, so the gradient loop differentiates again.
//! - Interpretation: a Rust loop of two calls per trip, so the stack stays flat.
//! - MLIR: `scf.while` with the trip count and stack bounds, through the region helpers of
//!   `mlir::regions`.
//!
//! One file per concern: the rules here (type, parse, interpretation, passes), `trace` (what
//! `gl.while_loop` records), `gradient` (the augmented loop and its backward loop; its
//! checkpointed forms in `checkpointed`, `dense`, `hybrid` and `schedule`), `tangent`, `lower`
//! (the dataflow frame) and `mlir` (`scf.while`; `trips` for unrolled trips, `stablehlo` for
//! the pure form), `batching` (inside `vmap`).

mod batching;
mod bounds;
mod checkpointed;
mod dense;
mod gradient;
mod hybrid;
mod loop_vars;
mod lower;
mod mlir;
mod schedule;
mod stablehlo;
mod tangent;
mod trace;
pub(crate) mod trips;

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_call;
use crate::graph::NodeKind;
use crate::graph::{AttrReader, Check, Library, NodeRule, ParseNode, ValueType, While};
use crate::interpret::nodes::{check_results, scalar};
use crate::interpret::{Interpret, NodeRun};
use crate::ops::attrs::Attr;
use crate::passes::{PassRules, Threading};
use crate::runtime_values::RtValue;
use crate::shape::TensorType;
use crate::tensor::Tensor;
pub use trace::emit_while;

impl NodeRule for While {
    fn keyword(&self) -> &'static str {
        "while"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let mut attrs = vec![
            ("cond", FuncName(&self.cond).to_string()),
            ("body", FuncName(&self.body).to_string()),
        ];
        if let Some(m) = self.maximum_iterations {
            attrs.push(("maximum_iterations", Attr::Int(m).to_string()));
        }
        attrs.push(("parallel_iterations", self.parallel_iterations.to_string()));
        if let Some(c) = self.checkpoints {
            attrs.push(("checkpoints", c.to_string()));
        }
        attrs
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.cond, &self.body]
    }

    fn with_callees(&self, names: Vec<String>) -> NodeKind {
        let mut names = names.into_iter();
        let mut next = |old: &String| names.next().unwrap_or_else(|| old.clone());
        NodeKind::While(While {
            cond: next(&self.cond),
            body: next(&self.body),
            maximum_iterations: self.maximum_iterations,
            parallel_iterations: self.parallel_iterations,
            checkpoints: self.checkpoints,
        })
    }

    fn check(&self, library: &Library, vars: &[&ValueType], outs: &[&ValueType]) -> Check {
        if self.maximum_iterations.is_some_and(|m| m < 0)
            || self.parallel_iterations == 0
            || self.checkpoints == Some(0)
        {
            return Err(
                "maximum_iterations must be >= 0, parallel_iterations and checkpoints >= 1".into(),
            );
        }
        let bool_scalar = ValueType::Tensor(TensorType::scalar(DType::Bool));
        check_call(library, "cond", &self.cond, vars, &[&bool_scalar])?;
        check_call(library, "body", &self.body, vars, outs)?;
        let body = library.get(&self.body).map_err(|e| e.message)?;
        for (k, (p, o)) in body.params.iter().zip(outs).enumerate() {
            if !p.compatible(o) {
                return Err(format!(
                    "loop var {k}: body @{} takes {p} but the node's output {k} is {o}",
                    self.body
                ));
            }
        }
        Ok(())
    }

    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        Ok(library.get(&self.body)?.params.clone())
    }
}

impl ParseNode for While {
    const KEYWORDS: &'static [&'static str] = &["while"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(While {
            cond: attrs.function("cond")?,
            body: attrs.function("body")?,
            maximum_iterations: attrs.optional_int("maximum_iterations")?,
            parallel_iterations: attrs.int("parallel_iterations")?,
            checkpoints: attrs.optional_int("checkpoints")?,
        })
    }
}

impl Interpret for While {
    /// A loop in Rust: each iteration is two calls that return before the next, so the stack
    /// stays flat however many iterations run. Once the maximum is reached `cond` is not
    /// called.
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let mut vars = run.take_all()?;
        let (cond, body) = (run.callee(0)?, run.callee(1)?);
        let maximum = self.maximum_iterations;
        if let Some(m) = maximum.filter(|&m| m < 0) {
            let msg = format!("maximum_iterations must be at least 0, got {m}");
            return Err(Error::invalid("while", msg));
        }
        let body_fn = run.function(body)?;
        let mut trip: i64 = 0;
        while maximum.is_none_or(|m| trip < m) {
            // The condition gets clones; its frame is gone before the body runs, so the body
            // again holds the only handle to each stack it carries.
            let go = run
                .call(cond, vars.clone())
                .and_then(|r| single(r).and_then(|c| scalar::<bool>(c, "while", "condition")))
                .map_err(|e| in_iteration(e, trip))?;
            if !go {
                break;
            }
            vars = run.call(body, vars).map_err(|e| in_iteration(e, trip))?;
            check_results(&vars, run.outputs(), body_fn).map_err(|e| in_iteration(e, trip))?;
            trip += 1;
        }
        While::count_trips(trip);
        Ok(run.store(vars))
    }
}

/// The one result of a `While` condition function.
fn single(mut results: Vec<RtValue>) -> Result<RtValue> {
    match (results.pop(), results.is_empty()) {
        (Some(value), true) => Ok(value),
        _ => {
            let msg = format!(
                "the condition returned {} values; it must return one",
                results.len() + 1
            );
            Err(Error::new(ErrorKind::ControlFlow, "while", msg))
        }
    }
}

fn in_iteration(mut e: Error, trip: i64) -> Error {
    e.message.push_str(&format!("\n  in iteration {trip}"));
    e
}

impl While {
    /// A loop node whose own gradient keeps stacks (the loops a gradient transform builds).
    pub(crate) fn stacked(
        cond: String,
        body: String,
        maximum_iterations: Option<i64>,
        parallel_iterations: u32,
    ) -> NodeKind {
        NodeKind::While(While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
            checkpoints: None,
        })
    }
}

/// The most trips a bounded loop's fixed-size gradient state keeps one slot each for
/// (`fixed_state`): past it a bound is a safety net more than a size, and a buffer of every
/// state could exhaust memory, so the loop checkpoints instead.
pub const ALL_STATES_UP_TO: i64 = 4096;

impl PassRules for While {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::Loop {
            cond: &self.cond,
            body: &self.body,
        }
    }

    fn constant_choice(&self, _selector: &Tensor) -> Result<Option<usize>> {
        Ok(None)
    }
}
