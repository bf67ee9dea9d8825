//! What tracing a construct from traced functions shares: the captures of its functions are
//! unified into one signature (the cond_v2 design). Each construct's own tracing (`emit_if`,
//! `emit_case`, `emit_while`, `emit_custom_call`) lives in its `control` module, which applies
//! the node through the context, so tapes record it and its gradient is the control-flow
//! gradient.

use std::collections::HashMap;

use super::tracer::lock;
use super::Val;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::with_params;
use crate::graph::ValueType;
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
    pub checkpoints: Option<u32>,
}

pub(crate) fn tracer_of(ctx: &dyn Context<Val>, what: &str) -> Result<super::TracerRef> {
    ctx.tracer().ok_or_else(|| {
        Error::new(
            ErrorKind::ControlFlow,
            what.to_string(),
            "no function is being traced",
        )
    })
}

/// The union of the branches' captures (first-seen order).
pub(crate) fn union(branches: &[&Branch]) -> Vec<Val> {
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
pub(crate) fn unify(
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

/// The rules traced beside a custom function (`emit_custom_call`): its gradient function
/// (one cotangent per result as parameters), its tangent function (one tangent per parameter),
/// or why it has none.
#[derive(Debug, Default)]
pub struct CustomRules {
    pub gradient: Option<Branch>,
    pub tangent: Option<Branch>,
    pub refused: Option<String>,
    /// A composite's kernel (`graph::Call::kernel`).
    pub kernel: Option<crate::ops::Op>,
}
