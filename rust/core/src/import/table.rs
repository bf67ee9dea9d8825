//! The mapping table: every MLIR op the importer understands, once, with how it becomes
//! gradloop ops. An op not listed here is refused with an error naming it and its location.
//! Terminators (`func.return`, `stablehlo.return`, `scf.yield`, `scf.condition`) end blocks
//! and are read by the block walk, not converted.

use super::contract;
use super::control;
use super::elementwise::{self as ew, binary, unary};
use super::gather;
use super::importer::Importer;
use super::layout;
use super::syntax::Operation;
use crate::error::Result;
use crate::ops::build;
use crate::trace::Val;

/// Converts one op: its operands' values in, its results' values out.
pub(crate) type Convert = for<'m> fn(&mut Importer<'m>, &'m Operation, &[Val]) -> Result<Vec<Val>>;

/// Ops that end a block; their operands are the block's results.
const TERMINATORS: &[&str] = &[
    "func.return",
    "stablehlo.return",
    "scf.yield",
    "scf.condition",
];

static TABLE: &[(&str, Convert)] = &[
    // elementwise, one operand
    ("stablehlo.abs", |im, op, x| unary(im, op, x, build::abs)),
    ("stablehlo.ceil", |im, op, x| unary(im, op, x, build::ceil)),
    ("stablehlo.cosine", |im, op, x| unary(im, op, x, build::cos)),
    ("stablehlo.exponential", |im, op, x| {
        unary(im, op, x, build::exp)
    }),
    ("stablehlo.exponential_minus_one", |im, op, x| {
        unary(im, op, x, build::expm1)
    }),
    ("stablehlo.floor", |im, op, x| {
        unary(im, op, x, build::floor)
    }),
    ("stablehlo.is_finite", |im, op, x| {
        unary(im, op, x, ew::is_finite)
    }),
    ("chlo.acos", |im, op, x| unary(im, op, x, build::arccos)),
    ("chlo.acosh", |im, op, x| unary(im, op, x, build::arccosh)),
    ("chlo.asin", |im, op, x| unary(im, op, x, build::arcsin)),
    ("chlo.asinh", |im, op, x| unary(im, op, x, build::arcsinh)),
    ("chlo.atan", |im, op, x| unary(im, op, x, build::arctan)),
    ("chlo.atanh", |im, op, x| unary(im, op, x, build::arctanh)),
    ("chlo.erf", |im, op, x| unary(im, op, x, build::erf)),
    ("chlo.cosh", |im, op, x| unary(im, op, x, build::cosh)),
    ("chlo.sinh", |im, op, x| unary(im, op, x, build::sinh)),
    ("chlo.tan", |im, op, x| unary(im, op, x, build::tan)),
    ("stablehlo.log", |im, op, x| unary(im, op, x, build::log)),
    ("stablehlo.log_plus_one", |im, op, x| {
        unary(im, op, x, build::log1p)
    }),
    ("stablehlo.logistic", |im, op, x| {
        unary(im, op, x, build::sigmoid)
    }),
    ("stablehlo.negate", |im, op, x| unary(im, op, x, build::neg)),
    ("stablehlo.round_nearest_even", |im, op, x| {
        unary(im, op, x, build::round)
    }),
    ("stablehlo.rsqrt", |im, op, x| unary(im, op, x, ew::rsqrt)),
    ("stablehlo.sign", |im, op, x| unary(im, op, x, build::sign)),
    ("stablehlo.sine", |im, op, x| unary(im, op, x, build::sin)),
    ("stablehlo.sqrt", |im, op, x| unary(im, op, x, build::sqrt)),
    ("stablehlo.tan", |im, op, x| unary(im, op, x, build::tan)),
    ("stablehlo.tanh", |im, op, x| unary(im, op, x, build::tanh)),
    ("stablehlo.not", ew::logical),
    ("stablehlo.convert", ew::convert),
    ("stablehlo.bitcast_convert", ew::bitcast_convert),
    // elementwise, two or three operands
    ("stablehlo.add", |im, op, x| binary(im, op, x, build::add)),
    ("stablehlo.subtract", |im, op, x| {
        binary(im, op, x, build::sub)
    }),
    ("stablehlo.multiply", |im, op, x| {
        binary(im, op, x, build::mul)
    }),
    ("stablehlo.divide", ew::divide),
    ("stablehlo.remainder", |im, op, x| {
        binary(im, op, x, build::rem)
    }),
    ("stablehlo.atan2", |im, op, x| {
        binary(im, op, x, build::arctan2)
    }),
    ("stablehlo.power", |im, op, x| binary(im, op, x, build::pow)),
    ("stablehlo.maximum", |im, op, x| {
        binary(im, op, x, build::maximum)
    }),
    ("stablehlo.minimum", |im, op, x| {
        binary(im, op, x, build::minimum)
    }),
    ("stablehlo.and", ew::logical),
    ("stablehlo.or", ew::logical),
    ("stablehlo.xor", ew::logical),
    ("stablehlo.compare", ew::compare),
    ("stablehlo.select", ew::select),
    ("stablehlo.clamp", ew::clamp),
    ("stablehlo.constant", ew::constant),
    ("stablehlo.optimization_barrier", ew::pass_through),
    // layout
    ("stablehlo.broadcast_in_dim", layout::broadcast_in_dim),
    ("stablehlo.reshape", layout::reshape),
    ("stablehlo.transpose", layout::transpose),
    ("stablehlo.iota", layout::iota),
    ("stablehlo.slice", layout::slice),
    ("stablehlo.concatenate", layout::concatenate),
    ("stablehlo.reverse", layout::reverse),
    ("stablehlo.pad", layout::pad),
    ("stablehlo.dynamic_slice", layout::dynamic_slice),
    (
        "stablehlo.dynamic_update_slice",
        layout::dynamic_update_slice,
    ),
    // contractions and reductions
    ("stablehlo.dot_general", contract::dot_general),
    ("stablehlo.dot", contract::dot),
    ("stablehlo.reduce", contract::reduce),
    // indexing along one axis
    ("stablehlo.gather", gather::gather),
    ("stablehlo.scatter", gather::scatter),
    // control flow
    ("stablehlo.while", control::stablehlo_while),
    ("stablehlo.if", control::if_op),
    ("stablehlo.case", control::case),
    ("scf.while", control::scf_while),
    ("scf.if", control::if_op),
    ("scf.index_switch", control::index_switch),
    ("func.call", control::call),
    // scalars between tensors and `scf` conditions
    ("tensor.extract", control::extract),
    ("arith.constant", ew::constant),
    ("arith.index_cast", ew::convert),
];

/// How to convert the op called `name`, if it is supported.
pub(crate) fn lookup(name: &str) -> Option<Convert> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

pub(crate) fn is_terminator(name: &str) -> bool {
    TERMINATORS.contains(&name)
}

/// Every op the importer converts, in table order.
pub fn supported_ops() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(n, _)| *n)
}
