//! An error inside the executor, and where it happened when that was inside a fused frame.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::dataflow::{DfNode, Origin};
use crate::error::Error;

/// An error, and where it happened when that was inside a fused frame.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: Error,
    pub inner: Option<Inside>,
}

/// Where in a fused frame a failure happened: the failing node's origin and its iteration in
/// each fused loop around it, innermost first.
#[derive(Debug, Default)]
pub(crate) struct Inside {
    pub origin: Option<Arc<Origin>>,
    pub iterations: SmallVec<[i64; 2]>,
}

impl Failure {
    /// Notes that the failure happened at `node` of a fused frame, in `iteration` when the
    /// frame is a loop's.
    pub fn inside(&mut self, node: &DfNode, iteration: Option<i64>) {
        let inside = self.inner.get_or_insert_with(|| Inside {
            origin: node.origin.clone(),
            iterations: SmallVec::new(),
        });
        inside.iterations.extend(iteration);
    }

    /// Where it happened, to compare two failures (check mode).
    pub fn place(&self) -> Option<(Option<String>, SmallVec<[i64; 2]>)> {
        self.inner.as_ref().map(|i| {
            (
                i.origin.as_ref().map(|o| o.site.clone()),
                i.iterations.clone(),
            )
        })
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure { error, inner: None }
    }
}
