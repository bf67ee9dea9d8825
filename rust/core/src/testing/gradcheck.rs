//! Test helper: tape gradients checked against central finite differences in float64, at first
//! and second order.
//!
//! A case is a closure that builds a scalar loss from float64 inputs through a `Context`. The
//! same closure then runs eagerly (finite differences), under a tape (first order), and under a
//! tape nested inside another (second order) — which exercises the claim that gradient rules,
//! being built from ops, are themselves differentiable. Anything that must not be
//! differentiated (integer indices, constants) is captured by the closure, not passed as input.
//!
//! ```ignore
//! // a scalar loss of your own:
//! gradcheck::check_gradients(&|ctx, xs| {
//!     let y = build::transpose(ctx, &xs[0], &[1, 0])?;
//!     gradcheck::smooth_loss(ctx, &y)
//! }, &[gradcheck::ramp(&[2, 3])]);
//! // or any op's output, reduced by `smooth_loss`:
//! gradcheck::check_op_gradients(&|ctx, xs| build::transpose(ctx, &xs[0], &[1, 0]), &[x]);
//! ```

use crate::error::{Error, Result};
use crate::ops::build;
use crate::ops::{Context, EagerContext};
use crate::tape::{compute_gradient, GradientRegistry, Tape, TapeContext, TapeRef};
use crate::tensor::Tensor;

/// A value built through a context from float64 inputs (a scalar where a loss is expected).
pub(crate) type LossFn<'a> = dyn Fn(&mut dyn Context<Tensor>, &[Tensor]) -> Result<Tensor> + 'a;

/// How closely tape and finite-difference gradients must agree.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tolerance {
    /// Finite-difference step.
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        // Central differences in f64 with eps 1e-6 are accurate to ~1e-9 for smooth losses of
        // moderate size; these bounds leave room for a few accumulated roundings.
        Tolerance {
            eps: 1e-6,
            atol: 1e-6,
            rtol: 1e-5,
        }
    }
}

/// Deterministic, non-trivial float64 values of `shape` (distinct, mixed signs, no ties).
pub(crate) fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|k| 0.3 + 0.17 * k as f64 - 0.011 * (k * k) as f64)
        .collect();
    Tensor::from_vec::<f64>(data, shape).unwrap()
}

/// `0, 1, 2, ...` as float64 of `shape`: forward tests read positions straight off the values.
pub(crate) fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|v| v as f64).collect::<Vec<_>>(), shape).unwrap()
}

/// Asserts that `r` failed with `kind`, that the message starts with `op:` and that it
/// mentions each of `needles`.
pub(crate) fn expect_error<T: std::fmt::Debug>(
    r: Result<T>,
    kind: crate::ErrorKind,
    op: &str,
    needles: &[&str],
) {
    let err = r.expect_err("expected an error");
    let text = err.to_string();
    assert_eq!(err.kind, kind, "{text}");
    assert!(
        text.starts_with(&format!("{op}:")),
        "{text} should start with {op}:"
    );
    for n in needles {
        assert!(text.contains(n), "{text} should mention {n}");
    }
}

/// `sum(sin(y) * w)` with fixed weights `w`: a scalar whose first and second derivatives with
/// respect to every element of `y` are nonzero and different, so mixed-up elements show.
pub(crate) fn smooth_loss(ctx: &mut dyn Context<Tensor>, y: &Tensor) -> Result<Tensor> {
    let w = weights(y.shape());
    let s = build::sin(ctx, y)?;
    let p = build::mul(ctx, &s, &w)?;
    let axes: Vec<usize> = (0..y.ndim()).collect();
    build::sum(ctx, &p, &axes, false)
}

fn weights(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|k| 1.5 + (0.7 * k as f64).cos()).collect();
    Tensor::from_vec::<f64>(data, shape).unwrap()
}

/// Gradients of `f` at `inputs` from a tape whose forward and backward ops run through
/// `outer`: when `outer` records on tapes of its own, they see the whole gradient computation.
/// Unconnected inputs get zeros.
pub(crate) fn tape_gradients(
    outer: &mut dyn Context<Tensor>,
    f: &LossFn<'_>,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>> {
    let registry = GradientRegistry::<Tensor>::with_op_table();
    let tape: TapeRef<Tensor> = Tape::new_ref(false);
    {
        let mut t = tape
            .lock()
            .map_err(|e| Error::internal("gradcheck", e.to_string()))?;
        for x in inputs {
            t.watch(x)?;
        }
    }
    let tapes = [tape.clone()];
    let loss = {
        let mut ctx = TapeContext {
            inner: &mut *outer,
            tapes: &tapes,
            registry: &registry,
        };
        f(&mut ctx, inputs)?
    };
    if loss.numel() != 1 {
        return Err(Error::invalid(
            "gradcheck",
            format!("the loss must be a scalar, got {}", loss.ty()),
        ));
    }
    let grads = compute_gradient(&tape, outer, &[loss], inputs, None)?;
    grads
        .into_iter()
        .zip(inputs)
        .map(|(g, x)| match g {
            Some(g) => Ok(g),
            None => build::zeros_like(outer, x),
        })
        .collect()
}

/// Central differences of `f` (run eagerly) for every element of every input.
pub(crate) fn numeric_gradients(
    f: &LossFn<'_>,
    inputs: &[Tensor],
    eps: f64,
) -> Result<Vec<Vec<f64>>> {
    let eval = |xs: &[Tensor]| -> Result<f64> { f(&mut EagerContext, xs)?.item_f64() };
    let mut out = Vec::with_capacity(inputs.len());
    for i in 0..inputs.len() {
        let base = inputs[i].as_slice::<f64>()?.to_vec();
        let mut grad = Vec::with_capacity(base.len());
        for k in 0..base.len() {
            let shifted = |delta: f64| -> Result<f64> {
                let mut data = base.clone();
                data[k] += delta;
                let mut xs = inputs.to_vec();
                xs[i] = Tensor::from_vec(data, inputs[i].shape())?;
                eval(&xs)
            };
            grad.push((shifted(eps)? - shifted(-eps)?) / (2.0 * eps));
        }
        out.push(grad);
    }
    Ok(out)
}

/// Panics (with the input, element and both values) where tape and numeric gradients differ.
pub(crate) fn check_first_order_with(
    f: &LossFn<'_>,
    inputs: &[Tensor],
    tol: Tolerance,
    what: &str,
) {
    let tape = tape_gradients(&mut EagerContext, f, inputs)
        .unwrap_or_else(|e| panic!("{what}: tape gradient failed: {e}"));
    let numeric = numeric_gradients(f, inputs, tol.eps)
        .unwrap_or_else(|e| panic!("{what}: finite differences failed: {e}"));
    for (i, (t, n)) in tape.iter().zip(&numeric).enumerate() {
        assert_eq!(
            t.shape(),
            inputs[i].shape(),
            "{what}: gradient {i} has the wrong shape"
        );
        for (k, (&a, &b)) in t.to_f64_vec().iter().zip(n).enumerate() {
            let bound = tol.atol + tol.rtol * a.abs().max(b.abs());
            assert!(
                (a - b).abs() <= bound,
                "{what}: d loss / d input{i}[{k}]: tape {a}, finite differences {b}"
            );
        }
    }
}

/// First-order check with the default tolerance.
pub(crate) fn check_first_order(f: &LossFn<'_>, inputs: &[Tensor]) {
    check_first_order_with(f, inputs, Tolerance::default(), "first order");
}

/// Second-order check: `h(x) = sum_i <v_i, grad_i f(x)>` (a Hessian-vector product with fixed
/// `v_i`) is built by an inner tape whose backward pass an outer tape records; the outer tape's
/// gradient of `h` is then checked against finite differences of `h`.
pub(crate) fn check_second_order(f: &LossFn<'_>, inputs: &[Tensor]) {
    let vs: Vec<Tensor> = inputs.iter().map(|x| weights(x.shape())).collect();
    let h = |ctx: &mut dyn Context<Tensor>, xs: &[Tensor]| -> Result<Tensor> {
        let grads = tape_gradients(ctx, f, xs)?;
        let mut total = build::scalar(ctx, crate::DType::F64, 0.0)?;
        for (g, v) in grads.iter().zip(&vs) {
            let p = build::mul(ctx, g, v)?;
            let axes: Vec<usize> = (0..p.ndim()).collect();
            let s = build::sum(ctx, &p, &axes, false)?;
            total = build::add(ctx, &total, &s)?;
        }
        Ok(total)
    };
    check_first_order_with(&h, inputs, Tolerance::default(), "second order");
}

/// First- and second-order checks.
pub(crate) fn check_gradients(f: &LossFn<'_>, inputs: &[Tensor]) {
    check_first_order(f, inputs);
    check_second_order(f, inputs);
}

/// `check_gradients` of `smooth_loss(f(inputs))`, for `f` with a non-scalar result (an op).
pub(crate) fn check_op_gradients(f: &LossFn<'_>, inputs: &[Tensor]) {
    check_gradients(
        &|ctx, xs| {
            let y = f(ctx, xs)?;
            smooth_loss(ctx, &y)
        },
        inputs,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elementwise_losses_pass_and_a_wrong_rule_would_not() {
        let x = ramp(&[2, 3]);
        check_op_gradients(
            &|ctx, xs| build::mul(ctx, &xs[0], &xs[0]),
            std::slice::from_ref(&x),
        );
        // finite differences of a loss see through stop_gradient; the tape does not.
        let wrong = std::panic::catch_unwind(|| {
            check_first_order(
                &|ctx, xs| {
                    let y = build::stop_gradient(ctx, &xs[0])?;
                    smooth_loss(ctx, &y)
                },
                std::slice::from_ref(&x),
            )
        });
        assert!(wrong.is_err());
    }
}
