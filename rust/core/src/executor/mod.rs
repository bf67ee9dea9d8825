//! The frame executor: runs a lowered dataflow graph (`crate::dataflow`) lazily, with dead
//! tokens for untaken branches, a frame per loop instance and up to `parallel_iterations`
//! iterations of a loop in flight, on a pool of threads.
//!
//! ```text
//!   Executor::new(graph)      lower once, plan once (`plan`: what is needed, where it goes)
//!   executor.run(args)        per-run state (`state`): frames, iterations, tokens, ready queue
//!     worker: take a ready node, run it (`kernel`), deliver its outputs, retire it
//!       light node (control primitives, small ops): run under the run's lock, inline
//!       heavy node (large ops): run outside the lock; when more work is ready and a thread
//!       is free, another worker starts first
//! ```
//!
//! Only what the results and side effects need runs (the plan prunes the rest), so an op in
//! an untaken branch or one nothing fetches never runs and never fails. The first error
//! cancels the run and names the node, the functions and loop iterations it sits in, and the
//! user's source line, as the interpreter does. Values move along edges and are cloned only
//! for a second consumer, so a stack threaded through a loop is pushed in place; its pushes
//! are ordered by the data dependence from one iteration to the next.
//!
//! Threads: `GRADLOOP_NUM_THREADS` when set, else rayon's pool size (the machine's cores).

mod checked;
mod failure;
mod frame;
mod kernel;
mod node;
mod plan;
mod state;
mod switch;
mod tiers;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use failure::Failure;
use frame::{FusedLoop, FusedLoops};
pub use kernel::{input_reader, Kernel};
use node::{is_cheap, run_node, Outcome, Prepared};
use plan::Plan;
use state::{locate, RunState, Task};
pub use tiers::{
    compiled_frames, frame_statistics, fused_passes, set_compiled_frames, set_fused_passes,
    CompiledFrames, FrameCounts, FrameStatistics, FusedPasses,
};

use crate::dataflow::{fuse_frames, fuse_root, lower, DataflowGraph, DfKind};
use crate::error::Result;
use crate::graph::Graph;
use crate::interpret::check_params;
use crate::passes;
use crate::runtime_values::RtValue;

/// How many threads runs use: `GRADLOOP_NUM_THREADS`, else rayon's pool size.
pub fn default_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("GRADLOOP_NUM_THREADS")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| n >= 1)
            .unwrap_or_else(rayon::current_num_threads)
    })
}

/// The passes a graph goes through before it is lowered: constants folded (an op that would
/// fail is left to fail only if it runs), branches on constants replaced by calls, repeated
/// pure nodes merged, batched loops' stand-ins bypassed where their lanes are discarded. Each
/// keeps the lazy semantics and is verified.
pub fn optimize(graph: &Graph) -> Result<Graph> {
    let graph = passes::fold_constants(graph)?;
    let graph = passes::eliminate_dead_branches(&graph)?;
    let graph = passes::eliminate_common_subexpressions(&graph)?;
    passes::elide_discarded_stand_ins(&graph)
}

/// A lowered graph, planned and ready to run any number of times (from any thread).
#[derive(Debug)]
pub struct Executor {
    plan: Plan,
    /// The whole graph as one fused frame, when every node it needs is cheap (fused loops
    /// included): a run is one pass on the calling thread.
    root: Option<FusedLoop>,
    threads: usize,
}

/// How loops run: fused into sequential programs where every node is cheap (the default),
/// or always as frames of tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loops {
    Fused,
    Frames,
}

impl Executor {
    /// Simplifies `graph` (`optimize`), lowers its entry and plans it; loops of cheap nodes
    /// are fused.
    pub fn new(graph: &Graph) -> Result<Executor> {
        Executor::with_loops(graph, Loops::Fused)
    }

    /// `new`, choosing how loops run. Fused, a graph whose every node is cheap runs as one
    /// program too.
    pub fn with_loops(graph: &Graph, loops: Loops) -> Result<Executor> {
        let lowered = lower(&optimize(graph)?)?;
        match loops {
            Loops::Fused => {
                let fused = fuse_frames(&lowered, is_cheap)?;
                // The root and the plan share each loop: compiled once.
                let mut loops = FusedLoops::default();
                let root = match fuse_root(&fused, is_cheap) {
                    Some(frame) => Some(FusedLoop::compile(&Arc::new(frame), &mut loops)?),
                    None => None,
                };
                Ok(Executor {
                    plan: Plan::build(fused, &mut loops)?,
                    root,
                    threads: default_threads(),
                })
            }
            Loops::Frames => Executor::from_dataflow(lowered),
        }
    }

    /// Plans an already lowered graph (run with tokens: nothing more is fused).
    pub fn from_dataflow(graph: DataflowGraph) -> Result<Executor> {
        Ok(Executor {
            plan: Plan::build(graph, &mut FusedLoops::default())?,
            root: None,
            threads: default_threads(),
        })
    }

    /// Whether a run is one pass of a program (every node cheap) rather than tokens.
    pub fn is_one_program(&self) -> bool {
        self.root.is_some()
    }

    /// Its fused frames: the root, else the fused loops (the root holds the loops the plan's
    /// nodes also hold).
    pub(super) fn fused_loops(&self) -> Box<dyn Iterator<Item = &FusedLoop> + '_> {
        match &self.root {
            Some(root) => Box::new(std::iter::once(root)),
            None => Box::new(self.plan.nodes.iter().filter_map(|n| n.fused.as_deref())),
        }
    }

    /// How many fused frames it has (the root's, fused loops' and the loops nested in them),
    /// how many of them are compiled to kernels on buffers, and how many of those have run as
    /// machine code (made at a frame's first run).
    pub fn frame_counts(&self) -> FrameCounts {
        self.fused_loops()
            .map(FusedLoop::frame_counts)
            .fold(FrameCounts::default(), |a, b| a + b)
    }

    /// The same executor running on at most `threads` threads (1: on the calling thread).
    pub fn with_threads(mut self, threads: usize) -> Executor {
        self.threads = threads.max(1);
        self
    }

    /// The lowered graph it runs.
    pub fn graph(&self) -> &DataflowGraph {
        &self.plan.graph
    }

    /// Runs the graph on `args` (checked against its parameters); returns its results.
    pub fn run(&self, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
        // Memory that ran out in the executor's own bookkeeping (its kernels check their own).
        crate::memory::checked(&self.plan.graph.name, self.run_unchecked(args))
    }

    fn run_unchecked(&self, args: Vec<RtValue>) -> Result<Vec<RtValue>> {
        let g = &self.plan.graph;
        check_params(&g.name, &g.params, &args)?;
        if let Some(root) = &self.root {
            return match root.run(args.into()) {
                Ok(results) => Ok(results.into_vec()),
                Err(Failure { error, inner }) => {
                    let inside = inner.unwrap_or_default();
                    Err(locate(error, inside.origin, &inside.iterations, || None))
                }
            };
        }
        let mut state = RunState::new(&self.plan, args);
        if self.threads <= 1 {
            drain(&mut state);
            return state.finish();
        }
        // Light work stays on the calling thread; the first heavy node moves the run onto
        // rayon's pool, where the kernels' own parallel loops can share the threads.
        let Some(first) = drain_light(&mut state) else {
            return state.finish();
        };
        let shared = Mutex::new(state);
        shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .workers = 1;
        rayon::scope(|scope| worker(&shared, self.threads, scope, Some(first)));
        let state = shared.into_inner().unwrap_or_else(PoisonError::into_inner);
        state.finish()
    }
}

/// Runs ready light nodes on this thread until none is left, or returns the first heavy one.
/// A fused loop with nothing else ready runs here too: no other thread could help.
fn drain_light(state: &mut RunState<'_>) -> Option<(Task, Prepared)> {
    while let Some(task) = state.ready.pop_front() {
        if let Some(heavy) = state.step(task) {
            let plan = state.plan;
            let node = &plan.graph.nodes[task.node as usize];
            if matches!(node.kind, DfKind::Loop(_)) && state.ready.is_empty() {
                let np = &plan.nodes[task.node as usize];
                settle(state, task, run_node(node, np, heavy));
                continue;
            }
            return Some((task, heavy));
        }
    }
    None
}

/// Runs every ready node on this thread until none is left.
fn drain(state: &mut RunState<'_>) {
    while let Some(task) = state.ready.pop_front() {
        let plan = state.plan;
        if let Some(heavy) = state.step(task) {
            let (node, np) = (
                &plan.graph.nodes[task.node as usize],
                &plan.nodes[task.node as usize],
            );
            settle(state, task, run_node(node, np, heavy));
        }
    }
}

fn settle(state: &mut RunState<'_>, task: Task, outcome: Result<Outcome, Failure>) {
    match outcome {
        Ok(outcome) => state.complete(task, outcome),
        Err(e) => state.fail(task, e),
    }
}

/// One thread's share of a run: light nodes under the lock, heavy ones outside it, starting
/// another worker first when more is ready and a thread is free.
fn worker<'s>(
    shared: &'s Mutex<RunState<'_>>,
    threads: usize,
    scope: &rayon::Scope<'s>,
    mut first: Option<(Task, Prepared)>,
) {
    let lock = || shared.lock().unwrap_or_else(PoisonError::into_inner);
    let mut state = lock();
    loop {
        let (task, heavy) = match first.take() {
            Some(pending) => pending,
            None => {
                let Some(task) = state.ready.pop_front() else {
                    break;
                };
                match state.step(task) {
                    Some(heavy) => (task, heavy),
                    None => continue,
                }
            }
        };
        let plan = state.plan;
        let (node, np) = (
            &plan.graph.nodes[task.node as usize],
            &plan.nodes[task.node as usize],
        );
        if !state.ready.is_empty() && state.workers < threads {
            state.workers += 1;
            scope.spawn(move |s| worker(shared, threads, s, None));
        }
        drop(state);
        let outcome = run_node(node, np, heavy);
        state = lock();
        if state.error.is_some() {
            break;
        }
        settle(&mut state, task, outcome);
    }
    state.workers -= 1;
}
