//! Single-precision sine and cosine on 16 lanes per instruction where the CPU has AVX-512.
//!
//! The extension is built for x86-64-v3 (`.cargo/config.toml`), so `wide`'s 8-lane f32 type
//! fills AVX2's 256-bit registers. Where the CPU has AVX-512 the same algorithm (`wide`'s port
//! of Agner Fog's vector class library) runs here on 512-bit registers, in functions compiled
//! for AVX-512 and called only when the CPU has it: W5's `sin` on float32[16] is one register,
//! as XLA runs it, instead of two.
//!
//! The results are `wide`'s bit for bit: the same operations in the same order, fused where
//! `wide` fuses them. A lane past the range reduction's accurate range goes through the op's
//! scalar kernel, decided per block of `wide`'s 8 lanes as `lanes` decides it, so that every
//! element's value is the same on every CPU and at every tensor size (`tests` checks both
//! against `wide`).

use super::kernels::PARALLEL_THRESHOLD;
use super::parallel;

/// Elements per parallel task, as `lanes` splits them.
const TASK: usize = 1 << 13;

/// Lanes of `wide`'s f32 block: the unit a lane past `LIMIT` sends to the scalar kernel.
const WIDE_LANES: usize = 8;

/// Lanes of one 512-bit register.
const LANES: usize = 16;

/// The largest |x| the range reduction keeps accurate (`lanes`'s f32 trig limit).
const LIMIT: f32 = 524_288.0;

/// Whether this CPU runs the 512-bit form (the detection is cached by `std`).
pub(super) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Sine (or cosine, `cos`) of every element of `xs` in place, or of `from` into `xs`, on
/// 512-bit registers; `scalar` is the op's kernel for lanes past the limit. False, with `xs`
/// untouched, where the CPU has no AVX-512.
pub(super) fn map(
    cos: bool,
    xs: &mut [f32],
    from: Option<&[f32]>,
    scalar: &(impl Fn(f32) -> f32 + Sync),
) -> bool {
    if !has_avx512() {
        return false;
    }
    parallel::map_pieces(xs, from, TASK, PARALLEL_THRESHOLD, &|xs, from| {
        run_avx512(cos, xs, from, scalar)
    });
    true
}

#[cfg(target_arch = "x86_64")]
#[allow(
    unsafe_code,
    reason = "a function compiled for AVX-512, called where the CPU has it"
)]
fn run_avx512(
    cos: bool,
    xs: &mut [f32],
    from: Option<&[f32]>,
    scalar: &(impl Fn(f32) -> f32 + Sync),
) {
    // SAFETY: `map` calls this only after `has_avx512`, so the CPU has the features
    // `avx512::blocks` is compiled for.
    unsafe { avx512::blocks(cos, xs, from, scalar) }
}

#[cfg(not(target_arch = "x86_64"))]
fn run_avx512(_: bool, _: &mut [f32], _: Option<&[f32]>, _: &(impl Fn(f32) -> f32 + Sync)) {
    unreachable!("`has_avx512` is false off x86-64")
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{LANES, LIMIT, WIDE_LANES};

    /// Whole registers of lanes, then the rest padded with ones (as `lanes` pads its last
    /// block).
    #[target_feature(enable = "avx512f")]
    pub(super) fn blocks(
        cos: bool,
        xs: &mut [f32],
        from: Option<&[f32]>,
        scalar: &(impl Fn(f32) -> f32 + Sync),
    ) {
        let (whole, rest) = xs.as_chunks_mut::<LANES>();
        let rest_from = match from {
            Some(from) => {
                let (sources, rest_from) = from.as_chunks::<LANES>();
                for (out, lanes) in whole.iter_mut().zip(sources) {
                    block(cos, lanes, out, scalar);
                }
                rest_from
            }
            None => {
                for out in whole.iter_mut() {
                    let lanes = *out;
                    block(cos, &lanes, out, scalar);
                }
                &*rest
            }
        };
        if !rest.is_empty() {
            let mut lanes = [1.0; LANES];
            lanes[..rest.len()].copy_from_slice(rest_from);
            let mut out = [0.0; LANES];
            block(cos, &lanes, &mut out, scalar);
            rest.copy_from_slice(&out[..rest.len()]);
        }
    }

    /// One register of lanes into `out`, stored there straight from the register. A register
    /// holding a lane past the limit sends each 8-lane block of `wide`'s that holds one to
    /// `scalar`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(unsafe_code, reason = "unaligned loads and stores of whole arrays")]
    fn block(
        cos: bool,
        lanes: &[f32; LANES],
        out: &mut [f32; LANES],
        scalar: &(impl Fn(f32) -> f32 + Sync),
    ) {
        // SAFETY: `lanes` holds the 16 f32 one unaligned load reads.
        let x = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
        let (sin, cosine) = sin_cos(x);
        let far = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(x), _mm512_set1_ps(LIMIT));
        // SAFETY: `out` has room for the 16 f32 one unaligned store writes.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), if cos { cosine } else { sin }) };
        if far != 0 {
            // `lanes` may be `out`'s old values (in place): the arguments are kept in `x`.
            let mut arguments = [0.0; LANES];
            // SAFETY: as above, for `arguments`.
            unsafe { _mm512_storeu_ps(arguments.as_mut_ptr(), x) };
            beyond_the_limit(far, &arguments, out, scalar);
        }
    }

    /// `scalar` of every lane of each 8-lane block that holds one past the limit (`far`).
    #[cold]
    fn beyond_the_limit(
        far: __mmask16,
        lanes: &[f32; LANES],
        out: &mut [f32; LANES],
        scalar: &(impl Fn(f32) -> f32 + Sync),
    ) {
        for (k, (part, out)) in lanes
            .chunks(WIDE_LANES)
            .zip(out.chunks_mut(WIDE_LANES))
            .enumerate()
        {
            if far >> (k * WIDE_LANES) & 0xff != 0 {
                out.iter_mut().zip(part).for_each(|(o, &x)| *o = scalar(x));
            }
        }
    }

    /// `wide::f32x8::sin_cos` on 16 lanes, operation for operation (its overflow select is
    /// left out: it changes only lanes past the limit, which go to the scalar kernel).
    #[target_feature(enable = "avx512f")]
    #[allow(
        clippy::excessive_precision,
        clippy::unreadable_literal,
        reason = "`wide`'s constants as it writes them"
    )]
    fn sin_cos(x: __m512) -> (__m512, __m512) {
        let dp1 = _mm512_set1_ps(0.78515625 * 2.0);
        let dp2 = _mm512_set1_ps(2.4187564849853515625E-4 * 2.0);
        let dp3 = _mm512_set1_ps(3.77489497744594108E-8 * 2.0);
        let p0s = _mm512_set1_ps(-1.6666654611E-1);
        let p1s = _mm512_set1_ps(8.3321608736E-3);
        let p2s = _mm512_set1_ps(-1.9515295891E-4);
        let p0c = _mm512_set1_ps(4.166664568298827E-2);
        let p1c = _mm512_set1_ps(-1.388731625493765E-3);
        let p2c = _mm512_set1_ps(2.443315711809948E-5);
        let two_over_pi = _mm512_set1_ps(2.0 / std::f32::consts::PI);

        let xa = _mm512_abs_ps(x);
        let y = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xa, two_over_pi),
        );
        let q = _mm512_cvtps_epi32(y);
        let r = _mm512_fnmadd_ps(
            y,
            dp3,
            _mm512_fnmadd_ps(y, dp2, _mm512_fnmadd_ps(y, dp1, xa)),
        );
        let x2 = _mm512_mul_ps(r, r);
        let x4 = _mm512_mul_ps(x2, x2);
        let poly_s = _mm512_fmadd_ps(x4, p2s, _mm512_fmadd_ps(x2, p1s, p0s));
        let poly_c = _mm512_fmadd_ps(x4, p2c, _mm512_fmadd_ps(x2, p1c, p0c));
        let s = _mm512_add_ps(_mm512_mul_ps(poly_s, _mm512_mul_ps(r, x2)), r);
        let half_x2 = _mm512_fnmadd_ps(_mm512_set1_ps(0.5), x2, _mm512_set1_ps(1.0));
        let c = _mm512_add_ps(_mm512_mul_ps(poly_c, _mm512_mul_ps(x2, x2)), half_x2);

        let swap = _mm512_test_epi32_mask(q, _mm512_set1_epi32(1));
        let sign = _mm512_set1_epi32(i32::MIN);
        let sin_sign = _mm512_and_si512(
            _mm512_xor_si512(_mm512_slli_epi32::<30>(q), _mm512_castps_si512(x)),
            sign,
        );
        let sin = _mm512_xor_si512(
            _mm512_castps_si512(_mm512_mask_blend_ps(swap, s, c)),
            sin_sign,
        );
        let one = _mm512_set1_epi32(1);
        let cos_sign = _mm512_slli_epi32::<30>(_mm512_and_si512(
            _mm512_add_epi32(q, one),
            _mm512_set1_epi32(2),
        ));
        let cos = _mm512_xor_si512(
            _mm512_castps_si512(_mm512_mask_blend_ps(swap, c, s)),
            cos_sign,
        );

        // IEEE 754: sin/cos(±inf) and sin/cos(NaN) are NaN.
        let exponent = _mm512_set1_epi32(0xFF00_0000_u32 as i32);
        let bits = _mm512_slli_epi32::<1>(_mm512_castps_si512(x));
        let finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
        let nan = _mm512_set1_ps(f32::NAN);
        (
            _mm512_mask_blend_ps(finite, nan, _mm512_castsi512_ps(sin)),
            _mm512_mask_blend_ps(finite, nan, _mm512_castsi512_ps(cos)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::lanes::{Fun, Lanes};

    fn inputs() -> Vec<f32> {
        let special = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            1e-30,
        ];
        let sweep = (0..20_001).map(|i| -600.0 + 0.06 * i as f32);
        let far = (0..120).map(|i| 1.37f32.powi(i) * if i % 2 == 0 { 1.0 } else { -1.0 });
        special.into_iter().chain(sweep).chain(far).collect()
    }

    /// Runs `check` where the CPU has AVX-512; elsewhere `map` must decline.
    fn on_avx512(check: impl FnOnce()) {
        if has_avx512() {
            check();
        } else {
            let mut xs = [0.5f32; 3];
            assert!(
                !map(false, &mut xs, None, &f32::sin),
                "no AVX-512, yet `map` ran"
            );
            assert_eq!(xs, [0.5; 3]);
        }
    }

    #[test]
    fn sine_and_cosine_are_wide_s_bit_for_bit() {
        on_avx512(|| {
            let xs = inputs();
            for (fun, cos) in [(Fun::Sin, false), (Fun::Cos, true)] {
                let scalar = |x: f32| {
                    let x = x as f64;
                    (if cos { x.cos() } else { x.sin() }) as f32
                };
                let mut want = xs.clone();
                f32::map_narrow(fun, &mut want, None, &scalar);
                // Lengths about one and two registers, and all: the padded last block too,
                // in place and from a source.
                for len in [1, 7, 8, 9, 15, 16, 17, 33, xs.len()] {
                    let mut from = vec![0.0f32; len];
                    assert!(map(cos, &mut from, Some(&xs[..len]), &scalar));
                    let mut in_place = xs[..len].to_vec();
                    assert!(map(cos, &mut in_place, None, &scalar));
                    for (k, (&f, &p)) in from.iter().zip(&in_place).enumerate() {
                        let w = want[k];
                        let same =
                            |g: f32| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                        assert!(
                            same(f) && same(p),
                            "{fun:?}({}) = {f} and {p}, wide {w}",
                            xs[k]
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn large_tensors_split_across_threads_give_the_same_values() {
        on_avx512(|| {
            let xs: Vec<f32> = (0..PARALLEL_THRESHOLD * 2 + 3)
                .map(|i| (i % 1013) as f32 * 0.37 - 180.0)
                .collect();
            let mut split = xs.clone();
            assert!(map(false, &mut split, None, &f32::sin));
            let piece = TASK / 2 + 5;
            for (k, chunk) in xs.chunks(piece).enumerate() {
                let mut alone = chunk.to_vec();
                assert!(map(false, &mut alone, None, &f32::sin));
                assert_eq!(alone, split[k * piece..k * piece + chunk.len()]);
            }
        });
    }
}
