//! A compiled frame's steps (`steps::Steps`) as machine code, made with Cranelift at the
//! frame's first run.
//!
//! ```text
//!   per step, in the steps' order, the same work the stepped interpreter does:
//!     liveness     live bits (per register) and dead bits (per node read as a control) are
//!                  bytes of the run's `State`, read and written in place
//!     merge, switch, pass, no-op   inline: a move swaps two registers' buffer indices, a
//!                  copy copies the buffer's bytes
//!     small elementwise op         inline (`elementwise`): loads, one instruction, stores
//!     other ops                    a call of the op's destination kernel on its buffers
//!     constants                    their elements copied from the frame's own
//!     stack pushes and pops        a call of the push or pop
//!     nested loops                 a call of the interpreter's step (`Interpreter`)
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

mod calls;
pub(super) mod elementwise;
mod emit;
mod fused;
mod runs;
#[cfg(test)]
mod tests;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cranelift_jit::JITModule;

use super::steps::{State, Steps};
use crate::error::Error;
use crate::executor::failure::Failure;
pub(crate) use calls::Interpreter;
use calls::{Ctx, Entry};

/// A frame's machine code, and the memory that holds it.
pub(crate) struct NativeCode {
    entry: Entry,
    module: Option<JITModule>,
    /// Runs of steps computed as one pass over their lanes (`fused`).
    pub passes: usize,
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
    /// The steps as machine code, or `None` where they stay interpreted.
    pub fn compile(steps: &Steps) -> Option<NativeCode> {
        let (entry, module) = catch_unwind(AssertUnwindSafe(|| emit::compile(steps))).ok()??;
        Some(NativeCode {
            entry,
            module: Some(module),
            passes: runs::count(&steps.steps),
        })
    }

    /// Runs `steps` on `state` (its inputs loaded, its dead bits cleared); the steps it does
    /// not compute itself go to `interpreter`.
    pub fn run(
        &self,
        steps: &Steps,
        interpreter: &dyn Interpreter,
        state: &mut State,
    ) -> Result<i64, Failure> {
        // Every buffer's address, refreshed (a buffer replaced between runs moved).
        let mut ctx = Ctx {
            raw: state.raw(),
            steps,
            interpreter,
            state,
            iteration: 0,
            failure: None,
        };
        // SAFETY: `entry` was compiled for these steps and registers, which `ctx`'s arrays
        // cover (the state was made for this frame); the arrays are not resized while the code
        // runs (steps only index them).
        let code = unsafe { (self.entry)(&mut ctx) };
        if code == 0 {
            return Ok(ctx.iteration);
        }
        let step = &steps.steps[code as usize - 1];
        let mut failure = ctx
            .failure
            .take()
            .unwrap_or_else(|| Error::internal("executor", "native code failed silently").into());
        failure.inside(
            &steps.fused.nodes[step.node],
            steps.fused.repeats.then_some(ctx.iteration),
        );
        Err(failure)
    }
}
