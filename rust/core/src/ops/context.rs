//! The `Context` seam: ops are applied through a context, never called directly. The eager
//! context runs kernels; a graph context (graph mode) adds nodes; `TapeContext` (in `tape`) wraps
//! either and records what runs, which is how gradients of gradients come for free.

use smallvec::SmallVec;

use super::{Op, Values};
use crate::error::{Error, Result};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::{NodeName, Value};

pub trait Context<V: Value> {
    /// Applies `op` to `inputs`, returning its outputs.
    fn apply(&mut self, op: &Op, inputs: &[V]) -> Result<Values<V>>;

    /// Applies a node that is not an op of the table: control flow (`If`, `Case`, `While`,
    /// `Call`), constants, variables and stacks. Only graph-building contexts support them.
    fn apply_node(&mut self, kind: &V::Node, inputs: &[V]) -> Result<Values<V>> {
        let _ = inputs;
        Err(Error::invalid(
            kind.name(),
            "this node only exists in graphs: use it inside @gl.function",
        ))
    }

    /// The trace this context adds nodes to, if any (gradients of control flow build functions
    /// in it).
    fn tracer(&self) -> Option<V::Trace> {
        None
    }
}

/// Runs ops at once on the CPU kernels.
#[derive(Clone, Copy, Debug, Default)]
pub struct EagerContext;

impl Context<Tensor> for EagerContext {
    fn apply(&mut self, op: &Op, inputs: &[Tensor]) -> Result<Values<Tensor>> {
        execute(op, inputs)
    }
}

/// Checks `inputs` against the op's rule, then runs its kernel.
///
/// ```
/// use gradloop::ops::binary::Add;
/// use gradloop::{execute, Op, Tensor};
///
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let b = Tensor::scalar(0.5f32);
/// let sum = execute(&Op::from(Add), &[a, b])?;
/// assert_eq!(sum[0].to_f64_vec(), vec![1.5, 2.5]);
/// // a mismatch is an error that names the op
/// let bad = execute(&Op::from(Add), &[Tensor::scalar(1.0f32)]);
/// assert!(bad.unwrap_err().to_string().contains("add"));
/// # Ok::<(), gradloop::Error>(())
/// ```
pub fn execute(op: &Op, inputs: &[Tensor]) -> Result<Values<Tensor>> {
    let types: SmallVec<[TensorType; 2]> = inputs.iter().map(|t| t.ty().clone()).collect();
    let outputs = op.infer(&types)?;
    for ty in &outputs {
        crate::tensor::check_allocation(op.name(), ty)?;
    }
    op.compute(inputs, &outputs)
}
