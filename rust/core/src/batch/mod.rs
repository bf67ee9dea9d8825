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
use crate::ops::batching::instantiate;
use crate::ops::{Context, Op, Values};
use crate::shape::TensorType;
pub use crate::trace::lanes::{lanes_at, LaneSet, Lanes, Narrowing};
pub use nodes::{select_lanes, stand_ins, BatchNode, LanesFunction, NodeBatch, StandIns, Want};

pub use graph::lanes_graph;

mod graph;
mod nodes;
use crate::trace::{escaped_lanes, TracerRef, Val};
use crate::value::Value;

/// Levels are unique for the life of the process, so that a value that outlives its `vmap`
/// is recognised as such.
static NEXT_LEVEL: AtomicU64 = AtomicU64::new(1);

/// A fresh batching level (one `vmap` call).
pub fn new_level() -> u64 {
    NEXT_LEVEL.fetch_add(1, Ordering::Relaxed)
}

/// `lanes`' value over the lanes of `set`: its own, or narrowed down the sets between (through
/// `ctx`, so tapes record it).
pub fn over(ctx: &mut dyn Context<Val>, lanes: &Lanes, set: &Arc<LaneSet>) -> Result<Val> {
    if Arc::ptr_eq(&lanes.set, set) {
        return Ok(lanes.physical.clone());
    }
    // Not cached: a gather made while the tapes were paused (inside a custom rule's forward
    // pass) would cut the value off from the tapes wherever the copy was used again.
    let Some((parent, narrowing)) = set.narrowing() else {
        return Err(escaped_lanes("vmap"));
    };
    if let Some((ancestor, rows)) = set.shortcut() {
        if ancestor.descends_from(&lanes.set) {
            let above = over(ctx, lanes, ancestor)?;
            return crate::ops::build::take(ctx, &above, rows, 0);
        }
    }
    let above = over(ctx, lanes, parent)?;
    match narrowing {
        Narrowing::Rows(rows) => crate::ops::build::take(ctx, &above, rows, 0),
        Narrowing::StandIns { mask, first } => stand_in_copies(ctx, &above, mask, first),
    }
}

/// `v` (over lanes) with every lane outside `mask` replaced by lane `first` (`[1]`).
///
/// A select of one broadcast lane, not a gather of every lane: its gradient is a select too,
/// where a gather's is a scatter-add whose every idle lane adds into the same row (a serial
/// chain). The copy's gradient is stopped: the lanes that hold copies are discarded by the
/// select that keeps `mask`'s lanes, so it is zero to every order.
pub fn stand_in_copies(
    ctx: &mut dyn Context<Val>,
    v: &Val,
    mask: &Val,
    first: &Val,
) -> Result<Val> {
    let copy = crate::ops::build::take(ctx, v, first, 0)?;
    let copy = crate::ops::build::stop_gradient(ctx, &copy)?;
    select_lanes(ctx, mask, v, &copy)
}

/// Applies ops over values of one batching level through their batching rules, over the
/// level's current lanes (`set`); anything else passes to `inner` unchanged.
pub struct BatchContext<'a> {
    pub inner: &'a mut dyn Context<Val>,
    pub set: &'a Arc<LaneSet>,
}

impl BatchContext<'_> {
    /// The physical inputs over the current lanes and which of them hold lanes; None when none
    /// does.
    fn unwrap(&mut self, inputs: &[Val]) -> Result<Option<(Inputs, SmallVec<[bool; 4]>)>> {
        let level = self.set.level;
        if !inputs.iter().any(|v| lanes_at(v, level).is_some()) {
            return Ok(None);
        }
        let mut physical = SmallVec::with_capacity(inputs.len());
        let mut batched = SmallVec::with_capacity(inputs.len());
        for v in inputs {
            match lanes_at(v, level) {
                Some(lanes) => {
                    physical.push(over(self.inner, lanes, self.set)?);
                    batched.push(true);
                }
                None => {
                    physical.push(v.clone());
                    batched.push(false);
                }
            }
        }
        Ok(Some((physical, batched)))
    }
}

type Inputs = SmallVec<[Val; 4]>;

impl Context<Val> for BatchContext<'_> {
    fn apply(&mut self, op: &Op, inputs: &[Val]) -> Result<Values<Val>> {
        let Some((physical, batched)) = self.unwrap(inputs)? else {
            return self.inner.apply(op, inputs);
        };
        // One lane's types first: a mismatch is the error the unbatched function raises,
        // naming one lane's shapes, not the batch's.
        let lane_types: SmallVec<[TensorType; 4]> = inputs.iter().map(|v| v.ty().clone()).collect();
        op.infer(&lane_types)?;
        let outputs = op.batch(self.inner, &physical, &batched)?;
        outputs
            .into_iter()
            .map(|o| Lanes::wrap(o, self.set))
            .collect()
    }

    fn apply_node(&mut self, kind: &NodeKind, inputs: &[Val]) -> Result<Values<Val>> {
        let Some((physical, batched)) = self.unwrap(inputs)? else {
            return self.inner.apply_node(kind, inputs);
        };
        let Some(rule) = crate::graph::construct_as!(kind, BatchNode) else {
            return Err(Error::internal(kind.name(), "not a construct"));
        };
        let mut cx = NodeBatch {
            ctx: self.inner,
            set: self.set,
        };
        rule.batch(&mut cx, &physical, &batched)
    }

    fn tracer(&self) -> Option<TracerRef> {
        self.inner.tracer()
    }
}

/// Runs `f` with a `BatchContext` for each of `sets` (each level's current lanes, outermost
/// level first) over `ctx`: the last level's context is the outermost of the chain.
pub fn with_levels<T>(
    sets: &[Arc<LaneSet>],
    ctx: &mut dyn Context<Val>,
    f: impl FnOnce(&mut dyn Context<Val>) -> Result<T>,
) -> Result<T> {
    match sets.split_first() {
        None => f(ctx),
        Some((set, rest)) => {
            let mut batch = BatchContext { inner: ctx, set };
            with_levels(rest, &mut batch, f)
        }
    }
}

/// The lane sets a value is wrapped in, outermost wrapper first (the innermost `vmap` first).
pub type Levels = SmallVec<[Arc<LaneSet>; 2]>;

/// `v` with every lane view taken off: the physical value that tapes, accumulators and traces
/// see, and the lane sets it was wrapped in (for `dress`).
pub fn strip(v: &Val) -> (Val, Levels) {
    let mut levels = Levels::new();
    let mut v = v;
    while let Val::Batched(lanes) = v {
        levels.push(lanes.set.clone());
        v = &lanes.physical;
    }
    (v.clone(), levels)
}

/// `v` with the lane views of the levels `of` taken off, from the outermost wrapper in, as
/// far as they go: lanes of other levels under them stay (a gradient function run inside a
/// later `vmap`, `jacrev`'s, keeps that call's lanes).
pub fn strip_levels(v: &Val, of: &[u64]) -> (Val, Levels) {
    let mut levels = Levels::new();
    let mut v = v;
    while let Val::Batched(lanes) = v {
        if !of.contains(&lanes.set.level) {
            break;
        }
        levels.push(lanes.set.clone());
        v = &lanes.physical;
    }
    (v.clone(), levels)
}

/// Whether two values are wrapped in the same lane sets (as `strip` gives them).
pub fn same_lanes(a: &[Arc<LaneSet>], b: &[Arc<LaneSet>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

/// `physical` wrapped back in `levels` (as `strip` gave them).
pub fn dress(physical: Val, levels: &[Arc<LaneSet>]) -> Result<Val> {
    levels.iter().rev().try_fold(physical, Lanes::wrap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::build;
    use crate::tensor::Tensor;
    use crate::trace::TraceContext;
    use crate::value::Value;

    fn run<T>(
        sets: &[Arc<LaneSet>],
        f: impl FnOnce(&mut dyn Context<Val>) -> Result<T>,
    ) -> Result<T> {
        let mut base = TraceContext::new(None);
        with_levels(sets, &mut base, f)
    }

    fn values(v: &Val) -> Vec<f64> {
        v.as_tensor().expect("concrete").to_f64_vec()
    }

    #[test]
    fn an_op_over_lanes_runs_once_over_the_batch() {
        let level = LaneSet::root(new_level(), 4);
        let xs = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), &level).unwrap();
        assert_eq!(x.ty().shape.as_slice(), &[3]);
        let y = Val::Tensor(Tensor::from_vec(vec![10.0f64, 20.0, 30.0], &[3]).unwrap());
        let out = run(std::slice::from_ref(&level), |ctx| {
            let s = build::add(ctx, &x, &y)?;
            build::sum(ctx, &s, &[0], false)
        })
        .unwrap();
        let lanes = lanes_at(&out, level.level).expect("batched");
        assert_eq!(out.ty().shape.as_slice(), &[] as &[usize]);
        assert_eq!(values(&lanes.physical), vec![66.0, 75.0]);
    }

    #[test]
    fn nested_levels_unwrap_one_at_a_time() {
        let (outer, inner) = (LaneSet::root(new_level(), 4), LaneSet::root(new_level(), 4));
        let xs = Tensor::from_vec((0..6).map(f64::from).collect::<Vec<_>>(), &[2, 3]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), &outer).unwrap();
        let x = Lanes::wrap(x, &inner).unwrap();
        assert_eq!(x.ty().shape.as_slice(), &[] as &[usize]);
        let (physical, levels) = strip(&x);
        assert!(same_lanes(&levels, &[inner.clone(), outer.clone()]));
        assert_eq!(physical.ty().shape.as_slice(), &[2, 3]);
        let sets = [outer.clone(), inner.clone()];
        let doubled = run(&sets, |ctx| build::add(ctx, &x, &x)).unwrap();
        let (physical, levels) = strip(&doubled);
        assert!(same_lanes(&levels, &[inner, outer]));
        assert_eq!(values(&physical), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let again = dress(physical, &levels).unwrap();
        assert_eq!(again.ty().shape.as_slice(), &[] as &[usize]);
    }

    #[test]
    fn a_value_kept_past_its_vmap_is_an_error() {
        let level = LaneSet::root(new_level(), 4);
        let xs = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), &level).unwrap();
        let err = run(&[], |ctx| build::neg(ctx, &x)).unwrap_err();
        assert!(err.to_string().contains("outside the vmap call"), "{err}");
    }

    #[test]
    fn a_value_over_all_lanes_is_gathered_to_a_subset() {
        let root = LaneSet::root(new_level(), 4);
        let xs = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[4]).unwrap();
        let x = Lanes::wrap(Val::Tensor(xs), &root).unwrap();
        let rows = Val::Tensor(Tensor::from_vec(vec![3i64, 1], &[2]).unwrap());
        let some = LaneSet::child(&root, Narrowing::Rows(rows));
        assert_eq!(some.count, 2);
        let y = run(std::slice::from_ref(&some), |ctx| build::neg(ctx, &x)).unwrap();
        let lanes = lanes_at(&y, root.level).unwrap();
        assert!(Arc::ptr_eq(&lanes.set, &some));
        assert_eq!(values(&lanes.physical), vec![-4.0, -2.0]);
        // A value of the subset used over all lanes has left its set.
        let err = run(&[root], |ctx| build::neg(ctx, &y)).unwrap_err();
        assert!(err.to_string().contains("outside the vmap call"), "{err}");
    }
}
