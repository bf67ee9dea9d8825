//! `gradloop._core.ForwardAccumulator`: forward mode's counterpart of `Tape`, which the Python
//! API (`gl.jvp` and the helpers built on it) drives.

use gradloop::batch::{dress, same_lanes, strip};
use gradloop::forward::{lock, AccumulatorRef, ForwardAccumulator};
use gradloop::trace::Val;
use gradloop::ErrorKind;
use pyo3::prelude::*;

use crate::errors::{new_err, IntoPyResult};
use crate::runtime;
use crate::tensor::PyTensor;

/// Tangents of values. Takes tangents only while on its thread's active stack (`push`/`pop`).
#[pyclass(frozen, name = "ForwardAccumulator", module = "gradloop._core")]
pub struct PyForwardAccumulator {
    inner: AccumulatorRef<Val>,
}

#[pymethods]
impl PyForwardAccumulator {
    #[new]
    fn new() -> Self {
        PyForwardAccumulator {
            inner: ForwardAccumulator::new_ref(),
        }
    }

    /// Gives `primal` the tangent `tangent` (a float tensor of the primal's type).
    fn watch(
        &self,
        py: Python<'_>,
        primal: &Bound<'_, PyTensor>,
        tangent: &Bound<'_, PyTensor>,
    ) -> PyResult<()> {
        // Inside `gl.vmap` the accumulator sees the batched program: both are taken off their
        // lanes, which must be the same (`gl.jvp` makes a primal lanes where its tangent is).
        let (p, primal_levels) = strip(&primal.get().inner);
        let (t, tangent_levels) = strip(&tangent.get().inner);
        if !same_lanes(&primal_levels, &tangent_levels) {
            return Err(new_err(
                py,
                ErrorKind::InvalidArgument,
                "ForwardAccumulator.watch",
                "a primal and its tangent must be batched over the same gl.vmap calls",
            ));
        }
        lock(&self.inner).watch(&p, t).py(py)
    }

    /// The tangent of `t`, or None when it has none (lanes like `t` inside `gl.vmap`).
    fn tangent(&self, py: Python<'_>, t: &Bound<'_, PyTensor>) -> PyResult<Option<PyTensor>> {
        let (p, levels) = strip(&t.get().inner);
        let tangent = lock(&self.inner).tangent(&p);
        tangent
            .map(|g| dress(g, &levels).map(PyTensor::new))
            .transpose()
            .py(py)
    }

    fn __len__(&self) -> usize {
        lock(&self.inner).len()
    }

    /// Starts taking tangents, innermost.
    fn push(&self) {
        runtime::push_accumulator(self.inner.clone(), None);
    }

    /// Stops taking tangents; returns where it stood among the tapes and accumulators (None if
    /// it was not active), for `push_at`.
    fn pop(&self) -> Option<(usize, u64)> {
        runtime::pop_accumulator(&self.inner)
    }

    /// Takes tangents again where `pop` took it from (what `pop` returned).
    fn push_at(&self, place: (usize, u64)) {
        runtime::push_accumulator(self.inner.clone(), Some(place));
    }
}

/// The accumulators taking tangents now, innermost last.
#[pyfunction]
pub fn active_accumulators() -> Vec<PyForwardAccumulator> {
    runtime::active_accumulators()
        .into_iter()
        .map(|inner| PyForwardAccumulator { inner })
        .collect()
}
