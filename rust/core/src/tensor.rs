//! `Tensor`: an immutable, contiguous, row-major buffer with a unique identity. Scalars and
//! tiny tensors (up to `SMALL_BYTES`) hold their elements inline and are copied; larger ones
//! share a buffer by `Arc`.
//!
//! Immutability is what lets the tape keep forward values without copying and lets numpy view
//! a tensor's memory without a copy (read-only). The identity (`id`) is what tapes track: two
//! handles to the same value share it; a value re-wrapped with `with_new_id` is a new tensor.
//! Inline elements cost no allocation and no atomic count to create, clone or drop, which is
//! most of what a loop over scalars or small vectors would otherwise spend.

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::dtype::{DType, Element, Elements, Small, Storage};
use crate::error::{Error, Result};
use crate::shape::{numel, Shape, ShapeDisplay, TensorType};

/// Identity of a tensor value, unique within the process.
pub type TensorId = u64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Identities a thread takes from `NEXT_ID` at once: most new ids then cost no atomic
/// operation (a loop creates one per op it runs).
const ID_BLOCK: u64 = 1024;

thread_local! {
    /// The thread's unused identities: `next..end`.
    static IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A fresh identity, unique in the process (also used for symbolic values, so ids never
/// collide across modes). Ids are not ordered across threads.
pub fn next_id() -> TensorId {
    IDS.with(|ids| {
        let (next, end) = ids.get();
        if next < end {
            ids.set((next + 1, end));
            return next;
        }
        let start = NEXT_ID.fetch_add(ID_BLOCK, Ordering::Relaxed);
        ids.set((start + 1, start + ID_BLOCK));
        start
    })
}

/// An identity that no value made before this call has, on any thread, and that every value
/// this thread makes after it exceeds: this thread starts a block of its own here. What
/// separates the values a trace closes over from those it makes (`Tracer::closed_over`).
pub fn id_epoch() -> TensorId {
    IDS.with(|ids| {
        let start = NEXT_ID.fetch_add(ID_BLOCK, Ordering::Relaxed);
        ids.set((start, start + ID_BLOCK));
        start
    })
}

/// Results smaller than this many bytes are allocated without asking first.
const ASK_ABOVE_BYTES: usize = 1 << 24;

/// Checks that a result of type `ty` can be allocated before a kernel allocates it (an
/// allocation that fails inside a kernel aborts the process): its size must fit in memory's
/// address range, and a large one is reserved and released once to see that the system gives
/// it. `op` names the op in the ResourceExhaustedError. Dimensions known only at run time
/// (`DYN`) are not checked here.
pub fn check_allocation(op: &str, ty: &crate::shape::TensorType) -> crate::Result<()> {
    if ty.shape.contains(&crate::shape::DYN) {
        return Ok(());
    }
    let bytes = ty
        .shape
        .iter()
        .try_fold(ty.dtype.size(), |n, &d| n.checked_mul(d));
    let refused = match bytes {
        None => true,
        Some(n) if n > isize::MAX as usize => true,
        Some(n) if n >= ASK_ABOVE_BYTES => {
            crate::memory::fallibly(|| Vec::<u8>::new().try_reserve_exact(n).is_err())
        }
        Some(_) => false,
    };
    if !refused {
        return Ok(());
    }
    let size = match bytes {
        Some(n) => format!("{n} bytes"),
        None => "more bytes than an address can count".to_owned(),
    };
    Err(crate::Error::new(
        crate::ErrorKind::ResourceExhausted,
        op.to_owned(),
        format!("its result {ty} needs {size}, more than this machine can allocate"),
    ))
}

/// Where a tensor's elements live.
#[derive(Clone, Debug)]
enum Data {
    /// Inline, a prefix of the buffer (as many elements as the shape has).
    Small(Small),
    Shared(Arc<Storage>),
    /// In memory another runtime owns (`Tensor::foreign`), read in place.
    Foreign(Arc<Foreign>),
}

/// Elements in memory another runtime owns, such as an XLA result: `owner` keeps the memory
/// alive and no one writes it, so a tensor can read it in place instead of copying it.
pub struct Foreign {
    start: std::ptr::NonNull<u8>,
    len: usize,
    dtype: DType,
    // Never touched, only dropped: unwinding cannot see it half-changed.
    _owner: std::panic::AssertUnwindSafe<Box<dyn Send + Sync>>,
}

#[allow(
    unsafe_code,
    reason = "foreign memory is immutable and its owner thread-safe"
)]
// SAFETY: the elements are immutable for the owner's lifetime (`Tensor::foreign`'s contract)
// and the owner itself is `Send + Sync`, so the block may be read from any thread.
unsafe impl Send for Foreign {}
#[allow(
    unsafe_code,
    reason = "foreign memory is immutable and its owner thread-safe"
)]
// SAFETY: as above.
unsafe impl Sync for Foreign {}

impl std::fmt::Debug for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Foreign({} x {} at {:p})",
            self.len, self.dtype, self.start
        )
    }
}

impl Foreign {
    fn slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        #[allow(
            unsafe_code,
            reason = "a slice over foreign memory kept alive by its owner"
        )]
        // SAFETY: `Tensor::foreign`'s contract: `len` elements of `dtype` (which is `T`),
        // aligned, alive and unchanged while `self` (which holds the owner) lives.
        let elements =
            unsafe { std::slice::from_raw_parts(self.start.as_ptr().cast::<T>(), self.len) };
        Some(elements)
    }
}

#[derive(Clone, Debug)]
pub struct Tensor {
    id: TensorId,
    ty: TensorType,
    data: Data,
}

impl Tensor {
    /// Wraps `storage` with `shape`; the element count must match.
    pub fn new(storage: Storage, shape: &[usize]) -> Result<Tensor> {
        let shape: Shape = shape.into();
        if numel(&shape) != storage.len() {
            return Err(Error::shape(
                "tensor",
                format!(
                    "{} elements cannot have shape {}",
                    storage.len(),
                    ShapeDisplay(&shape)
                ),
            ));
        }
        let dtype = storage.dtype();
        let small = crate::with_dtype!(dtype, T, {
            T::slice(&storage).and_then(|xs| small_of(xs.iter().copied(), xs.len()))
        });
        Ok(Tensor::with_data(
            dtype,
            shape,
            small.map_or_else(|| Data::Shared(Arc::new(storage)), Data::Small),
        ))
    }

    fn with_data(dtype: DType, shape: Shape, data: Data) -> Tensor {
        Tensor {
            id: next_id(),
            ty: TensorType { dtype, shape },
            data,
        }
    }

    /// A tensor of `shape` whose `dtype` elements are read in place at `start`, memory that
    /// `owner` keeps alive. Elements that fit inline are copied and `owner` dropped at once.
    ///
    /// # Safety
    /// `start` must point to `numel(shape)` initialised elements of `dtype` (a float or integer
    /// dtype: every bit pattern valid), aligned for it, that stay alive and unwritten for as
    /// long as `owner` lives.
    #[allow(unsafe_code, reason = "the caller vouches for foreign memory")]
    pub unsafe fn foreign(
        dtype: DType,
        shape: &[usize],
        start: *const u8,
        owner: Box<dyn Send + Sync>,
    ) -> Result<Tensor> {
        let len = numel(shape);
        let aligned = (start as usize).is_multiple_of(dtype.size());
        let start = match std::ptr::NonNull::new(start.cast_mut()) {
            Some(start) if aligned && dtype != DType::Bool => start,
            _ => {
                let msg = format!("cannot read {dtype} elements at {start:p} in place");
                return Err(Error::internal("tensor", msg));
            }
        };
        let foreign = Foreign {
            start,
            len,
            dtype,
            _owner: std::panic::AssertUnwindSafe(owner),
        };
        let small = crate::with_dtype!(dtype, T, {
            foreign
                .slice::<T>()
                .and_then(|xs| small_of(xs.iter().copied(), len))
        });
        let data = small.map_or_else(|| Data::Foreign(Arc::new(foreign)), Data::Small);
        Ok(Tensor::with_data(dtype, shape.into(), data))
    }

    /// Whether the elements live in memory another runtime owns (`foreign`).
    pub fn is_foreign(&self) -> bool {
        matches!(self.data, Data::Foreign(_))
    }

    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::new(T::into_storage(data), shape)
    }

    /// A tensor of `shape` whose elements are `elements` (as many as the shape holds), built
    /// inline when they fit: no allocation.
    pub fn collect<T: Element>(
        shape: &[usize],
        elements: impl Iterator<Item = T>,
    ) -> Result<Tensor> {
        let n = numel(shape);
        if n > T::SMALL {
            return Tensor::from_vec(elements.collect(), shape);
        }
        let mut small = T::small();
        let mut count = 0;
        if let Some(slots) = T::small_slice_mut(&mut small) {
            for (slot, x) in slots[..n].iter_mut().zip(elements) {
                *slot = x;
                count += 1;
            }
        }
        if count != n {
            let msg = format!("{count} elements cannot have shape {}", ShapeDisplay(shape));
            return Err(Error::shape("tensor", msg));
        }
        Ok(Tensor::with_data(
            T::DTYPE,
            shape.into(),
            Data::Small(small),
        ))
    }

    pub fn scalar<T: Element>(value: T) -> Tensor {
        let mut small = T::small();
        if let Some(first) = T::small_slice_mut(&mut small).and_then(|s| s.first_mut()) {
            *first = value;
        }
        Tensor::with_data(T::DTYPE, Shape::new(), Data::Small(small))
    }

    /// A tensor of `shape` whose every element is `value` converted to `dtype`.
    pub fn filled(dtype: DType, shape: &[usize], value: f64) -> Tensor {
        let n = numel(shape);
        let small = crate::with_dtype!(dtype, T, {
            small_of(std::iter::repeat_n(T::from_f64(value), n), n)
        });
        let data = small.map_or_else(
            || Data::Shared(Arc::new(Storage::filled(dtype, n, value))),
            Data::Small,
        );
        Tensor::with_data(dtype, shape.into(), data)
    }

    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::filled(dtype, shape, 0.0)
    }

    pub fn ones(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::filled(dtype, shape, 1.0)
    }

    /// An ndarray result as a tensor (copied only if it is not already row-major).
    pub fn from_array<T: Element>(array: ArrayD<T>) -> Tensor {
        let shape: Shape = array.shape().into();
        if array.len() <= T::SMALL {
            if let Some(small) = small_of(array.iter().copied(), array.len()) {
                return Tensor::with_data(T::DTYPE, shape, Data::Small(small));
            }
        }
        let data = if array.is_standard_layout() {
            let n = array.len();
            let (mut data, offset) = array.into_raw_vec_and_offset();
            let offset = offset.unwrap_or(0);
            if offset != 0 || data.len() != n {
                data.drain(..offset);
                data.truncate(n);
            }
            data
        } else {
            array.iter().copied().collect()
        };
        Tensor::with_data(
            T::DTYPE,
            shape,
            Data::Shared(Arc::new(T::into_storage(data))),
        )
    }

    /// The same elements under a new identity (so a tape sees a distinct value).
    pub fn with_new_id(&self) -> Tensor {
        Tensor {
            id: next_id(),
            ty: self.ty.clone(),
            data: self.data.clone(),
        }
    }

    /// The same elements with another shape of equal size; shares storage (no copy).
    pub fn reshaped(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape a tensor of shape {} ({} elements) into shape {}",
                    ShapeDisplay(self.shape()),
                    self.numel(),
                    ShapeDisplay(shape)
                ),
            ));
        }
        Ok(Tensor::with_data(
            self.dtype(),
            shape.into(),
            self.data.clone(),
        ))
    }

    pub fn id(&self) -> TensorId {
        self.id
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn ndim(&self) -> usize {
        self.ty.shape.len()
    }

    pub fn numel(&self) -> usize {
        match &self.data {
            Data::Small(_) => numel(&self.ty.shape),
            Data::Shared(s) => s.len(),
            Data::Foreign(f) => f.len,
        }
    }

    /// Whether the elements live inline (see the module doc).
    pub fn is_small(&self) -> bool {
        matches!(self.data, Data::Small(_))
    }

    /// The elements, borrowed, by dtype.
    pub fn elements(&self) -> Elements<'_> {
        match self.dtype() {
            DType::F32 => Elements::F32(self.as_slice::<f32>().unwrap_or_default()),
            DType::F64 => Elements::F64(self.as_slice::<f64>().unwrap_or_default()),
            DType::I32 => Elements::I32(self.as_slice::<i32>().unwrap_or_default()),
            DType::I64 => Elements::I64(self.as_slice::<i64>().unwrap_or_default()),
            DType::Bool => Elements::Bool(self.as_slice::<bool>().unwrap_or_default()),
        }
    }

    /// The elements as a slice of `T`; a dtype mismatch is an internal error.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        let slice = match &self.data {
            Data::Small(small) => {
                let n = numel(&self.ty.shape);
                T::small_slice(small).and_then(|s| s.get(..n))
            }
            Data::Shared(storage) => T::slice(storage),
            Data::Foreign(foreign) => foreign.slice(),
        };
        slice.ok_or_else(|| {
            Error::internal(
                "tensor",
                format!("expected {} storage, found {}", T::DTYPE, self.dtype()),
            )
        })
    }

    /// The elements, writable, when this tensor holds the only reference to its storage
    /// (nothing else can see a write; always for inline elements) and they are `T`s.
    pub fn unique_slice_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        match &mut self.data {
            Data::Small(small) => {
                let n = numel(&self.ty.shape);
                T::small_slice_mut(small).and_then(|s| s.get_mut(..n))
            }
            Data::Shared(storage) => Arc::get_mut(storage).and_then(T::slice_mut),
            Data::Foreign(_) => None, // its owner's memory: never written
        }
    }

    /// The same tensor (same identity) with its elements on the heap, so that `is_unique` can
    /// tell when no other handle holds it (what forward mode's accumulator prunes by).
    pub fn on_heap(self) -> Tensor {
        if !self.is_small() {
            return self;
        }
        let storage = crate::with_dtype!(self.dtype(), T, {
            T::into_storage(self.as_slice::<T>().unwrap_or_default().to_vec())
        });
        Tensor {
            data: Data::Shared(Arc::new(storage)),
            ..self
        }
    }

    /// Whether this handle is the only one holding its (heap) elements: every other handle of
    /// the tensor is gone. False for inline elements, which cannot tell.
    pub fn is_unique(&self) -> bool {
        match &self.data {
            Data::Small(_) => false,
            Data::Shared(s) => Arc::strong_count(s) == 1,
            Data::Foreign(f) => Arc::strong_count(f) == 1,
        }
    }

    /// The same storage and type under a fresh identity: what a kernel that wrote into a
    /// uniquely held input returns (the tape tells tensors apart by identity).
    pub fn renewed(self) -> Tensor {
        Tensor {
            id: next_id(),
            ..self
        }
    }

    /// An ndarray view (no copy).
    pub fn view<T: Element>(&self) -> Result<ArrayViewD<'_, T>> {
        let data = self.as_slice::<T>()?;
        ArrayViewD::from_shape(IxDyn(self.shape()), data)
            .map_err(|e| Error::internal("tensor", e.to_string()))
    }

    /// Every element converted to f64 (tests and printing).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        crate::with_dtype!(self.dtype(), T, {
            self.as_slice::<T>()
                .map(|s| s.iter().map(|x| x.to_f64()).collect())
                .unwrap_or_default()
        })
    }

    /// The single element of a size-1 tensor as f64.
    pub fn item_f64(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "item",
                format!(
                    "expected a tensor with one element, got shape {}",
                    ShapeDisplay(self.shape())
                ),
            ));
        }
        Ok(self.to_f64_vec()[0])
    }
}

/// `n` elements in a `Small` buffer, when they fit.
fn small_of<T: Element>(elements: impl Iterator<Item = T>, n: usize) -> Option<Small> {
    if n > T::SMALL {
        return None;
    }
    let mut small = T::small();
    if let Some(slots) = T::small_slice_mut(&mut small) {
        slots
            .iter_mut()
            .zip(elements)
            .for_each(|(slot, x)| *slot = x);
    }
    Some(small)
}

/// A Python-style scalar before it meets a tensor: it adapts to the tensor's dtype (as in JAX).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    /// The scalar as a 0-d tensor of `dtype`. Ints adapt to any numeric dtype, floats to float
    /// dtypes only, bools to bool only: anything else would silently change the meaning.
    pub fn to_tensor(self, dtype: DType, op: &'static str) -> Result<Tensor> {
        if !self.adapts_to(dtype) {
            return Err(Error::dtype(
                op,
                format!(
                    "cannot combine a Python {} with a {dtype} tensor; cast one of them first",
                    self.kind()
                ),
            ));
        }
        if let (Scalar::Int(i), DType::I32) = (self, dtype) {
            if i32::try_from(i).is_err() {
                return Err(Error::invalid(
                    op,
                    format!("Python int {i} does not fit in int32"),
                ));
            }
        }
        Ok(match (self, dtype) {
            (Scalar::Int(i), DType::I64) => Tensor::scalar(i),
            _ => Tensor::filled(dtype, &[], self.as_f64()),
        })
    }

    /// Whether the scalar combines with a tensor of `dtype` without changing meaning: ints with
    /// any numeric dtype, floats with floats, bools with bools.
    pub fn adapts_to(self, dtype: DType) -> bool {
        match self {
            Scalar::Bool(_) => dtype == DType::Bool,
            Scalar::Int(_) => dtype.is_numeric(),
            Scalar::Float(_) => dtype.is_float(),
        }
    }

    /// The value as a float (ints beyond 2^53 round).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// The dtype an op's operands are unified to: the first tensor's, or with only Python
    /// scalars, the widest kind's default (float over int over bool; float32 with none).
    pub fn unified_dtype(tensors: &[DType], scalars: &[Scalar]) -> DType {
        tensors.first().copied().unwrap_or_else(|| {
            scalars
                .iter()
                .map(|s| s.default_dtype())
                .max_by_key(|d| match d {
                    DType::Bool => 0,
                    DType::I32 | DType::I64 => 1,
                    _ => 2,
                })
                .unwrap_or(DType::F32)
        })
    }

    /// The dtype a scalar gets on its own (`gl.tensor(1.5)`): float32, int32 (int64 when it does
    /// not fit, as TensorFlow does) or bool.
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(i) if i32::try_from(i).is_err() => DType::I64,
            Scalar::Int(_) => DType::I32,
            Scalar::Float(_) => DType::F32,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Scalar::Bool(_) => "bool",
            Scalar::Int(_) => "int",
            Scalar::Float(_) => "float",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_unify_to_the_first_tensor_or_the_widest_scalar() {
        let (i, f, b) = (Scalar::Int(2), Scalar::Float(0.5), Scalar::Bool(true));
        assert_eq!(Scalar::unified_dtype(&[DType::F64], &[i, f]), DType::F64);
        assert_eq!(Scalar::unified_dtype(&[], &[b, i]), DType::I32);
        assert_eq!(Scalar::unified_dtype(&[], &[i, f]), DType::F32);
        assert_eq!(
            Scalar::unified_dtype(&[], &[Scalar::Int(1 << 40)]),
            DType::I64
        );
        assert_eq!(Scalar::unified_dtype(&[], &[]), DType::F32);
        assert!(i.adapts_to(DType::F32) && !f.adapts_to(DType::I32) && !b.adapts_to(DType::I32));
    }

    /// An owner that says when it is dropped.
    struct Owner(Vec<f64>, Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    #[allow(unsafe_code, reason = "foreign memory in a test")]
    fn foreign_elements_are_read_in_place_never_written_and_freed_with_the_last_handle() {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = Owner((0..100).map(f64::from).collect(), dropped.clone());
        let start = owner.0.as_ptr().cast::<u8>();
        // SAFETY: 100 f64s at `start`, alive and unwritten while the box holds `owner`.
        let t = unsafe { Tensor::foreign(DType::F64, &[10, 10], start, Box::new(owner)) }.unwrap();
        assert!(t.is_foreign() && !t.is_small());
        assert_eq!(t.as_slice::<f64>().unwrap().as_ptr().cast::<u8>(), start);
        assert_eq!(t.numel(), 100);
        assert!(t.as_slice::<f32>().is_err());
        let mut other = t.reshaped(&[100]).unwrap();
        assert!(other.unique_slice_mut::<f64>().is_none() && !other.is_unique());
        drop(t);
        assert!(other.is_unique() && !dropped.load(Ordering::SeqCst));
        assert_eq!(other.to_f64_vec()[99], 99.0);
        drop(other);
        assert!(dropped.load(Ordering::SeqCst));
        // a few elements are copied inline and the owner let go at once
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = Owner(vec![1.0, 2.0], dropped.clone());
        let start = owner.0.as_ptr().cast::<u8>();
        // SAFETY: as above.
        let t = unsafe { Tensor::foreign(DType::F64, &[2], start, Box::new(owner)) }.unwrap();
        assert!(t.is_small() && dropped.load(Ordering::SeqCst));
        assert_eq!(t.to_f64_vec(), vec![1.0, 2.0]);
        // misaligned or bool memory is refused
        let words = [0.0f64; 8];
        let start = words.as_ptr().cast::<u8>();
        // SAFETY: refused before any read (one byte past an f64's alignment).
        let odd = unsafe { Tensor::foreign(DType::F64, &[2], start.add(1), Box::new(())) };
        assert!(odd.is_err());
        // SAFETY: refused before any read.
        let flags = unsafe { Tensor::foreign(DType::Bool, &[64], start, Box::new(())) };
        assert!(flags.is_err());
    }

    #[test]
    fn construction_checks_element_count() {
        assert!(Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).is_ok());
        let err = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::Shape);
    }

    #[test]
    fn scalars_and_tiny_tensors_live_inline_and_are_copied() {
        let fits = Tensor::from_vec((0..16).map(|k| k as f32).collect(), &[4, 4]).unwrap();
        let big = Tensor::from_vec((0..17).map(|k| k as f32).collect(), &[17]).unwrap();
        assert!(fits.is_small() && !big.is_small());
        assert!(Tensor::scalar(true).is_small() && Tensor::zeros(DType::F64, &[8]).is_small());
        assert!(!Tensor::zeros(DType::F64, &[9]).is_small());
        assert_eq!(fits.as_slice::<f32>().unwrap().len(), 16);
        assert_eq!(
            fits.reshaped(&[16]).unwrap().to_f64_vec(),
            fits.to_f64_vec()
        );
        // A copy is written without touching the original.
        let mut copy = fits.clone();
        copy.unique_slice_mut::<f32>().unwrap()[0] = 7.0;
        assert_eq!(fits.as_slice::<f32>().unwrap()[0], 0.0);
        assert_eq!(copy.as_slice::<f32>().unwrap()[0], 7.0);
        // A shared buffer is written only when held alone.
        let mut shared = big.clone();
        assert!(shared.unique_slice_mut::<f32>().is_none());
        drop(big);
        assert!(shared.unique_slice_mut::<f32>().is_some());
        let made = Tensor::collect(&[2, 3], (0..6).map(|k| k as i64)).unwrap();
        assert!(made.is_small() && made.as_slice::<i64>().unwrap() == [0, 1, 2, 3, 4, 5]);
        assert!(Tensor::collect(&[2, 3], 0..5i64).is_err());
        let large = Tensor::collect(&[100], (0..100).map(|k| k as f64)).unwrap();
        assert!(!large.is_small() && large.to_f64_vec()[99] == 99.0);
    }

    #[test]
    fn reshape_shares_storage_and_gets_a_new_identity() {
        let t = Tensor::from_vec(vec![1i32, 2, 3, 4], &[4]).unwrap();
        let r = t.reshaped(&[2, 2]).unwrap();
        assert_ne!(t.id(), r.id());
        assert_eq!(r.as_slice::<i32>().unwrap(), &[1, 2, 3, 4]);
        assert!(t.reshaped(&[3]).is_err());
    }

    #[test]
    fn scalars_adapt_only_where_meaningful() {
        assert_eq!(
            Scalar::Int(2).to_tensor(DType::F32, "add").unwrap().dtype(),
            DType::F32
        );
        assert_eq!(
            Scalar::Float(0.5)
                .to_tensor(DType::F64, "add")
                .unwrap()
                .to_f64_vec(),
            vec![0.5]
        );
        assert_eq!(
            Scalar::Float(0.5)
                .to_tensor(DType::I32, "add")
                .unwrap_err()
                .kind,
            crate::ErrorKind::DType
        );
        assert!(Scalar::Int(1).to_tensor(DType::Bool, "add").is_err());
        assert_eq!(
            Scalar::Int(i64::MAX)
                .to_tensor(DType::I64, "add")
                .unwrap()
                .to_f64_vec()[0],
            i64::MAX as f64
        );
    }
}
