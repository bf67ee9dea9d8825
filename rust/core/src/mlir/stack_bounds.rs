//! How many values a bounded loop can push onto a stack, so that the stack's buffer can be
//! made that large before the loop and its pushes need no growth check (see `stacks.rs`). Each
//! construct counts its own (`EmitMlir::stack_pushes`); the loop's bound is `While`'s.
//!
//! A loop with `maximum_iterations = m` whose body pushes at most `p` values onto loop
//! variable `k` per trip (counting pushes in branches, the larger branch, and in nested loops,
//! `m' * p'` for a nested loop bounded by `m'`) pushes at most `m * p`. Anything else that
//! touches the stack (a call to an unknown function, a stack moved to another loop variable)
//! makes the count unknown, and the stack keeps its doubling buffer.

use super::function::construct_emitter;
use crate::graph::{Function, Library, NodeKind};

/// Nesting deeper than this is not analysed (the count is unknown).
const MAX_DEPTH: usize = 64;

/// What a value is, relative to the stack being followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushes {
    /// Not that stack.
    Unrelated,
    /// That stack, with at most this many values pushed since the start.
    AtMost(u64),
    /// That stack, after a number of pushes with no known bound.
    Unbounded,
}

impl Pushes {
    pub(crate) fn plus(self, n: Option<u64>) -> Pushes {
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
            _ if !related => vec![Pushes::Unrelated; n],
            // values a stack's size does not flow through: nothing known
            NodeKind::Const(_) | NodeKind::Op(_) => vec![Pushes::Unbounded; n],
            kind => {
                let construct = construct_emitter(kind)?;
                construct.stack_pushes(&PushFlow { library, depth }, &ins, n)?
            }
        };
        values.push(outs);
    }
    f.results
        .iter()
        .map(|p| values.get(p.node).and_then(|o| o.get(p.output)).copied())
        .collect()
}

/// Where a construct's stack counts are asked: the library, and how deep the analysis is.
pub(crate) struct PushFlow<'l> {
    pub library: &'l Library,
    depth: usize,
}

impl<'l> PushFlow<'l> {
    pub(crate) fn new(library: &'l Library) -> Self {
        PushFlow { library, depth: 0 }
    }

    /// The counts of the results of function `name` on operands counted `ins`, one level
    /// deeper.
    pub(crate) fn function(&self, name: &str, ins: &[Pushes]) -> Option<Vec<Pushes>> {
        flow(
            self.library,
            self.library.get(name).ok()?,
            ins,
            self.depth + 1,
        )
    }

    /// The counts of the results of whichever of `names` runs on operands counted `ins`.
    pub(crate) fn branches(&self, names: &[&str], ins: &[Pushes], n: usize) -> Option<Vec<Pushes>> {
        let mut out = vec![Pushes::Unrelated; n];
        for name in names {
            for (o, r) in out.iter_mut().zip(self.function(name, ins)?) {
                *o = o.either(r);
            }
        }
        Some(out)
    }
}
