//! `gradloop._core`: PyO3 bindings of the gradloop core. Thin by design: argument conversion and
//! error mapping only; every rule, kernel and gradient lives in the `gradloop` crate.

use pyo3::prelude::*;

mod batch;
mod convert;
mod dtype;
mod errors;
mod forward;
mod function;
mod indexing;
mod mlir;
mod ops;
mod runtime;
mod tape;
mod tensor;
mod trace;
mod updates;
mod variable;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // The allocator's reserve, so that memory running out in a kernel is an error, not an abort.
    gradloop::memory::arm();
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    if threading.call_method0("current_thread")?.is(&main) {
        gradloop::pool::adopt_current_thread();
    }
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<dtype::PyDType>()?;
    m.add_class::<tape::PyTape>()?;
    m.add_class::<forward::PyForwardAccumulator>()?;
    m.add_function(wrap_pyfunction!(forward::active_accumulators, m)?)?;
    m.add_class::<trace::PyBranch>()?;
    m.add_class::<function::PyConcreteFunction>()?;
    m.add_class::<function::PyGraph>()?;
    m.add_class::<function::PyLoweredGraph>()?;
    m.add_function(wrap_pyfunction!(function::set_graph_runner, m)?)?;
    m.add_function(wrap_pyfunction!(function::graph_runner, m)?)?;
    m.add_function(wrap_pyfunction!(function::set_compiled_frames, m)?)?;
    m.add_function(wrap_pyfunction!(function::compiled_frames, m)?)?;
    m.add_function(wrap_pyfunction!(function::set_flush_subnormals, m)?)?;
    m.add_function(wrap_pyfunction!(function::flushes_subnormals, m)?)?;
    m.add_function(wrap_pyfunction!(function::frame_statistics, m)?)?;
    m.add_function(wrap_pyfunction!(function::set_fused_passes, m)?)?;
    m.add_function(wrap_pyfunction!(function::fused_passes, m)?)?;
    m.add_function(wrap_pyfunction!(function::loop_trips, m)?)?;
    m.add_function(wrap_pyfunction!(function::executor_threads, m)?)?;
    m.add_class::<variable::PyVariableHandle>()?;
    for d in gradloop::DType::ALL {
        let name = if d == gradloop::DType::Bool {
            "bool_"
        } else {
            d.name()
        };
        m.add(name, dtype::py_dtype(py, d)?)?;
    }
    m.add_function(wrap_pyfunction!(dtype::as_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(errors::py_user_location, m)?)?;
    ops::register(m)?;
    updates::register(m)?;
    m.add_function(wrap_pyfunction!(tape::watch_on_active_tapes, m)?)?;
    m.add_function(wrap_pyfunction!(tape::any_tape_active, m)?)?;
    m.add_function(wrap_pyfunction!(tape::recording_tape_keys, m)?)?;
    m.add_function(wrap_pyfunction!(tape::any_tape_records, m)?)?;
    m.add_function(wrap_pyfunction!(tape::mode, m)?)?;
    m.add_function(wrap_pyfunction!(tape::pause_recording, m)?)?;
    m.add_function(wrap_pyfunction!(tape::resume_recording, m)?)?;
    m.add_function(wrap_pyfunction!(tape::record_custom_gradient, m)?)?;
    for f in [
        wrap_pyfunction!(batch::vmap_begin, m)?,
        wrap_pyfunction!(batch::vmap_end, m)?,
        wrap_pyfunction!(batch::vmap_levels, m)?,
        wrap_pyfunction!(batch::vmap_suspend, m)?,
        wrap_pyfunction!(batch::vmap_resume, m)?,
        wrap_pyfunction!(batch::vmap_lanes, m)?,
        wrap_pyfunction!(batch::lanes_wrap, m)?,
        wrap_pyfunction!(batch::lanes_unwrap, m)?,
        wrap_pyfunction!(batch::lanes_levels, m)?,
        wrap_pyfunction!(batch::lanes_narrow, m)?,
        wrap_pyfunction!(batch::lanes_stand_in, m)?,
        wrap_pyfunction!(batch::lanes_widen, m)?,
        wrap_pyfunction!(trace::trace_begin, m)?,
        wrap_pyfunction!(trace::trace_active, m)?,
        wrap_pyfunction!(trace::trace_push, m)?,
        wrap_pyfunction!(trace::trace_pop, m)?,
        wrap_pyfunction!(trace::trace_abort, m)?,
        wrap_pyfunction!(trace::trace_finish, m)?,
        wrap_pyfunction!(trace::emit_if, m)?,
        wrap_pyfunction!(trace::emit_case, m)?,
        wrap_pyfunction!(trace::emit_while, m)?,
        wrap_pyfunction!(trace::emit_custom_call, m)?,
        wrap_pyfunction!(trace::factor_kernel, m)?,
        wrap_pyfunction!(mlir::mlir_gradient_module, m)?,
        wrap_pyfunction!(mlir::mlir_jvp_module, m)?,
        wrap_pyfunction!(mlir::mlir_run_reference, m)?,
        wrap_pyfunction!(mlir::op_names, m)?,
        wrap_pyfunction!(mlir::mlir_supported_ops, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
