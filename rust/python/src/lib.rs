//! `gradloop._core`: PyO3 bindings of the gradloop core. Thin by design: argument conversion and
//! error mapping only; every rule, kernel and gradient lives in the `gradloop` crate.

use pyo3::prelude::*;

mod convert;
mod dtype;
mod errors;
mod indexing;
mod ops;
mod runtime;
mod tape;
mod tensor;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<dtype::PyDType>()?;
    m.add_class::<tape::PyTape>()?;
    for d in gradloop::DType::ALL {
        let name = if d == gradloop::DType::Bool {
            "bool_"
        } else {
            d.name()
        };
        m.add(name, dtype::py_dtype(py, d)?)?;
    }
    m.add_function(wrap_pyfunction!(dtype::as_dtype, m)?)?;
    ops::register(m)?;
    m.add_function(wrap_pyfunction!(tape::watch_on_active_tapes, m)?)?;
    m.add_function(wrap_pyfunction!(tape::any_tape_active, m)?)?;
    m.add_function(wrap_pyfunction!(tape::pause_recording, m)?)?;
    m.add_function(wrap_pyfunction!(tape::resume_recording, m)?)?;
    m.add_function(wrap_pyfunction!(tape::record_custom_gradient, m)?)?;
    Ok(())
}
