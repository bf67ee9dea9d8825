//! Test support, compiled only for tests: builders of example graphs and values, the gradient
//! checker (finite differences), the MLIR golden cases and traced programs, and FileCheck.

pub(crate) mod filecheck;
pub(crate) mod gradcheck;
pub(crate) mod graphs;
pub(crate) mod interpret;
pub(crate) mod mlir_cases;
pub(crate) mod mlir_check;
pub(crate) mod trace;
pub(crate) mod traced;
