//! Batching (`vmap`): values that stand for one lane of a batch, and the context that turns ops
//! over them into ops over every lane at once.
//!
//! Inside `vmap(fn)`, `fn` sees `Lanes` values: one lane's type, with every lane's value held in
//! `physical` along axis 0. `BatchContext`, the outermost context of the chain, gives an op over
//! such values to the op's batching rule (`OpDef::batch`), which applies ops over the physical
//! values through the contexts below it: tapes record, accumulators take tangents and traces
//! add nodes of the batched program. A gradient taken inside `vmap` is therefore the gradient of
//! the batched program, which, with its lanes independent, is every lane's own gradient.
//!
//! Levels nest (`vmap(vmap(fn))`): each `vmap` call has a level, a `Lanes` value belongs to one
//! level, and its `physical` value may itself be a `Lanes` value of an outer level. The chain
//! holds one `BatchContext` per active level, innermost outermost; each unwraps its own values
//! and passes the rest on.
//!
//! ```text
//!   fn sees:   x: f32[3]            (one lane)
//!   physical:  f32[B, 3]            (lanes along axis 0)
//!   sin(x) ->  Sin's rule: sin over f32[B, 3]  ->  a Lanes value of f32[3]
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::graph::NodeKind;
use crate::ops::{Context, Op, Values};
use crate::shape::TensorType;
use crate::tensor::{next_id, TensorId};
use crate::trace::{TracerRef, Val};
use crate::value::Value;

/// Levels are unique for the life of the process, so that a value that outlives its `vmap`
/// is recognised as such.
static NEXT_LEVEL: AtomicU64 = AtomicU64::new(1);

/// A fresh batching level (one `vmap` call).
pub fn new_level() -> u64 {
    NEXT_LEVEL.fetch_add(1, Ordering::Relaxed)
}

/// One lane's view of a batched value.
#[derive(Debug)]
pub struct Lanes {
    id: TensorId,
    /// Every lane's value, lanes along axis 0.
    pub physical: Val,
    /// The `vmap` call this value belongs to.
    pub level: u64,
    /// One lane's type: `physical`'s without axis 0.
    ty: TensorType,
}

impl Lanes {
    /// The lane view of `physical`, whose axis 0 holds the lanes of `level`.
    pub fn wrap(physical: Val, level: u64) -> Result<Val> {
        let whole = physical.ty();
        if whole.shape.is_empty() {
            return Err(Error::internal(
                "vmap",
                format!("a batched value needs a lanes axis, got {whole}"),
            ));
        }
        let ty = TensorType::new(whole.dtype, &whole.shape[1..]);
        Ok(Val::Batched(Arc::new(Lanes {
            id: next_id(),
            physical,
            level,
            ty,
        })))
    }

    pub fn id(&self) -> TensorId {
        self.id
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }
}

/// The lanes of `v` at `level`, if `v` belongs to it.
pub fn lanes_at(v: &Val, level: u64) -> Option<&Lanes> {
    match v {
        Val::Batched(lanes) if lanes.level == level => Some(lanes),
        _ => None,
    }
}

/// Applies ops over values of one batching level through their batching rules; anything else
/// passes to `inner` unchanged.
pub struct BatchContext<'a> {
    pub inner: &'a mut dyn Context<Val>,
    pub level: u64,
}

impl BatchContext<'_> {
    /// The physical inputs and which of them hold lanes; None when none does.
    fn unwrap(&self, inputs: &[Val]) -> Option<(SmallVec<[Val; 4]>, SmallVec<[bool; 4]>)> {
        if !inputs.iter().any(|v| lanes_at(v, self.level).is_some()) {
            return None;
        }
        let mut physical = SmallVec::with_capacity(inputs.len());
        let mut batched = SmallVec::with_capacity(inputs.len());
        for v in inputs {
            match lanes_at(v, self.level) {
                Some(lanes) => {
                    physical.push(lanes.physical.clone());
                    batched.push(true);
                }
                None => {
                    physical.push(v.clone());
                    batched.push(false);
                }
            }
        }
        Some((physical, batched))
    }
}

impl Context<Val> for BatchContext<'_> {
    fn apply(&mut self, op: &Op, inputs: &[Val]) -> Result<Values<Val>> {
        let Some((physical, batched)) = self.unwrap(inputs) else {
            return self.inner.apply(op, inputs);
        };
        let outputs = op.batch(self.inner, &physical, &batched)?;
        outputs
            .into_iter()
            .map(|o| Lanes::wrap(o, self.level))
            .collect()
    }

    fn apply_node(&mut self, kind: &NodeKind, inputs: &[Val]) -> Result<Values<Val>> {
        if self.unwrap(inputs).is_none() {
            return self.inner.apply_node(kind, inputs);
        }
        Err(Error::invalid(
            kind.name(),
            "this node has no batching rule yet: it cannot take batched operands inside vmap",
        ))
    }

    fn tracer(&self) -> Option<TracerRef> {
        self.inner.tracer()
    }
}

/// Runs `f` with a `BatchContext` for each of `levels` (outermost first) over `ctx`: the last
/// level's context is the outermost of the chain.
pub fn with_levels<T>(
    levels: &[u64],
    ctx: &mut dyn Context<Val>,
    f: impl FnOnce(&mut dyn Context<Val>) -> Result<T>,
) -> Result<T> {
    match levels.split_first() {
        None => f(ctx),
        Some((&level, rest)) => {
            let mut batch = BatchContext { inner: ctx, level };
            with_levels(rest, &mut batch, f)
        }
    }
}

/// Levels a value is wrapped in, outermost wrapper first (the innermost `vmap` first).
pub type Levels = SmallVec<[u64; 2]>;

/// `v` with every lane view taken off: the physical value that tapes, accumulators and traces
/// see, and the levels it was wrapped in (for `dress`).
pub fn strip(v: &Val) -> (Val, Levels) {
    let mut levels = Levels::new();
    let mut v = v;
    while let Val::Batched(lanes) = v {
        levels.push(lanes.level);
        v = &lanes.physical;
    }
    (v.clone(), levels)
}

/// `physical` wrapped back in `levels` (as `strip` gave them).
pub fn dress(physical: Val, levels: &[u64]) -> Result<Val> {
    levels
        .iter()
        .rev()
        .try_fold(physical, |v, &level| Lanes::wrap(v, level))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::build;
    use crate::tensor::Tensor;
    use crate::trace::TraceContext;

    fn run<T>(levels: &[u64], f: impl FnOnce(&mut dyn Context<Val>) -> Result<T>) -> Result<T> {
        let mut base = TraceContext::new(None);
        with_levels(levels, &mut base, f)
    }

    fn values(v: &Val) -> Vec<f64> {
        v.as_tensor().expect("concrete").to_f64_vec()
    }

    #[test]
    fn an_op_over_lanes_runs_once_over_the_batch() {
        let level = new_level();
        let xs = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), level).unwrap();
        assert_eq!(x.ty().shape.as_slice(), &[3]);
        let y = Val::Tensor(Tensor::from_vec(vec![10.0f64, 20.0, 30.0], &[3]).unwrap());
        let out = run(&[level], |ctx| {
            let s = build::add(ctx, &x, &y)?;
            build::sum(ctx, &s, &[0], false)
        })
        .unwrap();
        let lanes = lanes_at(&out, level).expect("batched");
        assert_eq!(out.ty().shape.as_slice(), &[] as &[usize]);
        assert_eq!(values(&lanes.physical), vec![66.0, 75.0]);
    }

    #[test]
    fn nested_levels_unwrap_one_at_a_time() {
        let (outer, inner) = (new_level(), new_level());
        let xs = Tensor::from_vec((0..6).map(f64::from).collect::<Vec<_>>(), &[2, 3]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), outer).unwrap();
        let x = Lanes::wrap(x, inner).unwrap();
        assert_eq!(x.ty().shape.as_slice(), &[] as &[usize]);
        let (physical, levels) = strip(&x);
        assert_eq!(levels.as_slice(), &[inner, outer]);
        assert_eq!(physical.ty().shape.as_slice(), &[2, 3]);
        let doubled = run(&[outer, inner], |ctx| build::add(ctx, &x, &x)).unwrap();
        let (physical, levels) = strip(&doubled);
        assert_eq!(levels.as_slice(), &[inner, outer]);
        assert_eq!(values(&physical), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let again = dress(physical, &levels).unwrap();
        assert_eq!(again.ty().shape.as_slice(), &[] as &[usize]);
    }

    #[test]
    fn a_value_kept_past_its_vmap_is_an_error() {
        let level = new_level();
        let xs = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), level).unwrap();
        let err = run(&[], |ctx| build::neg(ctx, &x)).unwrap_err();
        assert!(
            err.to_string().contains("after that call returned"),
            "{err}"
        );
    }
}
