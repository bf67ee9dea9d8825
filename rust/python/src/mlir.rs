//! MLIR in: the importer and gradient transform of the core, for `gradloop.mlir`.

use pyo3::prelude::*;

use crate::runtime;

/// The generic-form MLIR module `text` with a public `func.func @<function>_grad` added (the
/// gradient of `@function` with respect to its arguments `wrt`). `source` names the text in
/// error locations. Raises CompileError for ops or types the importer does not support.
#[pyfunction]
pub fn mlir_gradient_module(
    py: Python<'_>,
    text: &str,
    function: &str,
    wrt: Vec<usize>,
    source: &str,
) -> PyResult<String> {
    runtime::call(py, usize::MAX, || {
        gradloop::mlir::import::gradient_module(text, function, &wrt, source)
    })
}

/// Names of the MLIR ops the importer converts.
#[pyfunction]
pub fn mlir_supported_ops() -> Vec<&'static str> {
    gradloop::mlir::import::supported_ops().collect()
}
