//! Unary elementwise ops. Each `unary_op!` block is the whole op: name, accepted dtypes,
//! kernel, what the gradient saves and the gradient rule.
//!
//! Output shape and dtype equal the input's. Gradients (y = f(x), g = dL/dy):
//!
//! ```text
//! neg -g; exp g*y; log g/x; sin g*cos x; cos -g*sin x; tanh g*(1-y^2); sigmoid g*y*(1-y);
//! relu relu_grad(x, g) (g where x > 0); sqrt g/(2y); abs g*sign x; sign, floor, ceil, round 0; logical_not none.
//! ```
//!
//! MLIR: the StableHLO op of the same meaning (`stablehlo.sine`, `stablehlo.logistic` for
//! sigmoid, `stablehlo.not` for logical_not); relu is `stablehlo.maximum` with zero.

use super::attrs::op_attrs;
use super::kernels::Arith;
use super::lanes::{Fun, LaneElement, LaneMap};

use super::rules::{check_dtype, Accepts};
use super::{
    build, dest, expect_arity, kernels, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents,
    Types, Values,
};
use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue, ScalarForm};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;

pub(super) fn kernel_dtype_bug(op: &'static str, dtype: DType) -> Error {
    Error::internal(
        op,
        format!("kernel called with {dtype} (rule should have rejected it)"),
    )
}

macro_rules! unary_op {
    (
        $(#[$doc:meta])*
        $name:ident, $opname:literal, $builder:ident, $accepts:ident,
        kernel: |$x:ident: $T:ident| $kernel:expr,
        $(lanes: $fun:ident,)?
        saves: $saves:expr,
        grad: |$ctx:ident, $saved:ident, $g:ident| $grad:expr,
        mlir: |$e:ident, $mx:ident| $emit:expr
        $(, scalar: |$sd:ident| $scalar:expr)?
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub struct $name;
        op_attrs!($name = $opname {});

        impl OpDef for $name {

            fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
                expect_arity($opname, inputs, 1)?;
                check_dtype($opname, Accepts::$accepts, &inputs[0])?;
                Ok(smallvec::smallvec![inputs[0].clone()])
            }

            fn compute(&self, inputs: &[Tensor], _outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let input = &inputs[0];
                let out = unary_op!(@compute [$($fun)?] $accepts, input, $opname, |$x: $T| $kernel)?;
                Ok(smallvec::smallvec![out])
            }

            fn compute_owned(&self, inputs: &mut Vec<Tensor>, outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let out = &outputs[0];
                let written: Option<Tensor> =
                    unary_op!(@compute_into [$($fun)?] $accepts, inputs, out, |$x: $T| $kernel);
                match written {
                    Some(t) => Ok(smallvec::smallvec![t]),
                    None => self.compute(inputs, outputs),
                }
            }

            fn kernel_into(&self, _inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
                unary_op!(@dest [$($fun)?] $accepts, outputs[0].dtype, |$x: $T| $kernel)
            }

            fn saves(&self) -> Saves {
                $saves
            }

            fn emit(&self, $e: &mut Emitter, inputs: &[MlirValue], _outputs: &[TensorType]) -> Result<Values<MlirValue>> {
                let $mx = &inputs[0];
                let y: Result<MlirValue> = $emit;
                Ok(smallvec::smallvec![y?])
            }

            $(fn scalar(&self, $sd: DType) -> Option<ScalarForm> {
                $scalar
            })?

            $(fn lane_map(&self, dtype: DType) -> Option<LaneMap> {
                crate::with_float!(dtype, $T, { Some(<$T as LaneElement>::lane_map(Fun::$fun, |$x: $T| $kernel)) }, None)
            })?

            #[allow(unused_variables)]
            fn gradient<V: Value>(
                &self,
                $ctx: &mut dyn Context<V>,
                $saved: &Saved<V>,
                grads: &[Option<V>],
                needs: &[bool],
            ) -> Result<Grads<V>> {
                let Some($g) = grads[0].as_ref() else {
                    return Ok(smallvec::smallvec![None]);
                };
                let gx: Result<Option<V>> = $grad;
                Ok(smallvec::smallvec![gx?])
            }

            /// The Jacobian of an elementwise op is diagonal, so its tangent `f'(x) t` is the
            /// gradient rule's `g f'(x)` at `g = t`: one derivative formula serves both modes.
            fn tangent<V: Value>(
                &self,
                ctx: &mut dyn Context<V>,
                inputs: &[V],
                outputs: &[V],
                tangents: &[Option<V>],
            ) -> Result<Tangents<V>> {
                if matches!(self.saves(), Saves::NotDifferentiable(_)) || !outputs[0].ty().dtype.is_float() {
                    return tangents::none(outputs);
                }
                let saved = Saved::capture(self.saves(), inputs, outputs);
                Ok(smallvec::smallvec![self.gradient(ctx, &saved, tangents, &[true])?.swap_remove(0)])
            }

            fn batch<V: Value>(&self, ctx: &mut dyn Context<V>, inputs: &[V], _batched: &[bool]) -> Result<Values<V>> {
                $crate::ops::batching::pointwise(ctx, *self, inputs)
            }
        }

        #[doc = concat!("`", $opname, "(x)` elementwise.")]
        pub fn $builder<V: Value>(ctx: &mut dyn Context<V>, x: &V) -> Result<V> {
            build::apply1(ctx, $name, std::slice::from_ref(x))
        }
    };
    (@compute [] $accepts:ident, $input:ident, $opname:literal, |$x:ident: $T:ident| $kernel:expr) => {
        unary_op!(@dispatch $accepts, $input, $opname, |$x: $T| $kernel)
    };
    (@compute [$fun:ident] Float, $input:ident, $opname:literal, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($input.dtype(), $T, { kernels::map_lanes::<$T>($input, Fun::$fun, |$x: $T| $kernel) },
            Err(kernel_dtype_bug($opname, $input.dtype())))
    };
    (@compute_into [] $accepts:ident, $inputs:ident, $out:ident, |$x:ident: $T:ident| $kernel:expr) => {
        unary_op!(@into $accepts, $inputs, $out, |$x: $T| $kernel)
    };
    (@compute_into [$fun:ident] Float, $inputs:ident, $out:ident, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, $T, { kernels::map_lanes_into::<$T>($inputs, $out, Fun::$fun, |$x: $T| $kernel) }, None)
    };
    (@dest [] Float, $dtype:expr, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($dtype, $T, { Some(dest::map_to::<$T, $T>(|$x: $T| $kernel)) }, None)
    };
    (@dest [] Numeric, $dtype:expr, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_numeric!($dtype, $T, { Some(dest::map_to::<$T, $T>(|$x: $T| $kernel)) }, None)
    };
    (@dest [] Bool, $dtype:expr, |$x:ident: $T:ident| $kernel:expr) => {
        match $dtype {
            DType::Bool => {
                type $T = bool;
                Some(dest::map_to::<$T, $T>(|$x: $T| $kernel))
            }
            _ => None,
        }
    };
    (@dest [$fun:ident] Float, $dtype:expr, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($dtype, $T, { Some(dest::lanes_to::<$T>(Fun::$fun, |$x: $T| $kernel)) }, None)
    };
    (@dispatch Float, $input:ident, $opname:literal, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($input.dtype(), $T, { kernels::map::<$T, $T>($input, |$x: $T| $kernel) },
            Err(kernel_dtype_bug($opname, $input.dtype())))
    };
    (@into Float, $inputs:ident, $out:ident, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, $T, { kernels::map_into::<$T>($inputs, $out, |$x: $T| $kernel) }, None)
    };
    (@into Numeric, $inputs:ident, $out:ident, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_numeric!($out.dtype, $T, { kernels::map_into::<$T>($inputs, $out, |$x: $T| $kernel) }, None)
    };
    (@into Bool, $inputs:ident, $out:ident, |$x:ident: $T:ident| $kernel:expr) => {
        match $out.dtype {
            DType::Bool => {
                type $T = bool;
                kernels::map_into::<$T>($inputs, $out, |$x: $T| $kernel)
            }
            _ => None,
        }
    };
    (@dispatch Numeric, $input:ident, $opname:literal, |$x:ident: $T:ident| $kernel:expr) => {
        crate::with_numeric!($input.dtype(), $T, { kernels::map::<$T, $T>($input, |$x: $T| $kernel) },
            Err(kernel_dtype_bug($opname, $input.dtype())))
    };
    (@dispatch Bool, $input:ident, $opname:literal, |$x:ident: $T:ident| $kernel:expr) => {
        match $input.dtype() {
            DType::Bool => {
                type $T = bool;
                kernels::map::<$T, $T>($input, |$x: $T| $kernel)
            }
            other => Err(kernel_dtype_bug($opname, other)),
        }
    };
}

/// For the other files of elementwise ops (`unary_math`).
pub(super) use unary_op;

unary_op! {
    /// Negation.
    Neg, "neg", neg, Numeric,
    kernel: |x: T| x.wneg(),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g| Ok(Some(neg(ctx, g)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.negate", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "arith.negf")
}

unary_op! {
    /// e^x.
    Exp, "exp", exp, Float,
    kernel: |x: T| x.exp(),
    lanes: Exp,
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| Ok(Some(build::mul(ctx, g, saved.output(0)?)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.exponential", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.exp")
}

unary_op! {
    /// Natural logarithm.
    Log, "log", log, Float,
    kernel: |x: T| x.ln(),
    lanes: Log,
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| Ok(Some(build::div(ctx, g, saved.input(0)?)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.log", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.log")
}

unary_op! {
    /// Sine.
    Sin, "sin", sin, Float,
    kernel: |x: T| x.sin(),
    lanes: Sin,
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let c = cos(ctx, saved.input(0)?)?;
        Ok(Some(build::mul(ctx, g, &c)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.sine", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.sin")
}

unary_op! {
    /// Cosine.
    Cos, "cos", cos, Float,
    kernel: |x: T| x.cos(),
    lanes: Cos,
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let s = sin(ctx, saved.input(0)?)?;
        let gs = build::mul(ctx, g, &s)?;
        Ok(Some(neg(ctx, &gs)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.cosine", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.cos")
}

unary_op! {
    /// Hyperbolic tangent.
    Tanh, "tanh", tanh, Float,
    kernel: |x: T| x.tanh(),
    lanes: Tanh,
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| {
        let y = saved.output(0)?;
        let yy = build::mul(ctx, y, y)?;
        let one = build::ones_like(ctx, y)?;
        let d = build::sub(ctx, &one, &yy)?;
        Ok(Some(build::mul(ctx, g, &d)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.tanh", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.tanh")
}

unary_op! {
    /// Logistic sigmoid 1/(1+e^-x), computed without overflow for large |x|.
    Sigmoid, "sigmoid", sigmoid, Float,
    kernel: |x: T| {
        if x >= T::zero() {
            T::one() / (T::one() + (-x).exp())
        } else {
            let e = x.exp();
            e / (T::one() + e)
        }
    },
    lanes: Sigmoid,
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| {
        let y = saved.output(0)?;
        let one = build::ones_like(ctx, y)?;
        let d = build::sub(ctx, &one, y)?;
        let yd = build::mul(ctx, y, &d)?;
        Ok(Some(build::mul(ctx, g, &yd)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.logistic", &[x], &x.ty))
}

unary_op! {
    /// max(x, 0) (NaN stays NaN, as numpy's maximum).
    Relu, "relu", relu, Numeric,
    kernel: |x: T| if x > T::zero() || kernels::is_nan(x) { x } else { T::zero() },
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        Ok(Some(build::relu_grad(ctx, saved.input(0)?, g)?))
    },
    mlir: |e, x| {
        let zero = e.splat_like(x, 0.0)?;
        Ok(e.elementwise("stablehlo.maximum", &[x, &zero], &x.ty))
    }
}

unary_op! {
    /// Square root.
    Sqrt, "sqrt", sqrt, Float,
    kernel: |x: T| x.sqrt(),
    saves: Saves::OUTPUT,
    grad: |ctx, saved, g| {
        let y = saved.output(0)?;
        let two_y = build::add(ctx, y, y)?;
        Ok(Some(build::div(ctx, g, &two_y)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.sqrt", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.sqrt")
}

unary_op! {
    /// Absolute value.
    Abs, "abs", abs, Numeric,
    kernel: |x: T| x.wabs(),
    saves: Saves::inputs(1),
    grad: |ctx, saved, g| {
        let s = sign(ctx, saved.input(0)?)?;
        Ok(Some(build::mul(ctx, g, &s)?))
    },
    mlir: |e, x| Ok(e.elementwise("stablehlo.abs", &[x], &x.ty)),
    scalar: |d| ScalarForm::arith(d, "math.absf", "math.absi")
}

unary_op! {
    /// -1, 0 or 1 (0 for 0 and NaN-free inputs; its gradient is zero everywhere).
    Sign, "sign", sign, Numeric,
    kernel: |x: T| if x == T::zero() { x } else if x > T::zero() { T::one() } else { T::one().wneg() },
    saves: Saves::NOTHING,
    grad: |ctx, saved, g| Ok(Some(build::zeros_like(ctx, g)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.sign", &[x], &x.ty))
}

unary_op! {
    /// The largest integer not above `x` (NaN and infinities as they are). Its gradient is
    /// zero, as it is almost everywhere.
    Floor, "floor", floor, Float,
    kernel: |x: T| x.floor(),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g| Ok(Some(build::zeros_like(ctx, g)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.floor", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.floor")
}

unary_op! {
    /// The smallest integer not below `x`; zero gradient.
    Ceil, "ceil", ceil, Float,
    kernel: |x: T| x.ceil(),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g| Ok(Some(build::zeros_like(ctx, g)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.ceil", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.ceil")
}

unary_op! {
    /// The nearest integer, halves to even (numpy's `round`); zero gradient.
    Round, "round", round, Float,
    kernel: |x: T| x.round_ties_even(),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g| Ok(Some(build::zeros_like(ctx, g)?)),
    mlir: |e, x| Ok(e.elementwise("stablehlo.round_nearest_even", &[x], &x.ty)),
    scalar: |d| ScalarForm::float(d, "math.roundeven")
}

unary_op! {
    /// Logical negation of a bool tensor.
    LogicalNot, "logical_not", logical_not, Bool,
    kernel: |x: T| !x,
    saves: Saves::NotDifferentiable("its output is bool"),
    grad: |ctx, saved, g| Err(Error::gradient("logical_not", "logical_not is not differentiable")),
    mlir: |e, x| Ok(e.elementwise("stablehlo.not", &[x], &x.ty)),
    scalar: |d| (d == DType::Bool).then_some(ScalarForm::Not)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::EagerContext;

    fn t(v: Vec<f64>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, &[n]).unwrap()
    }

    #[test]
    fn kernels_match_std() {
        let x = t(vec![-1.5, 0.0, 0.25, 2.0]);
        let mut ctx = EagerContext;
        // vectorised (ops/lanes.rs): within a few ulp of libm, not bit for bit
        let got = sin(&mut ctx, &x).unwrap().to_f64_vec();
        for (g, v) in got.iter().zip(x.to_f64_vec()) {
            assert!(
                (g - v.sin()).abs() <= 4.0 * f64::EPSILON * v.sin().abs(),
                "{g} vs {}",
                v.sin()
            );
        }
        assert_eq!(
            relu(&mut ctx, &x).unwrap().to_f64_vec(),
            vec![0.0, 0.0, 0.25, 2.0]
        );
        assert_eq!(
            sign(&mut ctx, &x).unwrap().to_f64_vec(),
            vec![-1.0, 0.0, 1.0, 1.0]
        );
        let y = sigmoid(&mut ctx, &t(vec![-800.0, 800.0]))
            .unwrap()
            .to_f64_vec();
        assert_eq!(y, vec![0.0, 1.0]);
    }

    #[test]
    fn float_only_ops_reject_ints_with_the_op_name() {
        let x = Tensor::from_vec(vec![1i32, 2], &[2]).unwrap();
        let err = exp(&mut EagerContext, &x).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::DType);
        assert!(err.to_string().starts_with("exp:"), "{err}");
        assert!(err.to_string().contains("int32"), "{err}");
        assert_eq!(
            neg(&mut EagerContext, &x).unwrap().to_f64_vec(),
            vec![-1.0, -2.0]
        );
    }
}
