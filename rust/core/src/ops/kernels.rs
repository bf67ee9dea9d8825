//! Shared CPU kernel helpers: elementwise maps with numpy broadcasting, parallel above a size
//! threshold (rayon). Op kernels are written against these, generic over the element type.

use std::mem::MaybeUninit;

use ndarray::{ArrayViewMut, Axis, IxDyn, Slice, Zip};

use smallvec::SmallVec;

use super::lanes::{Fun, Lanes};
use super::parallel;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::shape::{numel, TensorType};
use crate::tensor::Tensor;

/// Below this many elements a kernel of tens of instructions per element (the transcendentals,
/// matrix-vector rows) stays on one thread: splitting costs more than it saves.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// The same for kernels of a few instructions per element (add, mul, relu, select, ...): they
/// stream memory at several elements per ns, so below this size waking a second thread costs
/// more than the half of the work it takes over.
pub const CHEAP_PARALLEL_THRESHOLD: usize = 1 << 18;

/// Elements one task of a parallel elementwise kernel writes: large enough that rayon's split
/// costs little beside it, small enough to balance two to a few dozen threads.
const PARALLEL_CHUNK: usize = 1 << 14;

/// A vector of `n` elements, chunk by chunk in parallel: `fill(start, chunk)` writes every
/// element of `chunk`, those from `start` on. Each chunk is a plain loop over slices, which
/// the compiler vectorises (a parallel iterator's `collect` writes one element at a time).
fn collect_parallel<U: Element>(
    n: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync + Send,
) -> Vec<U> {
    collect_chunks(n, PARALLEL_CHUNK, &fill)
}

/// `collect_parallel` in chunks of `chunk` elements.
#[allow(
    unsafe_code,
    reason = "writes the result in place, uninitialised before"
)]
fn collect_chunks<U: Element>(
    n: usize,
    chunk: usize,
    fill: &(dyn Fn(usize, &mut [MaybeUninit<U>]) + Sync),
) -> Vec<U> {
    let mut out = Vec::with_capacity(n);
    let slots = &mut out.spare_capacity_mut()[..n];
    parallel::chunks_mut(slots, chunk, &|k, piece| fill(k * chunk, piece));
    // SAFETY: the chunks cover `..n` and `fill` writes every element of each.
    unsafe { out.set_len(n) };
    out
}

/// Rows of a result being written: a block of them, uninitialised.
type RowsMut<'a, U> = ArrayViewMut<'a, MaybeUninit<U>, IxDyn>;

/// The `out_shape` result of `f` on broadcast views, in blocks of whole rows of its leading
/// axis in parallel (row-major, as `Tensor::from_vec` takes it): `f(rows, block)` writes the
/// rows `rows` into `block`.
fn collect_rows<U: Element>(
    out_shape: &[usize],
    f: &(dyn Fn(Slice, RowsMut<'_, U>) + Sync),
) -> Vec<U> {
    let row: usize = out_shape[1..].iter().product();
    if row == 0 || out_shape[0] == 0 {
        return Vec::new();
    }
    let rows_per_block = (PARALLEL_CHUNK / row).max(1);
    collect_chunks(numel(out_shape), rows_per_block * row, &|start, block| {
        let first = start / row;
        let rows = first..first + block.len() / row;
        let mut shape = out_shape.to_vec();
        shape[0] = rows.len();
        let dst = ArrayViewMut::from_shape(IxDyn(&shape), block).expect("whole rows");
        f(Slice::from(rows), dst)
    })
}

/// `f` applied to every element.
pub fn map<T: Element, U: Element>(x: &Tensor, f: impl Fn(T) -> U + Sync + Send) -> Result<Tensor> {
    let xs = x.as_slice::<T>()?;
    if xs.len() < CHEAP_PARALLEL_THRESHOLD {
        return Tensor::collect(x.shape(), xs.iter().map(|&v| f(v)));
    }
    let data = collect_parallel(xs.len(), |start, chunk| {
        for (d, &v) in chunk.iter_mut().zip(&xs[start..]) {
            d.write(f(v));
        }
    });
    Tensor::from_vec(data, x.shape())
}

/// `map` of a float function `lanes` vectorises (`fun`); `scalar` is the op's kernel, for the
/// lanes the vector form does not serve.
pub fn map_lanes<T: Element + Lanes>(
    x: &Tensor,
    fun: Fun,
    scalar: impl Fn(T) -> T + Sync,
) -> Result<Tensor> {
    let xs = x.as_slice::<T>()?;
    if xs.len() <= INLINE_LANES {
        let mut ys: SmallVec<[T; INLINE_LANES]> = SmallVec::from_slice(xs);
        T::map(fun, &mut ys, None, &scalar);
        return Tensor::collect(x.shape(), ys.into_iter());
    }
    let mut ys = vec![T::default(); xs.len()];
    T::map(fun, &mut ys, Some(xs), &scalar);
    Tensor::from_vec(ys, x.shape())
}

/// Up to this many elements `map_lanes` works on the stack.
const INLINE_LANES: usize = 16;

/// `map_lanes` written into the buffer of `inputs[0]` when it holds that buffer alone and is
/// of type `out`; `None` otherwise (see `map_into`).
pub fn map_lanes_into<T: Element + Lanes>(
    inputs: &mut Vec<Tensor>,
    out: &TensorType,
    fun: Fun,
    scalar: impl Fn(T) -> T + Sync,
) -> Option<Tensor> {
    let x = inputs.first_mut().filter(|x| x.ty() == out)?;
    T::map(fun, x.unique_slice_mut::<T>()?, None, &scalar);
    Some(inputs.swap_remove(0).renewed())
}

/// `zip` of `pow` through `Lanes::pow` when `a` has the result's shape and `b` has it too or
/// one element (the common cases: `x ** 2.0`, `x ** y`); the broadcasting `zip` otherwise.
pub fn pow_lanes<T: Element + Lanes>(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    scalar: impl Fn(T, T) -> T + Sync + Send,
) -> Result<Tensor> {
    if a.shape() != shape || (b.numel() != 1 && b.shape() != shape) {
        return zip::<T, T>(a, b, shape, scalar);
    }
    let (xs, ys) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    if xs.len() <= INLINE_LANES {
        let mut zs: SmallVec<[T; INLINE_LANES]> = SmallVec::from_slice(xs);
        T::pow(&mut zs, ys, &scalar);
        return Tensor::collect(a.shape(), zs.into_iter());
    }
    let mut zs = xs.to_vec();
    T::pow(&mut zs, ys, &scalar);
    Tensor::from_vec(zs, a.shape())
}

/// `pow_lanes` written into the buffer of `inputs[0]` when it holds that buffer alone, is of
/// type `out`, and `inputs[1]` has its shape or one element; `None` otherwise.
pub fn pow_lanes_into<T: Element + Lanes>(
    inputs: &mut Vec<Tensor>,
    out: &TensorType,
    scalar: impl Fn(T, T) -> T + Sync,
) -> Option<Tensor> {
    let [a, b] = inputs.as_mut_slice() else {
        return None;
    };
    if a.ty() != out || (b.numel() != 1 && b.shape() != a.shape()) {
        return None;
    }
    let ys = b.as_slice::<T>().ok()?;
    T::pow(a.unique_slice_mut::<T>()?, ys, &scalar);
    Some(inputs.swap_remove(0).renewed())
}

/// `map` written into the buffer of `inputs[0]` when it holds that buffer alone and is of type
/// `out` (the result is that tensor, renewed); `None` otherwise, and the caller allocates.
pub fn map_into<T: Element>(
    inputs: &mut Vec<Tensor>,
    out: &TensorType,
    f: impl Fn(T) -> T + Sync + Send,
) -> Option<Tensor> {
    let x = inputs.first_mut().filter(|x| x.ty() == out)?;
    let xs = x.unique_slice_mut::<T>()?;
    if xs.len() >= CHEAP_PARALLEL_THRESHOLD {
        parallel::chunks_mut(xs, PARALLEL_CHUNK, &|_, piece| {
            piece.iter_mut().for_each(|v| *v = f(*v))
        });
    } else {
        xs.iter_mut().for_each(|v| *v = f(*v));
    }
    Some(inputs.swap_remove(0).renewed())
}

/// `zip` written into the buffer of `inputs[0]`, or else `inputs[1]`, when that tensor holds
/// it alone and is of type `out`, and the other operand has its shape or one element; `None`
/// otherwise, and the caller allocates.
pub fn zip_into<T: Element>(
    inputs: &mut Vec<Tensor>,
    out: &TensorType,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Option<Tensor> {
    fn apply<T: Element>(xs: &mut [T], ys: &[T], g: impl Fn(T, T) -> T + Sync + Send) {
        if let &[y] = ys {
            xs.iter_mut().for_each(|x| *x = g(*x, y));
        } else if xs.len() >= CHEAP_PARALLEL_THRESHOLD {
            parallel::chunks_mut(xs, PARALLEL_CHUNK, &|k, piece| {
                let ys = &ys[k * PARALLEL_CHUNK..];
                piece.iter_mut().zip(ys).for_each(|(x, &y)| *x = g(*x, y))
            });
        } else {
            xs.iter_mut().zip(ys).for_each(|(x, &y)| *x = g(*x, y));
        }
    }
    let fits = |x: &Tensor, other: &Tensor| {
        x.ty() == out && (other.numel() == 1 || other.shape() == x.shape())
    };
    let [a, b] = inputs.as_mut_slice() else {
        return None;
    };
    if fits(a, b) {
        if let (Some(xs), Ok(ys)) = (a.unique_slice_mut::<T>(), b.as_slice::<T>()) {
            apply(xs, ys, &f);
            return Some(inputs.swap_remove(0).renewed());
        }
    }
    if fits(b, a) {
        if let (Some(xs), Ok(ys)) = (b.unique_slice_mut::<T>(), a.as_slice::<T>()) {
            apply(xs, ys, |x, y| f(y, x));
            return Some(inputs.swap_remove(1).renewed());
        }
    }
    None
}

/// `f` applied elementwise to `a` and `b` broadcast to `out_shape`.
pub fn zip<T: Element, U: Element>(
    a: &Tensor,
    b: &Tensor,
    out_shape: &[usize],
    f: impl Fn(T, T) -> U + Sync + Send,
) -> Result<Tensor> {
    let (xs, ys) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let n = xs.len().max(ys.len());
    let parallel = n >= CHEAP_PARALLEL_THRESHOLD;
    let data: Vec<U> = if a.shape() == b.shape() {
        if !parallel {
            return Tensor::collect(out_shape, xs.iter().zip(ys).map(|(&x, &y)| f(x, y)));
        }
        collect_parallel(n, |start, chunk| {
            for ((d, &x), &y) in chunk.iter_mut().zip(&xs[start..]).zip(&ys[start..]) {
                d.write(f(x, y));
            }
        })
    } else if ys.len() == 1 && a.shape() == out_shape {
        let y = ys[0];
        if !parallel {
            return Tensor::collect(out_shape, xs.iter().map(|&x| f(x, y)));
        }
        collect_parallel(n, |start, chunk| {
            for (d, &x) in chunk.iter_mut().zip(&xs[start..]) {
                d.write(f(x, y));
            }
        })
    } else if xs.len() == 1 && b.shape() == out_shape {
        let x = xs[0];
        if !parallel {
            return Tensor::collect(out_shape, ys.iter().map(|&y| f(x, y)));
        }
        collect_parallel(n, |start, chunk| {
            for (d, &y) in chunk.iter_mut().zip(&ys[start..]) {
                d.write(f(x, y));
            }
        })
    } else {
        let shape = IxDyn(out_shape);
        let av = a.view::<T>()?;
        let bv = b.view::<T>()?;
        let av = av
            .broadcast(shape.clone())
            .ok_or_else(|| broadcast_bug(a, out_shape))?;
        let bv = bv
            .broadcast(shape)
            .ok_or_else(|| broadcast_bug(b, out_shape))?;
        if !parallel || out_shape.is_empty() {
            let out = Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y));
            return Ok(Tensor::from_array(out));
        }
        collect_rows(out_shape, &|rows, mut dst| {
            let (a, b) = (av.slice_axis(Axis(0), rows), bv.slice_axis(Axis(0), rows));
            Zip::from(&mut dst).and(&a).and(&b).for_each(|d, &x, &y| {
                d.write(f(x, y));
            });
        })
    };
    Tensor::from_vec(data, out_shape)
}

/// `f` applied elementwise to three tensors broadcast to `out_shape`.
pub fn zip3<A: Element, B: Element, C: Element, U: Element>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    out_shape: &[usize],
    f: impl Fn(A, B, C) -> U + Sync + Send,
) -> Result<Tensor> {
    let shape = IxDyn(out_shape);
    let (av, bv, cv) = (a.view::<A>()?, b.view::<B>()?, c.view::<C>()?);
    let av = av
        .broadcast(shape.clone())
        .ok_or_else(|| broadcast_bug(a, out_shape))?;
    let bv = bv
        .broadcast(shape.clone())
        .ok_or_else(|| broadcast_bug(b, out_shape))?;
    let cv = cv
        .broadcast(shape)
        .ok_or_else(|| broadcast_bug(c, out_shape))?;
    if av.len() < CHEAP_PARALLEL_THRESHOLD || out_shape.is_empty() {
        let out = Zip::from(&av)
            .and(&bv)
            .and(&cv)
            .map_collect(|&x, &y, &z| f(x, y, z));
        return Ok(Tensor::from_array(out));
    }
    let data = collect_rows(out_shape, &|rows, mut dst| {
        let a = av.slice_axis(Axis(0), rows);
        let (b, c) = (bv.slice_axis(Axis(0), rows), cv.slice_axis(Axis(0), rows));
        Zip::from(&mut dst)
            .and(&a)
            .and(&b)
            .and(&c)
            .for_each(|d, &x, &y, &z| {
                d.write(f(x, y, z));
            });
    });
    Tensor::from_vec(data, out_shape)
}

fn broadcast_bug(t: &Tensor, out_shape: &[usize]) -> Error {
    Error::internal(
        "broadcast",
        format!(
            "shape {:?} does not broadcast to {:?} (shape rule and kernel disagree)",
            t.shape(),
            out_shape
        ),
    )
}

/// Arithmetic that wraps on integer overflow (as numpy and XLA do) instead of panicking.
pub trait Arith: Element {
    fn wadd(self, other: Self) -> Self;
    fn wsub(self, other: Self) -> Self;
    fn wmul(self, other: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    /// The remainder of truncated division, with the sign of `self` (C's `fmod`, Rust's `%`);
    /// 0 for integers divided by 0, as numpy gives.
    fn wrem(self, other: Self) -> Self;
    /// The quotient rounded toward zero; 0 for integers divided by 0, as numpy gives.
    fn wquot(self, other: Self) -> Self;
    fn zero() -> Self;
    fn one() -> Self;
}

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn wadd(self, o: Self) -> Self { self + o }
            fn wsub(self, o: Self) -> Self { self - o }
            fn wmul(self, o: Self) -> Self { self * o }
            fn wneg(self) -> Self { -self }
            fn wabs(self) -> Self { self.abs() }
            fn wrem(self, o: Self) -> Self { self % o }
            fn wquot(self, o: Self) -> Self { (self / o).trunc() }
            fn zero() -> Self { 0.0 }
            fn one() -> Self { 1.0 }
        }
    )*};
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            fn wsub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn wneg(self) -> Self { self.wrapping_neg() }
            fn wabs(self) -> Self { self.wrapping_abs() }
            fn wrem(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_rem(o) } }
            fn wquot(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_div(o) } }
            fn zero() -> Self { 0 }
            fn one() -> Self { 1 }
        }
    )*};
}

arith_float!(f32, f64);
arith_int!(i32, i64);

/// NaN is the one value unequal to itself; written for any element type (integers never are).
#[allow(clippy::eq_op)]
pub fn is_nan<T: PartialEq>(x: T) -> bool {
    x != x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes past the parallel threshold, ending inside a chunk.
    const N: usize = CHEAP_PARALLEL_THRESHOLD + 3 * PARALLEL_CHUNK + 7;

    fn ramp(n: usize, scale: f64) -> Tensor {
        let v: Vec<f64> = (0..n).map(|i| (i % 1013) as f64 * scale - 3.0).collect();
        Tensor::from_vec(v, &[n]).unwrap()
    }

    #[test]
    fn parallel_maps_write_every_element_in_order() {
        let x = ramp(N, 0.01);
        let got = map::<f64, f64>(&x, |v| v * v - 1.0).unwrap();
        let want: Vec<f64> = x
            .as_slice::<f64>()
            .unwrap()
            .iter()
            .map(|v| v * v - 1.0)
            .collect();
        assert_eq!(got.as_slice::<f64>().unwrap(), &want[..]);
        let signs = map::<f64, bool>(&x, |v| v > 0.0).unwrap();
        assert_eq!(signs.numel(), N);
        let xs = x.as_slice::<f64>().unwrap();
        assert!(signs
            .as_slice::<bool>()
            .unwrap()
            .iter()
            .zip(xs)
            .all(|(&s, &v)| s == (v > 0.0)));
    }

    #[test]
    fn parallel_zips_broadcast_either_operand_in_order() {
        let (a, b, s) = (ramp(N, 0.01), ramp(N, 0.03), ramp(1, 0.0));
        let (xs, ys) = (a.as_slice::<f64>().unwrap(), b.as_slice::<f64>().unwrap());
        let f = |x: f64, y: f64| x - 2.0 * y;
        let same = zip::<f64, f64>(&a, &b, &[N], f).unwrap();
        let want: Vec<f64> = xs.iter().zip(ys).map(|(&x, &y)| f(x, y)).collect();
        assert_eq!(same.as_slice::<f64>().unwrap(), &want[..]);
        let right = zip::<f64, f64>(&a, &s, &[N], f).unwrap();
        let want: Vec<f64> = xs.iter().map(|&x| f(x, -3.0)).collect();
        assert_eq!(right.as_slice::<f64>().unwrap(), &want[..]);
        let left = zip::<f64, f64>(&s, &b, &[N], f).unwrap();
        let want: Vec<f64> = ys.iter().map(|&y| f(-3.0, y)).collect();
        assert_eq!(left.as_slice::<f64>().unwrap(), &want[..]);
    }

    #[test]
    fn parallel_broadcasts_write_whole_rows_in_order() {
        // [rows, 1] against [1, cols] (an outer product past the threshold, the last block of
        // rows shorter), and a select of three shapes.
        let (rows, cols) = (1031, 509);
        let column = Tensor::from_vec((0..rows).map(|i| i as f64).collect(), &[rows, 1]).unwrap();
        let row = Tensor::from_vec((0..cols).map(|j| j as f64).collect(), &[1, cols]).unwrap();
        let f = |x: f64, y: f64| x * 1000.0 + y;
        let got = zip::<f64, f64>(&column, &row, &[rows, cols], f).unwrap();
        let want: Vec<f64> = (0..rows * cols)
            .map(|k| f((k / cols) as f64, (k % cols) as f64))
            .collect();
        assert_eq!(got.as_slice::<f64>().unwrap(), &want[..]);
        let mask: Vec<bool> = (0..cols).map(|j| j % 3 == 0).collect();
        let mask = Tensor::from_vec(mask, &[cols]).unwrap();
        let picked = zip3::<bool, f64, f64, f64>(&mask, &column, &row, &[rows, cols], |m, x, y| {
            if m {
                x
            } else {
                -y
            }
        })
        .unwrap();
        let want: Vec<f64> = (0..rows * cols)
            .map(|k| {
                let (i, j) = (k / cols, k % cols);
                if j % 3 == 0 {
                    i as f64
                } else {
                    -(j as f64)
                }
            })
            .collect();
        assert_eq!(picked.as_slice::<f64>().unwrap(), &want[..]);
    }
}
