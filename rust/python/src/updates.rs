//! The data-dependent indexing ops that `Tensor.at` (`gradloop/at.py`) composes into JAX's
//! functional updates, exposed as `gradloop._core.<name>`: each converts its arguments and
//! calls the core builder. No logic lives here.

use gradloop::ops::build;
use pyo3::prelude::*;

use crate::convert::{input, inputs};
use crate::runtime::{run, work};
use crate::tensor::PyTensor;

/// Zeros with `dim_size` along `axis`, `updates` summed in at `indices` (repeats accumulate).
#[pyfunction]
pub fn scatter_add(
    py: Python<'_>,
    updates: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    axis: usize,
    dim_size: usize,
) -> PyResult<PyTensor> {
    let (u, i) = (input(updates)?, input(indices)?);
    let n = work(&[&u, &i]);
    run(py, n, move |ctx| {
        build::scatter_add(ctx, &u, &i, axis, dim_size)
    })
    .map(PyTensor::new)
}

/// The window of `sizes` at `starts` (scalar integer tensors, clamped so the window fits).
#[pyfunction]
pub fn dynamic_slice(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    starts: &Bound<'_, PyAny>,
    sizes: Vec<usize>,
) -> PyResult<PyTensor> {
    let (x, starts) = (input(x)?, inputs(starts)?);
    let n = work(&[&x]);
    run(py, n, move |ctx| {
        build::dynamic_slice(ctx, &x, &starts, &sizes)
    })
    .map(PyTensor::new)
}

/// `x` with `update` written at `starts` (scalar integer tensors, clamped so it fits).
#[pyfunction]
pub fn dynamic_update_slice(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    update: &Bound<'_, PyAny>,
    starts: &Bound<'_, PyAny>,
) -> PyResult<PyTensor> {
    let (x, update, starts) = (input(x)?, input(update)?, inputs(starts)?);
    let n = work(&[&x, &update]);
    run(py, n, move |ctx| {
        build::dynamic_update_slice(ctx, &x, &update, &starts)
    })
    .map(PyTensor::new)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scatter_add, m)?)?;
    m.add_function(wrap_pyfunction!(dynamic_slice, m)?)?;
    m.add_function(wrap_pyfunction!(dynamic_update_slice, m)?)?;
    Ok(())
}
