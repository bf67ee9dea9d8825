//! Runtime values: tensors, stacks threaded as values, variable handles (what the interpreter
//! passes along edges, and what a traced function captures).
//!
//! A stack is a value in the IR (`StackPush` returns a new stack), but copying it on every push
//! would make a loop that pushes once per iteration quadratic. `StackValue` shares its storage
//! (small items packed into one buffer, larger ones as tensors) and mutates in place when it holds the only reference
//! (`Arc::make_mut`), which the interpreter arranges by moving values at their last use; a stack
//! that is still shared is copied once, then owned. A variable is the one mutable thing: every
//! `VariableRef` clone is a handle to the same cell.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::dtype::{Element, Storage};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{tensor_types_compatible, ValueType};
use crate::ops::execute;
use crate::ops::{binary, Op};
use crate::shape::{numel, TensorType, DYN};
use crate::tensor::Tensor;

/// A value flowing along an edge while the interpreter runs a function.
#[derive(Clone, Debug)]
pub enum RtValue {
    Tensor(Tensor),
    Stack(StackValue),
    Resource(VariableRef),
}

impl RtValue {
    /// The value's type as the IR writes it (allocates: for messages and tests).
    pub fn value_type(&self) -> ValueType {
        match self {
            RtValue::Tensor(t) => ValueType::Tensor(t.ty().clone()),
            RtValue::Stack(s) => ValueType::Stack(s.element.clone()),
            RtValue::Resource(v) => ValueType::Resource(v.ty.clone()),
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            RtValue::Tensor(t) => Some(t),
            RtValue::Stack(_) | RtValue::Resource(_) => None,
        }
    }

    /// The tensor, or an `InvalidArgument` error saying what it is instead.
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            RtValue::Tensor(t) => Ok(t),
            other => Err(not_a("tensor", &other)),
        }
    }

    /// The stack, or an `InvalidArgument` error saying what it is instead.
    pub fn into_stack(self) -> Result<StackValue> {
        match self {
            RtValue::Stack(s) => Ok(s),
            other => Err(not_a("stack", &other)),
        }
    }

    /// The variable handle, or an `InvalidArgument` error saying what it is instead.
    pub fn into_resource(self) -> Result<VariableRef> {
        match self {
            RtValue::Resource(v) => Ok(v),
            other => Err(not_a("resource", &other)),
        }
    }

    /// Why this value cannot stand where `expected` is declared: `None` when it fits (same
    /// kind and dtype, each known dimension equal), else the natural error kind — `DType`,
    /// `Shape`, or `InvalidArgument` for a stack or resource where a tensor belongs.
    pub fn mismatch(&self, expected: &ValueType) -> Option<ErrorKind> {
        let actual = match (self, expected) {
            (RtValue::Tensor(t), ValueType::Tensor(_)) => t.ty(),
            (RtValue::Stack(s), ValueType::Stack(_)) => &s.element,
            (RtValue::Resource(v), ValueType::Resource(_)) => &v.ty,
            _ => return Some(ErrorKind::InvalidArgument),
        };
        let expected = expected.inner();
        if actual.dtype != expected.dtype {
            Some(ErrorKind::DType)
        } else if !tensor_types_compatible(actual, expected) {
            Some(ErrorKind::Shape)
        } else {
            None
        }
    }
}

impl From<Tensor> for RtValue {
    fn from(t: Tensor) -> Self {
        RtValue::Tensor(t)
    }
}

impl From<StackValue> for RtValue {
    fn from(s: StackValue) -> Self {
        RtValue::Stack(s)
    }
}

impl From<VariableRef> for RtValue {
    fn from(v: VariableRef) -> Self {
        RtValue::Resource(v)
    }
}

fn not_a(wanted: &str, got: &RtValue) -> Error {
    let got = got.value_type();
    Error::invalid("interpret", format!("expected a {wanted}, got a {got}"))
}

/// A stack of tensors of one element type, with value semantics and shared storage.
#[derive(Clone, Debug)]
pub struct StackValue {
    element: TensorType,
    items: Arc<Items>,
}

/// Elements of a static type up to this many bytes are packed into one buffer: a push copies
/// them in, a pop copies them out, and no item is an allocation of its own (a loop's
/// residuals: scalars, an RNN's state). Larger ones stay tensors, so a push keeps the tensor
/// instead of copying it.
const PACKED_ITEM_BYTES: usize = 4096;

#[derive(Clone, Debug)]
enum Items {
    /// Every item's elements, bottom first; `len` items of the element's size.
    Packed {
        data: Storage,
        len: usize,
    },
    Tensors(Vec<Tensor>),
}

/// What `StackValue::pop_into` did with the top item.
pub enum Popped {
    /// Its elements were copied into the buffer.
    Copied,
    /// It was popped as a tensor (the buffer is not of its type, or items are tensors).
    Tensor(Tensor),
}

impl StackValue {
    /// An empty stack of `element`s (`DYN` dimensions accept any size).
    pub fn new(element: TensorType) -> Self {
        let size = element
            .shape
            .iter()
            .try_fold(element.dtype.size(), |bytes, &d| {
                (d != DYN).then(|| bytes.saturating_mul(d))
            });
        let items = match size {
            Some(bytes) if bytes <= PACKED_ITEM_BYTES => Items::Packed {
                data: Storage::filled(element.dtype, 0, 0.0),
                len: 0,
            },
            _ => Items::Tensors(Vec::new()),
        };
        StackValue {
            element,
            items: Arc::new(items),
        }
    }

    pub fn element(&self) -> &TensorType {
        &self.element
    }

    pub fn len(&self) -> usize {
        match &*self.items {
            Items::Packed { len, .. } => *len,
            Items::Tensors(items) => items.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Item `k` (0 the bottom), or `None` past the top.
    pub fn item(&self, k: usize) -> Option<Tensor> {
        match &*self.items {
            Items::Packed { data, len } if k < *len => {
                let n = numel(&self.element.shape);
                crate::with_dtype!(self.element.dtype, T, {
                    let xs = T::slice(data)?.get(k * n..(k + 1) * n)?;
                    Tensor::collect::<T>(&self.element.shape, xs.iter().copied()).ok()
                })
            }
            Items::Packed { .. } => None,
            Items::Tensors(items) => items.get(k).cloned(),
        }
    }

    /// Pushes `value`; amortised O(1) when this is the only handle to the storage. A value of
    /// another dtype or shape is an error (the backward loop would pop the wrong thing).
    pub fn push(&mut self, value: Tensor) -> Result<()> {
        if value.dtype() != self.element.dtype {
            return Err(self.type_error(ErrorKind::DType, &value));
        }
        if !tensor_types_compatible(value.ty(), &self.element) {
            return Err(self.type_error(ErrorKind::Shape, &value));
        }
        match Arc::make_mut(&mut self.items) {
            Items::Packed { data, len } => {
                let n = numel(&self.element.shape);
                let appended = crate::with_dtype!(value.dtype(), T, {
                    let xs = value.as_slice::<T>()?;
                    xs.len() == n && data.append(xs)?
                });
                if !appended {
                    let msg = format!("a {} does not fit a packed {}", value.ty(), self.element);
                    return Err(Error::internal("stack_push", msg));
                }
                *len += 1;
            }
            Items::Tensors(items) => {
                reserve_one(items)?;
                items.push(value);
            }
        }
        Ok(())
    }

    /// Pushes the elements of `buffer`, a tensor of exactly the element type (a compiled
    /// frame's register): copied in, with no tensor made for a packed stack.
    pub fn push_elements(&mut self, buffer: &Storage) -> Result<()> {
        let n = numel(&self.element.shape);
        let wrong = || {
            let msg = format!(
                "a buffer of {} elements pushed onto a stack of {}",
                buffer.len(),
                self.element
            );
            Error::internal("stack_push", msg)
        };
        if buffer.dtype() != self.element.dtype || buffer.len() != n {
            return Err(wrong());
        }
        match Arc::make_mut(&mut self.items) {
            Items::Packed { data, len } => {
                let appended = crate::with_dtype!(buffer.dtype(), T, {
                    data.append(T::slice(buffer).ok_or_else(wrong)?)?
                });
                if !appended {
                    return Err(wrong());
                }
                *len += 1;
                Ok(())
            }
            Items::Tensors(items) => {
                let tensor = crate::with_dtype!(buffer.dtype(), T, {
                    let xs = T::slice(buffer).ok_or_else(wrong)?;
                    Tensor::collect::<T>(&self.element.shape, xs.iter().copied())?
                });
                reserve_one(items)?;
                items.push(tensor);
                Ok(())
            }
        }
    }

    /// Pops the top element (`None` when empty); O(1) when the storage is not shared.
    pub fn pop(&mut self) -> Option<Tensor> {
        if self.is_empty() {
            return None;
        }
        let top = self.item(self.len() - 1);
        match Arc::make_mut(&mut self.items) {
            Items::Packed { data, len } => {
                *len -= 1;
                data.truncate(*len * numel(&self.element.shape));
                top
            }
            Items::Tensors(items) => items.pop(),
        }
    }

    /// Pops the top element into `buffer` when the buffer holds exactly the element type's
    /// elements and the stack is packed (no tensor made); as a tensor otherwise. `None` when
    /// empty.
    pub fn pop_into(&mut self, buffer: &mut Storage) -> Option<Popped> {
        if self.pop_packed_into(buffer) {
            return Some(Popped::Copied);
        }
        self.pop().map(Popped::Tensor)
    }

    /// Pops the top into `buffer` where the items are packed, the stack is not empty and the
    /// buffer holds exactly an item; else changes nothing and returns false.
    pub fn pop_packed_into(&mut self, buffer: &mut Storage) -> bool {
        let n = numel(&self.element.shape);
        let fits = buffer.dtype() == self.element.dtype && buffer.len() == n;
        let packed = matches!(&*self.items, Items::Packed { len, .. } if *len > 0);
        if !(fits && packed) {
            return false;
        }
        let Items::Packed { data, len } = Arc::make_mut(&mut self.items) else {
            return false;
        };
        if !buffer.copy_from(data, (*len - 1) * n) {
            return false;
        }
        *len -= 1;
        data.truncate(*len * n);
        true
    }

    /// Whether `self` and `other` share storage (tests check pushes do not copy).
    pub fn shares_storage_with(&self, other: &StackValue) -> bool {
        Arc::ptr_eq(&self.items, &other.items)
    }

    fn type_error(&self, kind: ErrorKind, value: &Tensor) -> Error {
        let (got, want) = (ValueType::Tensor(value.ty().clone()), self.stack_type());
        Error::new(
            kind,
            "stack_push",
            format!("cannot push a {got} onto a {want}"),
        )
    }

    fn stack_type(&self) -> ValueType {
        ValueType::Stack(self.element.clone())
    }
}

/// A handle to a variable: a cell holding its current tensor, of a fixed type. Clones share
/// the cell, so a write through one handle is seen by every reader.
#[derive(Clone, Debug)]
pub struct VariableRef {
    ty: TensorType,
    cell: Arc<Mutex<Tensor>>,
}

impl VariableRef {
    /// A variable holding `initial`, whose type becomes the variable's fixed type.
    pub fn new(initial: Tensor) -> Self {
        VariableRef {
            ty: initial.ty().clone(),
            cell: Arc::new(Mutex::new(initial)),
        }
    }

    /// A variable of type `ty` (which may have `DYN` dimensions) holding `initial`.
    pub fn with_type(ty: TensorType, initial: Tensor) -> Result<Self> {
        check_assignable("variable", &ty, &initial)?;
        Ok(VariableRef {
            ty,
            cell: Arc::new(Mutex::new(initial)),
        })
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// True when both handles name the same variable.
    pub fn same(&self, other: &VariableRef) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell)
    }

    /// The current value (the same tensor, identity included, until the next write).
    pub fn read(&self) -> Tensor {
        self.lock().clone()
    }

    /// Stores `value` under a fresh identity, so a tape tells the values before and after a
    /// write apart even when the same tensor is assigned twice.
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        check_assignable("assign_variable", &self.ty, value)?;
        *self.lock() = value.with_new_id();
        Ok(())
    }

    /// Adds `delta` (broadcast to the variable's shape) to the value, atomically: the lock is
    /// held from the read to the write, so concurrent increments are not lost.
    pub fn assign_add(&self, delta: &Tensor) -> Result<()> {
        let mut cell = self.lock();
        let mut sum = execute(&Op::Add(binary::Add), &[cell.clone(), delta.clone()])?;
        let sum = sum
            .pop()
            .ok_or_else(|| Error::internal("assign_add_variable", "add produced no output"))?;
        check_assignable("assign_add_variable", &self.ty, &sum)?;
        *cell = sum;
        Ok(())
    }

    /// Whether both handles name the same variable.
    pub fn same_variable(&self, other: &VariableRef) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell)
    }

    // A writer that panicked cannot leave a half-written tensor (the store is one move), so a
    // poisoned lock still guards a valid value: recover it instead of failing every later read.
    fn lock(&self) -> MutexGuard<'_, Tensor> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn check_assignable(op: &'static str, ty: &TensorType, value: &Tensor) -> Result<()> {
    let kind = if value.dtype() != ty.dtype {
        ErrorKind::DType
    } else if !tensor_types_compatible(value.ty(), ty) {
        ErrorKind::Shape
    } else {
        return Ok(());
    };
    let (got, want) = (
        ValueType::Tensor(value.ty().clone()),
        ValueType::Tensor(ty.clone()),
    );
    Err(Error::new(
        kind,
        op,
        format!("cannot store a {got} in a variable of type {want}"),
    ))
}

/// Stacks of tensors holding at least this many bytes check, each time their length reaches a
/// power of two, that the machine could give as much again.
const HEADROOM_ABOVE_BYTES: usize = 1 << 24;

/// Room for one more item of a stack of tensors, or a ResourceExhausted error. Each item is
/// an allocation of its own, so the stack never asks for one large block that could fail
/// cleanly: when its length reaches a power of two past 16 MiB it asks the system for as much
/// as it holds, and stops (freeing nothing it did not own) while the loop's kernels still
/// have that much room, rather than when a small allocation fails inside one of them.
fn reserve_one(items: &mut Vec<Tensor>) -> Result<()> {
    let refused = |what: String| Error::new(ErrorKind::ResourceExhausted, "stack_push", what);
    crate::memory::fallibly(|| items.try_reserve(1)).map_err(|_| {
        refused(format!(
            "a loop's stack of {} items cannot grow",
            items.len()
        ))
    })?;
    let n = items.len();
    if n.is_power_of_two() {
        let held: usize = items.iter().map(|t| t.numel() * t.dtype().size()).sum();
        let asked = || Vec::<u8>::new().try_reserve_exact(held).is_err();
        if held >= HEADROOM_ABOVE_BYTES && crate::memory::fallibly(asked) {
            return Err(refused(format!(
                "a loop's stack holds {held} bytes in {n} items and this machine could not \
                 allocate as much again (fewer trips, or `checkpoints`, keep it smaller)"
            )));
        }
    }
    Ok(())
}
