//! Data-dependent indexing: `dynamic_slice`, `dynamic_update_slice`, `take` (gather) and
//! `scatter_add` (the gradient of take).

use super::layout::pending_op;
use super::{build, Grads, OpDef, Saved, Saves, Types, Values};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

pending_op!(DynamicSlice, "dynamic_slice" { sizes: Vec<usize> });
pending_op!(DynamicUpdateSlice, "dynamic_update_slice" {});
pending_op!(Take, "take" { axis: usize });
pending_op!(ScatterAdd, "scatter_add" { axis: usize, dim_size: usize });

pub fn dynamic_slice<V: Value>(ctx: &mut dyn Context<V>, x: &V, starts: &[V], sizes: &[usize]) -> Result<V> {
    let mut inputs = vec![x.clone()];
    inputs.extend_from_slice(starts);
    build::apply1(ctx, DynamicSlice { sizes: sizes.to_vec() }, &inputs)
}
pub fn dynamic_update_slice<V: Value>(ctx: &mut dyn Context<V>, x: &V, update: &V, starts: &[V]) -> Result<V> {
    let mut inputs = vec![x.clone(), update.clone()];
    inputs.extend_from_slice(starts);
    build::apply1(ctx, DynamicUpdateSlice {}, &inputs)
}
pub fn take<V: Value>(ctx: &mut dyn Context<V>, x: &V, indices: &V, axis: usize) -> Result<V> {
    build::apply1(ctx, Take { axis }, &[x.clone(), indices.clone()])
}
pub fn scatter_add<V: Value>(ctx: &mut dyn Context<V>, updates: &V, indices: &V, axis: usize, dim_size: usize) -> Result<V> {
    build::apply1(ctx, ScatterAdd { axis, dim_size }, &[updates.clone(), indices.clone()])
}
