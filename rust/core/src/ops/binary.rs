//! Binary elementwise ops with numpy broadcasting, and `select` (where). Both operands must
//! share a dtype (Python scalars adapt before they get here, see `Scalar`).
//!
//! Gradients (z = f(a, b), g = dL/dz), each reduced back to its operand's shape:
//! add (g, g); sub (g, -g); mul (g*b, g*a); div (g/b, -g*a/b^2);
//! pow (g*b*a^(b-1), g*z*log a where a > 0 else 0); maximum/minimum route g to the chosen
//! operand (ties to a); select (-, g where c, g where !c); relu_grad (0, relu_grad(x, g')). Comparisons and logical ops have no
//! gradient: their output is bool.
//!
//! MLIR: operands are first broadcast to the result's shape (`broadcast_in_dim`, made explicit
//! by `Emitter::broadcast_operands`), then one StableHLO op: `add`, `subtract`, `multiply`,
//! `divide`, `power`, `maximum`, `minimum`, `compare` (EQ/NE/LT/LE/GT/GE), `and`, `or`, `select`.

use smallvec::smallvec;

use super::attrs::op_attrs;
use super::batching;
use super::kernels::{self, Arith};
use super::rules::{broadcast_binary, check_dtype, Accepts};
use super::{
    build, dest, expect_arity, tangents, DestKernel, Grads, OpDef, Saved, Saves, Tangents, Types,
    Values,
};
use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue, ScalarForm, TypeText};
use crate::error::{Error, Result};
use crate::ops::Context;
use crate::shape::{broadcast_shapes, TensorType};
use crate::tensor::Tensor;
use crate::value::Value;

pub(super) fn kernel_dtype_bug(op: &'static str, dtype: DType) -> Error {
    Error::internal(
        op,
        format!("kernel called with {dtype} (rule should have rejected it)"),
    )
}

/// `g` reduced to the shape of input `i`, if that input needs a gradient.
pub(super) fn unbroadcast<V: Value>(
    ctx: &mut dyn Context<V>,
    saved: &Saved<V>,
    i: usize,
    g: V,
) -> Result<V> {
    let shape = saved.input_types[i].shape.clone();
    build::sum_to_shape(ctx, &g, &shape)
}

macro_rules! binary_op {
    (
        $(#[$doc:meta])*
        $name:ident, $opname:literal, $builder:ident, $accepts:ident -> $out:ident,
        kernel: |$x:ident, $y:ident| $kernel:expr,
        $(lanes: $lanes:ident,)?
        saves: $saves:expr,
        grad: |$ctx:ident, $saved:ident, $g:ident, $needs:ident| $grad:expr,
        mlir: |$e:ident, $ea:ident, $eb:ident, $eo:ident| $emit:expr
        $(, scalar: |$sd:ident| $scalar:expr)?
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub struct $name;
        op_attrs!($name = $opname {});

        impl OpDef for $name {

            fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
                let out = binary_op!(@outdtype $out);
                Ok(smallvec![broadcast_binary($opname, Accepts::$accepts, inputs, out)?])
            }

            fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let (a, b, shape) = (&inputs[0], &inputs[1], &outputs[0].shape);
                let out = binary_op!(@compute [$($lanes)?] $accepts -> $out, $opname, a, b, shape, |$x, $y| $kernel)?;
                Ok(smallvec![out])
            }

            fn compute_owned(&self, inputs: &mut Vec<Tensor>, outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let out = &outputs[0];
                let written: Option<Tensor> =
                    binary_op!(@compute_into [$($lanes)?] $accepts -> $out, inputs, out, |$x, $y| $kernel);
                match written {
                    Some(t) => Ok(smallvec![t]),
                    None => self.compute(inputs, outputs),
                }
            }

            fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
                let (a, b, out) = (&inputs[0], &inputs[1], &outputs[0]);
                binary_op!(@dest [$($lanes)?] $accepts -> $out, a, b, out, |$x, $y| $kernel)
            }

            fn saves(&self) -> Saves {
                $saves
            }

            fn emit(&self, $e: &mut Emitter, inputs: &[MlirValue], outputs: &[TensorType]) -> Result<Values<MlirValue>> {
                let $eo = &outputs[0];
                let ops = $e.broadcast_operands(inputs, &$eo.shape)?;
                let ($ea, $eb) = (&ops[0], &ops[1]);
                let y: Result<MlirValue> = $emit;
                Ok(smallvec![y?])
            }

            $(fn scalar(&self, $sd: DType) -> Option<ScalarForm> {
                $scalar
            })?

            #[allow(unused_variables)]
            fn gradient<V: Value>(
                &self,
                $ctx: &mut dyn Context<V>,
                $saved: &Saved<V>,
                grads: &[Option<V>],
                $needs: &[bool],
            ) -> Result<Grads<V>> {
                let Some($g) = grads[0].as_ref() else {
                    return Ok(smallvec![None, None]);
                };
                let (ga, gb) = Self::terms($ctx, $saved, $g, $needs)?;
                let ga = match ga { Some(v) => Some(unbroadcast($ctx, $saved, 0, v)?), None => None };
                let gb = match gb { Some(v) => Some(unbroadcast($ctx, $saved, 1, v)?), None => None };
                Ok(smallvec![ga, gb])
            }

            /// Per operand the Jacobian is diagonal (up to broadcasting), so the tangent
            /// `sum_i dz/dx_i t_i` is made of the gradient's terms `g dz/dx_i` at `g = t_i`,
            /// before they are reduced to the operand's shape.
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
                let mut total = None;
                for (i, t) in tangents.iter().enumerate() {
                    let Some(t) = t else { continue };
                    let (ta, tb) = Self::terms(ctx, &saved, t, &[i == 0, i == 1])?;
                    total = tangents::sum_of(ctx, total, if i == 0 { ta } else { tb })?;
                }
                Ok(smallvec![tangents::fit(ctx, total, &outputs[0])?])
            }

            fn batch<V: Value>(&self, ctx: &mut dyn Context<V>, inputs: &[V], batched: &[bool]) -> Result<Values<V>> {
                $crate::ops::batching::broadcasting(ctx, *self, inputs, batched)
            }
        }

        impl $name {
            /// The gradient's terms before reduction: `g dz/da` and `g dz/db` where `needs` asks.
            #[allow(unused_variables)]
            fn terms<V: Value>(
                $ctx: &mut dyn Context<V>,
                $saved: &Saved<V>,
                $g: &V,
                $needs: &[bool],
            ) -> Result<(Option<V>, Option<V>)> {
                Ok($grad)
            }
        }

        #[doc = concat!("`", $opname, "(a, b)` elementwise, with broadcasting.")]
        pub fn $builder<V: Value>(ctx: &mut dyn Context<V>, a: &V, b: &V) -> Result<V> {
            build::apply1(ctx, $name, &[a.clone(), b.clone()])
        }
    };
    (@compute [] $accepts:ident -> $out:ident, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        binary_op!(@dispatch $accepts -> $out, $opname, $a, $b, $shape, |$x, $y| $kernel)
    };
    (@compute [pow] Float -> Same, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($a.dtype(), T, { kernels::pow_lanes::<T>($a, $b, $shape, |$x: T, $y: T| $kernel) },
            Err(kernel_dtype_bug($opname, $a.dtype())))
    };
    (@compute_into [] $accepts:ident -> $out:ident, $inputs:ident, $outty:ident, |$x:ident, $y:ident| $kernel:expr) => {
        binary_op!(@into $accepts -> $out, $inputs, $outty, |$x, $y| $kernel)
    };
    (@compute_into [pow] Float -> Same, $inputs:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, T, { kernels::pow_lanes_into::<T>($inputs, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@dest [pow] Float -> Same, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, T, { dest::pow_to::<T>($a, $b, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@dest [] Float -> Same, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, T, { dest::zip_to::<T, T>($a, $b, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@dest [] Numeric -> Same, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_numeric!($out.dtype, T, { dest::zip_to::<T, T>($a, $b, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@dest [] Numeric -> Bool, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_numeric!($a.dtype, T, { dest::zip_to::<T, bool>($a, $b, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@dest [] Any -> Bool, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_dtype!($a.dtype, T, { dest::zip_to::<T, bool>($a, $b, $out, |$x: T, $y: T| $kernel) })
    };
    (@dest [] Bool -> Bool, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        match $a.dtype {
            DType::Bool => dest::zip_to::<bool, bool>($a, $b, $out, |$x: bool, $y: bool| $kernel),
            _ => None,
        }
    };
    (@outdtype Same) => { None };
    (@into Float -> Same, $inputs:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($out.dtype, T, { kernels::zip_into::<T>($inputs, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@into Numeric -> Same, $inputs:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_numeric!($out.dtype, T, { kernels::zip_into::<T>($inputs, $out, |$x: T, $y: T| $kernel) }, None)
    };
    (@into $accepts:ident -> Bool, $inputs:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {{
        let _ = (&$inputs, $out);
        None
    }};
    (@outdtype Bool) => { Some(DType::Bool) };
    (@dispatch Float -> Same, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_float!($a.dtype(), T, { kernels::zip::<T, T>($a, $b, $shape, |$x: T, $y: T| $kernel) },
            Err(kernel_dtype_bug($opname, $a.dtype())))
    };
    (@dispatch Numeric -> Same, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_numeric!($a.dtype(), T, { kernels::zip::<T, T>($a, $b, $shape, |$x: T, $y: T| $kernel) },
            Err(kernel_dtype_bug($opname, $a.dtype())))
    };
    (@dispatch Numeric -> Bool, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_numeric!($a.dtype(), T, { kernels::zip::<T, bool>($a, $b, $shape, |$x: T, $y: T| $kernel) },
            Err(kernel_dtype_bug($opname, $a.dtype())))
    };
    (@dispatch Any -> Bool, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        crate::with_dtype!($a.dtype(), T, { kernels::zip::<T, bool>($a, $b, $shape, |$x: T, $y: T| $kernel) })
    };
    (@dispatch Integer -> Same, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        match $a.dtype() {
            DType::I32 => kernels::zip::<i32, i32>($a, $b, $shape, |$x: i32, $y: i32| $kernel),
            DType::I64 => kernels::zip::<i64, i64>($a, $b, $shape, |$x: i64, $y: i64| $kernel),
            other => Err(kernel_dtype_bug($opname, other)),
        }
    };
    (@dest [] Integer -> Same, $a:ident, $b:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        match $out.dtype {
            DType::I32 => dest::zip_to::<i32, i32>($a, $b, $out, |$x: i32, $y: i32| $kernel),
            DType::I64 => dest::zip_to::<i64, i64>($a, $b, $out, |$x: i64, $y: i64| $kernel),
            _ => None,
        }
    };
    (@into Integer -> Same, $inputs:ident, $out:ident, |$x:ident, $y:ident| $kernel:expr) => {
        match $out.dtype {
            DType::I32 => kernels::zip_into::<i32>($inputs, $out, |$x: i32, $y: i32| $kernel),
            DType::I64 => kernels::zip_into::<i64>($inputs, $out, |$x: i64, $y: i64| $kernel),
            _ => None,
        }
    };
    (@dispatch Bool -> Bool, $opname:literal, $a:ident, $b:ident, $shape:ident, |$x:ident, $y:ident| $kernel:expr) => {
        match $a.dtype() {
            DType::Bool => kernels::zip::<bool, bool>($a, $b, $shape, |$x: bool, $y: bool| $kernel),
            other => Err(kernel_dtype_bug($opname, other)),
        }
    };
}

/// For the other files of binary elementwise ops (`binary_math`).
pub(super) use binary_op;

binary_op! {
    /// a + b.
    Add, "add", add, Numeric -> Same,
    kernel: |x, y| x.wadd(y),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g, needs| (needs[0].then(|| g.clone()), needs[1].then(|| g.clone())),
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.add", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.addf", "arith.addi")
}

binary_op! {
    /// a - b.
    Sub, "sub", sub, Numeric -> Same,
    kernel: |x, y| x.wsub(y),
    saves: Saves::NOTHING,
    grad: |ctx, saved, g, needs| {
        let gb = if needs[1] { Some(build::neg(ctx, g)?) } else { None };
        (needs[0].then(|| g.clone()), gb)
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.subtract", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.subf", "arith.subi")
}

binary_op! {
    /// a * b.
    Mul, "mul", mul, Numeric -> Same,
    kernel: |x, y| x.wmul(y),
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let ga = if needs[0] { Some(mul(ctx, g, saved.input(1)?)?) } else { None };
        let gb = if needs[1] { Some(mul(ctx, g, saved.input(0)?)?) } else { None };
        (ga, gb)
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.multiply", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.mulf", "arith.muli")
}

binary_op! {
    /// a / b (float only: integer division is not silently truncated or promoted).
    Div, "div", div, Float -> Same,
    kernel: |x, y| x / y,
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let b = saved.input(1)?;
        let ga = div(ctx, g, b)?;
        let gb = if needs[1] {
            let a = saved.input(0)?;
            let t = mul(ctx, &ga, a)?;
            let t = div(ctx, &t, b)?;
            Some(build::neg(ctx, &t)?)
        } else {
            None
        };
        (needs[0].then_some(ga), gb)
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.divide", &[a, b], out)),
    scalar: |d| ScalarForm::float(d, "arith.divf")
}

binary_op! {
    /// a ** b (float only).
    Pow, "pow", pow, Float -> Same,
    kernel: |x, y| x.powf(y),
    lanes: pow,
    saves: Saves::Values { inputs: 0b11, outputs: 1 },
    grad: |ctx, saved, g, needs| {
        let (a, b) = (saved.input(0)?, saved.input(1)?);
        let ga = if needs[0] {
            let one = build::ones_like(ctx, b)?;
            let bm1 = sub(ctx, b, &one)?;
            let p = pow(ctx, a, &bm1)?;
            let d = mul(ctx, b, &p)?;
            Some(mul(ctx, g, &d)?)
        } else {
            None
        };
        let gb = if needs[1] {
            // d/db a^b = a^b log a, defined as 0 where a <= 0 (as TensorFlow does).
            let zero = build::zeros_like(ctx, a)?;
            let positive = greater(ctx, a, &zero)?;
            let ones = build::ones_like(ctx, a)?;
            let safe = select(ctx, &positive, a, &ones)?;
            let log_a = build::log(ctx, &safe)?;
            let log_a = select(ctx, &positive, &log_a, &zero)?;
            let d = mul(ctx, saved.output(0)?, &log_a)?;
            Some(mul(ctx, g, &d)?)
        } else {
            None
        };
        (ga, gb)
    },
    mlir: |e, a, b, out| emit_pow(e, a, b, out),
    scalar: |d| ScalarForm::float(d, "math.powf")
}

/// `a ** b` with the kernel's (C `pow`'s) semantics. IREE lowers `stablehlo.power` with an
/// exponent it cannot see as a constant to `exp(b * log a)`: NaN for every negative base. So the
/// power is taken of `|a|`, negated where `a`'s sign bit is set and `b` is an odd integer, and
/// NaN only where C gives NaN: a finite negative base with a non-integer exponent.
fn emit_pow(e: &mut Emitter, a: &MlirValue, b: &MlirValue, out: &TensorType) -> Result<MlirValue> {
    let ty = TypeText(out).to_string();
    let abs_a = e.elementwise("stablehlo.abs", &[a], out);
    let r = e.elementwise("stablehlo.power", &[&abs_a, b], out);
    let neg_r = e.elementwise("stablehlo.negate", &[&r], out);
    // The sign bit, so that -0.0 counts as negative (pow(-0, -1) = -inf): a < 0, or a == 0
    // with 1 / a = -inf. (Compares, not `bitcast_convert`: a module gradloop writes is one
    // its importer reads back, and it has no bitcast.)
    let zero = e.splat_like(a, 0.0)?;
    let one = e.splat_like(a, 1.0)?;
    let below = e.compare("LT", a, &zero);
    let is_zero = e.compare("EQ", a, &zero);
    let reciprocal = e.elementwise("stablehlo.divide", &[&one, a], out);
    let negative_zero = e.compare("LT", &reciprocal, &zero);
    let negative_zero = e.elementwise(
        "stablehlo.and",
        &[&is_zero, &negative_zero],
        &is_zero.ty.clone(),
    );
    let sign = e.elementwise("stablehlo.or", &[&below, &negative_zero], &below.ty.clone());
    // b is an odd integer: floor(b) == b and floor(b / 2) * 2 != b (false for infinities).
    let floor_b = e.elementwise("stablehlo.floor", &[b], out);
    let integral = e.compare("EQ", &floor_b, b);
    let half = e.splat_like(b, 0.5)?;
    let two = e.splat_like(b, 2.0)?;
    let halved = e.elementwise("stablehlo.multiply", &[b, &half], out);
    let floor_half = e.elementwise("stablehlo.floor", &[&halved], out);
    let even_part = e.elementwise("stablehlo.multiply", &[&floor_half, &two], out);
    let not_even = e.compare("NE", &even_part, b);
    let odd = e.elementwise(
        "stablehlo.and",
        &[&integral, &not_even],
        &integral.ty.clone(),
    );
    let flip = e.elementwise("stablehlo.and", &[&sign, &odd], &odd.ty.clone());
    let bool_ty = TypeText(&odd.ty).to_string();
    let signed = e.op(
        &format!("stablehlo.select {flip}, {neg_r}, {r} : ({bool_ty}, {ty}, {ty}) -> {ty}"),
        out,
    );
    // NaN for a finite negative base and a non-integer exponent.
    let neg_inf = e.splat_like(a, f64::NEG_INFINITY)?;
    let finite = e.compare("GT", a, &neg_inf);
    let fractional = e.elementwise("stablehlo.not", &[&integral], &integral.ty.clone());
    let undefined = e.elementwise("stablehlo.and", &[&below, &finite], &odd.ty.clone());
    let undefined = e.elementwise("stablehlo.and", &[&undefined, &fractional], &odd.ty.clone());
    let nan = e.splat_like(a, f64::NAN)?;
    let defined = e.op(
        &format!("stablehlo.select {undefined}, {nan}, {signed} : ({bool_ty}, {ty}, {ty}) -> {ty}"),
        out,
    );
    // 1 where C's pow is 1 and exp(b log|a|) is NaN: b = 0, a = 1, and |a| = 1 with |b| = inf.
    let inf = e.splat_like(a, f64::INFINITY)?;
    let b_zero = e.compare("EQ", b, &zero);
    let a_one = e.compare("EQ", a, &one);
    let abs_b = e.elementwise("stablehlo.abs", &[b], out);
    let unit = e.compare("EQ", &abs_a, &one);
    let b_inf = e.compare("EQ", &abs_b, &inf);
    let unit_inf = e.elementwise("stablehlo.and", &[&unit, &b_inf], &odd.ty.clone());
    let ones = e.elementwise("stablehlo.or", &[&b_zero, &a_one], &odd.ty.clone());
    let ones = e.elementwise("stablehlo.or", &[&ones, &unit_inf], &odd.ty.clone());
    Ok(e.op(
        &format!("stablehlo.select {ones}, {one}, {defined} : ({bool_ty}, {ty}, {ty}) -> {ty}"),
        out,
    ))
}

binary_op! {
    /// Elementwise maximum (NaN-propagating as numpy's).
    Maximum, "maximum", maximum, Numeric -> Same,
    kernel: |x, y| if x >= y || kernels::is_nan(x) { x } else { y },
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let mask = greater_equal(ctx, saved.input(0)?, saved.input(1)?)?;
        route(ctx, &mask, g, needs)?
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.maximum", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.maximumf", "arith.maxsi")
}

binary_op! {
    /// Elementwise minimum (NaN-propagating as numpy's).
    Minimum, "minimum", minimum, Numeric -> Same,
    kernel: |x, y| if x <= y || kernels::is_nan(x) { x } else { y },
    saves: Saves::INPUTS,
    grad: |ctx, saved, g, needs| {
        let mask = less_equal(ctx, saved.input(0)?, saved.input(1)?)?;
        route(ctx, &mask, g, needs)?
    },
    mlir: |e, a, b, out| Ok(e.elementwise("stablehlo.minimum", &[a, b], out)),
    scalar: |d| ScalarForm::arith(d, "arith.minimumf", "arith.minsi")
}

binary_op! {
    /// ReLU's gradient: `g` where `x > 0`, else 0 (`relu_grad(x, g)`), one pass that writes into
    /// `g`'s buffer when it is free, where `select(x > 0, g, zeros)` made three temporaries
    /// (TensorFlow's `ReluGrad`, PyTorch's `threshold_backward`). Linear in `g`, so its own
    /// gradient is itself; constant in `x`.
    ReluGrad, "relu_grad", relu_grad, Numeric -> Same,
    kernel: |x, g| if x > T::zero() { g } else { T::zero() },
    saves: Saves::inputs(1),
    grad: |ctx, saved, g, needs| {
        let ga = if needs[0] { Some(build::zeros_like(ctx, g)?) } else { None };
        let gb = if needs[1] { Some(relu_grad(ctx, saved.input(0)?, g)?) } else { None };
        (ga, gb)
    },
    mlir: |e, x, g, out| {
        let zero = e.splat_like(x, 0.0)?;
        let positive = e.compare("GT", x, &zero);
        let zeros = e.splat_like(g, 0.0)?;
        let body = format!(
            "stablehlo.select {positive}, {g}, {zeros} : {}, {}",
            TypeText(&positive.ty),
            TypeText(out)
        );
        Ok(e.op(&body, out))
    }
}

/// Sends `g` to a where `mask`, to b elsewhere (broadcast to the output's shape).
fn route<V: Value>(
    ctx: &mut dyn Context<V>,
    mask: &V,
    g: &V,
    needs: &[bool],
) -> Result<(Option<V>, Option<V>)> {
    let zero = build::zeros_like(ctx, g)?;
    let ga = if needs[0] {
        Some(select(ctx, mask, g, &zero)?)
    } else {
        None
    };
    let gb = if needs[1] {
        Some(select(ctx, mask, &zero, g)?)
    } else {
        None
    };
    Ok((ga, gb))
}

macro_rules! comparison_op {
    ($($name:ident, $opname:literal, $builder:ident, $accepts:ident, |$x:ident, $y:ident| $kernel:expr, mlir: $mlir:ident $what:literal, scalar: |$sd:ident| $scalar:expr;)*) => {$(
        binary_op! {
            #[doc = concat!("Elementwise `", $opname, "`; the result is bool.")]
            $name, $opname, $builder, $accepts -> Bool,
            kernel: |$x, $y| $kernel,
            saves: Saves::NotDifferentiable("its output is bool"),
            grad: |ctx, saved, g, needs| (None, None),
            mlir: |e, a, b, out| comparison_op!(@emit $mlir, $what, e, a, b, out),
            scalar: |$sd| $scalar
        }
    )*};
    (@emit compare, $direction:literal, $e:ident, $a:ident, $b:ident, $out:ident) => { Ok($e.compare($direction, $a, $b)) };
    (@emit logical, $op:literal, $e:ident, $a:ident, $b:ident, $out:ident) => { Ok($e.elementwise($op, &[$a, $b], $out)) };
}

comparison_op! {
    Equal, "equal", equal, Any, |x, y| x == y, mlir: compare "EQ",
        scalar: |d| ScalarForm::compare(d, "oeq", "eq");
    NotEqual, "not_equal", not_equal, Any, |x, y| x != y, mlir: compare "NE",
        scalar: |d| ScalarForm::compare(d, "une", "ne");
    Less, "less", less, Numeric, |x, y| x < y, mlir: compare "LT",
        scalar: |d| ScalarForm::order(d, "olt", "slt");
    LessEqual, "less_equal", less_equal, Numeric, |x, y| x <= y, mlir: compare "LE",
        scalar: |d| ScalarForm::order(d, "ole", "sle");
    Greater, "greater", greater, Numeric, |x, y| x > y, mlir: compare "GT",
        scalar: |d| ScalarForm::order(d, "ogt", "sgt");
    GreaterEqual, "greater_equal", greater_equal, Numeric, |x, y| x >= y, mlir: compare "GE",
        scalar: |d| ScalarForm::order(d, "oge", "sge");
    LogicalAnd, "logical_and", logical_and, Bool, |x, y| x && y, mlir: logical "stablehlo.and",
        scalar: |d| ScalarForm::logical(d, "arith.andi");
    LogicalOr, "logical_or", logical_or, Bool, |x, y| x || y, mlir: logical "stablehlo.or",
        scalar: |d| ScalarForm::logical(d, "arith.ori");
}

macro_rules! bitwise_op {
    ($($name:ident, $opname:literal, $builder:ident, |$x:ident, $y:ident| $kernel:expr, $mlir:literal;)*) => {$(
        binary_op! {
            #[doc = concat!("Elementwise `", $opname, "` of integers (numpy's; StableHLO's `", $mlir, "` on integers).")]
            $name, $opname, $builder, Integer -> Same,
            kernel: |$x, $y| $kernel,
            saves: Saves::NotDifferentiable("its operands are integers"),
            grad: |ctx, saved, g, needs| (None, None),
            mlir: |e, a, b, out| Ok(e.elementwise($mlir, &[a, b], out))
        }
    )*};
}

bitwise_op! {
    BitwiseAnd, "bitwise_and", bitwise_and, |x, y| x & y, "stablehlo.and";
    BitwiseOr, "bitwise_or", bitwise_or, |x, y| x | y, "stablehlo.or";
    BitwiseXor, "bitwise_xor", bitwise_xor, |x, y| x ^ y, "stablehlo.xor";
}

/// `where(cond, a, b)`: a where cond, else b; all three broadcast together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Select;
op_attrs!(Select = "where" {});

impl OpDef for Select {
    fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
        expect_arity("where", inputs, 3)?;
        let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
        check_dtype("where", Accepts::Bool, c)?;
        super::rules::check_same_dtype("where", a, b)?;
        let shape = broadcast_shapes("where", &c.shape, &a.shape)?;
        let shape = broadcast_shapes("where", &shape, &b.shape)?;
        Ok(smallvec![TensorType::new(a.dtype, &shape)])
    }

    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
        let (c, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
        let shape = &outputs[0].shape;
        let out = crate::with_dtype!(a.dtype(), T, {
            kernels::zip3::<bool, T, T, T>(c, a, b, shape, |c, x, y| if c { x } else { y })?
        });
        Ok(smallvec![out])
    }

    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        crate::with_dtype!(outputs[0].dtype, T, {
            dest::zip3_to::<bool, T, T, T>(inputs, &outputs[0], |c, x, y| if c { x } else { y })
        })
    }

    fn saves(&self) -> Saves {
        Saves::inputs(0b001)
    }

    fn scalar(&self, _dtype: DType) -> Option<ScalarForm> {
        Some(ScalarForm::Select)
    }

    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>> {
        let out = &outputs[0];
        let ops = e.broadcast_operands(inputs, &out.shape)?;
        let (c, a, b) = (&ops[0], &ops[1], &ops[2]);
        let body = format!(
            "stablehlo.select {c}, {a}, {b} : {}, {}",
            TypeText(&c.ty),
            TypeText(out)
        );
        Ok(smallvec![e.op(&body, out)])
    }

    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>> {
        let Some(g) = grads[0].as_ref() else {
            return Ok(smallvec![None, None, None]);
        };
        let (ga, gb) = route(ctx, saved.input(0)?, g, &needs[1..])?;
        let ga = match ga {
            Some(v) => Some(unbroadcast(ctx, saved, 1, v)?),
            None => None,
        };
        let gb = match gb {
            Some(v) => Some(unbroadcast(ctx, saved, 2, v)?),
            None => None,
        };
        Ok(smallvec![None, ga, gb])
    }

    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>> {
        tangents::linear(ctx, *self, inputs, outputs, tangents, &[1, 2])
    }

    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>> {
        batching::broadcasting(ctx, *self, inputs, batched)
    }
}

pub fn select<V: Value>(ctx: &mut dyn Context<V>, cond: &V, a: &V, b: &V) -> Result<V> {
    build::apply1(ctx, Select, &[cond.clone(), a.clone(), b.clone()])
}
