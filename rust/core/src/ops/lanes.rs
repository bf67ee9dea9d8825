//! Vectorised float math for the transcendental elementwise ops: the `wide` crate's kernels on
//! 8 f32 or 4 f64 lanes, within about 1 ulp of libm (2e-7 relative for f32, 7e-16 for f64 on
//! the test sweeps) and several times faster per element.
//!
//! Where `wide` departs from C's rules, a block of lanes is computed with the op's own scalar
//! kernel instead: subnormal inputs of `log` (flushed to -inf), sine and cosine of arguments
//! past their range reduction's accurate range, and `pow` outside finite positive bases and
//! finite exponents (negative bases with integer exponents, `pow(1, NaN) = 1`, ...). Every
//! element of a tensor goes through the same path whatever its size, so a scalar and an element
//! of a large tensor give the same value. f32 sine and cosine run on 16 lanes where the CPU has
//! AVX-512 (`wide_trig`), with the same results bit for bit.

use wide::{f32x8, f64x4};

use super::kernels::PARALLEL_THRESHOLD;
use super::{parallel, wide_trig};

/// A function `Lanes::map` vectorises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fun {
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
}

/// An op whose kernel is `Lanes::map` of one float tensor, as plain functions: its vector
/// function and its scalar kernel. Machine code calls it on the elements directly, without
/// the op's boxed kernel between (`executor::frame::native`).
#[derive(Clone, Copy, Debug)]
pub enum LaneMap {
    F32(Fun, fn(f32) -> f32),
    F64(Fun, fn(f64) -> f64),
}

/// The element type of a `LaneMap`.
pub trait LaneElement: Lanes {
    fn lane_map(fun: Fun, scalar: fn(Self) -> Self) -> LaneMap;
}

impl LaneElement for f32 {
    fn lane_map(fun: Fun, scalar: fn(f32) -> f32) -> LaneMap {
        LaneMap::F32(fun, scalar)
    }
}

impl LaneElement for f64 {
    fn lane_map(fun: Fun, scalar: fn(f64) -> f64) -> LaneMap {
        LaneMap::F64(fun, scalar)
    }
}

/// Elements per parallel task: a few pages of work, so rayon's splitting stays in the noise.
const TASK: usize = 1 << 13;

/// Float element types with vectorised kernels.
pub trait Lanes: Copy + Default + Send + Sync + 'static {
    /// `fun` applied to every element of `xs` in place, or to `from` (of `xs`'s length) into
    /// `xs`; `scalar` is the op's own kernel, used for the lanes the vector form does not
    /// serve (see the module doc).
    fn map(
        fun: Fun,
        xs: &mut [Self],
        from: Option<&[Self]>,
        scalar: &(impl Fn(Self) -> Self + Sync),
    );

    /// `map` in `wide`'s blocks alone: what `map` does where `wide_trig` has no wider form.
    fn map_narrow(
        fun: Fun,
        xs: &mut [Self],
        from: Option<&[Self]>,
        scalar: &(impl Fn(Self) -> Self + Sync),
    );

    /// `xs[i] = xs[i] ** ys[i]` (`ys` of one element is broadcast); `scalar` is C's `pow`.
    fn pow(xs: &mut [Self], ys: &[Self], scalar: &(impl Fn(Self, Self) -> Self + Sync));
}

macro_rules! lanes {
    ($T:ty, $V:ident, $N:literal, trig_limit: $trig:expr, wider_trig: $wider:path) => {
        impl Lanes for $T {
            fn map(
                fun: Fun,
                xs: &mut [$T],
                from: Option<&[$T]>,
                scalar: &(impl Fn($T) -> $T + Sync),
            ) {
                let trig = matches!(fun, Fun::Sin | Fun::Cos);
                if !(trig && $wider(fun == Fun::Cos, xs, from, scalar)) {
                    Self::map_narrow(fun, xs, from, scalar);
                }
            }

            fn map_narrow(
                fun: Fun,
                xs: &mut [$T],
                from: Option<&[$T]>,
                scalar: &(impl Fn($T) -> $T + Sync),
            ) {
                // One loop per function, so each is compiled with its constants in registers.
                match fun {
                    Fun::Exp => map_with(xs, from, scalar, |_| true, |v| v.exp()),
                    Fun::Log => map_with(xs, from, scalar, serves_log, |v| v.ln()),
                    Fun::Sin => map_with(xs, from, scalar, serves_trig, |v| v.sin_cos().0),
                    Fun::Cos => map_with(xs, from, scalar, serves_trig, |v| v.sin_cos().1),
                    Fun::Tanh => map_with(xs, from, scalar, |_| true, |v| v.tanh()),
                    Fun::Sigmoid => map_with(xs, from, scalar, |_| true, sigmoid),
                }
            }

            fn pow(xs: &mut [$T], ys: &[$T], scalar: &(impl Fn($T, $T) -> $T + Sync)) {
                let run = |(xs, ys): (&mut [$T], &[$T])| {
                    let mut exponents = [0.0; $N];
                    let mut offset = 0;
                    for block in xs.chunks_mut($N) {
                        let n = block.len();
                        let mut bases = [1.0; $N];
                        bases[..n].copy_from_slice(block);
                        match ys {
                            [y] => exponents = [*y; $N],
                            _ => exponents[..n].copy_from_slice(&ys[offset..offset + n]),
                        }
                        let (a, b) = ($V::from(bases), $V::from(exponents));
                        let served = a.simd_gt($V::ZERO) & a.is_finite() & b.is_finite();
                        if served.all() {
                            block.copy_from_slice(&a.powf_simd(b).to_array()[..n]);
                        } else {
                            for (x, y) in block.iter_mut().zip(&exponents) {
                                *x = scalar(*x, *y);
                            }
                        }
                        offset += n;
                    }
                };
                let task = TASK - TASK % $N;
                if xs.len() >= PARALLEL_THRESHOLD && ys.len() == xs.len() {
                    parallel::chunks_mut(xs, task, &|k, xs| {
                        let n = xs.len();
                        run((xs, &ys[k * task..][..n]))
                    });
                } else if xs.len() >= PARALLEL_THRESHOLD {
                    parallel::chunks_mut(xs, task, &|_, xs| run((xs, ys)));
                } else {
                    run((xs, ys));
                }
            }
        }

        /// `vector` over `xs` in blocks of lanes, in parallel for large slices; a block some
        /// lane of which `serves` rejects goes through `scalar` instead.
        #[inline(always)]
        fn map_with(
            xs: &mut [$T],
            from: Option<&[$T]>,
            scalar: &(impl Fn($T) -> $T + Sync),
            serves: impl Fn($V) -> bool + Sync + Copy,
            vector: impl Fn($V) -> $V + Sync + Copy,
        ) {
            let block = |b: &mut [$T; $N]| {
                let v = $V::from(*b);
                if serves(v) {
                    *b = vector(v).to_array();
                } else {
                    b.iter_mut().for_each(|x| *x = scalar(*x));
                }
            };
            // From a source, each block is read from it and written once: no copy first.
            let block_from = |(b, from): (&mut [$T; $N], &[$T; $N])| {
                let v = $V::from(*from);
                if serves(v) {
                    *b = vector(v).to_array();
                } else {
                    b.iter_mut().zip(from).for_each(|(x, &f)| *x = scalar(f));
                }
            };
            // The last partial block, padded with ones (read from `from`, else in place).
            let tail = |rest: &mut [$T], from: Option<&[$T]>| {
                if !rest.is_empty() {
                    let mut padded = [1.0; $N];
                    padded[..rest.len()].copy_from_slice(from.unwrap_or(rest));
                    block(&mut padded);
                    rest.copy_from_slice(&padded[..rest.len()]);
                }
            };
            let run = |xs: &mut [$T]| {
                let (blocks, rest) = xs.as_chunks_mut::<$N>();
                blocks.iter_mut().for_each(block);
                tail(rest, None);
            };
            let run_from = |(xs, from): (&mut [$T], &[$T])| {
                let (blocks, rest) = xs.as_chunks_mut::<$N>();
                let (sources, rest_from) = from.as_chunks::<$N>();
                blocks.iter_mut().zip(sources).for_each(block_from);
                tail(rest, Some(rest_from));
            };
            parallel::map_pieces(xs, from, TASK, PARALLEL_THRESHOLD, &|xs, from| match from {
                Some(from) => run_from((xs, from)),
                None => run(xs),
            });
        }

        /// `wide`'s logarithm flushes subnormal inputs to -inf.
        fn serves_log(v: $V) -> bool {
            !(v.simd_lt($V::splat(<$T>::MIN_POSITIVE)) & v.simd_gt($V::ZERO)).any()
        }

        fn serves_trig(v: $V) -> bool {
            !v.abs().simd_gt($V::splat($trig)).any()
        }

        /// e^-|x| never overflows: 1/(1+e) for x >= 0, e/(1+e) below (NaN stays NaN).
        fn sigmoid(v: $V) -> $V {
            let e = (-v.abs()).exp();
            let r = $V::ONE / ($V::ONE + e);
            v.simd_ge($V::ZERO).select(r, e * r)
        }
    };
}

mod single {
    use super::*;
    // Past 2^19 the f32 range reduction loses digits (1e-4 absolute error at 1e7).
    lanes!(f32, f32x8, 8, trig_limit: 524_288.0, wider_trig: wide_trig::map);
}

mod double {
    use super::*;
    // Checked accurate to 1e14; the limit leaves a margin.
    lanes!(f64, f64x4, 4, trig_limit: 1.0e12, wider_trig: no_wider_trig);

    /// f64 sine and cosine stay on `wide`'s 4 lanes: a wider form gained nothing measurable.
    fn no_wider_trig(_: bool, _: &mut [f64], _: Option<&[f64]>, _: &impl Fn(f64) -> f64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close32(got: f32, want: f32) -> bool {
        (got.is_nan() && want.is_nan())
            || got == want
            || (got - want).abs() <= 4.0 * f32::EPSILON * want.abs().max(f32::MIN_POSITIVE)
    }

    fn close64(got: f64, want: f64) -> bool {
        (got.is_nan() && want.is_nan())
            || got == want
            || (got - want).abs() <= 8.0 * f64::EPSILON * want.abs().max(f64::MIN_POSITIVE)
    }

    fn sigmoid64(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }

    const SPECIAL: [f64; 16] = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -1.0,
        1e-310,
        5e-324,
        709.8,
        -746.0,
        88.8,
        -104.0,
        1e-40,
        1e-8,
        3.0e7,
        1e300,
    ];

    fn inputs() -> Vec<f64> {
        let sweep = (0..4001).map(|i| -40.0 + 0.02 * i as f64);
        SPECIAL.iter().copied().chain(sweep).collect()
    }

    fn reference(fun: Fun) -> fn(f64) -> f64 {
        match fun {
            Fun::Exp => f64::exp,
            Fun::Log => f64::ln,
            Fun::Sin => f64::sin,
            Fun::Cos => f64::cos,
            Fun::Tanh => f64::tanh,
            Fun::Sigmoid => sigmoid64,
        }
    }

    const FUNS: [Fun; 6] = [
        Fun::Exp,
        Fun::Log,
        Fun::Sin,
        Fun::Cos,
        Fun::Tanh,
        Fun::Sigmoid,
    ];

    #[test]
    fn f64_lanes_match_libm_on_sweeps_and_special_values() {
        for fun in FUNS {
            let f = reference(fun);
            let mut xs = inputs();
            f64::map(fun, &mut xs, None, &f);
            for (x, got) in inputs().into_iter().zip(xs) {
                assert!(close64(got, f(x)), "{fun:?}({x}) = {got}, libm {}", f(x));
            }
        }
    }

    #[test]
    fn f32_lanes_match_libm_on_sweeps_and_special_values() {
        for fun in FUNS {
            let f = reference(fun);
            let scalar = |x: f32| f(x as f64) as f32;
            let xs: Vec<f32> = inputs().into_iter().map(|x| x as f32).collect();
            let mut got = xs.clone();
            f32::map(fun, &mut got, None, &scalar);
            for (x, got) in xs.into_iter().zip(got) {
                let want = f(x as f64) as f32;
                // sin/cos near their zeros: compare absolutely (the function's scale is 1).
                let trig = matches!(fun, Fun::Sin | Fun::Cos) && (got - want).abs() < 2e-7;
                assert!(
                    close32(got, want) || trig,
                    "{fun:?}({x}) = {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn large_tensors_take_the_parallel_path_with_the_same_values() {
        let xs: Vec<f32> = (0..PARALLEL_THRESHOLD * 3 + 5)
            .map(|i| (i % 977) as f32 * 0.01 - 4.0)
            .collect();
        let mut parallel = xs.clone();
        let mut copied = vec![0.0; xs.len()];
        f32::map(Fun::Tanh, &mut copied, Some(&xs), &f32::tanh);
        f32::map(Fun::Tanh, &mut parallel, None, &f32::tanh);
        assert_eq!(copied, parallel);
        for chunk in xs.chunks(5) {
            let mut alone = chunk.to_vec();
            f32::map(Fun::Tanh, &mut alone, None, &f32::tanh);
            let start = (chunk.as_ptr() as usize - xs.as_ptr() as usize) / 4;
            assert_eq!(alone, parallel[start..start + chunk.len()]);
        }
    }

    #[test]
    fn pow_follows_c_outside_positive_finite_bases() {
        let bases = [
            0.0,
            -0.0,
            2.0,
            -2.0,
            -2.0,
            0.5,
            f64::INFINITY,
            f64::NAN,
            1.0,
            1.0,
            -8.0,
            10.0,
            3.7,
        ];
        let exps = [
            0.0,
            3.0,
            -1.0,
            3.0,
            0.5,
            f64::INFINITY,
            2.0,
            0.0,
            f64::NAN,
            f64::INFINITY,
            1.0 / 3.0,
            -50.0,
            2.2,
        ];
        let mut xs = bases;
        f64::pow(&mut xs, &exps, &f64::powf);
        for ((a, b), got) in bases.iter().zip(&exps).zip(xs) {
            assert!(
                close64(got, a.powf(*b)),
                "pow({a}, {b}) = {got}, C {}",
                a.powf(*b)
            );
        }
        let positive: Vec<f32> = (1..200_000).map(|i| i as f32 * 1e-3).collect();
        let mut xs = positive.clone();
        f32::pow(&mut xs, &[2.5], &f32::powf);
        for (a, got) in positive.iter().zip(xs) {
            assert!(close32(got, a.powf(2.5)), "pow({a}, 2.5) = {got}");
        }
    }
}
