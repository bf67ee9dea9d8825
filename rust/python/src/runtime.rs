//! The thread-local handle on the core's `Runtime` (tapes and trace; it decides how an op runs),
//! and `run`, through which every op call goes (panic containment, GIL release for large
//! concrete work, error conversion).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use gradloop::batch::{LaneSet, Narrowing};

use gradloop::forward::AccumulatorRef;
use gradloop::front_end::{Mode, Phase, Runtime};
use gradloop::trace::{lock, TracerRef, Val};
use gradloop::{Context, EagerContext, Error, TapeRef, Tensor};
use pyo3::prelude::*;

use crate::errors::{to_py, user_frame};

/// Work smaller than this many elements keeps the GIL: releasing it costs more than the kernel.
const RELEASE_GIL_ABOVE: usize = 1 << 14;

thread_local! {
    /// This thread's tapes and trace: the bindings' only state (the core decides with it).
    static RUNTIME: RefCell<Runtime> = RefCell::new(Runtime::default());
}

pub fn active_tapes() -> Vec<TapeRef<Val>> {
    RUNTIME.with(|r| r.borrow().tapes().to_vec())
}

pub fn push_tape(tape: TapeRef<Val>) {
    RUNTIME.with(|r| r.borrow_mut().push_tape(tape));
}

/// Removes `tape` from the active stack (wherever it is: exits may interleave).
pub fn pop_tape(tape: &TapeRef<Val>) -> bool {
    RUNTIME.with(|r| r.borrow_mut().pop_tape(tape))
}

pub fn active_accumulators() -> Vec<AccumulatorRef<Val>> {
    RUNTIME.with(|r| r.borrow().accumulators().to_vec())
}

/// Makes `acc` take tangents: innermost, or back where `pop_accumulator` took it from.
pub fn push_accumulator(acc: AccumulatorRef<Val>, place: Option<(usize, u64)>) {
    RUNTIME.with(|r| r.borrow_mut().push_accumulator(acc, place));
}

/// Stops `acc` taking tangents; where it stood, None when it was not active.
pub fn pop_accumulator(acc: &AccumulatorRef<Val>) -> Option<(usize, u64)> {
    RUNTIME.with(|r| r.borrow_mut().pop_accumulator(acc))
}

/// Starts batching level `level` (a `vmap` call), innermost.
pub fn push_batch_level(level: u64, count: usize) {
    RUNTIME.with(|r| r.borrow_mut().push_batch_level(level, count));
}

/// Makes `set`'s level active again over `set` (a gradient function of a `vmap` level that
/// has ended), innermost.
pub fn push_batch_set(set: Arc<LaneSet>) {
    RUNTIME.with(|r| r.borrow_mut().push_batch_set(set));
}

/// Makes `set` the current lanes of its (active) level.
pub fn set_batch_set(set: Arc<LaneSet>) {
    RUNTIME.with(|r| r.borrow_mut().set_batch_set(set));
}

/// Sets every active batching level aside (`Runtime::suspend_batch_levels`).
pub fn suspend_batch_levels() {
    RUNTIME.with(|r| r.borrow_mut().suspend_batch_levels());
}

/// Makes the levels set aside last active again; false when none were.
pub fn resume_batch_levels() -> bool {
    RUNTIME.with(|r| r.borrow_mut().resume_batch_levels())
}

/// Ends batching level `level`; false when it was not active.
pub fn pop_batch_level(level: u64) -> bool {
    RUNTIME.with(|r| r.borrow_mut().pop_batch_level(level))
}

/// The active batching levels' current lanes, innermost last.
pub fn batch_levels() -> Vec<Arc<LaneSet>> {
    RUNTIME.with(|r| r.borrow().batch_levels().to_vec())
}

/// Narrows `level`'s current lanes (`Runtime::narrow_batch_level`).
pub fn narrow_batch_level(
    level: u64,
    narrowing: Narrowing,
    shortcut: Option<(Arc<LaneSet>, Val)>,
) -> bool {
    RUNTIME.with(|r| {
        r.borrow_mut()
            .narrow_batch_level(level, narrowing, shortcut)
    })
}

/// Undoes the last narrowing of `level`.
pub fn widen_batch_level(level: u64) -> bool {
    RUNTIME.with(|r| r.borrow_mut().widen_batch_level(level))
}

pub fn pause() -> usize {
    RUNTIME.with(|r| r.borrow_mut().pause())
}

/// Sets aside the tapes pushed after `level` (`Runtime::pause_above`).
pub fn pause_above(level: u64) -> usize {
    RUNTIME.with(|r| r.borrow_mut().pause_above(level))
}

/// The recording tapes pushed after `level`, innermost last.
pub fn tapes_above(level: u64) -> Vec<TapeRef<Val>> {
    RUNTIME.with(|r| r.borrow().tapes_above(level).to_vec())
}

pub fn resume(token: usize) -> gradloop::Result<()> {
    RUNTIME.with(|r| r.borrow_mut().resume(token))
}

/// What this thread is doing (`Runtime::phase`).
pub fn phase() -> Phase {
    RUNTIME.with(|r| r.borrow().phase())
}

/// The trace active on this thread, if any.
pub fn active_tracer() -> Option<TracerRef> {
    RUNTIME.with(|r| r.borrow().tracer().cloned())
}

/// Makes `tracer` the thread's active trace; false (and nothing changes) if one is active.
pub fn begin_trace(tracer: TracerRef) -> bool {
    RUNTIME.with(|r| r.borrow_mut().begin_trace(tracer))
}

/// Ends the thread's active trace, returning it.
pub fn end_trace() -> Option<TracerRef> {
    RUNTIME.with(|r| r.borrow_mut().end_trace())
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
            Val::Symbol(_) | Val::Batched(_) => return 0,
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
    let mode = RUNTIME.with(|r| r.borrow().mode(false));
    run_in(py, size, mode, f)
}

/// `run` for a node that closes the innermost traced frame and joins the one around it
/// (`Runtime::mode_closing_frame`).
pub fn run_closing_frame<T: Send>(
    py: Python<'_>,
    f: impl FnOnce(&mut dyn Context<Val>) -> gradloop::Result<T> + Send,
) -> PyResult<T> {
    let mode = RUNTIME.with(|r| r.borrow().mode_closing_frame());
    run_in(py, 0, mode, f)
}

fn run_in<T: Send>(
    py: Python<'_>,
    size: usize,
    mode: Mode,
    f: impl FnOnce(&mut dyn Context<Val>) -> gradloop::Result<T> + Send,
) -> PyResult<T> {
    if let Mode::Traced {
        tracer: Some(t), ..
    } = &mode
    {
        set_location(py, t);
    }
    call(py, size, move || mode.run(f))
}

/// Whether an op over `inputs` may take the eager fast path: nothing traces or records on this
/// thread and every input is concrete.
///
/// `TraceContext` over concrete values without a trace only executes kernels; running the same
/// builder on `EagerContext` over plain tensors does exactly that, without converting every
/// input and output between `Val` and `Tensor` (the eager hot path).
pub fn eager_ok<const N: usize>(inputs: &[Val; N]) -> bool {
    let concrete = inputs.iter().all(Val::is_concrete);
    concrete && phase() == Phase::Eager
}

/// Runs a builder on `EagerContext` over the tensors of `inputs` (all concrete: `eager_ok`).
pub fn run_eager<const N: usize, T: Into<Val>>(
    py: Python<'_>,
    size: usize,
    inputs: [Val; N],
    f: impl FnOnce(&mut dyn Context<Tensor>, [Tensor; N]) -> gradloop::Result<T> + Send,
) -> PyResult<Val> {
    call(py, size, move || {
        let tensors = inputs.map(|v| match v {
            Val::Tensor(t) => t,
            Val::Symbol(_) | Val::Batched(_) => {
                unreachable!("run_eager takes concrete inputs (eager_ok)")
            }
        });
        f(&mut EagerContext, tensors).map(Into::into)
    })
}

/// Calls a core builder over op inputs (the named `Val` variables): through `run` (a
/// `Context<Val>`: eager or traced, recorded by tapes), or, when `eager_ok`, through
/// `run_eager` with the same body over plain tensors. Evaluates to `PyResult<Val>`.
macro_rules! run_op {
    ($py:expr, $size:expr, |$ctx:ident $(, $v:ident)*| $body:expr) => {{
        let size: usize = $size;
        let inputs = [$($v),*];
        if $crate::runtime::eager_ok(&inputs) {
            $crate::runtime::run_eager($py, size, inputs, move |$ctx, [$($v),*]| $body)
        } else {
            let [$($v),*] = inputs;
            $crate::runtime::run($py, size, move |$ctx| $body)
        }
    }};
}
pub(crate) use run_op;

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
