//! `pack_indices`: the set positions of a mask packed to the front, the kernel of a traced
//! batched construct's buckets (`gradloop.batching._partition`, a composite call whose callee,
//! a prefix sum of table ops, is what compilers and derivatives read).

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::{expect_arity, Grads, OpDef, Saved, Saves, Tangents, Types, Values};
use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{Shape, TensorType, DYN};
use crate::tensor::Tensor;
use crate::value::Value;

/// `mask` (..., n) bool -> `rows` (..., size) int64, the first `size` positions set in `mask`
/// in order, the rest of `rows` the first of them (0 when none is set); `pos` (..., n) int64,
/// each position's index in `rows` (0 where it is not there); `fits` (..., n) bool, whether it
/// is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackIndices {
    pub size: usize,
}
op_attrs!(PackIndices = "pack_indices" { size });

impl OpDef for PackIndices {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("pack_indices", inputs, 1)?;
        let mask = &inputs[0];
        if mask.dtype != DType::Bool || mask.shape.is_empty() {
            return Err(Error::dtype(
                "pack_indices",
                format!("`mask` must be bool (..., n), got {mask}"),
            ));
        }
        let mut rows: Shape = mask.shape.clone();
        let last = rows.len() - 1;
        rows[last] = self.size;
        Ok(smallvec![
            TensorType::new(DType::I64, &rows),
            TensorType::new(DType::I64, &mask.shape),
            mask.clone(),
        ])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let mask = &inputs[0];
        let n = *mask.shape().last().unwrap_or(&0);
        if mask.shape().contains(&DYN) {
            return Err(Error::internal(
                "pack_indices",
                "a shape unknown at run time",
            ));
        }
        let flags = mask.as_slice::<bool>()?;
        let batch = flags.len().checked_div(n).unwrap_or(0);
        let mut rows = vec![0i64; batch * self.size];
        let mut pos = vec![0i64; flags.len()];
        let mut fits = vec![false; flags.len()];
        for b in 0..batch {
            let (flags, row) = (
                &flags[b * n..(b + 1) * n],
                &mut rows[b * self.size..][..self.size],
            );
            let mut count = 0;
            for (i, &set) in flags.iter().enumerate() {
                if set && count < self.size {
                    row[count] = i as i64;
                    pos[b * n + i] = count as i64;
                    fits[b * n + i] = true;
                    count += 1;
                }
            }
            let first = if count > 0 { row[0] } else { 0 };
            row[count..].fill(first);
        }
        Ok(smallvec![
            Tensor::from_vec(rows, &outputs[0].shape)?,
            Tensor::from_vec(pos, &outputs[1].shape)?,
            Tensor::from_vec(fits, &outputs[2].shape)?,
        ])
    }

    fn saves(&self) -> Saves {
        Saves::NotDifferentiable("indices of a mask")
    }

    fn emit(
        &self,
        e: &mut Emitter,
        _: &[MlirValue],
        _: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        Err(e.unsupported(
            "pack_indices is emitted through its composite call's callee, never on its own",
        ))
    }

    fn gradient<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &Saved<V>,
        _: &[Option<V>],
        _: &[bool],
    ) -> Result<Grads<V>> {
        Ok(smallvec![None])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        let inputs = batching::all_batched(ctx, inputs, batched)?;
        batching::pointwise(ctx, *self, &inputs)
    }

    fn tangent<V: Value>(
        &self,
        _: &mut dyn Context<V>,
        _: &[V],
        _: &[V],
        _: &[Option<V>],
    ) -> Result<Tangents<V>> {
        Ok(smallvec![None, None, None])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(mask: &[bool], shape: &[usize], size: usize) -> Vec<Tensor> {
        let op = PackIndices { size };
        let t = Tensor::from_vec(mask.to_vec(), shape).unwrap();
        let types = op.infer(&[t.ty().clone()]).unwrap();
        op.compute(&[t], &types).unwrap().into_vec()
    }

    #[test]
    fn packs_set_positions_to_the_front_padded_with_the_first() {
        let out = pack(&[false, true, false, true, true, false], &[6], 4);
        assert_eq!(out[0].as_slice::<i64>().unwrap(), &[1, 3, 4, 1]);
        assert_eq!(out[1].as_slice::<i64>().unwrap(), &[0, 0, 0, 1, 2, 0]);
        assert_eq!(
            out[2].as_slice::<bool>().unwrap(),
            &[false, true, false, true, true, false]
        );
    }

    #[test]
    fn positions_past_the_size_do_not_fit_and_rows_are_per_leading_index() {
        let out = pack(&[true, true, true, false, false, true], &[2, 3], 2);
        assert_eq!(out[0].as_slice::<i64>().unwrap(), &[0, 1, 2, 2]);
        assert_eq!(out[1].as_slice::<i64>().unwrap(), &[0, 1, 0, 0, 0, 0]);
        assert_eq!(
            out[2].as_slice::<bool>().unwrap(),
            &[true, true, false, false, false, true]
        );
    }

    #[test]
    fn an_empty_mask_gives_rows_of_zeros() {
        let out = pack(&[false, false, false], &[3], 2);
        assert_eq!(out[0].as_slice::<i64>().unwrap(), &[0, 0]);
    }
}
