//! `gradloop.Tensor`: the Python handle of a core value — a concrete tensor, or a symbolic value
//! of a function being traced — with attributes, numpy interop, repr and Python operators
//! (which call the same op functions as `gl.add` and friends).

use gradloop::graph::ValueType;
use gradloop::ops::build;
use gradloop::trace::Val;
use gradloop::{ErrorKind, Tensor, Value, DYN};
use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::convert::{numpy_view, opt_dtype};
use crate::dtype::{py_dtype, PyDType};
use crate::errors::{new_err, not_concrete_err, symbolic_value_err};
use crate::ops;

/// An immutable, contiguous tensor held by the Rust core, or (inside `@gl.function`) a symbolic
/// tensor standing for a value of the function being traced.
#[pyclass(frozen, name = "Tensor", module = "gradloop")]
pub struct PyTensor {
    pub inner: Val,
}

impl PyTensor {
    pub fn new(inner: impl Into<Val>) -> Self {
        PyTensor {
            inner: inner.into(),
        }
    }

    /// The concrete tensor, or the symbolic-value error for operation `what`.
    pub fn concrete(&self, py: Python<'_>, what: &'static str) -> PyResult<&Tensor> {
        match &self.inner {
            Val::Tensor(t) => Ok(t),
            other => Err(not_concrete_err(py, what, other)),
        }
    }
}

fn dim(d: usize) -> Option<usize> {
    (d != DYN).then_some(d)
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

    /// The dimensions; `None` for a dimension of a symbolic tensor known only at run time.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.ty().shape.iter().map(|&d| dim(d)))
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyDType>> {
        py_dtype(py, self.inner.ty().dtype)
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ty().ndim()
    }

    /// Number of elements; `None` when a dimension is unknown (symbolic tensors).
    #[getter]
    fn size(&self) -> Option<usize> {
        dim(gradloop::shape::numel(&self.inner.ty().shape))
    }

    /// True for a symbolic tensor: a value of the function being traced (`@gl.function`).
    #[getter]
    fn is_symbolic(&self) -> bool {
        !self.inner.is_concrete()
    }

    /// The identity gradient tapes track: two Python handles of one value share it.
    #[getter]
    fn _tape_id(&self) -> u64 {
        use gradloop::Value;
        self.inner.id()
    }

    /// The tensor with its axes reversed.
    #[getter(T)]
    fn transposed(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let perm: Vec<usize> = (0..self.inner.ty().ndim()).rev().collect();
        let x = self.inner.clone();
        let size = crate::runtime::numel(&x);
        crate::runtime::run_op!(py, size, |ctx, x| build::transpose(ctx, &x, &perm))
            .map(PyTensor::new)
    }

    /// A read-only numpy array sharing the tensor's memory (no copy).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        numpy_view(slf, "Tensor.numpy")
    }

    /// Pickles as its values (a numpy array of its own), so tensors travel to other
    /// processes (`multiprocessing`, Ray); a symbolic tensor has no values and refuses.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        let values = numpy_view(slf, "pickle")?.call_method0("copy")?;
        Ok((slf.py().import("gradloop")?.getattr("tensor")?, (values,)))
    }

    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let view = numpy_view(slf, "Tensor.__array__")?;
        match (dtype.filter(|d| !d.is_none()), copy) {
            (Some(d), _) => view.call_method1("astype", (d,)),
            (None, Some(true)) => view.call_method0("copy"),
            _ => Ok(view),
        }
    }

    /// The value of a one-element tensor as a Python scalar.
    fn item<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::scalar_item(slf, "Tensor.item")
    }

    fn tolist<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        numpy_view(slf, "Tensor.tolist")?.call_method0("tolist")
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let shape = &self.inner.ty().shape;
        match shape.first() {
            None => Err(new_err(
                py,
                ErrorKind::InvalidArgument,
                "len",
                "len() of a 0-d tensor is undefined",
            )),
            Some(&DYN) => Err(symbolic_value_err(py, "len", self.inner.ty())),
            Some(&n) => Ok(n),
        }
    }

    fn __bool__(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let t = slf.get().concrete(slf.py(), "Tensor.__bool__")?;
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
        Self::scalar_item(slf, "Tensor.__float__")?.extract()
    }

    fn __int__<'py>(slf: &Bound<'py, Self>) -> PyResult<i64> {
        Self::scalar_item(slf, "Tensor.__int__")?
            .call_method0("__int__")?
            .extract()
    }

    fn __index__<'py>(slf: &Bound<'py, Self>) -> PyResult<i64> {
        if !slf.get().inner.ty().dtype.is_int() {
            return Err(new_err(
                slf.py(),
                ErrorKind::DType,
                "index",
                "only integer tensors can be used as Python indices",
            ));
        }
        Self::scalar_item(slf, "Tensor.__index__")?.extract()
    }

    fn __hash__(&self) -> u64 {
        self.inner.id()
    }

    fn __repr__<'py>(slf: &Bound<'py, Self>) -> PyResult<String> {
        if let Val::Symbol(_) = &slf.get().inner {
            return Ok(symbolic_repr(&slf.get().inner));
        }
        let np = slf.py().import("numpy")?;
        let text: String = np
            .call_method1("array_repr", (numpy_view(slf, "repr")?,))?
            .extract()?;
        Ok(text
            .replacen("array(", "tensor(", 1)
            .replace("\n      ", "\n       "))
    }

    /// The values as numpy prints them; a symbolic tensor prints its repr (it has no values).
    fn __str__<'py>(slf: &Bound<'py, Self>) -> PyResult<String> {
        if let Val::Symbol(_) = &slf.get().inner {
            return Ok(symbolic_repr(&slf.get().inner));
        }
        numpy_view(slf, "str")?.str()?.extract()
    }

    /// JAX's functional updates: `x.at[idx].set(v)`, `.add`, `.mul`, `.min`, `.max`, `.get()`
    /// (`gradloop.at`).
    #[getter]
    fn at<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("gradloop.at")?
            .getattr("IndexUpdateHelper")?
            .call1((slf,))
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
    fn __mod__<'py>(slf: &Bound<'py, Self>, o: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        composed(slf.py(), "remainder", slf.as_any(), o)
    }
    fn __rmod__<'py>(slf: &Bound<'py, Self>, o: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        composed(slf.py(), "remainder", o, slf.as_any())
    }
    fn __floordiv__<'py>(
        slf: &Bound<'py, Self>,
        o: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        composed(slf.py(), "floor_divide", slf.as_any(), o)
    }
    fn __rfloordiv__<'py>(
        slf: &Bound<'py, Self>,
        o: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        composed(slf.py(), "floor_divide", o, slf.as_any())
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

    /// numpy's method: `gl.any(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn any<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "any", args, kwargs)
    }

    /// numpy's method: `gl.all(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn all<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "all", args, kwargs)
    }

    /// numpy's method: `gl.argmax(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn argmax<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "argmax", args, kwargs)
    }

    /// numpy's method: `gl.argmin(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn argmin<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "argmin", args, kwargs)
    }

    /// numpy's method: `gl.argsort(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn argsort<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "argsort", args, kwargs)
    }

    /// numpy's method: `gl.prod(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn prod<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "prod", args, kwargs)
    }

    /// numpy's method: `gl.cumsum(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn cumsum<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "cumsum", args, kwargs)
    }

    /// numpy's method: `gl.cumprod(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn cumprod<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "reductions", "cumprod", args, kwargs)
    }

    /// numpy's method: `gl.clip(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn clip<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "elementwise", "clip", args, kwargs)
    }

    /// numpy's method: `gl.diagonal(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn diagonal<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "arrays", "diagonal", args, kwargs)
    }

    /// numpy's method: `gl.trace(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn trace<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "arrays", "trace", args, kwargs)
    }

    /// numpy's method: `gl.repeat(x, ...)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn repeat<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        numpy_method(slf, "arrays", "repeat", args, kwargs)
    }

    /// The sum over `axis`, in `dtype` when one is given (numpy's method: `np.sum(x)` calls
    /// it with `dtype` and `out`).
    #[pyo3(signature = (axis=None, dtype=None, out=None, keepdims=false))]
    fn sum(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        let x = numpy_reduction_input(slf, "sum", dtype, out)?;
        ops::sum(slf.py(), &x, axis, keepdims)
    }

    /// The mean over `axis`, in `dtype` when one is given (numpy's method, as `sum`).
    #[pyo3(signature = (axis=None, dtype=None, out=None, keepdims=false))]
    fn mean(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        let x = numpy_reduction_input(slf, "mean", dtype, out)?;
        ops::mean(slf.py(), &x, axis, keepdims)
    }

    /// The maximum over `axis` (numpy's method: `np.max(x)` calls it with `out`).
    #[pyo3(signature = (axis=None, out=None, keepdims=false))]
    fn max(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        let x = numpy_reduction_input(slf, "max", None, out)?;
        ops::max(slf.py(), &x, axis, keepdims)
    }

    /// The minimum over `axis` (numpy's method, as `max`).
    #[pyo3(signature = (axis=None, out=None, keepdims=false))]
    fn min(
        slf: &Bound<'_, Self>,
        axis: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<PyTensor> {
        let x = numpy_reduction_input(slf, "min", None, out)?;
        ops::min(slf.py(), &x, axis, keepdims)
    }

    fn astype(slf: &Bound<'_, Self>, dtype: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        ops::cast(slf.py(), slf.as_any(), dtype)
    }
}

impl PyTensor {
    /// The value of a one-element concrete tensor as a Python scalar.
    fn scalar_item<'py>(slf: &Bound<'py, Self>, what: &'static str) -> PyResult<Bound<'py, PyAny>> {
        let t = slf.get().concrete(slf.py(), what)?;
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
        numpy_view(slf, what)?.call_method0("item")
    }
}

/// What a reduction method reduces: the tensor, cast to `dtype` when one is given. `out` (which
/// numpy's functions pass to the methods) must be None: tensors are immutable.
fn numpy_reduction_input<'py>(
    slf: &Bound<'py, PyTensor>,
    op: &'static str,
    dtype: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    if out.is_some_and(|o| !o.is_none()) {
        return Err(new_err(
            py,
            ErrorKind::InvalidArgument,
            op,
            "out= is not supported: gradloop tensors are immutable, use the returned tensor",
        ));
    }
    match dtype.filter(|d| !d.is_none()) {
        Some(dtype) => Ok(Bound::new(py, ops::cast(py, slf.as_any(), dtype)?)?.into_any()),
        None => Ok(slf.as_any().clone()),
    }
}

/// `<gl.Tensor symbolic shape=(3, None) dtype=float32>`.
fn symbolic_repr(v: &Val) -> String {
    let ty = v.ty();
    let dims: Vec<String> = ty
        .shape
        .iter()
        .map(|&d| dim(d).map_or_else(|| "None".to_string(), |d| d.to_string()))
        .collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    // A captured variable or stack (seen in `Branch.captures`) is not a tensor value.
    let kind = match v.value_type() {
        ValueType::Tensor(_) => "",
        ValueType::Resource(_) => " variable",
        ValueType::Stack(_) => " stack",
    };
    format!(
        "<gl.Tensor symbolic{kind} shape={shape} dtype={}>",
        ty.dtype.name()
    )
}

/// `a % b` and `a // b`: numpy's `remainder` and `floor_divide`, which the Python API composes
/// from the op table's `rem` and `quotient` as JAX does (`gradloop.elementwise`).
/// A numpy method that is a composition in Python: `gradloop.<module>.<name>(self, *args)`.
fn numpy_method<'py>(
    slf: &Bound<'py, PyTensor>,
    module: &str,
    name: &str,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let mut all = vec![slf.clone().into_any()];
    all.extend(args.iter());
    py.import(format!("gradloop.{module}"))?
        .getattr(name)?
        .call(PyTuple::new(py, all)?, kwargs)
}

fn composed<'py>(
    py: Python<'py>,
    name: &str,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    py.import("gradloop.elementwise")?
        .getattr(name)?
        .call1((a, b))
}
