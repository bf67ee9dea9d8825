//! Reductions against an element-by-element reference: every axis set, keepdims, the
//! parallel paths, NaN, wrapping and empty inputs.

use super::*;
use crate::dtype::DType;
use crate::ops::EagerContext;
use crate::ErrorKind;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sum,
    Max,
    Min,
}

fn run(kind: Kind, x: &Tensor, axes: &[usize], keep: bool) -> Result<Tensor> {
    let ctx = &mut EagerContext;
    match kind {
        Kind::Sum => sum(ctx, x, axes, keep),
        Kind::Max => reduce_max(ctx, x, axes, keep),
        Kind::Min => reduce_min(ctx, x, axes, keep),
    }
}

/// Element by element into the output position with the reduced axes dropped.
fn reference(kind: Kind, x: &Tensor, axes: &[usize]) -> Vec<f64> {
    let shape = x.shape();
    let out_shape = reduced_shape(shape, axes, true);
    let init = match kind {
        Kind::Sum => 0.0,
        Kind::Max => f64::NEG_INFINITY,
        Kind::Min => f64::INFINITY,
    };
    let mut out = vec![init; numel(&out_shape)];
    for (flat, v) in x.to_f64_vec().into_iter().enumerate() {
        let (mut rest, mut o, mut scale) = (flat, 0, 1);
        for d in (0..shape.len()).rev() {
            let i = rest % shape[d];
            rest /= shape[d];
            if !axes.contains(&d) {
                o += i * scale;
                scale *= shape[d];
            }
        }
        let a = out[o];
        out[o] = match kind {
            Kind::Sum => a + v,
            _ if a.is_nan() || v.is_nan() => f64::NAN,
            Kind::Max => a.max(v),
            Kind::Min => a.min(v),
        };
    }
    out
}

fn data(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| ((i * 7919 + 13) % 23) as f64 - 11.0)
        .collect();
    crate::with_dtype!(dtype, T, {
        Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>(), shape).unwrap()
    })
}

fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

fn check_all_axis_sets(x: &Tensor) {
    let r = x.ndim();
    for mask in 0..(1usize << r) {
        let axes: Vec<usize> = (0..r).filter(|&i| mask & (1 << i) != 0).collect();
        for kind in [Kind::Sum, Kind::Max, Kind::Min] {
            for keep in [false, true] {
                let y = run(kind, x, &axes, keep).unwrap();
                assert_eq!(y.shape(), reduced_shape(x.shape(), &axes, keep).as_slice());
                let want = reference(kind, x, &axes);
                assert!(
                    same(&y.to_f64_vec(), &want),
                    "{kind:?} of {} over {axes:?}",
                    x.ty()
                );
            }
        }
    }
}

#[test]
fn every_axis_set_matches_the_reference() {
    for shape in [
        &[2, 3, 4][..],
        &[5, 1, 6],
        &[3, 4, 5, 2],
        &[1, 7],
        &[6],
        &[],
    ] {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
            check_all_axis_sets(&data(shape, dtype));
        }
    }
}

#[test]
fn large_inputs_take_the_parallel_paths() {
    let shapes: [&[usize]; 6] = [
        &[600, 500],
        &[80, 5000],
        &[1000, 300],
        &[3, 100000],
        &[40, 80, 100],
        &[2, 80000, 2],
    ];
    for shape in shapes {
        check_all_axis_sets(&data(shape, DType::F32));
    }
    // More threads than output elements: each long row is split instead.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap();
    pool.install(|| check_all_axis_sets(&data(&[3, 100000], DType::F64)));
    check_all_axis_sets(&data(&[64, 512], DType::F64));
}

#[test]
fn nan_propagates_through_max_and_min() {
    for shape in [&[4, 9][..], &[300, 200]] {
        let mut x = data(shape, DType::F64).to_f64_vec();
        x[5] = f64::NAN;
        let n = x.len();
        x[n - 3] = f64::NAN;
        check_all_axis_sets(&Tensor::from_vec(x, shape).unwrap());
    }
}

#[test]
fn integer_sums_wrap() {
    let x = Tensor::from_vec(vec![i32::MAX, 1, 5, 6], &[2, 2]).unwrap();
    assert_eq!(
        run(Kind::Sum, &x, &[0, 1], false)
            .unwrap()
            .as_slice::<i32>()
            .unwrap(),
        &[i32::MIN.wrapping_add(11)]
    );
    assert_eq!(
        run(Kind::Sum, &x, &[1], false)
            .unwrap()
            .as_slice::<i32>()
            .unwrap(),
        &[i32::MIN, 11]
    );
}

#[test]
fn empty_inputs() {
    let x = Tensor::zeros(DType::F32, &[0, 3]);
    assert_eq!(
        run(Kind::Sum, &x, &[0], false).unwrap().to_f64_vec(),
        vec![0.0; 3]
    );
    assert_eq!(run(Kind::Sum, &x, &[1], true).unwrap().shape(), &[0, 1]);
    assert_eq!(run(Kind::Max, &x, &[1], false).unwrap().shape(), &[0]);
    let e = run(Kind::Max, &x, &[0], false).unwrap_err();
    assert!(
        e.kind == ErrorKind::InvalidArgument && e.to_string().starts_with("max:"),
        "{e}"
    );
    let e = run(Kind::Sum, &x, &[2], false).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Index);
}
