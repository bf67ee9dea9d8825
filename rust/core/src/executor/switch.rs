//! The switch's rule, which output a selector picks, for every tier: the token executor and
//! register programs read it from a tensor (`selector_output`), compiled frames from a buffer
//! (`selected`), and native code emits the same comparison (`frame::native::emit`).

use crate::dtype::{DType, Storage};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime_values::RtValue;

/// A bool picks 1 (true) or 0; an i32 index in range picks itself, out of range (negative
/// too) the last.
fn pick(selector: Selector, outputs: usize) -> usize {
    match selector {
        Selector::Bool(b) => usize::from(b),
        Selector::Index(i) => usize::try_from(i)
            .ok()
            .filter(|&i| i < outputs)
            .unwrap_or(outputs.saturating_sub(1)),
    }
}

enum Selector {
    Bool(bool),
    Index(i32),
}

/// The output `selector` (a scalar tensor) picks among `outputs`.
pub(crate) fn selector_output(selector: &RtValue, outputs: usize) -> Result<usize> {
    let t = match selector {
        RtValue::Tensor(t) => t,
        other => {
            return Err(other
                .clone()
                .into_tensor()
                .err()
                .unwrap_or_else(|| Error::internal("switch", "the selector is not a tensor")))
        }
    };
    if !t.shape().is_empty() {
        let msg = format!(
            "the predicate or index must be a scalar, got shape {:?}",
            t.shape()
        );
        return Err(Error::new(ErrorKind::Shape, "switch", msg));
    }
    let selector = match t.dtype() {
        DType::Bool => Selector::Bool(t.as_slice::<bool>()?[0]),
        DType::I32 => Selector::Index(t.as_slice::<i32>()?[0]),
        other => {
            let msg = format!("the predicate must be bool and the index i32, got {other}");
            return Err(Error::dtype("switch", msg));
        }
    };
    Ok(pick(selector, outputs))
}

/// The output the selector in `buffer` (a compiled frame's scalar bool or i32) picks.
pub(crate) fn selected(buffer: &Storage, outputs: usize) -> Result<usize> {
    let selector = match buffer {
        Storage::Bool(b) if b.len() == 1 => Selector::Bool(b[0]),
        Storage::I32(i) if i.len() == 1 => Selector::Index(i[0]),
        _ => {
            return Err(Error::internal(
                "switch",
                "the selector is not a bool or i32 scalar",
            ))
        }
    };
    Ok(pick(selector, outputs))
}
