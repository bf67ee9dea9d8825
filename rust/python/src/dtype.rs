//! `gradloop.DType`: the Python face of a core dtype, and conversion of anything a user may pass
//! as a dtype (a DType, a name, a numpy dtype or type, Python's float/int/bool).

use gradloop::{DType, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

use crate::errors::new_err;

/// An element type: float32, float64, int32, int64 or bool.
#[pyclass(frozen, eq, hash, name = "DType", module = "gradloop")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyDType(pub DType);

#[pymethods]
impl PyDType {
    #[getter]
    fn name(&self) -> &'static str {
        self.0.name()
    }

    #[getter]
    fn is_floating(&self) -> bool {
        self.0.is_float()
    }

    #[getter]
    fn is_integer(&self) -> bool {
        self.0.is_int()
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.0.size()
    }

    /// The matching numpy dtype.
    #[getter]
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("numpy")?
            .call_method1("dtype", (numpy_name(self.0),))
    }

    fn __repr__(&self) -> String {
        format!("gradloop.{}", self.0.name())
    }

    fn __str__(&self) -> &'static str {
        self.0.name()
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, (&'static str,))> {
        Ok((
            py.import("gradloop")?.getattr("as_dtype")?,
            (self.0.name(),),
        ))
    }
}

pub fn numpy_name(dtype: DType) -> &'static str {
    dtype.name()
}

static SINGLETONS: PyOnceLock<[Py<PyDType>; 5]> = PyOnceLock::new();

/// The shared Python object for `dtype` (so `t.dtype is gl.float32` holds).
pub fn py_dtype(py: Python<'_>, dtype: DType) -> PyResult<Py<PyDType>> {
    let all = SINGLETONS.get_or_try_init(py, || -> PyResult<[Py<PyDType>; 5]> {
        Ok([
            Py::new(py, PyDType(DType::F32))?,
            Py::new(py, PyDType(DType::F64))?,
            Py::new(py, PyDType(DType::I32))?,
            Py::new(py, PyDType(DType::I64))?,
            Py::new(py, PyDType(DType::Bool))?,
        ])
    })?;
    let i = DType::ALL.iter().position(|d| *d == dtype).unwrap_or(0);
    Ok(all[i].clone_ref(py))
}

/// Any dtype spelling to a core dtype.
pub fn to_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let py = obj.py();
    if let Ok(d) = obj.cast::<PyDType>() {
        return Ok(d.get().0);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return DType::from_name(&s.to_cow()?).map_err(|e| crate::errors::to_py(py, e));
    }
    if let Ok(t) = obj.cast::<PyType>() {
        let builtins = py.import("builtins")?;
        if t.is(&builtins.getattr("float")?) {
            return Ok(DType::F32);
        }
        if t.is(&builtins.getattr("int")?) {
            return Ok(DType::I32);
        }
        if t.is(&builtins.getattr("bool")?) {
            return Ok(DType::Bool);
        }
    }
    // numpy dtypes and scalar types (np.float32, np.dtype("int64"), ...).
    let np_dtype = py.import("numpy")?.call_method1("dtype", (obj,));
    if let Ok(np_dtype) = np_dtype {
        let name: String = np_dtype.getattr("name")?.extract()?;
        return DType::from_name(&name).map_err(|e| crate::errors::to_py(py, e));
    }
    Err(new_err(
        py,
        ErrorKind::DType,
        "dtype",
        format!("cannot interpret {} as a dtype", obj.repr()?),
    ))
}

/// `as_dtype(x)`: the gradloop dtype for any dtype spelling.
#[pyfunction]
pub fn as_dtype(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<Py<PyDType>> {
    py_dtype(py, to_dtype(dtype)?)
}
