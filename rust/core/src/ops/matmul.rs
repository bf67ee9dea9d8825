//! Matrix product with batch dimensions (numpy's matmul for rank >= 2 operands).

use super::layout::pending_op;
use super::{build, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

pending_op!(MatMul, "matmul" {});

pub fn matmul<V: Value>(ctx: &mut dyn Context<V>, a: &V, b: &V) -> Result<V> {
    build::apply1(ctx, MatMul {}, &[a.clone(), b.clone()])
}
