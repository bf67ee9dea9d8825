//! A compiled frame's steps, as data: what each step does to which registers (`BufferStep`),
//! what each register holds (`Slot`), and the run's `State` of buffers and bits. The stepped
//! interpreter (`buffers`) and the native emitter (`native`) both read the steps and work on
//! the same state, so either can run a step the other began a run with.
//!
//! A register's buffer is found through a permutation (`State::phys`), so a move exchanges two
//! indices and copies nothing. Machine code reads each buffer's address from `State::data`:
//! the buffers are private here, and every method that could replace a buffer (an exchange, a
//! kernel that writes its output) refreshes that address, so the table cannot go stale.

use std::sync::Arc;

use smallvec::SmallVec;

use super::native::elementwise::Elementwise;
use super::registers::{Read, Reg};
use crate::dataflow::FusedFrame;
use crate::dtype::{DType, Element, Storage};
use crate::error::{Error, Result};
use crate::graph::ValueType;
use crate::ops::lanes::LaneMap;
use crate::ops::DestKernel;
use crate::runtime_values::{Popped, RtValue, StackValue};
use crate::shape::{numel, TensorType, DYN};
use crate::tensor::Tensor;

pub(crate) enum BufferAction {
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
    /// A nested loop: the index of its frame (`BufferFrame::nested`) and of its state
    /// (`State::nested`).
    Loop(usize),
    NoOp,
}

pub(crate) struct BufferStep {
    pub node: usize,
    pub action: BufferAction,
    pub reads: SmallVec<[Read; 4]>,
    /// Per read, the register whose buffer holds its elements: its own, or the loop input it
    /// passes on unchanged (`BufferFrame::pass_invariants`).
    pub data: SmallVec<[Reg; 4]>,
    pub controls: SmallVec<[u32; 2]>,
    pub out: Reg,
    pub outputs: u32,
    /// Outputs of a pass or switch (bit k) whose elements stay in the input's buffer.
    pub in_place: u32,
    /// An op whose native code computes it in place of a kernel call (`native::Elementwise`).
    pub inline: Option<Elementwise>,
    /// An op whose native code calls its vector function on the elements (`LaneMap`).
    pub lane_map: Option<LaneMap>,
    /// Steps of one domain are live together when their inputs are (`cluster`).
    pub domain: u32,
}

/// What a register holds: a tensor of a static type in a buffer, or another value (a stack,
/// a variable) as the program holds it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Slot {
    Buffer(TensorType),
    Value(ValueType),
}

impl Slot {
    /// The slot of a value of type `ty` (`None`: a dimension is unknown).
    pub fn of(ty: &ValueType) -> Option<Slot> {
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

/// A frame's steps and registers.
pub(crate) struct Steps {
    pub fused: Arc<FusedFrame>,
    pub steps: Vec<BufferStep>,
    /// Per register, what it holds.
    pub slots: Vec<Slot>,
    /// Per register, whether it holds a value rather than a buffer (`Slot::Value`).
    pub holds_value: Vec<bool>,
    pub inputs: Vec<Reg>,
    pub carried: Vec<Reg>,
    pub results: Vec<Reg>,
}

/// A run's buffers and bits, kept for the next run.
#[derive(Default)]
pub(crate) struct State {
    buffers: Vec<Storage>,
    /// Per buffer, the address of its first element (what machine code reads): filled when
    /// machine code starts a run (`addresses`), empty for a stepped run.
    data: Vec<usize>,
    /// Per register, the value of a `Slot::Value` register (`None` when empty). Boxed, so
    /// that machine code tests a slot for a value by its pointer (`Option<Box<_>>` is null
    /// when empty) and a move of a slot is eight bytes.
    pub values: Vec<Option<Box<RtValue>>>,
    /// Per register, the index of its buffer: a permutation (moves exchange entries).
    pub phys: Vec<u32>,
    pub live: Vec<bool>,
    pub dead: Vec<bool>,
    /// The states of the nested loops' frames (`BufferAction::Loop`).
    pub nested: Vec<State>,
}

/// What machine code is handed of a `State`: its arrays, as raw pointers (`#[repr(C)]`: the
/// code reads the fields at their offsets).
#[repr(C)]
pub(crate) struct RawState {
    pub live: *mut bool,
    pub dead: *mut bool,
    pub phys: *mut u32,
    /// Per buffer, the address of its first element.
    pub data: *const usize,
    pub buffers: *mut Storage,
    /// Per slot, `Option<Box<RtValue>>`: a pointer, null when empty.
    pub values: *mut Option<Box<RtValue>>,
}

impl State {
    /// A state for `steps`: a buffer per slot (a buffer the machine cannot give is an error).
    pub fn new(steps: &Steps, nested: Vec<State>) -> Result<State> {
        let mut buffers = Vec::with_capacity(steps.slots.len());
        for s in &steps.slots {
            buffers.push(match s {
                Slot::Buffer(t) => {
                    crate::tensor::check_allocation("executor", t)?;
                    Storage::filled(t.dtype, numel(&t.shape), 0.0)
                }
                Slot::Value(_) => Storage::Bool(Vec::new()),
            });
        }
        let n = steps.slots.len();
        Ok(State {
            buffers,
            data: Vec::with_capacity(n),
            values: vec![None; n],
            phys: (0..n as u32).collect(),
            live: vec![false; n],
            dead: vec![false; steps.fused.nodes.len()],
            nested,
        })
    }

    /// Every buffer's address refreshed, and the arrays as machine code reads them. The
    /// pointers are valid while the state is neither resized nor moved.
    pub fn raw(&mut self) -> RawState {
        self.data.clear();
        self.data.extend(self.buffers.iter_mut().map(address));
        RawState {
            live: self.live.as_mut_ptr(),
            dead: self.dead.as_mut_ptr(),
            phys: self.phys.as_mut_ptr(),
            data: self.data.as_ptr(),
            buffers: self.buffers.as_mut_ptr(),
            values: self.values.as_mut_ptr(),
        }
    }

    /// After buffer `b` may have been replaced: its address, where machine code reads it.
    #[inline]
    fn refresh(&mut self, b: usize) {
        if let Some(at) = self.data.get_mut(b) {
            *at = address(&mut self.buffers[b]);
        }
    }

    /// The buffer that register `r` holds.
    #[inline]
    pub fn buffer(&self, r: usize) -> &Storage {
        &self.buffers[self.phys[r] as usize]
    }

    /// The value register `r` holds. Values, like buffers, sit in the slot the permutation
    /// gives the register, so a move exchanges two entries of `phys` and copies nothing.
    #[inline]
    pub fn value(&mut self, r: usize) -> &mut Option<Box<RtValue>> {
        &mut self.values[self.phys[r] as usize]
    }

    /// The value register `r` holds: moved out (`take`, its last read) or cloned.
    pub fn read_value(&mut self, r: usize, take: bool) -> Option<RtValue> {
        let slot = self.value(r);
        let value = if take { slot.take() } else { slot.clone() };
        value.map(|v| *v)
    }

    /// `t`'s elements into register `r`'s buffer.
    #[inline]
    pub fn load(&mut self, r: usize, t: &Tensor) -> Result<()> {
        let b = self.phys[r] as usize;
        crate::with_dtype!(t.dtype(), T, {
            let to = T::slice_mut(&mut self.buffers[b]).ok_or_else(|| {
                Error::internal("executor", "an input's buffer has another dtype")
            })?;
            to.copy_from_slice(t.as_slice::<T>()?);
        });
        Ok(())
    }

    /// Register `r`'s buffer as a tensor of type `ty`.
    pub fn unload(&self, r: usize, ty: &TensorType) -> Result<Tensor> {
        crate::with_dtype!(ty.dtype, T, {
            let xs = T::slice(self.buffer(r)).ok_or_else(|| {
                Error::internal("executor", "a result's buffer has another dtype")
            })?;
            Tensor::collect::<T>(&ty.shape, xs.iter().copied())
        })
    }

    /// `src`'s elements into register `r`'s buffer.
    #[inline]
    pub fn copy_in(&mut self, r: usize, src: &Storage) -> Result<()> {
        copy(&mut self.buffers[self.phys[r] as usize], src)
    }

    /// Register `from`'s elements into register `to`'s buffer (distinct buffers).
    #[inline]
    pub fn copy_register(&mut self, from: usize, to: usize) -> Result<()> {
        let (src, dst) = (self.phys[from] as usize, self.phys[to] as usize);
        let (src, dst) = if src < dst {
            let (a, b) = self.buffers.split_at_mut(dst);
            (&a[src], &mut b[0])
        } else {
            let (a, b) = self.buffers.split_at_mut(src);
            (&b[0], &mut a[dst])
        };
        copy(dst, src)
    }

    /// Register `r`'s buffer exchanged with register `other_r`'s of another state (a nested
    /// loop's), both addresses refreshed.
    #[inline]
    pub fn exchange(&mut self, r: usize, other: &mut State, other_r: usize) {
        let (b, other_b) = (self.phys[r] as usize, other.phys[other_r] as usize);
        std::mem::swap(&mut self.buffers[b], &mut other.buffers[other_b]);
        self.refresh(b);
        other.refresh(other_b);
    }

    /// Register `other_r`'s elements in another state into register `r`'s buffer.
    #[inline]
    pub fn copy_from(&mut self, r: usize, other: &State, other_r: usize) -> Result<()> {
        copy(
            &mut self.buffers[self.phys[r] as usize],
            other.buffer(other_r),
        )
    }

    /// `kernel` on the buffers of registers `data` into those of `out..out + count` (distinct
    /// from the inputs': registers map to distinct buffers).
    #[inline]
    pub fn run_kernel(
        &mut self,
        kernel: &DestKernel,
        data: &[Reg],
        out: usize,
        count: usize,
    ) -> Result<()> {
        let State { buffers, phys, .. } = self;
        let mut written: SmallVec<[Storage; 1]> = (out..out + count)
            .map(|r| std::mem::replace(&mut buffers[phys[r] as usize], Storage::Bool(Vec::new())))
            .collect();
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
            let b = self.phys[r] as usize;
            self.buffers[b] = w;
            self.refresh(b);
        }
        done
    }

    /// Pushes register `item`'s buffer (of type `ty`) onto the stack in register `stack`.
    pub fn push(&mut self, stack: usize, item: usize, ty: &TensorType) -> Result<()> {
        let element = &self.buffers[self.phys[item] as usize];
        let items = stack_in(&mut self.values[self.phys[stack] as usize])?;
        if ty == items.element() {
            items.push_elements(element)
        } else {
            items.push(unload(element, ty)?)
        }
    }

    /// Pops the stack in register `stack` into register `into`'s buffer (`None`: the register
    /// holds a value, and the top comes back as a tensor). An empty stack is an error.
    pub fn pop(&mut self, stack: usize, into: Option<usize>) -> Result<Popped> {
        let mut scratch = Storage::Bool(Vec::new());
        let b = into.map(|r| self.phys[r] as usize);
        let State {
            buffers, values, ..
        } = self;
        let items = stack_in(&mut values[self.phys[stack] as usize])?;
        let buffer = match b {
            Some(b) => &mut buffers[b],
            None => &mut scratch,
        };
        let Some(popped) = items.pop_into(buffer) else {
            let ty = ValueType::Stack(items.element().clone());
            return Err(Error::index("stack_pop", format!("pop from an empty {ty}")));
        };
        if let Some(b) = b {
            self.refresh(b);
        }
        Ok(popped)
    }
}

/// The stack a value register's slot holds.
fn stack_in(slot: &mut Option<Box<RtValue>>) -> Result<&mut StackValue> {
    match slot.as_deref_mut() {
        Some(RtValue::Stack(items)) => Ok(items),
        _ => Err(Error::internal("executor", "a stack is missing")),
    }
}

/// The address of a buffer's first element.
pub(crate) fn address(buffer: &mut Storage) -> usize {
    match buffer {
        Storage::F32(v) => v.as_mut_ptr() as usize,
        Storage::F64(v) => v.as_mut_ptr() as usize,
        Storage::I32(v) => v.as_mut_ptr() as usize,
        Storage::I64(v) => v.as_mut_ptr() as usize,
        Storage::Bool(v) => v.as_mut_ptr() as usize,
    }
}

/// `src`'s elements into `dst`, which holds as many of the same dtype (a frame's registers
/// have static types, so anything else is a compiler bug: no buffer is reallocated here).
#[inline]
fn copy(dst: &mut Storage, src: &Storage) -> Result<()> {
    match (dst, src) {
        (Storage::F32(d), Storage::F32(s)) if d.len() == s.len() => d.copy_from_slice(s),
        (Storage::F64(d), Storage::F64(s)) if d.len() == s.len() => d.copy_from_slice(s),
        (Storage::I32(d), Storage::I32(s)) if d.len() == s.len() => d.copy_from_slice(s),
        (Storage::I64(d), Storage::I64(s)) if d.len() == s.len() => d.copy_from_slice(s),
        (Storage::Bool(d), Storage::Bool(s)) if d.len() == s.len() => d.copy_from_slice(s),
        (d, s) => return Err(mismatched_copy(d, s)),
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn mismatched_copy(dst: &Storage, src: &Storage) -> Error {
    let msg = format!(
        "a copy of {} {} elements into a buffer of {} {}",
        src.len(),
        src.dtype(),
        dst.len(),
        dst.dtype()
    );
    Error::internal("executor", msg)
}

fn unload(buffer: &Storage, ty: &TensorType) -> Result<Tensor> {
    crate::with_dtype!(ty.dtype, T, {
        let xs = T::slice(buffer)
            .ok_or_else(|| Error::internal("executor", "a result's buffer has another dtype"))?;
        Tensor::collect::<T>(&ty.shape, xs.iter().copied())
    })
}

/// A constant's elements, as a compiled frame keeps them.
pub(crate) fn storage_of(t: &Tensor) -> Option<Storage> {
    Some(crate::with_dtype!(t.dtype(), T, {
        T::into_storage(t.as_slice::<T>().ok()?.to_vec())
    }))
}

/// Whether buffers of types `a` and `b` hold the same elements: one dtype, one count.
pub(crate) fn same_buffer(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype && numel(&a.shape) == numel(&b.shape)
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
