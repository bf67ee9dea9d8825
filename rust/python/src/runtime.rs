//! Per-thread eager runtime: the stack of active tapes, and `run`, through which every op call
//! goes (tape recording, panic containment, GIL release for large work, error conversion).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use gradloop::{Context, EagerContext, Error, GradientRegistry, TapeContext, TapeRef, Tensor};
use pyo3::prelude::*;

use crate::errors::to_py;

/// Work smaller than this many elements keeps the GIL: releasing it costs more than the kernel.
const RELEASE_GIL_ABOVE: usize = 1 << 14;

#[derive(Default)]
struct ThreadState {
    /// Active tapes, innermost last.
    tapes: Vec<TapeRef<Tensor>>,
    /// Tape stacks set aside by `pause_recording`.
    paused: Vec<Vec<TapeRef<Tensor>>>,
}

thread_local! {
    static STATE: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

pub fn registry() -> &'static GradientRegistry<Tensor> {
    static REGISTRY: OnceLock<GradientRegistry<Tensor>> = OnceLock::new();
    REGISTRY.get_or_init(GradientRegistry::with_op_table)
}

pub fn active_tapes() -> Vec<TapeRef<Tensor>> {
    STATE.with(|s| s.borrow().tapes.clone())
}

pub fn push_tape(tape: TapeRef<Tensor>) {
    STATE.with(|s| s.borrow_mut().tapes.push(tape));
}

/// Removes `tape` from the active stack (wherever it is: exits may interleave).
pub fn pop_tape(tape: &TapeRef<Tensor>) -> bool {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        match s
            .tapes
            .iter()
            .rposition(|t| std::sync::Arc::ptr_eq(t, tape))
        {
            Some(i) => {
                s.tapes.remove(i);
                true
            }
            None => false,
        }
    })
}

pub fn pause() -> usize {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let tapes = std::mem::take(&mut s.tapes);
        s.paused.push(tapes);
        s.paused.len()
    })
}

pub fn resume(token: usize) -> Result<(), String> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.paused.len() != token {
            return Err(format!(
                "resume_recording({token}) out of order: {} pauses are open",
                s.paused.len()
            ));
        }
        let mut tapes = s.paused.pop().unwrap_or_default();
        // Tapes pushed while paused (and not popped) stay active, innermost.
        tapes.append(&mut s.tapes);
        s.tapes = tapes;
        Ok(())
    })
}

/// Runs `f` with a context that executes eagerly and records on the active tapes.
///
/// `size` (elements touched) decides whether the GIL is released. Panics become InternalError.
pub fn run<T: Send>(
    py: Python<'_>,
    size: usize,
    f: impl FnOnce(&mut dyn Context<Tensor>) -> gradloop::Result<T> + Send,
) -> PyResult<T> {
    let tapes = active_tapes();
    let work = move || {
        catch_unwind(AssertUnwindSafe(|| {
            let mut eager = EagerContext;
            if tapes.is_empty() {
                f(&mut eager)
            } else {
                let mut ctx = TapeContext {
                    inner: &mut eager,
                    tapes: &tapes,
                    registry: registry(),
                };
                f(&mut ctx)
            }
        }))
        .unwrap_or_else(|panic| Err(panic_error(panic)))
    };
    let result = if size > RELEASE_GIL_ABOVE {
        py.detach(work)
    } else {
        work()
    };
    result.map_err(|e| to_py(py, e))
}

pub fn panic_error(panic: Box<dyn std::any::Any + Send>) -> Error {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::internal("gradloop", format!("internal error (please report): {msg}"))
}
