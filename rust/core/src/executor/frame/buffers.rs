//! A fused frame whose values all have static types, compiled from its register program
//! (`Program`) to direct kernel calls on preallocated buffers (`steps`), run step by step or
//! as machine code (`native`).
//!
//! ```text
//!   compile: every register a buffer of its static type's size; every op the kernel the op
//!            table chose for its exact types (`Op::kernel_into`), which writes into the
//!            output's buffer; control primitives move buffers; a nested loop is its own
//!            `FusedLoop`'s frame, shared
//!   run:     inputs copied into their buffers; the program's steps, with a live bit per
//!            register and a dead bit per node, in the program's order; results copied out
//! ```
//!
//! What the interpreted program does with values (a read at its last use moves it, a dead
//! step leaves its inputs in place, a merge takes its first live input), this does with
//! buffers: a move swaps two buffers, a read before the last copies. The kernels write every
//! element, so no buffer is cleared, and buffers are kept from run to run: a steady loop
//! allocates nothing but its results. No type is compared and no shape computed at run time;
//! dtype dispatch happened when the kernels were chosen.
//!
//! A frame with a value of unknown shape, a stack, a variable, or an op the table has no
//! destination kernel for is not compiled: its program runs as before. A run whose inputs do
//! not have the frame's static types also goes to the program (same results, same errors).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use smallvec::SmallVec;

use super::native::elementwise::Elementwise;
use super::native::NativeCode;
use super::registers::{Program, Read, Reg, RegisterAction};
use super::steps::{same_buffer, storage_of, BufferAction, BufferStep, Slot, State, Steps};
use super::{in_place, rank_one};
use crate::dataflow::DfKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::executor::failure::Failure;
use crate::executor::tiers::{count, native_frames, Statistic};
use crate::graph::constructs::StackOp;
use crate::graph::While;
use crate::runtime_values::RtValue;
use crate::shape::TensorType;

pub(crate) struct BufferFrame {
    pub(super) ir: Steps,
    /// The frames of its nested loops (`BufferAction::Loop`), each its loop's own.
    pub(super) nested: Vec<Arc<BufferFrame>>,
    /// States of finished runs (a frame may run on several threads at once).
    spare: Mutex<Vec<State>>,
    /// The steps as machine code, made at the first run that may use it (`None`: the frame
    /// has nothing native code would speed up, or Cranelift refused it).
    native: OnceLock<Option<NativeCode>>,
    /// Runs so far without machine code (a root's count until it is compiled).
    runs: AtomicU32,
}

/// A root frame is compiled to machine code at its third run.
const ROOT_RUNS_BEFORE_NATIVE: u32 = 2;

impl std::fmt::Debug for BufferFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BufferFrame(frame {}, {} steps)",
            self.ir.fused.frame,
            self.ir.steps.len()
        )
    }
}

impl BufferFrame {
    /// Compiles `program`, whose nested loops' frames are `nested` (in its steps' order), or
    /// `None` where its frame or a nested one has something without a compiled form.
    pub fn compile(program: &Program, nested: &[Option<Arc<BufferFrame>>]) -> Option<BufferFrame> {
        let fused = program.fused();
        let slots = fused
            .nodes
            .iter()
            .flat_map(|n| n.outputs.iter().map(Slot::of))
            .collect::<Option<Vec<_>>>()?;
        let mut frames = Vec::new();
        let mut steps = Vec::with_capacity(program.steps().len());
        for step in program.steps() {
            let node = &fused.nodes[step.node];
            let reads: SmallVec<[Read; 4]> = step.reads.iter().copied().collect();
            let tensor_types = |regs: &mut dyn Iterator<Item = usize>| {
                regs.map(|r| slots[r].tensor().cloned())
                    .collect::<Option<Vec<TensorType>>>()
            };
            let input_types = tensor_types(&mut reads.iter().map(|r| r.reg as usize));
            let outputs = step.out as usize..(step.out + step.outputs) as usize;
            let output_types = tensor_types(&mut outputs.clone());
            let buffers = |regs: &[Reg]| regs.iter().all(|&r| slots[r as usize].tensor().is_some());
            let mut inline = None;
            let mut lane_map = None;
            let action = match &step.action {
                RegisterAction::Const(t) => BufferAction::Const(storage_of(t)?),
                RegisterAction::Pass => BufferAction::Pass,
                RegisterAction::LoopMerge => BufferAction::LoopMerge,
                RegisterAction::Merge => BufferAction::Merge,
                RegisterAction::Switch(n) => {
                    let selector = slots[reads.get(1)?.reg as usize].tensor()?;
                    let scalar = selector.shape.is_empty()
                        && matches!(selector.dtype, DType::Bool | DType::I32);
                    if !scalar || *n == 0 {
                        return None;
                    }
                    BufferAction::Switch(*n)
                }
                RegisterAction::Op { op, .. } => {
                    let (inputs, outputs) = (input_types?, output_types?);
                    let inferred = op.infer(&inputs).ok()?;
                    if inferred.as_slice() != outputs || outputs.is_empty() {
                        return None;
                    }
                    if op.same_elements()
                        && inputs.len() == 1
                        && outputs.len() == 1
                        && same_buffer(&inputs[0], &outputs[0])
                    {
                        // The buffer moves at its last read, else its elements are copied.
                        BufferAction::Pass
                    } else {
                        if outputs.len() == 1 {
                            inline = Elementwise::of(op, &inputs, &outputs[0]);
                            lane_map = op.lane_map(outputs[0].dtype);
                        }
                        BufferAction::Kernel(op.kernel_into(&inputs, &outputs).unwrap_or_else(
                            || crate::ops::through_compute(op.clone(), &inputs, &outputs),
                        ))
                    }
                }
                RegisterAction::Loop(_) => {
                    frames.push(nested.get(frames.len())?.clone()?);
                    BufferAction::Loop(frames.len() - 1)
                }
                RegisterAction::NoOp => BufferAction::NoOp,
                // A variable's side effect would run twice in check mode; stacks are values.
                RegisterAction::Kernel => match &node.kind {
                    DfKind::Stack(StackOp::Push) if buffers(&[reads.get(1)?.reg]) => {
                        BufferAction::Push
                    }
                    DfKind::Stack(StackOp::Pop) if buffers(&[step.out + 1]) => BufferAction::Pop,
                    DfKind::Stack(_) => BufferAction::Node,
                    _ => return None,
                },
            };
            if node.outputs.len() != step.outputs as usize {
                return None;
            }
            steps.push(BufferStep {
                node: step.node,
                action,
                data: reads.iter().map(|r| r.reg).collect(),
                reads,
                controls: step.controls.clone(),
                out: step.out,
                outputs: step.outputs,
                in_place: 0,
                inline,
                lane_map,
                domain: step.domain,
            });
        }
        rank_one::fuse(&mut steps, &fused.nodes, &slots, program.results());
        let invariant: Vec<Reg> = program
            .inputs()
            .iter()
            .filter(|&&(_, inv)| inv)
            .map(|&(r, _)| r)
            .collect();
        Self::pass_invariants(&mut steps, &slots, &invariant, program.results());
        rank_one::update_in_place(&mut steps, &fused.nodes);
        in_place::slice_updates(&mut steps, &fused.nodes, &slots);
        count(Statistic::BufferFramesCompiled, 1);
        Some(BufferFrame {
            ir: Steps {
                fused: fused.clone(),
                steps,
                holds_value: slots.iter().map(|s| matches!(s, Slot::Value(_))).collect(),
                slots,
                inputs: program.inputs().iter().map(|&(r, _)| r).collect(),
                carried: program.carried().to_vec(),
                results: program.results().to_vec(),
            },
            nested: frames,
            spare: Mutex::new(Vec::new()),
            native: OnceLock::new(),
            runs: AtomicU32::new(0),
        })
    }

    /// Its steps.
    #[cfg(test)]
    pub fn steps(&self) -> &Steps {
        &self.ir
    }

    /// The frames of its nested loops.
    #[cfg(test)]
    pub fn nested_frames(&self) -> &[Arc<BufferFrame>] {
        &self.nested
    }

    /// A state with a buffer per slot, its nested loops' too.
    fn fresh_state(&self) -> Result<State> {
        let nested = self
            .nested
            .iter()
            .map(|inner| inner.fresh_state())
            .collect::<Result<_>>()?;
        State::new(&self.ir, nested)
    }

    /// Whether `inputs` have the frame's static types (else the program runs them).
    pub fn accepts(&self, inputs: &[RtValue]) -> bool {
        inputs.len() == self.ir.inputs.len()
            && inputs.iter().zip(&self.ir.inputs).all(|(v, &r)| {
                match (&self.ir.slots[r as usize], v) {
                    (Slot::Buffer(ty), RtValue::Tensor(t)) => t.ty() == ty,
                    (Slot::Value(ty), v) => {
                        !matches!(v, RtValue::Tensor(_)) && v.mismatch(ty).is_none()
                    }
                    _ => false,
                }
            })
    }

    /// Runs the frame on `inputs`, which it `accepts`. They are given up, so a stack among
    /// them stays the only handle to its items and is pushed and popped in place.
    pub fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>, Failure> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut state = match spare {
            Some(state) => state,
            None => self.fresh_state()?,
        };
        state.live.fill(false);
        let outcome = self.load_inputs(&mut state, inputs.into_iter());
        let outcome = outcome.and_then(|()| self.run_in(&mut state));
        let outcome = outcome.and_then(|()| {
            self.ir
                .results
                .iter()
                .map(|&r| Ok(self.result(&mut state, r)?))
                .collect()
        });
        // Stacks and variables are not kept from run to run.
        state.values.iter_mut().for_each(|v| *v = None);
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(state);
        outcome
    }

    /// Loads `inputs` (of the frame's slots) into its input registers.
    fn load_inputs(
        &self,
        state: &mut State,
        inputs: impl Iterator<Item = RtValue>,
    ) -> Result<(), Failure> {
        for (v, &r) in inputs.zip(&self.ir.inputs) {
            self.load_input(state, r as usize, v)?;
            state.live[r as usize] = true;
        }
        Ok(())
    }

    /// Input register `r`'s value `v` (a tensor into its buffer).
    pub(super) fn load_input(&self, state: &mut State, r: usize, v: RtValue) -> Result<()> {
        match v {
            RtValue::Tensor(t) if self.ir.slots[r].tensor().is_some() => state.load(r, &t)?,
            other => *state.value(r) = Some(Box::new(other)),
        }
        Ok(())
    }

    /// Result register `r`'s value (a buffer's elements are copied out).
    pub(super) fn result(&self, state: &mut State, r: Reg) -> Result<RtValue> {
        let r = r as usize;
        match &self.ir.slots[r] {
            Slot::Buffer(ty) => Ok(RtValue::Tensor(state.unload(r, ty)?)),
            Slot::Value(_) => {
                // A register returned twice is cloned for all but its last use.
                let last = self.ir.results.iter().filter(|&&x| x as usize == r).count() == 1;
                state
                    .read_value(r, last)
                    .ok_or_else(|| Error::internal("executor", "a result is empty"))
            }
        }
    }

    /// Runs the steps on `state`, whose input registers are loaded; the results are left in
    /// their registers (live, or an error).
    pub(super) fn run_in(&self, state: &mut State) -> Result<(), Failure> {
        state.dead.fill(false);
        let trips = match self.native_code() {
            Some(code) => {
                count(Statistic::NativeRuns, 1);
                code.run(&self.ir, self, state)?
            }
            None => {
                count(Statistic::BufferRuns, 1);
                self.run_steps(state)?
            }
        };
        if self.ir.fused.repeats {
            While::count_trips(trips);
        }
        for (k, &r) in self.ir.results.iter().enumerate() {
            if !state.live[r as usize] {
                let msg = format!("frame {}: result {k} is dead", self.ir.fused.frame);
                return Err(Error::internal("executor", msg).into());
            }
        }
        Ok(())
    }

    /// Whether it has machine code (made at its first run that may use it).
    pub fn is_native(&self) -> bool {
        matches!(self.native.get(), Some(Some(_)))
    }

    /// The frame's machine code, where runs may use it (compiled at the first such run).
    fn native_code(&self) -> Option<&NativeCode> {
        if !native_frames() {
            return None;
        }
        // A root runs once per call: compiled when called again, not for a single call.
        if !self.ir.fused.repeats && self.native.get().is_none() {
            let runs = self.runs.fetch_add(1, Ordering::Relaxed);
            if runs < ROOT_RUNS_BEFORE_NATIVE {
                return None;
            }
        }
        self.native
            .get_or_init(|| {
                let code = NativeCode::compile(&self.ir);
                if let Some(code) = &code {
                    count(Statistic::NativeFramesCompiled, 1);
                    count(Statistic::FusedPassesCompiled, code.passes as u64);
                }
                code
            })
            .as_ref()
    }

    /// A loop input that does not change (an invariant: never written, never moved) reaches its
    /// readers through switches and identities each iteration. Where every reader of such a
    /// pass's output only reads elements (an op or a stack node, not a result or another pass),
    /// the output keeps its liveness but its readers read the input's buffer: no copy per
    /// iteration of a large operand (an RNN's weights, its input sequence).
    fn pass_invariants(
        steps: &mut [BufferStep],
        slots: &[Slot],
        invariant: &[Reg],
        results: &[Reg],
    ) {
        let mut only_read = vec![true; slots.len()];
        for step in steps.iter() {
            if !matches!(
                step.action,
                BufferAction::Kernel(_) | BufferAction::Node | BufferAction::Push
            ) {
                for r in &step.reads {
                    only_read[r.reg as usize] = false;
                }
            }
        }
        for &r in results {
            only_read[r as usize] = false;
        }
        let mut source: Vec<Option<Reg>> = vec![None; slots.len()];
        for step in steps.iter_mut() {
            let passes = matches!(step.action, BufferAction::Pass | BufferAction::Switch(_));
            let Some(from) = step.reads.first().map(|r| r.reg).filter(|_| passes) else {
                continue;
            };
            if !invariant.contains(&from) || slots[from as usize].tensor().is_none() {
                continue;
            }
            for k in 0..step.outputs.min(32) {
                let out = (step.out + k) as usize;
                if only_read[out] {
                    step.in_place |= 1 << k;
                    source[out] = Some(from);
                }
            }
        }
        for step in steps.iter_mut() {
            for (data, r) in step.data.iter_mut().zip(&step.reads) {
                *data = source[r.reg as usize].unwrap_or(r.reg);
            }
        }
    }
}
