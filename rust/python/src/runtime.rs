//! Per-thread runtime: the stack of active tapes, the active trace (at most one per thread), and
//! `run`, through which every op call goes (eager execution or tracing, tape recording, panic
//! containment, GIL release for large concrete work, error conversion).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use gradloop::trace::{graph_registry, lock, TraceContext, TracerRef, Val};
use gradloop::{Context, Error, GradientRegistry, TapeContext, TapeRef};
use pyo3::prelude::*;

use crate::errors::{to_py, user_frame};

/// Work smaller than this many elements keeps the GIL: releasing it costs more than the kernel.
const RELEASE_GIL_ABOVE: usize = 1 << 14;

#[derive(Default)]
struct ThreadState {
    /// Active tapes, innermost last.
    tapes: Vec<TapeRef<Val>>,
    /// Tape stacks set aside by `pause_recording`.
    paused: Vec<Vec<TapeRef<Val>>>,
    /// The trace being built on this thread (`trace_begin` .. `trace_finish`/`trace_abort`).
    tracer: Option<TracerRef>,
}

thread_local! {
    static STATE: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

/// The registry of every op's rule plus control flow and stacks (graph mode's registry serves
/// eager values too: `Val` is concrete or symbolic).
pub fn registry() -> &'static GradientRegistry<Val> {
    static REGISTRY: OnceLock<GradientRegistry<Val>> = OnceLock::new();
    REGISTRY.get_or_init(graph_registry)
}

pub fn active_tapes() -> Vec<TapeRef<Val>> {
    STATE.with(|s| s.borrow().tapes.clone())
}

pub fn push_tape(tape: TapeRef<Val>) {
    STATE.with(|s| s.borrow_mut().tapes.push(tape));
}

/// Removes `tape` from the active stack (wherever it is: exits may interleave).
pub fn pop_tape(tape: &TapeRef<Val>) -> bool {
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

/// The trace active on this thread, if any.
pub fn active_tracer() -> Option<TracerRef> {
    STATE.with(|s| s.borrow().tracer.clone())
}

/// Makes `tracer` the thread's active trace; false (and nothing changes) if one is active.
pub fn begin_trace(tracer: TracerRef) -> bool {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.tracer.is_some() {
            return false;
        }
        s.tracer = Some(tracer);
        true
    })
}

/// Ends the thread's active trace, returning it.
pub fn end_trace() -> Option<TracerRef> {
    STATE.with(|s| s.borrow_mut().tracer.take())
}

/// Stamps the user's current source line on the nodes `tracer` adds next.
pub fn set_location(py: Python<'_>, tracer: &TracerRef) {
    let location = user_frame(py).map(|(file, line)| gradloop::graph::Location::new(file, line));
    lock(tracer).location = location;
}

/// Elements of concrete work an op over `vals` does; 0 when any is symbolic (tracing is cheap
/// and never releases the GIL).
pub fn work(vals: &[&Val]) -> usize {
    let mut n = 0usize;
    for v in vals {
        match v {
            Val::Tensor(t) => n = n.saturating_add(t.numel()),
            Val::Symbol(_) => return 0,
        }
    }
    n
}

/// Elements of `v` when concrete (0 when symbolic): see `work`.
pub fn numel(v: &Val) -> usize {
    v.as_tensor().map_or(0, |t| t.numel())
}

/// Runs `f` with a context that executes eagerly when every input is concrete and adds nodes to
/// the thread's active trace otherwise, recording on the active tapes.
///
/// `size` (concrete elements touched, see `work`) decides whether the GIL is released. Panics
/// become InternalError.
pub fn run<T: Send>(
    py: Python<'_>,
    size: usize,
    f: impl FnOnce(&mut dyn Context<Val>) -> gradloop::Result<T> + Send,
) -> PyResult<T> {
    let (tapes, tracer) = STATE.with(|s| {
        let s = s.borrow();
        (s.tapes.clone(), s.tracer.clone())
    });
    if let Some(t) = &tracer {
        set_location(py, t);
    }
    call(py, size, move || {
        let mut base = TraceContext::new(tracer);
        if tapes.is_empty() {
            f(&mut base)
        } else {
            let mut ctx = TapeContext {
                inner: &mut base,
                tapes: &tapes,
                registry: registry(),
            };
            f(&mut ctx)
        }
    })
}

/// Runs core work `f`: panics become InternalError, errors `gradloop.errors` exceptions, and
/// the GIL is released when `size` (concrete elements touched) is large.
pub fn call<T: Send>(
    py: Python<'_>,
    size: usize,
    f: impl FnOnce() -> gradloop::Result<T> + Send,
) -> PyResult<T> {
    let work = move || catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(p)));
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
