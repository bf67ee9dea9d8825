//! Python values to core values: `gl.tensor(...)`, operands of ops (tensors — concrete or
//! symbolic —, Python scalars that adapt to the other operand's dtype, nested lists, numpy
//! arrays), and numpy views of concrete tensors without a copy.

use gradloop::trace::{Symbol, Val};
use gradloop::{DType, Element, ErrorKind, Scalar, Tensor, Value};
use numpy::{
    PyArray, PyArrayDescrMethods, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::dtype::{numpy_name, to_dtype};
use crate::errors::{new_err, not_concrete_err, IntoPyResult};
use crate::tensor::PyTensor;

/// An op argument before dtype adaptation.
pub enum Operand {
    Tensor(Val),
    Scalar(Scalar),
}

/// A Python bool/int/float as a `Scalar` (None for anything else).
pub fn scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    // Exact types only: numpy scalars (np.float64 subclasses float) keep their own dtype.
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(Some(Scalar::Bool(obj.extract()?)));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        let v: i64 = obj.extract().map_err(|_| {
            new_err(
                obj.py(),
                ErrorKind::InvalidArgument,
                "tensor",
                format!("integer {} does not fit in int64", obj),
            )
        })?;
        return Ok(Some(Scalar::Int(v)));
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        return Ok(Some(Scalar::Float(obj.extract()?)));
    }
    Ok(None)
}

/// A number argument (`arange`'s): a Python int (or bool) is an int, anything else that
/// converts to a float (numpy scalars included) a float.
pub fn python_number(obj: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    Ok(match scalar(obj)? {
        Some(Scalar::Bool(b)) => Scalar::Int(i64::from(b)),
        Some(s) => s,
        None if obj.is_instance_of::<PyInt>() => Scalar::Int(obj.extract()?),
        None => Scalar::Float(obj.extract()?),
    })
}

pub fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Operand> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(Operand::Tensor(t.get().inner.clone()));
    }
    if let Some(s) = scalar(obj)? {
        return Ok(Operand::Scalar(s));
    }
    // Objects that stand for a tensor (a Variable) hand it over, so tapes see the real value.
    if obj.hasattr(pyo3::intern!(obj.py(), "__gl_tensor__"))? {
        let t = obj.call_method0(pyo3::intern!(obj.py(), "__gl_tensor__"))?;
        return Ok(Operand::Tensor(t.cast::<PyTensor>()?.get().inner.clone()));
    }
    Ok(Operand::Tensor(to_tensor(obj, None)?))
}

/// A single op input: a tensor, or anything `gl.tensor` accepts.
/// A sequence of tensors (or values `input` takes).
pub fn inputs(xs: &Bound<'_, PyAny>) -> PyResult<Vec<Val>> {
    let seq = xs.cast::<pyo3::types::PySequence>()?;
    (0..seq.len()?).map(|i| input(&seq.get_item(i)?)).collect()
}

pub fn input(obj: &Bound<'_, PyAny>) -> PyResult<Val> {
    match operand(obj)? {
        Operand::Tensor(t) => Ok(t),
        Operand::Scalar(s) => Ok(Val::Tensor(
            s.to_tensor(s.default_dtype(), "tensor").py(obj.py())?,
        )),
    }
}

/// A single input that must be concrete (`what` names the operation in the error).
pub fn concrete_input(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Tensor> {
    match input(obj)? {
        Val::Tensor(t) => Ok(t),
        other => Err(not_concrete_err(obj.py(), what, &other)),
    }
}

/// The two operands of a binary op, unified as `unify` does; two Tensors (the eager hot
/// path) are taken as they are.
pub fn binary_operands(
    py: Python<'_>,
    op: &'static str,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<[Val; 2]> {
    if let (Ok(a), Ok(b)) = (a.cast::<PyTensor>(), b.cast::<PyTensor>()) {
        return Ok([a.get().inner.clone(), b.get().inner.clone()]);
    }
    unify(py, op, &[a, b])?.try_into().map_err(|_| {
        new_err(
            py,
            ErrorKind::Internal,
            op,
            "expected two operands after conversion",
        )
    })
}

/// Operands of an op that needs one dtype: Python scalars take the dtype of the tensors.
pub fn unify(py: Python<'_>, op: &'static str, objs: &[&Bound<'_, PyAny>]) -> PyResult<Vec<Val>> {
    let operands: Vec<Operand> = objs.iter().map(|o| operand(o)).collect::<PyResult<_>>()?;
    let (mut tensors, mut scalars) = (Vec::new(), Vec::new());
    for o in &operands {
        match o {
            Operand::Tensor(t) => tensors.push(t.ty().dtype),
            Operand::Scalar(s) => scalars.push(*s),
        }
    }
    let dtype = Scalar::unified_dtype(&tensors, &scalars);
    operands
        .into_iter()
        .map(|o| match o {
            Operand::Tensor(t) => Ok(t),
            Operand::Scalar(s) => Ok(Val::Tensor(s.to_tensor(dtype, op).py(py)?)),
        })
        .collect()
}

/// `gl.tensor(data, dtype=None)`: a new value (a new identity: no tape connects it to `data`).
pub fn to_tensor(obj: &Bound<'_, PyAny>, dtype: Option<DType>) -> PyResult<Val> {
    let py = obj.py();
    if let Ok(t) = obj.cast::<PyTensor>() {
        return match (&t.get().inner, dtype) {
            (Val::Tensor(t), Some(d)) if d != t.dtype() => {
                gradloop::ops::build::cast(&mut gradloop::EagerContext, t, d)
                    .py(py)
                    .map(Val::Tensor)
            }
            (Val::Tensor(t), _) => Ok(Val::Tensor(t.with_new_id())),
            (Val::Symbol(s), Some(d)) if d != s.ty().dtype => {
                let s = Val::Symbol(s.clone());
                crate::runtime::run(py, 0, move |ctx| {
                    let s = gradloop::ops::build::stop_gradient(ctx, &s)?;
                    gradloop::ops::build::cast(ctx, &s, d)
                })
            }
            (Val::Symbol(s), _) => Ok(Val::Symbol(Symbol::new(
                s.frame,
                s.port,
                s.value_type().clone(),
            ))),
            // A new identity of every lane: through the batching rules.
            (lanes @ Val::Batched(_), d) => {
                let lanes = lanes.clone();
                crate::runtime::run(py, 0, move |ctx| {
                    let x = gradloop::ops::build::stop_gradient(ctx, &lanes)?;
                    match d {
                        Some(d) if d != x.ty().dtype => gradloop::ops::build::cast(ctx, &x, d),
                        _ => Ok(x),
                    }
                })
            }
        };
    }
    to_concrete(obj, dtype).map(Val::Tensor)
}

/// `gl.tensor(data, dtype)` for data that is not a tensor.
fn to_concrete(obj: &Bound<'_, PyAny>, dtype: Option<DType>) -> PyResult<Tensor> {
    let py = obj.py();
    if let Some(s) = scalar(obj)? {
        let target = dtype.unwrap_or(s.default_dtype());
        return match s {
            // An explicit dtype converts like numpy: gl.tensor(1.5, dtype=gl.int32) is 1.
            Scalar::Float(f) if !target.is_float() => Ok(Tensor::filled(target, &[], f)),
            Scalar::Int(i) if target == DType::Bool => Ok(Tensor::filled(target, &[], i as f64)),
            Scalar::Bool(b) if target != DType::Bool => {
                Ok(Tensor::filled(target, &[], f64::from(u8::from(b))))
            }
            _ => s.to_tensor(target, "tensor").py(py),
        };
    }
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        // The common argument, an array already of the wanted dtype: no `asarray` round trip.
        if let Some(own) = element_dtype(array) {
            if dtype.is_none_or(|d| d == own) {
                return gradloop::with_dtype!(own, T, { copy_array::<T>(obj) });
            }
        }
    }
    let np = py.import("numpy")?;
    let is_ndarray =
        obj.is_instance(&np.getattr("ndarray")?)? || obj.is_instance(&np.getattr("generic")?)?;
    let array = match dtype {
        Some(d) => np.call_method1("asarray", (obj, numpy_name(d))),
        None => np.call_method1("asarray", (obj,)),
    }
    .map_err(|e| {
        // A gradloop error from an element (a symbolic tensor's value) is the real cause.
        let ours = py
            .import("gradloop.errors")
            .and_then(|m| m.getattr("GradloopError"))
            .is_ok_and(|base| e.is_instance(py, &base));
        if ours {
            return e;
        }
        new_err(
            py,
            ErrorKind::Shape,
            "tensor",
            format!("cannot make a tensor from {}: {e}", short_repr(obj)),
        )
    })?;
    let array = if dtype.is_none() && !is_ndarray {
        python_defaults(&array)?
    } else {
        array
    };
    from_numpy(&array)
}

/// Nested Python lists follow the scalar defaults: floats -> float32, ints -> int32 (int64
/// when a value does not fit, as TensorFlow does: never a silent wrap).
fn python_defaults<'py>(array: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
    match kind.as_str() {
        "f" => array.call_method1("astype", ("float32",)),
        "i" | "u" => {
            let size: usize = array.getattr("size")?.extract()?;
            let fits = size == 0 || {
                let lo: i128 = array.call_method0("min")?.extract()?;
                let hi: i128 = array.call_method0("max")?.extract()?;
                lo >= i128::from(i32::MIN) && hi <= i128::from(i32::MAX)
            };
            array.call_method1("astype", (if fits { "int32" } else { "int64" },))
        }
        _ => Ok(array.clone()),
    }
}

fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let r = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<object>".into());
    if r.len() > 60 {
        format!("{}...", &r[..57])
    } else {
        r
    }
}

fn copy_array<T: Element + numpy::Element>(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let a: PyReadonlyArrayDyn<'_, T> = array.extract()?;
    let view = a.as_array();
    let data: Vec<T> = match view.as_slice() {
        Some(s) => s.to_vec(),
        None => view.iter().copied().collect(),
    };
    Tensor::from_vec(data, view.shape()).py(array.py())
}

/// The gradloop dtype of an array's elements, from its descriptor in C: numpy's `dtype.name` is
/// a Python-level property, more than half of what was a small array's conversion.
fn element_dtype(array: &Bound<'_, PyUntypedArray>) -> Option<DType> {
    let py = array.py();
    let descr = array.dtype();
    [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool]
        .into_iter()
        .find(|&d| gradloop::with_dtype!(d, T, { descr.is_equiv_to(&numpy::dtype::<T>(py)) }))
}

/// Copies a numpy array of a supported dtype into a tensor.
pub fn from_numpy(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let py = array.py();
    if let Some(dtype) = array.cast::<PyUntypedArray>().ok().and_then(element_dtype) {
        return gradloop::with_dtype!(dtype, T, { copy_array::<T>(array) });
    }
    let name: String = array.getattr("dtype")?.getattr("name")?.extract()?;
    let dtype = match DType::from_name(&name) {
        Ok(d) => d,
        Err(_) if name == "object" => {
            return Err(new_err(
                py,
                ErrorKind::Shape,
                "tensor",
                "cannot make a tensor from ragged nested sequences or objects",
            ));
        }
        Err(_) => {
            return Err(new_err(
                py,
                ErrorKind::DType,
                "tensor",
                format!("numpy dtype {name} is not supported; use float32, float64, int32, int64 or bool (pass dtype= to convert)"),
            ));
        }
    };
    // A supported dtype in the other byte order: numpy swaps it into native order first.
    let native = array.call_method1("astype", (dtype.name(),))?;
    gradloop::with_dtype!(dtype, T, { copy_array::<T>(&native) })
}

/// A tensor reading `array`'s elements in place, the array kept alive as their owner; a copy
/// (`from_numpy`) where they cannot be read in place. The caller vouches that no one writes
/// the array's memory again.
#[allow(
    unsafe_code,
    reason = "a numpy array's fields, and its memory read in place"
)]
pub fn read_in_place(array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let Ok(untyped) = array.cast::<PyUntypedArray>() else {
        return from_numpy(array);
    };
    let flags = numpy::npyffi::NPY_ARRAY_C_CONTIGUOUS | numpy::npyffi::NPY_ARRAY_ALIGNED;
    // SAFETY: `untyped` is a live numpy array; its flags and data pointer are plain fields.
    let (in_place, start) = unsafe {
        let raw = &*untyped.as_array_ptr();
        let fields = &raw.fields;
        (
            fields.flags & flags == flags,
            fields.data.cast::<u8>().cast_const(),
        )
    };
    match element_dtype(untyped) {
        Some(dtype) if in_place && dtype != DType::Bool => {
            let owner: Box<dyn Send + Sync> = Box::new(array.clone().unbind());
            // SAFETY: a C-contiguous, aligned numpy array of `dtype` holds `numel(shape)`
            // initialised elements at its data pointer; `owner` keeps the array, hence its
            // memory, alive; the caller vouches that no one writes it.
            let t = unsafe { Tensor::foreign(dtype, untyped.shape(), start, owner) };
            t.py(array.py())
        }
        _ => from_numpy(array),
    }
}

/// A read-only numpy array viewing the tensor's memory; `owner` keeps the memory alive.
/// `what` names the operation in the error for a symbolic tensor.
pub fn numpy_view<'py>(
    owner: &Bound<'py, PyTensor>,
    what: &'static str,
) -> PyResult<Bound<'py, PyAny>> {
    let py = owner.py();
    let t = match &owner.get().inner {
        Val::Tensor(t) => t,
        other => return Err(not_concrete_err(py, what, other)),
    };
    let array = gradloop::with_dtype!(t.dtype(), T, {
        view_as::<T>(t, owner.clone().into_any()).py(py)?
    });
    Ok(array)
}

#[allow(
    unsafe_code,
    reason = "a numpy array over the tensor's storage, made read-only"
)]
fn view_as<'py, T: Element + numpy::Element>(
    t: &Tensor,
    owner: Bound<'py, PyAny>,
) -> gradloop::Result<Bound<'py, PyAny>> {
    let view = t.view::<T>()?;
    // SAFETY: the view borrows the tensor's storage, which `owner` (the Python tensor holding an
    // Arc to it) keeps alive for the array's lifetime; storage is immutable and the array is made
    // read-only below, so no one can write through it.
    let array: Bound<'py, PyArrayDyn<T>> = unsafe { PyArray::borrow_from_array(&view, owner) };
    // SAFETY: `array` is a live numpy array just made, so its object pointer is valid; clearing
    // the writeable flag is the documented way to make it read-only.
    unsafe {
        (*array.as_array_ptr()).fields.flags &= !numpy::npyffi::NPY_ARRAY_WRITEABLE;
    }
    Ok(array.into_any())
}

/// `dtype=None` or any dtype spelling.
pub fn opt_dtype(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    match obj {
        Some(o) if !o.is_none() => Ok(Some(to_dtype(o)?)),
        _ => Ok(None),
    }
}
