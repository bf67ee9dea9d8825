//! Element types and the single point where kernels dispatch on them.

use std::fmt;

use crate::error::{Error, Result};

/// The five element types a tensor can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    I32,
    I64,
    Bool,
}

impl DType {
    /// The numpy-style name (`float32`, `int64`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Result<DType> {
        Ok(match name {
            "float32" | "f32" => DType::F32,
            "float64" | "f64" => DType::F64,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "bool" | "bool_" => DType::Bool,
            other => {
                return Err(Error::dtype(
                    "dtype",
                    format!(
                    "unsupported dtype '{other}'; expected float32, float64, int32, int64 or bool"
                ),
                ))
            }
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Numeric means arithmetic makes sense: floats and integers, not bool.
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// All dtypes, in a fixed order (for tests and tables).
    pub const ALL: [DType; 5] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type a tensor can hold. Kernels are generic over it; `Storage` is the closed set.
pub trait Element:
    Copy + Send + Sync + PartialEq + PartialOrd + fmt::Debug + Default + 'static
{
    const DTYPE: DType;
    /// How many elements fit in a `Small` buffer.
    const SMALL: usize;
    fn into_storage(data: Vec<Self>) -> Storage;
    fn slice(storage: &Storage) -> Option<&[Self]>;
    fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]>;
    fn vec_mut(storage: &mut Storage) -> Option<&mut Vec<Self>>;
    /// A `Small` buffer of this type (every element the default).
    fn small() -> Small;
    /// The whole `Small` buffer (`SMALL` elements) when it holds this type.
    fn small_slice(small: &Small) -> Option<&[Self]>;
    fn small_slice_mut(small: &mut Small) -> Option<&mut [Self]>;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $variant:ident, $from:expr, $to:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            const SMALL: usize = SMALL_BYTES / std::mem::size_of::<$t>();
            fn into_storage(data: Vec<Self>) -> Storage {
                Storage::$variant(data)
            }
            fn small() -> Small {
                Small::$variant([<$t>::default(); SMALL_BYTES / std::mem::size_of::<$t>()])
            }
            fn small_slice(small: &Small) -> Option<&[Self]> {
                match small {
                    Small::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn small_slice_mut(small: &mut Small) -> Option<&mut [Self]> {
                match small {
                    Small::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice(storage: &Storage) -> Option<&[Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(storage: &mut Storage) -> Option<&mut Vec<Self>> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
        }
    };
}

element!(f32, F32, |v: f64| v as f32, |x: f32| x as f64);
element!(f64, F64, |v: f64| v, |x: f64| x);
element!(i32, I32, |v: f64| v as i32, |x: i32| x as f64);
element!(i64, I64, |v: f64| v as i64, |x: i64| x as f64);
element!(bool, Bool, |v: f64| v != 0.0, |x: bool| if x {
    1.0
} else {
    0.0
});

/// Bytes of elements a tensor holds inline, without a heap allocation or a shared count:
/// scalars and tiny tensors (16 float32s) are copied instead of shared.
pub const SMALL_BYTES: usize = 64;

/// An inline element buffer (`SMALL_BYTES`); a tensor uses a prefix of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Small {
    F32([f32; SMALL_BYTES / 4]),
    F64([f64; SMALL_BYTES / 8]),
    I32([i32; SMALL_BYTES / 4]),
    I64([i64; SMALL_BYTES / 8]),
    Bool([bool; SMALL_BYTES]),
}

/// A tensor's elements, borrowed, by dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elements<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    Bool(&'a [bool]),
}

/// Contiguous, row-major element buffer. Immutable once inside a `Tensor` (shared by `Arc`).
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `xs`; `Ok(false)` (nothing appended) when they are not of this buffer's dtype,
    /// a ResourceExhausted error (nothing appended) when the buffer cannot grow: a loop's
    /// stack outgrowing memory must not abort the process.
    pub fn append<T: Element>(&mut self, xs: &[T]) -> crate::Result<bool> {
        let Some(v) = T::vec_mut(self) else {
            return Ok(false);
        };
        crate::memory::fallibly(|| v.try_reserve(xs.len())).map_err(|_| {
            let bytes = (v.len() + xs.len()).saturating_mul(std::mem::size_of::<T>());
            crate::Error::new(
                crate::ErrorKind::ResourceExhausted,
                "stack_push",
                format!(
                    "a loop's stack needs {bytes} bytes after {} elements, more than this \
                     machine can allocate (fewer trips, or `checkpoints`, keep it smaller)",
                    v.len()
                ),
            )
        })?;
        v.extend_from_slice(xs);
        Ok(true)
    }

    /// Keeps the first `len` elements.
    pub fn truncate(&mut self, len: usize) {
        match self {
            Storage::F32(v) => v.truncate(len),
            Storage::F64(v) => v.truncate(len),
            Storage::I32(v) => v.truncate(len),
            Storage::I64(v) => v.truncate(len),
            Storage::Bool(v) => v.truncate(len),
        }
    }

    /// Overwrites every element with `from`'s, starting at `start` (same dtype, and `from`
    /// holds them: otherwise nothing is copied and the result is false).
    pub fn copy_from(&mut self, from: &Storage, start: usize) -> bool {
        fn copy<T: Copy>(to: &mut [T], from: &[T], start: usize) -> bool {
            match from.get(start..start + to.len()) {
                Some(xs) => {
                    to.copy_from_slice(xs);
                    true
                }
                None => false,
            }
        }
        match (self, from) {
            (Storage::F32(to), Storage::F32(xs)) => copy(to, xs, start),
            (Storage::F64(to), Storage::F64(xs)) => copy(to, xs, start),
            (Storage::I32(to), Storage::I32(xs)) => copy(to, xs, start),
            (Storage::I64(to), Storage::I64(xs)) => copy(to, xs, start),
            (Storage::Bool(to), Storage::Bool(xs)) => copy(to, xs, start),
            _ => false,
        }
    }

    /// A buffer of `len` copies of `value` (converted from f64).
    pub fn filled(dtype: DType, len: usize, value: f64) -> Storage {
        crate::with_dtype!(dtype, T, { T::into_storage(vec![T::from_f64(value); len]) })
    }
}

/// Runs `$body` with `$T` bound to the Rust type of `$dtype` (any of the five dtypes).
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident, $body:block) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

/// Like `with_dtype!` for the numeric dtypes; `$otherwise` is evaluated for bool.
#[macro_export]
macro_rules! with_numeric {
    ($dtype:expr, $T:ident, $body:block, $otherwise:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::Bool => $otherwise,
        }
    };
}

/// Like `with_dtype!` for the float dtypes; `$otherwise` is evaluated for the others.
#[macro_export]
macro_rules! with_float {
    ($dtype:expr, $T:ident, $body:block, $otherwise:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 | $crate::DType::I64 | $crate::DType::Bool => $otherwise,
        }
    };
}
