//! The per-thread runtime state of a front end: the stack of recording tapes (with the stacks
//! set aside by pauses) and the active trace — and the one place that decides, from them, how
//! an op runs: eagerly, traced into a graph, and/or recorded on tapes.
//!
//! The core holds no thread-locals: a front end keeps one `Runtime` per thread (the Python
//! bindings do, in a `thread_local!`) and runs every op through `Runtime::mode`.

use std::sync::Arc;

use crate::batch::{with_levels, LaneSet, Narrowing};
use crate::error::{Error, Result};
use crate::forward::{AccumulatorRef, ForwardContext};
use crate::ops::Context;
use crate::tape::{TapeContext, TapeRef};
use crate::trace::{registry, TraceContext, TracerRef, Val};

/// A stack of tapes, innermost last, shared so that each op takes it with one reference count.
type Tapes = Arc<Vec<TapeRef<Val>>>;

/// Tapes and trace of one thread.
#[derive(Default)]
pub struct Runtime {
    /// Recording tapes, innermost last: shared, so that each op takes the stack with one
    /// reference count instead of a copy (pushes and pops copy it when an op still holds it).
    tapes: Arc<Vec<TapeRef<Val>>>,
    /// When each tape was pushed (`next_level`), beside `tapes`: ascending.
    tape_levels: Vec<u64>,
    /// Tape stacks set aside by `pause`, innermost last, with their levels.
    paused: Vec<(Tapes, Vec<u64>)>,
    /// The trace being built (`begin_trace` .. `end_trace`).
    tracer: Option<TracerRef>,
    /// Forward-mode accumulators, innermost last (shared as `tapes` is), and when each was
    /// pushed.
    accumulators: Arc<Vec<AccumulatorRef<Val>>>,
    accumulator_levels: Vec<u64>,
    /// For each accumulator, the depth of the traced frame it was pushed in (None: pushed
    /// outside a trace). Inside a deeper frame (a branch or loop body) it takes no tangents:
    /// the construct's tangent rule differentiates that frame's function from its nodes, and
    /// tangents built inline there would be differentiated again, once per enclosing construct
    /// (`visible_accumulators`).
    accumulator_frames: Vec<Option<usize>>,
    /// For each accumulator, how many of the tapes were pushed before it: those record its
    /// tangent ops (reverse over forward); the later ones do not (`ForwardContext`).
    tapes_below: Arc<Vec<usize>>,
    /// The level the next tape or accumulator gets: nesting order across both stacks.
    next_level: u64,
    /// Active `vmap` calls' current lanes (one set per level), innermost last.
    batch_levels: Arc<Vec<Arc<LaneSet>>>,
    /// Levels set aside by `suspend_batch_levels`, the latest last.
    suspended_levels: Vec<Arc<Vec<Arc<LaneSet>>>>,
}

/// How an op runs now: the decision `Runtime::mode` makes, carrying what it needs.
pub enum Mode {
    /// Plain kernels over concrete tensors: nothing traces or records.
    Eager,
    /// Through a `TraceContext` (adding nodes when an input is symbolic), recorded on `tapes`,
    /// with tangents on `accumulators`.
    Traced {
        tracer: Option<TracerRef>,
        tapes: Arc<Vec<TapeRef<Val>>>,
        accumulators: Arc<Vec<AccumulatorRef<Val>>>,
        tapes_below: Arc<Vec<usize>>,
        batch_levels: Arc<Vec<Arc<LaneSet>>>,
    },
}

impl Mode {
    /// Runs `f` with the context this mode calls for (`Eager` runs on a `TraceContext` without
    /// a trace, which only executes kernels).
    #[inline]
    pub fn run<T>(self, f: impl FnOnce(&mut dyn Context<Val>) -> Result<T>) -> Result<T> {
        let (tracer, tapes, accumulators, tapes_below, levels) = match self {
            Mode::Eager => (
                None,
                Arc::default(),
                Arc::default(),
                Arc::default(),
                Arc::default(),
            ),
            Mode::Traced {
                tracer,
                tapes,
                accumulators,
                tapes_below,
                batch_levels,
            } => (tracer, tapes, accumulators, tapes_below, batch_levels),
        };
        // Batching contexts go outermost: what they pass on is the batched program, which the
        // tapes record and the accumulators differentiate (`batch`).
        let f = |ctx: &mut dyn Context<Val>| with_levels(&levels, ctx, f);
        let mut base = TraceContext::new(tracer);
        if tapes.is_empty() && accumulators.is_empty() {
            return f(&mut base);
        }
        if accumulators.is_empty() {
            let mut taped = TapeContext {
                inner: &mut base,
                tapes: &tapes,
                registry: registry(),
            };
            return f(&mut taped);
        }
        base.heap_outputs = true;
        let mut ctx = ForwardContext {
            inner: &mut base,
            tapes: &tapes,
            accumulators: &accumulators,
            tapes_below: &tapes_below,
            registry: registry(),
        };
        f(&mut ctx)
    }
}

/// What the thread is doing, as a front end's own constructs need to know it (a `cond` builds a
/// node only while tracing; a compiled function inlines its Python while anything records).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing traces or records.
    Eager,
    /// Tapes record or accumulators take tangents; nothing traces.
    Recording,
    /// A function is being traced (tapes may record too).
    Tracing,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Eager => "eager",
            Phase::Recording => "recording",
            Phase::Tracing => "tracing",
        }
    }
}

impl Runtime {
    /// What the thread is doing now.
    pub fn phase(&self) -> Phase {
        let quiet = self.tapes.is_empty() && self.accumulators.is_empty();
        match (&self.tracer, quiet) {
            (Some(_), _) => Phase::Tracing,
            (None, false) => Phase::Recording,
            (None, true) => Phase::Eager,
        }
    }

    /// How an op over inputs that are all concrete (`all_concrete`) or not runs now.
    pub fn mode(&self, all_concrete: bool) -> Mode {
        if all_concrete && self.phase() == Phase::Eager {
            return Mode::Eager;
        }
        self.traced_mode(self.frame_depth())
    }

    /// How a node runs that closes the innermost traced frame and is emitted into the one
    /// around it (a custom rule's call): the accumulators of that outer frame see it.
    pub fn mode_closing_frame(&self) -> Mode {
        self.traced_mode(self.frame_depth().map(|d| d.saturating_sub(1)))
    }

    fn traced_mode(&self, depth: Option<usize>) -> Mode {
        let (accumulators, tapes_below) = self.visible_accumulators(depth);
        Mode::Traced {
            tracer: self.tracer.clone(),
            tapes: self.tapes.clone(),
            accumulators,
            tapes_below,
            batch_levels: self.batch_levels.clone(),
        }
    }

    /// The active `vmap` levels' current lanes, innermost last.
    pub fn batch_levels(&self) -> &[Arc<LaneSet>] {
        &self.batch_levels
    }

    /// Starts batching level `level` (a `vmap` call) over all its `count` lanes, innermost.
    pub fn push_batch_level(&mut self, level: u64, count: usize) {
        Arc::make_mut(&mut self.batch_levels).push(LaneSet::root(level, count));
    }

    /// Makes `set`'s level active over `set`, innermost (a gradient function of a level that
    /// has ended runs on lanes of it).
    pub fn push_batch_set(&mut self, set: Arc<LaneSet>) {
        Arc::make_mut(&mut self.batch_levels).push(set);
    }

    /// Makes `set` the current lanes of its level, if that level is active.
    pub fn set_batch_set(&mut self, set: Arc<LaneSet>) {
        if let Some(i) = self.batch_levels.iter().rposition(|s| s.level == set.level) {
            Arc::make_mut(&mut self.batch_levels)[i] = set;
        }
    }

    /// Sets every active level aside until `resume_batch_levels` (a custom rule's function is
    /// traced as one lane's).
    pub fn suspend_batch_levels(&mut self) {
        let levels = std::mem::take(&mut self.batch_levels);
        if let Some(t) = &self.tracer {
            crate::trace::lock(t).begin_lane_frames(levels.iter().map(|s| s.level).collect());
        }
        self.suspended_levels.push(levels);
    }

    /// Makes the levels the last `suspend_batch_levels` set aside active again; false when
    /// none were.
    pub fn resume_batch_levels(&mut self) -> bool {
        match self.suspended_levels.pop() {
            Some(levels) => {
                if let Some(t) = &self.tracer {
                    crate::trace::lock(t).end_lane_frames();
                }
                self.batch_levels = levels;
                true
            }
            None => false,
        }
    }

    /// Ends batching level `level`; false when it was not active.
    pub fn pop_batch_level(&mut self, level: u64) -> bool {
        match self.batch_levels.iter().rposition(|s| s.level == level) {
            Some(i) => {
                Arc::make_mut(&mut self.batch_levels).remove(i);
                true
            }
            None => false,
        }
    }

    /// Narrows level `level`'s current lanes by `narrowing` until `widen`; false when the level
    /// is not active.
    /// `shortcut`: the ancestor these lanes are rows of, and those rows (`LaneSet::child_via`).
    pub fn narrow_batch_level(
        &mut self,
        level: u64,
        narrowing: Narrowing,
        shortcut: Option<(Arc<LaneSet>, Val)>,
    ) -> bool {
        match self.batch_levels.iter().rposition(|s| s.level == level) {
            Some(i) => {
                let levels = Arc::make_mut(&mut self.batch_levels);
                levels[i] = LaneSet::child_via(&levels[i], narrowing, shortcut);
                true
            }
            None => false,
        }
    }

    /// Undoes the last `narrow_batch_level` of `level`; false when there is none.
    pub fn widen_batch_level(&mut self, level: u64) -> bool {
        let Some(i) = self.batch_levels.iter().rposition(|s| s.level == level) else {
            return false;
        };
        let Some(parent) = self.batch_levels[i].parent().cloned() else {
            return false;
        };
        Arc::make_mut(&mut self.batch_levels)[i] = parent;
        true
    }

    fn level(&mut self) -> u64 {
        self.next_level += 1;
        self.next_level
    }

    /// Recounts the tapes below each accumulator after either stack changed.
    fn relevel(&mut self) {
        let levels = &self.tape_levels;
        self.tapes_below = Arc::new(
            self.accumulator_levels
                .iter()
                .map(|&a| levels.partition_point(|&t| t < a))
                .collect(),
        );
    }

    /// The forward-mode accumulators that take tangents here, innermost last: the active ones
    /// less those pushed in a traced frame outside the current one.
    pub fn accumulators(&self) -> Arc<Vec<AccumulatorRef<Val>>> {
        self.visible_accumulators(self.frame_depth()).0
    }

    /// The tracer's frame depth now (None outside a trace).
    fn frame_depth(&self) -> Option<usize> {
        self.tracer.as_ref().map(|t| crate::trace::lock(t).depth())
    }

    /// The accumulators that take tangents in a traced frame of `depth` (None: outside a
    /// trace), with their `tapes_below`.
    fn visible_accumulators(
        &self,
        depth: Option<usize>,
    ) -> (Arc<Vec<AccumulatorRef<Val>>>, Arc<Vec<usize>>) {
        let all = || (self.accumulators.clone(), self.tapes_below.clone());
        let Some(shallowest) = self.accumulator_frames.iter().flatten().min() else {
            return all(); // none was pushed while tracing
        };
        let depth = match depth {
            Some(d) if *shallowest < d => d,
            _ => return all(),
        };
        let keep = |k: &usize| self.accumulator_frames[*k].is_none_or(|f| f >= depth);
        let ks: Vec<usize> = (0..self.accumulators.len()).filter(keep).collect();
        let accumulators = ks.iter().map(|&k| self.accumulators[k].clone()).collect();
        let below = ks.iter().map(|&k| self.tapes_below[k]).collect();
        (Arc::new(accumulators), Arc::new(below))
    }

    /// Makes `acc` take tangents: innermost, or back where `pop_accumulator` took it from
    /// (`place`: its index and level).
    pub fn push_accumulator(&mut self, acc: AccumulatorRef<Val>, place: Option<(usize, u64)>) {
        let (at, level) = match place {
            Some((at, level)) => (at.min(self.accumulators.len()), level),
            None => (self.accumulators.len(), self.level()),
        };
        Arc::make_mut(&mut self.accumulators).insert(at, acc);
        self.accumulator_levels.insert(at, level);
        let frame = self.frame_depth();
        self.accumulator_frames.insert(at, frame);
        self.relevel();
    }

    /// Stops `acc` taking tangents, wherever it is in the stack; where it stood (index and
    /// level, for `push_accumulator`), None when it was not active.
    pub fn pop_accumulator(&mut self, acc: &AccumulatorRef<Val>) -> Option<(usize, u64)> {
        let i = self
            .accumulators
            .iter()
            .rposition(|a| Arc::ptr_eq(a, acc))?;
        Arc::make_mut(&mut self.accumulators).remove(i);
        self.accumulator_frames.remove(i);
        let level = self.accumulator_levels.remove(i);
        self.relevel();
        Some((i, level))
    }

    /// The recording tapes, innermost last.
    pub fn tapes(&self) -> &[TapeRef<Val>] {
        &self.tapes
    }

    pub fn push_tape(&mut self, tape: TapeRef<Val>) {
        Arc::make_mut(&mut self.tapes).push(tape);
        let level = self.level();
        self.tape_levels.push(level);
        self.relevel();
    }

    /// Stops `tape` recording, wherever it is in the stack (exits may interleave); false when
    /// it was not recording.
    pub fn pop_tape(&mut self, tape: &TapeRef<Val>) -> bool {
        match self.tapes.iter().rposition(|t| Arc::ptr_eq(t, tape)) {
            Some(i) => {
                Arc::make_mut(&mut self.tapes).remove(i);
                self.tape_levels.remove(i);
                self.relevel();
                true
            }
            None => false,
        }
    }

    /// Sets the recording tapes aside (nothing records) until `resume(token)`.
    pub fn pause(&mut self) -> usize {
        self.pause_above(0)
    }

    /// Sets aside the recording tapes pushed after `level` (those nested inside the tape or
    /// accumulator of that level; all of them for 0) until `resume(token)`.
    pub fn pause_above(&mut self, level: u64) -> usize {
        let keep = self.tape_levels.partition_point(|&l| l <= level);
        let levels = self.tape_levels.split_off(keep);
        let tapes = Arc::make_mut(&mut self.tapes).split_off(keep);
        self.paused.push((Arc::new(tapes), levels));
        self.relevel();
        self.paused.len()
    }

    /// The recording tapes pushed after `level` (nested inside what has that level).
    pub fn tapes_above(&self, level: u64) -> &[TapeRef<Val>] {
        &self.tapes[self.tape_levels.partition_point(|&l| l <= level)..]
    }

    /// Ends the pause `token`, the innermost one; tapes pushed during it stay recording,
    /// innermost.
    pub fn resume(&mut self, token: usize) -> Result<()> {
        if self.paused.len() != token {
            let open = self.paused.len();
            let msg = format!("resume_recording({token}) out of order: {open} pauses are open");
            return Err(Error::invalid("resume_recording", msg));
        }
        let (paused, paused_levels) = self.paused.pop().unwrap_or_default();
        // Merged by level: the tapes set aside may be inner to some that kept recording.
        let mut both: Vec<(u64, TapeRef<Val>)> = paused_levels
            .into_iter()
            .zip(paused.iter().cloned())
            .chain(
                self.tape_levels
                    .iter()
                    .copied()
                    .zip(self.tapes.iter().cloned()),
            )
            .collect();
        both.sort_by_key(|(level, _)| *level);
        self.tape_levels = both.iter().map(|(level, _)| *level).collect();
        self.tapes = Arc::new(both.into_iter().map(|(_, tape)| tape).collect());
        self.relevel();
        Ok(())
    }

    /// The trace being built, if any.
    pub fn tracer(&self) -> Option<&TracerRef> {
        self.tracer.as_ref()
    }

    /// Makes `tracer` the active trace; false (and nothing changes) if one is active.
    pub fn begin_trace(&mut self, tracer: TracerRef) -> bool {
        if self.tracer.is_some() {
            return false;
        }
        self.tracer = Some(tracer);
        true
    }

    /// Ends the active trace, returning it.
    pub fn end_trace(&mut self) -> Option<TracerRef> {
        self.tracer.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::Tape;

    #[test]
    fn pauses_nest_and_tapes_pushed_while_paused_stay_innermost() {
        let mut rt = Runtime::default();
        let (a, b) = (Tape::new_ref(false), Tape::new_ref(false));
        rt.push_tape(a.clone());
        let token = rt.pause();
        assert!(rt.tapes().is_empty());
        assert!(matches!(rt.mode(true), Mode::Eager));
        assert_eq!(rt.phase(), Phase::Eager);
        rt.push_tape(b.clone());
        assert!(rt.resume(token + 1).is_err(), "out of order");
        rt.resume(token).unwrap();
        assert!(Arc::ptr_eq(&rt.tapes()[0], &a) && Arc::ptr_eq(&rt.tapes()[1], &b));
        assert!(rt.pop_tape(&a) && !rt.pop_tape(&a));
        assert!(matches!(rt.mode(true), Mode::Traced { .. }));
        assert_eq!(rt.phase(), Phase::Recording);
    }
}
