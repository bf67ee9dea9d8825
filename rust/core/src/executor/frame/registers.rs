//! A fused loop (`DfKind::Loop`, from `dataflow::fuse_frames`) compiled to a register
//! program: each node's outputs live in registers, a dead value is an empty register, and one
//! iteration runs the nodes in their fixed order.
//!
//! ```text
//!   registers ← the loop's inputs (an invariant's register is only ever cloned)
//!   for iteration 0, 1, ...:
//!     each step: dead if a control input is dead or (not a merge) an input is empty;
//!                else read (the last reader of a register takes its value), run, write
//!     stop when every next_iteration is empty
//!   outputs ← the exits' registers
//! ```
//!
//! Reading a value at its last use moves it, so an elementwise op writes into its input's
//! buffer, and a stack threaded through the loop is pushed in place. No queue, lock or
//! allocation per token: the cost per node is a match and the kernel.

use std::sync::Arc;

use smallvec::SmallVec;

use super::cluster::{cluster, fused_lanes, Role, Step};
use crate::dataflow::{DfKind, DfNode, FusedFrame};
use crate::error::{Error, Result};
use crate::executor::checked::{checked_types, CheckedTypes};
use crate::executor::failure::Failure;
use crate::executor::kernel::Kernel;
use crate::executor::switch::selector_output;
use crate::executor::tiers::{count, Statistic};
use crate::graph::While;
use crate::ops::{execute, Op};
use crate::runtime_values::RtValue;
use crate::shape::DYN;
use crate::tensor::Tensor;

pub(crate) type Reg = u32;

/// One input of a step: the register, and whether this is its last read in an iteration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read {
    pub reg: Reg,
    pub take: bool,
}

#[derive(Debug)]
pub(super) enum RegisterAction {
    Const(Tensor),
    /// Identity, exit, next_iteration: the input unchanged.
    Pass,
    /// A loop's merge: the entry in iteration 0, then what `next_iteration` carried.
    LoopMerge,
    /// A branch merge: its first live input.
    Merge,
    Switch(usize),
    /// An op, with its static types when they are known. `trusted`: its inputs always have
    /// exactly those types (see `Program::compile`), so they are not compared at run time.
    Op {
        op: Op,
        checked: Option<Box<CheckedTypes>>,
        trusted: bool,
    },
    /// A node run through `Kernel` (variables and stacks).
    Kernel,
    NoOp,
    Loop(Arc<dyn NestedLoop>),
}

/// A loop nested in a frame, run whole by one step (a `FusedLoop`, which picks its own tier).
pub(crate) trait NestedLoop: Send + Sync + std::fmt::Debug {
    fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>, Failure>;
}

#[derive(Debug)]
pub(super) struct RegisterStep {
    /// The inner node it runs (for its kind and origin).
    pub node: usize,
    pub action: RegisterAction,
    pub reads: SmallVec<[Read; 4]>,
    /// Inner nodes whose death makes this step dead.
    pub controls: SmallVec<[u32; 2]>,
    /// First output register; the node's outputs are consecutive.
    pub out: Reg,
    pub outputs: u32,
    /// Steps of one domain are live together when their inputs are (`cluster`).
    pub domain: u32,
}

/// A compiled fused loop, shared by every run of the plan.
#[derive(Debug)]
pub(crate) struct Program {
    fused: Arc<FusedFrame>,
    steps: Vec<RegisterStep>,
    registers: usize,
    /// Per input: its register, and whether it is an invariant.
    inputs: Vec<(Reg, bool)>,
    /// The registers `next_iteration` writes: the loop goes on while one is full.
    carried: Vec<Reg>,
    /// The registers of the results (a loop's exits), one per output.
    results: Vec<Reg>,
}

/// Compiles the loops nested in a frame (each once: see `FusedLoops`).
pub(super) type CompileNested<'a> = dyn FnMut(&Arc<FusedFrame>) -> Result<Arc<dyn NestedLoop>> + 'a;

impl Program {
    /// Compiles `fused`; its nested loops come from `nested`.
    pub fn compile(fused: &Arc<FusedFrame>, nested: &mut CompileNested<'_>) -> Result<Program> {
        let nodes = &fused.nodes;
        let mut first = Vec::with_capacity(nodes.len());
        let mut registers = 0u32;
        for node in nodes {
            first.push(registers);
            registers += node.outputs.len() as u32;
        }
        let args = fused.invariant.len();
        let reg = |p: &crate::graph::Port| first[p.node] + p.output as u32;
        let mut steps = Vec::with_capacity(nodes.len() - args);
        for (id, node) in nodes.iter().enumerate().skip(args) {
            let action = match &node.kind {
                DfKind::Const(c) => RegisterAction::Const(c.0.clone()),
                DfKind::Identity | DfKind::Exit | DfKind::NextIteration => RegisterAction::Pass,
                DfKind::Merge { loop_merge: true } => RegisterAction::LoopMerge,
                DfKind::Merge { loop_merge: false } => RegisterAction::Merge,
                DfKind::Switch { outputs } => RegisterAction::Switch(*outputs),
                DfKind::Op(op) => RegisterAction::Op {
                    op: op.clone(),
                    checked: checked_types(nodes, id),
                    trusted: false,
                },
                DfKind::Variable(_) | DfKind::Stack(_) => RegisterAction::Kernel,
                DfKind::NoOp => RegisterAction::NoOp,
                DfKind::Loop(inner) => RegisterAction::Loop(nested(inner)?),
                DfKind::Arg(_) | DfKind::Enter { .. } => {
                    let msg = format!("a fused loop holds {} %{id}", node.kind.name());
                    return Err(Error::internal("executor", msg));
                }
            };
            steps.push(RegisterStep {
                node: id,
                action,
                reads: node
                    .inputs
                    .iter()
                    .map(|p| Read {
                        reg: reg(p),
                        take: false,
                    })
                    .collect(),
                controls: node.control_inputs.iter().map(|&c| c as u32).collect(),
                out: first[id],
                outputs: node.outputs.len() as u32,
                domain: 0,
            });
        }
        order_steps(&mut steps, nodes);
        let results: Vec<Reg> = fused.results.iter().map(reg).collect();
        // The last read of a register in an iteration takes it; an invariant's is kept, and
        // so is a result's (read once the pass is over).
        let invariant: Vec<Reg> = (0..args)
            .filter(|&k| fused.invariant[k])
            .map(|k| first[k])
            .chain(results.iter().copied())
            .collect();
        let mut seen = vec![false; registers as usize];
        for step in steps.iter_mut().rev() {
            for read in step.reads.iter_mut().rev() {
                let r = read.reg as usize;
                read.take = !seen[r] && !invariant.contains(&read.reg);
                seen[r] = true;
            }
        }
        trust(&mut steps, nodes, registers as usize, args);
        let of_kind = |f: fn(&DfKind) -> bool| -> Vec<Reg> {
            steps
                .iter()
                .filter(|s| f(&nodes[s.node].kind))
                .map(|s| s.out)
                .collect()
        };
        let carried = of_kind(|k| matches!(k, DfKind::NextIteration));
        count(Statistic::ProgramsCompiled, 1);
        Ok(Program {
            fused: fused.clone(),
            steps,
            registers: registers as usize,
            inputs: (0..args).map(|k| (first[k], fused.invariant[k])).collect(),
            carried,
            results,
        })
    }

    pub(super) fn fused(&self) -> &Arc<FusedFrame> {
        &self.fused
    }

    pub(super) fn steps(&self) -> &[RegisterStep] {
        &self.steps
    }

    pub(super) fn inputs(&self) -> &[(Reg, bool)] {
        &self.inputs
    }

    pub(super) fn carried(&self) -> &[Reg] {
        &self.carried
    }

    pub(super) fn results(&self) -> &[Reg] {
        &self.results
    }

    /// Runs the loop (or the root's one pass) on `inputs` (all live); returns its results.
    pub fn run(&self, inputs: SmallVec<[RtValue; 4]>) -> Result<SmallVec<[RtValue; 2]>, Failure> {
        count(Statistic::ProgramRuns, 1);
        // Trusted steps rely on the inputs having their static types.
        let trust = self
            .fused
            .nodes
            .iter()
            .zip(&inputs)
            .all(|(arg, v)| v.mismatch(&arg.outputs[0]).is_none());
        let mut regs: Vec<Option<RtValue>> = vec![None; self.registers];
        let mut dead = vec![false; self.fused.nodes.len()];
        for (&(reg, _), value) in self.inputs.iter().zip(inputs) {
            regs[reg as usize] = Some(value);
        }
        let mut scratch: Vec<Tensor> = Vec::new();
        let mut iteration: i64 = 0;
        loop {
            for step in &self.steps {
                let result = self.step(step, iteration, trust, &mut regs, &mut dead, &mut scratch);
                if let Err(mut failure) = result {
                    failure.inside(
                        &self.fused.nodes[step.node],
                        self.fused.repeats.then_some(iteration),
                    );
                    return Err(failure);
                }
            }
            if !self.fused.repeats || self.carried.iter().all(|&r| regs[r as usize].is_none()) {
                break;
            }
            iteration += 1;
        }
        if self.fused.repeats {
            While::count_trips(iteration);
        }
        // A register returned twice is cloned for all but its last use.
        let last = |k: usize| !self.results[k + 1..].contains(&self.results[k]);
        self.results
            .iter()
            .enumerate()
            .map(|(k, &r)| {
                let slot = &mut regs[r as usize];
                let value = if last(k) { slot.take() } else { slot.clone() };
                value.ok_or_else(|| {
                    let msg = format!("frame {}: result {k} is dead", self.fused.frame);
                    Failure::from(Error::internal("executor", msg))
                })
            })
            .collect()
    }

    fn step(
        &self,
        step: &RegisterStep,
        iteration: i64,
        trust: bool,
        regs: &mut [Option<RtValue>],
        dead: &mut [bool],
        scratch: &mut Vec<Tensor>,
    ) -> Result<(), Failure> {
        let out = step.out as usize;
        let control_dead = step.controls.iter().any(|&c| dead[c as usize]);
        let reads = &step.reads;
        // The merges decide their own death from which inputs are live.
        let is_dead = match step.action {
            RegisterAction::LoopMerge => {
                let value = read(regs, reads[usize::from(iteration > 0)]);
                let live = value.is_some() && !control_dead;
                regs[out] = value.filter(|_| live);
                dead[step.node] = !live;
                return Ok(());
            }
            RegisterAction::Merge => {
                let mut first = None;
                for &r in reads {
                    let v = read(regs, r);
                    if first.is_none() {
                        first = v;
                    }
                }
                let live = first.is_some() && !control_dead;
                regs[out] = first.filter(|_| live);
                dead[step.node] = !live;
                return Ok(());
            }
            _ => control_dead || reads.iter().any(|r| regs[r.reg as usize].is_none()),
        };
        dead[step.node] = is_dead;
        if is_dead {
            for r in &mut regs[out..out + step.outputs as usize] {
                *r = None;
            }
            // Later readers of the inputs still see them; the values are dropped when the
            // registers are written next.
            return Ok(());
        }
        match &step.action {
            RegisterAction::Const(t) => regs[out] = Some(RtValue::Tensor(t.clone())),
            RegisterAction::Pass => regs[out] = read(regs, reads[0]),
            RegisterAction::Switch(n) => {
                // The data first: a branch's predicate switches itself. The selector is only
                // looked at (several switches share one predicate).
                let value = read(regs, reads[0]);
                let selector = regs[reads[1].reg as usize].as_ref();
                let chosen = selector_output(selector.ok_or_else(|| missing("switch"))?, *n)?;
                if reads[1].take {
                    regs[reads[1].reg as usize] = None;
                }
                for k in 0..*n {
                    regs[out + k] = None;
                }
                regs[out + chosen] = value;
            }
            RegisterAction::Op {
                op,
                checked,
                trusted,
            } => {
                scratch.clear();
                for (i, &r) in reads.iter().enumerate() {
                    match read(regs, r) {
                        Some(RtValue::Tensor(t)) => scratch.push(t),
                        Some(other) => {
                            let mut e = other.into_tensor().err().unwrap_or_else(|| missing("op"));
                            e.message = format!("input {i}: {}", e.message);
                            return Err(e.into());
                        }
                        None => return Err(missing(op.name()).into()),
                    }
                }
                let outs = match checked {
                    Some(c)
                        if (trust && *trusted) || scratch.iter().map(Tensor::ty).eq(&c.inputs) =>
                    {
                        op.compute_owned(scratch, &c.outputs)
                    }
                    _ => execute(op, scratch),
                };
                scratch.clear();
                for (k, t) in outs?.into_iter().enumerate() {
                    regs[out + k] = Some(RtValue::Tensor(t));
                }
            }
            RegisterAction::Kernel | RegisterAction::Loop(_) => {
                let inputs: SmallVec<[RtValue; 4]> =
                    reads.iter().filter_map(|&r| read(regs, r)).collect();
                let outs = match (&step.action, &self.fused.nodes[step.node].kind) {
                    (RegisterAction::Loop(program), _) => program.run(inputs)?,
                    (_, DfKind::Variable(v)) => v.run(inputs)?,
                    (_, DfKind::Stack(s)) => s.run(inputs)?,
                    (_, other) => {
                        let message =
                            format!("a kernel step of a {} node has no kernel", other.name());
                        return Err(Error::internal("executor", message).into());
                    }
                };
                for (k, v) in outs.into_iter().enumerate() {
                    regs[out + k] = Some(v);
                }
            }
            RegisterAction::NoOp => {}
            RegisterAction::LoopMerge | RegisterAction::Merge => {}
        }
        Ok(())
    }
}

/// A register's value: moved out at its last read in the iteration, else cloned.
fn read(regs: &mut [Option<RtValue>], r: Read) -> Option<RtValue> {
    let slot = &mut regs[r.reg as usize];
    if r.take {
        slot.take()
    } else {
        slot.clone()
    }
}

/// Marks the op steps whose inputs always have their static types, so that they skip the
/// comparison. A value has its static type when it is a constant, an input of the loop
/// (checked when the run starts), or the output of a trusted op, passed on by identities, switches and merges; a
/// kernel's output (a stack pop, a variable read) is compared. Loops carry values around, so
/// trust is withdrawn until nothing changes.
fn trust(steps: &mut [RegisterStep], nodes: &[DfNode], registers: usize, args: usize) {
    let mut reg_trusted = vec![true; registers];
    // An input is checked against its static type when the run starts (`run`): exact only
    // where every dimension is known.
    for (k, arg) in nodes[..args].iter().enumerate() {
        reg_trusted[k] = arg.outputs[0]
            .as_tensor()
            .is_some_and(|t| !t.shape.contains(&DYN));
    }
    loop {
        let mut changed = false;
        for step in steps.iter() {
            let inputs_trusted = step.reads.iter().all(|r| reg_trusted[r.reg as usize]);
            let trusted = match &step.action {
                RegisterAction::Kernel | RegisterAction::Loop(_) => false,
                RegisterAction::Op { checked, .. } => inputs_trusted && checked.is_some(),
                _ => inputs_trusted,
            };
            for r in step.out..step.out + step.outputs {
                if !trusted && reg_trusted[r as usize] {
                    reg_trusted[r as usize] = false;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    for step in steps.iter_mut() {
        let inputs_trusted = step.reads.iter().all(|r| reg_trusted[r.reg as usize]);
        if let RegisterAction::Op { trusted, .. } = &mut step.action {
            *trusted = inputs_trusted;
        }
    }
}

/// Puts `steps` in the order `cluster` gives, each with its domain.
fn order_steps(steps: &mut Vec<RegisterStep>, nodes: &[DfNode]) {
    let view: Vec<Step> = steps
        .iter()
        .map(|s| Step {
            node: s.node as u32,
            role: match &s.action {
                RegisterAction::Op { .. } | RegisterAction::Const(_) => Role::Pure,
                RegisterAction::LoopMerge => Role::LoopMerge,
                RegisterAction::Merge => Role::Merge,
                RegisterAction::Switch(_) => Role::Switch,
                _ => Role::Effect,
            },
            reads: s.reads.iter().map(|r| r.reg).collect(),
            controls: s.controls.clone(),
            out: s.out,
            outputs: s.outputs,
            lanes: match &s.action {
                RegisterAction::Op { op, .. } => fused_lanes(op, &nodes[s.node], nodes),
                _ => None,
            },
        })
        .collect();
    let (domains, order) = cluster(&view);
    let mut taken: Vec<Option<RegisterStep>> = steps.drain(..).map(Some).collect();
    for (step, domain) in taken.iter_mut().zip(domains) {
        if let Some(step) = step {
            step.domain = domain;
        }
    }
    steps.extend(order.into_iter().filter_map(|k| taken[k].take()));
}

fn missing(op: &'static str) -> Error {
    Error::internal(op, "an input is missing")
}
