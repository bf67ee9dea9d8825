//! Which steps native code runs as one pass over their lanes (`fused`): runs of elementwise
//! ops over the same many lanes, side by side in the steps (`frame::cluster` put them so), and
//! which of their outputs a step outside the run reads.

use smallvec::SmallVec;

use crate::executor::frame::steps::{BufferAction, BufferStep, Steps};
use crate::executor::tiers::fused_passes;

/// The steps `k..end` when at least `FusedPasses::min_ops` from `k` form a run: kernels with one output
/// and an inline form over the same lanes, more than run inline one by one, in one domain.
pub(super) fn run_at(steps: &[BufferStep], k: usize) -> Option<usize> {
    let lanes = |s: &BufferStep| match (&s.action, &s.inline) {
        (BufferAction::Kernel(_), Some(e)) if e.fuses() && s.outputs == 1 => {
            Some((e.elements, s.domain))
        }
        _ => None,
    };
    let n = lanes(&steps[k])?;
    let end = k + steps[k..]
        .iter()
        .take_while(|s| lanes(s) == Some(n))
        .count();
    (end - k >= fused_passes().min_ops).then_some(end)
}

/// How many runs `steps` holds.
pub(super) fn count(steps: &[BufferStep]) -> usize {
    let (mut runs, mut k) = (0, 0);
    while k < steps.len() {
        match run_at(steps, k) {
            Some(end) => (runs, k) = (runs + 1, end),
            None => k += 1,
        }
    }
    runs
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
