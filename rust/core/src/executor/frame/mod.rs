//! A fused loop (`DfKind::Loop`, or a root fused whole), compiled once and run on the fastest
//! tier its inputs allow. Each tier is compiled from the one before it and knows nothing above:
//!
//! ```text
//!   FusedLoop    picks the tier per run; check mode runs two and compares them (`agree`)
//!     registers  a register program: every value a register, any type (`Program`), its
//!                steps ordered so that elementwise ops over the same lanes sit together
//!                (`cluster`)
//!     buffers    compiled from it where every value has a static type: kernels writing
//!                into preallocated buffers, run step by step (`BufferFrame`)
//!       steps    the step IR both of the below read, and the run's `State`
//!       native   the same steps as machine code (Cranelift), at the frame's first runs;
//!                a run of elementwise ops over many lanes is one loop over them (`fused`)
//! ```
//!
//! A loop nested in a frame is a `FusedLoop` of its own, compiled once (`FusedLoops`): the
//! outer program runs it as a step, and the outer buffer frame holds its buffer frame.

mod buffers;
mod cluster;
mod in_place;
mod native;
mod rank_one;
mod registers;
mod stepped;
mod steps;

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use buffers::BufferFrame;
use registers::{NestedLoop, Program};
pub(super) use steps::same_bits;
#[cfg(test)]
pub(super) use steps::{BufferAction, BufferStep, Steps};

use crate::dataflow::FusedFrame;
use crate::error::{Error, Result};
use crate::executor::failure::Failure;
use crate::executor::tiers::{compiled_frames, CompiledFrames, FrameCounts};
use crate::runtime_values::RtValue;

/// A fused loop, compiled: its register program, and its buffer frame where it has one.
#[derive(Debug)]
pub(crate) struct FusedLoop {
    program: Program,
    buffers: Option<Arc<BufferFrame>>,
    /// The loops nested in it, in its steps' order (for their counts).
    nested: Vec<Arc<FusedLoop>>,
}

/// The fused loops compiled so far, by frame: a loop that both the root and the plan hold, or
/// that two frames nest, is compiled once.
#[derive(Default)]
pub(crate) struct FusedLoops {
    compiled: HashMap<*const FusedFrame, Arc<FusedLoop>>,
}

impl FusedLoops {
    /// `fused`'s loop, compiled at its first request.
    pub fn compile(&mut self, fused: &Arc<FusedFrame>) -> Result<Arc<FusedLoop>> {
        if let Some(done) = self.compiled.get(&Arc::as_ptr(fused)) {
            return Ok(done.clone());
        }
        // The map's key stays valid: the loop holds its frame.
        let compiled = Arc::new(FusedLoop::compile(fused, self)?);
        self.compiled.insert(Arc::as_ptr(fused), compiled.clone());
        Ok(compiled)
    }
}

impl FusedLoop {
    /// Compiles `fused`; its nested loops come from `loops`.
    pub fn compile(fused: &Arc<FusedFrame>, loops: &mut FusedLoops) -> Result<FusedLoop> {
        let mut nested = Vec::new();
        let program = Program::compile(fused, &mut |inner| {
            let inner = loops.compile(inner)?;
            nested.push(inner.clone());
            Ok(inner as Arc<dyn NestedLoop>)
        })?;
        let frames: Vec<Option<Arc<BufferFrame>>> =
            nested.iter().map(|inner| inner.buffers.clone()).collect();
        let buffers = BufferFrame::compile(&program, &frames).map(Arc::new);
        Ok(FusedLoop {
            program,
            buffers,
            nested,
        })
    }

    /// Runs the loop (or the root's one pass) on `inputs` (all live); returns its results.
    /// The buffer frame runs them when there is one and they have its types (in check mode
    /// the program runs them too, and any difference is an internal error).
    pub fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>, Failure> {
        let mode = compiled_frames();
        let buffers = self
            .buffers
            .as_ref()
            .filter(|_| mode != CompiledFrames::Off);
        match buffers {
            Some(frame) if frame.accepts(&inputs) => {
                if mode != CompiledFrames::Check {
                    return frame.run(inputs);
                }
                let outcome = frame.run(inputs.clone());
                let want = self.program.run(inputs);
                agree(self.program.fused(), outcome, want)
            }
            _ => self.program.run(inputs),
        }
    }

    /// How many frames it is (itself and the loops nested in it), how many have a buffer
    /// frame, and how many of those have machine code.
    pub fn frame_counts(&self) -> FrameCounts {
        let own = FrameCounts {
            total: 1,
            compiled: usize::from(self.buffers.is_some()),
            native: usize::from(self.buffers.as_ref().is_some_and(|b| b.is_native())),
        };
        self.nested
            .iter()
            .map(|inner| inner.frame_counts())
            .fold(own, |a, b| a + b)
    }

    /// Its buffer frame, where it has one.
    #[cfg(test)]
    pub fn buffers(&self) -> Option<&Arc<BufferFrame>> {
        self.buffers.as_ref()
    }

    /// The loops nested in it.
    #[cfg(test)]
    pub fn nested(&self) -> &[Arc<FusedLoop>] {
        &self.nested
    }
}

impl NestedLoop for FusedLoop {
    fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>, Failure> {
        FusedLoop::run(self, inputs)
    }
}

/// The check mode's verdict: the program's outcome when the compiled frame's is the same (equal
/// bits, or the same error at the same place), else an internal error saying where they part.
fn agree(
    fused: &FusedFrame,
    compiled: Result<SmallVec<[RtValue; 2]>, Failure>,
    program: Result<SmallVec<[RtValue; 2]>, Failure>,
) -> Result<SmallVec<[RtValue; 2]>, Failure> {
    let differs = match (&compiled, &program) {
        (Ok(a), Ok(b)) => (a.len() != b.len() || !a.iter().zip(b).all(|(x, y)| same_bits(x, y)))
            .then(|| "results".to_string()),
        (Err(a), Err(b)) => (a.error.kind != b.error.kind
            || a.error.to_string() != b.error.to_string()
            || a.place() != b.place())
        .then(|| format!("errors ({} against {})", a.error, b.error)),
        (Ok(_), Err(b)) => Some(format!(
            "outcomes (it succeeded, the program failed: {})",
            b.error
        )),
        (Err(a), Ok(_)) => Some(format!(
            "outcomes (it failed: {}, the program succeeded)",
            a.error
        )),
    };
    match differs {
        None => program,
        Some(what) => {
            let msg = format!(
                "frame {}: the compiled frame and its program differ in {what}",
                fused.frame
            );
            Err(Error::internal("executor", msg).into())
        }
    }
}
