//! Forward mode: `ForwardAccumulator` and `ForwardContext`, the tape's counterparts.
//!
//! An accumulator maps values to their tangents. While it is active, every op applied through
//! a `ForwardContext` whose inputs have tangents gets its outputs' tangents at once, from the
//! op's own tangent rule (`OpDef::tangent`); a node that calls functions (`If`, `Case`,
//! `While`) is replaced by the node its construct's tangent rule builds, which computes the
//! primal outputs and their tangents together. Nothing is kept for later: a loop's tangents
//! live as long as its values do, which is why forward mode needs no stacks.
//!
//! Nesting: the tangent ops of accumulator `k` are applied through a context over the
//! accumulators before it (and all tapes), so outer accumulators differentiate them again
//! (forward over forward) and tapes record them (reverse over forward); ops a tape's gradient
//! runs under an active accumulator get tangents too (forward over reverse: Hessian-vector
//! products).
//!
//! Memory: an entry keeps its primal as well as its tangent; once the primal's last other
//! handle is gone (`Value::is_unique`) the entry is dropped at the next sweep, so eager loops
//! run in memory bounded by what the program itself holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::ops::{Context, Op, Tangents, Values};
use crate::shape::{ShapeDisplay, DYN};
pub use crate::tape::NodeTangentRule;
use crate::tape::{lock as tape_lock, GradientRegistry, TapeContext, TapeRef};
use crate::tensor::TensorId;
use crate::value::{NodeName, Value};

/// Entries below this many are never swept.
const SWEEP_FLOOR: usize = 1024;

/// Tangents of values, by identity.
pub struct ForwardAccumulator<V: Value> {
    /// identity -> (primal, tangent)
    entries: HashMap<TensorId, (V, V)>,
    /// The next sweep happens at this many entries (twice the survivors of the last one).
    sweep_at: usize,
}

/// Accumulators are shared between the thread that runs ops and the code that reads tangents.
pub type AccumulatorRef<V> = Arc<Mutex<ForwardAccumulator<V>>>;

pub fn lock<V: Value>(acc: &AccumulatorRef<V>) -> MutexGuard<'_, ForwardAccumulator<V>> {
    // A poisoned accumulator only means a panic elsewhere; its entries are still consistent.
    acc.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V: Value> Default for ForwardAccumulator<V> {
    fn default() -> Self {
        ForwardAccumulator {
            entries: HashMap::new(),
            sweep_at: SWEEP_FLOOR,
        }
    }
}

fn same_type<V: Value>(a: &V, b: &V) -> bool {
    let (a, b) = (a.ty(), b.ty());
    a.dtype == b.dtype
        && a.shape.len() == b.shape.len()
        && a.shape
            .iter()
            .zip(&b.shape)
            .all(|(x, y)| x == y || *x == DYN || *y == DYN)
}

impl<V: Value> ForwardAccumulator<V> {
    pub fn new_ref() -> AccumulatorRef<V> {
        Arc::new(Mutex::new(Self::default()))
    }

    /// Number of values holding a tangent (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Gives `primal` the tangent `tangent`: a float value of the primal's type.
    pub fn watch(&mut self, primal: &V, tangent: V) -> Result<()> {
        let (p, t) = (primal.ty(), tangent.ty());
        if !p.dtype.is_float() {
            return Err(Error::gradient(
                "jvp",
                format!(
                    "a {} value has no tangent: only float32 and float64 values have tangents",
                    p.dtype
                ),
            ));
        }
        if !same_type(primal, &tangent) {
            return Err(Error::shape(
                "jvp",
                format!("a tangent of type {t} does not match its primal of type {p}"),
            ));
        }
        self.set(primal, tangent);
        Ok(())
    }

    /// The tangent of `v`, if it has one.
    pub fn tangent(&self, v: &V) -> Option<V> {
        self.entries.get(&v.id()).map(|(_, t)| t.clone())
    }

    fn tangents_of(&self, inputs: &[V]) -> SmallVec<[Option<V>; 2]> {
        inputs.iter().map(|v| self.tangent(v)).collect()
    }

    fn set(&mut self, primal: &V, tangent: V) {
        if self.entries.len() >= self.sweep_at {
            // Entries whose primal nothing else holds can never be asked for again.
            self.entries.retain(|_, (p, _)| !p.is_unique());
            self.sweep_at = (2 * self.entries.len()).max(SWEEP_FLOOR);
        }
        self.entries.insert(primal.id(), (primal.clone(), tangent));
    }
}

/// A context that applies ops through `inner`, records them on `tapes` and gives their
/// outputs tangents on `accumulators` (innermost last).
///
/// Nesting follows push order across both stacks (`tapes_below[k]`: how many tapes were
/// pushed before accumulator `k`): accumulator `k`'s tangent ops are recorded by the tapes
/// before it and differentiated by the accumulators before it, and nothing later sees them.
/// A node that calls functions is replaced by its tangent node for the accumulators and tapes
/// before `k`; a later tape that records it still sees the node itself (so a gradient taken
/// inside `jvp` differentiates the loop, not the loop with its tangents).
pub struct ForwardContext<'a, V: Value> {
    pub inner: &'a mut dyn Context<V>,
    pub tapes: &'a [TapeRef<V>],
    pub accumulators: &'a [AccumulatorRef<V>],
    pub tapes_below: &'a [usize],
    pub registry: &'a GradientRegistry<V>,
}

impl<V: Value> ForwardContext<'_, V> {
    /// The context accumulator `k`'s tangent ops run through: the tapes and accumulators
    /// pushed before it.
    fn outer(&mut self, k: usize) -> ForwardContext<'_, V> {
        ForwardContext {
            inner: &mut *self.inner,
            tapes: &self.tapes[..self.tapes_below[k]],
            accumulators: &self.accumulators[..k],
            tapes_below: &self.tapes_below[..k],
            registry: self.registry,
        }
    }

    /// Every tape, and the accumulators before `k`.
    fn below(&mut self, k: usize) -> ForwardContext<'_, V> {
        ForwardContext {
            inner: &mut *self.inner,
            tapes: self.tapes,
            accumulators: &self.accumulators[..k],
            tapes_below: &self.tapes_below[..k],
            registry: self.registry,
        }
    }

    fn store(&self, k: usize, name: &str, outputs: &[V], tangents: Tangents<V>) -> Result<()> {
        if tangents.len() != outputs.len() {
            return Err(Error::internal(
                name.to_string(),
                format!(
                    "tangent rule gave {} tangents for {} outputs",
                    tangents.len(),
                    outputs.len()
                ),
            ));
        }
        let mut acc = lock(&self.accumulators[k]);
        for (o, t) in outputs.iter().zip(tangents) {
            let Some(t) = t else { continue };
            if !o.ty().dtype.is_float() {
                continue;
            }
            if !same_type(o, &t) {
                return Err(Error::internal(
                    name.to_string(),
                    format!(
                        "tangent of type {}{} for an output of type {}",
                        t.ty().dtype,
                        ShapeDisplay(&t.ty().shape),
                        o.ty()
                    ),
                ));
            }
            acc.set(o, t);
        }
        Ok(())
    }
}

impl<V: Value> Context<V> for ForwardContext<'_, V> {
    fn apply(&mut self, op: &Op, inputs: &[V]) -> Result<Values<V>> {
        let outputs = if self.tapes.is_empty() {
            self.inner.apply(op, inputs)?
        } else {
            record_op_through(self.inner, self.tapes, self.registry, op, inputs)?
        };
        for k in 0..self.accumulators.len() {
            let tangents = lock(&self.accumulators[k]).tangents_of(inputs);
            if tangents.iter().all(Option::is_none) {
                continue;
            }
            let out_tangents = op.tangent(&mut self.outer(k), inputs, &outputs, &tangents)?;
            self.store(k, op.name(), &outputs, out_tangents)?;
        }
        Ok(outputs)
    }

    fn apply_node(&mut self, kind: &V::Node, inputs: &[V]) -> Result<Values<V>> {
        // The innermost accumulator with a tangent here builds the node; the outer ones see
        // that node (over primals and these tangents) go through their own context.
        let innermost = (0..self.accumulators.len()).rev().find_map(|k| {
            let tangents = lock(&self.accumulators[k]).tangents_of(inputs);
            tangents
                .iter()
                .any(Option::is_some)
                .then_some((k, tangents))
        });
        let Some((k, tangents)) = innermost else {
            let mut taped = TapeContext {
                inner: &mut *self.inner,
                tapes: self.tapes,
                registry: self.registry,
            };
            return taped.apply_node(kind, inputs);
        };
        let Some(rule) = self.registry.node_tangent() else {
            return Err(Error::gradient(
                kind.name(),
                format!("{} has no forward-mode rule here", kind.name()),
            ));
        };
        let built = rule(&mut self.outer(k), kind, inputs, &tangents)?;
        let Some((outputs, out_tangents)) = built else {
            return self.below(k).apply_node(kind, inputs);
        };
        let later = &self.tapes[self.tapes_below[k]..];
        if !later.iter().any(|t| tape_lock(t).should_record(inputs)) {
            self.store(k, kind.name(), &outputs, out_tangents)?;
            return Ok(outputs);
        }
        // A tape pushed after the accumulator records the node itself; the tangent node's
        // values stand for the node's outputs' tangents.
        let outputs = self.below(k).apply_node(kind, inputs)?;
        self.store(k, kind.name(), &outputs, out_tangents)?;
        Ok(outputs)
    }

    fn tracer(&self) -> Option<V::Trace> {
        self.inner.tracer()
    }
}

/// `op` applied through `inner` and recorded on `tapes`.
fn record_op_through<V: Value>(
    inner: &mut dyn Context<V>,
    tapes: &[TapeRef<V>],
    registry: &GradientRegistry<V>,
    op: &Op,
    inputs: &[V],
) -> Result<Values<V>> {
    let mut taped = TapeContext {
        inner,
        tapes,
        registry,
    };
    taped.apply(op, inputs)
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
