//! Every op of the op table through the emitter: one row per op (more for ops with several
//! StableHLO forms), each a one-node graph whose MLIR must contain the op's StableHLO and carry
//! the node's `loc`; forms without a lowering must be `Compile` errors naming the op, its node
//! and source line. `check.rs` runs the same rows under IREE against the interpreter.

use std::collections::HashSet;

use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::graph::{FunctionBuilder, Graph, Library, Location, ValueType};
use crate::ops::{
    binary, binary_math, creation, index, layout, matmul, reduce, special, unary, unary_math, Op,
    OpKind,
};
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;

use super::emit_module;

/// One op applied to concrete inputs, and a substring its MLIR must contain.
pub(crate) struct OpCase {
    pub op: Op,
    pub inputs: Vec<Tensor>,
    pub needle: &'static str,
}

fn case(op: impl Into<Op>, inputs: Vec<Tensor>, needle: &'static str) -> OpCase {
    OpCase {
        op: op.into(),
        inputs,
        needle,
    }
}

/// Distinct float32 values of `shape` in about [-1.4, 1.5], no ties.
pub(crate) fn values(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|k| (0.3 + 0.37 * k as f64 - 0.013 * (k * k) as f64).sin() * 1.5)
        .map(|v| v as f32)
        .collect();
    Tensor::from_vec::<f32>(data, shape).unwrap()
}

/// Positive float32 values (for log, sqrt, pow).
fn positive(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|k| 0.25 + 0.3 * k as f32).collect();
    Tensor::from_vec::<f32>(data, shape).unwrap()
}

fn bools(v: &[bool], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn ints<T: crate::dtype::Element>(v: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

/// The rows: every op kind at least once.
pub(crate) fn op_cases() -> Vec<OpCase> {
    use binary::*;
    use unary::*;
    let (m, v, s) = (values(&[2, 3]), values(&[3]), Tensor::scalar(0.25f32));
    let mask = bools(&[true, false, false, true, true, false], &[2, 3]);
    let shape = |d: &[usize]| d.into();
    let mut rows =
        vec![
        case(
            creation::Fill {
                dtype: DType::F32,
                shape: shape(&[2, 3]),
                value: 1.5,
            },
            vec![],
            "stablehlo.constant dense<1.5> : tensor<2x3xf32>",
        ),
        case(
            creation::FillLike { value: -2.0 },
            vec![m.clone()],
            "dense<-2.0> : tensor<2x3xf32>",
        ),
        case(
            creation::Arange {
                dtype: DType::F32,
                start: 1.0,
                step: 0.5,
                len: 4,
            },
            vec![],
            "stablehlo.iota dim = 0 : tensor<4xf32>",
        ),
        case(
            creation::Arange {
                dtype: DType::I32,
                start: 0.0,
                step: 0.5,
                len: 5,
            },
            vec![],
            "stablehlo.convert",
        ),
        case(creation::StopGradient, vec![m.clone()], "return %arg0"),
        case(creation::Identity, vec![m.clone()], "return %arg0"),
        case(
            creation::Cast { to: DType::I32 },
            vec![m.clone()],
            "stablehlo.convert %arg0 : (tensor<2x3xf32>) -> tensor<2x3xi32>",
        ),
        case(
            creation::Cast { to: DType::Bool },
            vec![m.clone()],
            "stablehlo.compare NE",
        ),
        case(
            creation::Cast { to: DType::F32 },
            vec![mask.clone()],
            "stablehlo.select %arg0, %0, %1 : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>)",
        ),
        case(
            creation::BitcastConvert { to: DType::I32 },
            vec![m.clone()],
            "stablehlo.bitcast_convert %arg0 : (tensor<2x3xf32>) -> tensor<2x3xi32>",
        ),
        case(Neg, vec![m.clone()], "stablehlo.negate"),
        case(Exp, vec![m.clone()], "stablehlo.exponential"),
        case(Log, vec![positive(&[2, 3])], "stablehlo.log"),
        case(Sin, vec![m.clone()], "stablehlo.sine"),
        case(Cos, vec![m.clone()], "stablehlo.cosine"),
        case(Tanh, vec![m.clone()], "stablehlo.tanh"),
        case(Sigmoid, vec![m.clone()], "stablehlo.logistic"),
        case(Relu, vec![m.clone()], "stablehlo.maximum"),
        case(Sqrt, vec![positive(&[2, 3])], "stablehlo.sqrt"),
        case(Abs, vec![m.clone()], "stablehlo.abs"),
        case(Sign, vec![m.clone()], "stablehlo.sign"),
        case(Floor, vec![m.clone()], "stablehlo.floor"),
        case(Ceil, vec![m.clone()], "stablehlo.ceil"),
        case(Round, vec![m.clone()], "stablehlo.round_nearest_even"),
        case(LogicalNot, vec![mask.clone()], "stablehlo.not"),
        case(unary_math::Tan, vec![m.clone()], "stablehlo.tan"),
        case(unary_math::Arcsin, vec![m.clone()], "stablehlo.atan2"),
        case(unary_math::Arccos, vec![m.clone()], "stablehlo.atan2"),
        case(unary_math::Arctan, vec![m.clone()], "stablehlo.atan2"),
        case(unary_math::Sinh, vec![m.clone()], "stablehlo.exponential_minus_one"),
        case(unary_math::Cosh, vec![m.clone()], "stablehlo.exponential"),
        case(unary_math::Arcsinh, vec![m.clone()], "stablehlo.log_plus_one"),
        case(unary_math::Arccosh, vec![positive(&[2, 3])], "stablehlo.select"),
        case(unary_math::Arctanh, vec![m.clone()], "stablehlo.log_plus_one"),
        case(unary_math::Log1p, vec![positive(&[2, 3])], "stablehlo.log_plus_one"),
        case(unary_math::Expm1, vec![m.clone()], "stablehlo.exponential_minus_one"),
        case(special::Erf, vec![m.clone()], "stablehlo.exponential"),
        case(binary_math::Arctan2, vec![m.clone(), v.clone()], "stablehlo.atan2"),
        case(binary_math::Rem, vec![m.clone(), positive(&[3])], "stablehlo.remainder"),
        case(binary_math::Quotient, vec![m.clone(), positive(&[3])], "stablehlo.floor"),
        case(Add, vec![m.clone(), v.clone()], "stablehlo.add"),
        case(Sub, vec![s.clone(), m.clone()], "stablehlo.subtract"),
        case(Mul, vec![m.clone(), v.clone()], "stablehlo.multiply"),
        case(Div, vec![m.clone(), positive(&[3])], "stablehlo.divide"),
        case(Pow, vec![positive(&[2, 3]), v.clone()], "stablehlo.power"),
        case(Maximum, vec![m.clone(), s.clone()], "stablehlo.maximum"),
        case(Minimum, vec![v.clone(), m.clone()], "stablehlo.minimum"),
        case(ReluGrad, vec![v.clone(), v.clone()], "stablehlo.select"),
        case(
            Equal,
            vec![ints(vec![1i32, 2, 3], &[3]), ints(vec![2i32], &[1])],
            "stablehlo.compare EQ, {{*}}, SIGNED",
        ),
        case(
            NotEqual,
            vec![mask.clone(), bools(&[true, false, true], &[3])],
            "stablehlo.compare NE, {{*}}, UNSIGNED",
        ),
        case(Less, vec![m.clone(), v.clone()], "stablehlo.compare LT"),
        case(
            LessEqual,
            vec![m.clone(), s.clone()],
            "stablehlo.compare LE",
        ),
        case(Greater, vec![m.clone(), v.clone()], "stablehlo.compare GT"),
        case(GreaterEqual, vec![m.clone(), v.clone()], "compare GE"),
        case(
            LogicalAnd,
            vec![mask.clone(), bools(&[true, false, true], &[3])],
            "stablehlo.and",
        ),
        case(
            LogicalOr,
            vec![mask.clone(), bools(&[false], &[])],
            "stablehlo.or",
        ),
        case(
            BitwiseAnd,
            vec![ints(vec![6i32, 5, 3], &[3]), ints(vec![3i32], &[1])],
            "stablehlo.and {{*}} : tensor<3xi32>",
        ),
        case(
            BitwiseOr,
            vec![ints(vec![6i32, 5, 3], &[3]), ints(vec![3i32], &[1])],
            "stablehlo.or",
        ),
        case(
            BitwiseXor,
            vec![ints(vec![6i32, 5, 3], &[3]), ints(vec![3i32], &[1])],
            "stablehlo.xor",
        ),
        case(
            Select,
            vec![mask.clone(), v.clone(), s.clone()],
            "stablehlo.select",
        ),
        case(
            reduce::Sum {
                axes: vec![0],
                keepdims: false,
            },
            vec![m.clone()],
            "stablehlo.reduce(%arg0 init: {{*}}) across dimensions = [0]",
        ),
        case(
            reduce::ReduceMax {
                axes: vec![1],
                keepdims: true,
            },
            vec![m.clone()],
            "stablehlo.maximum",
        ),
        case(
            reduce::ReduceMin {
                axes: vec![0, 1],
                keepdims: false,
            },
            vec![ints(vec![3i64, -1, 4, 1, -5, 9], &[2, 3])],
            "stablehlo.constant dense<9223372036854775807> : tensor<i64>",
        ),
        case(
            matmul::MatMul {
                transpose_a: false,
                transpose_b: true,
            },
            vec![values(&[2, 3]), values(&[4, 3])],
            "stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]",
        ),
        case(
            matmul::MatMul {
                transpose_a: false,
                transpose_b: false,
            },
            vec![
                ints(vec![1i32, 2, 3, 4], &[1, 2, 2]),
                ints(vec![1i32, 0, 2, 1, -1, 1, 3, 0], &[2, 2, 2]),
            ],
            "batching_dims = [0] x [0], contracting_dims = [2] x [1]",
        ),
        case(
            layout::Reshape {
                shape: shape(&[3, 2]),
            },
            vec![m.clone()],
            "stablehlo.reshape",
        ),
        case(
            layout::Transpose { perm: vec![1, 0] },
            vec![m.clone()],
            "stablehlo.transpose %arg0, dims = [1, 0]",
        ),
        case(
            layout::BroadcastTo {
                shape: shape(&[4, 2, 3]),
            },
            vec![m.clone()],
            "stablehlo.broadcast_in_dim %arg0, dims = [1, 2]",
        ),
        case(
            layout::Concatenate { axis: 1 },
            vec![m.clone(), values(&[2, 1]), m.clone()],
            "stablehlo.concatenate %arg0, %arg1, %arg2, dim = 1",
        ),
        case(
            layout::Slice {
                start: vec![0, 1],
                stop: vec![2, 3],
                step: vec![1, 2],
            },
            vec![m.clone()],
            "stablehlo.slice %arg0 [0:2, 1:3:2]",
        ),
        case(
            layout::Pad {
                low: vec![1, 0],
                high: vec![0, 2],
                interior: vec![1, 0],
            },
            vec![m.clone()],
            "low = [1, 0], high = [0, 2], interior = [1, 0]",
        ),
        case(
            layout::Reverse { axes: vec![0, 1] },
            vec![m.clone()],
            "stablehlo.reverse %arg0, dims = [0, 1]",
        ),
        case(
            index::DynamicSlice { sizes: vec![1, 2] },
            vec![m.clone(), Tensor::scalar(1i32), Tensor::scalar(5i64)],
            "stablehlo.dynamic_slice",
        ),
        case(
            index::DynamicUpdateSlice {},
            vec![
                m.clone(),
                values(&[1, 2]),
                Tensor::scalar(-3i32),
                Tensor::scalar(1i32),
            ],
            "stablehlo.dynamic_update_slice",
        ),
        case(
            index::Take { axis: 1 },
            vec![m.clone(), ints(vec![2i64, 0, -1, 1], &[2, 2])],
            "\"stablehlo.gather\"",
        ),
        case(
            index::ScatterAdd {
                axis: 1,
                dim_size: 3,
            },
            vec![values(&[2, 2, 2]), ints(vec![2i32, -3, 2, 1], &[2, 2])],
            "\"stablehlo.scatter\"",
        ),
    ];
    rows.push(case(
        layout::Concatenate { axis: 0 },
        vec![v.clone()],
        "return %arg0",
    ));
    rows
}

/// A graph `@op_<name>` applying `op` to parameters typed like `inputs`, at `ops.py:<line>`.
pub(crate) fn one_op_graph(op: &Op, types: &[TensorType], line: u32) -> Graph {
    let params = types.iter().cloned().map(ValueType::Tensor).collect();
    let name = format!("op_{}", op.name());
    let (mut b, args) = FunctionBuilder::new(name.clone(), params);
    let loc = Some(Location::new("ops.py", line));
    let outs = b
        .add_op(op.clone(), &args, loc)
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    let mut lib = Library::new();
    lib.add(b.finish(&outs, &[]).unwrap()).unwrap();
    Graph::new(lib, name).unwrap()
}

#[test]
fn every_op_emits_stablehlo_with_its_location() {
    let mut covered = HashSet::new();
    for (i, c) in op_cases().into_iter().enumerate() {
        covered.insert(c.op.kind());
        let types: Vec<TensorType> = c.inputs.iter().map(|t| t.ty().clone()).collect();
        let line = 100 + i as u32;
        let g = one_op_graph(&c.op, &types, line);
        let text = emit_module(&g).unwrap_or_else(|e| panic!("{}: {e}", c.op.name()));
        let checks = format!("CHECK: func.func\nCHECK: {}", c.needle);
        crate::testing::filecheck::filecheck(&text, &checks);
        // Every op carries the node's location (constants and reducer bodies included); an op
        // with a region has it after the region's closing brace.
        let loc = format!("loc(\"ops.py\":{line}:0)");
        let region_header = |l: &str| l.ends_with('{') || l.contains("stablehlo.reduce(");
        for l in text
            .lines()
            .filter(|l| l.contains(" = ") && !region_header(l))
        {
            assert!(l.ends_with(&loc), "{l}\n{text}");
        }
        for l in text
            .lines()
            .filter(|l| l.trim_start().starts_with('}') && l.contains("loc("))
        {
            assert!(l.ends_with(&loc), "{l}\n{text}");
        }
    }
    let missing: Vec<&str> = OpKind::ALL
        .iter()
        .filter(|k| !covered.contains(k) && !COMPOSITE_KERNELS.contains(k))
        .map(|k| k.name())
        .collect();
    assert!(missing.is_empty(), "ops without an MLIR test: {missing:?}");
}

/// Kernels that graphs hold only inside composite calls, whose callees are emitted instead.
const COMPOSITE_KERNELS: [OpKind; 7] = [
    OpKind::LuFactor,
    OpKind::LuPermutation,
    OpKind::LuSolve,
    OpKind::TriangularSolve,
    OpKind::Cholesky,
    OpKind::HouseholderQr,
    OpKind::PackIndices,
];

#[test]
fn factorisation_kernels_alone_are_compile_errors_naming_the_op() {
    let a = TensorType::new(DType::F64, &[3, 3]);
    let g = one_op_graph(&crate::ops::factor::Cholesky.into(), &[a], 7);
    let e = emit_module(&g).unwrap_err();
    assert_eq!(e.kind, crate::ErrorKind::Compile);
    assert!(e.message.contains("composite call"), "{e}");
}

#[test]
fn forms_without_stablehlo_are_compile_errors_naming_the_op_and_line() {
    let dynamic = TensorType::new(DType::F32, &[DYN, 3]);
    let cases: Vec<(Op, Vec<TensorType>, &str)> = vec![
        (
            layout::Reshape {
                shape: [DYN, 2].as_slice().into(),
            }
            .into(),
            vec![dynamic.clone()],
            "reshape to a shape with unknown dimensions [?, 2]",
        ),
        (
            creation::Fill {
                dtype: DType::F32,
                shape: [DYN].as_slice().into(),
                value: 0.0,
            }
            .into(),
            vec![],
            "unknown shape tensor<?xf32>",
        ),
        (
            index::Take { axis: 0 }.into(),
            vec![dynamic.clone(), TensorType::new(DType::I32, &[2])],
            "unknown dimensions",
        ),
        (
            matmul::MatMul::default().into(),
            vec![
                TensorType::new(DType::F32, &[DYN, 1, 2, 3]),
                TensorType::new(DType::F32, &[4, 3, 2]),
            ],
            "broadcasting the batch dimensions",
        ),
    ];
    for (op, types, needle) in cases {
        let g = one_op_graph(&op, &types, 77);
        let err = emit_module(&g).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Compile, "{err}");
        let msg = err.to_string();
        let name = op.name();
        assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
        assert!(msg.contains(needle), "{msg}");
        assert!(
            msg.contains(&format!(
                "at %{} = {name} in @op_{name} (ops.py:77)",
                types.len()
            )),
            "{msg}"
        );
    }
}
