//! The order of a frame's steps: elementwise ops over many lanes next to each other, so that
//! native code runs each run of them as one pass over the lanes (`native::fused`) instead of a
//! kernel per op, each reading and writing every lane.
//!
//! A batched loop body interleaves such ops with small ones (a stand-in lane picked by a
//! reduction, a gather of one row, constants) and with the frame's moves. The steps are put in
//! a topological order of phases: every other step that can run, then every elementwise op
//! that can run (grouped by domain and lanes), and again. Steps with effects (everything but
//! ops and constants: merges, switches, moves, stacks, variables, nested loops) keep their
//! order among themselves, and every step still follows its inputs and control inputs; a loop
//! merge's read of the previous iteration is no input.
//!
//! A step's domain says when it is live: the switch outputs above it (a branch of a `cond` in
//! the frame runs below one). Steps of one domain whose inputs are live are all live, so native
//! code checks a run's liveness once (`BufferStep::domain`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use smallvec::SmallVec;

use crate::dataflow::DfNode;
use crate::executor::tiers::fused_passes;
use crate::ops::dest::Source;
use crate::ops::Op;
use crate::shape::{numel, DYN};

/// What the order needs of a step.
pub(super) struct Step {
    pub node: u32,
    pub role: Role,
    /// Its input registers, and the nodes it reads as controls.
    pub reads: SmallVec<[u32; 4]>,
    pub controls: SmallVec<[u32; 2]>,
    /// Its output registers: `out..out + outputs`.
    pub out: u32,
    pub outputs: u32,
    /// Its lanes, when it may join a pass (`fused_lanes`).
    pub lanes: Option<usize>,
}

/// What kind of step it is, for the order and the domains.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// An op or a constant: no effect, free to move.
    Pure,
    LoopMerge,
    Merge,
    Switch,
    /// Anything else: kept in order with the other effects.
    Effect,
}

/// Each step's domain, and the order to run `steps` in (indices; `steps` are in a valid order),
/// as the module says.
pub(super) fn cluster(steps: &[Step]) -> (Vec<u32>, Vec<usize>) {
    let domain = domains(steps);
    let n = steps.len();
    let mut producer = HashMap::new();
    let mut step_of_node = HashMap::new();
    for (k, s) in steps.iter().enumerate() {
        for r in s.out..s.out + s.outputs {
            producer.insert(r, k);
        }
        step_of_node.insert(s.node, k);
    }
    let mut waiting = vec![0usize; n];
    let mut unblocks: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut last_effect = None;
    for (k, s) in steps.iter().enumerate() {
        let mut before: Vec<usize> = s
            .reads
            .iter()
            .filter_map(|r| producer.get(r).copied())
            .chain(
                s.controls
                    .iter()
                    .filter_map(|c| step_of_node.get(c).copied()),
            )
            .filter(|&q| q < k)
            .collect();
        if s.role != Role::Pure {
            before.extend(last_effect.replace(k));
        }
        before.sort_unstable();
        before.dedup();
        waiting[k] = before.len();
        for q in before {
            unblocks[q].push(k);
        }
    }
    let lanes: Vec<Option<usize>> = steps.iter().map(|s| s.lanes).collect();
    let mut other: BinaryHeap<Reverse<usize>> = BinaryHeap::new();
    let mut fusable: BinaryHeap<Reverse<(u32, usize, usize)>> = BinaryHeap::new();
    let push = |k: usize,
                other: &mut BinaryHeap<Reverse<usize>>,
                fusable: &mut BinaryHeap<Reverse<(u32, usize, usize)>>| {
        match lanes[k] {
            Some(l) => fusable.push(Reverse((domain[k], l, k))),
            None => other.push(Reverse(k)),
        }
    };
    for k in (0..n).filter(|&k| waiting[k] == 0) {
        push(k, &mut other, &mut fusable);
    }
    let mut order = Vec::with_capacity(n);
    loop {
        let k = if let Some(Reverse(k)) = other.pop() {
            k
        } else if let Some(Reverse((_, _, k))) = fusable.pop() {
            k
        } else {
            break;
        };
        order.push(k);
        for &next in &unblocks[k] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                push(next, &mut other, &mut fusable);
            }
        }
        // While ops are being grouped, the other steps they make ready wait for the group.
        if lanes[k].is_some() {
            while let Some(Reverse((_, _, j))) = fusable.pop() {
                order.push(j);
                for &next in &unblocks[j] {
                    waiting[next] -= 1;
                    if waiting[next] == 0 {
                        push(next, &mut other, &mut fusable);
                    }
                }
            }
        }
    }
    if order.len() != n {
        order = (0..n).collect(); // a cycle cannot happen in a valid order; keep it if it did
    }
    (domain, order)
}

/// Each step's domain, numbered: the switch outputs above it (each a selector and an output),
/// as a path from the frame's own domain (0). A switch's outputs each open a domain below its
/// inputs'; a merge is in the domain its inputs share; any other step is in the deepest of its
/// inputs'.
fn domains(steps: &[Step]) -> Vec<u32> {
    type Path = Vec<(u32, u32)>;
    let mut of_reg: HashMap<u32, Path> = HashMap::new();
    let mut ids: HashMap<Path, u32> = HashMap::from([(Vec::new(), 0)]);
    let mut domain = Vec::with_capacity(steps.len());
    for step in steps {
        let inputs: Vec<&Path> = step.reads.iter().filter_map(|r| of_reg.get(r)).collect();
        let path: Path = match step.role {
            Role::LoopMerge => Vec::new(),
            Role::Merge => inputs
                .split_first()
                .map(|(first, rest)| {
                    let shared = rest.iter().fold(first.len(), |n, p| {
                        n.min(
                            first
                                .iter()
                                .zip(p.iter())
                                .take_while(|(a, b)| a == b)
                                .count(),
                        )
                    });
                    first[..shared].to_vec()
                })
                .unwrap_or_default(),
            _ => inputs
                .iter()
                .max_by_key(|p| p.len())
                .map(|p| p.to_vec())
                .unwrap_or_default(),
        };
        let next = ids.len() as u32;
        domain.push(*ids.entry(path.clone()).or_insert(next));
        for (o, r) in (step.out..step.out + step.outputs).enumerate() {
            let mut out = path.clone();
            // Switches on one selector route their values alike: a loop's, one per value.
            if let (Role::Switch, Some(&selector)) = (step.role, step.reads.get(1)) {
                out.push((selector, o as u32));
            }
            of_reg.insert(r, out);
        }
    }
    domain
}

/// The lanes of `op` at `node` when native code may run it in a pass with its neighbours: one
/// output of a static type over more lanes than run inline, a scalar form, and operands of the
/// output's shape or of one element.
pub(super) fn fused_lanes(op: &Op, node: &DfNode, nodes: &[DfNode]) -> Option<usize> {
    let [out] = node.outputs.as_slice() else {
        return None;
    };
    let out = out.as_tensor()?;
    let lanes = numel(&out.shape);
    if out.shape.contains(&DYN) || lanes < fused_passes().from_elements {
        return None;
    }
    let inputs: Vec<_> = node
        .inputs
        .iter()
        .map(|p| nodes[p.node].outputs.get(p.output)?.as_tensor())
        .collect::<Option<_>>()?;
    let operands_fit = inputs.iter().all(|t| {
        !t.shape.contains(&DYN)
            && matches!(
                Source::of(&t.shape, &out.shape),
                Some(Source::Same | Source::One)
            )
    });
    let form = op.scalar(inputs.last()?.dtype);
    (operands_fit && form.is_some()).then_some(lanes)
}
