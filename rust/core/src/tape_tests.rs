//! Tape behaviour: recording rules, persistence, unconnected sources, higher order.

use super::*;
use crate::ops::build;
use crate::ops::EagerContext;
use crate::tensor::Tensor;

fn registry() -> GradientRegistry<Tensor> {
    GradientRegistry::with_op_table()
}

fn x(values: &[f64]) -> Tensor {
    Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

/// Records `f(x)` on `tape`, returning the output.
fn record(
    tape: &TapeRef<Tensor>,
    reg: &GradientRegistry<Tensor>,
    f: impl Fn(&mut dyn Context<Tensor>) -> Result<Tensor>,
) -> Tensor {
    let mut eager = EagerContext;
    let tapes = [tape.clone()];
    let mut ctx = TapeContext {
        inner: &mut eager,
        tapes: &tapes,
        registry: reg,
    };
    f(&mut ctx).unwrap()
}

fn grad(tape: &TapeRef<Tensor>, y: &Tensor, x: &Tensor) -> Result<Option<Tensor>> {
    Ok(compute_gradient(
        tape,
        &mut EagerContext,
        std::slice::from_ref(y),
        std::slice::from_ref(x),
        None,
    )?
    .remove(0))
}

#[test]
fn first_order_matches_the_analytic_derivative() {
    // d/dx sum(sin(x) * x) = cos(x) * x + sin(x)
    let reg = registry();
    let a = x(&[0.5, -1.25, 2.0]);
    let tape = Tape::new_ref(false);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| {
        let s = build::sin(ctx, &a)?;
        let p = build::mul(ctx, &s, &a)?;
        build::sum(ctx, &p, &[0], false)
    });
    let g = grad(&tape, &y, &a).unwrap().unwrap().to_f64_vec();
    for (gi, xi) in g.iter().zip(a.to_f64_vec()) {
        assert!((gi - (xi.cos() * xi + xi.sin())).abs() < 1e-12);
    }
}

#[test]
fn non_persistent_tape_refuses_a_second_gradient() {
    let reg = registry();
    let a = x(&[1.0]);
    let tape = Tape::new_ref(false);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| build::exp(ctx, &a));
    assert!(grad(&tape, &y, &a).unwrap().is_some());
    let err = grad(&tape, &y, &a).unwrap_err();
    assert_eq!(err.kind, crate::ErrorKind::Gradient);
    assert!(err.message.contains("persistent"), "{err}");
}

#[test]
fn persistent_tape_gives_the_same_gradient_twice() {
    let reg = registry();
    let a = x(&[0.3, 0.7]);
    let tape = Tape::new_ref(true);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| {
        let t = build::tanh(ctx, &a)?;
        build::sum(ctx, &t, &[0], false)
    });
    let g1 = grad(&tape, &y, &a).unwrap().unwrap().to_f64_vec();
    let g2 = grad(&tape, &y, &a).unwrap().unwrap().to_f64_vec();
    assert_eq!(g1, g2);
}

#[test]
fn unwatched_and_unconnected_sources_get_none() {
    let reg = registry();
    let (a, b, c) = (x(&[1.0]), x(&[2.0]), x(&[3.0]));
    let tape = Tape::new_ref(true);
    tape.lock().unwrap().watch(&a).unwrap();
    tape.lock().unwrap().watch(&c).unwrap();
    let y = record(&tape, &reg, |ctx| build::mul(ctx, &a, &b));
    assert!(grad(&tape, &y, &b).unwrap().is_none(), "b is not watched");
    assert!(grad(&tape, &y, &c).unwrap().is_none(), "c does not reach y");
    assert_eq!(
        grad(&tape, &y, &a).unwrap().unwrap().to_f64_vec(),
        vec![2.0]
    );
}

#[test]
fn integer_values_cannot_be_watched() {
    let t = Tensor::from_vec(vec![1i32], &[1]).unwrap();
    let err = Tape::<Tensor>::new(false).watch(&t).unwrap_err();
    assert_eq!(err.kind, crate::ErrorKind::Gradient);
    assert!(err.message.contains("int32"));
}

#[test]
fn stop_gradient_blocks_and_records_nothing() {
    let reg = registry();
    let a = x(&[1.5]);
    let tape = Tape::new_ref(false);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| {
        let s = build::stop_gradient(ctx, &a)?;
        build::mul(ctx, &s, &s)
    });
    assert_eq!(tape.lock().unwrap().len(), 0);
    assert!(grad(&tape, &y, &a).unwrap().is_none());
}

#[test]
fn nested_tapes_give_third_derivatives() {
    // f = x^4 (as x*x*x*x): f''' = 24 x.
    let reg = registry();
    let a = x(&[0.7]);
    let (t1, t2, t3) = (
        Tape::new_ref(false),
        Tape::new_ref(false),
        Tape::new_ref(false),
    );
    for t in [&t1, &t2, &t3] {
        t.lock().unwrap().watch(&a).unwrap();
    }
    let mut eager = EagerContext;
    let all = [t1.clone(), t2.clone(), t3.clone()];
    let y = {
        let mut ctx = TapeContext {
            inner: &mut eager,
            tapes: &all,
            registry: &reg,
        };
        let x2 = build::mul(&mut ctx, &a, &a).unwrap();
        build::mul(&mut ctx, &x2, &x2).unwrap()
    };
    // Each gradient is computed under the tapes that are still "outside" it.
    let outer2 = [t1.clone(), t2.clone()];
    let mut ctx2 = TapeContext {
        inner: &mut eager,
        tapes: &outer2,
        registry: &reg,
    };
    let g1 = compute_gradient(&t3, &mut ctx2, &[y], std::slice::from_ref(&a), None)
        .unwrap()
        .remove(0)
        .unwrap();
    let mut eager = EagerContext;
    let outer1 = [t1.clone()];
    let mut ctx1 = TapeContext {
        inner: &mut eager,
        tapes: &outer1,
        registry: &reg,
    };
    let g2 = compute_gradient(
        &t2,
        &mut ctx1,
        std::slice::from_ref(&g1),
        std::slice::from_ref(&a),
        None,
    )
    .unwrap()
    .remove(0)
    .unwrap();
    let g3 = grad(&t1, &g2, &a).unwrap().unwrap();
    let v = 0.7f64;
    assert!((g1.to_f64_vec()[0] - 4.0 * v.powi(3)).abs() < 1e-12);
    assert!((g2.to_f64_vec()[0] - 12.0 * v * v).abs() < 1e-12);
    assert!((g3.to_f64_vec()[0] - 24.0 * v).abs() < 1e-12);
}

#[test]
fn output_gradients_seed_the_backward_pass_and_are_checked() {
    let reg = registry();
    let a = x(&[1.0, 2.0]);
    let tape = Tape::new_ref(true);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| build::mul(ctx, &a, &a));
    let seed = x(&[10.0, 100.0]);
    let g = compute_gradient(
        &tape,
        &mut EagerContext,
        std::slice::from_ref(&y),
        std::slice::from_ref(&a),
        Some(&[Some(seed)]),
    )
    .unwrap();
    assert_eq!(g[0].as_ref().unwrap().to_f64_vec(), vec![20.0, 400.0]);
    let bad = x(&[1.0]);
    let err =
        compute_gradient(&tape, &mut EagerContext, &[y], &[a], Some(&[Some(bad)])).unwrap_err();
    assert_eq!(err.kind, crate::ErrorKind::Shape);
}

#[test]
fn a_value_used_twice_accumulates_its_gradient() {
    // y = x*x + x: dy/dx = 2x + 1
    let reg = registry();
    let a = x(&[3.0]);
    let tape = Tape::new_ref(false);
    tape.lock().unwrap().watch(&a).unwrap();
    let y = record(&tape, &reg, |ctx| {
        let sq = build::mul(ctx, &a, &a)?;
        build::add(ctx, &sq, &a)
    });
    assert_eq!(
        grad(&tape, &y, &a).unwrap().unwrap().to_f64_vec(),
        vec![7.0]
    );
}
