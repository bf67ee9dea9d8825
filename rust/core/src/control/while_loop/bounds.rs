//! The most values a bounded loop pushes onto a stack over all its trips (the loop's part of
//! `mlir::stack_bounds`): `maximum_iterations` times what one trip pushes.

use crate::graph::Library;
use crate::mlir::stack_bounds::{PushFlow, Pushes};

/// The most values a `While` with `body` and `maximum_iterations` pushes onto its loop
/// variable `k` over all its trips, or None when there is no known bound.
pub(crate) fn loop_pushes(
    library: &Library,
    body: &str,
    k: usize,
    maximum_iterations: Option<i64>,
) -> Option<u64> {
    loop_pushes_at(&PushFlow::new(library), body, k, maximum_iterations)
}

/// `loop_pushes` for a loop met `flow`'s depth down the analysis.
pub(super) fn loop_pushes_at(
    flow: &PushFlow<'_>,
    body: &str,
    k: usize,
    maximum_iterations: Option<i64>,
) -> Option<u64> {
    let params = flow.library.get(body).ok()?.params.len();
    let mut start = vec![Pushes::Unrelated; params];
    *start.get_mut(k)? = Pushes::AtMost(0);
    let results = flow.function(body, &start)?;
    let per_trip = match results.get(k)? {
        Pushes::AtMost(n) => *n,
        _ => return None,
    };
    // the stack must stay loop variable k (not also become another one)
    let elsewhere = results
        .iter()
        .enumerate()
        .any(|(i, r)| i != k && *r != Pushes::Unrelated);
    if elsewhere {
        return None;
    }
    if per_trip == 0 {
        return Some(0);
    }
    let trips = u64::try_from(maximum_iterations?.max(0)).ok()?;
    trips.checked_mul(per_trip)
}
