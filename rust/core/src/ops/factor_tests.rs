//! The factorisation kernels against their definitions: reconstructions and residuals.

use super::*;

fn matrix(n: usize, seed: u64) -> Vec<f64> {
    // a deterministic, well-conditioned matrix: small pseudo-random entries plus n on the
    // diagonal of a cyclic shift, so that pivoting has to swap rows
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) - 0.5
    };
    let mut a: Vec<f64> = (0..n * n).map(|_| next()).collect();
    for i in 0..n {
        a[i * n + (i + 1) % n] += n as f64;
    }
    a
}

fn run(op: impl Into<Op>, inputs: &[Tensor]) -> Values<Tensor> {
    let op = op.into();
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let outs = op.infer(&types).unwrap();
    op.compute(inputs, &outs).unwrap()
}

use super::super::Op;

#[test]
fn lu_factor_reconstructs_the_rows_it_names() {
    for n in [1, 2, 5, 64, 200] {
        let a = matrix(n, n as u64);
        let out = run(LuFactor, &[Tensor::from_vec(a.clone(), &[n, n]).unwrap()]);
        let lu = out[0].as_slice::<f64>().unwrap();
        let piv = out[1].as_slice::<i32>().unwrap();
        let perm = out[2].as_slice::<i32>().unwrap();
        // perm is what the swaps make, applied in turn
        let made = run(LuPermutation, &[out[1].clone()]);
        assert_eq!(made[0].as_slice::<i32>().unwrap(), perm);
        assert!(piv.iter().enumerate().all(|(i, &p)| p as usize >= i));
        for i in 0..n {
            for j in 0..n {
                let mut s = 0.0;
                for k in 0..=i.min(j) {
                    let l = if k == i { 1.0 } else { lu[i * n + k] };
                    s += l * lu[k * n + j];
                }
                let want = a[perm[i] as usize * n + j];
                assert!((s - want).abs() < 1e-10 * n as f64, "n={n} ({i},{j})");
            }
        }
    }
}

#[test]
fn solves_leave_small_residuals_both_ways() {
    let (n, k) = (7, 3);
    let a = matrix(n, 3);
    let b: Vec<f64> = (0..n * k).map(|v| (v as f64).sin()).collect();
    let f = run(LuFactor, &[Tensor::from_vec(a.clone(), &[n, n]).unwrap()]);
    for trans in [false, true] {
        let x = run(
            LuSolve { trans },
            &[
                f[0].clone(),
                f[2].clone(),
                Tensor::from_vec(b.clone(), &[n, k]).unwrap(),
            ],
        );
        let x = x[0].as_slice::<f64>().unwrap();
        for i in 0..n {
            for c in 0..k {
                let s: f64 = (0..n)
                    .map(|j| {
                        let aij = if trans { a[j * n + i] } else { a[i * n + j] };
                        aij * x[j * k + c]
                    })
                    .sum();
                assert!((s - b[i * k + c]).abs() < 1e-12, "trans={trans}");
            }
        }
    }
}

#[test]
fn triangular_solves_read_one_triangle() {
    let n = 4;
    let a = matrix(n, 9);
    let b: Vec<f64> = (0..n).map(|v| v as f64 + 1.0).collect();
    for lower in [true, false] {
        for unit in [true, false] {
            let op = TriangularSolve {
                lower,
                unit_diagonal: unit,
            };
            let x = run(
                op,
                &[
                    Tensor::from_vec(a.clone(), &[1, n, n]).unwrap(),
                    Tensor::from_vec(b.clone(), &[1, n, 1]).unwrap(),
                ],
            );
            let x = x[0].as_slice::<f64>().unwrap();
            for i in 0..n {
                let s: f64 = (0..n)
                    .map(|j| {
                        let inside = if lower { j < i } else { j > i };
                        let v = match (i == j, unit) {
                            (true, true) => 1.0,
                            (true, false) => a[i * n + i],
                            _ if inside => a[i * n + j],
                            _ => 0.0,
                        };
                        v * x[j]
                    })
                    .sum();
                assert!((s - b[i]).abs() < 1e-12, "lower={lower} unit={unit}");
            }
        }
    }
}

#[test]
fn cholesky_factors_and_refuses_with_nan() {
    let n = 5;
    let m = matrix(n, 4);
    // a = m m^T + I, positive definite
    let mut a = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            a[i * n + j] = (0..n).map(|k| m[i * n + k] * m[j * n + k]).sum::<f64>();
        }
        a[i * n + i] += 1.0;
    }
    let l = run(Cholesky, &[Tensor::from_vec(a.clone(), &[n, n]).unwrap()]);
    let l = l[0].as_slice::<f64>().unwrap();
    for i in 0..n {
        for j in 0..n {
            let s: f64 = (0..n).map(|k| l[i * n + k] * l[j * n + k]).sum();
            assert!((s - a[i * n + j]).abs() < 1e-9);
            if j > i {
                assert_eq!(l[i * n + j], 0.0);
            }
        }
    }
    a[0] = -1.0;
    let bad = run(Cholesky, &[Tensor::from_vec(a, &[n, n]).unwrap()]);
    assert!(bad[0].as_slice::<f64>().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn kernels_refuse_derivatives_and_emission() {
    assert!(matches!(LuFactor.saves(), Saves::NotDifferentiable(_)));
    let e = Op::from(Cholesky).infer(&[TensorType::new(DType::I32, &[2, 2])]);
    assert!(e.is_err());
    let e = Op::from(LuFactor).infer(&[TensorType::new(DType::F64, &[2, 3])]);
    assert!(e.is_err());
}

#[test]
fn qr_is_orthogonal_times_upper_with_lapack_signs() {
    for (m, n) in [(5, 3), (3, 5), (4, 4), (70, 40)] {
        let a: Vec<f64> = matrix(m.max(n), 11)[..m * n].to_vec();
        let out = run(
            HouseholderQr,
            &[Tensor::from_vec(a.clone(), &[m, n]).unwrap()],
        );
        let (q, r) = (
            out[0].as_slice::<f64>().unwrap(),
            out[1].as_slice::<f64>().unwrap(),
        );
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..m).map(|k| q[i * m + k] * r[k * n + j]).sum();
                assert!((s - a[i * n + j]).abs() < 1e-11, "({m},{n}) a[{i},{j}]");
                if i > j {
                    assert_eq!(r[i * n + j], 0.0);
                }
            }
            for j in 0..m {
                let s: f64 = (0..m).map(|k| q[k * m + i] * q[k * m + j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-12);
            }
        }
        // LAPACK's sign: r[0,0] = -sign(a[0,0]) |a[:,0]|
        let norm: f64 = (0..m).map(|i| a[i * n] * a[i * n]).sum::<f64>().sqrt();
        assert!((r[0] + a[0].signum() * norm).abs() < 1e-12);
    }
    let empty = run(
        HouseholderQr,
        &[Tensor::from_vec(Vec::<f64>::new(), &[2, 3, 0]).unwrap()],
    );
    assert_eq!(
        empty[0].as_slice::<f64>().unwrap()[..9],
        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    );
}
