//! Tests of op attributes: every op kind round-trips through (name, attributes), names are
//! unique, and bad attributes are `Graph` errors naming the op.

use std::collections::HashSet;

use super::*;
use crate::graph::builtin_names;
use crate::ops::{
    binary, binary_math, creation, factor, index, layout, matmul, reduce, special, unary,
    unary_math, Op, OpKind,
};

fn shape(dims: &[usize]) -> Shape {
    dims.into()
}

/// One op of every kind, with attribute values that are easy to get wrong (DYN, -0.0,
/// tiny floats, empty lists).
pub(crate) fn samples() -> Vec<Op> {
    use binary::*;
    use unary::*;
    let fill = creation::Fill {
        dtype: DType::I64,
        shape: shape(&[2, DYN]),
        value: -0.1,
    };
    let arange = creation::Arange {
        dtype: DType::F32,
        start: -0.0,
        step: 1e-300,
        len: 4,
    };
    let (axes, keepdims) = (vec![0, 2], false);
    let slice = layout::Slice {
        start: vec![0, 1],
        stop: vec![3, DYN],
        step: vec![1, 2],
    };
    let pad = layout::Pad {
        low: vec![1],
        high: vec![0],
        interior: vec![2],
    };
    vec![
        fill.into(),
        creation::FillLike { value: -0.0 }.into(),
        arange.into(),
        creation::StopGradient.into(),
        creation::Identity.into(),
        creation::Cast { to: DType::Bool }.into(),
        Neg.into(),
        Exp.into(),
        Log.into(),
        Sin.into(),
        Cos.into(),
        Tanh.into(),
        Sigmoid.into(),
        Relu.into(),
        Sqrt.into(),
        Abs.into(),
        Sign.into(),
        Floor.into(),
        Ceil.into(),
        Round.into(),
        LogicalNot.into(),
        unary_math::Tan.into(),
        unary_math::Arcsin.into(),
        unary_math::Arccos.into(),
        unary_math::Arctan.into(),
        unary_math::Sinh.into(),
        unary_math::Cosh.into(),
        unary_math::Arcsinh.into(),
        unary_math::Arccosh.into(),
        unary_math::Arctanh.into(),
        unary_math::Log1p.into(),
        unary_math::Expm1.into(),
        creation::BitcastConvert { to: DType::I64 }.into(),
        special::Erf.into(),
        factor::LuFactor.into(),
        factor::LuPermutation.into(),
        factor::LuSolve { trans: true }.into(),
        factor::TriangularSolve {
            lower: false,
            unit_diagonal: true,
        }
        .into(),
        factor::Cholesky.into(),
        factor::HouseholderQr.into(),
        binary_math::Arctan2.into(),
        binary_math::Rem.into(),
        binary_math::Quotient.into(),
        Add.into(),
        Sub.into(),
        Mul.into(),
        Div.into(),
        Pow.into(),
        Maximum.into(),
        Minimum.into(),
        ReluGrad.into(),
        Equal.into(),
        NotEqual.into(),
        Less.into(),
        LessEqual.into(),
        Greater.into(),
        GreaterEqual.into(),
        LogicalAnd.into(),
        LogicalOr.into(),
        BitwiseAnd.into(),
        BitwiseOr.into(),
        BitwiseXor.into(),
        Select.into(),
        reduce::Sum {
            axes: vec![],
            keepdims: true,
        }
        .into(),
        reduce::ReduceMax {
            axes: axes.clone(),
            keepdims,
        }
        .into(),
        reduce::ReduceMin { axes, keepdims }.into(),
        matmul::MatMul {
            transpose_a: true,
            transpose_b: false,
        }
        .into(),
        layout::Reshape {
            shape: shape(&[DYN, 3]),
        }
        .into(),
        layout::Transpose { perm: vec![1, 0] }.into(),
        layout::BroadcastTo { shape: shape(&[]) }.into(),
        layout::Concatenate { axis: 1 }.into(),
        slice.into(),
        pad.into(),
        layout::Reverse { axes: vec![0] }.into(),
        index::DynamicSlice { sizes: vec![2, 2] }.into(),
        index::DynamicUpdateSlice {}.into(),
        index::Take { axis: 0 }.into(),
        index::ScatterAdd {
            axis: 1,
            dim_size: DYN,
        }
        .into(),
        crate::ops::pack::PackIndices { size: 4 }.into(),
    ]
}

#[test]
fn every_op_kind_round_trips_through_its_attributes() {
    let ops = samples();
    let kinds: HashSet<OpKind> = ops.iter().map(Op::kind).collect();
    assert_eq!(kinds.len(), ops.len(), "one sample per kind");
    assert_eq!(
        kinds.len(),
        OpKind::ALL.len(),
        "add a sample for the new op"
    );
    for op in ops {
        assert_eq!(
            op.kind().name(),
            op.name(),
            "OpAttrs::NAME differs from OpDef::name"
        );
        let map = AttrMap::from_pairs(op.attrs());
        assert_eq!(Op::from_name(op.name(), &map).unwrap(), op);
    }
}

#[test]
fn op_names_are_unique_and_not_graph_keywords() {
    let mut seen = HashSet::new();
    for kind in OpKind::ALL {
        let name = kind.name();
        assert!(seen.insert(name), "two ops are called {name}");
        assert!(
            !builtin_names().contains(&name),
            "{name} is a graph keyword"
        );
    }
}

#[test]
fn bad_attributes_are_graph_errors_naming_the_op() {
    let err = |name: &str, attrs: Vec<(&'static str, Attr)>| {
        let e = Op::from_name(name, &AttrMap::from_pairs(attrs)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Graph);
        e.to_string()
    };
    let e = err("sum", vec![("axes", Attr::Ints(vec![0]))]);
    assert!(e.contains("sum: missing attribute `keepdims`"), "{e}");
    let e = err("neg", vec![("axes", Attr::Ints(vec![0]))]);
    assert!(
        e.contains("neg: unknown attribute `axes` (expected: none)"),
        "{e}"
    );
    let e = err("transpose", vec![("perm", Attr::Ints(vec![-1]))]);
    assert!(e.contains("`perm` = [-1] is not a valid"), "{e}");
    let e = err("cast", vec![("to", Attr::Int(3))]);
    assert!(e.contains("cast: attribute `to` = 3"), "{e}");
    assert!(err("frobnicate", vec![]).contains("unknown op `frobnicate`"));
    let mut map = AttrMap::new();
    map.insert("axis", Attr::Int(0)).unwrap();
    assert!(map.insert("axis", Attr::Int(1)).is_err());
}

#[test]
fn attributes_print_in_text_form() {
    let cases = [
        (Attr::Shape(vec![2, DYN]), "[2, ?]"),
        (Attr::Size(DYN), "?"),
        (Attr::Ints(vec![-1, 0]), "[-1, 0]"),
        (Attr::Float(1.0), "1.0"),
        (Attr::Float(1e-7), "1e-7"),
        (Attr::Float(f64::NEG_INFINITY), "-inf"),
        (Attr::DType(DType::I64), "i64"),
        (Attr::Bool(false), "false"),
    ];
    for (attr, text) in cases {
        assert_eq!(attr.to_string(), text);
    }
    assert_eq!(usize::from_attr(&Attr::Int(-1)), None);
    assert_eq!(f64::from_attr(&Attr::Int(2)), Some(2.0));
    assert_eq!(
        Shape::from_attr(&Attr::Ints(vec![1, 2]))
            .unwrap()
            .as_slice(),
        &[1, 2]
    );
}
