//! A fused frame whose values all have static types, compiled from its register program
//! (`Program`) to direct kernel calls on preallocated buffers.
//!
//! ```text
//!   compile: every register a buffer of its static type's size; every op the kernel the op
//!            table chose for its exact types (`Op::kernel_into`), which writes into the
//!            output's buffer; control primitives move buffers; nested loops compiled alike
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
use std::sync::{Mutex, OnceLock, PoisonError};

use smallvec::SmallVec;

use super::kernel::Failure;
use super::kernel::Kernel;
use super::native::{Elementwise, NativeCode};
use super::program::{Program, Read, Reg, RegisterAction};
use super::{count, Statistic};
use crate::dataflow::{DfKind, FusedFrame};
use crate::dtype::{DType, Element, Storage};
use crate::error::{Error, Result};
use crate::graph::constructs::StackOp;
use crate::graph::ValueType;
use crate::ops::DestKernel;
use crate::runtime_values::{Popped, RtValue, StackValue};
use crate::shape::{numel, TensorType, DYN};
use crate::tensor::Tensor;

pub(super) enum BufferAction {
    /// A constant's elements, copied into its register each time the step runs (as the
    /// program clones its tensor).
    Const(Storage),
    Pass,
    LoopMerge,
    Merge,
    Switch(usize),
    Kernel(DestKernel),
    /// A kernel that updates its first input in place: that input is read for the last time,
    /// its buffer moves to the output register, and the kernel reads the other inputs and
    /// the output's buffer (`rank_one::update_in_place`).
    Update(DestKernel),
    /// A stack node, run through its construct's `Kernel` on values.
    Node,
    /// `stack_push` of a buffer's elements: the stack moved, pushed, moved on.
    Push,
    /// `stack_pop` into a buffer.
    Pop,
    /// A nested loop, with the index of its state in `State::nested`.
    Loop(Box<CompiledFrame>, usize),
    NoOp,
}

pub(super) struct BufferStep {
    pub node: usize,
    pub action: BufferAction,
    pub reads: SmallVec<[Read; 4]>,
    /// Per read, the register whose buffer holds its elements: its own, or the loop input it
    /// passes on unchanged (see `pass_invariants`).
    pub data: SmallVec<[Reg; 4]>,
    pub controls: SmallVec<[u32; 2]>,
    pub out: Reg,
    pub outputs: u32,
    /// Outputs of a pass or switch (bit k) whose elements stay in the input's buffer.
    pub in_place: u32,
    /// An op whose native code computes it in place of a kernel call (`native::Elementwise`).
    pub inline: Option<Elementwise>,
}

/// What a register holds: a tensor of a static type in a buffer, or another value (a stack,
/// a variable) as the program holds it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Slot {
    Buffer(TensorType),
    Value(ValueType),
}

impl Slot {
    fn of(ty: &ValueType) -> Option<Slot> {
        match ty {
            ValueType::Tensor(t) if t.shape.contains(&DYN) => None,
            ValueType::Tensor(t) => Some(Slot::Buffer(t.clone())),
            other => Some(Slot::Value(other.clone())),
        }
    }

    pub fn tensor(&self) -> Option<&TensorType> {
        match self {
            Slot::Buffer(t) => Some(t),
            Slot::Value(_) => None,
        }
    }
}

/// A run's buffers and bits, kept for the next run.
#[derive(Default)]
pub(super) struct State {
    pub buffers: Vec<Storage>,
    /// Per register, the value of a `Slot::Value` register (`None` when empty). Boxed, so
    /// that machine code tests a slot for a value by its pointer (`Option<Box<_>>` is null
    /// when empty) and a move of a slot is eight bytes.
    pub values: Vec<Option<Box<RtValue>>>,
    /// Per register, the index of its buffer: a permutation (moves exchange entries).
    pub phys: Vec<u32>,
    pub live: Vec<bool>,
    pub dead: Vec<bool>,
    /// Per buffer, the address of its first element (what machine code reads, `native`).
    pub data: Vec<usize>,
    nested: Vec<State>,
}

impl State {
    /// The stack register `r` holds, beside the buffers and the permutation (to read or
    /// write a buffer while pushing or popping it).
    fn stack_and_buffers(&mut self, r: usize) -> Result<(&mut StackValue, &mut [Storage], &[u32])> {
        let State {
            values,
            buffers,
            phys,
            ..
        } = self;
        let items = stack_in(&mut values[phys[r] as usize])?;
        Ok((items, buffers, phys))
    }

    /// The value register `r` holds. Values, like buffers, sit in the slot the permutation
    /// gives the register, so a move exchanges two entries of `phys` and copies nothing.
    #[inline]
    pub fn value(&mut self, r: usize) -> &mut Option<Box<RtValue>> {
        &mut self.values[self.phys[r] as usize]
    }
}

pub(crate) struct CompiledFrame {
    pub(super) fused: std::sync::Arc<FusedFrame>,
    pub(super) steps: Vec<BufferStep>,
    /// Per register, what it holds.
    pub(super) slots: Vec<Slot>,
    /// Per register, whether it holds a value rather than a buffer (`Slot::Value`).
    pub(super) holds_value: Vec<bool>,
    inputs: Vec<Reg>,
    pub(super) carried: Vec<Reg>,
    results: Vec<Reg>,
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

impl std::fmt::Debug for CompiledFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CompiledFrame(frame {}, {} steps)",
            self.fused.frame,
            self.steps.len()
        )
    }
}

/// Whether buffers of types `a` and `b` hold the same elements: one dtype, one count.
fn same_buffer(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype && numel(&a.shape) == numel(&b.shape)
}

/// The stack a value register's slot holds.
fn stack_in(slot: &mut Option<Box<RtValue>>) -> Result<&mut StackValue> {
    match slot.as_deref_mut() {
        Some(RtValue::Stack(items)) => Ok(items),
        _ => Err(Error::internal("executor", "a stack is missing")),
    }
}

fn storage_of(t: &Tensor) -> Option<Storage> {
    Some(crate::with_dtype!(t.dtype(), T, {
        T::into_storage(t.as_slice::<T>().ok()?.to_vec())
    }))
}

impl CompiledFrame {
    /// Compiles `program`, or `None` where its frame has something without a compiled form.
    pub fn compile(program: &Program) -> Option<CompiledFrame> {
        let fused = program.fused();
        let slots = fused
            .nodes
            .iter()
            .flat_map(|n| n.outputs.iter().map(Slot::of))
            .collect::<Option<Vec<_>>>()?;
        let mut nested = 0;
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
                        }
                        BufferAction::Kernel(op.kernel_into(&inputs, &outputs).unwrap_or_else(
                            || crate::ops::through_compute(op.clone(), &inputs, &outputs),
                        ))
                    }
                }
                RegisterAction::Loop(inner) => {
                    nested += 1;
                    BufferAction::Loop(Box::new(CompiledFrame::compile(inner)?), nested - 1)
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
            });
        }
        super::rank_one::fuse(&mut steps, &fused.nodes, &slots, program.results());
        let invariant: Vec<Reg> = program
            .inputs()
            .iter()
            .filter(|&&(_, inv)| inv)
            .map(|&(r, _)| r)
            .collect();
        Self::pass_invariants(&mut steps, &slots, &invariant, program.results());
        super::rank_one::update_in_place(&mut steps, &fused.nodes);
        super::in_place::slice_updates(&mut steps, &fused.nodes, &slots);
        count(Statistic::BufferFramesCompiled);
        Some(CompiledFrame {
            fused: fused.clone(),
            steps,
            holds_value: slots.iter().map(|s| matches!(s, Slot::Value(_))).collect(),
            slots,
            inputs: program.inputs().iter().map(|&(r, _)| r).collect(),
            carried: program.carried().to_vec(),
            results: program.results().to_vec(),
            spare: Mutex::new(Vec::new()),
            native: OnceLock::new(),
            runs: AtomicU32::new(0),
        })
    }

    /// A state with a buffer per slot; a buffer the machine cannot give is an error.
    fn fresh_state(&self) -> Result<State> {
        let mut buffers = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            buffers.push(match s {
                Slot::Buffer(t) => {
                    crate::tensor::check_allocation("executor", t)?;
                    Storage::filled(t.dtype, numel(&t.shape), 0.0)
                }
                Slot::Value(_) => Storage::Bool(Vec::new()),
            });
        }
        let nested = self
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                BufferAction::Loop(inner, _) => Some(inner.fresh_state()),
                _ => None,
            })
            .collect::<Result<_>>()?;
        let n = self.slots.len();
        Ok(State {
            buffers,
            values: vec![None; n],
            phys: (0..n as u32).collect(),
            live: vec![false; n],
            dead: vec![false; self.fused.nodes.len()],
            data: Vec::with_capacity(n),
            nested,
        })
    }

    /// Whether `inputs` have the frame's static types (else the program runs them).
    pub fn accepts(&self, inputs: &[RtValue]) -> bool {
        inputs.len() == self.inputs.len()
            && inputs
                .iter()
                .zip(&self.inputs)
                .all(|(v, &r)| match (&self.slots[r as usize], v) {
                    (Slot::Buffer(ty), RtValue::Tensor(t)) => t.ty() == ty,
                    (Slot::Value(ty), v) => {
                        !matches!(v, RtValue::Tensor(_)) && v.mismatch(ty).is_none()
                    }
                    _ => false,
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
            self.results
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
        for (v, &r) in inputs.zip(&self.inputs) {
            self.load_input(state, r as usize, v)?;
            state.live[r as usize] = true;
        }
        Ok(())
    }

    /// Input register `r`'s value `v` (a tensor into its buffer).
    fn load_input(&self, state: &mut State, r: usize, v: RtValue) -> Result<()> {
        match v {
            RtValue::Tensor(t) if self.slots[r].tensor().is_some() => {
                load(&mut state.buffers[state.phys[r] as usize], &t)?
            }
            other => *state.value(r) = Some(Box::new(other)),
        }
        Ok(())
    }

    /// Result register `r`'s value (a buffer's elements are copied out).
    fn result(&self, state: &mut State, r: Reg) -> Result<RtValue> {
        let r = r as usize;
        match &self.slots[r] {
            Slot::Buffer(ty) => Ok(RtValue::Tensor(unload(
                &state.buffers[state.phys[r] as usize],
                ty,
            )?)),
            Slot::Value(_) => {
                // A register returned twice is cloned for all but its last use.
                let last = self.results.iter().filter(|&&x| x as usize == r).count() == 1;
                let value = if last {
                    state.value(r).take()
                } else {
                    state.value(r).clone()
                };
                value
                    .map(|v| *v)
                    .ok_or_else(|| Error::internal("executor", "a result is empty"))
            }
        }
    }

    /// Runs the steps on `state`, whose input registers are loaded; the results are left in
    /// their registers (live, or an error).
    fn run_in(&self, state: &mut State) -> Result<(), Failure> {
        state.dead.fill(false);
        match self.native_code() {
            Some(code) => {
                count(Statistic::NativeRuns);
                code.run(self, state)?
            }
            None => {
                count(Statistic::BufferRuns);
                self.run_steps(state)?
            }
        }
        for (k, &r) in self.results.iter().enumerate() {
            if !state.live[r as usize] {
                let msg = format!("frame {}: result {k} is dead", self.fused.frame);
                return Err(Error::internal("executor", msg).into());
            }
        }
        Ok(())
    }

    /// How many of this frame and the loops nested in it have machine code.
    pub fn native_frames(&self) -> usize {
        let own = usize::from(matches!(self.native.get(), Some(Some(_))));
        let nested = self.steps.iter().map(|step| match &step.action {
            BufferAction::Loop(inner, _) => inner.native_frames(),
            _ => 0,
        });
        own + nested.sum::<usize>()
    }

    /// The frame's machine code, where runs may use it (compiled at the first such run).
    fn native_code(&self) -> Option<&NativeCode> {
        if !super::native_frames() {
            return None;
        }
        // A root runs once per call: compiled when called again, not for a single call.
        if !self.fused.repeats && self.native.get().is_none() {
            let runs = self.runs.fetch_add(1, Ordering::Relaxed);
            if runs < ROOT_RUNS_BEFORE_NATIVE {
                return None;
            }
        }
        self.native
            .get_or_init(|| {
                let code = NativeCode::compile(self);
                if code.is_some() {
                    count(Statistic::NativeFramesCompiled);
                }
                code
            })
            .as_ref()
    }

    /// The steps run one by one, iteration after iteration.
    fn run_steps(&self, state: &mut State) -> Result<(), Failure> {
        let mut iteration: i64 = 0;
        loop {
            for step in &self.steps {
                if let Err(mut failure) = self.step(step, iteration, state) {
                    failure.inside(
                        &self.fused.nodes[step.node],
                        self.fused.repeats.then_some(iteration),
                    );
                    return Err(failure);
                }
            }
            if !self.fused.repeats || self.carried.iter().all(|&r| !state.live[r as usize]) {
                break;
            }
            iteration += 1;
        }
        Ok(())
    }

    /// One step, for native code that calls back (out of line: `step` itself is inlined
    /// into `run_steps`' loop, which is what runs a frame without machine code).
    #[inline(never)]
    pub(super) fn step_outlined(
        &self,
        step: &BufferStep,
        iteration: i64,
        state: &mut State,
    ) -> Result<(), Failure> {
        self.step(step, iteration, state)
    }

    #[inline(always)]
    fn step(&self, step: &BufferStep, iteration: i64, state: &mut State) -> Result<(), Failure> {
        let out = step.out as usize;
        let control_dead = step.controls.iter().any(|&c| state.dead[c as usize]);
        let reads = &step.reads[..];
        match &step.action {
            // The merges decide their own death from which inputs are live.
            BufferAction::LoopMerge | BufferAction::Merge => {
                let considered = match step.action {
                    BufferAction::LoopMerge => &reads[usize::from(iteration > 0)..][..1],
                    _ => reads,
                };
                let chosen = considered
                    .iter()
                    .copied()
                    .find(|r| state.live[r.reg as usize]);
                let is_live = chosen.is_some() && !control_dead;
                if let Some(from) = chosen.filter(|_| is_live) {
                    self.transfer(state, from, out);
                }
                self.release(state, considered);
                state.live[out] = is_live;
                state.dead[step.node] = !is_live;
                return Ok(());
            }
            _ => {
                let is_dead = control_dead || reads.iter().any(|r| !state.live[r.reg as usize]);
                state.dead[step.node] = is_dead;
                if is_dead {
                    for live in &mut state.live[out..out + step.outputs as usize] {
                        *live = false;
                    }
                    return Ok(());
                }
            }
        }
        match &step.action {
            BufferAction::Const(c) => {
                copy(&mut state.buffers[state.phys[out] as usize], c);
                state.live[out] = true;
            }
            BufferAction::Pass => {
                if step.in_place & 1 == 0 {
                    self.transfer(state, reads[0], out);
                }
                self.release(state, reads);
                state.live[out] = true;
            }
            BufferAction::Switch(n) => {
                let selector = &state.buffers[state.phys[reads[1].reg as usize] as usize];
                let k = selected(selector, *n)?;
                state.live[out..out + n].fill(false);
                if step.in_place & (1 << k.min(31)) == 0 || k >= 32 {
                    self.transfer(state, reads[0], out + k);
                }
                self.release(state, reads);
                state.live[out + k] = true;
            }
            BufferAction::Kernel(kernel) | BufferAction::Update(kernel) => {
                let updates = matches!(step.action, BufferAction::Update(_));
                if updates {
                    self.transfer(state, reads[0], out);
                }
                let State { buffers, phys, .. } = state;
                // Registers map to distinct buffers, so the outputs' are none of the inputs'.
                let count = step.outputs as usize;
                let mut written: SmallVec<[Storage; 1]> = (out..out + count)
                    .map(|r| {
                        std::mem::replace(&mut buffers[phys[r] as usize], Storage::Bool(Vec::new()))
                    })
                    .collect();
                let data = &step.data[usize::from(updates)..];
                let input = |k: usize| &buffers[phys[data[k] as usize] as usize];
                let outputs = written.as_mut_slice();
                let done = match data.len() {
                    0 => kernel(&[], outputs),
                    1 => kernel(&[input(0)], outputs),
                    2 => kernel(&[input(0), input(1)], outputs),
                    3 => kernel(&[input(0), input(1), input(2)], outputs),
                    n => kernel(&(0..n).map(input).collect::<Vec<_>>(), outputs),
                };
                for (r, w) in (out..out + count).zip(written) {
                    buffers[phys[r] as usize] = w;
                }
                done?;
                self.release(state, reads);
                state.live[out..out + count].fill(true);
            }
            BufferAction::Push => self.push(step, state)?,
            BufferAction::Pop => self.pop(step, state)?,
            BufferAction::Node => {
                let inputs = self.take_inputs(state, step)?;
                let outs = match &self.fused.nodes[step.node].kind {
                    DfKind::Stack(s) => s.run(inputs)?,
                    other => {
                        let message =
                            format!("a node step of a {} node has no kernel", other.name());
                        return Err(Error::internal("executor", message).into());
                    }
                };
                for (k, v) in outs.into_iter().enumerate() {
                    self.write(state, out + k, v)?;
                }
            }
            BufferAction::Loop(inner, index) => {
                // Out of `state` while it runs (back in place whatever the outcome).
                let mut inner_state = std::mem::take(&mut state.nested[*index]);
                let outcome = self.run_nested(step, inner, state, &mut inner_state);
                state.nested[*index] = inner_state;
                outcome?;
            }
            BufferAction::LoopMerge | BufferAction::Merge | BufferAction::NoOp => {}
        }
        Ok(())
    }

    /// A nested loop's step: its inputs into the inner frame's input registers, the inner
    /// frame run, its results into the step's outputs. A buffer moves by exchanging places
    /// with the inner register's (read for the last time, from its own register) or is copied;
    /// never through a tensor. A checkpointed loop's advance, nested in its backward loop,
    /// carries the snapshots' `[c + 1, ...]` buffers in and out on every backward trip.
    fn run_nested(
        &self,
        step: &BufferStep,
        inner: &CompiledFrame,
        state: &mut State,
        inner_state: &mut State,
    ) -> Result<(), Failure> {
        inner_state.live.fill(false);
        let same_buffer = |outer: usize, r: usize| match (&self.slots[outer], &inner.slots[r]) {
            (Slot::Buffer(a), Slot::Buffer(b)) => a == b,
            _ => false,
        };
        let inputs = step.reads.iter().zip(&step.data).zip(&inner.inputs);
        let moved = |r: &Read, data: Reg| r.take && data == r.reg;
        // Copies first: a buffer moved away must not be one a later read copies from.
        for ((r, &data), &to) in inputs.clone() {
            let (from, to) = (r.reg as usize, to as usize);
            if same_buffer(from, to) && !moved(r, data) {
                let src = &state.buffers[state.phys[data as usize] as usize];
                copy(&mut inner_state.buffers[inner_state.phys[to] as usize], src);
            } else if !same_buffer(from, to) {
                let v = self.read(state, *r, data)?;
                inner.load_input(inner_state, to, v)?;
            }
            inner_state.live[to] = true;
        }
        for ((r, &data), &to) in inputs {
            let (from, to) = (r.reg as usize, to as usize);
            if same_buffer(from, to) && moved(r, data) {
                let b = state.phys[from] as usize;
                let inner_b = inner_state.phys[to] as usize;
                std::mem::swap(&mut state.buffers[b], &mut inner_state.buffers[inner_b]);
                refresh_address(state, b);
            }
        }
        self.release(state, &step.reads);
        inner.run_in(inner_state)?;
        for (k, &r) in inner.results.iter().enumerate() {
            let (r, out) = (r as usize, step.out as usize + k);
            if !same_buffer(out, r) {
                let v = inner.result(inner_state, r as Reg)?;
                self.write(state, out, v)?;
                continue;
            }
            let (inner_b, b) = (inner_state.phys[r] as usize, state.phys[out] as usize);
            if inner.results.iter().filter(|&&x| x as usize == r).count() == 1 {
                std::mem::swap(&mut state.buffers[b], &mut inner_state.buffers[inner_b]);
                refresh_address(state, b);
            } else {
                copy(&mut state.buffers[b], &inner_state.buffers[inner_b]);
            }
            state.live[out] = true;
        }
        inner_state.values.iter_mut().for_each(|v| *v = None);
        Ok(())
    }

    /// `stack_push` of a buffer's elements (the step is live). The stack moves to the output
    /// register first (an exchange of slots at its last read) and is pushed where it lands.
    pub(super) fn push(&self, step: &BufferStep, state: &mut State) -> Result<()> {
        let (reads, out) = (&step.reads[..], step.out as usize);
        let ty = self.slots[reads[1].reg as usize].tensor();
        let ty = ty.ok_or_else(|| Error::internal("stack_push", "no buffer"))?;
        self.transfer(state, reads[0], out);
        self.release(state, reads);
        let (items, buffers, phys) = state.stack_and_buffers(out)?;
        let element = &buffers[phys[step.data[1] as usize] as usize];
        if ty == items.element() {
            items.push_elements(element)?;
        } else {
            items.push(unload(element, ty)?)?;
        }
        state.live[out] = true;
        Ok(())
    }

    /// `stack_pop` into a buffer (the step is live); the stack moves as in `push`.
    pub(super) fn pop(&self, step: &BufferStep, state: &mut State) -> Result<()> {
        let (reads, out) = (&step.reads[..], step.out as usize);
        self.transfer(state, reads[0], out);
        self.release(state, reads);
        let (items, buffers, phys) = state.stack_and_buffers(out)?;
        let mut scratch = Storage::Bool(Vec::new());
        let buffer = match &self.slots[out + 1] {
            Slot::Buffer(_) => &mut buffers[phys[out + 1] as usize],
            Slot::Value(_) => &mut scratch,
        };
        let Some(popped) = items.pop_into(buffer) else {
            let ty = ValueType::Stack(items.element().clone());
            return Err(Error::index("stack_pop", format!("pop from an empty {ty}")));
        };
        state.live[out] = true;
        match popped {
            Popped::Copied => {
                state.live[out + 1] = true;
                Ok(())
            }
            Popped::Tensor(top) => self.write(state, out + 1, RtValue::Tensor(top)),
        }
    }

    /// A node's inputs as the program reads them (see `read`), its last reads released.
    fn take_inputs(&self, state: &mut State, step: &BufferStep) -> Result<SmallVec<[RtValue; 4]>> {
        let inputs = step
            .reads
            .iter()
            .zip(&step.data)
            .map(|(&r, &data)| self.read(state, r, data))
            .collect::<Result<_>>()?;
        self.release(state, &step.reads);
        Ok(inputs)
    }

    /// Register `r`'s value as the program holds it: a buffer's elements (those of register
    /// `data`) as a tensor, a value moved out at its last read.
    fn read(&self, state: &mut State, r: Read, data: Reg) -> Result<RtValue> {
        let reg = r.reg as usize;
        match &self.slots[reg] {
            Slot::Buffer(ty) => Ok(RtValue::Tensor(unload(
                &state.buffers[state.phys[data as usize] as usize],
                ty,
            )?)),
            Slot::Value(_) => {
                let value = if r.take {
                    state.value(reg).take()
                } else {
                    state.value(reg).clone()
                };
                value
                    .map(|v| *v)
                    .ok_or_else(|| Error::internal("executor", "an input is missing"))
            }
        }
    }

    /// Writes `v` into register `r`: a tensor into its buffer (it must have the register's
    /// static type), another value as it is.
    fn write(&self, state: &mut State, r: usize, v: RtValue) -> Result<()> {
        match (&self.slots[r], v) {
            (Slot::Buffer(ty), RtValue::Tensor(t)) if t.ty() == ty => {
                load(&mut state.buffers[state.phys[r] as usize], &t)?
            }
            (Slot::Value(_), v) if !matches!(v, RtValue::Tensor(_)) => {
                *state.value(r) = Some(Box::new(v))
            }
            (slot, v) => {
                let msg = format!("a {} is written to a register of {slot:?}", v.value_type());
                return Err(Error::internal("executor", msg));
            }
        }
        state.live[r] = true;
        Ok(())
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

    /// Register `from`'s value into register `to`: moved at its last read (the two registers
    /// exchange slots; what `to` held is dropped when `from` is released, as every read that
    /// moves is), else copied (a value shared).
    #[inline]
    fn transfer(&self, state: &mut State, from: Read, to: usize) {
        let r = from.reg as usize;
        if from.take {
            state.phys.swap(r, to);
            return;
        }
        if self.holds_value[r] {
            *state.value(to) = state.value(r).clone();
            return;
        }
        let State { buffers, phys, .. } = state;
        let (src, dst) = (phys[r] as usize, phys[to] as usize);
        let (src, dst) = if src < dst {
            let (a, b) = buffers.split_at_mut(dst);
            (&a[src], &mut b[0])
        } else {
            let (a, b) = buffers.split_at_mut(src);
            (&b[0], &mut a[dst])
        };
        copy(dst, src);
    }

    /// Registers read for the last time in the iteration are empty afterwards (a value's
    /// reference dropped, so a stack threaded through the loop is pushed in place).
    #[inline]
    fn release(&self, state: &mut State, reads: &[Read]) {
        for r in reads.iter().filter(|r| r.take) {
            let reg = r.reg as usize;
            state.live[reg] = false;
            if self.holds_value[reg] {
                *state.value(reg) = None;
            }
        }
    }
}

/// After buffer `b` was exchanged for another: its address, where machine code reads it (the
/// frame's `data`, filled when its machine code starts a run; empty for an interpreted one).
fn refresh_address(state: &mut State, b: usize) {
    if let Some(at) = state.data.get_mut(b) {
        *at = super::native::address(&mut state.buffers[b]);
    }
}

fn copy(dst: &mut Storage, src: &Storage) {
    match (dst, src) {
        (Storage::F32(d), Storage::F32(s)) => d.copy_from_slice(s),
        (Storage::F64(d), Storage::F64(s)) => d.copy_from_slice(s),
        (Storage::I32(d), Storage::I32(s)) => d.copy_from_slice(s),
        (Storage::I64(d), Storage::I64(s)) => d.copy_from_slice(s),
        (Storage::Bool(d), Storage::Bool(s)) => d.copy_from_slice(s),
        (d, s) => *d = s.clone(),
    }
}

/// The output a switch's selector picks, as `kernel::selector_output` reads it (a bool, or an
/// i32 index clamped to the last output).
fn selected(selector: &Storage, outputs: usize) -> Result<usize> {
    match selector {
        Storage::Bool(b) => Ok(usize::from(b[0])),
        Storage::I32(i) => Ok(usize::try_from(i[0])
            .ok()
            .filter(|&i| i < outputs)
            .unwrap_or(outputs - 1)),
        _ => Err(Error::internal("switch", "the selector is not bool or i32")),
    }
}

fn load(buffer: &mut Storage, t: &Tensor) -> Result<()> {
    crate::with_dtype!(t.dtype(), T, {
        let to = T::slice_mut(buffer)
            .ok_or_else(|| Error::internal("executor", "an input's buffer has another dtype"))?;
        to.copy_from_slice(t.as_slice::<T>()?);
    });
    Ok(())
}

fn unload(buffer: &Storage, ty: &TensorType) -> Result<Tensor> {
    crate::with_dtype!(ty.dtype, T, {
        let xs = T::slice(buffer)
            .ok_or_else(|| Error::internal("executor", "a result's buffer has another dtype"))?;
        Tensor::collect::<T>(&ty.shape, xs.iter().copied())
    })
}

/// Whether two results are the same bits (the check mode's comparison: the compiled frame's
/// kernels are the program's own, so nothing may differ, NaN payloads included).
pub(crate) fn same_bits(a: &RtValue, b: &RtValue) -> bool {
    fn bits<T: Element>(t: &Tensor, f: impl Fn(T) -> u64) -> Option<Vec<u64>> {
        Some(t.as_slice::<T>().ok()?.iter().map(|&x| f(x)).collect())
    }
    fn of(t: &Tensor) -> Option<Vec<u64>> {
        match t.dtype() {
            DType::F32 => bits::<f32>(t, |x| u64::from(x.to_bits())),
            DType::F64 => bits::<f64>(t, f64::to_bits),
            DType::I32 => bits::<i32>(t, |x| x as u64),
            DType::I64 => bits::<i64>(t, |x| x as u64),
            DType::Bool => bits::<bool>(t, u64::from),
        }
    }
    let tensors = |x: &Tensor, y: &Tensor| x.ty() == y.ty() && of(x).is_some() && of(x) == of(y);
    match (a, b) {
        (RtValue::Tensor(x), RtValue::Tensor(y)) => tensors(x, y),
        (RtValue::Stack(x), RtValue::Stack(y)) => {
            x.element() == y.element()
                && x.len() == y.len()
                && (0..x.len()).all(|k| match (x.item(k), y.item(k)) {
                    (Some(p), Some(q)) => tensors(&p, &q),
                    _ => false,
                })
        }
        _ => false,
    }
}
