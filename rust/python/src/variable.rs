//! `VariableHandle`: a core variable cell. Eagerly, reads and writes act on the cell at once;
//! while tracing they become `read_variable` / `assign_variable` / `assign_add_variable` nodes
//! over the variable (captured by the traced function), and act when the function runs.

use gradloop::graph::{NodeKind, VariableOp};
use gradloop::interpret::VariableRef;
use gradloop::trace::{lock, Val};
use gradloop::{ErrorKind, Value, DYN};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{concrete_input, operand, Operand};
use crate::dtype::{py_dtype, PyDType};
use crate::errors::{new_err, IntoPyResult};
use crate::runtime::{self, run};
use crate::tensor::PyTensor;
use crate::trace::first;

/// A handle to a variable: a cell holding a tensor of a fixed dtype and shape. Handles made
/// from the same cell (e.g. `ConcreteFunction.captured_inputs`) share it.
#[pyclass(frozen, name = "VariableHandle", module = "gradloop._core")]
pub struct PyVariableHandle {
    inner: VariableRef,
}

impl PyVariableHandle {
    pub fn new(inner: VariableRef) -> Self {
        PyVariableHandle { inner }
    }

    pub fn inner(&self) -> &VariableRef {
        &self.inner
    }

    /// `obj` as a value to store: Python scalars take the variable's dtype.
    fn value(&self, py: Python<'_>, obj: &Bound<'_, PyAny>, op: &'static str) -> PyResult<Val> {
        match operand(obj)? {
            Operand::Tensor(v) => Ok(v),
            Operand::Scalar(s) => Ok(Val::Tensor(s.to_tensor(self.inner.ty().dtype, op).py(py)?)),
        }
    }

    /// Applies `kind` (an assignment) to the variable and `value`: a node while tracing, else
    /// `eager` on the cell.
    fn write(
        &self,
        py: Python<'_>,
        kind: NodeKind,
        value: Val,
        eager: fn(&VariableRef, &gradloop::Tensor) -> gradloop::Result<()>,
    ) -> PyResult<()> {
        let op = kind.name();
        if let Val::Batched(lanes) = &value {
            return Err(new_err(
                py,
                ErrorKind::InvalidArgument,
                op,
                format!(
                    "cannot assign a batched value ({} in each lane of a gl.vmap) to a \
                     Variable: it holds one value, not one per lane; return the value from the \
                     vmapped function and assign it outside",
                    lanes.ty()
                ),
            ));
        }
        if let Some(tracer) = runtime::active_tracer() {
            let resource = lock(&tracer).capture_variable(&self.inner);
            return run(py, 0, move |ctx| {
                ctx.apply_node(&kind, &[resource, value]).map(drop)
            });
        }
        let t = match value {
            Val::Tensor(t) => t,
            Val::Batched(_) => unreachable!("refused above"),
            Val::Symbol(s) => {
                return Err(new_err(
                    py,
                    ErrorKind::ControlFlow,
                    op,
                    format!(
                        "cannot store a symbolic {} tensor in a variable: no function is being \
                         traced on this thread (was the tensor kept from an earlier trace?)",
                        s.ty()
                    ),
                ))
            }
        };
        let cell = self.inner.clone();
        runtime::call(py, t.numel(), move || eager(&cell, &t))
    }
}

#[pymethods]
impl PyVariableHandle {
    /// A new variable holding `initial` (a concrete tensor), whose dtype and shape it keeps.
    #[new]
    fn py_new(initial: &Bound<'_, PyAny>) -> PyResult<Self> {
        let t = concrete_input(initial, "VariableHandle")?;
        Ok(PyVariableHandle::new(VariableRef::new(t)))
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyDType>> {
        py_dtype(py, self.inner.ty().dtype)
    }

    /// Pickles as a new variable holding the current value: a copy in the process that
    /// unpickles it, whose assignments stay there.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (PyTensor,))> {
        let value = PyTensor::new(slf.get().inner.read());
        Ok((slf.get_type().into_any(), (value,)))
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(
            py,
            self.inner
                .ty()
                .shape
                .iter()
                .map(|&d| (d != DYN).then_some(d)),
        )
    }

    /// The current value; while tracing, a `read_variable` node (the value when it runs).
    fn read(&self, py: Python<'_>) -> PyResult<PyTensor> {
        match runtime::active_tracer() {
            None => Ok(PyTensor::new(self.inner.read())),
            Some(tracer) => {
                let resource = lock(&tracer).capture_variable(&self.inner);
                run(py, 0, move |ctx| {
                    let out = ctx.apply_node(&NodeKind::Variable(VariableOp::Read), &[resource])?;
                    first(out, "read_variable")
                })
                .map(PyTensor::new)
            }
        }
    }

    /// While tracing, the variable's resource value in the trace (what tapes watch so that
    /// gradients flow through reads in branches and loop bodies); `None` otherwise.
    fn resource(&self) -> Option<PyTensor> {
        let tracer = runtime::active_tracer()?;
        let resource = lock(&tracer).capture_variable(&self.inner);
        Some(PyTensor::new(resource))
    }

    /// Stores `value` (same dtype and shape); while tracing, an `assign_variable` node.
    fn assign(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = self.value(py, value, "assign_variable")?;
        self.write(
            py,
            NodeKind::Variable(VariableOp::Assign),
            value,
            VariableRef::assign,
        )
    }

    /// Adds `delta` (broadcast to the variable's shape); while tracing, an
    /// `assign_add_variable` node.
    fn assign_add(&self, py: Python<'_>, delta: &Bound<'_, PyAny>) -> PyResult<()> {
        let delta = self.value(py, delta, "assign_add_variable")?;
        self.write(
            py,
            NodeKind::Variable(VariableOp::AssignAdd),
            delta,
            VariableRef::assign_add,
        )
    }

    /// Whether `other` is a handle to the same variable.
    fn same(&self, other: &Bound<'_, PyVariableHandle>) -> bool {
        self.inner.same(&other.get().inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "<gl.VariableHandle dtype={} shape={}>",
            self.inner.ty().dtype.name(),
            gradloop::shape::ShapeDisplay(&self.inner.ty().shape)
        )
    }
}
