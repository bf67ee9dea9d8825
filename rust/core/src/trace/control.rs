//! Emitting `If`, `Case` and `While` from traced functions: the captures of the functions are
//! unified into one signature (the cond_v2 design), then the node is applied through the
//! context, so tapes record it and its gradient is the control-flow gradient.

use crate::graph::{Call, Case, If, While};
use std::collections::HashMap;

use super::tracer::lock;
use super::variables::{thread_variables, Construct};
use super::Val;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::with_params;
use crate::graph::{NodeKind, ValueType};
use crate::ops::Context;
use crate::tensor::TensorId;
use crate::value::Value;

/// A traced function and the outer values it captured (`Tracer::pop_function`).
#[derive(Clone, Debug)]
pub struct Branch {
    pub name: String,
    pub captures: Vec<Val>,
}

impl From<(String, Vec<Val>)> for Branch {
    fn from((name, captures): (String, Vec<Val>)) -> Self {
        Branch { name, captures }
    }
}

/// Cond and body of a loop, traced with the loop variables as their first parameters.
#[derive(Clone, Debug)]
pub struct LoopFunctions {
    pub cond: Branch,
    pub body: Branch,
    pub maximum_iterations: Option<i64>,
    pub parallel_iterations: u32,
}

fn tracer_of(ctx: &dyn Context<Val>, what: &str) -> Result<super::TracerRef> {
    ctx.tracer().ok_or_else(|| {
        Error::new(
            ErrorKind::ControlFlow,
            what.to_string(),
            "no function is being traced",
        )
    })
}

/// The union of the branches' captures (first-seen order).
fn union(branches: &[&Branch]) -> Vec<Val> {
    let mut seen: HashMap<TensorId, usize> = HashMap::new();
    let mut all = Vec::new();
    for b in branches {
        for v in &b.captures {
            seen.entry(v.id()).or_insert_with(|| {
                all.push(v.clone());
                all.len() - 1
            });
        }
    }
    all
}

/// Re-signs each function so that it takes `leading` own parameters then every value of
/// `captures` (in order); loop bodies (`passthrough`) also return the captures unchanged.
/// Returns the new function names.
fn unify(
    tracer: &super::TracerRef,
    branches: &[&Branch],
    leading: usize,
    captures: &[Val],
    passthrough: bool,
) -> Result<Vec<String>> {
    let index: HashMap<TensorId, usize> = captures
        .iter()
        .enumerate()
        .map(|(i, v)| (v.id(), i))
        .collect();
    let mut t = lock(tracer);
    let mut names = Vec::new();
    for b in branches {
        let f = t.library().get(&b.name)?.clone();
        let own = f.params.len() - b.captures.len();
        if own != leading {
            return Err(Error::internal(
                "trace",
                format!("@{} has {own} own parameters, expected {leading}", b.name),
            ));
        }
        let aligned = b.captures.len() == captures.len()
            && b.captures
                .iter()
                .zip(captures)
                .all(|(a, c)| a.id() == c.id());
        if aligned && !passthrough {
            names.push(b.name.clone());
            continue;
        }
        let mut params: Vec<ValueType> = f.params[..own].to_vec();
        params.extend(captures.iter().map(Val::value_type));
        let mut mapping: Vec<usize> = (0..own).collect();
        mapping.extend(b.captures.iter().map(|v| own + index[&v.id()]));
        let pass: Vec<usize> = if passthrough {
            (own..own + captures.len()).collect()
        } else {
            Vec::new()
        };
        let g = with_params(&f, &b.name, params, &mapping, &pass)?;
        t.replace_function(g)?;
        names.push(b.name.clone());
    }
    Ok(names)
}

/// `If(pred, captures...)` over two traced branches (no own parameters); returns its outputs.
pub fn emit_if(
    ctx: &mut dyn Context<Val>,
    pred: &Val,
    then_branch: &Branch,
    else_branch: &Branch,
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "cond")?;
    let branches = [then_branch, else_branch];
    let mut captures = union(&branches);
    let names = unify(&tracer, &branches, 0, &captures, false)?;
    let own = lock(&tracer).library().get(&names[0])?.results.len();
    let threaded = thread_variables(ctx, &tracer, &names, 0, Construct::Branches, &mut captures)?;
    let kind = NodeKind::If(If {
        then_branch: names[0].clone(),
        else_branch: names[1].clone(),
    });
    let mut inputs = vec![pred.clone()];
    inputs.extend(captures);
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, own, Construct::Branches)
}

/// `Case(index, captures...)` over traced branches; an out-of-range index runs the last.
pub fn emit_case(ctx: &mut dyn Context<Val>, index: &Val, branches: &[Branch]) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "switch_case")?;
    let refs: Vec<&Branch> = branches.iter().collect();
    let mut captures = union(&refs);
    let names = unify(&tracer, &refs, 0, &captures, false)?;
    let own = match names.first() {
        Some(first) => lock(&tracer).library().get(first)?.results.len(),
        None => 0,
    };
    let threaded = thread_variables(ctx, &tracer, &names, 0, Construct::Branches, &mut captures)?;
    let mut inputs = vec![index.clone()];
    inputs.extend(captures);
    let kind = NodeKind::Case(Case { branches: names });
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, own, Construct::Branches)
}

/// `While(vars..., captures...)`; cond and body were traced with the loop variables as
/// parameters. Captures become extra loop variables the body passes through. Returns the
/// final loop variables (without the captures).
pub fn emit_while(
    ctx: &mut dyn Context<Val>,
    functions: &LoopFunctions,
    vars: &[Val],
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "while_loop")?;
    let mut captures = union(&[&functions.cond, &functions.body]);
    let cond = unify(&tracer, &[&functions.cond], vars.len(), &captures, false)?;
    let body = unify(&tracer, &[&functions.body], vars.len(), &captures, true)?;
    let names = [cond[0].clone(), body[0].clone()];
    let threaded = thread_variables(
        ctx,
        &tracer,
        &names,
        vars.len(),
        Construct::Loop,
        &mut captures,
    )?;
    let kind = NodeKind::While(While {
        cond: cond[0].clone(),
        body: body[0].clone(),
        maximum_iterations: functions.maximum_iterations,
        parallel_iterations: functions.parallel_iterations,
    });
    let mut inputs = vars.to_vec();
    inputs.extend(captures);
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, vars.len(), Construct::Loop)
}

/// The rules traced beside a custom function (`emit_custom_call`): its gradient function
/// (one cotangent per result as parameters), its tangent function (one tangent per parameter),
/// or why it has none.
#[derive(Debug, Default)]
pub struct CustomRules {
    pub gradient: Option<Branch>,
    pub tangent: Option<Branch>,
    pub refused: Option<String>,
}

/// Closes the innermost frame, a custom function traced on `params` that computed `results`,
/// and calls it through a `Call` node whose gradient and tangent are the `rules` (the user's
/// functions, traced above that frame).
///
/// What a rule captured of the frame's own values (not its parameters) becomes extra results
/// of the function: the residuals, as cond_v2 exposes intermediates. The gradient is then
/// re-signed to take `(operands, results, cotangents)` and the tangent `(operands, results,
/// operand tangents)` (`NodeKind::Call`), so a gradient it takes of an operand flows into that
/// operand when differentiated again, while residuals are constants, as the eager forward pass
/// of a custom gradient is not recorded. Returns the call's `results`.
pub fn emit_custom_call(
    ctx: &mut dyn Context<Val>,
    inputs: &[Val],
    params: &[Val],
    results: &[Val],
    rules: &CustomRules,
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "custom_gradient")?;
    let (call, operands) = {
        let mut t = lock(&tracer);
        let frame = t.top_frame();
        let mut residuals: Vec<Val> = Vec::new();
        for c in [&rules.gradient, &rules.tangent]
            .into_iter()
            .flatten()
            .flat_map(|b| &b.captures)
        {
            let own = matches!(c, Val::Symbol(s) if s.frame == frame);
            let param = params.iter().any(|p| p.id() == c.id());
            if own && !param && !residuals.iter().any(|r| r.id() == c.id()) {
                residuals.push(c.clone());
            }
        }
        let mut outs = results.to_vec();
        outs.extend(residuals.iter().cloned());
        let (function, captures) = t.pop_function(&outs)?;
        let f = t.library().get(&function)?.clone();
        let (n, n_out) = (f.params.len(), outs.len());
        let out_types = f.result_types()?;
        // Where a rule's capture is found among `(operands, results)`.
        let slot = |c: &Val| -> Result<usize> {
            let id = c.id();
            if let Some(k) = params.iter().position(|p| p.id() == id) {
                Ok(k)
            } else if let Some(q) = captures.iter().position(|v| v.id() == id) {
                Ok(params.len() + q)
            } else if let Some(r) = residuals.iter().position(|v| v.id() == id) {
                Ok(n + results.len() + r)
            } else {
                Err(Error::internal(
                    "custom_gradient",
                    "a value a custom rule captured is neither an operand nor a residual",
                ))
            }
        };
        // Each rule re-signed: `(operands, results, then its own leading parameters)`.
        let mut resign = |branch: &Branch, suffix: &str, leading: &[ValueType]| -> Result<String> {
            let g0 = t.library().get(&branch.name)?.clone();
            let own = g0.params.len() - branch.captures.len();
            let mut types = f.params.clone();
            types.extend(out_types.iter().cloned());
            types.extend(leading.iter().cloned());
            let mut mapping: Vec<usize> = (0..own).map(|i| n + n_out + i).collect();
            for c in &branch.captures {
                mapping.push(slot(c)?);
            }
            let name = t.fresh_name(&format!("{function}_{suffix}"));
            let g = with_params(&g0, &name, types, &mapping, &[])?;
            t.add_function(g)?;
            Ok(name)
        };
        let gradient = match &rules.gradient {
            Some(b) => Some(resign(b, "grad", &out_types)?),
            None => None,
        };
        let tangent = match &rules.tangent {
            Some(b) => Some(resign(b, "jvp", &f.params)?),
            None => None,
        };
        let call = Call {
            function,
            gradient,
            tangent,
            refused: rules.refused.clone(),
        };
        let mut operands = inputs.to_vec();
        operands.extend(captures);
        (call, operands)
    };
    let mut outputs = ctx.apply_node(&NodeKind::Call(call), &operands)?.into_vec();
    outputs.truncate(results.len());
    Ok(outputs)
}
