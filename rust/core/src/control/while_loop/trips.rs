//! How many iterations of a `While` one trip of its emitted `scf.while` runs.
//!
//! A trip of an IREE loop has a fixed cost on the host (fences, a queue submission, transient
//! buffers) whatever its dispatches compute, so loops of cheap iterations run several per trip,
//! recorded into the trip's one command buffer and submitted once. Two shapes:
//!
//! - **Predicated** (`predication`): a loop of ops and pushes. Each iteration after a trip's
//!   first runs on from the one before, and with it whether the condition has held at every
//!   iteration so far; the iterations kept are a prefix, so at the trip's end each variable is
//!   chosen from its values (`Lowering::choose_kept`). The last trip throws away at most all
//!   but one iteration, so the work per trip is bounded. Pushes all land, after the trip's
//!   dispatches; stack sizes and the trip counter advance by the iterations kept. A stack of
//!   scalars (a host list) keeps the loop at one iteration a trip: see docs/notes.md.
//! - **Exact** (`countdown`): a loop that runs exactly `n` more iterations, `n` a variable the
//!   condition tests `> 0` and the body decrements: the gradient loops of `While::augment`, which
//!   pop the forward loop's stacks. It becomes two loops, `k` iterations per trip while `n >= k`,
//!   then one per trip for the rest: nothing is computed twice or thrown away, and a stack is
//!   never popped past the iterations that pushed it (a predicated pop could be).

use crate::dtype::DType;
use crate::emit::MlirValue;
use crate::error::Result;
use crate::graph::{Function, NodeKind, Port, StackOp, ValueType, While};
use crate::mlir::function::one;
use crate::mlir::work::{ops_work, plain};
use crate::mlir::{Bound, Lowering};
use crate::ops::Op;
use crate::shape::TensorType;
use crate::tensor::Tensor;

/// The most iterations per trip of a predicated loop.
const UNROLL: usize = 32;

/// Work (elements, or multiply-adds) one trip of a predicated loop may hold, which bounds what
/// its last trip throws away: a trip's fixed cost in IREE is that of some ten thousand
/// elements of arithmetic (W6's forward loop runs 8 iterations a trip at this budget).
const UNROLL_BUDGET: usize = 1 << 16;

/// The most iterations per trip of an exact loop: past 8, a trip's fixed cost is a few percent
/// of its iterations' (measured on W6's gradient loop at 1, 4 and 8: `docs/notes.md`).
const EXACT_UNROLL: usize = 8;

/// Work one trip of an exact loop may hold (nothing is wasted: the bound is on code size and
/// compile time, and beyond it the trip's fixed cost no longer matters).
const EXACT_BUDGET: usize = 1 << 18;

/// Ops, stack pops and pushes one unrolled trip may hold: the module's size and IREE's compile
/// time grow with them, whatever the work.
const UNROLL_NODES: usize = 256;

/// Nodes that unrolled trips may add to one module, over all its loops (each iteration of a
/// trip after its first): a second derivative of nested loops holds dozens of small loops, and
/// unrolled each to `UNROLL_NODES` they made modules of 60,000 lines that IREE took minutes to
/// compile. Loops are unrolled in the order they are emitted (forward loops before their
/// gradients) while the budget lasts.
pub(crate) const UNROLL_MODULE_NODES: usize = 1024;

/// How a predicated loop runs its trips.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Predicated {
    pub per_trip: usize,
    /// Ops and stack nodes of one iteration (condition and body).
    pub nodes: usize,
    /// For a loop that pushes or counts trips and whose condition the device decides: per
    /// loop variable, whether the host computes it from one trip to the next (`host_vars`).
    /// Within a trip the other rank-0 variables then stay on the device, the host ones are
    /// computed for every iteration and the last kept is chosen at the trip's end, once the
    /// number of iterations kept is read back: one wait for the device per trip.
    pub host_vars: Option<Vec<bool>>,
}

/// A predicated trip's iterations after its first, by what `choose_kept` needs.
pub(crate) struct Kept<'a> {
    /// Per iteration after the first: whether the condition held at it and every one before.
    pub alive: Vec<Bound>,
    /// The name the number of iterations kept is given, for a loop that counts them (stacks
    /// pushed, `maximum_iterations`).
    pub counted: Option<&'a str>,
    /// `Predicated::host_vars`.
    pub host_vars: Option<&'a [bool]>,
}

/// How many iterations one trip of a predicated loop runs: for a loop whose condition is ops
/// only and whose body is ops and pushes onto stacks of tensors kept as lists (each pushed at
/// most once per iteration; with `EmitOptions::unroll_loops`), as many as fit `UNROLL_BUDGET`
/// of work (`OpDef::work` summed over the ops) and `UNROLL_NODES` ops, a power of two up to
/// `UNROLL`; 1 otherwise. A
/// trip's pushes all land in the list, written after its dispatches, and its size, like a
/// `maximum_iterations` counter, advances by the iterations kept, so a later trip writes over
/// the others.
pub(crate) fn predication(l: &Lowering<'_>, w: &While) -> Result<Predicated> {
    let single = Predicated {
        per_trip: 1,
        nodes: 0,
        host_vars: None,
    };
    if !l.e.options.unroll_loops {
        return Ok(single);
    }
    let (cond, body) = (l.library.get(&w.cond)?, l.library.get(&w.body)?);
    let (Some((cond_work, cond_nodes)), Some((body_work, body_nodes))) =
        (ops_work(cond, false), ops_work(body, true))
    else {
        return Ok(single);
    };
    let pops = body
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Stack(StackOp::Pop)));
    let stacks_ok = body.params.iter().enumerate().all(|(k, t)| match t {
        ValueType::Stack(element) => {
            l.e.options.list_stacks
                && element.ndim() > 0
                && !crate::mlir::stacks::on_host(element)
                && body
                    .results
                    .get(k)
                    .is_some_and(|&r| pushed_at_most_once(body, r, k))
        }
        _ => true,
    });
    if pops || !stacks_ok {
        return Ok(single);
    }
    let stacks = body.params.iter().any(|t| matches!(t, ValueType::Stack(_)));
    let host = host_vars(body);
    let on_host = cond
        .results
        .first()
        .is_some_and(|&r| scalar_of(cond, r, &host));
    // Rank-0 state kept on the device within a trip, host values computed every iteration:
    // one wait for the device per trip (W6's forward loop: `docs/notes.md`).
    let work = cond_work.saturating_add(body_work);
    let nodes = (cond_nodes + body_nodes).max(1);
    Ok(Predicated {
        per_trip: power_of_two(
            (UNROLL_BUDGET / work)
                .min(UNROLL_NODES / nodes)
                .min(1 + unroll_nodes_left(l) / nodes)
                .clamp(1, UNROLL),
        ),
        nodes,
        host_vars: (!on_host && (stacks || w.maximum_iterations.is_some())).then_some(host),
    })
}

/// Whether `port` is parameter `k` of `f`, or a push onto it.
fn pushed_at_most_once(f: &Function, port: Port, k: usize) -> bool {
    let is_arg =
        |p: Port| matches!(f.nodes.get(p.node).map(|n| &n.kind), Some(NodeKind::Arg(i)) if *i == k);
    match f.nodes.get(port.node) {
        Some(n) if n.kind == NodeKind::Stack(StackOp::Push) => {
            n.inputs.first().is_some_and(|&p| is_arg(p))
        }
        _ => is_arg(port),
    }
}

/// Per parameter of a loop's `body`: whether the host computes it from one trip to the next,
/// a rank-0 variable that the body computes from such variables and constants only (a
/// counter, say), never from a tensor or a reduction of one.
fn host_vars(body: &Function) -> Vec<bool> {
    let rank0 = |t: &ValueType| matches!(t, ValueType::Tensor(t) if t.ndim() == 0);
    let mut host: Vec<bool> = body.params.iter().map(rank0).collect();
    loop {
        let next: Vec<bool> = (0..host.len())
            .map(|k| {
                host[k]
                    && body
                        .results
                        .get(k)
                        .is_some_and(|&r| scalar_of(body, r, &host))
            })
            .collect();
        if next == host {
            return host;
        }
        host = next;
    }
}

/// Whether `port` of `f` is computed from the `host` parameters and rank-0 constants by ops on
/// rank-0 values.
fn scalar_of(f: &Function, port: Port, host: &[bool]) -> bool {
    let Some(node) = f.nodes.get(port.node) else {
        return false;
    };
    let rank0 = node
        .outputs
        .iter()
        .all(|t| matches!(t, ValueType::Tensor(t) if t.ndim() == 0));
    match &node.kind {
        NodeKind::Arg(k) => host.get(*k).copied().unwrap_or(false),
        NodeKind::Const(_) => rank0,
        NodeKind::Op(_) => rank0 && node.inputs.iter().all(|&p| scalar_of(f, p, host)),
        _ => false,
    }
}

/// A loop that runs exactly `vars[count]` more iterations, unrolled `per_trip` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Countdown {
    pub count: usize,
    pub per_trip: usize,
    /// Ops and stack nodes of one iteration of the body.
    pub nodes: usize,
}

/// What is left of the module's `UNROLL_MODULE_NODES`.
fn unroll_nodes_left(l: &Lowering<'_>) -> usize {
    UNROLL_MODULE_NODES.saturating_sub(l.e.unrolled_nodes)
}

/// Charges the nodes a loop of `nodes` per iteration adds at `per_trip` iterations a trip to
/// the module's `UNROLL_MODULE_NODES`.
pub(crate) fn charge_unrolled(l: &mut Lowering<'_>, per_trip: usize, nodes: usize) {
    l.e.unrolled_nodes = (l.e.unrolled_nodes).saturating_add(per_trip.saturating_sub(1) * nodes);
}

/// The countdown shape of `w`, where it has one and unrolling pays (`EmitOptions::unroll_loops`):
/// its condition is `vars[count] > 0` on an int64 scalar, its body returns `vars[count] - 1`,
/// and its body is ops and stack pops and pushes; no `maximum_iterations`.
pub(crate) fn countdown(l: &Lowering<'_>, w: &While) -> Result<Option<Countdown>> {
    if !l.e.options.unroll_loops || w.maximum_iterations.is_some() {
        return Ok(None);
    }
    let (cond, body) = (l.library.get(&w.cond)?, l.library.get(&w.body)?);
    let Some(count) = tested_above_zero(cond) else {
        return Ok(None);
    };
    let decremented = body.results.get(count).is_some_and(|&r| {
        op_of_arg_and_const(body, r, Op::Sub(Default::default()), 1) == Some(count)
    });
    if !decremented || !cond.nodes.iter().all(|n| plain(&n.kind, false)) {
        return Ok(None);
    }
    let Some((work, nodes)) = ops_work(body, true) else {
        return Ok(None);
    };
    let nodes = nodes.max(1);
    let per_trip = (EXACT_BUDGET / work.max(1))
        .min(UNROLL_NODES / nodes)
        .min(1 + unroll_nodes_left(l) / nodes)
        .clamp(1, EXACT_UNROLL);
    Ok((per_trip > 1).then(|| Countdown {
        count,
        per_trip: power_of_two(per_trip),
        nodes,
    }))
}

/// `k` where `f` returns `arg k > 0`, `arg k` an int64 scalar.
fn tested_above_zero(f: &Function) -> Option<usize> {
    let [result] = f.results[..] else {
        return None;
    };
    op_of_arg_and_const(f, result, Op::Greater(Default::default()), 0)
}

/// `k` where `port` is `op(arg k, c)`, `arg k` an int64 scalar and `c` the int64 scalar `value`.
fn op_of_arg_and_const(f: &Function, port: Port, op: Op, value: i64) -> Option<usize> {
    let node = f.nodes.get(port.node)?;
    if node.kind != NodeKind::Op(op) {
        return None;
    }
    let [a, c] = node.inputs[..] else {
        return None;
    };
    let NodeKind::Arg(k) = f.nodes.get(a.node)?.kind else {
        return None;
    };
    let NodeKind::Const(constant) = &f.nodes.get(c.node)?.kind else {
        return None;
    };
    let int64_scalar =
        |t: &crate::shape::TensorType| t.dtype == crate::dtype::DType::I64 && t.shape.is_empty();
    let arg_ok = f.params.get(k).is_some_and(|t| match t {
        ValueType::Tensor(t) => int64_scalar(t),
        _ => false,
    });
    let const_ok = int64_scalar(constant.0.ty()) && constant.0.to_f64_vec() == [value as f64];
    (arg_ok && const_ok).then_some(k)
}

/// The largest power of two not above `n` (n >= 1).
fn power_of_two(n: usize) -> usize {
    1 << n.ilog2()
}

impl Lowering<'_> {
    /// A value held on the host as a tensor (uploaded, no wait); other values as they are.
    pub(crate) fn on_device(&mut self, b: Bound) -> Result<Bound> {
        match b {
            Bound::Scalar(_) | Bound::Elements { .. } => Ok(Bound::Tensor(self.tensor_input(&b)?)),
            other => Ok(other),
        }
    }

    /// At a predicated trip's end, each variable's value after the last iteration kept, from
    /// its `values` after each one; the stacks sized and the counter advanced by the number
    /// kept (`trip_kept`). A value is chosen where its iterations' conditions are: on the
    /// device by the device's, on the host by the host's; a tensor on the device by a host
    /// condition, by the number kept uploaded once and compared there (an upload per
    /// iteration made IREE record a command each, and W5 ran several times slower). A
    /// host variable of a loop the device decides is chosen by the number kept, read back
    /// once a trip.
    pub(crate) fn choose_kept(
        &mut self,
        kept: Kept<'_>,
        args: &[Bound],
        next: &mut [Bound],
        values: Vec<Vec<Bound>>,
    ) -> Result<()> {
        let on_host = |k: usize| kept.host_vars.is_some_and(|h| h[k]);
        let host_alive = matches!(kept.alive[0], Bound::Scalar(_));
        let distinct = |v: &[Bound]| v.iter().any(|x| *x != v[0]);
        let uploads = host_alive
            && next
                .iter()
                .zip(&values)
                .any(|(var, v)| matches!(var, Bound::Tensor(_)) && distinct(v));
        let count = match kept.counted.is_some() || kept.host_vars.is_some() || uploads {
            true => Some(self.count_kept(&kept.alive)?),
            false => None,
        };
        let read_back = match (&count, kept.counted.is_some() || kept.host_vars.is_some()) {
            (Some(count), true) => Some(self.trip_kept(kept.counted, count, args, next)?),
            _ => None,
        };
        let mut uploaded = None;
        for (k, (var, values)) in next.iter_mut().zip(values).enumerate() {
            if !distinct(&values) || matches!(var, Bound::Stack { .. }) {
                continue;
            }
            *var = match (&*var, &read_back, &count) {
                (Bound::Scalar(_), Some(n), _) if on_host(k) && !host_alive => {
                    let n = n.clone();
                    self.last_kept(&n, values)?
                }
                (Bound::Tensor(_), _, Some(count)) if host_alive => {
                    if uploaded.is_none() {
                        uploaded = Some(self.tensor_input(count)?);
                    }
                    let count = uploaded.clone().expect("set above");
                    self.last_kept_where(&count, values)?
                }
                _ => self.last_alive(&kept.alive, values)?,
            };
        }
        Ok(())
    }

    /// The number of iterations a trip keeps (int64 rank-0, on the side of its conditions):
    /// the first, and each after it while `alive`.
    fn count_kept(&mut self, alive: &[Bound]) -> Result<Bound> {
        let mut kept = None;
        for go in alive {
            kept = Some(self.count_if(kept, go)?);
        }
        kept.ok_or_else(|| self.e.bug("a trip of one iteration counted"))
    }

    /// Of `values` after each iteration, the last whose condition held (`alive`, one per
    /// iteration after the first).
    fn last_alive(&mut self, alive: &[Bound], values: Vec<Bound>) -> Result<Bound> {
        self.last_where(values, |_, j| Ok(alive[j - 1].clone()))
    }

    /// Of a host variable's `values` after each iteration of a trip, the one after the last of
    /// the `n` iterations kept.
    fn last_kept(&mut self, n: &str, values: Vec<Bound>) -> Result<Bound> {
        self.last_where(values, |l, j| {
            let j = l.scalar_constant(DType::I64, j as f64);
            let (name, loc) = (l.e.fresh(), l.e.loc());
            l.e.line(&format!("{name} = arith.cmpi sgt, {n}, {j} : i64 {loc}"));
            Ok(scalar(&name, DType::Bool))
        })
    }

    /// Of a variable's `values` after each iteration of a trip, the one after the last of the
    /// `count` iterations kept (an int64 rank-0 tensor), chosen on the device.
    fn last_kept_where(&mut self, count: &MlirValue, values: Vec<Bound>) -> Result<Bound> {
        self.last_where(values, |l, j| {
            let j = l.e.scalar(DType::I64, j as f64);
            Ok(Bound::Tensor(l.e.compare("GT", count, &j)))
        })
    }

    /// Of `values` after each iteration of a trip, the last that `kept(j)` (iteration `j >= 1`
    /// was kept) selects.
    fn last_where(
        &mut self,
        values: Vec<Bound>,
        mut kept: impl FnMut(&mut Self, usize) -> Result<Bound>,
    ) -> Result<Bound> {
        let mut values = values.into_iter();
        let mut last = values
            .next()
            .ok_or_else(|| self.e.bug("no value of a loop variable"))?;
        for (j, value) in values.enumerate() {
            if value != last {
                let pred = kept(self, j + 1)?;
                last = self.select(&pred, value, last)?;
            }
        }
        Ok(last)
    }

    /// The host bool `counter + j < limit`: iteration `j` of a trip is within
    /// `maximum_iterations`.
    pub(crate) fn counter_below(&mut self, counter: &str, j: usize, limit: &str) -> Bound {
        let j = self.scalar_constant(DType::I64, j as f64);
        let (at, below) = (self.e.fresh(), self.e.fresh());
        let loc = self.e.loc();
        self.e
            .line(&format!("{at} = arith.addi {counter}, {j} : i64 {loc}"));
        self.e.line(&format!(
            "{below} = arith.cmpi slt, {at}, {limit} : i64 {loc}"
        ));
        scalar(&below, DType::Bool)
    }

    /// `a and b` of two bools, on the device when either is there (the other uploaded, so that
    /// the device's value is never waited for).
    pub(crate) fn both(&mut self, a: Bound, b: Bound) -> Result<Bound> {
        let (a, b) = match (&a, &b) {
            (Bound::Scalar(_), Bound::Tensor(_)) => (b, a),
            _ => (a, b),
        };
        let b = match a {
            Bound::Tensor(_) => Bound::Tensor(self.tensor_input(&b)?),
            _ => b,
        };
        let outs = self.apply(&Op::LogicalAnd(Default::default()), vec![a, b])?;
        let [and] = one(self, outs)?;
        Ok(and)
    }

    /// `kept + (go ? 1 : 0)` as an int64 rank-0 value on `go`'s side, `kept` starting at 1 (a
    /// trip's first iteration always runs).
    pub(crate) fn count_if(&mut self, kept: Option<Bound>, go: &Bound) -> Result<Bound> {
        let constant = |l: &mut Self, v: i64| match go {
            Bound::Tensor(_) => Bound::Tensor(l.e.constant(&Tensor::scalar(v))),
            _ => scalar(&l.scalar_constant(DType::I64, v as f64), DType::I64),
        };
        let kept = match kept {
            Some(k) => k,
            None => constant(self, 1),
        };
        let (unit, zero) = (constant(self, 1), constant(self, 0));
        let step = self.select(go, unit, zero)?;
        let outs = self.apply(&Op::Add(Default::default()), vec![kept, step])?;
        let [sum] = one(self, outs)?;
        Ok(sum)
    }

    /// At a predicated trip's end: the number of iterations `kept`, read back to the host (and
    /// defined as `name`, what a counter advances by), each stack pushed in the trip sized at
    /// its size on entry (`args`) plus that number.
    fn trip_kept(
        &mut self,
        name: Option<&str>,
        kept: &Bound,
        args: &[Bound],
        next: &mut [Bound],
    ) -> Result<String> {
        let n = self.scalar_input(kept)?;
        let loc = self.e.loc();
        if let Some(name) = name {
            let zero = self.scalar_constant(DType::I64, 0.0);
            self.e
                .line(&format!("{name} = arith.addi {n}, {zero} : i64 {loc}"));
        }
        let rows = self.e.fresh();
        self.e.line(&format!(
            "{rows} = arith.index_cast {n} : i64 to index {loc}"
        ));
        for (var, arg) in next.iter_mut().zip(args) {
            if let (Bound::Stack { size, .. }, Bound::Stack { size: entry, .. }) = (var, arg) {
                if size != entry {
                    let sized = self.e.fresh();
                    self.e.line(&format!(
                        "{sized} = arith.addi {entry}, {rows} : index {loc}"
                    ));
                    *size = sized;
                }
            }
        }
        Ok(n)
    }
}

/// A host scalar value of `dtype` named `name`.
fn scalar(name: &str, dtype: DType) -> Bound {
    Bound::Scalar(MlirValue {
        name: name.to_string(),
        ty: TensorType::scalar(dtype),
    })
}
