//! The one mapping from core errors to `gradloop.errors` exceptions, with the user's source line.

use std::cell::RefCell;

use gradloop::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

static PACKAGE_DIR: PyOnceLock<String> = PyOnceLock::new();
static GETFRAME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

thread_local! {
    /// A Python exception raised inside a callback the core invoked (a custom gradient): it is
    /// re-raised as it was instead of the core error that carried it out.
    static PENDING: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Parks a Python exception raised in a callback; returns the core error that unwinds the core.
pub fn park(err: PyErr) -> Error {
    PENDING.with(|p| *p.borrow_mut() = Some(err));
    Error::internal("callback", "a Python callback raised an exception")
}

/// The Python exception for a core error: the parked callback exception if there is one, else
/// the `gradloop.errors` class of the error's kind with the caller's file and line appended.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    if let Some(parked) = PENDING.with(|p| p.borrow_mut().take()) {
        return parked;
    }
    let message = match user_location(py) {
        Some(loc) => format!("{err} (at {loc})"),
        None => err.to_string(),
    };
    match error_class(py, err.kind.name()) {
        Ok(class) => PyErr::from_value(
            class
                .call1((message,))
                .unwrap_or_else(|e| e.into_value(py).into_bound(py).into_any()),
        ),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// A `gradloop.errors` exception of class `name` raised from the bindings themselves.
pub fn new_err(
    py: Python<'_>,
    kind: gradloop::ErrorKind,
    op: &'static str,
    message: impl Into<String>,
) -> PyErr {
    to_py(py, Error::new(kind, op, message))
}

fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("gradloop.errors")?.getattr(name)
}

/// The gradloop package directory (frames inside it are the library's, not the user's).
fn package_dir(py: Python<'_>) -> Option<&str> {
    PACKAGE_DIR
        .get_or_try_init(py, || -> PyResult<String> {
            let file: String = py.import("gradloop")?.getattr("__file__")?.extract()?;
            let dir = std::path::Path::new(&file)
                .parent()
                .map(|p| p.display().to_string());
            Ok(dir.unwrap_or_default())
        })
        .ok()
        .map(String::as_str)
}

/// File name and line of the innermost Python frame outside the gradloop package.
pub fn user_frame(py: Python<'_>) -> Option<(String, u32)> {
    let package = package_dir(py)?;
    let getframe = GETFRAME
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("sys")?.getattr("_getframe")?.unbind())
        })
        .ok()?;
    let mut frame = getframe.bind(py).call1((0,)).ok()?;
    for _ in 0..64 {
        let code = frame.getattr(intern!(py, "f_code")).ok()?;
        let file = code.getattr(intern!(py, "co_filename")).ok()?;
        let file = file.cast::<PyString>().ok()?.to_cow().ok()?;
        if package.is_empty() || !file.starts_with(package) {
            let line: u32 = frame
                .getattr(intern!(py, "f_lineno"))
                .ok()?
                .extract()
                .ok()?;
            let name = std::path::Path::new(file.as_ref())
                .file_name()
                .map(|f| f.to_string_lossy().into_owned());
            return Some((name.unwrap_or_else(|| file.into_owned()), line));
        }
        frame = frame.getattr(intern!(py, "f_back")).ok()?;
        if frame.is_none() {
            return None;
        }
    }
    None
}

/// `file:line` of the innermost Python frame outside the gradloop package.
fn user_location(py: Python<'_>) -> Option<String> {
    user_frame(py).map(|(file, line)| format!("{file}:{line}"))
}

/// `file:line` of the innermost Python frame outside the gradloop package, or `<unknown>`: the
/// one place the user's line is found, for the Python layer's messages too.
#[pyfunction(name = "user_location")]
pub fn py_user_location(py: Python<'_>) -> String {
    user_location(py).unwrap_or_else(|| "<unknown>".to_owned())
}

/// The error for reading the value of a symbolic tensor (`what` names the operation).
pub fn symbolic_value_err(py: Python<'_>, what: &'static str, ty: &gradloop::TensorType) -> PyErr {
    new_err(
        py,
        gradloop::ErrorKind::ControlFlow,
        what,
        format!(
            "this tensor ({ty}) is a symbolic tensor inside @gl.function; its value is only \
             known when the function runs — use gl.cond / gl.while_loop for data-dependent \
             control flow"
        ),
    )
}

/// The error for reading the value of `v`, which is not concrete (symbolic or batched), in
/// operation `what`.
pub fn not_concrete_err(py: Python<'_>, what: &'static str, v: &gradloop::trace::Val) -> PyErr {
    use gradloop::Value;
    match v {
        gradloop::trace::Val::Batched(lanes) => new_err(
            py,
            gradloop::ErrorKind::ControlFlow,
            what,
            format!(
                "this tensor ({}) stands for every lane of a gl.vmap, so it has no single value \
                 to read inside the vmapped function; use gl.cond / gl.switch_case / \
                 gl.while_loop for data-dependent control flow (each lane takes its own path)",
                lanes.ty()
            ),
        ),
        _ => symbolic_value_err(py, what, v.ty()),
    }
}

/// Extension trait: `result.py(py)?` converts a core result at the boundary.
pub trait IntoPyResult<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for gradloop::Result<T> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
