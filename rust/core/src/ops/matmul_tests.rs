//! MatMul against a naive reference: broadcast batches, transposes, size 0, rank 1, ints,
//! errors and gradients (first and second order, finite differences).

use super::*;
use crate::dtype::{DType, Element};
use crate::ops::EagerContext;
use crate::testing::gradcheck;
use crate::ErrorKind;

/// Small integers in [-3, 3]: products and sums stay exact in every dtype.
fn data(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % 7) as f64 - 3.0
        })
        .collect();
    crate::with_dtype!(dtype, T, {
        Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>(), shape).unwrap()
    })
}

/// Triple loop over broadcast batch indices.
fn reference(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> (Vec<usize>, Vec<f64>) {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k) = if ta {
        (sa[ra - 1], sa[ra - 2])
    } else {
        (sa[ra - 2], sa[ra - 1])
    };
    let n = if tb { sb[rb - 2] } else { sb[rb - 1] };
    let batch = broadcast_shapes("t", &sa[..ra - 2], &sb[..rb - 2]).unwrap();
    let (xa, xb) = (a.to_f64_vec(), b.to_f64_vec());
    let index = |shape: &[usize], bidx: &[usize], r: usize, c: usize| {
        let own = &shape[..shape.len() - 2];
        let lead = bidx.len() - own.len();
        let mut off = 0;
        for (d, &size) in own.iter().enumerate() {
            off = off * size + if size == 1 { 0 } else { bidx[lead + d] };
        }
        let cols = shape[shape.len() - 1];
        off * shape[shape.len() - 2] * cols + r * cols + c
    };
    let mut out = vec![];
    for t in 0..numel(&batch) {
        let mut bidx = vec![0; batch.len()];
        let mut u = t;
        for d in (0..batch.len()).rev() {
            bidx[d] = u % batch[d];
            u /= batch[d];
        }
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|p| {
                        let x = if ta {
                            xa[index(sa, &bidx, p, i)]
                        } else {
                            xa[index(sa, &bidx, i, p)]
                        };
                        let y = if tb {
                            xb[index(sb, &bidx, j, p)]
                        } else {
                            xb[index(sb, &bidx, p, j)]
                        };
                        x * y
                    })
                    .sum();
                out.push(s);
            }
        }
    }
    let mut shape = batch.to_vec();
    shape.extend([m, n]);
    (shape, out)
}

fn check(sa: &[usize], sb: &[usize], ta: bool, tb: bool) {
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let (a, b) = (data(sa, 1, dtype), data(sb, 2, dtype));
        let c = matmul_transposed(&mut EagerContext, &a, &b, ta, tb).unwrap();
        let (shape, want) = reference(&a, &b, ta, tb);
        assert_eq!(
            c.shape(),
            shape.as_slice(),
            "{sa:?} @ {sb:?} ({ta}, {tb}) {dtype}"
        );
        assert_eq!(c.dtype(), dtype);
        assert_eq!(c.to_f64_vec(), want, "{sa:?} @ {sb:?} ({ta}, {tb}) {dtype}");
    }
}

#[test]
fn matches_the_reference_with_broadcast_batches_and_transposes() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 6]),
        (&[1, 3, 4], &[2, 4, 5]),
        (&[2, 3, 4], &[1, 4, 5]),
        (&[1, 1], &[1, 7]),
        (&[3, 40, 30], &[30, 40]),
        (&[4, 1, 3], &[1, 3, 2]),
    ];
    for &(sa, sb) in cases {
        check(sa, sb, false, false);
        let swap = |s: &[usize]| {
            let mut s = s.to_vec();
            let r = s.len();
            s.swap(r - 1, r - 2);
            s
        };
        check(&swap(sa), sb, true, false);
        check(sa, &swap(sb), false, true);
        check(&swap(sa), &swap(sb), true, true);
    }
}

#[test]
fn vector_products_match_the_reference_at_every_block_boundary() {
    // One row or one column out (`MatVec`'s loops), both layouts of the matrix, sizes around
    // the vector width, the 8-register block and the 4-row group, batches, and past
    // `MATVEC_ELEMENTS` (gemm again).
    let sizes = [1, 3, 4, 8, 9, 31, 64, 65, 70, 129, 300];
    for (k, n) in sizes
        .iter()
        .flat_map(|&k| sizes.iter().map(move |&n| (k, n)))
    {
        check(&[1, k], &[k, n], false, false);
        check(&[1, k], &[n, k], false, true);
        check(&[k, 1], &[k, n], true, false);
        check(&[n, k], &[k, 1], false, false);
        check(&[k, n], &[k, 1], true, false);
        check(&[n, k], &[1, k], false, true);
    }
    check(&[3, 1, 64], &[64, 70], false, false);
    check(&[2, 70, 64], &[2, 64, 1], false, false);
    check(&[5, 1, 64], &[5, 33, 64], false, true);
}

#[test]
fn large_products_take_the_parallel_paths() {
    // Many products spread one per task; one product split by gemm; ints split by rows.
    check(&[40, 40, 60], &[40, 60, 50], false, false);
    check(&[200, 150], &[150, 150], false, false);
    check(&[150, 200], &[150, 150], true, true);
}

#[test]
fn products_split_over_threads_by_rows_or_columns_match_the_reference() {
    // Four threads whatever the machine: rows (ragged last block), columns (blocks of 80, 80,
    // 80 and 60, each copied into its columns), transposed operands, and sides too short to
    // split (gemm's own split).
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    pool.install(|| {
        check(&[300, 200], &[200, 100], false, false);
        check(&[200, 300], &[200, 100], true, false);
        check(&[70, 200], &[200, 300], false, false);
        check(&[70, 200], &[300, 200], false, true);
        check(&[2, 70, 200], &[200, 300], false, false);
        check(&[40, 4000], &[4000, 40], false, false);
    });
}

#[test]
fn products_with_a_transposed_operand_are_rerouted_through_row_major_copies() {
    // Each case is large enough for `Reroute`, with sizes that leave ragged tiles.
    let route = |sa: &[usize], sb: &[usize], ta: bool, tb: bool| {
        let op = MatMul {
            transpose_a: ta,
            transpose_b: tb,
        };
        let ty = |s: &[usize]| TensorType::new(DType::F32, s);
        let plan = op.plan(&ty(sa), &ty(sb)).unwrap();
        match Reroute::choose(&plan) {
            Some(Reroute::Right) => "right",
            Some(Reroute::Left) => "left",
            Some(Reroute::LeftAndResult) => "left and result",
            None => "none",
        }
    };
    type Case<'a> = (&'a [usize], &'a [usize], bool, bool, &'a str);
    let cases: &[Case] = &[
        (&[33, 300], &[257, 300], false, true, "left and result"),
        (&[257, 300], &[33, 300], false, true, "right"),
        (
            &[2, 33, 300],
            &[2, 257, 300],
            false,
            true,
            "left and result",
        ),
        (&[300, 70], &[300, 130], true, false, "left"),
        (&[2, 300, 70], &[300, 130], true, false, "left"),
        // too small, or the copy would cost more than the product saves
        (&[8, 64], &[64, 64], false, true, "none"),
        (&[40, 500], &[60, 500], false, true, "none"),
        (&[300, 70], &[130, 300], true, true, "none"),
    ];
    for &(sa, sb, ta, tb, want) in cases {
        assert_eq!(route(sa, sb, ta, tb), want, "{sa:?} @ {sb:?} ({ta}, {tb})");
        check(sa, sb, ta, tb);
    }
}

#[test]
fn size_zero_dimensions() {
    check(&[0, 3], &[3, 2], false, false);
    check(&[2, 0], &[0, 3], false, false);
    check(&[0, 2, 3], &[3, 4], false, false);
    check(&[2, 3], &[3, 0], false, false);
    let c = matmul(
        &mut EagerContext,
        &data(&[2, 0], 1, DType::F32),
        &data(&[0, 3], 2, DType::F32),
    )
    .unwrap();
    assert_eq!((c.shape(), c.to_f64_vec()), (&[2, 3][..], vec![0.0; 6]));
}

#[test]
fn integer_products_wrap() {
    let a = Tensor::from_vec(vec![i32::MAX, 1], &[1, 2]).unwrap();
    let b = Tensor::from_vec(vec![2i32, 3], &[2, 1]).unwrap();
    let c = matmul(&mut EagerContext, &a, &b).unwrap();
    assert_eq!(
        c.as_slice::<i32>().unwrap(),
        &[i32::MAX.wrapping_mul(2).wrapping_add(3)]
    );
}

#[test]
fn rank_one_operands_follow_numpy() {
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[3], &[3], &[]),
        (&[3], &[3, 4], &[4]),
        (&[2, 3], &[3], &[2]),
        (&[5, 2, 3], &[3], &[5, 2]),
        (&[3], &[5, 3, 4], &[5, 4]),
    ];
    for &(sa, sb, want) in cases {
        let (a, b) = (data(sa, 3, DType::F64), data(sb, 4, DType::F64));
        let c = matmul(&mut EagerContext, &a, &b).unwrap();
        assert_eq!(c.shape(), want, "{sa:?} @ {sb:?}");
        let a2 = if sa.len() == 1 {
            a.reshaped(&[1, sa[0]]).unwrap()
        } else {
            a.clone()
        };
        let b2 = if sb.len() == 1 {
            b.reshaped(&[sb[0], 1]).unwrap()
        } else {
            b.clone()
        };
        assert_eq!(c.to_f64_vec(), reference(&a2, &b2, false, false).1);
    }
}

fn err(sa: &[usize], da: DType, sb: &[usize], db: DType) -> Error {
    matmul(&mut EagerContext, &data(sa, 1, da), &data(sb, 2, db)).unwrap_err()
}

#[test]
fn errors_name_the_op_both_operands_and_the_expectation() {
    let e = err(&[2, 3], DType::F32, &[4, 5], DType::F32);
    assert_eq!(e.kind, ErrorKind::Shape);
    let text = e.to_string();
    assert!(
        text.starts_with("matmul:")
            && text.contains("float32[2, 3]")
            && text.contains("float32[4, 5]"),
        "{text}"
    );
    assert!(text.contains("[..., k, n]"), "{text}");
    let e = err(&[3], DType::F32, &[4, 5], DType::F32);
    assert!(
        e.kind == ErrorKind::Shape && e.to_string().contains("float32[3]"),
        "{e}"
    );
    let e = err(&[2, 3, 4], DType::F64, &[3, 4, 5], DType::F64);
    assert!(
        e.kind == ErrorKind::Shape && e.to_string().contains("batch dimensions [2] and [3]"),
        "{e}"
    );
    let e = err(&[], DType::F64, &[3], DType::F64);
    assert!(
        e.kind == ErrorKind::Shape && e.to_string().contains("at least one dimension"),
        "{e}"
    );
    let e = err(&[2, 3], DType::F32, &[3, 2], DType::F64);
    assert!(
        e.kind == ErrorKind::DType && e.to_string().contains("float64[3, 2]"),
        "{e}"
    );
    let t = Tensor::from_vec(vec![true; 4], &[2, 2]).unwrap();
    let e = matmul(&mut EagerContext, &t, &t).unwrap_err();
    assert!(
        e.kind == ErrorKind::DType && e.to_string().contains("bool[2, 2]"),
        "{e}"
    );
    let v = data(&[3], 1, DType::F32);
    let e = matmul_transposed(&mut EagerContext, &v, &v, false, false).unwrap_err();
    assert!(
        e.kind == ErrorKind::Shape && e.to_string().contains("rank >= 2"),
        "{e}"
    );
}

#[test]
fn gradients_match_finite_differences() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[2, 3], &[3, 4]),
        (&[2, 2, 3], &[3, 4]),
        (&[3, 2], &[2, 2, 3]),
        (&[2, 1, 2, 3], &[3, 3, 2]),
        (&[3], &[3, 2]),
        (&[2, 3], &[3]),
    ];
    for &(sa, sb) in cases {
        let (a, b) = (gradcheck::ramp(sa), gradcheck::ramp(sb));
        let scaled = |x: &Tensor| {
            Tensor::from_vec(x.to_f64_vec().iter().map(|v| v * 0.1).collect(), x.shape()).unwrap()
        };
        let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let y = matmul(ctx, &xs[0], &xs[1])?;
            gradcheck::smooth_loss(ctx, &y)
        };
        gradcheck::check_gradients(&f, &[scaled(&a), scaled(&b)]);
    }
}

#[test]
fn transposed_operand_gradients_match_finite_differences() {
    for (ta, tb) in [(true, false), (false, true), (true, true)] {
        let (a, b) = (gradcheck::ramp(&[2, 3, 2]), gradcheck::ramp(&[4, 3]));
        let f = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| {
            let y = matmul_transposed(ctx, &xs[0], &xs[1], ta, tb)?;
            gradcheck::smooth_loss(ctx, &y)
        };
        let (a, b) = if ta {
            (a, b)
        } else {
            (a.reshaped(&[2, 2, 3]).unwrap(), b)
        };
        let b = if tb { b } else { b.reshaped(&[3, 4]).unwrap() };
        gradcheck::check_gradients(&f, &[a, b]);
    }
}

#[test]
fn destination_kernels_overwrite_what_the_buffer_held() {
    // Compiled frames reuse buffers between iterations: the kernel must not read them.
    let cases: &[(&[usize], &[usize], bool, bool)] = &[
        (&[1, 64], &[64, 64], false, false),
        (&[1, 64], &[1, 64], true, false),
        (&[3, 2, 5], &[5, 4], false, false),
        (&[3, 0], &[0, 4], false, false),
        (&[2, 3], &[4, 3], false, true),
    ];
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
        for &(sa, sb, ta, tb) in cases {
            let op = MatMul {
                transpose_a: ta,
                transpose_b: tb,
            };
            let (a, b) = (data(sa, 3, dtype), data(sb, 4, dtype));
            let want = op.compute(&[a.clone(), b.clone()], &[]).unwrap().remove(0);
            let kernel = op
                .kernel_into(&[a.ty().clone(), b.ty().clone()], &[want.ty().clone()])
                .unwrap();
            crate::with_dtype!(dtype, T, {
                let storage = |t: &Tensor| T::into_storage(t.as_slice::<T>().unwrap().to_vec());
                let (xs, ys) = (storage(&a), storage(&b));
                let mut out = [T::into_storage(vec![T::from_f64(7.0); want.numel()])];
                kernel(&[&xs, &ys], &mut out).unwrap();
                let got = T::slice(&out[0]).unwrap();
                assert_eq!(
                    got,
                    want.as_slice::<T>().unwrap(),
                    "{dtype:?} {sa:?} {sb:?}"
                );
            });
        }
    }
}

/// Values with zeros of both signs, so a product of 0 and a negative is -0.
fn signed(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| [-0.0, 1.5, 0.0, -2.25, 3.0][(i * 7 + seed) % 5] * (1.0 + i as f32 / 64.0))
        .collect()
}

#[test]
fn outer_products_are_exact_products_on_both_sides_of_the_loop_threshold() {
    // [m, 1] x [1, n] and the transposed forms; 128 x 128 is the loop's last size (gemm's
    // kernels past it may add a zero product to +0).
    for (m, n) in [(1, 1), (3, 4), (64, 64), (128, 128), (129, 128)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a_shape = if ta { [1, m] } else { [m, 1] };
            let b_shape = if tb { [n, 1] } else { [1, n] };
            let (xa, xb) = (signed(m, 1), signed(n, 2));
            let a = Tensor::from_vec(xa.clone(), &a_shape).unwrap();
            let b = Tensor::from_vec(xb.clone(), &b_shape).unwrap();
            let c = matmul_transposed(&mut EagerContext, &a, &b, ta, tb).unwrap();
            assert_eq!(c.shape(), [m, n]);
            let got = c.as_slice::<f32>().unwrap();
            let bits_differ = (0..m * n).filter(|&k| {
                let want = xa[k / n] * xb[k % n];
                got[k].to_bits() != want.to_bits() && !(m * n > OUTER_LOOP_ELEMENTS && want == 0.0)
            });
            assert_eq!(bits_differ.count(), 0, "{m} x {n} ({ta}, {tb})");
        }
    }
}

#[test]
fn a_rank_one_update_adds_the_rounded_product_in_the_adds_order() {
    let (m, n) = (5, 7);
    let (a, b, x) = (signed(m, 3), signed(n, 4), signed(m * n, 0));
    let storage = |v: &[f32]| f32::into_storage(v.to_vec());
    for product_first in [false, true] {
        let kernel = rank_one_update_into(DType::F32, m, n, product_first).unwrap();
        // Into a buffer from x, a and b; and in place, from a and b into x's elements.
        let mut out = [storage(&vec![7.0; m * n])];
        kernel(&[&storage(&x), &storage(&a), &storage(&b)], &mut out).unwrap();
        let mut updated = [storage(&x)];
        kernel(&[&storage(&a), &storage(&b)], &mut updated).unwrap();
        for got in [&out[0], &updated[0]].map(|s| f32::slice(s).unwrap()) {
            for k in 0..m * n {
                let p = a[k / n] * b[k % n];
                let want = x[k] + p; // either order: the operands are not NaNs
                assert_eq!(got[k].to_bits(), want.to_bits(), "element {k}");
            }
        }
        let mut wrong = [storage(&[0.0; 3])];
        assert!(kernel(&[&storage(&x), &storage(&a), &storage(&b)], &mut wrong).is_err());
        assert!(kernel(&[&storage(&a), &storage(&b)], &mut wrong).is_err());
        assert!(kernel(&[&storage(&x[..3]), &storage(&a), &storage(&b)], &mut out).is_err());
    }
    assert!(rank_one_update_into(DType::I32, m, n, false).is_none());
    assert!(rank_one_update_into(DType::F64, 129, 128, false).is_none());
}
