//! `elide_discarded_stand_ins`: a batched loop's trip, traced at static shapes, runs its body
//! on every lane, a finished lane on a copy of a running one (a stand-in,
//! `batch::stand_in_copies`: `where(live, x, stop_gradient(take(x, first)))`), so that no value
//! it would compute (an error, a NaN that a gradient would multiply by zero) can reach a result.
//! Where the copy feeds nothing but ops that cannot fail, each lane by lane, into selects that
//! keep the running lanes (`where(live, new, old)`), a finished lane's own values are as good:
//! what it computes is discarded, and no error can come of it. The select of the copy is then
//! bypassed; the copy, and the search for the running lane, are no longer needed and do not
//! run. A gradient's forward pass keeps its stand-ins: they reach the stacks it saves.

use std::collections::{HashMap, HashSet};

use crate::emit::ScalarForm;
use crate::error::Result;
use crate::graph::{Function, Graph, Library, NodeKind, Port};
use crate::ops::Op;
use crate::shape::DYN;

/// `graph` with every stand-in whose lanes are discarded (see the module doc) bypassed.
pub fn elide_discarded_stand_ins(graph: &Graph) -> Result<Graph> {
    let mut library = Library::new();
    for f in graph.library.iter() {
        library.add(elided(f))?;
    }
    Graph::new(library, graph.entry.clone())
}

fn elided(f: &Function) -> Function {
    let users = users(f);
    let bypass: HashMap<Port, Port> = (0..f.nodes.len())
        .filter_map(|w| {
            let (mask, x) = stand_in(f, w)?;
            let out = Port { node: w, output: 0 };
            let lanes = tensor_shape(f, out)?.first().copied()?;
            let mask = lane_mask(f, mask, lanes)?;
            discarded(f, &users, out, mask).then_some((out, x))
        })
        .collect();
    let mut f = f.clone();
    if bypass.is_empty() {
        return f;
    }
    for node in &mut f.nodes {
        for p in &mut node.inputs {
            if let Some(&x) = bypass.get(p) {
                *p = x;
            }
        }
    }
    f
}

fn op(f: &Function, p: Port) -> Option<&Op> {
    match &f.nodes[p.node].kind {
        NodeKind::Op(op) => Some(op),
        _ => None,
    }
}

/// Node `w` as a stand-in `where(mask, x, stop_gradient(take(x, first)))`: `(mask, x)`.
fn stand_in(f: &Function, w: usize) -> Option<(Port, Port)> {
    let node = &f.nodes[w];
    let (NodeKind::Op(Op::Select(_)), [mask, x, copy]) = (&node.kind, node.inputs.as_slice())
    else {
        return None;
    };
    let Some(Op::StopGradient(_)) = op(f, *copy) else {
        return None;
    };
    let taken = f.nodes[copy.node].inputs.first()?;
    let Some(Op::Take(take)) = op(f, *taken) else {
        return None;
    };
    (take.axis == 0 && f.nodes[taken.node].inputs.first() == Some(x)).then_some((*mask, *x))
}

fn tensor_shape(f: &Function, p: Port) -> Option<&[usize]> {
    let t = f.nodes[p.node].outputs[p.output].as_tensor()?;
    (!t.shape.contains(&DYN)).then_some(t.shape.as_slice())
}

/// The bool over `lanes` lanes that `mask` reshapes to select along axis 0 (a select
/// broadcasts it over a value's other axes), if it is one.
fn lane_mask(f: &Function, mut mask: Port, lanes: usize) -> Option<Port> {
    let along_lanes =
        |shape: &[usize]| shape.first() == Some(&lanes) && shape[1..].iter().all(|&d| d == 1);
    if !along_lanes(tensor_shape(f, mask)?) {
        return None;
    }
    while let Some(Op::Reshape(_)) = op(f, mask) {
        mask = f.nodes[mask.node].inputs[0];
    }
    (tensor_shape(f, mask)? == [lanes]).then_some(mask)
}

/// Per port, the (node, input position) pairs that read it.
fn users(f: &Function) -> HashMap<Port, Vec<(usize, usize)>> {
    let mut users: HashMap<Port, Vec<(usize, usize)>> = HashMap::new();
    for (n, node) in f.nodes.iter().enumerate() {
        for (i, &p) in node.inputs.iter().enumerate() {
            users.entry(p).or_default().push((n, i));
        }
    }
    users
}

/// Whether everything computed from `start` (a value over lanes along axis 0) reaches only
/// selects on `mask`'s lanes, as the value they keep there, through ops that cannot fail and
/// compute each lane from that lane alone.
fn discarded(
    f: &Function,
    users: &HashMap<Port, Vec<(usize, usize)>>,
    start: Port,
    mask: Port,
) -> bool {
    if f.results.contains(&start) {
        return false;
    }
    let mut todo = vec![start];
    let mut seen = HashSet::from([start]);
    while let Some(p) = todo.pop() {
        let Some(shape) = tensor_shape(f, p) else {
            return false;
        };
        for &(n, i) in users.get(&p).map_or(&[][..], Vec::as_slice) {
            let node = &f.nodes[n];
            let NodeKind::Op(op) = &node.kind else {
                return false;
            };
            let out = Port { node: n, output: 0 };
            if matches!(op, Op::Select(_))
                && i == 1
                && shape.first().and_then(|&l| lane_mask(f, node.inputs[0], l)) == Some(mask)
                && tensor_shape(f, out) == Some(shape)
            {
                if node.inputs[0] == p || node.inputs[2] == p {
                    return false;
                }
                continue;
            }
            if !lane_by_lane(f, op, &node.inputs, node.outputs.as_slice(), shape) {
                return false;
            }
            if f.results.contains(&out) {
                return false;
            }
            if seen.insert(out) {
                todo.push(out);
            }
        }
    }
    true
}

/// Whether `op` (read on a value of `shape`) computes each lane from that lane alone and
/// cannot fail: an op with a scalar form (`OpDef::scalar`: one output, elementwise, no error)
/// that cannot trap, whose output has `shape` and whose operands have it or one element.
fn lane_by_lane(
    f: &Function,
    op: &Op,
    inputs: &[Port],
    outputs: &[crate::graph::ValueType],
    shape: &[usize],
) -> bool {
    let [out] = outputs else {
        return false;
    };
    let Some(out) = out.as_tensor().filter(|t| t.shape.as_slice() == shape) else {
        return false;
    };
    let operands: Option<Vec<_>> = inputs
        .iter()
        .map(|p| f.nodes[p.node].outputs[p.output].as_tensor())
        .collect();
    let Some(operands) = operands else {
        return false;
    };
    let fits = operands
        .iter()
        .all(|t| t.shape == out.shape || t.shape.iter().product::<usize>() == 1);
    let form = operands.last().and_then(|last| op.scalar(last.dtype));
    fits && form.is_some_and(|form| !traps(&form))
}

/// Whether a scalar form may trap on a lane's own values (an integer divided by zero, which a
/// compiled target need not guard) rather than give a value the select discards.
fn traps(form: &ScalarForm) -> bool {
    const INTEGER_DIVISIONS: [&str; 6] = [
        "arith.divsi",
        "arith.divui",
        "arith.remsi",
        "arith.remui",
        "arith.floordivsi",
        "arith.ceildivsi",
    ];
    matches!(form, ScalarForm::Op(m) if INTEGER_DIVISIONS.contains(m))
}
