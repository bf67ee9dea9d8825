//! The calls between machine code and Rust: what the code is given (`Ctx`), its signature
//! (`Entry`), and the functions it calls for what it does not compute itself.

#![allow(
    unsafe_code,
    reason = "machine code calls these with raw pointers into the run's state"
)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::dtype::Storage;
use crate::error::{Error, Result};
use crate::executor::failure::Failure;
use crate::executor::frame::steps::{address, BufferAction, RawState, State, Steps};
use crate::ops::lanes::{LaneMap, Lanes};
use crate::runtime_values::RtValue;

/// What runs the steps machine code calls back for (the stepped interpreter, on the same
/// state).
pub(crate) trait Interpreter {
    /// Step `step`, liveness included.
    fn step(&self, step: usize, iteration: i64, state: &mut State) -> Result<(), Failure>;
    /// Step `step`, a live stack push or pop.
    fn stack_step(&self, step: usize, state: &mut State) -> Result<()>;
}

/// What the machine code is given: the run's state, as raw pointers (`#[repr(C)]`: the code
/// reads the fields at their offsets).
#[repr(C)]
pub(crate) struct Ctx<'a> {
    pub raw: RawState,
    pub steps: *const Steps,
    pub interpreter: &'a dyn Interpreter,
    pub state: *mut State,
    /// The iteration a failing step ran in, or the trips made when the frame returns.
    pub iteration: i64,
    pub failure: Option<Failure>,
}

pub(super) type Entry = unsafe extern "C" fn(*mut Ctx<'_>) -> u32;

// Machine code reads a value slot as one pointer, null when empty (`Option<Box<_>>`'s layout,
// which Rust guarantees).
const _: () = assert!(std::mem::size_of::<Option<Box<RtValue>>>() == std::mem::size_of::<usize>());

/// A step's outcome for the machine code: 0, or 1 with the failure kept in `ctx`.
#[inline]
fn report(ctx: &mut Ctx, outcome: std::thread::Result<Result<(), Failure>>) -> u32 {
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(failure)) => {
            ctx.failure = Some(failure);
            1
        }
        Err(_) => {
            ctx.failure = Some(Error::internal("executor", "a step panicked").into());
            1
        }
    }
}

/// Step `step` run by the interpreter (liveness included).
pub(super) extern "C" fn run_step(ctx: *mut Ctx, step: u32, iteration: i64) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its interpreter and state
    // outlive it.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as above.
    let (interpreter, state) = (ctx.interpreter, unsafe { &mut *ctx.state });
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        interpreter.step(step as usize, iteration, state)
    }));
    report(ctx, outcome)
}

/// Step `step`, a live stack push or pop.
pub(super) extern "C" fn stack_step(ctx: *mut Ctx, step: u32) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its interpreter and state
    // outlive it.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as above.
    let (interpreter, state) = (ctx.interpreter, unsafe { &mut *ctx.state });
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        interpreter
            .stack_step(step as usize, state)
            .map_err(Failure::from)
    }));
    report(ctx, outcome)
}

/// A push of the buffer `item` onto the stack in `slot`, where it lies: 0 when done, else 1
/// with nothing changed (the general step then runs it).
pub(super) extern "C" fn push_in_place(
    slot: *mut Option<Box<RtValue>>,
    item: *const Storage,
) -> u32 {
    // SAFETY: the code passes a stack register's slot and another register's buffer: distinct
    // parts of the run's state, alive for the call.
    let (slot, item) = unsafe { (&mut *slot, &*item) };
    let pushed = catch_unwind(AssertUnwindSafe(|| match slot.as_deref_mut() {
        Some(RtValue::Stack(stack)) => stack.push_elements(item).is_ok(),
        _ => false,
    }));
    u32::from(!matches!(pushed, Ok(true)))
}

/// A pop of the stack in `slot`, where it lies, into `buffer`: 0 when done, else 1 with
/// nothing changed (the general step then runs it, and reports an empty stack).
pub(super) extern "C" fn pop_in_place(
    slot: *mut Option<Box<RtValue>>,
    buffer: *mut Storage,
) -> u32 {
    // SAFETY: as in `push_in_place`.
    let (slot, buffer) = unsafe { (&mut *slot, &mut *buffer) };
    let popped = catch_unwind(AssertUnwindSafe(|| match slot.as_deref_mut() {
        Some(RtValue::Stack(stack)) => stack.pop_packed_into(buffer),
        _ => false,
    }));
    u32::from(!matches!(popped, Ok(true)))
}

/// Step `step`'s destination kernel on the buffers at `inputs` (as many as it reads) and `out`.
pub(super) extern "C" fn call_kernel(
    ctx: *mut Ctx,
    step: u32,
    a: *const Storage,
    b: *const Storage,
    c: *const Storage,
    out: *mut Storage,
) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: the steps outlive the run.
    let steps = unsafe { &*ctx.steps };
    let step = &steps.steps[step as usize];
    let (kernel, skip) = match &step.action {
        BufferAction::Kernel(kernel) => (kernel, 0),
        BufferAction::Update(kernel) => (kernel, 1),
        _ => {
            let failure = Error::internal("executor", "a kernel call on another step").into();
            return report(ctx, Ok(Err(failure)));
        }
    };
    // SAFETY: the code passes the buffers of the step's registers: distinct `Storage`s of
    // the state, none of them the output's (an update's first input is not passed). Only
    // the step's inputs are dereferenced; the pointers past them are null.
    let input = |p: *const Storage| unsafe { &*p };
    // SAFETY: as above.
    let output = unsafe { &mut *out };
    // The code reads the output at the address it had: a kernel writes in place.
    let before = address(output);
    let outputs = std::slice::from_mut(output);
    // A fixed array per count, not a collected vector: this runs for every kernel step.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        match step.reads.len().min(3) - skip {
            0 => kernel(&[], outputs),
            1 => kernel(&[input(a)], outputs),
            2 => kernel(&[input(a), input(b)], outputs),
            _ => kernel(&[input(a), input(b), input(c)], outputs),
        }
        .map_err(Failure::from)
    }));
    let outcome = match outcome {
        Ok(Ok(())) if address(&mut outputs[0]) != before => {
            let msg = "a kernel replaced its output's buffer instead of writing into it";
            Ok(Err(Error::internal("executor", msg).into()))
        }
        other => other,
    };
    report(ctx, outcome)
}

/// Step `step`'s vector function (`BufferStep::lane_map`) of the `n` elements at `from` into
/// those at `to`: the op's kernel without its boxed closure and checks between.
pub(super) extern "C" fn map_lanes(
    ctx: *mut Ctx,
    step: u32,
    from: *const u8,
    to: *mut u8,
    n: usize,
) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: the steps outlive the run.
    let steps = unsafe { &*ctx.steps };
    let Some(map) = steps.steps[step as usize].lane_map else {
        let failure = Error::internal("executor", "a vector function's call on another step");
        return report(ctx, Ok(Err(failure.into())));
    };
    // SAFETY: the code passes the first elements of the step's input and output registers:
    // distinct buffers of `n` elements each of the map's type (the emitter checks both
    // registers' static types), aligned as their `Vec`s are.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        match map {
            LaneMap::F32(fun, scalar) => {
                let xs = std::slice::from_raw_parts(from.cast::<f32>(), n);
                let ys = std::slice::from_raw_parts_mut(to.cast::<f32>(), n);
                f32::map(fun, ys, Some(xs), &scalar);
            }
            LaneMap::F64(fun, scalar) => {
                let xs = std::slice::from_raw_parts(from.cast::<f64>(), n);
                let ys = std::slice::from_raw_parts_mut(to.cast::<f64>(), n);
                f64::map(fun, ys, Some(xs), &scalar);
            }
        }
        Ok(())
    }));
    report(ctx, outcome)
}

/// Register `from`'s value (a stack) shared into register `to` (a read before the last; the
/// last moves it by exchanging the registers' slots, inline).
pub(super) extern "C" fn share_value(ctx: *mut Ctx, from: u32, to: u32) {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its state outlives it.
    let state = unsafe { &mut *(*ctx).state };
    *state.value(to as usize) = state.value(from as usize).clone();
}

/// Drops register `reg`'s value (its last read), so a stack threaded on stays unique.
pub(super) extern "C" fn clear_value(ctx: *mut Ctx, reg: u32) {
    // SAFETY: as in `share_value`.
    let state = unsafe { &mut *(*ctx).state };
    *state.value(reg as usize) = None;
}

/// The address of a constant's first element (the frame owns it, so it does not move).
pub(super) fn address_of_elements(storage: &Storage) -> *const u8 {
    match storage {
        Storage::F32(v) => v.as_ptr().cast(),
        Storage::F64(v) => v.as_ptr().cast(),
        Storage::I32(v) => v.as_ptr().cast(),
        Storage::I64(v) => v.as_ptr().cast(),
        Storage::Bool(v) => v.as_ptr().cast(),
    }
}

/// Copies `n` bytes between two distinct buffers.
pub(super) extern "C" fn copy_bytes(to: *mut u8, from: *const u8, n: usize) {
    // SAFETY: the code passes two registers' buffers of `n` bytes each, which are distinct.
    unsafe { std::ptr::copy_nonoverlapping(from, to, n) }
}
