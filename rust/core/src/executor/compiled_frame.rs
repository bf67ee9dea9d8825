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

use std::sync::{Mutex, PoisonError};

use smallvec::SmallVec;

use super::kernel::Failure;
use super::program::{Action as ProgramAction, Program, Read, Reg};
use crate::dataflow::FusedFrame;
use crate::dtype::{DType, Element, Storage};
use crate::error::{Error, Result};
use crate::graph::ValueType;
use crate::ops::DestKernel;
use crate::runtime_values::RtValue;
use crate::shape::{numel, TensorType, DYN};
use crate::tensor::Tensor;

enum Action {
    /// A constant's elements, copied into its register each time the step runs (as the
    /// program clones its tensor).
    Const(Storage),
    Pass,
    LoopMerge,
    Merge,
    Switch(usize),
    Kernel(DestKernel),
    /// A nested loop, with the index of its state in `State::nested`.
    Loop(Box<CompiledFrame>, usize),
    NoOp,
}

struct Step {
    node: usize,
    action: Action,
    reads: SmallVec<[Read; 4]>,
    controls: SmallVec<[u32; 2]>,
    out: Reg,
    outputs: u32,
}

/// A run's buffers and bits, kept for the next run.
struct State {
    buffers: Vec<Storage>,
    /// Per register, the index of its buffer: a permutation (moves exchange entries).
    phys: Vec<u32>,
    live: Vec<bool>,
    dead: Vec<bool>,
    nested: Vec<State>,
}

pub(crate) struct CompiledFrame {
    fused: std::sync::Arc<FusedFrame>,
    steps: Vec<Step>,
    /// Per register, its static type.
    types: Vec<TensorType>,
    inputs: Vec<Reg>,
    carried: Vec<Reg>,
    results: Vec<Reg>,
    /// States of finished runs (a frame may run on several threads at once).
    spare: Mutex<Vec<State>>,
}

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

/// The static type of a value, when it is a tensor of known shape.
fn static_type(ty: &ValueType) -> Option<TensorType> {
    ty.as_tensor().filter(|t| !t.shape.contains(&DYN)).cloned()
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
        let types = fused
            .nodes
            .iter()
            .flat_map(|n| n.outputs.iter().map(static_type))
            .collect::<Option<Vec<_>>>()?;
        let mut nested = 0;
        let mut steps = Vec::with_capacity(program.steps().len());
        for step in program.steps() {
            let node = &fused.nodes[step.node];
            let reads: SmallVec<[Read; 4]> = step.reads.iter().copied().collect();
            let input_types: Vec<TensorType> = reads
                .iter()
                .map(|r| types[r.reg as usize].clone())
                .collect();
            let output_types = &types[step.out as usize..(step.out + step.outputs) as usize];
            let action = match &step.action {
                ProgramAction::Const(t) => Action::Const(storage_of(t)?),
                ProgramAction::Pass => Action::Pass,
                ProgramAction::LoopMerge => Action::LoopMerge,
                ProgramAction::Merge => Action::Merge,
                ProgramAction::Switch(n) => {
                    let selector = input_types.get(1)?;
                    let scalar = selector.shape.is_empty()
                        && matches!(selector.dtype, DType::Bool | DType::I32);
                    if !scalar || *n == 0 {
                        return None;
                    }
                    Action::Switch(*n)
                }
                ProgramAction::Op { op, .. } => {
                    let inferred = op.infer(&input_types).ok()?;
                    if inferred.as_slice() != output_types {
                        return None;
                    }
                    if output_types.len() != 1 {
                        return None;
                    }
                    Action::Kernel(op.kernel_into(&input_types, output_types)?)
                }
                ProgramAction::Loop(inner) => {
                    nested += 1;
                    Action::Loop(Box::new(CompiledFrame::compile(inner)?), nested - 1)
                }
                ProgramAction::NoOp => Action::NoOp,
                ProgramAction::Kernel => return None,
            };
            if node.outputs.len() != step.outputs as usize {
                return None;
            }
            steps.push(Step {
                node: step.node,
                action,
                reads,
                controls: step.controls.clone(),
                out: step.out,
                outputs: step.outputs,
            });
        }
        Some(CompiledFrame {
            fused: fused.clone(),
            steps,
            types,
            inputs: program.inputs().iter().map(|&(r, _)| r).collect(),
            carried: program.carried().to_vec(),
            results: program.results().to_vec(),
            spare: Mutex::new(Vec::new()),
        })
    }

    fn fresh_state(&self) -> State {
        let buffers = self
            .types
            .iter()
            .map(|t| Storage::filled(t.dtype, numel(&t.shape), 0.0))
            .collect();
        let nested = self
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Loop(inner, _) => Some(inner.fresh_state()),
                _ => None,
            })
            .collect();
        State {
            buffers,
            phys: (0..self.types.len() as u32).collect(),
            live: vec![false; self.types.len()],
            dead: vec![false; self.fused.nodes.len()],
            nested,
        }
    }

    /// Runs the frame on `inputs`, or `None` when they do not all have its static types (the
    /// program runs them instead).
    pub fn run(&self, inputs: &[RtValue]) -> Option<Result<SmallVec<[RtValue; 2]>, Failure>> {
        if inputs.len() != self.inputs.len() {
            return None;
        }
        let tensors: SmallVec<[&Tensor; 4]> = inputs
            .iter()
            .zip(&self.inputs)
            .map(|(v, &r)| match v {
                RtValue::Tensor(t) if t.ty() == &self.types[r as usize] => Some(t),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut state = spare.unwrap_or_else(|| self.fresh_state());
        state.live.fill(false);
        for (t, &r) in tensors.iter().zip(&self.inputs) {
            if let Err(e) = load(&mut state.buffers[state.phys[r as usize] as usize], t) {
                return Some(Err(e.into()));
            }
            state.live[r as usize] = true;
        }
        let outcome = self.run_in(&mut state).and_then(|()| {
            self.results
                .iter()
                .map(|&r| {
                    let ty = &self.types[r as usize];
                    let buffer = &state.buffers[state.phys[r as usize] as usize];
                    Ok(RtValue::Tensor(unload(buffer, ty)?))
                })
                .collect()
        });
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(state);
        Some(outcome)
    }

    /// Runs the steps on `state`, whose input registers are loaded; the results are left in
    /// their registers (live, or an error).
    fn run_in(&self, state: &mut State) -> Result<(), Failure> {
        state.dead.fill(false);
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
        for (k, &r) in self.results.iter().enumerate() {
            if !state.live[r as usize] {
                let msg = format!("frame {}: result {k} is dead", self.fused.frame);
                return Err(Error::internal("executor", msg).into());
            }
        }
        Ok(())
    }

    fn step(&self, step: &Step, iteration: i64, state: &mut State) -> Result<(), Failure> {
        let State {
            buffers,
            phys,
            live,
            dead,
            nested,
        } = state;
        let out = step.out as usize;
        let control_dead = step.controls.iter().any(|&c| dead[c as usize]);
        let reads = &step.reads[..];
        match &step.action {
            // The merges decide their own death from which inputs are live.
            Action::LoopMerge | Action::Merge => {
                let considered = match step.action {
                    Action::LoopMerge => &reads[usize::from(iteration > 0)..][..1],
                    _ => reads,
                };
                let chosen = considered.iter().copied().find(|r| live[r.reg as usize]);
                let is_live = chosen.is_some() && !control_dead;
                if let Some(from) = chosen.filter(|_| is_live) {
                    transfer(buffers, phys, from, out);
                }
                release(live, considered);
                live[out] = is_live;
                dead[step.node] = !is_live;
                return Ok(());
            }
            _ => {
                let is_dead = control_dead || reads.iter().any(|r| !live[r.reg as usize]);
                dead[step.node] = is_dead;
                if is_dead {
                    live[out..out + step.outputs as usize].fill(false);
                    return Ok(());
                }
            }
        }
        match &step.action {
            Action::Const(c) => {
                copy(&mut buffers[phys[out] as usize], c);
                live[out] = true;
            }
            Action::Pass => {
                transfer(buffers, phys, reads[0], out);
                release(live, reads);
                live[out] = true;
            }
            Action::Switch(n) => {
                let k = selected(&buffers[phys[reads[1].reg as usize] as usize], *n)?;
                live[out..out + n].fill(false);
                transfer(buffers, phys, reads[0], out + k);
                release(live, reads);
                live[out + k] = true;
            }
            Action::Kernel(kernel) => {
                // Registers map to distinct buffers, so the output's is none of the inputs'.
                let o = phys[out] as usize;
                let mut written = std::mem::replace(&mut buffers[o], Storage::Bool(Vec::new()));
                let input = |k: usize| &buffers[phys[reads[k].reg as usize] as usize];
                let outputs = std::slice::from_mut(&mut written);
                let done = match reads.len() {
                    0 => kernel(&[], outputs),
                    1 => kernel(&[input(0)], outputs),
                    2 => kernel(&[input(0), input(1)], outputs),
                    3 => kernel(&[input(0), input(1), input(2)], outputs),
                    n => kernel(&(0..n).map(input).collect::<Vec<_>>(), outputs),
                };
                buffers[o] = written;
                done?;
                release(live, reads);
                live[out] = true;
            }
            Action::Loop(inner, index) => {
                let inner_state = &mut nested[*index];
                inner_state.live.fill(false);
                for (r, &to) in reads.iter().zip(&inner.inputs) {
                    let to = inner_state.phys[to as usize] as usize;
                    copy(
                        &mut inner_state.buffers[to],
                        &buffers[phys[r.reg as usize] as usize],
                    );
                }
                for &to in &inner.inputs {
                    inner_state.live[to as usize] = true;
                }
                inner.run_in(inner_state)?;
                for (k, &from) in inner.results.iter().enumerate() {
                    let from = &inner_state.buffers[inner_state.phys[from as usize] as usize];
                    copy(&mut buffers[phys[out + k] as usize], from);
                }
                release(live, reads);
                live[out..out + step.outputs as usize].fill(true);
            }
            Action::LoopMerge | Action::Merge | Action::NoOp => {}
        }
        Ok(())
    }
}

/// Register `from`'s value into register `to`: moved at its last read (the two registers
/// exchange buffers), else copied.
fn transfer(buffers: &mut [Storage], phys: &mut [u32], from: Read, to: usize) {
    let r = from.reg as usize;
    if from.take {
        phys.swap(r, to);
        return;
    }
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

/// Registers read for the last time in the iteration are empty afterwards.
fn release(live: &mut [bool], reads: &[Read]) {
    for r in reads {
        if r.take {
            live[r.reg as usize] = false;
        }
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
    match (a, b) {
        (RtValue::Tensor(x), RtValue::Tensor(y)) => {
            x.ty() == y.ty() && of(x).is_some() && of(x) == of(y)
        }
        _ => false,
    }
}
