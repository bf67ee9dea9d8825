//! `gradloop.Tensor`: the Python handle of a core tensor — attributes, numpy interop, repr and
//! Python operators (which call the same op functions as `gl.add` and friends).

use gradloop::ops::build;
use gradloop::{ErrorKind, Tensor};
use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{numpy_view, opt_dtype};
use crate::dtype::{py_dtype, PyDType};
use crate::errors::new_err;
use crate::ops;

/// An immutable, contiguous tensor held by the Rust core.
#[pyclass(frozen, name = "Tensor", module = "gradloop")]
pub struct PyTensor {
    pub inner: Tensor,
}

impl PyTensor {
    pub fn new(inner: Tensor) -> Self {
        PyTensor { inner }
    }
}

#[pymethods]
impl PyTensor {
    /// `Tensor(data, dtype=None)`: the same as `gl.tensor(data, dtype)`.
    #[new]
    #[pyo3(signature = (data, dtype=None))]
    fn py_new(data: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(crate::convert::to_tensor(
            data,
            opt_dtype(dtype)?,
        )?))
    }

    /// numpy defers binary operators to a Tensor operand (so `array + tensor` is a Tensor).
    #[classattr]
    fn __array_priority__() -> f64 {
        1000.0
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyDType>> {
        py_dtype(py, self.inner.dtype())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.numel()
    }

    /// The tensor with its axes reversed.
    #[getter(T)]
    fn transposed(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let perm: Vec<usize> = (0..self.inner.ndim()).rev().collect();
        let x = self.inner.clone();
        crate::runtime::run(py, x.numel(), move |ctx| build::transpose(ctx, &x, &perm))
            .map(PyTensor::new)
    }

    /// A read-only numpy array sharing the tensor's memory (no copy).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        numpy_view(slf)
    }

    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = numpy_view(slf)?;
        match (dtype.filter(|d| !d.is_none()), copy) {
            (Some(d), _) => view.call_method1("astype", (d,)),
            (None, Some(true)) => view.call_method0("copy"),
            _ => Ok(view),
        }
    }

    /// The value of a one-element tensor as a Python scalar.
    fn item<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let t = &slf.get().inner;
        if t.numel() != 1 {
            return Err(new_err(
                slf.py(),
                ErrorKind::Shape,
                "item",
                format!(
                    "only one-element tensors can be converted to Python scalars, got shape {:?}",
                    t.shape()
                ),
            ));
        }
        numpy_view(slf)?.call_method0("item")
    }

    fn tolist<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        numpy_view(slf)?.call_method0("tolist")
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.shape().first().copied().ok_or_else(|| {
            new_err(
                py,
                ErrorKind::InvalidArgument,
                "len",
                "len() of a 0-d tensor is undefined",
            )
        })
    }

    fn __bool__(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let t = &slf.get().inner;
        if t.numel() != 1 {
            return Err(new_err(
                slf.py(),
                ErrorKind::InvalidArgument,
                "bool",
                format!(
                    "the truth value of a tensor with {} elements is ambiguous; use gl.cond for data-dependent branches",
                    t.numel()
                ),
            ));
        }
        Ok(t.to_f64_vec()[0] != 0.0)
    }

    fn __float__<'py>(slf: &Bound<'py, Self>) -> PyResult<f64> {
        Self::item(slf)?.extract()
    }

    fn __int__<'py>(slf: &Bound<'py, Self>) -> PyResult<i64> {
        Self::item(slf)?.call_method0("__int__")?.extract()
    }

    fn __index__<'py>(slf: &Bound<'py, Self>) -> PyResult<i64> {
        if !slf.get().inner.dtype().is_int() {
            return Err(new_err(
                slf.py(),
                ErrorKind::DType,
                "index",
                "only integer tensors can be used as Python indices",
            ));
        }
        Self::item(slf)?.extract()
    }

    fn __hash__(&self) -> u64 {
        self.inner.id()
    }

    fn __repr__<'py>(slf: &Bound<'py, Self>) -> PyResult<String> {
        let np = slf.py().import("numpy")?;
        let text: String = np
            .call_method1("array_repr", (numpy_view(slf)?,))?
            .extract()?;
        Ok(text
            .replacen("array(", "tensor(", 1)
            .replace("\n      ", "\n       "))
    }

    fn __str__<'py>(slf: &Bound<'py, Self>) -> PyResult<String> {
        numpy_view(slf)?.str()?.extract()
    }

    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        crate::indexing::getitem(py, &self.inner, index)
    }

    fn __add__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::add(slf.py(), slf.as_any(), o)
    }
    fn __radd__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::add(slf.py(), o, slf.as_any())
    }
    fn __sub__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::sub(slf.py(), slf.as_any(), o)
    }
    fn __rsub__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::sub(slf.py(), o, slf.as_any())
    }
    fn __mul__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::mul(slf.py(), slf.as_any(), o)
    }
    fn __rmul__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::mul(slf.py(), o, slf.as_any())
    }
    fn __truediv__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::div(slf.py(), slf.as_any(), o)
    }
    fn __rtruediv__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::div(slf.py(), o, slf.as_any())
    }
    fn __pow__(
        slf: &Bound<'_, Self>,
        o: &Bound<'_, PyAny>,
        _modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        ops::pow(slf.py(), slf.as_any(), o)
    }
    fn __rpow__(
        slf: &Bound<'_, Self>,
        o: &Bound<'_, PyAny>,
        _modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        ops::pow(slf.py(), o, slf.as_any())
    }
    fn __matmul__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::matmul(slf.py(), slf.as_any(), o)
    }
    fn __rmatmul__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::matmul(slf.py(), o, slf.as_any())
    }
    fn __and__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::logical_and(slf.py(), slf.as_any(), o)
    }
    fn __rand__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::logical_and(slf.py(), o, slf.as_any())
    }
    fn __or__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::logical_or(slf.py(), slf.as_any(), o)
    }
    fn __ror__(slf: &Bound<'_, Self>, o: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::logical_or(slf.py(), o, slf.as_any())
    }
    fn __neg__(slf: &Bound<'_, Self>) -> PyResult<PyTensor> {
        ops::neg(slf.py(), slf.as_any())
    }
    fn __pos__(&self) -> PyTensor {
        PyTensor::new(self.inner.clone())
    }
    fn __abs__(slf: &Bound<'_, Self>) -> PyResult<PyTensor> {
        ops::abs(slf.py(), slf.as_any())
    }
    fn __invert__(slf: &Bound<'_, Self>) -> PyResult<PyTensor> {
        ops::logical_not(slf.py(), slf.as_any())
    }

    fn __richcmp__(
        slf: &Bound<'_, Self>,
        o: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let (py, a) = (slf.py(), slf.as_any());
        // `t == None` is plain Python identity, not an elementwise op.
        if o.is_none() {
            return Ok(py.NotImplemented());
        }
        let result = match op {
            CompareOp::Lt => ops::less(py, a, o),
            CompareOp::Le => ops::less_equal(py, a, o),
            CompareOp::Gt => ops::greater(py, a, o),
            CompareOp::Ge => ops::greater_equal(py, a, o),
            CompareOp::Eq => ops::equal(py, a, o),
            CompareOp::Ne => ops::not_equal(py, a, o),
        }?;
        Ok(Py::new(py, result)?.into_any())
    }

    /// `t.reshape(2, 3)` or `t.reshape((2, 3))`; one dimension may be -1.
    #[pyo3(signature = (*shape))]
    fn reshape(slf: &Bound<'_, Self>, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let shape =
            if shape.len() == 1 && !shape.get_item(0)?.is_instance_of::<pyo3::types::PyInt>() {
                shape.get_item(0)?
            } else {
                shape.clone().into_any()
            };
        ops::reshape(slf.py(), slf.as_any(), &shape)
    }

    #[pyo3(signature = (*axes))]
    fn transpose(slf: &Bound<'_, Self>, axes: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let axes = match axes.len() {
            0 => None,
            1 if !axes.get_item(0)?.is_instance_of::<pyo3::types::PyInt>() => {
                Some(axes.get_item(0)?)
            }
            _ => Some(axes.clone().into_any()),
        };
        ops::transpose(slf.py(), slf.as_any(), axes.as_ref())
    }

    #[pyo3(signature = (axis=None, keepdims=false))]
    fn sum(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        ops::sum(slf.py(), slf.as_any(), axis, keepdims)
    }

    #[pyo3(signature = (axis=None, keepdims=false))]
    fn mean(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        ops::mean(slf.py(), slf.as_any(), axis, keepdims)
    }

    #[pyo3(signature = (axis=None, keepdims=false))]
    fn max(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        ops::max(slf.py(), slf.as_any(), axis, keepdims)
    }

    #[pyo3(signature = (axis=None, keepdims=false))]
    fn min(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        ops::min(slf.py(), slf.as_any(), axis, keepdims)
    }

    fn astype(slf: &Bound<'_, Self>, dtype: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::cast(slf.py(), slf.as_any(), dtype)
    }
}
