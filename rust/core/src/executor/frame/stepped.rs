//! The stepped interpreter of a buffer frame's steps (`steps`): what the register program
//! does with values (a read at its last use moves it, a dead step leaves its inputs in place, a
//! merge takes its first live input), done with buffers. A move exchanges two registers'
//! buffers, a read before the last copies. Native code calls back here for the steps it does
//! not compute itself (`Interpreter`).

use smallvec::SmallVec;

use super::buffers::BufferFrame;
use super::native::Interpreter;
use super::registers::{Read, Reg};
use super::steps::{BufferAction, BufferStep, Slot, State};
use crate::dataflow::DfKind;
use crate::error::{Error, Result};
use crate::executor::failure::Failure;
use crate::executor::kernel::Kernel;
use crate::executor::switch::selected;
use crate::runtime_values::{Popped, RtValue};

impl BufferFrame {
    /// The steps run one by one, iteration after iteration; returns the trips made.
    pub(super) fn run_steps(&self, state: &mut State) -> Result<i64, Failure> {
        let mut iteration: i64 = 0;
        loop {
            for step in &self.ir.steps {
                if let Err(mut failure) = self.step(step, iteration, state) {
                    failure.inside(
                        &self.ir.fused.nodes[step.node],
                        self.ir.fused.repeats.then_some(iteration),
                    );
                    return Err(failure);
                }
            }
            if !self.ir.fused.repeats || self.ir.carried.iter().all(|&r| !state.live[r as usize]) {
                break;
            }
            iteration += 1;
        }
        Ok(iteration)
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
                    self.transfer(state, from, out)?;
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
                state.copy_in(out, c)?;
                state.live[out] = true;
            }
            BufferAction::Pass => {
                if step.in_place & 1 == 0 {
                    self.transfer(state, reads[0], out)?;
                }
                self.release(state, reads);
                state.live[out] = true;
            }
            BufferAction::Switch(n) => {
                let k = selected(state.buffer(reads[1].reg as usize), *n)?;
                state.live[out..out + n].fill(false);
                if step.in_place & (1 << k.min(31)) == 0 || k >= 32 {
                    self.transfer(state, reads[0], out + k)?;
                }
                self.release(state, reads);
                state.live[out + k] = true;
            }
            BufferAction::Kernel(kernel) | BufferAction::Update(kernel) => {
                let updates = matches!(step.action, BufferAction::Update(_));
                if updates {
                    self.transfer(state, reads[0], out)?;
                }
                let count = step.outputs as usize;
                state.run_kernel(kernel, &step.data[usize::from(updates)..], out, count)?;
                self.release(state, reads);
                state.live[out..out + count].fill(true);
            }
            BufferAction::Push => self.push(step, state)?,
            BufferAction::Pop => self.pop(step, state)?,
            BufferAction::Node => {
                let inputs = self.take_inputs(state, step)?;
                let outs = match &self.ir.fused.nodes[step.node].kind {
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
            BufferAction::Loop(index) => {
                // Out of `state` while it runs (back in place whatever the outcome).
                let inner = &self.nested[*index];
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
        inner: &BufferFrame,
        state: &mut State,
        inner_state: &mut State,
    ) -> Result<(), Failure> {
        inner_state.live.fill(false);
        let same_buffer = |outer: usize, r: usize| match (&self.ir.slots[outer], &inner.ir.slots[r])
        {
            (Slot::Buffer(a), Slot::Buffer(b)) => a == b,
            _ => false,
        };
        let inputs = step.reads.iter().zip(&step.data).zip(&inner.ir.inputs);
        let moved = |r: &Read, data: Reg| r.take && data == r.reg;
        // Copies first: a buffer moved away must not be one a later read copies from.
        for ((r, &data), &to) in inputs.clone() {
            let (from, to) = (r.reg as usize, to as usize);
            if same_buffer(from, to) && !moved(r, data) {
                inner_state.copy_from(to, state, data as usize)?;
            } else if !same_buffer(from, to) {
                let v = self.read(state, *r, data)?;
                inner.load_input(inner_state, to, v)?;
            }
            inner_state.live[to] = true;
        }
        for ((r, &data), &to) in inputs {
            let (from, to) = (r.reg as usize, to as usize);
            if same_buffer(from, to) && moved(r, data) {
                state.exchange(from, inner_state, to);
            }
        }
        self.release(state, &step.reads);
        inner.run_in(inner_state)?;
        for (k, &r) in inner.ir.results.iter().enumerate() {
            let (r, out) = (r as usize, step.out as usize + k);
            if !same_buffer(out, r) {
                let v = inner.result(inner_state, r as Reg)?;
                self.write(state, out, v)?;
                continue;
            }
            if inner
                .ir
                .results
                .iter()
                .filter(|&&x| x as usize == r)
                .count()
                == 1
            {
                state.exchange(out, inner_state, r);
            } else {
                state.copy_from(out, inner_state, r)?;
            }
            state.live[out] = true;
        }
        inner_state.values.iter_mut().for_each(|v| *v = None);
        Ok(())
    }

    /// `stack_push` of a buffer's elements (the step is live). The stack moves to the output
    /// register first (an exchange of slots at its last read) and is pushed where it lands.
    fn push(&self, step: &BufferStep, state: &mut State) -> Result<()> {
        let (reads, out) = (&step.reads[..], step.out as usize);
        let ty = self.ir.slots[reads[1].reg as usize].tensor();
        let ty = ty.ok_or_else(|| Error::internal("stack_push", "no buffer"))?;
        self.transfer(state, reads[0], out)?;
        self.release(state, reads);
        state.push(out, step.data[1] as usize, ty)?;
        state.live[out] = true;
        Ok(())
    }

    /// `stack_pop` into a buffer (the step is live); the stack moves as in `push`.
    fn pop(&self, step: &BufferStep, state: &mut State) -> Result<()> {
        let (reads, out) = (&step.reads[..], step.out as usize);
        self.transfer(state, reads[0], out)?;
        self.release(state, reads);
        let into = self.ir.slots[out + 1].tensor().map(|_| out + 1);
        let popped = state.pop(out, into)?;
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
        match &self.ir.slots[reg] {
            Slot::Buffer(ty) => Ok(RtValue::Tensor(state.unload(data as usize, ty)?)),
            Slot::Value(_) => state
                .read_value(reg, r.take)
                .ok_or_else(|| Error::internal("executor", "an input is missing")),
        }
    }

    /// Writes `v` into register `r`: a tensor into its buffer (it must have the register's
    /// static type), another value as it is.
    fn write(&self, state: &mut State, r: usize, v: RtValue) -> Result<()> {
        match (&self.ir.slots[r], v) {
            (Slot::Buffer(ty), RtValue::Tensor(t)) if t.ty() == ty => state.load(r, &t)?,
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

    /// Register `from`'s value into register `to`: moved at its last read (the two registers
    /// exchange slots; what `to` held is dropped when `from` is released, as every read that
    /// moves is), else copied (a value shared).
    #[inline]
    fn transfer(&self, state: &mut State, from: Read, to: usize) -> Result<()> {
        let r = from.reg as usize;
        if from.take {
            state.phys.swap(r, to);
        } else if self.ir.holds_value[r] {
            *state.value(to) = state.value(r).clone();
        } else {
            state.copy_register(r, to)?;
        }
        Ok(())
    }

    /// Registers read for the last time in the iteration are empty afterwards (a value's
    /// reference dropped, so a stack threaded through the loop is pushed in place).
    #[inline]
    fn release(&self, state: &mut State, reads: &[Read]) {
        for r in reads.iter().filter(|r| r.take) {
            let reg = r.reg as usize;
            state.live[reg] = false;
            if self.ir.holds_value[reg] {
                *state.value(reg) = None;
            }
        }
    }
}

/// What machine code calls back for the steps it does not compute itself.
impl Interpreter for BufferFrame {
    fn step(&self, step: usize, iteration: i64, state: &mut State) -> Result<(), Failure> {
        self.step_outlined(&self.ir.steps[step], iteration, state)
    }

    fn stack_step(&self, step: usize, state: &mut State) -> Result<()> {
        let step = &self.ir.steps[step];
        match step.action {
            BufferAction::Push => self.push(step, state),
            BufferAction::Pop => self.pop(step, state),
            _ => Err(Error::internal("executor", "a stack call on another step")),
        }
    }
}

impl BufferFrame {
    /// One step, for native code that calls back (out of line: `step` itself is inlined
    /// into `run_steps`' loop, which is what runs a frame without machine code).
    #[inline(never)]
    fn step_outlined(
        &self,
        step: &BufferStep,
        iteration: i64,
        state: &mut State,
    ) -> Result<(), Failure> {
        self.step(step, iteration, state)
    }
}
