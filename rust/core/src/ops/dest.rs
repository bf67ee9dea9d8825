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
    // Operands of the output's shape or of one element (a `where` over a mask and a scalar):
    // index k or 0 by a stride, without a match per element.
    let strides = sources.clone().map(|s| match s {
        Source::Same => Some(1usize),
        Source::One => Some(0),
        Source::Table(_) => None,
    });
    Some(Box::new(move |inputs, outputs| {
        let (a, b, c) = (
            input::<A>(inputs, 0)?,
            input::<B>(inputs, 1)?,
            input::<C>(inputs, 2)?,
        );
        let zs = output::<U>(outputs, 0)?;
        match strides {
            [Some(1), Some(1), Some(1)] => zip3_strided::<1, 1, 1, _, _, _, _>(a, b, c, zs, &f),
            [Some(1), Some(1), Some(0)] => zip3_strided::<1, 1, 0, _, _, _, _>(a, b, c, zs, &f),
            [Some(1), Some(0), Some(1)] => zip3_strided::<1, 0, 1, _, _, _, _>(a, b, c, zs, &f),
            [Some(1), Some(0), Some(0)] => zip3_strided::<1, 0, 0, _, _, _, _>(a, b, c, zs, &f),
            [Some(sa), Some(sb), Some(sc)] => {
                for (k, z) in zs.iter_mut().enumerate() {
                    *z = f(a[k * sa], b[k * sb], c[k * sc]);
                }
            }
            _ => {
                for (k, z) in zs.iter_mut().enumerate() {
                    *z = f(
                        a[sources[0].at(k)],
                        b[sources[1].at(k)],
                        c[sources[2].at(k)],
                    );
                }
            }
        }
        Ok(())
    }))
}

/// `zs[k] = f(a[k * SA], b[k * SB], c[k * SC])` with the strides (0 or 1) known to the
/// compiler and the operands cut to the lengths they are read at: no bounds check in the loop,
/// which then vectorises (`where` over lanes is on every batched loop's trip).
fn zip3_strided<const SA: usize, const SB: usize, const SC: usize, A, B, C, U>(
    a: &[A],
    b: &[B],
    c: &[C],
    zs: &mut [U],
    f: &impl Fn(A, B, C) -> U,
) where
    A: Copy,
    B: Copy,
    C: Copy,
{
    let Some(last) = zs.len().checked_sub(1) else {
        return;
    };
    let (a, b, c) = (&a[..=last * SA], &b[..=last * SB], &c[..=last * SC]);
    for (k, z) in zs.iter_mut().enumerate() {
        *z = f(a[k * SA], b[k * SB], c[k * SC]);
    }
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

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Calls `f` with every index of `shape`, in row-major order.
fn each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut index = vec![0usize; shape.len()];
    loop {
        f(&index);
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// Where each output element comes from: `(input, flat index)`, or `None` for a zero.
pub type GatherTable = Vec<Option<(u16, u32)>>;

/// Output element `k` is input `table[k].0`'s element `table[k].1` (the type's zero where the
/// entry is `None`): slices, pads and concatenations, which only move elements.
pub fn gather_to<T: Element>(table: GatherTable) -> DestKernel {
    Box::new(move |inputs, outputs| {
        let sources = (0..inputs.len())
            .map(|k| input::<T>(inputs, k))
            .collect::<Result<smallvec::SmallVec<[&[T]; 4]>>>()?;
        let ys = output::<T>(outputs, 0)?;
        for (y, entry) in ys.iter_mut().zip(&table) {
            *y = match *entry {
                Some((i, k)) => sources[i as usize][k as usize],
                None => T::default(),
            };
        }
        Ok(())
    })
}

/// `gather_to` for elements of `dtype`: the kernel of an op that only moves elements, from its
/// `OpDef::gather_table`.
pub fn gather_kernel(dtype: crate::dtype::DType, table: GatherTable) -> DestKernel {
    crate::with_dtype!(dtype, T, { gather_to::<T>(table) })
}

/// The table of a strided slice of `from` (`start`, `step` per dimension) of shape `out`.
pub fn slice_table(from: &[usize], start: &[usize], step: &[usize], out: &[usize]) -> GatherTable {
    let s = strides(from);
    let mut table = Vec::with_capacity(numel(out));
    each_index(out, |i| {
        let k: usize = (0..i.len())
            .map(|d| (start[d] + i[d] * step[d]) * s[d])
            .sum();
        table.push(Some((0, k as u32)));
    });
    table
}

/// The table of a zero pad of `from` to `out`: input element `i` lands at `low + i * (interior
/// + 1)` per dimension.
pub fn pad_table(from: &[usize], low: &[usize], interior: &[usize], out: &[usize]) -> GatherTable {
    let s = strides(out);
    let mut table = vec![None; numel(out)];
    let mut k = 0u32;
    each_index(from, |i| {
        let at: usize = (0..i.len())
            .map(|d| (low[d] + i[d] * (interior[d] + 1)) * s[d])
            .sum();
        table[at] = Some((0, k));
        k += 1;
    });
    table
}

/// The table of the concatenation of `inputs` along `axis`.
pub fn concat_table(inputs: &[&[usize]], axis: usize, out: &[usize]) -> GatherTable {
    let mut offsets = Vec::with_capacity(inputs.len());
    let mut offset = 0;
    for shape in inputs {
        offsets.push(offset);
        offset += shape[axis];
    }
    let input_strides: Vec<Vec<usize>> = inputs.iter().map(|s| strides(s)).collect();
    let mut table = Vec::with_capacity(numel(out));
    each_index(out, |i| {
        let which = offsets.partition_point(|&o| o <= i[axis]) - 1;
        let s = &input_strides[which];
        let k: usize = (0..i.len())
            .map(|d| if d == axis { i[d] - offsets[which] } else { i[d] } * s[d])
            .sum();
        table.push(Some((which as u16, k as u32)));
    });
    table
}

/// A window of shape `window` inside an operand of shape `from`, read at run time from start
/// positions (clamped as `dynamic_slice` and `dynamic_update_slice` clamp them): the window's
/// flat offsets from its first element, and the operand's strides.
#[derive(Clone, Debug)]
pub struct Window {
    offsets: Vec<u32>,
    strides: Vec<usize>,
    limits: Vec<i64>,
}

impl Window {
    pub fn new(from: &[usize], window: &[usize]) -> Option<Window> {
        if !table_fits(1, &[from]) || window.iter().zip(from).any(|(w, f)| w > f) {
            return None;
        }
        let zeros = vec![0; from.len()];
        let ones = vec![1; from.len()];
        let offsets = slice_table(from, &zeros, &ones, window)
            .into_iter()
            .map(|e| e.map_or(0, |(_, k)| k))
            .collect();
        let limits = from
            .iter()
            .zip(window)
            .map(|(f, w)| (f - w) as i64)
            .collect();
        Some(Window {
            offsets,
            strides: strides(from),
            limits,
        })
    }

    /// The flat index of the window's first element for the start tensors `starts` (scalar
    /// i32 or i64 buffers), each clamped to `[0, dim - size]`.
    pub fn base(&self, starts: &[&Storage]) -> Result<usize> {
        let mut base = 0;
        for ((s, &limit), &stride) in starts.iter().zip(&self.limits).zip(&self.strides) {
            let v = match s {
                Storage::I32(v) => v.first().map(|&x| i64::from(x)),
                Storage::I64(v) => v.first().copied(),
                _ => None,
            };
            let v = v.ok_or_else(buffer_bug)?;
            base += v.clamp(0, limit) as usize * stride;
        }
        Ok(base)
    }

    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }
}

/// Whether a table for `n` elements of inputs `inputs` fits its index types.
pub fn table_fits(inputs: usize, elements: &[&[usize]]) -> bool {
    u16::try_from(inputs).is_ok() && elements.iter().all(|s| u32::try_from(numel(s)).is_ok())
}

/// A destination kernel for an op without one of its own: the op's allocating kernel
/// (`compute`) on copies of the inputs, its results copied into the outputs. The copies cost
/// what the interpreted path's allocations cost; they let a compiled frame hold a loop whose body
/// calls such an op (a factorisation's kernel) instead of leaving the whole loop interpreted.
pub fn through_compute(op: super::Op, inputs: &[TensorType], outputs: &[TensorType]) -> DestKernel {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape.to_vec()).collect();
    let types = outputs.to_vec();
    Box::new(move |ins: &[&Storage], outs: &mut [Storage]| {
        let tensors = ins
            .iter()
            .zip(&shapes)
            .map(|(s, shape)| crate::tensor::Tensor::new((*s).clone(), shape))
            .collect::<Result<Vec<_>>>()?;
        let results = op.compute(&tensors, &types)?;
        if results.len() != outs.len() {
            return Err(buffer_bug());
        }
        for (k, r) in results.iter().enumerate() {
            crate::with_dtype!(r.dtype(), T, {
                let out = output::<T>(outs, k)?;
                let src = r.as_slice::<T>()?;
                if out.len() != src.len() {
                    return Err(buffer_bug());
                }
                out.copy_from_slice(src);
            });
        }
        Ok(())
    })
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
    fn gather_tables_slice_pad_and_concatenate() {
        let at = |t: GatherTable| t.iter().map(|e| e.map(|(i, k)| (i, k))).collect::<Vec<_>>();
        // x[2, 3] = 0..6: x[:, ::2] is [0, 2, 3, 5].
        let slice = slice_table(&[2, 3], &[0, 0], &[1, 2], &[2, 2]);
        assert_eq!(at(slice), [0, 2, 3, 5].map(|k| Some((0, k))));
        // [a, b] padded by 1 low, 1 interior: [0, a, 0, b].
        let pad = pad_table(&[2], &[1], &[1], &[4]);
        assert_eq!(at(pad), [None, Some((0, 0)), None, Some((0, 1))]);
        // [[a], [b]] ++ [[c, d], [e, f]] along axis 1.
        let cat = concat_table(&[&[2, 1], &[2, 2]], 1, &[2, 3]);
        let want = [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2), (1, 3)].map(Some);
        assert_eq!(at(cat), want);
        let k = gather_to::<i32>(pad_table(&[2], &[1], &[1], &[4]));
        let mut out = [Storage::I32(vec![9; 4])];
        k(&[&Storage::I32(vec![5, 6])], &mut out).unwrap();
        assert_eq!(i32::slice(&out[0]).unwrap(), [0, 5, 0, 6]);
    }

    #[test]
    fn windows_clamp_their_starts_as_dynamic_slices_do() {
        // A [2, 2] window of a [3, 4] operand: offsets from its first element.
        let w = Window::new(&[3, 4], &[2, 2]).unwrap();
        assert_eq!(w.offsets(), [0, 1, 4, 5]);
        let at = |r: i64, c: i32| w.base(&[&Storage::I64(vec![r]), &Storage::I32(vec![c])]);
        assert_eq!(at(1, 2).unwrap(), 6);
        assert_eq!(at(-5, 9).unwrap(), 2, "clamped to [0, 1] and [0, 2]");
        assert!(w
            .base(&[&Storage::F32(vec![0.0]), &Storage::I32(vec![0])])
            .is_err());
        assert!(Window::new(&[3], &[4]).is_none());
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
