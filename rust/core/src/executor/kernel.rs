//! How the executor runs a node that stays a node after lowering (variables, stacks): its
//! construct's `Kernel`, in `crate::control`.

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::runtime_values::RtValue;

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
