//! The loop's tangent: a loop carrying the tangents beside the loop variables.

use crate::error::{Error, Result};
use crate::graph::NodeKind;
use crate::graph::While;
use crate::trace::Val;

/// The tangent of a loop is a loop carrying the tangents of the loop variables a tangent
/// reaches beside them: its body is the body's tangent function, its condition the condition
/// on the loop variables alone. Nothing is stacked: memory does not grow with the trip count.
impl crate::trace::tangents::Tangent for While {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        use crate::trace::gradients::function;
        use crate::trace::tangents::{
            ignoring_tangents, or_zero, split, takes_tangent, tangent_function, tracer_of,
        };
        let tracer = tracer_of(ctx, "while_loop")?;
        let takes: Vec<bool> = inputs
            .iter()
            .map(|v| takes_tangent(&v.value_type()))
            .collect();
        // The loop variables that carry a tangent: those given one, and those a trip gives
        // one to from them (a fixed point, at most one step per variable).
        let f = function(&tracer, &self.body)?;
        let mut carried: Vec<bool> = tangents.iter().map(Option::is_some).collect();
        let body = loop {
            let body = tangent_function(&tracer, &f, &carried, Some(&carried))?;
            let grown: Vec<bool> = (0..carried.len())
                .map(|i| carried[i] || (takes[i] && body.reached[i]))
                .collect();
            if grown == carried {
                break body;
            }
            carried = grown;
        };
        if body.tangent_out != carried {
            return Err(Error::internal(
                "while_loop",
                "the body's tangents do not match its loop variables",
            ));
        }
        let extra = inputs
            .iter()
            .zip(&carried)
            .filter(|(_, &c)| c)
            .map(|(v, _)| v.value_type())
            .collect();
        let cond = ignoring_tangents(&tracer, &function(&tracer, &self.cond)?, extra)?;
        let node = NodeKind::While(While {
            cond,
            body: body.name,
            ..self.clone()
        });
        let mut args = inputs.to_vec();
        for (i, v) in inputs.iter().enumerate() {
            if carried[i] {
                args.push(or_zero(ctx, &tangents[i], v)?);
            }
        }
        let outputs = ctx.apply_node(&node, &args)?;
        Ok(Some(split(outputs, &carried)))
    }
}
