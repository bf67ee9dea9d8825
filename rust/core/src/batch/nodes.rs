//! Batching rules of the constructs: `BatchNode`, implemented by each construct in its home
//! under `control/` (the construct table asks every construct for one), and what the rules
//! share: a library function over lanes (`NodeBatch::function`) and stand-in lanes for
//! branches some lanes do not take (`NodeBatch::stand_ins`).
//!
//! A construct meets lanes when a traced function is replayed or called inside `vmap` (a
//! custom rule's call, `recompute_grad`, a callee holding control flow). Its rule makes the
//! functions it calls into functions over lanes and applies the construct to those.

use std::sync::Arc;

use super::{
    instantiate, lanes_at, over, stand_in_copies, BatchContext, LaneSet, Lanes, Narrowing,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Function, ValueType};
use crate::ops::{build, Context, Values};
use crate::shape::{TensorType, DYN};
use crate::trace::gradients::function;
use crate::trace::{lock, replay, TraceContext, TracerRef, Val};
use crate::value::Value;

/// What `NodeBatch::build_function` traces: the results of the function's parameters.
pub type FunctionBody<'a> = dyn FnMut(&mut dyn Context<Val>, &[Val]) -> Result<Vec<Val>> + 'a;

/// A construct's batching rule.
pub trait BatchNode {
    /// The node over the lanes of `cx.set`: `inputs[k]` holds every lane's value along axis 0
    /// where `batched[k]`, else one value for all lanes. Returns the outputs, lane views where
    /// they differ per lane (`NodeBatch::wrap`).
    fn batch(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>>;
}

/// What a function over lanes makes of one of its results.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    /// Over lanes if it differs per lane, else one value.
    AsItComes,
    /// Over lanes (repeated when it is the same in all).
    Lanes,
    /// One value: the sum over lanes where it differs per lane (the gradient of a value every
    /// lane used).
    Summed,
}

/// A library function over lanes and which of its results are.
pub struct LanesFunction {
    pub name: String,
    pub batched: Vec<bool>,
}

/// A construct's view of one batching level: the contexts below it and the current lanes.
pub struct NodeBatch<'a> {
    pub ctx: &'a mut dyn Context<Val>,
    pub set: &'a Arc<LaneSet>,
}

impl NodeBatch<'_> {
    /// `physical` as a lane view when `batched`, else as it is.
    pub fn wrap(&self, physical: Val, batched: bool) -> Result<Val> {
        if batched {
            Lanes::wrap(physical, self.set)
        } else {
            Ok(physical)
        }
    }

    /// The node's outputs wrapped per `batched`.
    pub fn wrap_all(&self, outputs: Values<Val>, batched: &[bool]) -> Result<Values<Val>> {
        outputs
            .into_iter()
            .zip(batched)
            .map(|(v, &b)| self.wrap(v, b))
            .collect()
    }

    /// How many lanes.
    pub fn count(&self) -> usize {
        self.set.count
    }

    fn tracer(&self, what: &'static str) -> Result<TracerRef> {
        self.ctx
            .tracer()
            .ok_or_else(|| Error::internal(what, "a node over lanes outside a traced function"))
    }

    /// Library function `name` over the lanes: its parameters over lanes where `batched` says,
    /// result `k` as `want(k)` says. Added to the tracer's library.
    pub fn function(
        &mut self,
        name: &str,
        batched: &[bool],
        want: &dyn Fn(usize) -> Want,
    ) -> Result<LanesFunction> {
        let tracer = self.tracer("vmap")?;
        let f = function(&tracer, name)?;
        let types = f
            .params
            .iter()
            .zip(batched)
            .map(|(t, &b)| {
                if b {
                    lanes_type(t, self.set.count)
                } else {
                    Ok(t.clone())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let params = lock(&tracer).push_function(&format!("{}_lanes", f.name), types);
        let built = self.replay_over_lanes(&tracer, &f, &params, batched, want);
        let (outs, flags) = match built {
            Ok(b) => b,
            Err(e) => {
                lock(&tracer).abandon_function();
                return Err(e);
            }
        };
        let (name, captures) = lock(&tracer).pop_function(&outs)?;
        if !captures.is_empty() {
            return Err(Error::internal(
                "vmap",
                format!("@{name} captured {} outer values", captures.len()),
            ));
        }
        Ok(LanesFunction {
            name,
            batched: flags,
        })
    }

    fn replay_over_lanes(
        &mut self,
        tracer: &TracerRef,
        f: &Function,
        params: &[Val],
        batched: &[bool],
        want: &dyn Fn(usize) -> Want,
    ) -> Result<(Vec<Val>, Vec<bool>)> {
        replay_over_lanes(tracer, f, params, batched, self.set, want)
    }

    /// A function with the parameters of library function `name` whose results are zeros of
    /// its results' types (what a branch no lane takes gives).
    pub fn zeros_like_results(&mut self, name: &str) -> Result<String> {
        let tracer = self.tracer("vmap")?;
        let f = function(&tracer, name)?;
        let results = f.result_types()?;
        self.build_function(
            &format!("{}_idle", f.name),
            f.params.clone(),
            &mut |ctx, _| {
                results
                    .iter()
                    .map(|t| match t {
                        ValueType::Tensor(t) => build::fill(ctx, t.dtype, &t.shape, 0.0),
                        other => Err(Error::invalid(
                            "vmap",
                            format!("a {other} result over lanes"),
                        )),
                    })
                    .collect()
            },
        )
    }

    /// A new library function of parameters typed `params` whose results `body` computes
    /// (through a context of the new function's own, outside every batching level).
    pub fn build_function(
        &mut self,
        hint: &str,
        params: Vec<ValueType>,
        body: &mut FunctionBody<'_>,
    ) -> Result<String> {
        let tracer = self.tracer("vmap")?;
        let symbols = lock(&tracer).push_function(hint, params);
        let mut base = TraceContext::new(Some(tracer.clone()));
        let results = match body(&mut base, &symbols) {
            Ok(r) => r,
            Err(e) => {
                lock(&tracer).abandon_function();
                return Err(e);
            }
        };
        let (name, captures) = lock(&tracer).pop_function(&results)?;
        if !captures.is_empty() {
            return Err(Error::internal(
                "vmap",
                format!("@{name} captured {} outer values", captures.len()),
            ));
        }
        Ok(name)
    }

    /// Library function `name` applied to `args` through `ctx` (inlined).
    pub fn inline(ctx: &mut dyn Context<Val>, name: &str, args: &[Val]) -> Result<Vec<Val>> {
        let tracer = ctx.tracer().ok_or_else(|| {
            Error::internal("vmap", "a node over lanes outside a traced function")
        })?;
        let f = function(&tracer, name)?;
        replay(ctx, &f, args)
    }

    /// `v` over the lanes (repeated when it is the same in all).
    pub fn lanes(&mut self, v: &Val, batched: bool) -> Result<Val> {
        if batched {
            Ok(v.clone())
        } else {
            instantiate(self.ctx, v, self.set.count)
        }
    }

    /// The stand-ins of the lanes `mask` excludes (`StandIns`), and whether any lane is in
    /// `mask`.
    pub fn stand_ins(&mut self, mask: &Val, what: &'static str) -> Result<(StandIns, Val)> {
        stand_ins(self.ctx, mask, self.set.count, what)
    }
}

/// `f` replayed into the tracer's current function on `params` over the lanes of `set` (those
/// `batched` marks hold every lane's value along axis 0): each result as `want` says, and
/// whether it is over lanes.
pub(super) fn replay_over_lanes(
    tracer: &TracerRef,
    f: &Function,
    params: &[Val],
    batched: &[bool],
    set: &Arc<LaneSet>,
    want: &dyn Fn(usize) -> Want,
) -> Result<(Vec<Val>, Vec<bool>)> {
    let mut base = TraceContext::new(Some(tracer.clone()));
    let args = params
        .iter()
        .zip(batched)
        .map(|(p, &b)| {
            if b {
                Lanes::wrap(p.clone(), set)
            } else {
                Ok(p.clone())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let results = {
        let mut lanes = BatchContext {
            inner: &mut base,
            set,
        };
        replay(&mut lanes, f, &args)?
    };
    let mut outs = Vec::with_capacity(results.len());
    let mut flags = Vec::with_capacity(results.len());
    for (k, r) in results.iter().enumerate() {
        let (v, b) = match (lanes_at(r, set.level), want(k)) {
            (Some(l), Want::Summed) => {
                let all = over(&mut base, l, set)?;
                (build::sum(&mut base, &all, &[0], false)?, false)
            }
            (Some(l), _) => (over(&mut base, l, set)?, true),
            (None, Want::Lanes) => (instantiate(&mut base, r, set.count)?, true),
            (None, _) => (r.clone(), false),
        };
        outs.push(v);
        flags.push(b);
    }
    Ok((outs, flags))
}

/// The lanes a branch or a trip runs on: each lane `mask` (bool over lanes) holds is itself,
/// each other lane computes on a copy of the first lane that does (the last lane when none
/// does), so that nothing it would compute (NaN, inf, an error) reaches a result
/// (`stand_in_copies`).
pub struct StandIns {
    mask: Val,
    first: Val,
}

impl StandIns {
    /// `v` (over lanes) with every lane outside the mask replaced by the first inside it.
    pub fn of(&self, ctx: &mut dyn Context<Val>, v: &Val) -> Result<Val> {
        stand_in_copies(ctx, v, &self.mask, &self.first)
    }
}

impl From<StandIns> for Narrowing {
    fn from(s: StandIns) -> Self {
        Narrowing::StandIns {
            mask: s.mask,
            first: s.first,
        }
    }
}

/// `StandIns` for `mask` over `n` lanes, and whether any lane is in `mask` (a bool scalar).
pub fn stand_ins(
    ctx: &mut dyn Context<Val>,
    mask: &Val,
    n: usize,
    what: &'static str,
) -> Result<(StandIns, Val)> {
    if n == DYN || n == 0 {
        return Err(Error::invalid(
            what,
            "a branch or loop whose predicate differs per lane needs a number of lanes known as \
             the function is traced",
        ));
    }
    let lane = build::arange(ctx, 0.0, n as f64, 1.0, DType::I64)?;
    let past = build::fill(ctx, DType::I64, &[n], n as f64)?;
    let candidates = build::select(ctx, mask, &lane, &past)?;
    let first = build::reduce_min(ctx, &candidates, &[0], true)?;
    let count = build::scalar(ctx, DType::I64, n as f64)?;
    let any = build::less(ctx, &first, &count)?;
    let any = build::reshape(ctx, &any, &[])?;
    let last = build::scalar(ctx, DType::I64, (n - 1) as f64)?;
    let first = build::minimum(ctx, &first, &last)?;
    let stand_ins = StandIns {
        mask: mask.clone(),
        first,
    };
    Ok((stand_ins, any))
}

/// `a` on the lanes `mask` (bool over lanes) holds, else `b` (both over lanes).
pub fn select_lanes(ctx: &mut dyn Context<Val>, mask: &Val, a: &Val, b: &Val) -> Result<Val> {
    let mut shape = vec![1usize; a.ty().shape.len()];
    shape[0] = mask.ty().shape[0];
    let m = build::reshape(ctx, mask, &shape)?;
    build::select(ctx, &m, a, b)
}

/// `t` with the lanes' axis in front.
pub(super) fn lanes_type(t: &ValueType, count: usize) -> Result<ValueType> {
    match t {
        ValueType::Tensor(t) => {
            let mut shape = vec![count];
            shape.extend_from_slice(&t.shape);
            Ok(ValueType::Tensor(TensorType::new(t.dtype, &shape)))
        }
        other => Err(Error::invalid(
            "vmap",
            format!("a {other} cannot differ per lane"),
        )),
    }
}
