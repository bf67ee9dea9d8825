//! `gl.vmap`'s hooks: batching levels and the lane views of tensors (the batching rules live in
//! the core: `gradloop::batch` and each op's `OpDef::batch`).

use std::sync::Arc;

use gradloop::batch::{lanes_at, new_level, over, stand_ins, strip, LaneSet, Lanes, Narrowing};
use gradloop::ops::build;
use gradloop::trace::Val;
use gradloop::{ErrorKind, Value};
use pyo3::prelude::*;

use crate::errors::{new_err, IntoPyResult};
use crate::runtime;
use crate::tensor::PyTensor;

/// Starts a batching level (one `vmap` call) of `lanes` lanes, innermost; returns it.
#[pyfunction]
pub fn vmap_begin(lanes: usize) -> u64 {
    let level = new_level();
    runtime::push_batch_level(level, lanes);
    level
}

/// How many lanes level `level` holds now (None when known only at run time).
#[pyfunction]
pub fn vmap_lanes(py: Python<'_>, level: u64) -> PyResult<Option<usize>> {
    let count = current(py, level)?.count;
    Ok((count != gradloop::DYN).then_some(count))
}

/// Ends batching level `level`; false when it was not active.
#[pyfunction]
pub fn vmap_end(level: u64) -> bool {
    runtime::pop_batch_level(level)
}

/// Sets every active batching level aside until `vmap_resume`: a function traced in between
/// is one lane's (a custom rule's function, whose call is then batched as a node).
#[pyfunction]
pub fn vmap_suspend() {
    runtime::suspend_batch_levels();
}

/// Makes the levels the last `vmap_suspend` set aside active again; false when none were.
#[pyfunction]
pub fn vmap_resume() -> bool {
    runtime::resume_batch_levels()
}

/// The active batching levels, innermost last.
#[pyfunction]
pub fn vmap_levels() -> Vec<u64> {
    runtime::batch_levels().iter().map(|s| s.level).collect()
}

/// The current lanes of active level `level`.
fn current(py: Python<'_>, level: u64) -> PyResult<Arc<LaneSet>> {
    runtime::batch_levels()
        .into_iter()
        .find(|s| s.level == level)
        .ok_or_else(|| {
            new_err(
                py,
                ErrorKind::Internal,
                "vmap",
                format!("batching level {level} is not active"),
            )
        })
}

/// One lane's view of `t`, whose axis 0 holds the current lanes of `level`.
#[pyfunction]
pub fn lanes_wrap(py: Python<'_>, t: &Bound<'_, PyTensor>, level: u64) -> PyResult<PyTensor> {
    Lanes::wrap(t.get().inner.clone(), &current(py, level)?)
        .py(py)
        .map(PyTensor::new)
}

/// The current lanes of `level` of `t` (lanes along axis 0) if `t` is batched at `level`,
/// else None. A value of lanes that include the current ones is gathered to them.
#[pyfunction]
pub fn lanes_unwrap(
    py: Python<'_>,
    t: &Bound<'_, PyTensor>,
    level: u64,
) -> PyResult<Option<PyTensor>> {
    let v = t.get().inner.clone();
    if lanes_at(&v, level).is_none() {
        return Ok(None);
    }
    let set = current(py, level)?;
    runtime::run(py, 0, move |ctx| {
        let lanes = lanes_at(&v, level).expect("checked above");
        over(ctx, lanes, &set)
    })
    .map(|p| Some(PyTensor::new(p)))
}

/// The levels `t` is batched at, innermost `vmap` first.
#[pyfunction]
pub fn lanes_levels(t: &Bound<'_, PyTensor>) -> Vec<u64> {
    strip(&t.get().inner).1.iter().map(|s| s.level).collect()
}

/// Narrows level `level` to the lanes `rows` (int64 indices into its current lanes): values
/// over wider lanes are gathered when used, until `lanes_widen(level)`.
#[pyfunction]
pub fn lanes_narrow(py: Python<'_>, level: u64, rows: &Bound<'_, PyTensor>) -> PyResult<()> {
    let rows = rows.get().inner.clone();
    let current = runtime::batch_levels()
        .into_iter()
        .rfind(|s| s.level == level);
    // Rows of rows: these lanes as rows of the chain's top, gathered from it once.
    let shortcut = match current.as_ref().and_then(|c| Some((c, c.narrowing()?))) {
        Some((set, (parent, Narrowing::Rows(parent_rows)))) => {
            let (ancestor, through) = match set.shortcut() {
                Some((a, r)) => (a.clone(), r.clone()),
                None => (parent.clone(), parent_rows.clone()),
            };
            let picked = rows.clone();
            let composed = runtime::run(py, 0, move |ctx| build::take(ctx, &through, &picked, 0))?;
            Some((ancestor, composed))
        }
        _ => None,
    };
    narrow(py, level, Narrowing::Rows(rows), shortcut)
}

/// Narrows level `level` to stand-ins: each lane outside `mask` (bool over its current lanes)
/// computes on a copy of the first lane inside it, until `lanes_widen(level)`.
#[pyfunction]
pub fn lanes_stand_in(py: Python<'_>, level: u64, mask: &Bound<'_, PyTensor>) -> PyResult<()> {
    let mask = mask.get().inner.clone();
    let lanes = mask.ty().shape.first().copied().unwrap_or(0);
    let (lanes_in, _any) = runtime::run(py, 0, move |ctx| stand_ins(ctx, &mask, lanes, "vmap"))?;
    narrow(py, level, lanes_in.into(), None)
}

fn narrow(
    py: Python<'_>,
    level: u64,
    narrowing: Narrowing,
    shortcut: Option<(Arc<LaneSet>, Val)>,
) -> PyResult<()> {
    if runtime::narrow_batch_level(level, narrowing, shortcut) {
        return Ok(());
    }
    Err(new_err(
        py,
        ErrorKind::Internal,
        "vmap",
        format!("batching level {level} is not active"),
    ))
}

/// Undoes the last `lanes_narrow(level)`.
#[pyfunction]
pub fn lanes_widen(py: Python<'_>, level: u64) -> PyResult<()> {
    if runtime::widen_batch_level(level) {
        return Ok(());
    }
    Err(new_err(
        py,
        ErrorKind::Internal,
        "vmap",
        format!("batching level {level} is not narrowed"),
    ))
}
