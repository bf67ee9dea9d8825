//! Python index expressions (`t[1, ::-2, None, ...]`, `xs[i]` with a scalar int tensor) to the
//! core's index items.

use gradloop::ops::indexing::{getitem as core_getitem, IndexItem};
use gradloop::trace::Val;
use gradloop::{ErrorKind, Tensor, Value};
use pyo3::prelude::*;
use pyo3::types::{PyEllipsis, PyInt, PySlice, PyTuple};

use crate::errors::new_err;
use crate::runtime::{eager_ok, numel, run, run_eager};
use crate::tensor::PyTensor;

fn opt_i64(obj: Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if obj.is_none() {
        Ok(None)
    } else {
        Ok(Some(obj.extract()?))
    }
}

fn item(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<IndexItem<Val>> {
    if obj.is_none() {
        return Ok(IndexItem::NewAxis);
    }
    if obj.is_instance_of::<PyEllipsis>() {
        return Ok(IndexItem::Ellipsis);
    }
    if let Ok(t) = obj.cast::<PyTensor>() {
        let t = &t.get().inner;
        let ty = t.ty();
        if ty.ndim() == 0 && ty.dtype.is_int() {
            return Ok(IndexItem::Tensor(t.clone()));
        }
        return Err(new_err(
            py,
            ErrorKind::Index,
            "getitem",
            format!(
                "a tensor index must be a scalar int32/int64 tensor, got {}{}; use gl.take to gather",
                ty.dtype,
                gradloop::shape::ShapeDisplay(&ty.shape)
            ),
        ));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(IndexItem::Int(obj.extract()?));
    }
    if let Ok(s) = obj.cast::<PySlice>() {
        return Ok(IndexItem::Slice {
            start: opt_i64(s.getattr("start")?)?,
            stop: opt_i64(s.getattr("stop")?)?,
            step: opt_i64(s.getattr("step")?)?,
        });
    }
    if obj.hasattr("__index__")? && !obj.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(IndexItem::Int(obj.call_method0("__index__")?.extract()?));
    }
    Err(new_err(
        py,
        ErrorKind::Index,
        "getitem",
        format!(
            "unsupported index {}: use ints, slices, None, ..., or a scalar int tensor (gl.take gathers with arrays)",
            obj.repr()?
        ),
    ))
}

pub fn getitem(py: Python<'_>, x: &Val, index: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    let items: Vec<IndexItem<Val>> = match index.cast::<PyTuple>() {
        Ok(t) => t.iter().map(|o| item(py, &o)).collect::<PyResult<_>>()?,
        Err(_) => vec![item(py, index)?],
    };
    let symbolic_index = items
        .iter()
        .any(|i| matches!(i, IndexItem::Tensor(v) if !v.is_concrete()));
    let size = if symbolic_index { 0 } else { numel(x) };
    let x = [x.clone()];
    if !symbolic_index && eager_ok(&x) {
        return run_eager(py, size, x, move |ctx, [x]| {
            let items: Vec<IndexItem<Tensor>> = items.into_iter().map(concrete_item).collect();
            core_getitem(ctx, &x, &items)
        })
        .map(PyTensor::new);
    }
    let [x] = x;
    run(py, size, move |ctx| core_getitem(ctx, &x, &items)).map(PyTensor::new)
}

/// An index item over concrete tensors (the eager fast path: no symbolic index).
fn concrete_item(item: IndexItem<Val>) -> IndexItem<Tensor> {
    match item {
        IndexItem::Int(i) => IndexItem::Int(i),
        IndexItem::Slice { start, stop, step } => IndexItem::Slice { start, stop, step },
        IndexItem::NewAxis => IndexItem::NewAxis,
        IndexItem::Ellipsis => IndexItem::Ellipsis,
        IndexItem::Tensor(Val::Tensor(t)) => IndexItem::Tensor(t),
        IndexItem::Tensor(Val::Symbol(_) | Val::Batched(_)) => {
            unreachable!("checked: no symbolic index")
        }
    }
}
