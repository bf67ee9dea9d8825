//! Replaying a function of the library through a context: each node is applied again, so a
//! `TapeContext` over a `TraceContext` records it (a function inlined under a tape is how its
//! gradient is built) and nested control flow records its own control-flow gradient.

use super::tracer::lock;
use super::Val;
use crate::error::Result;
use crate::graph::{Function, NodeKind};
use crate::ops::Context;

/// Applies `function`'s nodes through `ctx` with its parameters bound to `args`; returns its
/// results. Each node keeps its source location.
pub fn replay(ctx: &mut dyn Context<Val>, function: &Function, args: &[Val]) -> Result<Vec<Val>> {
    let tracer = ctx.tracer();
    let saved = tracer.as_ref().and_then(|t| lock(t).location.clone());
    let mut values: Vec<Vec<Val>> = Vec::with_capacity(function.nodes.len());
    let result = (|| {
        for node in &function.nodes {
            if let (Some(t), Some(l)) = (&tracer, &node.location) {
                lock(t).location = Some(l.clone());
            }
            let inputs: Vec<Val> = node
                .inputs
                .iter()
                .map(|p| values[p.node][p.output].clone())
                .collect();
            let outputs = match &node.kind {
                NodeKind::Arg(i) => vec![args
                    .get(*i)
                    .cloned()
                    .ok_or_else(|| crate::error::Error::invalid("replay", "missing argument"))?],
                NodeKind::Op(op) => ctx.apply(op, &inputs)?.into_vec(),
                kind => ctx.apply_node(kind, &inputs)?.into_vec(),
            };
            values.push(outputs);
        }
        Ok(function
            .results
            .iter()
            .map(|p| values[p.node][p.output].clone())
            .collect())
    })();
    if let Some(t) = &tracer {
        lock(t).location = saved;
    }
    result
}
