//! `gl.vmap`'s hooks: batching levels and the lane views of tensors (the batching rules live in
//! the core: `gradloop::batch` and each op's `OpDef::batch`).

use gradloop::batch::{lanes_at, new_level, strip, Lanes};
use pyo3::prelude::*;

use crate::errors::IntoPyResult;
use crate::runtime;
use crate::tensor::PyTensor;

/// Starts a batching level (one `vmap` call), innermost; returns it.
#[pyfunction]
pub fn vmap_begin() -> u64 {
    let level = new_level();
    runtime::push_batch_level(level);
    level
}

/// Ends batching level `level`; false when it was not active.
#[pyfunction]
pub fn vmap_end(level: u64) -> bool {
    runtime::pop_batch_level(level)
}

/// The active batching levels, innermost last.
#[pyfunction]
pub fn vmap_levels() -> Vec<u64> {
    runtime::batch_levels()
}

/// One lane's view of `t`, whose axis 0 holds the lanes of `level`.
#[pyfunction]
pub fn lanes_wrap(py: Python<'_>, t: &Bound<'_, PyTensor>, level: u64) -> PyResult<PyTensor> {
    Lanes::wrap(t.get().inner.clone(), level)
        .py(py)
        .map(PyTensor::new)
}

/// Every lane of `t` (lanes along axis 0) if `t` is batched at `level`, else None.
#[pyfunction]
pub fn lanes_unwrap(t: &Bound<'_, PyTensor>, level: u64) -> Option<PyTensor> {
    lanes_at(&t.get().inner, level).map(|lanes| PyTensor::new(lanes.physical.clone()))
}

/// The levels `t` is batched at, innermost `vmap` first.
#[pyfunction]
pub fn lanes_levels(t: &Bound<'_, PyTensor>) -> Vec<u64> {
    strip(&t.get().inner).1.into_vec()
}
