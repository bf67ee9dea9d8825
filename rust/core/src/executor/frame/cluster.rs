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

use super::registers::{RegisterAction, RegisterStep};
use crate::dataflow::DfNode;
use crate::ops::dest::Source;
use crate::shape::{numel, DYN};

/// Elementwise ops over at most this many lanes run inline one by one (`Elementwise`).
const FUSED_FROM: usize = 65;

/// Sets each step's domain and reorders `steps` (in a valid order for `nodes`) as the module
/// says.
pub(super) fn cluster(steps: &mut Vec<RegisterStep>, nodes: &[DfNode]) {
    assign_domains(steps);
    let n = steps.len();
    let mut producer = HashMap::new();
    let mut step_of_node = HashMap::new();
    for (k, s) in steps.iter().enumerate() {
        for r in s.out..s.out + s.outputs {
            producer.insert(r, k);
        }
        step_of_node.insert(s.node as u32, k);
    }
    let mut waiting = vec![0usize; n];
    let mut unblocks: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut last_effect = None;
    for (k, s) in steps.iter().enumerate() {
        let mut before: Vec<usize> = s
            .reads
            .iter()
            .filter_map(|r| producer.get(&r.reg).copied())
            .chain(
                s.controls
                    .iter()
                    .filter_map(|c| step_of_node.get(c).copied()),
            )
            .filter(|&q| q < k)
            .collect();
        if !matches!(
            s.action,
            RegisterAction::Op { .. } | RegisterAction::Const(_)
        ) {
            before.extend(last_effect.replace(k));
        }
        before.sort_unstable();
        before.dedup();
        waiting[k] = before.len();
        for q in before {
            unblocks[q].push(k);
        }
    }
    let lanes: Vec<Option<usize>> = steps.iter().map(|s| fused_lanes(s, nodes)).collect();
    let mut other: BinaryHeap<Reverse<usize>> = BinaryHeap::new();
    let mut fusable: BinaryHeap<Reverse<(u32, usize, usize)>> = BinaryHeap::new();
    let push = |k: usize,
                other: &mut BinaryHeap<Reverse<usize>>,
                fusable: &mut BinaryHeap<Reverse<(u32, usize, usize)>>| {
        match lanes[k] {
            Some(l) => fusable.push(Reverse((steps[k].domain, l, k))),
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
    if order.len() != n || order.iter().enumerate().all(|(i, &k)| i == k) {
        return; // a cycle cannot happen in a valid order; keep it as it is if it did
    }
    let mut taken: Vec<Option<RegisterStep>> = steps.drain(..).map(Some).collect();
    steps.extend(order.into_iter().filter_map(|k| taken[k].take()));
}

/// Each step's domain, numbered: the switch outputs above it (each a selector and an output),
/// as a path from the frame's own domain (0). A switch's outputs each open a domain below its
/// inputs'; a merge is in the domain its inputs share; any other step is in the deepest of its
/// inputs'.
fn assign_domains(steps: &mut [RegisterStep]) {
    type Path = Vec<(u32, u32)>;
    let mut of_reg: HashMap<u32, Path> = HashMap::new();
    let mut ids: HashMap<Path, u32> = HashMap::from([(Vec::new(), 0)]);
    for step in steps.iter_mut() {
        let inputs: Vec<&Path> = step
            .reads
            .iter()
            .filter_map(|r| of_reg.get(&r.reg))
            .collect();
        let path: Path = match step.action {
            RegisterAction::LoopMerge => Vec::new(),
            RegisterAction::Merge => inputs
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
        step.domain = *ids.entry(path.clone()).or_insert(next);
        for (o, r) in (step.out..step.out + step.outputs).enumerate() {
            let mut out = path.clone();
            // Switches on one selector route their values alike: a loop's, one per value.
            if let (RegisterAction::Switch(_), Some(selector)) = (&step.action, step.reads.get(1)) {
                out.push((selector.reg, o as u32));
            }
            of_reg.insert(r, out);
        }
    }
}

/// The lanes of `step` when it is an op that native code may run in a pass with its
/// neighbours: one output of a static type over more lanes than run inline, a scalar form,
/// and operands of the output's shape or of one element.
fn fused_lanes(step: &RegisterStep, nodes: &[DfNode]) -> Option<usize> {
    let RegisterAction::Op { op, .. } = &step.action else {
        return None;
    };
    let node = &nodes[step.node];
    let [out] = node.outputs.as_slice() else {
        return None;
    };
    let out = out.as_tensor()?;
    let lanes = numel(&out.shape);
    if out.shape.contains(&DYN) || lanes < FUSED_FROM {
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
