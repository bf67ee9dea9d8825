//! Kernels that write into buffers the caller owns (`OpDef::kernel_into`), chosen once for exact
//! static types: what the executor's compiled frames run, allocating nothing per call.
//!
//! Each is built from the op's own scalar kernel (or its vector lanes, on the same path
//! `compute` takes), so a compiled frame computes bit for bit what the op table's `compute`
//! does; the executor's check mode compares the two.

use std::sync::Arc;

use super::lanes::{Fun, Lanes};
use crate::dtype::{Element, Storage};
use crate::error::{Error, Result};
use crate::shape::{numel, TensorType};

/// A kernel on inputs and outputs of the static types it was chosen for: reads `inputs`, writes
/// every element of `outputs` (buffers of the output types' sizes).
pub type DestKernel = Box<dyn Fn(&[&Storage], &mut [Storage]) -> Result<()> + Send + Sync>;

fn buffer_bug() -> Error {
    Error::internal("kernel", "a buffer does not hold its static type")
}

/// Input `k` as a slice of `T`.
pub fn input<'a, T: Element>(inputs: &[&'a Storage], k: usize) -> Result<&'a [T]> {
    inputs
        .get(k)
        .and_then(|s| T::slice(s))
        .ok_or_else(buffer_bug)
}

/// Output `k` as a mutable slice of `T`.
pub fn output<T: Element>(outputs: &mut [Storage], k: usize) -> Result<&mut [T]> {
    outputs
        .get_mut(k)
        .and_then(T::slice_mut)
        .ok_or_else(buffer_bug)
}

/// Where each output element of a broadcasting op reads an operand.
#[derive(Clone, Debug)]
pub enum Source {
    /// The same index: the operand has the output's elements in the same order.
    Same,
    /// Its one element.
    One,
    /// A table, one index per output element (computed once, when the kernel is chosen).
    Table(Arc<[u32]>),
}

impl Source {
    /// How an operand of shape `from` is read when broadcast to `to` (numpy's rules; `None`
    /// where they do not apply or the table would not fit `u32`).
    pub fn of(from: &[usize], to: &[usize]) -> Option<Source> {
        let (n, m) = (numel(from), numel(to));
        if n == 1 {
            return Some(Source::One);
        }
        if n == m && from.len() <= to.len() && to.ends_with(from) {
            return Some(Source::Same);
        }
        if from.len() > to.len() || u32::try_from(m).is_err() {
            return None;
        }
        let lead = to.len() - from.len();
        let mut strides = vec![0usize; to.len()];
        let mut stride = 1;
        for (k, &d) in from.iter().enumerate().rev() {
            let t = to[lead + k];
            if d != t && d != 1 {
                return None;
            }
            strides[lead + k] = if d == 1 { 0 } else { stride };
            stride *= d;
        }
        let mut table = Vec::with_capacity(m);
        let mut index = vec![0usize; to.len()];
        for _ in 0..m {
            table.push(
                index
                    .iter()
                    .zip(&strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>() as u32,
            );
            for axis in (0..to.len()).rev() {
                index[axis] += 1;
                if index[axis] < to[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
        Some(Source::Table(table.into()))
    }

    #[inline]
    fn at(&self, k: usize) -> usize {
        match self {
            Source::Same => k,
            Source::One => 0,
            Source::Table(t) => t[k] as usize,
        }
    }
}

/// `f` applied to every element of input 0.
pub fn map_to<T: Element, U: Element>(f: impl Fn(T) -> U + Send + Sync + 'static) -> DestKernel {
    Box::new(move |inputs, outputs| {
        let xs = input::<T>(inputs, 0)?;
        let ys = output::<U>(outputs, 0)?;
        ys.iter_mut().zip(xs).for_each(|(y, &x)| *y = f(x));
        Ok(())
    })
}

/// A function the lanes vectorise (`fun`), as `kernels::map_lanes` computes it; `scalar` is
/// the op's own kernel for the lanes the vector form does not serve.
pub fn lanes_to<T: Element + Lanes>(
    fun: Fun,
    scalar: impl Fn(T) -> T + Send + Sync + 'static,
) -> DestKernel {
    Box::new(move |inputs, outputs| {
        let xs = input::<T>(inputs, 0)?;
        let ys = output::<T>(outputs, 0)?;
        T::map(fun, ys, Some(xs), &scalar);
        Ok(())
    })
}

/// `f` applied elementwise to inputs 0 and 1 broadcast to `out`'s shape.
pub fn zip_to<T: Element, U: Element>(
    a: &TensorType,
    b: &TensorType,
    out: &TensorType,
    f: impl Fn(T, T) -> U + Send + Sync + 'static,
) -> Option<DestKernel> {
    let (sa, sb) = (
        Source::of(&a.shape, &out.shape)?,
        Source::of(&b.shape, &out.shape)?,
    );
    Some(Box::new(move |inputs, outputs| {
        let (xs, ys) = (input::<T>(inputs, 0)?, input::<T>(inputs, 1)?);
        let zs = output::<U>(outputs, 0)?;
        match (&sa, &sb) {
            (Source::Same, Source::Same) => zs
                .iter_mut()
                .zip(xs.iter().zip(ys))
                .for_each(|(z, (&x, &y))| *z = f(x, y)),
            (Source::Same, Source::One) => {
                let y = ys[0];
                zs.iter_mut().zip(xs).for_each(|(z, &x)| *z = f(x, y));
            }
            (Source::One, Source::Same) => {
                let x = xs[0];
                zs.iter_mut().zip(ys).for_each(|(z, &y)| *z = f(x, y));
            }
            _ => zs
                .iter_mut()
                .enumerate()
                .for_each(|(k, z)| *z = f(xs[sa.at(k)], ys[sb.at(k)])),
        }
        Ok(())
    }))
}

/// `f` applied elementwise to inputs 0, 1 and 2 broadcast to `out`'s shape.
pub fn zip3_to<A: Element, B: Element, C: Element, U: Element>(
    types: &[TensorType],
    out: &TensorType,
    f: impl Fn(A, B, C) -> U + Send + Sync + 'static,
) -> Option<DestKernel> {
    let sources = [
        Source::of(&types[0].shape, &out.shape)?,
        Source::of(&types[1].shape, &out.shape)?,
        Source::of(&types[2].shape, &out.shape)?,
    ];
    Some(Box::new(move |inputs, outputs| {
        let (a, b, c) = (
            input::<A>(inputs, 0)?,
            input::<B>(inputs, 1)?,
            input::<C>(inputs, 2)?,
        );
        let zs = output::<U>(outputs, 0)?;
        for (k, z) in zs.iter_mut().enumerate() {
            *z = f(
                a[sources[0].at(k)],
                b[sources[1].at(k)],
                c[sources[2].at(k)],
            );
        }
        Ok(())
    }))
}

/// `a ** b` as `kernels::pow_lanes` computes it: the lanes when `a` has the output's shape and
/// `b` has it too or one element, the scalar kernel elementwise otherwise.
pub fn pow_to<T: Element + Lanes>(
    a: &TensorType,
    b: &TensorType,
    out: &TensorType,
    scalar: impl Fn(T, T) -> T + Send + Sync + Copy + 'static,
) -> Option<DestKernel> {
    if a.shape != out.shape || (numel(&b.shape) != 1 && b.shape != out.shape) {
        return zip_to::<T, T>(a, b, out, scalar);
    }
    Some(Box::new(move |inputs, outputs| {
        let (xs, ys) = (input::<T>(inputs, 0)?, input::<T>(inputs, 1)?);
        let zs = output::<T>(outputs, 0)?;
        zs.copy_from_slice(xs);
        T::pow(zs, ys, &scalar);
        Ok(())
    }))
}

/// Input 0's elements unchanged (identity, reshape, a cast to the same dtype).
pub fn copy_to<T: Element>() -> DestKernel {
    Box::new(|inputs, outputs| {
        output::<T>(outputs, 0)?.copy_from_slice(input::<T>(inputs, 0)?);
        Ok(())
    })
}

/// Every element `value` (as `Tensor::filled` converts it).
pub fn fill_to(out: &TensorType, value: f64) -> DestKernel {
    let filled = Storage::filled(out.dtype, numel(&out.shape), value);
    Box::new(move |_, outputs| {
        let slot = outputs.get_mut(0).ok_or_else(buffer_bug)?;
        crate::with_dtype!(filled.dtype(), T, {
            let from = T::slice(&filled).ok_or_else(buffer_bug)?;
            T::slice_mut(slot)
                .ok_or_else(buffer_bug)?
                .copy_from_slice(from);
        });
        Ok(())
    })
}

/// Input 0 broadcast to `out`'s shape.
pub fn broadcast_to<T: Element>(from: &TensorType, out: &TensorType) -> Option<DestKernel> {
    let source = Source::of(&from.shape, &out.shape)?;
    Some(Box::new(move |inputs, outputs| {
        let xs = input::<T>(inputs, 0)?;
        let ys = output::<T>(outputs, 0)?;
        match &source {
            Source::Same => ys.copy_from_slice(xs),
            Source::One => ys.fill(xs[0]),
            Source::Table(_) => ys
                .iter_mut()
                .enumerate()
                .for_each(|(k, y)| *y = xs[source.at(k)]),
        }
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn sources_follow_numpy_broadcasting() {
        let table = |from: &[usize], to: &[usize]| match Source::of(from, to) {
            Some(Source::Table(t)) => t.to_vec(),
            other => panic!("{other:?}"),
        };
        assert!(matches!(Source::of(&[1, 16], &[1, 16]), Some(Source::Same)));
        assert!(matches!(
            Source::of(&[16], &[2, 16]),
            None | Some(Source::Table(_))
        ));
        assert!(matches!(Source::of(&[], &[3, 2]), Some(Source::One)));
        assert_eq!(table(&[3, 1], &[3, 2]), [0, 0, 1, 1, 2, 2]);
        assert_eq!(table(&[2], &[3, 2]), [0, 1, 0, 1, 0, 1]);
        assert!(Source::of(&[3], &[2]).is_none());
    }

    #[test]
    fn zip_to_broadcasts_as_the_table_says() {
        let ty = |shape: &[usize]| TensorType::new(DType::F64, shape);
        let k = zip_to::<f64, f64>(&ty(&[3, 1]), &ty(&[2]), &ty(&[3, 2]), |x, y| x - y).unwrap();
        let (a, b) = (
            Storage::F64(vec![10.0, 20.0, 30.0]),
            Storage::F64(vec![1.0, 2.0]),
        );
        let mut out = [Storage::F64(vec![0.0; 6])];
        k(&[&a, &b], &mut out).unwrap();
        assert_eq!(
            f64::slice(&out[0]).unwrap(),
            [9.0, 8.0, 19.0, 18.0, 29.0, 28.0]
        );
        let mut wrong = [Storage::I32(vec![0; 6])];
        assert!(k(&[&a, &b], &mut wrong).is_err());
    }
}
