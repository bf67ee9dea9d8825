//! A compiled frame's steps as machine code, made with Cranelift at the frame's first run.
//!
//! ```text
//!   per step, in the steps' order, the same work `CompiledFrame::step` does:
//!     liveness     live bits (per register) and dead bits (per node read as a control) are
//!                  bytes of the run's `State`, read and written in place
//!     merge, switch, pass, no-op   inline: a move swaps two registers' buffer indices, a
//!                  copy copies the buffer's bytes
//!     small elementwise op         inline (`elementwise`): loads, one instruction, stores
//!     other ops                    a call of the op's destination kernel on its buffers
//!     constants                    their elements copied from the frame's own
//!     stack pushes and pops        a call of the push or pop
//!     nested loops                 a call of `CompiledFrame::step` itself
//!     a move of a value (a stack)  a call that moves it between registers
//!   the loop: native control flow around the steps, until no value is carried
//! ```
//!
//! Everything the code reads and writes is the `State` the interpreted steps use, so a step
//! called back into Rust sees what the code did before it and the reverse: both ways of
//! running a frame compute the same bits (check mode compares them with the program). What
//! cannot be compiled (Cranelift refuses the function, too many steps) runs as before.

#![allow(
    unsafe_code,
    reason = "machine code is entered through a function pointer and calls back with raw pointers"
)]

mod elementwise;
mod emit;
#[cfg(test)]
mod tests;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cranelift_jit::JITModule;

pub(crate) use elementwise::Elementwise;

use super::compiled_frame::{BufferAction, CompiledFrame, State};
use super::kernel::Failure;
use crate::dtype::Storage;
use crate::error::Error;
use crate::runtime_values::RtValue;

/// What the machine code is given: the run's state, as raw pointers (`#[repr(C)]`: the code
/// reads the fields at their offsets).
#[repr(C)]
pub(super) struct Ctx {
    live: *mut bool,
    dead: *mut bool,
    phys: *mut u32,
    /// Per buffer, the address of its first element.
    data: *const usize,
    buffers: *mut Storage,
    /// Per slot, `Option<Box<RtValue>>`: a pointer, null when empty.
    values: *mut Option<Box<RtValue>>,
    frame: *const CompiledFrame,
    state: *mut State,
    /// The iteration a failing step ran in.
    iteration: i64,
    failure: Option<Failure>,
}

type Entry = unsafe extern "C" fn(*mut Ctx) -> u32;

// Machine code reads a value slot as one pointer, null when empty (`Option<Box<_>>`'s layout,
// which Rust guarantees).
const _: () = assert!(std::mem::size_of::<Option<Box<RtValue>>>() == std::mem::size_of::<usize>());

/// A frame's machine code, and the memory that holds it.
pub(crate) struct NativeCode {
    entry: Entry,
    module: Option<JITModule>,
}

// SAFETY: the code is immutable once finalised and reentrant (each run passes its own `Ctx`);
// the module is only touched again when the code is dropped.
unsafe impl Send for NativeCode {}
// SAFETY: as above: shared references only call the finished code.
unsafe impl Sync for NativeCode {}

impl Drop for NativeCode {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: the code is no longer reachable: its only pointer is this value's.
            unsafe { module.free_memory() };
        }
    }
}

impl NativeCode {
    /// The frame's steps as machine code, or `None` where they stay interpreted.
    pub fn compile(frame: &CompiledFrame) -> Option<NativeCode> {
        catch_unwind(AssertUnwindSafe(|| emit::compile(frame)))
            .ok()
            .flatten()
    }

    /// Runs the frame's steps on `state` (its inputs loaded, its dead bits cleared).
    pub fn run(&self, frame: &CompiledFrame, state: &mut State) -> Result<(), Failure> {
        // Refilled each run, without allocating: a buffer's address is stable while it is not
        // replaced, which a run never does but nothing between runs promises.
        let State { buffers, data, .. } = &mut *state;
        data.clear();
        data.extend(buffers.iter_mut().map(address));
        let state_ptr: *mut State = state;
        // SAFETY: every pointer is derived from `state_ptr` and used only during this call;
        // the vectors behind them are not resized while the code runs (steps only index them).
        let mut ctx = unsafe {
            Ctx {
                live: (*state_ptr).live.as_mut_ptr(),
                dead: (*state_ptr).dead.as_mut_ptr(),
                phys: (*state_ptr).phys.as_mut_ptr(),
                data: (*state_ptr).data.as_ptr(),
                buffers: (*state_ptr).buffers.as_mut_ptr(),
                values: (*state_ptr).values.as_mut_ptr(),
                frame,
                state: state_ptr,
                iteration: 0,
                failure: None,
            }
        };
        // SAFETY: `entry` was compiled for this frame's steps and registers, which `ctx`'s
        // arrays cover (the state was made for this frame).
        let code = unsafe { (self.entry)(&mut ctx) };
        if code == 0 {
            return Ok(());
        }
        let step = &frame.steps[code as usize - 1];
        let mut failure = ctx
            .failure
            .take()
            .unwrap_or_else(|| Error::internal("executor", "native code failed silently").into());
        failure.inside(
            &frame.fused.nodes[step.node],
            frame.fused.repeats.then_some(ctx.iteration),
        );
        Err(failure)
    }
}

/// The address of a buffer's first element.
pub(super) fn address(buffer: &mut Storage) -> usize {
    match buffer {
        Storage::F32(v) => v.as_mut_ptr() as usize,
        Storage::F64(v) => v.as_mut_ptr() as usize,
        Storage::I32(v) => v.as_mut_ptr() as usize,
        Storage::I64(v) => v.as_mut_ptr() as usize,
        Storage::Bool(v) => v.as_mut_ptr() as usize,
    }
}

/// A step's outcome for the machine code: 0, or 1 with the failure kept in `ctx`.
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

/// Step `step` run by `CompiledFrame::step` (liveness included).
extern "C" fn run_step(ctx: *mut Ctx, step: u32, iteration: i64) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its frame and state outlive it.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as above.
    let (frame, state) = unsafe { (&*ctx.frame, &mut *ctx.state) };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        frame.step_outlined(&frame.steps[step as usize], iteration, state)
    }));
    report(ctx, outcome)
}

/// Step `step`, a live stack push or pop.
extern "C" fn stack_step(ctx: *mut Ctx, step: u32) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its frame and state outlive it.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as above.
    let (frame, state) = unsafe { (&*ctx.frame, &mut *ctx.state) };
    let step = &frame.steps[step as usize];
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        match step.action {
            BufferAction::Push => frame.push(step, state),
            BufferAction::Pop => frame.pop(step, state),
            _ => Err(Error::internal("executor", "a stack call on another step")),
        }
        .map_err(Failure::from)
    }));
    report(ctx, outcome)
}

/// A push of the buffer `item` onto the stack in `slot`, where it lies: 0 when done, else 1
/// with nothing changed (the general step then runs it).
extern "C" fn push_in_place(slot: *mut Option<Box<RtValue>>, item: *const Storage) -> u32 {
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
extern "C" fn pop_in_place(slot: *mut Option<Box<RtValue>>, buffer: *mut Storage) -> u32 {
    // SAFETY: as in `push_in_place`.
    let (slot, buffer) = unsafe { (&mut *slot, &mut *buffer) };
    let popped = catch_unwind(AssertUnwindSafe(|| match slot.as_deref_mut() {
        Some(RtValue::Stack(stack)) => stack.pop_packed_into(buffer),
        _ => false,
    }));
    u32::from(!matches!(popped, Ok(true)))
}

/// Step `step`'s destination kernel on the buffers at `inputs` (as many as it reads) and `out`.
extern "C" fn call_kernel(
    ctx: *mut Ctx,
    step: u32,
    a: *const Storage,
    b: *const Storage,
    c: *const Storage,
    out: *mut Storage,
) -> u32 {
    // SAFETY: `ctx` is the live `Ctx` of the run that called.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: the frame outlives the run.
    let frame = unsafe { &*ctx.frame };
    let step = &frame.steps[step as usize];
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
    let outputs = std::slice::from_mut(unsafe { &mut *out });
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
    report(ctx, outcome)
}

/// Register `from`'s value (a stack) shared into register `to` (a read before the last; the
/// last moves it by exchanging the registers' slots, inline).
extern "C" fn share_value(ctx: *mut Ctx, from: u32, to: u32) {
    // SAFETY: `ctx` is the live `Ctx` of the run that called; its state outlives it.
    let state = unsafe { &mut *(*ctx).state };
    *state.value(to as usize) = state.value(from as usize).clone();
}

/// Drops register `reg`'s value (its last read), so a stack threaded on stays unique.
extern "C" fn clear_value(ctx: *mut Ctx, reg: u32) {
    // SAFETY: as in `share_value`.
    let state = unsafe { &mut *(*ctx).state };
    *state.value(reg as usize) = None;
}

/// The address of a constant's first element (the frame owns it, so it does not move).
fn address_of_elements(storage: &Storage) -> *const u8 {
    match storage {
        Storage::F32(v) => v.as_ptr().cast(),
        Storage::F64(v) => v.as_ptr().cast(),
        Storage::I32(v) => v.as_ptr().cast(),
        Storage::I64(v) => v.as_ptr().cast(),
        Storage::Bool(v) => v.as_ptr().cast(),
    }
}

/// Copies `n` bytes between two distinct buffers.
extern "C" fn copy_bytes(to: *mut u8, from: *const u8, n: usize) {
    // SAFETY: the code passes two registers' buffers of `n` bytes each, which are distinct.
    unsafe { std::ptr::copy_nonoverlapping(from, to, n) }
}
