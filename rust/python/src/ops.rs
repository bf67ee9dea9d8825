//! Op functions exposed as `gradloop.<name>`. Each converts its arguments, then calls the core
//! builder through `runtime::run` (eager execution or tracing, + tape recording). No logic lives
//! here.

use gradloop::ops::{build, layout, reduce};
use gradloop::shape::{normalize_axis, DYN};
use gradloop::trace::Val;
use gradloop::{DType, Scalar, Value};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::convert::{binary_operands, input, inputs, opt_dtype, python_number, scalar};
use crate::dtype::to_dtype;
use crate::errors::IntoPyResult;
use crate::runtime::{numel, run, run_op, work};
use crate::tensor::PyTensor;

macro_rules! unary_fns {
    ($($name:ident => $builder:path, $what:literal;)*) => {
        $(
            pub fn $name(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
                let x = input(x)?;
                run_op!(py, numel(&x), |ctx, x| $builder(ctx, &x)).map(PyTensor::new)
            }
        )*
        pub mod py_unary {
            use pyo3::prelude::*;
            use crate::tensor::PyTensor;
            $(
                #[doc = concat!("`", stringify!($name), "(x)`: ", $what, ", elementwise.")]
                #[pyfunction]
                pub fn $name(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
                    super::$name(py, x)
                }
            )*
            pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
                $( m.add_function(wrap_pyfunction!($name, m)?)?; )*
                Ok(())
            }
        }
    };
}

macro_rules! binary_fns {
    ($($name:ident => $builder:path, $what:literal;)*) => {
        $(
            pub fn $name(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
                let [a, b] = binary_operands(py, stringify!($name), a, b)?;
                run_op!(py, work(&[&a, &b]), |ctx, a, b| $builder(ctx, &a, &b)).map(PyTensor::new)
            }
        )*
        pub mod py_binary {
            use pyo3::prelude::*;
            use crate::tensor::PyTensor;
            $(
                #[doc = concat!("`", stringify!($name), "(a, b)`: ", $what, ", with numpy's broadcasting; Python scalars adapt to the tensor's dtype.")]
                #[pyfunction]
                pub fn $name(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
                    super::$name(py, a, b)
                }
            )*
            pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
                $( m.add_function(wrap_pyfunction!($name, m)?)?; )*
                Ok(())
            }
        }
    };
}

unary_fns! {
    neg => build::neg, "-x";
    exp => build::exp, "e to the x";
    log => build::log, "the natural logarithm";
    sin => build::sin, "the sine";
    cos => build::cos, "the cosine";
    tanh => build::tanh, "the hyperbolic tangent";
    sigmoid => build::sigmoid, "the logistic function 1 / (1 + e^-x)";
    relu => build::relu, "max(x, 0)";
    sqrt => build::sqrt, "the square root";
    abs => build::abs, "the absolute value";
    sign => build::sign, "-1, 0 or 1 by the sign of x (its gradient is zero)";
    floor => build::floor, "the largest integer not above x";
    ceil => build::ceil, "the smallest integer not below x";
    round => build::round, "x rounded to the nearest integer, halves to even";
    logical_not => build::logical_not, "not x, on bools";
    tan => build::tan, "the tangent";
    arcsin => build::arcsin, "the inverse sine";
    arccos => build::arccos, "the inverse cosine";
    arctan => build::arctan, "the inverse tangent";
    sinh => build::sinh, "the hyperbolic sine";
    cosh => build::cosh, "the hyperbolic cosine";
    arcsinh => build::arcsinh, "the inverse hyperbolic sine";
    arccosh => build::arccosh, "the inverse hyperbolic cosine";
    arctanh => build::arctanh, "the inverse hyperbolic tangent";
    log1p => build::log1p, "log(1 + x), accurate for small x";
    expm1 => build::expm1, "e^x - 1, accurate for small x";
    erf => build::erf, "the error function";
    stop_gradient => build::stop_gradient, "x itself, through which no gradient flows";
    identity => build::identity, "x itself";
}

binary_fns! {
    add => build::add, "a + b, elementwise";
    sub => build::sub, "a - b, elementwise";
    mul => build::mul, "a * b, elementwise";
    div => build::div, "a / b, elementwise (true division)";
    pow => build::pow, "a to the power b, elementwise";
    maximum => build::maximum, "the larger of a and b, elementwise";
    minimum => build::minimum, "the smaller of a and b, elementwise";
    equal => build::equal, "a == b, elementwise";
    not_equal => build::not_equal, "a != b, elementwise";
    less => build::less, "a < b, elementwise";
    less_equal => build::less_equal, "a <= b, elementwise";
    greater => build::greater, "a > b, elementwise";
    greater_equal => build::greater_equal, "a >= b, elementwise";
    logical_and => build::logical_and, "a and b, on bools, elementwise";
    bitwise_and => build::bitwise_and, "a & b, on integers and bools, elementwise";
    bitwise_or => build::bitwise_or, "a | b, on integers and bools, elementwise";
    bitwise_xor => build::bitwise_xor, "a ^ b, on integers and bools, elementwise";
    logical_or => build::logical_or, "a or b, on bools, elementwise";
    matmul => build::matmul, "the matrix product, as numpy's `matmul` (leading dimensions are a batch)";
    arctan2 => build::arctan2, "the angle of the point (b, a), elementwise";
    rem => build::rem, "the remainder of a / b truncated toward zero (the sign of a, as C's `%`), elementwise";
    quotient => build::quotient, "a / b truncated toward zero, elementwise";
}

/// `axis` as None, an int or a sequence of ints, made absolute for rank `ndim`.
fn axes(
    op: &'static str,
    py: Python<'_>,
    axis: Option<&Bound<'_, PyAny>>,
    ndim: usize,
) -> PyResult<Vec<usize>> {
    let raw: Option<Vec<i64>> = match axis {
        None => None,
        Some(a) if a.is_none() => None,
        Some(a) if a.is_instance_of::<PyInt>() => Some(vec![a.extract()?]),
        Some(a) => Some(a.extract()?),
    };
    reduce::axes_for(op, raw.as_deref(), ndim).py(py)
}

macro_rules! reduction_fns {
    ($($name:ident, $opname:literal => $builder:path;)*) => {
        $(
            pub fn $name(py: Python<'_>, x: &Bound<'_, PyAny>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyTensor> {
                let x = input(x)?;
                let axes = axes($opname, py, axis, x.ty().ndim())?;
                run_op!(py, numel(&x), |ctx, x| $builder(ctx, &x, &axes, keepdims)).map(PyTensor::new)
            }
        )*
        pub mod py_reduce {
            use pyo3::prelude::*;
            use crate::tensor::PyTensor;
            $(
                #[doc = concat!("`", $opname, "` over `axis` (None: all axes; an int or a tuple of ints).")]
                #[pyfunction]
                #[pyo3(signature = (x, axis=None, keepdims=false))]
                pub fn $name(py: Python<'_>, x: &Bound<'_, PyAny>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyTensor> {
                    super::$name(py, x, axis, keepdims)
                }
            )*
            pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
                $( m.add_function(wrap_pyfunction!($name, m)?)?; )*
                Ok(())
            }
        }
    };
}

reduction_fns! {
    sum, "sum" => build::sum;
    mean, "mean" => build::mean;
    max, "max" => build::reduce_max;
    min, "min" => build::reduce_min;
}

fn int_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if obj.is_instance_of::<PyInt>() {
        return Ok(vec![obj.extract()?]);
    }
    obj.extract()
}

pub fn reshape(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
) -> PyResult<PyTensor> {
    let x = input(x)?;
    let shape = layout::resolve_shape(&x.ty().shape, &int_list(shape)?).py(py)?;
    run_op!(py, 0, |ctx, x| build::reshape(ctx, &x, &shape)).map(PyTensor::new)
}

pub fn transpose(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axes: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let x = input(x)?;
    let n = x.ty().ndim();
    let perm: Vec<usize> = match axes.filter(|a| !a.is_none()) {
        None => (0..n).rev().collect(),
        Some(a) => int_list(a)?
            .into_iter()
            .map(|ax| normalize_axis("transpose", ax, n))
            .collect::<gradloop::Result<_>>()
            .py(py)?,
    };
    run_op!(py, numel(&x), |ctx, x| build::transpose(ctx, &x, &perm)).map(PyTensor::new)
}

pub fn cast(py: Python<'_>, x: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    let x = input(x)?;
    let to = to_dtype(dtype)?;
    run_op!(py, numel(&x), |ctx, x| build::cast(ctx, &x, to)).map(PyTensor::new)
}

fn shape_arg(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let dims = int_list(shape)?;
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                crate::errors::new_err(
                    shape.py(),
                    gradloop::ErrorKind::Shape,
                    "shape",
                    format!("negative dimension {d} in shape {dims:?}"),
                )
            })
        })
        .collect()
}

pub mod py_shape {
    use super::*;

    /// Same elements in a new shape (one dimension may be -1).
    #[pyfunction]
    pub fn reshape(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        shape: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        super::reshape(py, x, shape)
    }

    /// Permutes axes (reverses them when `axes` is None).
    #[pyfunction]
    #[pyo3(signature = (x, axes=None))]
    pub fn transpose(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        axes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        super::transpose(py, x, axes)
    }

    /// Converts elements to `dtype`.
    #[pyfunction]
    pub fn cast(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        super::cast(py, x, dtype)
    }

    /// The same bits read as `dtype` of the same width (JAX's `lax.bitcast_convert_type`).
    #[pyfunction]
    pub fn bitcast_convert(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        let x = input(x)?;
        let to = to_dtype(dtype)?;
        run_op!(py, numel(&x), |ctx, x| build::bitcast_convert(ctx, &x, to)).map(PyTensor::new)
    }

    /// numpy's broadcast_to.
    #[pyfunction]
    pub fn broadcast_to(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        shape: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        let x = input(x)?;
        let shape = shape_arg(shape)?;
        run_op!(py, numel(&x), |ctx, x| build::broadcast_to(ctx, &x, &shape)).map(PyTensor::new)
    }

    fn first_ndim(py: Python<'_>, op: &'static str, xs: &[Val]) -> PyResult<usize> {
        xs.first().map(|t| t.ty().ndim()).ok_or_else(|| {
            crate::errors::new_err(
                py,
                gradloop::ErrorKind::InvalidArgument,
                op,
                "need at least one tensor",
            )
        })
    }

    /// Joins tensors along an existing axis.
    #[pyfunction]
    #[pyo3(signature = (xs, axis=0))]
    pub fn concatenate(py: Python<'_>, xs: &Bound<'_, PyAny>, axis: i64) -> PyResult<PyTensor> {
        let xs = inputs(xs)?;
        let axis =
            normalize_axis("concatenate", axis, first_ndim(py, "concatenate", &xs)?).py(py)?;
        let n = work(&xs.iter().collect::<Vec<_>>());
        run(py, n, move |ctx| build::concatenate(ctx, &xs, axis)).map(PyTensor::new)
    }

    /// Joins tensors along a new axis.
    #[pyfunction]
    #[pyo3(signature = (xs, axis=0))]
    pub fn stack(py: Python<'_>, xs: &Bound<'_, PyAny>, axis: i64) -> PyResult<PyTensor> {
        let xs = inputs(xs)?;
        let axis = normalize_axis("stack", axis, first_ndim(py, "stack", &xs)? + 1).py(py)?;
        let n = work(&xs.iter().collect::<Vec<_>>());
        run(py, n, move |ctx| build::stack(ctx, &xs, axis)).map(PyTensor::new)
    }

    /// Inserts a size-1 axis at `axis`.
    #[pyfunction]
    pub fn expand_dims(py: Python<'_>, x: &Bound<'_, PyAny>, axis: i64) -> PyResult<PyTensor> {
        let x = input(x)?;
        let axis = normalize_axis("expand_dims", axis, x.ty().ndim() + 1).py(py)?;
        run_op!(py, 0, |ctx, x| build::expand_dims(ctx, &x, axis)).map(PyTensor::new)
    }

    /// Removes size-1 axes (all of them when `axis` is None).
    #[pyfunction]
    #[pyo3(signature = (x, axis=None))]
    pub fn squeeze(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        axis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        let x = input(x)?;
        let axes = match axis.filter(|a| !a.is_none()) {
            None => None,
            Some(a) => Some(int_list(a)?),
        };
        run_op!(py, 0, |ctx, x| build::squeeze_axes(
            ctx,
            &x,
            axes.as_deref()
        ))
        .map(PyTensor::new)
    }

    /// `where(cond, x, y)`: x where cond is true, else y (broadcasting).
    #[pyfunction]
    #[pyo3(name = "where")]
    pub fn where_(
        py: Python<'_>,
        cond: &Bound<'_, PyAny>,
        x: &Bound<'_, PyAny>,
        y: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        let c = input(cond)?;
        let [x, y] = binary_operands(py, "where", x, y)?;
        let n = work(&[&c, &x, &y]);
        run_op!(py, n, |ctx, c, x, y| build::select(ctx, &c, &x, &y)).map(PyTensor::new)
    }

    /// numpy's take: elements of `x` at `indices` along `axis` (flattened x when None).
    #[pyfunction]
    #[pyo3(signature = (x, indices, axis=None))]
    pub fn take(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        indices: &Bound<'_, PyAny>,
        axis: Option<i64>,
    ) -> PyResult<PyTensor> {
        let x = input(x)?;
        let indices = input(indices)?;
        run_op!(py, work(&[&x, &indices]), |ctx, x, indices| {
            build::take_along(ctx, &x, &indices, axis)
        })
        .map(PyTensor::new)
    }
}

fn creation_dtype(dtype: Option<&Bound<'_, PyAny>>, default: DType) -> PyResult<DType> {
    Ok(opt_dtype(dtype)?.unwrap_or(default))
}

pub mod py_creation {
    use super::*;

    /// A tensor of `shape` filled with zeros.
    #[pyfunction]
    #[pyo3(signature = (shape, dtype=None))]
    pub fn zeros(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        full_impl(py, shape, 0.0, creation_dtype(dtype, DType::F32)?)
    }

    /// A tensor of `shape` filled with ones.
    #[pyfunction]
    #[pyo3(signature = (shape, dtype=None))]
    pub fn ones(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        full_impl(py, shape, 1.0, creation_dtype(dtype, DType::F32)?)
    }

    /// A tensor of `shape` filled with `value` (dtype from the value when not given).
    #[pyfunction]
    #[pyo3(signature = (shape, value, dtype=None))]
    pub fn full(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        let s = scalar(value)?.ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(
                "full: value must be a Python bool, int or float",
            )
        })?;
        let dtype = creation_dtype(dtype, s.default_dtype())?;
        // The scalar rules apply (no silent float -> int or int32 overflow); then fill.
        let v = s.to_tensor(dtype, "full").py(py)?.item_f64().py(py)?;
        full_impl(py, shape, v, dtype)
    }

    fn full_impl(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        value: f64,
        dtype: DType,
    ) -> PyResult<PyTensor> {
        let shape = shape_arg(shape)?;
        run_op!(py, 0, |ctx| build::fill(ctx, dtype, &shape, value)).map(PyTensor::new)
    }

    /// Zeros shaped like `x` (its dtype unless `dtype` is given).
    #[pyfunction]
    #[pyo3(signature = (x, dtype=None))]
    pub fn zeros_like(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        like(py, x, dtype, 0.0)
    }

    /// Ones shaped like `x` (its dtype unless `dtype` is given).
    #[pyfunction]
    #[pyo3(signature = (x, dtype=None))]
    pub fn ones_like(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        like(py, x, dtype, 1.0)
    }

    fn like(
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        value: f64,
    ) -> PyResult<PyTensor> {
        let x = input(x)?;
        let dtype = creation_dtype(dtype, x.ty().dtype)?;
        let shape = x.ty().shape.to_vec();
        if shape.contains(&DYN) {
            // Known only at run time: fill like `x` (its dtype), then cast.
            return run(py, 0, move |ctx| {
                let filled = build::fill_like(ctx, &x, value)?;
                if filled.ty().dtype == dtype {
                    Ok(filled)
                } else {
                    build::cast(ctx, &filled, dtype)
                }
            })
            .map(PyTensor::new);
        }
        run_op!(py, 0, |ctx| build::fill(ctx, dtype, &shape, value)).map(PyTensor::new)
    }

    /// numpy's arange: `arange(stop)` or `arange(start, stop, step)`; int32 when all are ints.
    #[pyfunction]
    #[pyo3(signature = (start, stop=None, step=None, dtype=None))]
    pub fn arange(
        py: Python<'_>,
        start: &Bound<'_, PyAny>,
        stop: Option<&Bound<'_, PyAny>>,
        step: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        let number = |o: Option<&Bound<'_, PyAny>>| -> PyResult<Option<Scalar>> {
            o.filter(|o| !o.is_none()).map(python_number).transpose()
        };
        let (start, stop, step) = (python_number(start)?, number(stop)?, number(step)?);
        let dtype = opt_dtype(dtype)?;
        run_op!(py, 0, |ctx| build::arange_of(ctx, start, stop, step, dtype)).map(PyTensor::new)
    }

    /// `gl.tensor(data, dtype=None)`: from Python scalars, nested lists, numpy arrays or tensors.
    #[pyfunction]
    #[pyo3(signature = (data, dtype=None))]
    pub fn tensor(data: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(crate::convert::to_tensor(
            data,
            opt_dtype(dtype)?,
        )?))
    }

    /// `array`'s elements read where they lie, for a numpy array whose memory no one writes
    /// again (XLA's results): the tensor keeps the array alive. An array that cannot be read
    /// in place (not contiguous or aligned, bool, another byte order) is copied.
    #[pyfunction]
    pub fn tensor_in_place(array: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        Ok(PyTensor::new(crate::convert::read_in_place(array)?))
    }

    /// `data` as a tensor, a Python scalar taking `like`'s dtype where it adapts to it (as an
    /// op's scalar operand does: `Scalar::adapts_to`) and its own default otherwise.
    #[pyfunction]
    pub fn tensor_like(data: &Bound<'_, PyAny>, like: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        let dtype = like.inner.ty().dtype;
        // Python ints and floats, their subclasses included (np.float64 is one).
        let number = if data.is_instance_of::<PyBool>() {
            None
        } else if data.is_instance_of::<PyFloat>() {
            Some(Scalar::Float(0.0))
        } else if data.is_instance_of::<PyInt>() {
            Some(Scalar::Int(0))
        } else {
            None
        };
        let adapted = number.is_some_and(|s| s.adapts_to(dtype));
        Ok(PyTensor::new(crate::convert::to_tensor(
            data,
            adapted.then_some(dtype),
        )?))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py_unary::register(m)?;
    py_binary::register(m)?;
    py_reduce::register(m)?;
    for f in [
        wrap_pyfunction!(py_shape::reshape, m)?,
        wrap_pyfunction!(py_shape::transpose, m)?,
        wrap_pyfunction!(py_shape::cast, m)?,
        wrap_pyfunction!(py_shape::bitcast_convert, m)?,
        wrap_pyfunction!(py_shape::broadcast_to, m)?,
        wrap_pyfunction!(py_shape::concatenate, m)?,
        wrap_pyfunction!(py_shape::stack, m)?,
        wrap_pyfunction!(py_shape::expand_dims, m)?,
        wrap_pyfunction!(py_shape::squeeze, m)?,
        wrap_pyfunction!(py_shape::where_, m)?,
        wrap_pyfunction!(py_shape::take, m)?,
        wrap_pyfunction!(py_creation::zeros, m)?,
        wrap_pyfunction!(py_creation::ones, m)?,
        wrap_pyfunction!(py_creation::full, m)?,
        wrap_pyfunction!(py_creation::zeros_like, m)?,
        wrap_pyfunction!(py_creation::ones_like, m)?,
        wrap_pyfunction!(py_creation::arange, m)?,
        wrap_pyfunction!(py_creation::tensor, m)?,
        wrap_pyfunction!(py_creation::tensor_like, m)?,
        wrap_pyfunction!(py_creation::tensor_in_place, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
