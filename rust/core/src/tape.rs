//! The gradient tape (after the C++ gradient tape RFC): `GradientFunction`, `GradientRegistry`,
//! `ForwardOperation`, `Tape` and `TapeContext`.
//!
//! A tape records, for each op whose inputs it watches, the op's gradient function — which keeps
//! only the forward values its rule needs. `compute_gradient` walks the records backwards and
//! runs the gradient functions through a context: when that context is itself a `TapeContext`
//! over outer tapes, the backward pass is recorded too, giving higher-order derivatives.
//!
//! Lock order: a tape's mutex is held only to record or to take a snapshot of its records, never
//! while a gradient function runs (gradient functions may call back into user code that records
//! onto the same tapes).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::error::{Error, ErrorKind, Result};
use crate::ops::Context;
use crate::ops::{build, Grads, Op, OpKind, Saved, Saves, Values};
use crate::shape::{ShapeDisplay, DYN};
use crate::tensor::TensorId;
use crate::value::{NodeName, Value};

/// Input gradients from output gradients, computed through a context.
pub trait GradientFunction<V: Value>: Send + Sync {
    /// `grad_outputs[i]` is `None` when output `i` got no gradient; `needs[i]` is false for
    /// inputs whose gradient nobody asked for (the RFC's `skip_input_indices`).
    fn compute(
        &self,
        ctx: &mut dyn Context<V>,
        grad_outputs: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>>;
}

/// A forward op as a gradient factory sees it.
pub struct ForwardOperation<'a, V> {
    pub op: &'a Op,
    pub inputs: &'a [V],
    pub outputs: &'a [V],
    /// Inputs no tape watches: their gradients need not be computed.
    pub skip_input_indices: &'a [usize],
}

/// Builds the gradient function of one forward op; `Ok(None)` means "not differentiable".
pub type GradientFactory<V> =
    fn(&ForwardOperation<'_, V>) -> Result<Option<Arc<dyn GradientFunction<V>>>>;

/// Builds the gradient function of a graph node that is not an op (control flow, stacks):
/// `(kind, inputs, outputs)`; `Ok(None)` means "not differentiable".
pub type NodeGradientFactory<V> =
    fn(&<V as Value>::Node, &[V], &[V]) -> Result<Option<Arc<dyn GradientFunction<V>>>>;

/// Builds the forward-mode counterpart of a graph node that is not an op (control flow): through
/// the context, the node computing `kind`'s outputs and their tangents from `inputs` and their
/// tangents (see `forward`). `Ok(None)`: the node takes no tangents and runs as it is.
pub type NodeTangentRule<V> = fn(
    &mut dyn Context<V>,
    &<V as Value>::Node,
    &[V],
    &[Option<V>],
) -> Result<Option<(Values<V>, crate::ops::Tangents<V>)>>;

/// Op kind -> gradient factory. `with_op_table()` registers every op's own rule.
pub struct GradientRegistry<V: Value> {
    factories: HashMap<OpKind, Option<GradientFactory<V>>>,
    nodes: Option<NodeGradientFactory<V>>,
    node_tangents: Option<NodeTangentRule<V>>,
}

impl<V: Value> GradientRegistry<V> {
    /// An empty registry (every op not differentiable until registered).
    pub fn new() -> Self {
        GradientRegistry {
            factories: HashMap::new(),
            nodes: None,
            node_tangents: None,
        }
    }

    /// Every op of the table with the gradient rule written beside its kernel.
    pub fn with_op_table() -> Self {
        let mut r = Self::new();
        for &kind in OpKind::ALL {
            r.register(kind, op_table_gradient::<V>);
        }
        r
    }

    pub fn register(&mut self, kind: OpKind, factory: GradientFactory<V>) {
        self.factories.insert(kind, Some(factory));
    }

    pub fn register_not_differentiable(&mut self, kind: OpKind) {
        self.factories.insert(kind, None);
    }

    /// Sets the gradient factory of non-op nodes (control flow and stacks in graphs).
    pub fn register_nodes(&mut self, factory: NodeGradientFactory<V>) {
        self.nodes = Some(factory);
    }

    /// Sets the forward-mode rule of non-op nodes (control flow in graphs).
    pub fn register_node_tangents(&mut self, rule: NodeTangentRule<V>) {
        self.node_tangents = Some(rule);
    }

    /// The forward-mode rule of non-op nodes, if one is registered.
    pub fn node_tangent(&self) -> Option<NodeTangentRule<V>> {
        self.node_tangents
    }

    /// The gradient function of a non-op node, or `None` when none is registered for it.
    pub fn lookup_node(
        &self,
        kind: &V::Node,
        inputs: &[V],
        outputs: &[V],
    ) -> Result<Option<Arc<dyn GradientFunction<V>>>> {
        match self.nodes {
            Some(factory) => factory(kind, inputs, outputs),
            None => Ok(None),
        }
    }

    /// The gradient function for `fwd`, or `None` when its op is not differentiable.
    pub fn lookup(
        &self,
        fwd: &ForwardOperation<'_, V>,
    ) -> Result<Option<Arc<dyn GradientFunction<V>>>> {
        match self.factories.get(&fwd.op.kind()) {
            Some(Some(factory)) => factory(fwd),
            _ => Ok(None),
        }
    }
}

impl<V: Value> Default for GradientRegistry<V> {
    fn default() -> Self {
        Self::with_op_table()
    }
}

/// The op table's gradient: the op (attributes) plus only what its rule saves.
struct OpGradient<V> {
    op: Op,
    saved: Saved<V>,
}

impl<V: Value> GradientFunction<V> for OpGradient<V> {
    fn compute(
        &self,
        ctx: &mut dyn Context<V>,
        grad_outputs: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>> {
        self.op.gradient(ctx, &self.saved, grad_outputs, needs)
    }
}

fn op_table_gradient<V: Value>(
    fwd: &ForwardOperation<'_, V>,
) -> Result<Option<Arc<dyn GradientFunction<V>>>> {
    let saves = fwd.op.saves();
    if let Saves::NotDifferentiable(_) = saves {
        return Ok(None);
    }
    let saved = Saved::capture(saves, fwd.inputs, fwd.outputs);
    Ok(Some(Arc::new(OpGradient {
        op: fwd.op.clone(),
        saved,
    })))
}

struct TapeEntry<V: Value> {
    inputs: SmallVec<[TensorId; 2]>,
    outputs: SmallVec<[TensorId; 1]>,
    /// Input `i` was watched when recorded (else its gradient is skipped).
    needs: SmallVec<[bool; 2]>,
    /// Op name for error messages.
    name: &'static str,
    input_types: SmallVec<[crate::shape::TensorType; 2]>,
    function: Arc<dyn GradientFunction<V>>,
}

impl<V: Value> Clone for TapeEntry<V> {
    fn clone(&self) -> Self {
        TapeEntry {
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            needs: self.needs.clone(),
            name: self.name,
            input_types: self.input_types.clone(),
            function: self.function.clone(),
        }
    }
}

/// Records operations on watched values; computes gradients from the records.
pub struct Tape<V: Value> {
    persistent: bool,
    watched: HashSet<TensorId>,
    entries: Vec<TapeEntry<V>>,
    used: bool,
    /// Bytes of the concrete values its records were given (an upper bound of what they keep).
    held_bytes: usize,
}

/// Tapes whose records hold at least this many bytes check, each time their length reaches a
/// power of two, that the machine could give as much again (`Tape::check_headroom`).
const HEADROOM_ABOVE_BYTES: usize = 1 << 24;

/// Tapes are shared between the thread that records and the code that asks for gradients.
pub type TapeRef<V> = Arc<Mutex<Tape<V>>>;

fn is_trainable<V: Value>(v: &V) -> bool {
    v.ty().dtype.is_float()
}

impl<V: Value> Tape<V> {
    pub fn new(persistent: bool) -> Self {
        Tape {
            persistent,
            watched: HashSet::new(),
            entries: Vec::new(),
            used: false,
            held_bytes: 0,
        }
    }

    pub fn new_ref(persistent: bool) -> TapeRef<V> {
        Arc::new(Mutex::new(Self::new(persistent)))
    }

    pub fn persistent(&self) -> bool {
        self.persistent
    }

    /// Number of recorded operations (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Watches `v` (float dtypes only: integers and bools have no gradient).
    pub fn watch(&mut self, v: &V) -> Result<()> {
        if !is_trainable(v) {
            return Err(Error::gradient(
                "watch",
                format!(
                    "cannot watch a {} tensor: only float32 and float64 have gradients",
                    v.ty().dtype
                ),
            ));
        }
        self.watched.insert(v.id());
        Ok(())
    }

    pub fn is_watched(&self, id: TensorId) -> bool {
        self.watched.contains(&id)
    }

    /// True when an op with these inputs must be recorded.
    pub fn should_record(&self, inputs: &[V]) -> bool {
        inputs
            .iter()
            .any(|v| self.watched.contains(&v.id()) && is_trainable(v))
    }

    /// Records an op; its float outputs become watched. A ResourceExhausted error (nothing
    /// recorded) when the records outgrow what the machine can give (`check_headroom`).
    pub fn record_operation(
        &mut self,
        name: &'static str,
        inputs: &[V],
        outputs: &[V],
        function: Arc<dyn GradientFunction<V>>,
    ) -> Result<()> {
        let held = inputs
            .iter()
            .chain(outputs)
            .map(Value::held_bytes)
            .sum::<usize>();
        self.check_headroom(name, held)?;
        self.held_bytes = self.held_bytes.saturating_add(held);
        let needs = inputs
            .iter()
            .map(|v| self.watched.contains(&v.id()) && is_trainable(v))
            .collect();
        for o in outputs.iter().filter(|o| is_trainable(*o)) {
            self.watched.insert(o.id());
        }
        self.entries.push(TapeEntry {
            inputs: inputs.iter().map(Value::id).collect(),
            outputs: outputs.iter().map(Value::id).collect(),
            needs,
            name,
            input_types: inputs.iter().map(|v| v.ty().clone()).collect(),
            function,
        });
        Ok(())
    }

    /// Each record is small and the values it keeps were allocated by their ops, so a tape
    /// never asks for one large block that could fail cleanly: when its length reaches a power
    /// of two past 16 MiB held, it asks the system for as much as it holds, and refuses to
    /// grow while the kernels still have that much room, rather than a small allocation
    /// failing inside one of them and aborting the process.
    fn check_headroom(&mut self, name: &str, more: usize) -> Result<()> {
        let refused =
            |what: String| Error::new(ErrorKind::ResourceExhausted, name.to_owned(), what);
        let entries = &mut self.entries;
        crate::memory::fallibly(|| entries.try_reserve(1)).map_err(|_| {
            refused(format!(
                "the gradient tape cannot grow past {} records",
                self.entries.len()
            ))
        })?;
        let n = self.entries.len() + 1;
        let held = self.held_bytes.saturating_add(more);
        if n.is_power_of_two()
            && held >= HEADROOM_ABOVE_BYTES
            && crate::memory::fallibly(|| Vec::<u8>::new().try_reserve_exact(held).is_err())
        {
            return Err(refused(format!(
                "the gradient tape's {n} records hold {held} bytes and this machine could not \
                 allocate as much again (a loop of many trips: `checkpoints` keeps its \
                 gradient's memory bounded)"
            )));
        }
        Ok(())
    }
}

pub fn lock<V: Value>(tape: &TapeRef<V>) -> MutexGuard<'_, Tape<V>> {
    // A poisoned tape only means a panic elsewhere; its records are still consistent.
    tape.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `op` on every tape in `tapes` that watches one of its inputs.
pub fn record_op<V: Value>(
    tapes: &[TapeRef<V>],
    registry: &GradientRegistry<V>,
    op: &Op,
    inputs: &[V],
    outputs: &[V],
) -> Result<()> {
    let mut function: Option<Option<Arc<dyn GradientFunction<V>>>> = None;
    for tape in tapes {
        let mut t = lock(tape);
        if !t.should_record(inputs) {
            continue;
        }
        if function.is_none() {
            let skip: SmallVec<[usize; 2]> = (0..inputs.len())
                .filter(|&i| !t.watched.contains(&inputs[i].id()))
                .collect();
            let fwd = ForwardOperation {
                op,
                inputs,
                outputs,
                skip_input_indices: &skip,
            };
            function = Some(registry.lookup(&fwd)?);
        }
        if let Some(Some(f)) = &function {
            t.record_operation(op.name(), inputs, outputs, f.clone())?;
        }
    }
    Ok(())
}

/// Records a user-supplied gradient function (custom gradients) on the tapes that need it.
pub fn record_custom<V: Value>(
    tapes: &[TapeRef<V>],
    name: &'static str,
    inputs: &[V],
    outputs: &[V],
    function: Arc<dyn GradientFunction<V>>,
) -> Result<()> {
    for tape in tapes {
        let mut t = lock(tape);
        if t.should_record(inputs) {
            t.record_operation(name, inputs, outputs, function.clone())?;
        }
    }
    Ok(())
}

/// A context that applies ops through `inner` and records them on `tapes`.
pub struct TapeContext<'a, V: Value> {
    pub inner: &'a mut dyn Context<V>,
    pub tapes: &'a [TapeRef<V>],
    pub registry: &'a GradientRegistry<V>,
}

impl<V: Value> Context<V> for TapeContext<'_, V> {
    fn apply(&mut self, op: &Op, inputs: &[V]) -> Result<Values<V>> {
        let outputs = self.inner.apply(op, inputs)?;
        if !self.tapes.is_empty() {
            record_op(self.tapes, self.registry, op, inputs, &outputs)?;
        }
        Ok(outputs)
    }

    fn apply_node(&mut self, kind: &V::Node, inputs: &[V]) -> Result<Values<V>> {
        let outputs = self.inner.apply_node(kind, inputs)?;
        let watched = self.tapes.iter().any(|t| lock(t).should_record(inputs));
        if watched {
            if let Some(f) = self.registry.lookup_node(kind, inputs, &outputs)? {
                record_custom(self.tapes, kind.name(), inputs, &outputs, f)?;
            }
        }
        Ok(outputs)
    }

    fn tracer(&self) -> Option<V::Trace> {
        self.inner.tracer()
    }
}

/// Gradients of `targets` with respect to `sources`, from the records of `tape`.
///
/// `output_gradients[i]` seeds target `i` (ones when absent). The result has one entry per
/// source: `None` when the source is not watched or does not reach any target. Gradient ops run
/// through `ctx`, so they are recorded by whatever tapes `ctx` records on.
pub fn compute_gradient<V: Value>(
    tape: &TapeRef<V>,
    ctx: &mut dyn Context<V>,
    targets: &[V],
    sources: &[V],
    output_gradients: Option<&[Option<V>]>,
) -> Result<Vec<Option<V>>> {
    let (entries, watched) = {
        let mut t = lock(tape);
        if t.used && !t.persistent {
            return Err(Error::gradient(
                "GradientTape.gradient",
                "a non-persistent GradientTape can only compute one gradient; \
                 create it with persistent=True to call gradient() more than once",
            ));
        }
        t.used = true;
        if t.persistent {
            (t.entries.clone(), t.watched.clone())
        } else {
            (
                std::mem::take(&mut t.entries),
                std::mem::take(&mut t.watched),
            )
        }
    };
    if let Some(og) = output_gradients {
        if og.len() != targets.len() {
            return Err(Error::invalid(
                "GradientTape.gradient",
                format!(
                    "got {} output_gradients for {} targets",
                    og.len(),
                    targets.len()
                ),
            ));
        }
    }
    backward(&entries, &watched, ctx, targets, sources, output_gradients)
}

fn backward<V: Value>(
    entries: &[TapeEntry<V>],
    watched: &HashSet<TensorId>,
    ctx: &mut dyn Context<V>,
    targets: &[V],
    sources: &[V],
    output_gradients: Option<&[Option<V>]>,
) -> Result<Vec<Option<V>>> {
    let needed = reachable_entries(entries, targets);
    let source_ids: HashSet<TensorId> = sources.iter().map(Value::id).collect();
    let mut grads: HashMap<TensorId, V> = HashMap::new();
    for (i, target) in targets.iter().enumerate() {
        if !watched.contains(&target.id()) {
            continue;
        }
        let seed = match output_gradients.and_then(|og| og[i].clone()) {
            Some(g) => check_seed(target, g)?,
            None => build::ones_like(ctx, target)?,
        };
        accumulate(ctx, &mut grads, target.id(), seed)?;
    }
    for (index, entry) in entries.iter().enumerate().rev() {
        if !needed[index] {
            continue;
        }
        let grad_outputs: SmallVec<[Option<V>; 1]> = entry
            .outputs
            .iter()
            .map(|id| {
                if source_ids.contains(id) {
                    grads.get(id).cloned()
                } else {
                    grads.remove(id)
                }
            })
            .collect();
        if grad_outputs.iter().all(Option::is_none) {
            continue;
        }
        let grad_inputs = entry.function.compute(ctx, &grad_outputs, &entry.needs)?;
        if grad_inputs.len() != entry.inputs.len() {
            return Err(Error::internal(
                entry.name,
                format!(
                    "gradient returned {} values for {} inputs",
                    grad_inputs.len(),
                    entry.inputs.len()
                ),
            ));
        }
        for (i, g) in grad_inputs.into_iter().enumerate() {
            if let (Some(g), true) = (g, entry.needs[i]) {
                check_gradient(entry, i, &g)?;
                accumulate(ctx, &mut grads, entry.inputs[i], g)?;
            }
        }
    }
    Ok(sources
        .iter()
        .map(|s| {
            if watched.contains(&s.id()) {
                grads.get(&s.id()).cloned()
            } else {
                None
            }
        })
        .collect())
}

/// Marks the entries that lie on a path to some target.
fn reachable_entries<V: Value>(entries: &[TapeEntry<V>], targets: &[V]) -> Vec<bool> {
    let mut producer: HashMap<TensorId, usize> = HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        for &o in &e.outputs {
            producer.insert(o, i);
        }
    }
    let mut needed = vec![false; entries.len()];
    let mut stack: Vec<TensorId> = targets.iter().map(Value::id).collect();
    while let Some(id) = stack.pop() {
        if let Some(&i) = producer.get(&id) {
            if !needed[i] {
                needed[i] = true;
                let e = &entries[i];
                stack.extend(
                    e.inputs
                        .iter()
                        .zip(&e.needs)
                        .filter(|(_, n)| **n)
                        .map(|(id, _)| *id),
                );
            }
        }
    }
    needed
}

fn accumulate<V: Value>(
    ctx: &mut dyn Context<V>,
    grads: &mut HashMap<TensorId, V>,
    id: TensorId,
    g: V,
) -> Result<()> {
    let sum = match grads.remove(&id) {
        Some(prev) => match prev.sum_node() {
            Some(node) => {
                let mut out = ctx.apply_node(&node, &[prev, g])?;
                if out.is_empty() {
                    return Err(Error::internal(node.name(), "the sum gave no value"));
                }
                out.swap_remove(0)
            }
            None => build::add(ctx, &prev, &g)?,
        },
        None => g,
    };
    grads.insert(id, sum);
    Ok(())
}

fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || *x == DYN || *y == DYN)
}

fn check_seed<V: Value>(target: &V, g: V) -> Result<V> {
    let (t, gt) = (target.ty(), g.ty());
    if t.dtype != gt.dtype || !same_shape(&t.shape, &gt.shape) {
        return Err(Error::shape(
            "GradientTape.gradient",
            format!("output gradient of type {gt} does not match its target of type {t}"),
        ));
    }
    Ok(g)
}

fn check_gradient<V: Value>(entry: &TapeEntry<V>, i: usize, g: &V) -> Result<()> {
    let (want, got) = (&entry.input_types[i], g.ty());
    if want.dtype != got.dtype || !same_shape(&want.shape, &got.shape) {
        return Err(Error::internal(
            entry.name,
            format!(
                "gradient for input {i} has type {}{} but the input is {}",
                got.dtype,
                ShapeDisplay(&got.shape),
                want
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "tape_tests.rs"]
mod tests;
