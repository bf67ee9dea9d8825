//! Which tiers fused frames run on (the process's mode), and what each tier has done (the
//! process's statistics).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// How fused frames run: compiled to kernel calls on buffers, as machine code, where they can
/// be (`On`, the default), always as register programs (`Off`), or both with their outcomes
/// compared (`Check`: a difference is an internal error; the crate's tests' default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompiledFrames {
    On,
    /// Compiled to kernel calls on buffers, the steps run one by one (no machine code).
    Buffers,
    Off,
    Check,
}

impl CompiledFrames {
    const ALL: [CompiledFrames; 4] = [Self::On, Self::Off, Self::Check, Self::Buffers];

    /// Its name: "on", "buffers", "off" or "check".
    pub fn name(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Buffers => "buffers",
            Self::Off => "off",
            Self::Check => "check",
        }
    }

    /// The mode of that name.
    pub fn from_name(name: &str) -> Option<CompiledFrames> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    fn code(self) -> u8 {
        Self::ALL.iter().position(|&m| m == self).unwrap_or(0) as u8
    }
}

/// `CompiledFrames`' code, or `UNSET` before the first read (`GRADLOOP_COMPILED_FRAMES`, else
/// `On`, or `Check` in the crate's tests, is read then).
static COMPILED_FRAMES: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

/// Sets how fused frames run, for the whole process.
pub fn set_compiled_frames(mode: CompiledFrames) {
    COMPILED_FRAMES.store(mode.code(), Ordering::Relaxed);
}

/// How fused frames run now.
pub fn compiled_frames() -> CompiledFrames {
    let code = COMPILED_FRAMES.load(Ordering::Relaxed);
    if let Some(&mode) = CompiledFrames::ALL.get(usize::from(code)) {
        return mode;
    }
    let default = if cfg!(test) {
        CompiledFrames::Check
    } else {
        CompiledFrames::On
    };
    let mode = std::env::var("GRADLOOP_COMPILED_FRAMES")
        .ok()
        .and_then(|name| CompiledFrames::from_name(name.trim()))
        .unwrap_or(default);
    // A concurrent `set_compiled_frames` wins over the default.
    let _ =
        COMPILED_FRAMES.compare_exchange(UNSET, mode.code(), Ordering::Relaxed, Ordering::Relaxed);
    CompiledFrames::ALL[usize::from(COMPILED_FRAMES.load(Ordering::Relaxed)).min(3)]
}

/// When native code runs elementwise ops as one pass over their lanes (`frame::native::fused`):
/// ops over `from_elements` or more elements, in runs of `min_ops` or more side by side. An op
/// outside such a run is unrolled up to `UNROLL_AT_MOST` elements and calls its kernel past
/// that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedPasses {
    pub from_elements: usize,
    pub min_ops: usize,
}

impl FusedPasses {
    /// Runs of four ops or more (fewer call their kernels, whose vectors are twice as wide)
    /// over eight lanes or more: from there a pass costs less than the ops unrolled one by one,
    /// which store and load every lane between ops (`docs/notes.md`, fused passes).
    pub const DEFAULT: FusedPasses = FusedPasses {
        from_elements: 8,
        min_ops: 4,
    };
}

/// The most elements an op outside a fused run is unrolled over: past that the code grows
/// with the lanes, and a kernel call costs less.
pub const UNROLL_AT_MOST: usize = 64;

static FUSED_FROM_ELEMENTS: AtomicUsize = AtomicUsize::new(FusedPasses::DEFAULT.from_elements);
static FUSED_MIN_OPS: AtomicUsize = AtomicUsize::new(FusedPasses::DEFAULT.min_ops);

/// Sets the thresholds of fused passes for frames compiled from now on, for the whole process:
/// tests lower them so that a few lanes take the passes' code (both at least 2).
pub fn set_fused_passes(passes: FusedPasses) {
    FUSED_FROM_ELEMENTS.store(passes.from_elements.max(2), Ordering::Relaxed);
    FUSED_MIN_OPS.store(passes.min_ops.max(2), Ordering::Relaxed);
}

/// The thresholds of fused passes now.
pub fn fused_passes() -> FusedPasses {
    FusedPasses {
        from_elements: FUSED_FROM_ELEMENTS.load(Ordering::Relaxed),
        min_ops: FUSED_MIN_OPS.load(Ordering::Relaxed),
    }
}

/// How many fused frames an executor has, how many are compiled to kernels on buffers, and how
/// many of those have run as machine code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounts {
    pub total: usize,
    pub compiled: usize,
    pub native: usize,
}

/// The counts of two sets of frames together.
impl std::ops::Add for FrameCounts {
    type Output = FrameCounts;

    fn add(self, other: FrameCounts) -> FrameCounts {
        FrameCounts {
            total: self.total + other.total,
            compiled: self.compiled + other.compiled,
            native: self.native + other.native,
        }
    }
}

/// What the process's fused frames have done since it started: how many were compiled to each
/// tier, and how many runs each tier made (a run of a loop is all its trips). Tools and tests
/// read it to see which tier ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStatistics {
    pub programs_compiled: u64,
    pub buffer_frames_compiled: u64,
    pub native_frames_compiled: u64,
    /// Runs of elementwise ops that native code computes as one pass (`FusedPasses`).
    pub fused_passes_compiled: u64,
    pub program_runs: u64,
    pub buffer_runs: u64,
    pub native_runs: u64,
}

/// The process's counts, one per field of `FrameStatistics`, in its order.
static STATISTICS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// A count of `FrameStatistics`.
#[derive(Clone, Copy)]
pub(crate) enum Statistic {
    ProgramsCompiled,
    BufferFramesCompiled,
    NativeFramesCompiled,
    FusedPassesCompiled,
    ProgramRuns,
    BufferRuns,
    NativeRuns,
}

pub(crate) fn count(statistic: Statistic, n: u64) {
    STATISTICS[statistic as usize].fetch_add(n, Ordering::Relaxed);
}

/// The process's frame statistics now.
pub fn frame_statistics() -> FrameStatistics {
    let read = |s: Statistic| STATISTICS[s as usize].load(Ordering::Relaxed);
    FrameStatistics {
        programs_compiled: read(Statistic::ProgramsCompiled),
        buffer_frames_compiled: read(Statistic::BufferFramesCompiled),
        native_frames_compiled: read(Statistic::NativeFramesCompiled),
        fused_passes_compiled: read(Statistic::FusedPassesCompiled),
        program_runs: read(Statistic::ProgramRuns),
        buffer_runs: read(Statistic::BufferRuns),
        native_runs: read(Statistic::NativeRuns),
    }
}

/// Whether compiled frames run as machine code (`On` and `Check`; not `Buffers`).
pub(crate) fn native_frames() -> bool {
    compiled_frames() != CompiledFrames::Buffers
}
