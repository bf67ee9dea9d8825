//! Derivatives of a graph's entry function as a new entry (`jvp_graph`: forward mode, below).
//!
//! The gradient: `gradient_graph(graph, wrt, name)`
//! traces `name(params.., cotangents..) -> (d/d params[i] for i in wrt)` by replaying the entry
//! under a tape (so `If`/`Case`/`While` get their control-flow gradients) and running the
//! tape backwards. It works on any graph, traced or imported from MLIR.
//!
//! Cotangent parameters follow the entry's parameters when the entry has several results or a
//! non-scalar one (one per result, typed like it); a single scalar result is seeded with 1.
//! Integer results get no gradient (their cotangents are ignored); an argument nothing
//! depends on gets zeros.

use super::{lock, registry, replay, TraceContext, Tracer, TracerRef, Val};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::build;
use crate::passes::bind_params;
use crate::tape::{compute_gradient, Tape, TapeContext, TapeRef};
use crate::trace::Captured;
use crate::value::Value;

/// Whether the gradient of `graph`'s entry takes one cotangent per result.
pub fn takes_cotangents(graph: &Graph) -> Result<bool> {
    let results = graph.entry_function()?.result_types()?;
    Ok(results.len() != 1 || !results[0].inner().is_scalar())
}

/// The graph whose entry `name` computes the gradients of `graph`'s entry with respect to its
/// parameters `wrt` (in that order; see the module doc for the signature).
///
/// ```
/// use gradloop::interpret::{run_graph, RtValue};
/// use gradloop::Tensor;
///
/// // sum(x * x): its gradient is 2x
/// let graph = gradloop::graph::parse_graph(r#"graph @f
/// func @f(%0: f64[2]) -> (f64[]) {
///   %1 = mul(%0, %0) : f64[2]
///   %2 = sum(%1) {axes=[0], keepdims=false} : f64[]
///   return %2
/// }"#)?;
/// let grad = gradloop::trace::gradient_graph(&graph, &[0], "f_grad")?;
/// let x = Tensor::from_vec(vec![1.5, -2.0], &[2])?;
/// let dx = run_graph(&grad, vec![RtValue::from(x)])?.remove(0).into_tensor()?;
/// assert_eq!(dx.to_f64_vec(), vec![3.0, -4.0]);
/// # Ok::<(), gradloop::Error>(())
/// ```
pub fn gradient_graph(graph: &Graph, wrt: &[usize], name: &str) -> Result<Graph> {
    differentiate(graph, wrt, name, takes_cotangents(graph)?, None)
}

/// `gradient_graph` with its loops' gradients in fixed-size state (`fixed_state` snapshots
/// where nothing bounds a loop: `Tracer::fixed_state_loops`), as pure StableHLO needs.
pub fn gradient_graph_with(
    graph: &Graph,
    wrt: &[usize],
    name: &str,
    fixed_state: Option<u32>,
) -> Result<Graph> {
    differentiate(graph, wrt, name, takes_cotangents(graph)?, fixed_state)
}

/// `gradient_graph` taking one cotangent per result always, a single scalar result's too:
/// `name(params.., cotangents..)`, the vector-Jacobian product that a staged eager op's
/// gradient calls (cotangents of integer results are ignored).
pub fn vjp_graph(graph: &Graph, wrt: &[usize], name: &str) -> Result<Graph> {
    differentiate(graph, wrt, name, true, None)
}

fn differentiate(
    graph: &Graph,
    wrt: &[usize],
    name: &str,
    cotangents: bool,
    fixed_state: Option<u32>,
) -> Result<Graph> {
    let f = graph.entry_function()?;
    for &i in wrt {
        let ty = f.params.get(i).ok_or_else(|| {
            Error::index(
                "grad",
                format!(
                    "wrt index {i} is out of range: @{} has {} arguments",
                    f.name,
                    f.params.len()
                ),
            )
        })?;
        if !ty.inner().dtype.is_float() {
            return Err(Error::gradient(
                "grad",
                format!("argument {i} of @{} is {ty}: only float32 and float64 arguments have gradients", f.name),
            ));
        }
    }
    let n = f.params.len();
    let mut params = f.params.clone();
    if cotangents {
        params.extend(f.result_types()?);
    }
    let (tracer, xs) = Tracer::with_library(graph.library.clone(), name, params);
    lock(&tracer).fixed_state_loops = fixed_state;
    let registry = registry();
    let mut base = TraceContext::new(Some(tracer.clone()));
    let tape: TapeRef<Val> = Tape::new_ref(false);
    let mut sources: Vec<usize> = wrt.to_vec();
    sources.sort_unstable();
    sources.dedup();
    {
        let mut t = tape.lock().unwrap_or_else(|e| e.into_inner());
        for &i in &sources {
            t.watch(&xs[i])?;
        }
    }
    let tapes = [tape.clone()];
    let mut taped = TapeContext {
        inner: &mut base,
        tapes: &tapes,
        registry,
    };
    let ys = replay(&mut taped, f, &xs[..n])?;
    let (mut targets, mut seeds) = (Vec::new(), Vec::new());
    for (k, y) in ys.into_iter().enumerate() {
        if y.ty().dtype.is_float() {
            targets.push(y);
            seeds.push(cotangents.then(|| xs[n + k].clone()));
        }
    }
    let source_vals: Vec<Val> = sources.iter().map(|&i| xs[i].clone()).collect();
    let grads = if targets.is_empty() {
        vec![None; sources.len()]
    } else {
        let seeds = cotangents.then_some(seeds.as_slice());
        compute_gradient(&tape, &mut base, &targets, &source_vals, seeds)?
    };
    let mut outs = Vec::with_capacity(wrt.len());
    for &i in wrt {
        let k = sources.iter().position(|&s| s == i).unwrap_or_default();
        outs.push(match &grads[k] {
            Some(g) => g.clone(),
            None => build::zeros_like(&mut base, &xs[i])?,
        });
    }
    finish_entry(&tracer, &outs, "grad")
}

/// The graph whose entry `name` computes `graph`'s entry and its tangents along its parameters
/// `wrt`: `name(params.., one tangent per wrt parameter..) -> (results.., one tangent per float
/// result..)` (zeros for a result no tangent reaches). It replays the entry under a forward
/// accumulator, so `If`/`Case`/`While` get their control-flow tangents; no stacks.
///
/// ```
/// use gradloop::interpret::{run_graph, RtValue};
/// use gradloop::Tensor;
///
/// // sum(x * x) along t: 2 <x, t>
/// let graph = gradloop::graph::parse_graph(r#"graph @f
/// func @f(%0: f64[2]) -> (f64[]) {
///   %1 = mul(%0, %0) : f64[2]
///   %2 = sum(%1) {axes=[0], keepdims=false} : f64[]
///   return %2
/// }"#)?;
/// let jvp = gradloop::trace::jvp_graph(&graph, &[0], "f_jvp")?;
/// let x = Tensor::from_vec(vec![1.5, -2.0], &[2])?;
/// let t = Tensor::from_vec(vec![1.0, 0.5], &[2])?;
/// let out = run_graph(&jvp, vec![RtValue::from(x), RtValue::from(t)])?;
/// let dy = out[1].clone().into_tensor()?;
/// assert_eq!(dy.to_f64_vec(), vec![1.0]);
/// # Ok::<(), gradloop::Error>(())
/// ```
pub fn jvp_graph(graph: &Graph, wrt: &[usize], name: &str) -> Result<Graph> {
    let f = graph.entry_function()?;
    for (k, &i) in wrt.iter().enumerate() {
        let ty = f.params.get(i).ok_or_else(|| {
            Error::index(
                "jvp",
                format!(
                    "wrt index {i} is out of range: @{} has {} arguments",
                    f.name,
                    f.params.len()
                ),
            )
        })?;
        if !ty.inner().dtype.is_float() {
            return Err(Error::gradient(
                "jvp",
                format!(
                    "argument {i} of @{} is {ty}: only float32 and float64 arguments have tangents",
                    f.name
                ),
            ));
        }
        if wrt[..k].contains(&i) {
            return Err(Error::invalid(
                "jvp",
                format!("wrt names argument {i} twice"),
            ));
        }
    }
    let n = f.params.len();
    let mut params = f.params.clone();
    params.extend(wrt.iter().map(|&i| f.params[i].clone()));
    let (tracer, xs) = Tracer::with_library(graph.library.clone(), name, params);
    let given = wrt.iter().enumerate().map(|(k, &i)| (i, xs[n + k].clone()));
    let (ys, tangents) = super::tangents::replay_forward(&tracer, f, &xs[..n], given)?;
    let mut base = TraceContext::new(Some(tracer.clone()));
    let mut outs = ys.clone();
    for (y, t) in ys.iter().zip(tangents) {
        if y.ty().dtype.is_float() {
            outs.push(match t {
                Some(t) => t,
                None => build::zeros_like(&mut base, y)?,
            });
        }
    }
    finish_entry(&tracer, &outs, "jvp")
}

/// Finishes a derived entry: tensors a rule made eagerly and captured become constants.
pub fn finish_entry(tracer: &TracerRef, outs: &[Val], what: &'static str) -> Result<Graph> {
    let traced = lock(tracer).finish(outs)?;
    if traced.captured_inputs.is_empty() {
        return Ok(traced.graph);
    }
    let mut values = vec![None; traced.num_params];
    for c in traced.captured_inputs {
        match c {
            Captured::Tensor(t) => values.push(Some(t)),
            Captured::Variable(_) => {
                return Err(Error::internal(
                    what,
                    "a derived function captured a variable",
                ))
            }
        }
    }
    bind_params(&traced.graph, &values)
}
