//! Running one ready node: ops through the op table, the control primitives by moving their
//! input, variable and stack nodes through their construct's `Kernel` (in `crate::control`).

use smallvec::{smallvec, SmallVec};

use std::sync::Arc;

use super::plan::{checked_types, NodePlan};
use super::state::{Outcome, Prepared};
use crate::dataflow::{DataflowGraph, DfKind, DfNode, Origin};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::NodeId;
use crate::ops::{execute, Op};
use crate::runtime_values::RtValue;
use crate::shape::TensorType;
use crate::tensor::Tensor;

/// How the executor runs a node that stays a node after lowering (variables, stacks).
pub trait Kernel {
    fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>>;
}

/// The inputs of `op`'s node one at a time; a missing one is an internal error (a verified
/// graph has none).
pub fn input_reader(
    op: &'static str,
    inputs: SmallVec<[RtValue; 4]>,
) -> impl FnMut() -> Result<RtValue> {
    let mut inputs = inputs.into_iter();
    move || {
        inputs
            .next()
            .ok_or_else(|| Error::internal(op, "missing input"))
    }
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

/// An error, and where it happened when that was inside a fused frame.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: Error,
    pub inner: Option<Inside>,
}

/// Where in a fused frame a failure happened: the failing node's origin and its iteration in
/// each fused loop around it, innermost first.
#[derive(Debug, Default)]
pub(crate) struct Inside {
    pub origin: Option<Arc<Origin>>,
    pub iterations: SmallVec<[i64; 2]>,
}

impl Failure {
    /// Notes that the failure happened at `node` of a fused frame, in `iteration` when the
    /// frame is a loop's.
    pub fn inside(&mut self, node: &DfNode, iteration: Option<i64>) {
        let inside = self.inner.get_or_insert_with(|| Inside {
            origin: node.origin.clone(),
            iterations: SmallVec::new(),
        });
        inside.iterations.extend(iteration);
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure { error, inner: None }
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
        DfKind::Loop(_) => match &np.program {
            Some(program) => program.run(inputs).map(Outcome::Values),
            None => Err(Error::internal("loop", "the fused loop was not compiled").into()),
        },
    }
}

/// The output a switch's selector picks: a bool picks 1 (true) or 0; an i32 index in range
/// picks itself, out of range (negative too) the last.
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
    match t.dtype() {
        DType::Bool => Ok(usize::from(t.as_slice::<bool>()?[0])),
        DType::I32 => {
            let i = t.as_slice::<i32>()?[0];
            Ok(usize::try_from(i)
                .ok()
                .filter(|&i| i < outputs)
                .unwrap_or(outputs - 1))
        }
        other => {
            let msg = format!("the predicate must be bool and the index i32, got {other}");
            Err(Error::dtype("switch", msg))
        }
    }
}
