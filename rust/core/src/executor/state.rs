//! One run's state: frame instances and their iterations, the tokens waiting in input slots,
//! the ready queue. Every method runs under the run's lock; kernels run outside it.
//!
//! A token is a value or *dead* (`None`). A node is ready when all its inputs and control
//! inputs have arrived (a merge: on its first live input, or when every input arrived dead); a
//! node with a dead input produces dead outputs without running. Tokens are tagged by the
//! frame instance and iteration they belong to: `enter` delivers into iteration 0 of the
//! child frame instance (created on the first `enter`), `next_iteration` into the next
//! iteration (started when the frame has fewer than its window of iterations in flight, else
//! deferred), `exit` into the iteration of the parent that created the frame.
//!
//! An iteration is complete when nothing of it is queued or running, no frame it created is
//! still alive, and nothing more can arrive: it is the oldest of its frame, and every `enter`
//! of the frame has delivered. Complete iterations are recycled; a frame whose last iteration
//! completes is removed, which may complete its parent's iteration.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use smallvec::SmallVec;

use super::failure::Failure;
use super::node::{is_heavy, run_node, take_tensors, Outcome, Prepared};
use super::plan::{Plan, Target};
use super::switch::selector_output;
use crate::dataflow::{DfKind, FrameId, Origin};
use crate::error::{Error, Result};
use crate::graph::While;
use crate::ops::execute;
use crate::runtime_values::RtValue;
use crate::tensor::Tensor;

/// A value, or dead.
pub(crate) type Token = Option<RtValue>;

/// A node ready to run in one iteration of one frame instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Task {
    pub node: u32,
    pub frame: u32,
    pub iter: i64,
}

struct IterState {
    pending: Vec<u32>,
    dead: Vec<bool>,
    fired: Vec<bool>,
    slots: Vec<Option<RtValue>>,
    /// Tasks of this iteration queued or running.
    outstanding: u32,
    /// Child frame instances created in this iteration and still alive.
    children: u32,
}

struct FrameState {
    template: FrameId,
    /// The instance and iteration whose `enter` created it (the root's is itself).
    parent: (u32, i64),
    dead: bool,
    enters_pending: usize,
    /// Constant `enter`s that have delivered: each new iteration receives them too.
    invariants: Vec<(u32, Token)>,
    /// Iteration number of `iterations[0]`.
    first: i64,
    iterations: VecDeque<IterState>,
    /// `next_iteration` tokens waiting for the window to admit the next iteration.
    deferred: Vec<(u32, RtValue)>,
}

const ROOT: u32 = 0;

/// The state of one run of a plan.
pub(crate) struct RunState<'p> {
    pub plan: &'p Plan,
    frames: Vec<Option<FrameState>>,
    free_frames: Vec<u32>,
    index: HashMap<(FrameId, u32, i64), u32>,
    /// Recycled iteration states, per frame of the plan.
    spare: Vec<Vec<IterState>>,
    pub ready: VecDeque<Task>,
    results: Vec<Option<Token>>,
    args: Vec<Option<RtValue>>,
    pub error: Option<Error>,
    /// Workers running (the parallel driver's count).
    pub workers: usize,
    /// An op's input tensors, reused by every op run under the lock.
    scratch: Vec<Tensor>,
}

impl<'p> RunState<'p> {
    pub fn new(plan: &'p Plan, args: Vec<RtValue>) -> Self {
        let mut state = RunState {
            plan,
            frames: Vec::new(),
            free_frames: Vec::new(),
            index: HashMap::new(),
            spare: plan.frames.iter().map(|_| Vec::new()).collect(),
            ready: VecDeque::new(),
            results: vec![None; plan.graph.results.len()],
            args: args.into_iter().map(Some).collect(),
            error: None,
            workers: 0,
            scratch: Vec::new(),
        };
        let root = state.new_frame(0, (ROOT, 0), false);
        debug_assert_eq!(root, ROOT);
        for &node in &plan.sources {
            state.enqueue(ROOT, 0, node);
        }
        state
    }

    fn frame(&mut self, inst: u32) -> &mut FrameState {
        match self.frames.get_mut(inst as usize) {
            Some(Some(f)) => f,
            _ => unreachable!("frame instance {inst} is alive while its tokens are"),
        }
    }

    fn iteration(&mut self, inst: u32, iter: i64) -> &mut IterState {
        let frame = self.frame(inst);
        let k = (iter - frame.first) as usize;
        &mut frame.iterations[k]
    }

    fn fresh_iteration(&mut self, template: FrameId) -> IterState {
        let fp = &self.plan.frames[template];
        match self.spare[template].pop() {
            Some(mut it) => {
                it.pending.copy_from_slice(&fp.pending);
                it.dead.fill(false);
                it.fired.fill(false);
                it.slots.iter_mut().for_each(|s| *s = None);
                it.outstanding = 0;
                it.children = 0;
                it
            }
            None => IterState {
                pending: fp.pending.clone(),
                dead: vec![false; fp.pending.len()],
                fired: vec![false; fp.pending.len()],
                slots: (0..fp.slots).map(|_| None).collect(),
                outstanding: 0,
                children: 0,
            },
        }
    }

    fn new_frame(&mut self, template: FrameId, parent: (u32, i64), dead: bool) -> u32 {
        let first = self.fresh_iteration(template);
        let state = FrameState {
            template,
            parent,
            dead,
            enters_pending: self.plan.frames[template].enters,
            invariants: Vec::new(),
            first: 0,
            iterations: VecDeque::from([first]),
            deferred: Vec::new(),
        };
        match self.free_frames.pop() {
            Some(i) => {
                self.frames[i as usize] = Some(state);
                i
            }
            None => {
                self.frames.push(Some(state));
                (self.frames.len() - 1) as u32
            }
        }
    }

    fn enqueue(&mut self, inst: u32, iter: i64, node: u32) {
        self.iteration(inst, iter).outstanding += 1;
        self.ready.push_back(Task {
            node,
            frame: inst,
            iter,
        });
    }

    /// Runs `task` here, under the run's lock, unless it is an op heavy enough to run beside
    /// other work: then its inputs are taken and handed back for `run_node` and `complete`.
    pub fn step(&mut self, task: Task) -> Option<Prepared> {
        let plan = self.plan;
        let np = &plan.nodes[task.node as usize];
        let node = &plan.graph.nodes[task.node as usize];
        let (local, base, n) = (np.local as usize, np.slot_base as usize, node.inputs.len());
        let it = self.iteration(task.frame, task.iter);
        if it.dead[local] {
            it.slots[base..base + n].iter_mut().for_each(|s| *s = None);
            self.complete(task, Outcome::Dead);
            return None;
        }
        match &node.kind {
            DfKind::Identity
            | DfKind::Enter { .. }
            | DfKind::Exit
            | DfKind::NextIteration
            | DfKind::Merge { .. } => {
                let token = it.slots[base].take();
                self.route(task, &node.kind, 0, token);
                self.retire(task, false);
            }
            DfKind::Switch { outputs } => {
                let (value, selector) = (it.slots[base].take(), it.slots[base + 1].take());
                let routed = value
                    .zip(selector)
                    .ok_or_else(|| Error::internal("switch", "an input is missing"))
                    .and_then(|(value, selector)| {
                        selector_output(&selector, *outputs).map(|output| (output, value))
                    });
                match routed {
                    Ok((output, value)) => self.complete(task, Outcome::Routed { output, value }),
                    Err(e) => self.fail(task, e.into()),
                }
            }
            DfKind::Const(c) => {
                self.route(task, &node.kind, 0, Some(RtValue::Tensor(c.0.clone())));
                self.retire(task, false);
            }
            DfKind::Arg(k) => {
                let arg = self.args.get_mut(*k).and_then(Option::take);
                self.route(task, &node.kind, 0, arg);
                self.retire(task, false);
            }
            DfKind::Op(op) => {
                let slots = &mut it.slots[base..base + n];
                let outputs = np.checked.as_ref().map(|c| &c.outputs[..]);
                if is_heavy(
                    op,
                    slots.iter().flatten().filter_map(RtValue::as_tensor),
                    outputs,
                ) {
                    let inputs = slots.iter_mut().filter_map(Option::take).collect();
                    return Some(Prepared { inputs });
                }
                let mut tensors = std::mem::take(&mut self.scratch);
                let slots = &mut self.iteration(task.frame, task.iter).slots[base..base + n];
                let result = take_tensors(slots, &mut tensors).and_then(|()| match &np.checked {
                    Some(c) if tensors.iter().map(Tensor::ty).eq(&c.inputs) => {
                        op.compute_owned(&mut tensors, &c.outputs)
                    }
                    _ => execute(op, &tensors),
                });
                tensors.clear();
                self.scratch = tensors;
                match result {
                    Ok(outs) => {
                        for (k, t) in outs.into_iter().enumerate() {
                            self.route(task, &node.kind, k, Some(RtValue::Tensor(t)));
                        }
                        self.retire(task, false);
                    }
                    Err(e) => self.fail(task, e.into()),
                }
            }
            DfKind::Loop(_) => {
                // A whole loop: run outside the lock (or by the caller, when nothing else is
                // ready).
                let slots = &mut it.slots[base..base + n];
                let inputs = slots.iter_mut().filter_map(Option::take).collect();
                return Some(Prepared { inputs });
            }
            DfKind::NoOp | DfKind::Variable(_) | DfKind::Stack(_) => {
                let slots = &mut it.slots[base..base + n];
                let inputs = slots.iter_mut().filter_map(Option::take).collect();
                match run_node(node, np, Prepared { inputs }) {
                    Ok(outcome) => self.complete(task, outcome),
                    Err(e) => self.fail(task, e),
                }
            }
        }
        None
    }

    /// Delivers what `task` produced, then retires it (which may complete its iteration).
    pub fn complete(&mut self, task: Task, outcome: Outcome) {
        let plan = self.plan;
        let node = &plan.graph.nodes[task.node as usize];
        let np = &plan.nodes[task.node as usize];
        let node_dead = matches!(outcome, Outcome::Dead);
        match outcome {
            Outcome::Dead => {
                for k in 0..np.outputs.len() {
                    self.route(task, &node.kind, k, None);
                }
            }
            Outcome::Values(values) => {
                for (k, v) in values.into_iter().enumerate() {
                    self.route(task, &node.kind, k, Some(v));
                }
            }
            Outcome::Routed { output, value } => {
                let mut value = Some(value);
                for k in 0..np.outputs.len() {
                    let token = if k == output { value.take() } else { None };
                    self.route(task, &node.kind, k, token);
                }
            }
        }
        self.retire(task, node_dead);
    }

    /// Signals the node's control consumers and retires the task.
    fn retire(&mut self, task: Task, dead: bool) {
        let plan = self.plan;
        for &c in &plan.nodes[task.node as usize].control_out {
            self.arrive_control(task.frame, task.iter, c, dead);
        }
        self.iteration(task.frame, task.iter).outstanding -= 1;
        self.try_finish(task.frame);
    }

    /// Sends output `k` of `task`'s node to the iteration its kind delivers to.
    fn route(&mut self, task: Task, kind: &DfKind, k: usize, token: Token) {
        let targets = &self.plan.nodes[task.node as usize].outputs[k];
        if targets.is_empty() {
            return;
        }
        match *kind {
            DfKind::Enter { frame, constant } => {
                let inst = self.enter_frame(frame, task, token.is_none());
                if constant {
                    self.frame(inst).invariants.push((task.node, token.clone()));
                    let (first, len) = {
                        let f = self.frame(inst);
                        (f.first, f.iterations.len() as i64)
                    };
                    for iter in first..first + len {
                        self.send(inst, iter, task.node, 0, token.clone());
                    }
                } else {
                    self.send(inst, 0, task.node, 0, token);
                }
                // The frame's first iteration may have been waiting only for this.
                self.frame(inst).enters_pending -= 1;
                self.try_finish(inst);
            }
            DfKind::Exit => {
                let frame = self.frame(task.frame);
                if token.is_none() && !frame.dead {
                    return; // an iteration that goes on
                }
                let (inst, iter) = frame.parent;
                self.send(inst, iter, task.node, k, token);
            }
            DfKind::NextIteration => {
                let Some(value) = token else {
                    return; // the loop ends in this iteration
                };
                let window = self.plan.frames[self.frame(task.frame).template].window;
                let frame = self.frame(task.frame);
                let next = task.iter + 1;
                let started = frame.first + frame.iterations.len() as i64;
                if next < started {
                    self.send(task.frame, next, task.node, 0, Some(value));
                } else if frame.iterations.len() < window {
                    self.start_iteration(task.frame);
                    self.send(task.frame, next, task.node, 0, Some(value));
                } else {
                    frame.deferred.push((task.node, value));
                }
            }
            _ => self.send(task.frame, task.iter, task.node, k, token),
        }
    }

    /// The child frame instance of `template` that `task`'s iteration enters (created on
    /// the first `enter`; a dead first token makes a dead loop).
    fn enter_frame(&mut self, template: FrameId, task: Task, dead: bool) -> u32 {
        let key = (template, task.frame, task.iter);
        if let Some(&inst) = self.index.get(&key) {
            // A hoisted constant may enter first, live: the loop is dead when any entry is.
            self.frame(inst).dead |= dead;
            return inst;
        }
        let inst = self.new_frame(template, (task.frame, task.iter), dead);
        self.index.insert(key, inst);
        self.iteration(task.frame, task.iter).children += 1;
        inst
    }

    /// Starts the next iteration of a loop frame: the trip before it ran its body.
    fn start_iteration(&mut self, inst: u32) {
        While::count_trips(1);
        let template = self.frame(inst).template;
        let it = self.fresh_iteration(template);
        let frame = self.frame(inst);
        frame.iterations.push_back(it);
        let iter = frame.first + frame.iterations.len() as i64 - 1;
        for k in 0..frame.invariants.len() {
            let (enter, token) = self.frame(inst).invariants[k].clone();
            self.send(inst, iter, enter, 0, token);
        }
    }

    /// Delivers `token` from output `k` of `from` to each of its consumers in `(inst, iter)`:
    /// cloned for all but the last, which takes it.
    fn send(&mut self, inst: u32, iter: i64, from: u32, k: usize, token: Token) {
        let plan = self.plan;
        let targets = &plan.nodes[from as usize].outputs[k];
        let last = targets.len().saturating_sub(1);
        let mut token = Some(token);
        for (i, &target) in targets.iter().enumerate() {
            let t = if i == last {
                token.take().flatten()
            } else {
                token.as_ref().and_then(Clone::clone)
            };
            match target {
                Target::Result(r) => self.results[r as usize] = Some(t),
                Target::Input { node, slot } => self.arrive(inst, iter, node, slot, t),
            }
        }
    }

    fn arrive(&mut self, inst: u32, iter: i64, node: u32, slot: u32, token: Token) {
        let plan = self.plan;
        let np = &plan.nodes[node as usize];
        let (local, base) = (np.local as usize, np.slot_base as usize);
        let kind = &plan.graph.nodes[node as usize].kind;
        let ready = match kind {
            // A dead token ends a loop at its next_iteration; at an exit it only means "not
            // yet", unless the whole loop is dead.
            DfKind::NextIteration if token.is_none() => false,
            DfKind::Exit if token.is_none() && !self.frame(inst).dead => false,
            _ if np.forward => {
                self.forward(inst, iter, node, token);
                false
            }
            DfKind::Merge { loop_merge: true } => {
                let it = self.iteration(inst, iter);
                match token {
                    Some(v) => it.slots[base] = Some(v),
                    None => it.dead[local] = true,
                }
                true
            }
            DfKind::Merge { loop_merge: false } => {
                let it = self.iteration(inst, iter);
                it.pending[local] -= 1;
                if it.fired[local] {
                    false
                } else if let Some(v) = token {
                    it.slots[base] = Some(v);
                    it.fired[local] = true;
                    true
                } else if it.pending[local] == 0 {
                    it.dead[local] = true;
                    it.fired[local] = true;
                    true
                } else {
                    false
                }
            }
            _ => {
                let it = self.iteration(inst, iter);
                if it.fired[local] {
                    return; // fired dead already: later inputs change nothing
                }
                it.pending[local] -= 1;
                let fire = match token {
                    Some(v) => {
                        it.slots[base + slot as usize] = Some(v);
                        it.pending[local] == 0
                    }
                    // Dead on its first dead input: no need to wait for the others.
                    None => {
                        it.dead[local] = true;
                        true
                    }
                };
                it.fired[local] |= fire;
                fire
            }
        };
        if ready {
            self.enqueue(inst, iter, node);
        }
    }

    /// Runs a forwarding node where its token arrives: the token goes on to the iteration the
    /// node's kind delivers to, and its control consumers are signalled. The chain of such
    /// nodes ends at the first node that computes or waits (a loop passes a switch each trip).
    fn forward(&mut self, inst: u32, iter: i64, node: u32, token: Token) {
        let plan = self.plan;
        let task = Task {
            node,
            frame: inst,
            iter,
        };
        let dead = token.is_none();
        self.route(task, &plan.graph.nodes[node as usize].kind, 0, token);
        for &c in &plan.nodes[node as usize].control_out {
            self.arrive_control(inst, iter, c, dead);
        }
    }

    fn arrive_control(&mut self, inst: u32, iter: i64, node: u32, dead: bool) {
        let local = self.plan.nodes[node as usize].local as usize;
        let it = self.iteration(inst, iter);
        if it.fired[local] {
            return;
        }
        it.pending[local] -= 1;
        it.dead[local] |= dead;
        if dead || it.pending[local] == 0 {
            it.fired[local] = true;
            self.enqueue(inst, iter, node);
        }
    }

    /// Retires the complete iterations at the front of `inst`, and the frame with its last.
    fn try_finish(&mut self, mut inst: u32) {
        while inst != ROOT {
            let frame = self.frame(inst);
            let front = &frame.iterations[0];
            if front.outstanding > 0 || front.children > 0 || frame.enters_pending > 0 {
                return;
            }
            let done = frame.iterations.pop_front();
            frame.first += 1;
            let template = frame.template;
            if let Some(done) = done {
                self.spare[template].push(done);
            }
            let frame = self.frame(inst);
            if !frame.deferred.is_empty() {
                let deferred = std::mem::take(&mut frame.deferred);
                let iter = frame.first + frame.iterations.len() as i64;
                self.start_iteration(inst);
                for (node, value) in deferred {
                    self.send(inst, iter, node, 0, Some(value));
                }
            }
            if !self.frame(inst).iterations.is_empty() {
                continue;
            }
            let Some(frame) = self.frames[inst as usize].take() else {
                return;
            };
            self.free_frames.push(inst);
            let (parent, iter) = frame.parent;
            self.index.remove(&(frame.template, parent, iter));
            self.iteration(parent, iter).children -= 1;
            inst = parent;
        }
    }

    /// Records the run's first error with where it happened; nothing more runs.
    pub fn fail(&mut self, task: Task, failure: Failure) {
        if self.error.is_none() {
            let (origin, inner) = match failure.inner {
                Some(inside) => (inside.origin, inside.iterations),
                None => (
                    self.plan.graph.nodes[task.node as usize].origin.clone(),
                    SmallVec::new(),
                ),
            };
            self.error = Some(self.located(failure.error, origin, &inner, task));
        }
        self.ready.clear();
    }

    /// `locate`, with the iterations of `task`'s frames after those of `inner`.
    fn located(
        &mut self,
        e: Error,
        origin: Option<Arc<Origin>>,
        inner: &[i64],
        task: Task,
    ) -> Error {
        let (mut inst, mut iter) = (task.frame, task.iter);
        locate(e, origin, inner, || {
            if inst == ROOT {
                return None;
            }
            let here = iter;
            (inst, iter) = self.frame(inst).parent;
            Some(here)
        })
    }

    /// The results, once the run has no more work.
    pub fn finish(self) -> Result<Vec<RtValue>> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let name = &self.plan.graph.name;
        self.results
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(Some(v)) => Ok(v),
                Some(None) => Err(Error::internal(
                    "executor",
                    format!("@{name}: result {i} is dead"),
                )),
                None => Err(Error::internal(
                    "executor",
                    format!("@{name}: the run stopped before result {i} was computed"),
                )),
            })
            .collect()
    }
}

/// Adds the failing node's site and the sites it was lowered through, with the iteration of
/// each loop, as the interpreter writes them: first the iterations `inner` of the fused loops
/// around the node (innermost first), then those `outer` gives, innermost first.
pub(crate) fn locate(
    mut e: Error,
    origin: Option<Arc<Origin>>,
    inner: &[i64],
    mut outer: impl FnMut() -> Option<i64>,
) -> Error {
    let mut inner = inner.iter().copied();
    let mut at = origin;
    let mut first = true;
    while let Some(o) = at {
        if o.is_loop && !first {
            if let Some(k) = inner.next().or_else(&mut outer) {
                e.message.push_str(&format!("\n  in iteration {k}"));
            }
        }
        e.message.push_str("\n  ");
        e.message.push_str(&o.site);
        first = false;
        at = o.parent.clone();
    }
    e
}
