//! Variables inside control flow become values as each construct is traced: each Variable its
//! functions read or assign is read once before the node and passed in as a tensor; one they
//! assign comes back as a value (after a branch's results, or in the loop variable that
//! carried it) and is assigned once after the node.
//!
//! ```text
//!   while_loop(cond, body, x)              %r = read_variable(v)
//!     body: v.assign(v * x); ...      ──►   %w = while(%x, %r) {body: v' = assigned_value(v, v*x)}
//!                                           assign_variable(v, %w#1)
//! ```
//!
//! The construct is then pure, which is what its gradient needs: a nested construct is
//! differentiated by running its forward pass again where the gradient is built, and a pure
//! one may run twice; every read inside sees the value it saw in the forward pass. Assignments
//! keep eager mode's gradient semantics through `passes::Assignments::Credited`. A construct
//! without such a form (a loop condition that assigns) keeps its Variables (see `gradients`).

use super::{lock, TracerRef, Val};
use crate::error::{ErrorKind, Result};
use crate::graph::VariableOp;
use crate::graph::{NodeKind, ValueType};
use crate::ops::Context;
use crate::passes;

/// Which construct the functions belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// `If` / `Case`: the branches return assigned Variables after their results.
    Branches,
    /// `While`: captures are loop variables, which carry the assigned Variables.
    Loop,
}

/// The Variables a construct assigns: (index among its captures, resource).
#[derive(Default)]
pub(crate) struct Threaded {
    assigned: Vec<(usize, Val)>,
}

/// Rewrites the functions `names` of a construct (which take `leading` own parameters, then
/// `captures`) so that they take Variables as values (see the module doc), and replaces the
/// resources among `captures` by reads. Leaves everything as it is for a construct that has
/// no such form.
pub(crate) fn thread_variables(
    ctx: &mut dyn Context<Val>,
    tracer: &TracerRef,
    names: &[String],
    leading: usize,
    construct: Carrier,
    captures: &mut [Val],
) -> Result<Threaded> {
    let resources: Vec<usize> = (0..captures.len())
        .filter(|&i| matches!(captures[i].value_type(), ValueType::Resource(_)))
        .collect();
    if resources.is_empty() {
        return Ok(Threaded::default());
    }
    let rewritten = {
        let mut t = lock(tracer);
        let types: Vec<_> = resources
            .iter()
            .map(|&i| captures[i].value_type().inner().clone())
            .collect();
        let helpers = t.assignment_helpers(&types)?;
        let callees: Vec<&str> = names.iter().map(String::as_str).collect();
        passes::thread_variables(t.library(), &callees, construct == Carrier::Loop, helpers)
    };
    let (written, functions) = match rewritten {
        Ok(r) => r,
        Err(e) if e.kind == ErrorKind::Compile => return Ok(Threaded::default()),
        Err(e) => return Err(e),
    };
    {
        let mut t = lock(tracer);
        for f in functions {
            t.put_function(f)?;
        }
    }
    let mut assigned = Vec::with_capacity(written.len());
    for i in resources {
        let resource = captures[i].clone();
        if written.contains(&(leading + i)) {
            assigned.push((i, resource.clone()));
        }
        captures[i] = ctx
            .apply_node(&NodeKind::Variable(VariableOp::Read), &[resource])?
            .remove(0);
    }
    Ok(Threaded { assigned })
}

impl Threaded {
    /// Assigns each Variable its final value among the node's `outputs`, after `own` results
    /// (its own results or loop variables); returns those.
    pub(crate) fn assign_after(
        self,
        ctx: &mut dyn Context<Val>,
        mut outputs: Vec<Val>,
        own: usize,
        construct: Carrier,
    ) -> Result<Vec<Val>> {
        for (j, (i, resource)) in self.assigned.into_iter().enumerate() {
            let last = match construct {
                Carrier::Branches => outputs[own + j].clone(),
                Carrier::Loop => outputs[own + i].clone(),
            };
            ctx.apply_node(&NodeKind::Variable(VariableOp::Assign), &[resource, last])?;
        }
        outputs.truncate(own);
        Ok(outputs)
    }
}
