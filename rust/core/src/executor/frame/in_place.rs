//! Slice updates in place: a `dynamic_update_slice` whose operand is read for the last time,
//! from its own register, writes the update into the operand's buffer, which moves to the
//! output (`BufferAction::Update`), instead of copying the whole operand first.
//!
//! A checkpointed loop stores each kept state as one row of a `[c + 1, ...]` snapshot buffer
//! carried through its forward loop and its advance: a copy of the buffer per store was a
//! quarter of a checkpointed RNN gradient's time in graph mode. The elements written are the
//! kernel's own (`ops::index::update_slice_in_place`), so check mode still agrees bit for bit.

use super::steps::{BufferAction, BufferStep, Slot};
use crate::dataflow::{DfKind, DfNode};
use crate::ops::{index, Op};
use crate::shape::TensorType;

/// Turns each such step of `steps` into an in-place update (after `pass_invariants`: a read
/// whose data is another register's buffer, an invariant's, is not its own to give away).
pub(super) fn slice_updates(steps: &mut [BufferStep], nodes: &[DfNode], slots: &[Slot]) {
    for step in steps.iter_mut() {
        let is_update = matches!(
            &nodes[step.node].kind,
            DfKind::Op(Op::DynamicUpdateSlice(_))
        );
        let own = step
            .reads
            .first()
            .is_some_and(|x| x.take && step.data[0] == x.reg);
        if !is_update
            || !own
            || !matches!(step.action, BufferAction::Kernel(_))
            || step.outputs != 1
        {
            continue;
        }
        let types: Option<Vec<TensorType>> = step
            .reads
            .iter()
            .map(|r| slots[r.reg as usize].tensor().cloned())
            .collect();
        let same_type =
            slots[step.out as usize].tensor() == slots[step.reads[0].reg as usize].tensor();
        let Some(kernel) = types
            .filter(|_| same_type)
            .and_then(|t| index::update_slice_in_place(&t))
        else {
            continue;
        };
        step.action = BufferAction::Update(kernel);
    }
}
