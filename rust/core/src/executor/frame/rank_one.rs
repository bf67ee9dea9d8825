//! Rank-one updates in compiled frames: a step `x + outer(a, b)` whose product (a `MatMul` of
//! an `m`-vector by an `n`-vector, contraction 1) nothing else reads becomes one step that
//! reads (x, a, b) and writes the sum in one pass (`ops::matmul::rank_one_update_into`).
//!
//! This is the gradient of a vector-matrix product accumulated over a loop (`dW += h^T g` in
//! an RNN's backward loop): the product's buffer and the add's second pass over it go away
//! (W6: two per step). The kernel computes what the two ops compute, bit for bit, so the
//! interpreted program and check mode agree.
//!
//! Where the add's other operand (the accumulator) is read for the last time, in its own
//! buffer, the fused step updates that buffer in place (`BufferAction::Update`): the sum needs no
//! second buffer, and one pass over the accumulator's cache lines instead of two.
//!
//! The product's step is removed and its reads move to the add. That is sound when the
//! product is the add's operand at its only read, has no control inputs and is no step's
//! control input, and no step between the two writes a or b, so their buffers hold the same
//! elements at the add. A read of a or b between that was its last becomes a copy, and the
//! add's read takes instead.

use super::registers::{Read, Reg};
use super::steps::{BufferAction, BufferStep, Slot};
use crate::dataflow::{DfKind, DfNode};
use crate::ops::{matmul, Op, OpKind};

/// Rewrites every such pair in `steps` (before `pass_invariants`: each read's data is its own
/// register). `results` are the frame's result registers.
pub(super) fn fuse(steps: &mut Vec<BufferStep>, nodes: &[DfNode], slots: &[Slot], results: &[Reg]) {
    let mut j = 0;
    while j < steps.len() {
        match candidate(steps, j, nodes, slots, results) {
            Some(Fusion {
                product,
                fused,
                taken,
            }) => {
                for (k, q) in taken {
                    steps[k].reads[q].take = false;
                }
                steps[j] = fused;
                steps.remove(product);
                j -= 1; // the add moved down by one
            }
            None => j += 1,
        }
    }
}

/// Turns each fused step whose accumulator is read for the last time, from its own register
/// (not an invariant's buffer, `pass_invariants`), into an in-place update. The kernel takes
/// (a, b) and the output's buffer, which is then the accumulator's.
pub(super) fn update_in_place(steps: &mut [BufferStep], nodes: &[DfNode]) {
    for step in steps.iter_mut() {
        let fused = step.reads.len() == 3 && is_add(&nodes[step.node]);
        let x = step.reads[..].first().copied();
        let own = x.is_some_and(|x| x.take && step.data[0] == x.reg);
        if !fused || !own || !matches!(step.action, BufferAction::Kernel(_)) {
            continue;
        }
        if let BufferAction::Kernel(kernel) =
            std::mem::replace(&mut step.action, BufferAction::NoOp)
        {
            step.action = BufferAction::Update(kernel);
        }
    }
}

/// A product's step to remove, the step that replaces its add, and the reads between that
/// stop being the last of their register.
struct Fusion {
    product: usize,
    fused: BufferStep,
    taken: Vec<(usize, usize)>,
}

/// For the add at step `j`, the fusion of its product into it, if one is sound.
fn candidate(
    steps: &[BufferStep],
    j: usize,
    nodes: &[DfNode],
    slots: &[Slot],
    results: &[Reg],
) -> Option<Fusion> {
    let add = &steps[j];
    if !is_add(&nodes[add.node])
        || !matches!(add.action, BufferAction::Kernel(_))
        || add.reads.len() != 2
    {
        return None;
    }
    let out = slots[add.out as usize].tensor()?;
    (0..2).find_map(|p| {
        let (product, x) = (add.reads[p], add.reads[1 - p]);
        if !product.take || results.contains(&product.reg) {
            return None;
        }
        let i = steps[..j].iter().rposition(|s| s.out == product.reg)?;
        let mm = &steps[i];
        let DfKind::Op(Op::MatMul(_)) = &nodes[mm.node].kind else {
            return None;
        };
        if !matches!(mm.action, BufferAction::Kernel(_)) || mm.outputs != 1 || mm.reads.len() != 2 {
            return None;
        }
        let (a, b) = (mm.reads[0], mm.reads[1]);
        let regs = [x.reg, a.reg, b.reg];
        let distinct = regs[0] != regs[1] && regs[0] != regs[2] && regs[1] != regs[2];
        let (ta, tb) = (
            slots[a.reg as usize].tensor()?,
            slots[b.reg as usize].tensor()?,
        );
        let (m, n) = (*out.shape.first()?, *out.shape.get(1)?);
        // a: [m, k] or [k, m] with m * k elements, b likewise: m and n elements mean k = 1,
        // and the elements of a vector are in order whichever axis is 1.
        let outer = out.ndim() == 2
            && ta.ndim() == 2
            && tb.ndim() == 2
            && ta.shape.iter().product::<usize>() == m
            && tb.shape.iter().product::<usize>() == n;
        let same_types = slots[x.reg as usize].tensor() == Some(out)
            && slots[product.reg as usize].tensor() == Some(out)
            && ta.dtype == out.dtype
            && tb.dtype == out.dtype;
        if !distinct || !outer || !same_types || !mm.controls.is_empty() {
            return None;
        }
        // Nothing reads the product elsewhere, waits on its node, or writes a or b between.
        let others_read = steps.iter().enumerate().any(|(k, s)| {
            (k != j && s.reads.iter().any(|r| r.reg == product.reg))
                || s.controls.contains(&(mm.node as u32))
        });
        let written = steps[i + 1..j]
            .iter()
            .any(|s| (s.out..s.out + s.outputs).any(|r| r == a.reg || r == b.reg));
        if others_read || written {
            return None;
        }
        // A read of a or b between that was the last becomes a copy: the add's is now last.
        let mut taken = Vec::new();
        for (k, s) in steps.iter().enumerate().take(j).skip(i + 1) {
            for (q, r) in s.reads.iter().enumerate() {
                if r.take && (r.reg == a.reg || r.reg == b.reg) {
                    taken.push((k, q));
                }
            }
        }
        let kernel = matmul::rank_one_update_into(out.dtype, m, n, p == 0)?;
        let last = |r: Read| Read {
            take: r.take || taken.iter().any(|&(k, q)| steps[k].reads[q].reg == r.reg),
            ..r
        };
        let reads: smallvec::SmallVec<[_; 4]> = [x, last(a), last(b)].into_iter().collect();
        let fused = BufferStep {
            node: add.node,
            action: BufferAction::Kernel(kernel),
            data: reads.iter().map(|r| r.reg).collect(),
            reads,
            controls: add.controls.clone(),
            out: add.out,
            outputs: 1,
            in_place: 0,
            inline: None,
            lane_map: None,
            domain: add.domain,
        };
        Some(Fusion {
            product: i,
            fused,
            taken,
        })
    })
}

fn is_add(node: &DfNode) -> bool {
    matches!(&node.kind, DfKind::Op(op) if op.kind() == OpKind::Add)
}
