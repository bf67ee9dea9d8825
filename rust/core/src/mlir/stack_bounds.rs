//! How many values a bounded loop can push onto a stack, so that the stack's buffer can be
//! made that large before the loop and its pushes need no growth check (see `stacks.rs`).
//!
//! A loop with `maximum_iterations = m` whose body pushes at most `p` values onto loop
//! variable `k` per trip (counting pushes in branches, the larger branch, and in nested loops,
//! `m' * p'` for a nested loop bounded by `m'`) pushes at most `m * p`. Anything else that
//! touches the stack (a call to an unknown function, a stack moved to another loop variable)
//! makes the count unknown, and the stack keeps its doubling buffer.

use crate::graph::{Call, Case, If, StackOp, While};
use crate::graph::{Function, Library, NodeKind};

/// Nesting deeper than this is not analysed (the count is unknown).
const MAX_DEPTH: usize = 64;

/// What a value is, relative to the stack being followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pushes {
    /// Not that stack.
    Unrelated,
    /// That stack, with at most this many values pushed since the start.
    AtMost(u64),
    /// That stack, after a number of pushes with no known bound.
    Unbounded,
}

impl Pushes {
    fn plus(self, n: Option<u64>) -> Pushes {
        match (self, n) {
            (Pushes::AtMost(a), Some(b)) => {
                a.checked_add(b).map_or(Pushes::Unbounded, Pushes::AtMost)
            }
            (Pushes::Unrelated, _) => Pushes::Unrelated,
            _ => Pushes::Unbounded,
        }
    }

    /// The count of a value that is one of these two (the outputs of two branches).
    fn either(self, other: Pushes) -> Pushes {
        match (self, other) {
            (Pushes::Unrelated, x) | (x, Pushes::Unrelated) => x,
            (Pushes::AtMost(a), Pushes::AtMost(b)) => Pushes::AtMost(a.max(b)),
            _ => Pushes::Unbounded,
        }
    }
}

/// The most values a `While` with `body` and `maximum_iterations` pushes onto its loop
/// variable `k` over all its trips, or None when there is no known bound.
pub(crate) fn loop_pushes(
    library: &Library,
    body: &str,
    k: usize,
    maximum_iterations: Option<i64>,
) -> Option<u64> {
    loop_pushes_at(library, body, k, maximum_iterations, 0)
}

fn loop_pushes_at(
    library: &Library,
    body: &str,
    k: usize,
    maximum_iterations: Option<i64>,
    depth: usize,
) -> Option<u64> {
    let f = library.get(body).ok()?;
    let mut start = vec![Pushes::Unrelated; f.params.len()];
    *start.get_mut(k)? = Pushes::AtMost(0);
    let results = flow(library, f, &start, depth + 1)?;
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

/// The counts of `f`'s results given its parameters' (None when `f` is not analysable).
fn flow(library: &Library, f: &Function, start: &[Pushes], depth: usize) -> Option<Vec<Pushes>> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut values: Vec<Vec<Pushes>> = Vec::with_capacity(f.nodes.len());
    for node in &f.nodes {
        let ins: Vec<Pushes> = node
            .inputs
            .iter()
            .map(|p| values.get(p.node).and_then(|o| o.get(p.output)).copied())
            .collect::<Option<_>>()?;
        let n = node.outputs.len();
        let related = ins.iter().any(|p| *p != Pushes::Unrelated);
        let outs = match &node.kind {
            NodeKind::Arg(i) => vec![start.get(*i).copied().unwrap_or(Pushes::Unrelated)],
            NodeKind::Stack(StackOp::Push) => vec![ins.first()?.plus(Some(1))],
            NodeKind::Stack(StackOp::Pop) => vec![*ins.first()?, Pushes::Unrelated],
            _ if !related => vec![Pushes::Unrelated; n],
            NodeKind::If(If {
                then_branch,
                else_branch,
            }) => branches(
                library,
                &[then_branch, else_branch],
                ins.get(1..)?,
                n,
                depth,
            )?,
            NodeKind::Case(Case { branches: names }) => {
                let names: Vec<&String> = names.iter().collect();
                branches(library, &names, ins.get(1..)?, n, depth)?
            }
            NodeKind::Call(Call { function, .. }) => {
                flow(library, library.get(function).ok()?, &ins, depth + 1)?
            }
            NodeKind::While(While {
                body,
                maximum_iterations,
                ..
            }) => ins
                .iter()
                .enumerate()
                .map(|(k, c)| match c {
                    Pushes::Unrelated => Pushes::Unrelated,
                    c => c.plus(loop_pushes_at(library, body, k, *maximum_iterations, depth)),
                })
                .collect(),
            // values a stack's size does not flow through: nothing known
            NodeKind::Const(_)
            | NodeKind::Op(_)
            | NodeKind::Variable(_)
            | NodeKind::Stack(StackOp::New { .. } | StackOp::Add) => vec![Pushes::Unbounded; n],
        };
        values.push(outs);
    }
    f.results
        .iter()
        .map(|p| values.get(p.node).and_then(|o| o.get(p.output)).copied())
        .collect()
}

/// The counts of the results of whichever of `names` runs on operands counted `ins`.
fn branches(
    library: &Library,
    names: &[&String],
    ins: &[Pushes],
    n: usize,
    depth: usize,
) -> Option<Vec<Pushes>> {
    let mut out = vec![Pushes::Unrelated; n];
    for name in names {
        let results = flow(library, library.get(name).ok()?, ins, depth + 1)?;
        for (o, r) in out.iter_mut().zip(results) {
            *o = o.either(r);
        }
    }
    Some(out)
}
