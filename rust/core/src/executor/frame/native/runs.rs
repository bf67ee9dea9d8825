//! Which steps native code runs as one pass over their lanes (`fused`): runs of elementwise
//! ops over the same many lanes, side by side in the steps (`frame::cluster` put them so), and
//! which of their outputs a step outside the run reads.

use smallvec::SmallVec;

use crate::executor::frame::steps::{BufferAction, BufferStep, Steps};

/// Fewer ops than this call their kernels: 16-byte vectors lose to the kernels' wider ones
/// while the lanes of a few operands stay in the first-level cache (a loop of `x * c + d`
/// over 1,024 float64 lanes: 0.60 µs a trip as one pass, 0.47 as two kernels).
const MIN_RUN: usize = 4;

/// The steps `k..end` when at least `MIN_RUN` from `k` form a run: kernels with one output
/// and an inline form over the same lanes, more than run inline one by one, in one domain.
pub(super) fn run_at(steps: &[BufferStep], k: usize) -> Option<usize> {
    let lanes = |s: &BufferStep| match (&s.action, &s.inline) {
        (BufferAction::Kernel(_), Some(e)) if !e.small() && s.outputs == 1 => {
            Some((e.elements, s.domain))
        }
        _ => None,
    };
    let n = lanes(&steps[k])?;
    let end = k + steps[k..]
        .iter()
        .take_while(|s| lanes(s) == Some(n))
        .count();
    (end - k >= MIN_RUN).then_some(end)
}

/// Per register, how many steps read it (a read or a data register), and whether the frame
/// reads it past its steps (an input, a carried value, a result).
pub(super) fn readers(frame: &Steps) -> Vec<u32> {
    let mut count = vec![0u32; frame.slots.len()];
    for step in &frame.steps {
        let mut regs: SmallVec<[u32; 8]> = step.reads.iter().map(|r| r.reg).collect();
        regs.extend(step.data.iter().copied());
        regs.sort_unstable();
        regs.dedup();
        for r in regs {
            count[r as usize] += 1;
        }
    }
    for &r in frame
        .inputs
        .iter()
        .chain(&frame.carried)
        .chain(&frame.results)
    {
        count[r as usize] = u32::MAX / 2;
    }
    count
}

/// How many of `steps` read register `reg`.
pub(super) fn readers_inside(steps: &[BufferStep], reg: u32) -> u32 {
    steps
        .iter()
        .filter(|s| s.reads.iter().any(|r| r.reg == reg) || s.data.contains(&reg))
        .count() as u32
}
