//! `Value`: what contexts, tapes and gradient rules pass around — a concrete `Tensor` in eager
//! mode, a symbolic graph value when tracing. Rules are generic over it, so one rule serves both.

use std::fmt;

use crate::shape::TensorType;
use crate::tensor::{Tensor, TensorId};

pub trait Value: Clone + fmt::Debug + Send + Sync + 'static {
    /// Identity the tape tracks.
    fn id(&self) -> TensorId;
    /// Static dtype and shape.
    fn ty(&self) -> &TensorType;
}

impl Value for Tensor {
    fn id(&self) -> TensorId {
        Tensor::id(self)
    }

    fn ty(&self) -> &TensorType {
        Tensor::ty(self)
    }
}
