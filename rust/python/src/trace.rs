//! The tracing API the Python `@gl.function` layer is built on: one active trace per thread
//! (`trace_begin` .. `trace_finish`), inner function frames (`trace_push`/`trace_pop`, giving a
//! `Branch`), and the control-flow nodes over them (`emit_if`, `emit_case`, `emit_while`).

use gradloop::graph::ValueType;
use gradloop::trace::{self, lock, Branch, LoopFunctions, Tracer, TracerRef, Val};
use gradloop::{ErrorKind, DYN};
use pyo3::prelude::*;
use pyo3::types::PySequence;

use crate::convert::input;
use crate::dtype::to_dtype;
use crate::errors::{new_err, IntoPyResult};
use crate::function::PyConcreteFunction;
use crate::runtime::{self, run};
use crate::tape::tensors;
use crate::tensor::PyTensor;

/// A traced inner function (a cond branch, a loop cond or body) and the outer values it
/// captured. Pass it to `emit_if`, `emit_case` or `emit_while`.
#[pyclass(frozen, name = "Branch", module = "gradloop._core")]
pub struct PyBranch {
    inner: Branch,
}

#[pymethods]
impl PyBranch {
    /// The function's name in the graph's library.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The outer values the function captured (its parameters after its own, in order).
    #[getter]
    fn captures(&self) -> Vec<PyTensor> {
        self.inner
            .captures
            .iter()
            .cloned()
            .map(PyTensor::new)
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<gl.Branch @{} captures={}>",
            self.inner.name,
            self.inner.captures.len()
        )
    }
}

/// Parameter types from `[(dtype, (dim | None, ...)), ...]` (`None`: known only at run time).
fn param_types(params: &Bound<'_, PyAny>) -> PyResult<Vec<ValueType>> {
    let seq = params.cast::<PySequence>()?;
    (0..seq.len()?)
        .map(|i| {
            let (dtype, shape): (Bound<'_, PyAny>, Vec<Option<usize>>) =
                seq.get_item(i)?.extract()?;
            let shape: Vec<usize> = shape.into_iter().map(|d| d.unwrap_or(DYN)).collect();
            Ok(ValueType::tensor(to_dtype(&dtype)?, &shape))
        })
        .collect()
}

fn py_tensors(vals: Vec<Val>) -> Vec<PyTensor> {
    vals.into_iter().map(PyTensor::new).collect()
}

/// The thread's active trace, or a ControlFlowError naming `what`.
pub fn require_tracer(py: Python<'_>, what: &'static str) -> PyResult<TracerRef> {
    runtime::active_tracer().ok_or_else(|| {
        new_err(
            py,
            ErrorKind::ControlFlow,
            what,
            "no function is being traced on this thread (call trace_begin first)",
        )
    })
}

/// Starts tracing function `name` with parameters of the given types; returns the symbolic
/// parameters. Errors if this thread is already tracing. With `fixed_state_loops`, loop
/// gradients keep fixed-size state (`Tracer::fixed_state_loops`: what pure StableHLO needs).
/// With `closed_over_inputs`, every tensor made before the trace that the traced code uses is
/// an input (scalars too) and ops on such tensors are traced (`Tracer::closed_over_before`):
/// what an eager construct staged as a graph needs to differentiate what it closes over.
#[pyfunction]
#[pyo3(signature = (name, params, fixed_state_loops=None, closed_over_inputs=false))]
pub fn trace_begin(
    py: Python<'_>,
    name: &str,
    params: &Bound<'_, PyAny>,
    fixed_state_loops: Option<u32>,
    closed_over_inputs: bool,
) -> PyResult<Vec<PyTensor>> {
    let types = param_types(params)?;
    if runtime::active_tracer().is_some() {
        return Err(new_err(
            py,
            ErrorKind::ControlFlow,
            "trace_begin",
            "a function is already being traced on this thread (nested functions are inlined: \
             use trace_push for inner functions)",
        ));
    }
    let (tracer, vals) = Tracer::new(name, types);
    {
        let mut t = lock(&tracer);
        t.fixed_state_loops = fixed_state_loops;
        t.closed_over_before = closed_over_inputs.then(gradloop::tensor::id_epoch);
    }
    runtime::begin_trace(tracer);
    Ok(py_tensors(vals))
}

/// Whether a function is being traced on this thread.
#[pyfunction]
pub fn trace_active() -> bool {
    runtime::active_tracer().is_some()
}

/// Opens an inner function frame (a branch or loop function); returns its symbolic parameters.
#[pyfunction]
pub fn trace_push(
    py: Python<'_>,
    name: &str,
    params: &Bound<'_, PyAny>,
) -> PyResult<Vec<PyTensor>> {
    let types = param_types(params)?;
    let tracer = require_tracer(py, "trace_push")?;
    let vals = lock(&tracer).push_function(name, types);
    Ok(py_tensors(vals))
}

/// Closes the innermost frame with `results`; returns the traced function as a `Branch`.
#[pyfunction]
pub fn trace_pop(py: Python<'_>, results: &Bound<'_, PyAny>) -> PyResult<PyBranch> {
    let results = tensors(results)?;
    let tracer = require_tracer(py, "trace_pop")?;
    let popped = lock(&tracer).pop_function(&results).py(py)?;
    Ok(PyBranch {
        inner: Branch::from(popped),
    })
}

/// Drops the thread's active trace and all its frames (after an exception). Never fails.
#[pyfunction]
pub fn trace_abort() {
    drop(runtime::end_trace());
}

/// Finishes the trace with `results` (the entry function's results) and ends it, whether or
/// not finishing succeeds.
#[pyfunction]
pub fn trace_finish(py: Python<'_>, results: &Bound<'_, PyAny>) -> PyResult<PyConcreteFunction> {
    let results = tensors(results)?;
    let tracer = require_tracer(py, "trace_finish")?;
    runtime::end_trace();
    let traced = lock(&tracer).finish(&results).py(py)?;
    Ok(PyConcreteFunction::new(traced))
}

/// `If(pred, captures...)` over two branches traced without parameters; returns its outputs.
#[pyfunction]
pub fn emit_if(
    py: Python<'_>,
    pred: &Bound<'_, PyAny>,
    then_branch: &Bound<'_, PyBranch>,
    else_branch: &Bound<'_, PyBranch>,
) -> PyResult<Vec<PyTensor>> {
    let pred = input(pred)?;
    let (t, e) = (
        then_branch.get().inner.clone(),
        else_branch.get().inner.clone(),
    );
    run(py, 0, move |ctx| {
        gradloop::control::emit_if(ctx, &pred, &t, &e)
    })
    .map(py_tensors)
}

/// `Case(index, captures...)` over branches traced without parameters; an out-of-range index
/// runs the last branch. Returns its outputs.
#[pyfunction]
pub fn emit_case(
    py: Python<'_>,
    index: &Bound<'_, PyAny>,
    branches: Vec<Bound<'_, PyBranch>>,
) -> PyResult<Vec<PyTensor>> {
    let index = input(index)?;
    let branches: Vec<Branch> = branches.iter().map(|b| b.get().inner.clone()).collect();
    run(py, 0, move |ctx| {
        gradloop::control::emit_case(ctx, &index, &branches)
    })
    .map(py_tensors)
}

/// `While(loop_vars..., captures...)`: `cond` and `body` were traced with the loop variables'
/// types as parameters. Returns the final loop variables. With `checkpoints`, the gradient keeps
/// that many snapshots of the loop variables instead of stacks.
#[pyfunction]
#[pyo3(signature = (cond, body, loop_vars, maximum_iterations=None, parallel_iterations=10, checkpoints=None))]
pub fn emit_while(
    py: Python<'_>,
    cond: &Bound<'_, PyBranch>,
    body: &Bound<'_, PyBranch>,
    loop_vars: &Bound<'_, PyAny>,
    maximum_iterations: Option<i64>,
    parallel_iterations: u32,
    checkpoints: Option<u32>,
) -> PyResult<Vec<PyTensor>> {
    let seq = loop_vars.cast::<PySequence>()?;
    let vars: Vec<Val> = (0..seq.len()?)
        .map(|i| input(&seq.get_item(i)?))
        .collect::<PyResult<_>>()?;
    let functions = LoopFunctions {
        cond: cond.get().inner.clone(),
        body: body.get().inner.clone(),
        maximum_iterations,
        parallel_iterations,
        checkpoints,
    };
    run(py, 0, move |ctx| {
        gradloop::control::emit_while(ctx, &functions, &vars)
    })
    .map(py_tensors)
}

/// The first output of a node that has one.
pub fn first(mut outputs: gradloop::ops::Values<Val>, what: &'static str) -> gradloop::Result<Val> {
    if outputs.is_empty() {
        return Err(gradloop::Error::internal(
            what,
            "the node produced no output",
        ));
    }
    Ok(outputs.swap_remove(0))
}

/// A factorisation kernel (`gradloop::ops::factor`, named by its graph text) on `inputs`:
/// what `gl.linalg` runs eagerly where nothing traces or differentiates its operands.
#[pyfunction]
pub fn factor_kernel(
    py: Python<'_>,
    kernel: &str,
    inputs: &Bound<'_, PyAny>,
) -> PyResult<Vec<PyTensor>> {
    let op = gradloop::control::parse_kernel(kernel).py(py)?;
    let inputs = tensors(inputs)?;
    let size = inputs.iter().map(runtime::numel).sum();
    run(py, size, move |ctx| ctx.apply(&op, &inputs)).map(|v| py_tensors(v.into_vec()))
}

/// Closes the innermost frame, a custom function traced on `params` that returned `results`,
/// and calls it on `inputs` through a node whose gradient is `grad` (traced above that frame
/// on one cotangent per result) and whose tangent is `tangent` (on one tangent per parameter);
/// `refused`, where given, is why it has neither; `kernel`, where given, makes it a composite
/// (the graph text of the op the executor runs in its place). Returns the call's results.
#[pyfunction]
#[pyo3(signature = (inputs, params, results, grad=None, tangent=None, refused=None, kernel=None))]
#[allow(clippy::too_many_arguments)] // the Python call's keyword arguments, one by one
pub fn emit_custom_call(
    py: Python<'_>,
    inputs: &Bound<'_, PyAny>,
    params: &Bound<'_, PyAny>,
    results: &Bound<'_, PyAny>,
    grad: Option<&Bound<'_, PyBranch>>,
    tangent: Option<&Bound<'_, PyBranch>>,
    refused: Option<String>,
    kernel: Option<&str>,
) -> PyResult<Vec<PyTensor>> {
    let (inputs, params, results) = (tensors(inputs)?, tensors(params)?, tensors(results)?);
    let kernel = match kernel {
        Some(text) => Some(gradloop::control::parse_kernel(text).py(py)?),
        None => None,
    };
    let rules = trace::CustomRules {
        gradient: grad.map(|b| b.get().inner.clone()),
        tangent: tangent.map(|b| b.get().inner.clone()),
        refused,
        kernel,
    };
    runtime::run_closing_frame(py, move |ctx| {
        gradloop::control::emit_custom_call(ctx, &inputs, &params, &results, &rules)
    })
    .map(py_tensors)
}
