//! One error type for the whole core: a category, the op that failed, and a message.
//!
//! The Python bindings map each category onto one class of `gradloop.errors` in one place.

use std::borrow::Cow;

/// What went wrong, coarsely: each kind is one Python exception class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Shapes that do not fit the op (broadcasting, matmul, reshape, ...).
    Shape,
    /// A dtype the op does not accept, or operands whose dtypes differ.
    DType,
    /// An index or axis out of range.
    Index,
    /// Any other bad argument value.
    InvalidArgument,
    /// Branch or loop functions whose structure, dtypes or shapes disagree.
    ControlFlow,
    /// A gradient that cannot be computed as asked.
    Gradient,
    /// A custom rule whose results have the wrong structure, dtype or shape (also a TypeError).
    GradientType,
    /// A malformed graph (verifier) or text form that does not parse.
    Graph,
    /// A failure of the MLIR emitter or of the compiler behind it.
    Compile,
    /// An allocation larger than the machine can give (sized by the user's shapes or data).
    ResourceExhausted,
    /// A bug in gradloop itself; never the user's fault.
    Internal,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Shape => "ShapeError",
            ErrorKind::DType => "DTypeError",
            ErrorKind::Index => "IndexError",
            ErrorKind::InvalidArgument => "InvalidArgumentError",
            ErrorKind::ControlFlow => "ControlFlowError",
            ErrorKind::Gradient => "GradientError",
            ErrorKind::GradientType => "GradientTypeError",
            ErrorKind::Graph => "GraphError",
            ErrorKind::Compile => "CompileError",
            ErrorKind::ResourceExhausted => "ResourceExhaustedError",
            ErrorKind::Internal => "InternalError",
        }
    }
}

/// An error with its kind, the op (or API function) that raised it, and a human message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub op: Cow<'static, str>,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(
        kind: ErrorKind,
        op: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            op: op.into(),
            message: message.into(),
        }
    }

    pub fn shape(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Shape, op, message)
    }

    pub fn dtype(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DType, op, message)
    }

    pub fn index(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Index, op, message)
    }

    pub fn invalid(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, op, message)
    }

    pub fn gradient(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Gradient, op, message)
    }

    pub fn internal(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, op, message)
    }
}
