//! Running one ready node of the token executor: ops through the op table, the control
//! primitives by moving their input, variable and stack nodes through their construct's
//! `Kernel` (in `crate::control`), a fused loop through its `FusedLoop`.

use smallvec::{smallvec, SmallVec};

use super::checked::checked_types;
use super::failure::Failure;
use super::kernel::Kernel;
use super::plan::NodePlan;
use super::switch::selector_output;
use crate::dataflow::{DataflowGraph, DfKind, DfNode};
use crate::error::{Error, Result};
use crate::graph::NodeId;
use crate::ops::{execute, Op};
use crate::runtime_values::RtValue;
use crate::shape::TensorType;
use crate::tensor::Tensor;

/// A ready node with its inputs taken out of the run's state.
pub(crate) struct Prepared {
    pub inputs: SmallVec<[RtValue; 4]>,
}

/// What running a node produced.
pub(crate) enum Outcome {
    /// Every output dead.
    Dead,
    /// One value per output.
    Values(SmallVec<[RtValue; 2]>),
    /// A switch: `value` on output `output`, every other output dead.
    Routed { output: usize, value: RtValue },
}

/// Work below which a node runs on the thread that found it ready, under the run's lock:
/// handing it to another thread would cost more than it does.
const INLINE_WORK: usize = 1 << 15;

/// Whether `op` on `inputs` (producing `outputs`, when known) is worth running outside the
/// run's lock, beside other work.
pub(crate) fn is_heavy<'t>(
    op: &Op,
    inputs: impl Iterator<Item = &'t Tensor>,
    outputs: Option<&[TensorType]>,
) -> bool {
    let inputs: SmallVec<[&[usize]; 4]> = inputs.map(Tensor::shape).collect();
    let outputs: SmallVec<[&[usize]; 2]> = outputs
        .unwrap_or_default()
        .iter()
        .map(|t| &t.shape[..])
        .collect();
    op.work(&inputs, &outputs) >= INLINE_WORK
}

/// Whether node `id` is cheap enough to run inside a fused loop (`dataflow::fuse_frames`):
/// an op whose static types are known and whose work stays under the inline threshold, or
/// any other node but an argument or an unfused loop's entry.
pub(crate) fn is_cheap(graph: &DataflowGraph, id: NodeId) -> bool {
    match &graph.nodes[id].kind {
        DfKind::Op(op) => checked_types(&graph.nodes, id).is_some_and(|c| {
            let inputs: SmallVec<[&[usize]; 4]> = c.inputs.iter().map(|t| &t.shape[..]).collect();
            let outputs: SmallVec<[&[usize]; 2]> = c.outputs.iter().map(|t| &t.shape[..]).collect();
            op.work(&inputs, &outputs) < INLINE_WORK
        }),
        DfKind::Arg(_) | DfKind::Enter { .. } => false,
        _ => true,
    }
}

/// Moves the tensors out of `slots` into `tensors` (an error names an input that is not one).
pub(crate) fn take_tensors(slots: &mut [Option<RtValue>], tensors: &mut Vec<Tensor>) -> Result<()> {
    for (i, slot) in slots.iter_mut().enumerate() {
        match slot.take() {
            Some(RtValue::Tensor(t)) => tensors.push(t),
            Some(other) => {
                let mut e = match other.into_tensor() {
                    Err(e) => e,
                    Ok(_) => Error::internal("executor", "not a tensor"),
                };
                e.message = format!("input {i}: {}", e.message);
                return Err(e);
            }
            None => return Err(Error::internal("executor", format!("input {i} is missing"))),
        }
    }
    Ok(())
}

/// Runs the prepared node.
pub(crate) fn run_node(node: &DfNode, np: &NodePlan, p: Prepared) -> Result<Outcome, Failure> {
    let mut inputs = p.inputs;
    let pass = |inputs: &mut SmallVec<[RtValue; 4]>| -> Result<Outcome> {
        let v = inputs
            .drain(..)
            .next()
            .ok_or_else(|| Error::internal(node.kind.name(), "no input"))?;
        Ok(Outcome::Values(smallvec![v]))
    };
    match &node.kind {
        DfKind::Arg(_)
        | DfKind::Identity
        | DfKind::Merge { .. }
        | DfKind::Enter { .. }
        | DfKind::Exit
        | DfKind::NextIteration => Ok(pass(&mut inputs)?),
        DfKind::Const(c) => Ok(Outcome::Values(smallvec![RtValue::Tensor(c.0.clone())])),
        DfKind::Op(op) => {
            let tensors: SmallVec<[Tensor; 4]> = inputs
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    v.into_tensor().map_err(|mut e| {
                        e.message = format!("input {i}: {}", e.message);
                        e
                    })
                })
                .collect::<Result<_>>()?;
            let outs = execute(op, &tensors)?;
            Ok(Outcome::Values(
                outs.into_iter().map(RtValue::Tensor).collect(),
            ))
        }
        DfKind::Switch { outputs } => {
            let mut it = inputs.into_iter();
            let (Some(value), Some(selector)) = (it.next(), it.next()) else {
                return Err(Error::internal("switch", "takes (data, selector)").into());
            };
            let output = selector_output(&selector, *outputs)?;
            Ok(Outcome::Routed { output, value })
        }
        DfKind::NoOp => Ok(Outcome::Values(SmallVec::new())),
        DfKind::Variable(v) => Ok(v.run(inputs).map(Outcome::Values)?),
        DfKind::Stack(s) => Ok(s.run(inputs).map(Outcome::Values)?),
        DfKind::Loop(_) => match &np.fused {
            Some(fused) => fused.run(inputs).map(Outcome::Values),
            None => Err(Error::internal("loop", "the fused loop was not compiled").into()),
        },
    }
}
