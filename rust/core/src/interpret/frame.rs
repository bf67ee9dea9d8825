//! Per-call state: the value table of one function call, apart from the shared, immutable plan.
//!
//! Nodes read their inputs straight from the table and write their outputs straight back:
//! values are 72 bytes, so gathering them into intermediate vectors and returning those by
//! value was the interpreter's main cost on small loops (measured: half the time in memcpy).

use super::plan::{NodePlan, Plan, Use};
use crate::error::{Error, Result};
use crate::graph::{Function, ValueType};
use crate::runtime_values::RtValue;
use crate::tensor::Tensor;

/// The state of one call of a function.
pub(super) struct Frame {
    /// One slot per node output (`Plan::slots`); `None` before it is computed, after its last
    /// use, and for outputs nobody reads.
    table: Vec<Option<RtValue>>,
    /// Arguments not yet taken by their `Arg` node.
    args: Vec<Option<RtValue>>,
    /// Scratch for an op's input tensors, reused by every op node of the call.
    tensors: Vec<Tensor>,
}

impl Frame {
    pub fn new(plan: &Plan, args: Vec<RtValue>) -> Frame {
        Frame {
            table: vec![None; plan.slots],
            args: args.into_iter().map(Some).collect(),
            tensors: Vec::new(),
        }
    }

    /// The value read by `u`: moved out at its last use (so its owner count drops — what lets
    /// a stack be pushed in place), cloned otherwise.
    pub fn take(&mut self, u: Use) -> Result<RtValue> {
        let value = match self.table.get_mut(u.slot) {
            Some(cell) if u.last => cell.take(),
            Some(cell) => cell.clone(),
            None => None,
        };
        value.ok_or_else(|| Error::internal("interpret", format!("slot {} holds no value", u.slot)))
    }

    /// The values read by `uses`, in order.
    pub fn take_all(&mut self, uses: &[Use]) -> Result<Vec<RtValue>> {
        uses.iter().map(|&u| self.take(u)).collect()
    }

    /// Argument `i` (each `Arg` node takes its argument once).
    pub fn take_arg(&mut self, i: usize) -> Option<RtValue> {
        self.args.get_mut(i).and_then(Option::take)
    }

    /// Runs `f` on the input tensors of an op node, gathered into the reusable scratch vector,
    /// which is cleared afterwards so inputs at their last use are freed at once.
    pub fn with_tensors<R>(
        &mut self,
        uses: &[Use],
        f: impl FnOnce(&[Tensor]) -> Result<R>,
    ) -> Result<R> {
        let mut tensors = std::mem::take(&mut self.tensors);
        tensors.clear();
        for (i, &u) in uses.iter().enumerate() {
            let value = self.take(u)?;
            tensors.push(value.into_tensor().map_err(|mut e| {
                e.message = format!("input {i}: {}", e.message);
                e
            })?);
        }
        let result = f(&tensors);
        tensors.clear();
        self.tensors = tensors;
        result
    }

    /// Stores the outputs of the node planned by `np` (those somebody reads); returns how many
    /// there were, for the caller to check against the node's declared outputs.
    pub fn store(&mut self, np: &NodePlan, outputs: impl IntoIterator<Item = RtValue>) -> usize {
        let mut count = 0;
        for (k, value) in outputs.into_iter().enumerate() {
            count += 1;
            if np.read.get(k).copied().unwrap_or(false) {
                if let Some(cell) = self.table.get_mut(np.first_slot + k) {
                    *cell = Some(value);
                }
            }
        }
        count
    }

    /// The function's results, moving each value at its last use.
    pub fn results(mut self, plan: &Plan) -> Result<Vec<RtValue>> {
        self.take_all(&plan.results)
    }
}

/// Checks `args` against the parameters of `function`: count first, then each argument's kind,
/// dtype and shape, with the natural error kind (`InvalidArgument`, `DType`, `Shape`).
pub(super) fn check_args(function: &Function, args: &[RtValue]) -> Result<()> {
    check_params(&function.name, &function.params, args)
}

/// `check_args` for the function `name` taking `params`.
pub fn check_params(name: &str, params: &[ValueType], args: &[RtValue]) -> Result<()> {
    if args.len() != params.len() {
        let (got, want) = (args.len(), params.len());
        let msg = format!("@{name} takes {want} argument(s), got {got}");
        return Err(Error::invalid("call", msg));
    }
    for (i, (arg, param)) in args.iter().zip(params).enumerate() {
        if let Some(kind) = arg.mismatch(param) {
            let got = arg.value_type();
            let msg = format!("@{name}: argument {i} is a {got}, but parameter {i} is a {param}");
            return Err(Error::new(kind, "call", msg));
        }
    }
    Ok(())
}
