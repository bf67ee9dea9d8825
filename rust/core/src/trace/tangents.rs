//! Forward mode through constructs: the dispatch of the tangent rule of nodes that are not ops
//! (to each construct's `Tangent`, in `crate::control`), and the program transform the
//! constructs that call functions share.
//!
//! The tangent of a function `f(params) -> results` is a function `f_jvp(params, tangents of
//! the params that have one) -> (results, tangents of every float result)`, traced by replaying
//! `f` under a `ForwardContext` whose accumulator holds the tangent parameters (a result no
//! tangent reaches gets zeros, so branches agree on their signature). The tangent of an
//! `If`/`Case` is the same construct over its branches' tangent functions; of a `While`, a
//! `While` whose body is the body's tangent function and whose loop variables are followed by
//! their tangents — no stacks, since nothing flows backwards.

use super::gradients::{function, gradient_error, is_float_stack, is_float_tensor, zero_like};
use super::tracer::lock;
use super::{registry, replay, TraceContext, TracerRef, Val};
use crate::error::{Error, Result};
use crate::forward::{ForwardAccumulator, ForwardContext};
use crate::graph::{Function, NodeKind, NodeRule, ValueType};
use crate::ops::{Context, Tangents, Values};

/// What a node's tangent rule builds: its outputs and their tangents, or `None` when the node
/// takes no tangents (it then runs as it is).
pub type Built = Option<(Values<Val>, Tangents<Val>)>;

/// How forward mode goes through a construct's node.
pub(crate) trait Tangent {
    /// Through `ctx`, the node that computes this node's outputs and their tangents from
    /// `inputs` and `tangents` (`None` where an input has none; at least one is `Some`).
    fn tangent(
        &self,
        ctx: &mut dyn Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<Built>;
}

/// The forward-mode rule of every node that is not an op (registered with the gradients).
pub fn node_tangent(
    ctx: &mut dyn Context<Val>,
    kind: &NodeKind,
    inputs: &[Val],
    tangents: &[Option<Val>],
) -> Result<Built> {
    match kind {
        NodeKind::Arg(_) | NodeKind::Const(_) | NodeKind::Op(_) => Ok(None),
        NodeKind::If(c) => c.tangent(ctx, inputs, tangents),
        NodeKind::Case(c) => c.tangent(ctx, inputs, tangents),
        NodeKind::While(c) => c.tangent(ctx, inputs, tangents),
        NodeKind::Call(c) => c.tangent(ctx, inputs, tangents),
        NodeKind::Variable(c) => c.tangent(ctx, inputs, tangents),
        NodeKind::Stack(c) => c.tangent(ctx, inputs, tangents),
    }
}

/// A value that has a tangent of its own type: a float tensor, or a stack of them.
pub(crate) fn takes_tangent(ty: &ValueType) -> bool {
    is_float_tensor(ty) || is_float_stack(ty)
}

/// `t`, or a zero tangent for `like` (zeros, or an empty stack).
pub(crate) fn or_zero(ctx: &mut dyn Context<Val>, t: &Option<Val>, like: &Val) -> Result<Val> {
    match t {
        Some(t) => Ok(t.clone()),
        None => zero_like(ctx, like),
    }
}

pub(crate) fn tracer_of(ctx: &dyn Context<Val>, what: &str) -> Result<TracerRef> {
    ctx.tracer()
        .ok_or_else(|| gradient_error(what, "control flow outside a traced function"))
}

/// `f` replayed on `args` into the tracer's current function under a fresh accumulator that
/// holds the `tangents` given (argument index, tangent): its results and their tangents (`None`
/// where none reaches).
pub(crate) fn replay_forward(
    tracer: &TracerRef,
    f: &Function,
    args: &[Val],
    tangents: impl IntoIterator<Item = (usize, Val)>,
) -> Result<(Vec<Val>, Vec<Option<Val>>)> {
    let acc = ForwardAccumulator::new_ref();
    for (i, t) in tangents {
        crate::forward::lock(&acc).watch(&args[i], t)?;
    }
    let mut base = TraceContext::new(Some(tracer.clone()));
    let accumulators = [acc.clone()];
    let mut ctx = ForwardContext {
        inner: &mut base,
        tapes: &[],
        accumulators: &accumulators,
        tapes_below: &[0],
        registry: registry(),
    };
    let results = replay(&mut ctx, f, args)?;
    let acc = crate::forward::lock(&acc);
    let tangents = results.iter().map(|r| acc.tangent(r)).collect();
    Ok((results, tangents))
}

/// A function's tangent function (see the module doc), added to the tracer's library.
pub(crate) struct TangentFunction {
    pub name: String,
    /// The results that have a tangent result (after all the results, in this order).
    pub tangent_out: Vec<bool>,
    /// The results a tangent reaches (the others' are structurally zero).
    pub reached: Vec<bool>,
}

/// Builds the tangent function of `f` for the parameters `tangent_in` marks, returning the
/// tangents of the results `want` marks (zeros where none reaches; every result that takes one
/// when `None`).
pub(crate) fn tangent_function(
    tracer: &TracerRef,
    f: &Function,
    tangent_in: &[bool],
    want: Option<&[bool]>,
) -> Result<TangentFunction> {
    let mut types = f.params.clone();
    types.extend(
        f.params
            .iter()
            .zip(tangent_in)
            .filter(|(_, &t)| t)
            .map(|(ty, _)| ty.clone()),
    );
    let params = lock(tracer).push_function(&format!("{}_jvp", f.name), types);
    let n = f.params.len();
    let built = (|| {
        let marked = (0..n).filter(|&i| tangent_in[i]);
        let given = marked.enumerate().map(|(k, i)| (i, params[n + k].clone()));
        let (results, tangents) = replay_forward(tracer, f, &params[..n], given)?;
        let mut base = TraceContext::new(Some(tracer.clone()));
        let mut outs = results.clone();
        let mut tangent_out = Vec::with_capacity(results.len());
        let mut reached = Vec::with_capacity(results.len());
        for (j, (r, t)) in results.iter().zip(tangents).enumerate() {
            reached.push(t.is_some());
            let takes = takes_tangent(&r.value_type()) && want.is_none_or(|w| w[j]);
            tangent_out.push(takes);
            if takes {
                outs.push(or_zero(&mut base, &t, r)?);
            }
        }
        Ok((outs, tangent_out, reached))
    })();
    let (outs, tangent_out, reached) = match built {
        Ok(b) => b,
        Err(e) => {
            lock(tracer).abandon_function();
            return Err(e);
        }
    };
    let (name, captures) = lock(tracer).pop_function(&outs)?;
    if !captures.is_empty() {
        return Err(Error::internal(
            "jvp",
            format!("@{name} captured {} outer values", captures.len()),
        ));
    }
    Ok(TangentFunction {
        name,
        tangent_out,
        reached,
    })
}

/// `f` taking `extra` parameters after its own, which it ignores (a loop condition beside a
/// loop's tangents).
pub(crate) fn ignoring_tangents(
    tracer: &TracerRef,
    f: &Function,
    extra: Vec<ValueType>,
) -> Result<String> {
    let mut types = f.params.clone();
    types.extend(extra);
    let params = lock(tracer).push_function(&format!("{}_jvp", f.name), types);
    let mut base = TraceContext::new(Some(tracer.clone()));
    let results = match replay(&mut base, f, &params[..f.params.len()]) {
        Ok(r) => r,
        Err(e) => {
            lock(tracer).abandon_function();
            return Err(e);
        }
    };
    let (name, captures) = lock(tracer).pop_function(&results)?;
    if !captures.is_empty() {
        return Err(Error::internal(
            "jvp",
            format!("@{name} captured {} outer values", captures.len()),
        ));
    }
    Ok(name)
}

/// The tangent of a node calling functions with one signature (`If`, `Case`, `Call`): the same
/// construct over each callee's tangent function, on the inputs followed by the operands'
/// tangents (the inputs before `operand_start`, a predicate or an index, have none).
pub(crate) fn over_callees(
    ctx: &mut dyn Context<Val>,
    construct: &dyn NodeRule,
    inputs: &[Val],
    tangents: &[Option<Val>],
) -> Result<Built> {
    let tracer = tracer_of(ctx, construct.keyword())?;
    let start = construct.operand_start();
    let tangent_in: Vec<bool> = tangents[start..].iter().map(Option::is_some).collect();
    let callees: Vec<Function> = construct
        .callees()
        .into_iter()
        .map(|c| function(&tracer, c))
        .collect::<Result<_>>()?;
    // Every callee's tangent function with a tangent for each result that takes one; where no
    // callee's tangent reaches a result, they are built again without it, so that a result no
    // branch perturbs gets no tangent at all rather than zeros. (Built once in the common
    // case: a construct nested d deep would otherwise be built 2^d times.)
    let mut built = callees
        .iter()
        .map(|f| tangent_function(&tracer, f, &tangent_in, None))
        .collect::<Result<Vec<_>>>()?;
    let mut wanted: Vec<bool> = Vec::new();
    for b in &built {
        wanted.resize(b.reached.len(), false);
        for (w, r) in wanted.iter_mut().zip(&b.reached) {
            *w |= *r;
        }
    }
    let surplus = built
        .first()
        .is_some_and(|b| b.tangent_out.iter().zip(&wanted).any(|(&t, &w)| t && !w));
    if surplus {
        built = callees
            .iter()
            .map(|f| tangent_function(&tracer, f, &tangent_in, Some(&wanted)))
            .collect::<Result<Vec<_>>>()?;
    }
    let tangent_out = built
        .last()
        .map(|b| b.tangent_out.clone())
        .unwrap_or_default();
    let names: Vec<String> = built.into_iter().map(|b| b.name).collect();
    let node = construct.with_callees(names);
    let mut args = inputs.to_vec();
    args.extend(tangents[start..].iter().flatten().cloned());
    let outputs = ctx.apply_node(&node, &args)?;
    Ok(Some(split(outputs, &tangent_out)))
}

/// A tangent node's outputs split into the primal outputs and their tangents.
pub(crate) fn split(outputs: Values<Val>, tangent_out: &[bool]) -> (Values<Val>, Tangents<Val>) {
    let n = tangent_out.len();
    let mut rest = outputs[n..].iter().cloned();
    let tangents = tangent_out
        .iter()
        .map(|&t| if t { rest.next() } else { None })
        .collect();
    (outputs[..n].iter().cloned().collect(), tangents)
}
