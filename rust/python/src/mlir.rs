//! MLIR in: the importer and gradient transform of the core, for `gradloop.mlir`.

use pyo3::prelude::*;

use crate::convert::concrete_input;
use crate::runtime;
use crate::tensor::PyTensor;

/// The generic-form MLIR module `text` with a public `func.func @<function>_grad` added (the
/// gradient of `@function` with respect to its arguments `wrt`). `source` names the text in
/// error locations; `checkpoints` is what every loop's gradient keeps, or else `fixed_state`
/// (fixed-size state each loop chooses, that many snapshots where nothing bounds it), or else
/// stacks; `pure_stablehlo` writes the gradient as `func` and `stablehlo` ops alone. Raises
/// CompileError for ops or types the importer does not support.
#[pyfunction]
#[pyo3(signature = (text, function, wrt, source, checkpoints=None, pure_stablehlo=false, fixed_state=None))]
#[allow(clippy::too_many_arguments)]
pub fn mlir_gradient_module(
    py: Python<'_>,
    text: &str,
    function: &str,
    wrt: Vec<usize>,
    source: &str,
    checkpoints: Option<u32>,
    pure_stablehlo: bool,
    fixed_state: Option<u32>,
) -> PyResult<String> {
    let loops = gradloop::import::LoopGradients {
        checkpoints,
        fixed_state,
    };
    runtime::call(py, usize::MAX, || {
        gradloop::import::gradient_module(text, function, &wrt, source, loops, pure_stablehlo)
    })
}

/// The generic-form MLIR module `text` with a public `func.func @<function>_jvp` added (its
/// results and their tangents along the arguments `wrt`). Errors as `mlir_gradient_module`'s.
#[pyfunction]
#[pyo3(signature = (text, function, wrt, source, pure_stablehlo=false))]
pub fn mlir_jvp_module(
    py: Python<'_>,
    text: &str,
    function: &str,
    wrt: Vec<usize>,
    source: &str,
    pure_stablehlo: bool,
) -> PyResult<String> {
    runtime::call(py, usize::MAX, || {
        gradloop::import::jvp_module(text, function, &wrt, source, pure_stablehlo)
    })
}

/// `function` of the generic-form module `text` imported and run on the graph interpreter on
/// `args` (concrete tensors): the reference semantics of a module.
#[pyfunction]
pub fn mlir_run_reference(
    py: Python<'_>,
    text: &str,
    function: &str,
    args: Vec<Bound<'_, PyAny>>,
) -> PyResult<Vec<PyTensor>> {
    let tensors = args
        .iter()
        .map(|a| concrete_input(a, "mlir_run_reference"))
        .collect::<PyResult<Vec<_>>>()?;
    let outputs = runtime::call(py, usize::MAX, || {
        gradloop::import::run_reference(text, function, tensors, "<mlir>")
    })?;
    Ok(outputs.into_iter().map(PyTensor::new).collect())
}

/// Names of the op table's ops, in table order (what graph text and `count_nodes` call them).
#[pyfunction]
pub fn op_names() -> Vec<&'static str> {
    gradloop::OpKind::ALL.iter().map(|k| k.name()).collect()
}

/// Names of the MLIR ops the importer converts.
#[pyfunction]
pub fn mlir_supported_ops() -> Vec<&'static str> {
    gradloop::import::supported_ops().collect()
}
