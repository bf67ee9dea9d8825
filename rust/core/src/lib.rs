//! gradloop: differentiable dynamic control flow — the Rust core.
//!
//! Pure Rust, no Python: tensors (`tensor`, `dtype`), the op table (`ops`, with the `Context`
//! seam ops are applied through, `ops::context`) and the gradient tape (`tape`), the graph IR
//! (`graph`, `trace`, `interpret`), the MLIR emitter (`mlir`), control flow as a table of
//! constructs (`control`: one module per construct, each implementing every layer's trait) and
//! a front end's per-thread state (`front_end`). The Python bindings are a thin layer over this.
//!
//! From Rust: build a graph ([`graph::parse_graph`], [`graph::FunctionBuilder`]), differentiate
//! it ([`trace::gradient_graph`]), run it ([`interpret::run_graph`]) or single ops
//! ([`execute`]), and emit MLIR ([`mlir::emit_module`]). `examples/loop_gradient.rs` does each
//! for a loop with a data-dependent trip count.

pub mod batch;
pub mod control;
pub mod dataflow;
pub mod dtype;
pub mod emit;
pub mod error;
pub mod executor;
pub mod forward;
pub mod front_end;
pub mod graph;
pub mod import;
pub mod interpret;
pub mod location;
pub mod memory;
pub mod mlir;
pub mod ops;
pub mod passes;
pub mod pool;
pub mod runtime_values;
pub mod shape;
pub mod subnormals;
pub mod tape;
pub mod tensor;
#[cfg(test)]
pub(crate) mod testing;
pub mod trace;
pub mod value;

pub use dtype::{DType, Element, Elements, Storage};
pub use error::{Error, ErrorKind, Result};
pub use ops::{execute, Context, EagerContext};
pub use ops::{Op, OpKind};
pub use shape::{Shape, TensorType, DYN};
pub use tape::{
    compute_gradient, ForwardOperation, GradientFunction, GradientRegistry, Tape, TapeContext,
    TapeRef,
};
pub use tensor::{Scalar, Tensor, TensorId};
pub use value::Value;
