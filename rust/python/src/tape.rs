//! `gradloop._core.Tape` and the recording controls the Python autodiff API is built on.

use std::sync::Arc;

use gradloop::batch::{dress, same_lanes, strip, strip_levels, LaneSet, Levels, Narrowing};
use gradloop::ops::{build, Grads};
use gradloop::tape::{compute_gradient, record_custom, Tape};
use gradloop::trace::Val;
use gradloop::{Context, ErrorKind, GradientFunction, TapeRef, TensorType, Value, DYN};
use pyo3::prelude::*;
use pyo3::types::{PySequence, PyTuple};

use crate::errors::{new_err, park, IntoPyResult};
use crate::runtime;
use crate::tensor::PyTensor;

/// A gradient tape. Records only while on the active stack of its thread (`push`/`pop`).
#[pyclass(frozen, name = "Tape", module = "gradloop._core")]
pub struct PyTape {
    inner: TapeRef<Val>,
}

/// The values of a sequence of Tensors.
pub fn tensors(seq: &Bound<'_, PyAny>) -> PyResult<Vec<Val>> {
    let seq = seq.cast::<PySequence>()?;
    (0..seq.len()?)
        .map(|i| Ok(seq.get_item(i)?.cast::<PyTensor>()?.get().inner.clone()))
        .collect()
}

fn lock(t: &TapeRef<Val>) -> std::sync::MutexGuard<'_, Tape<Val>> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl PyTape {
    #[new]
    #[pyo3(signature = (persistent=false))]
    fn new(persistent: bool) -> Self {
        PyTape {
            inner: Tape::new_ref(persistent),
        }
    }

    #[getter]
    fn persistent(&self) -> bool {
        lock(&self.inner).persistent()
    }

    /// Watches `t`; inside `gl.vmap`, the batch it is a lane of (what the tape records).
    fn watch(&self, py: Python<'_>, t: &Bound<'_, PyTensor>) -> PyResult<()> {
        lock(&self.inner).watch(&strip(&t.get().inner).0).py(py)
    }

    fn is_watched(&self, t: &Bound<'_, PyTensor>) -> bool {
        lock(&self.inner).is_watched(strip(&t.get().inner).0.id())
    }

    fn __len__(&self) -> usize {
        lock(&self.inner).len()
    }

    /// Identifies this tape among the recording ones (`recording_tape_keys`) while it lives.
    #[getter]
    fn key(&self) -> usize {
        std::sync::Arc::as_ptr(&self.inner) as usize
    }

    fn push(&self) {
        runtime::push_tape(self.inner.clone());
    }

    fn pop(&self) -> bool {
        runtime::pop_tape(&self.inner)
    }

    /// Gradients of `targets` w.r.t. `sources` (one entry per source; None if unconnected).
    #[pyo3(signature = (targets, sources, output_gradients=None))]
    fn gradient(
        &self,
        py: Python<'_>,
        targets: &Bound<'_, PyAny>,
        sources: &Bound<'_, PyAny>,
        output_gradients: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<PyTensor>>> {
        // Inside `gl.vmap` the tape recorded the batched program: gradients are taken between
        // batches and handed back as lanes.
        let (targets, target_levels): (Vec<Val>, Vec<Levels>) =
            tensors(targets)?.iter().map(strip).unzip();
        let (sources, source_levels): (Vec<Val>, Vec<Levels>) =
            tensors(sources)?.iter().map(strip).unzip();
        check_lanes(py, &target_levels, &source_levels)?;
        let seeds: Option<Vec<Option<Val>>> = match output_gradients.filter(|o| !o.is_none()) {
            None => None,
            Some(og) => {
                let seq = og.cast::<PySequence>()?;
                let seeds = (0..seq.len()?)
                    .map(|i| {
                        let item = seq.get_item(i)?;
                        if item.is_none() {
                            return Ok(None);
                        }
                        let seed = crate::convert::input(&item)?;
                        let levels = target_levels.get(i).map_or(&[][..], |l| l.as_slice());
                        seed_for(py, seed, targets.get(i), levels).map(Some)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Some(seeds)
            }
        };
        let tape = self.inner.clone();
        // A concrete backward pass may be large: release the GIL (symbolic never does).
        let concrete = targets.iter().all(Val::is_concrete)
            && seeds.iter().flatten().flatten().all(Val::is_concrete);
        let size = if concrete { usize::MAX } else { 0 };
        // Gradient ops are recorded by the active (outer) tapes: higher-order gradients.
        let grads = runtime::run(py, size, move |ctx| {
            compute_gradient(&tape, ctx, &targets, &sources, seeds.as_deref())
        })?;
        grads
            .into_iter()
            .zip(&source_levels)
            .map(|(g, levels)| g.map(|g| dress(g, levels).map(PyTensor::new)).transpose())
            .collect::<gradloop::Result<_>>()
            .py(py)
    }
}

/// Inside `gl.vmap`, each lane's gradient with respect to a value that is the same in every
/// lane differs per lane; the tape holds only their sum. Refused (`gl.grad` makes its
/// arguments lanes first).
fn check_lanes(py: Python<'_>, targets: &[Levels], sources: &[Levels]) -> PyResult<()> {
    for (i, source) in sources.iter().enumerate() {
        let missing = targets
            .iter()
            .flatten()
            .any(|t| !source.iter().any(|s| s.level == t.level));
        if missing {
            return Err(new_err(
                py,
                ErrorKind::InvalidArgument,
                "GradientTape.gradient",
                format!(
                    "source {i} is the same in every lane of a gl.vmap but the target differs \
                     per lane: each lane's gradient is its own, and the tape holds only their \
                     sum; watch a batched value (one the vmapped function received or computed) \
                     or use gl.grad, which makes its arguments lanes"
                ),
            ));
        }
    }
    Ok(())
}

/// The seed of a target batched at `levels` (`target`, taken off its lanes): batched the same
/// way, it is taken off its lanes as the target is; the same in every lane, it is repeated
/// for each; batched where the target is not, it stays a lane view, and the backward pass runs
/// batched (a Jacobian's rows as one `vmap`).
fn seed_for(
    py: Python<'_>,
    seed: Val,
    target: Option<&Val>,
    levels: &[Arc<LaneSet>],
) -> PyResult<Val> {
    let (physical, seed_levels) = strip(&seed);
    if same_lanes(&seed_levels, levels) {
        return Ok(physical);
    }
    if seed_levels.len() == levels.len()
        && seed_levels
            .iter()
            .zip(levels)
            .all(|(s, t)| s.level == t.level)
    {
        // Lanes of the same calls, over other lanes of them (a branch's): gathered to the
        // target's lanes, where it can be.
        let levels = levels.to_vec();
        return runtime::run(py, 0, move |ctx| {
            let mut v = seed;
            for set in &levels {
                let lanes = gradloop::batch::lanes_at(&v, set.level)
                    .ok_or_else(|| gradloop::Error::internal("vmap", "lanes changed"))?;
                v = gradloop::batch::over(ctx, lanes, set)?;
            }
            Ok(v)
        });
    }
    if levels.is_empty() {
        return Ok(seed);
    }
    if let (true, Some(target)) = (seed_levels.is_empty(), target) {
        let shape = target.ty().shape.clone();
        return runtime::run(py, 0, move |ctx| build::broadcast_to(ctx, &seed, &shape));
    }
    Err(new_err(
        py,
        ErrorKind::InvalidArgument,
        "GradientTape.gradient",
        "output_gradients must be batched over the same gl.vmap calls as their targets, or \
         the targets over none",
    ))
}

/// Watches `t` on every active tape (a Variable read).
#[pyfunction]
pub fn watch_on_active_tapes(py: Python<'_>, t: &Bound<'_, PyTensor>) -> PyResult<()> {
    for tape in runtime::active_tapes() {
        lock(&tape).watch(&t.get().inner).py(py)?;
    }
    Ok(())
}

/// The `key`s of the tapes recording now, innermost last.
#[pyfunction]
pub fn recording_tape_keys() -> Vec<usize> {
    runtime::active_tapes()
        .iter()
        .map(|t| std::sync::Arc::as_ptr(t) as usize)
        .collect()
}

/// What this thread is doing: "eager" (nothing traces or records), "recording" (tapes record)
/// or "tracing" (a function is being traced).
#[pyfunction]
pub fn mode() -> &'static str {
    runtime::phase().name()
}

/// Whether a tape is recording on this thread.
#[pyfunction]
pub fn any_tape_active() -> bool {
    !runtime::active_tapes().is_empty()
}

/// Whether an active tape would record an op on `inputs`: one of them is watched, or computed
/// from a watched value.
#[pyfunction]
pub fn any_tape_records(inputs: &Bound<'_, PyAny>) -> PyResult<bool> {
    let inputs = tensors(inputs)?;
    Ok(runtime::active_tapes()
        .iter()
        .any(|t| lock(t).should_record(&inputs)))
}

/// Sets the active tapes aside (nothing is recorded) until `resume_recording(token)`; with
/// `above_level`, only those pushed after the tape or accumulator of that level (nested in it).
#[pyfunction]
#[pyo3(signature = (above_level=None))]
pub fn pause_recording(above_level: Option<u64>) -> usize {
    match above_level {
        None => runtime::pause(),
        Some(level) => runtime::pause_above(level),
    }
}

/// Records again on the tapes that `pause_recording` set aside (its `token`).
#[pyfunction]
pub fn resume_recording(py: Python<'_>, token: usize) -> PyResult<()> {
    runtime::resume(token).py(py)
}

/// What a missing output gradient is made from: the output's type, or the (symbolic) output
/// itself when its shape is only known at run time.
enum ZeroSeed {
    Type(TensorType),
    Like(Val),
}

/// A gradient function implemented in Python (`gl.custom_gradient`, `gl.recompute_grad`).
struct PyGradientFunction {
    callable: Py<PyAny>,
    zero_seeds: Vec<ZeroSeed>,
    n_inputs: usize,
    /// Whether the callable takes `needs=` (which inputs' gradients are asked for).
    takes_needs: bool,
    /// The `vmap` lanes each input and output was a view of (empty outside `vmap`).
    input_lanes: Vec<Levels>,
    output_lanes: Vec<Levels>,
    /// The lanes current when the op ran (a branch's or a loop's live lanes).
    current: Vec<Arc<LaneSet>>,
}

impl GradientFunction<Val> for PyGradientFunction {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> gradloop::Result<Grads<Val>> {
        // Missing output gradients become zeros: the user's function expects every one.
        let mut seeds = Vec::with_capacity(grad_outputs.len());
        for (g, zero) in grad_outputs.iter().zip(&self.zero_seeds) {
            seeds.push(match (g, zero) {
                (Some(g), _) => g.clone(),
                (None, ZeroSeed::Type(ty)) => build::fill(ctx, ty.dtype, &ty.shape, 0.0)?,
                (None, ZeroSeed::Like(v)) => build::zeros_like(ctx, v)?,
            });
        }
        if self
            .input_lanes
            .iter()
            .chain(&self.output_lanes)
            .all(|l| l.is_empty())
        {
            return Python::attach(|py| self.call(py, seeds, needs).map_err(park));
        }
        // The seeds as lanes of the outputs' vmap levels, active while the function runs
        // (they may have ended: the gradient of a vmapped function), the gradients taken off
        // their lanes as the inputs were.
        let seeds = seeds
            .into_iter()
            .zip(&self.output_lanes)
            .map(|(g, lanes)| dress(g, lanes))
            .collect::<gradloop::Result<Vec<_>>>()?;
        let sets: Vec<&Arc<LaneSet>> = self.current.iter().collect();
        let grads = with_lanes_active(&sets, || {
            Python::attach(|py| self.call(py, seeds, needs).map_err(park))
        })?;
        grads
            .into_iter()
            .zip(&self.input_lanes)
            .map(|(g, lanes)| {
                g.map(|g| onto_lanes(ctx, &g, lanes, &self.current))
                    .transpose()
            })
            .collect()
    }
}

/// Runs `f` with the lanes of `sets` current (a level that has ended is pushed again for the
/// call; one still active but narrowed otherwise is set to the recorded lanes), as it was when
/// the op was recorded.
fn with_lanes_active<T>(sets: &[&Arc<LaneSet>], f: impl FnOnce() -> T) -> T {
    let mut chosen: Vec<&Arc<LaneSet>> = Vec::new();
    for set in sets {
        if !chosen.iter().any(|c| c.level == set.level) {
            chosen.push(set);
        }
    }
    chosen.sort_by_key(|s| s.level);
    let active = runtime::batch_levels();
    let mut pushed = Vec::new();
    let mut swapped = Vec::new();
    for set in &chosen {
        match active.iter().find(|a| a.level == set.level) {
            None => {
                runtime::push_batch_set((*set).clone());
                pushed.push(set.level);
            }
            Some(current) if !Arc::ptr_eq(current, set) => {
                runtime::set_batch_set((*set).clone());
                swapped.push(current.clone());
            }
            Some(_) => {}
        }
    }
    let out = f();
    for level in pushed.iter().rev() {
        runtime::pop_batch_level(*level);
    }
    for set in swapped {
        runtime::set_batch_set(set);
    }
    out
}

/// Gradient `g` (lanes of some `vmap` levels) as the physical gradient of an input that was
/// a view of `lanes`: summed over lanes the input did not have (an input the same in every
/// lane gathers every lane's gradient); repeated over the lanes `current` when the op ran for
/// a level it does not have (the gradient function saw those lanes: a branch's or a loop's
/// live ones); then taken onto the input's lanes of each level (narrowed lanes summed into
/// their rows, lanes outside them getting nothing).
fn onto_lanes(
    ctx: &mut dyn Context<Val>,
    g: &Val,
    lanes: &[Arc<LaneSet>],
    current: &[Arc<LaneSet>],
) -> gradloop::Result<Val> {
    // Only the levels the op ran under: a `vmap` the gradient runs in now keeps its lanes.
    let own: Vec<u64> = current.iter().chain(lanes).map(|s| s.level).collect();
    let (mut physical, g_lanes) = strip_levels(g, &own);
    if same_lanes(&g_lanes, lanes) {
        return Ok(physical);
    }
    // Axes outermost level first (`strip` lists the innermost first).
    let mut held: Vec<Arc<LaneSet>> = g_lanes.iter().rev().cloned().collect();
    let wanted: Vec<&Arc<LaneSet>> = lanes.iter().rev().collect();
    let extra: Vec<usize> = (0..held.len())
        .filter(|&k| !wanted.iter().any(|w| w.level == held[k].level))
        .collect();
    if !extra.is_empty() {
        physical = build::sum(ctx, &physical, &extra, false)?;
        held.retain(|h| wanted.iter().any(|w| w.level == h.level));
    }
    let order: Vec<Option<usize>> = wanted
        .iter()
        .map(|w| held.iter().position(|h| h.level == w.level))
        .collect();
    if order.iter().flatten().zip(0..).any(|(&k, i)| k != i) {
        return Err(gradloop::Error::invalid(
            "custom_gradient",
            "a gradient function returned a gradient batched over gl.vmap calls in another \
             order than its input",
        ));
    }
    if held.len() < wanted.len() {
        let rest = physical.ty().shape[held.len()..].to_vec();
        let (mut shape, mut target, mut sets) = (Vec::new(), Vec::new(), Vec::new());
        let mut present = held.iter();
        for (w, k) in wanted.iter().zip(&order) {
            let (set, size) = match (k, present.clone().next()) {
                (Some(_), Some(h)) => {
                    present.next();
                    (h.clone(), h.count)
                }
                _ => {
                    let seen = current.iter().find(|c| c.level == w.level).unwrap_or(w);
                    (seen.clone(), 1)
                }
            };
            shape.push(size);
            target.push(set.count);
            sets.push(set);
        }
        shape.extend_from_slice(&rest);
        target.extend_from_slice(&rest);
        let expanded = build::reshape(ctx, &physical, &shape)?;
        physical = build::broadcast_to(ctx, &expanded, &target)?;
        held = sets;
    }
    for (axis, (from, to)) in held.iter().zip(&wanted).enumerate() {
        if !Arc::ptr_eq(from, to) {
            physical = scattered_up(ctx, physical, from, to, axis)?;
        }
    }
    Ok(physical)
}

/// `g`, over the lanes of `from` along `axis`, as a gradient over the wider lanes `to` (an
/// ancestor of `from`): summed into their rows (the transpose of `batch::over`'s gathers).
fn scattered_up(
    ctx: &mut dyn Context<Val>,
    mut g: Val,
    from: &Arc<LaneSet>,
    to: &Arc<LaneSet>,
    axis: usize,
) -> gradloop::Result<Val> {
    let mut set = from.clone();
    while !Arc::ptr_eq(&set, to) {
        let Some((parent, narrowing)) = set.narrowing() else {
            return Err(gradloop::Error::invalid(
                "custom_gradient",
                "a gradient over lanes that are not a subset of its input's",
            ));
        };
        g = match narrowing {
            Narrowing::Rows(rows) => build::scatter_add(ctx, &g, rows, axis, parent.count)?,
            // a stand-in's copy has no gradient (`batch::stand_in_copies`)
            Narrowing::StandIns { mask, .. } => {
                let zeros = build::zeros_like(ctx, &g)?;
                let mut shape = vec![1usize; g.ty().shape.len()];
                shape[axis] = parent.count;
                let mask = build::reshape(ctx, mask, &shape)?;
                build::select(ctx, &mask, &g, &zeros)?
            }
        };
        set = parent.clone();
    }
    Ok(g)
}

impl PyGradientFunction {
    fn call(&self, py: Python<'_>, seeds: Vec<Val>, needs: &[bool]) -> PyResult<Grads<Val>> {
        let args = PyTuple::new(py, seeds.into_iter().map(PyTensor::new))?;
        let result = if self.takes_needs {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("needs", PyTuple::new(py, needs)?)?;
            self.callable.bind(py).call(args, Some(&kwargs))?
        } else {
            self.callable.bind(py).call1(args)?
        };
        let seq = result.cast::<PySequence>().map_err(|_| {
            new_err(py, ErrorKind::Gradient, "custom_gradient", "the gradient function must return a sequence with one gradient (or None) per input")
        })?;
        if seq.len()? != self.n_inputs {
            return Err(new_err(
                py,
                ErrorKind::Gradient,
                "custom_gradient",
                format!(
                    "the gradient function returned {} gradients for {} inputs",
                    seq.len()?,
                    self.n_inputs
                ),
            ));
        }
        (0..self.n_inputs)
            .map(|i| {
                let item = seq.get_item(i)?;
                if item.is_none() {
                    Ok(None)
                } else {
                    Ok(Some(crate::convert::input(&item)?))
                }
            })
            .collect()
    }
}

/// Records an op on the active tapes whose gradient is `grad_fn(*output_grads)`; with
/// `takes_needs`, `grad_fn(*output_grads, needs=(bool per input))`, so that it computes only
/// the gradients asked for.
/// With `above_level`, only the tapes pushed after the tape or accumulator of that level
/// record it.
#[pyfunction]
#[pyo3(signature = (name, inputs, outputs, grad_fn, takes_needs=false, above_level=None))]
pub fn record_custom_gradient(
    py: Python<'_>,
    name: &str,
    inputs: &Bound<'_, PyAny>,
    outputs: &Bound<'_, PyAny>,
    grad_fn: Py<PyAny>,
    takes_needs: bool,
    above_level: Option<u64>,
) -> PyResult<()> {
    // The tape keeps static op names; the user's name is for error messages only.
    let _ = name;
    // Inside `gl.vmap` the tapes record the batched program: the op joins batches; its
    // gradient function sees lanes, as the function it stands for did.
    let (inputs, input_lanes): (Vec<Val>, Vec<Levels>) = tensors(inputs)?.iter().map(strip).unzip();
    let (outputs, output_lanes): (Vec<Val>, Vec<Levels>) =
        tensors(outputs)?.iter().map(strip).unzip();
    let zero_seeds = outputs
        .iter()
        .map(|v| match v {
            Val::Symbol(_) if v.ty().shape.contains(&DYN) => ZeroSeed::Like(v.clone()),
            _ => ZeroSeed::Type(v.ty().clone()),
        })
        .collect();
    let function = Arc::new(PyGradientFunction {
        callable: grad_fn,
        zero_seeds,
        n_inputs: inputs.len(),
        takes_needs,
        input_lanes,
        output_lanes,
        current: runtime::batch_levels(),
    });
    let tapes = match above_level {
        None => runtime::active_tapes(),
        Some(level) => runtime::tapes_above(level),
    };
    record_custom(&tapes, "custom_gradient", &inputs, &outputs, function).py(py)
}
