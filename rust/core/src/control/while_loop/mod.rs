//! `While`: `(vars...) -> vars`, running `while cond(vars): vars = body(vars)` (`gl.while_loop`),
//! stopping after `maximum_iterations` trips when set; `parallel_iterations` bounds the
//! iterations an executor may run at once.
//!
//! - Type rule: `cond(vars) -> bool[]`, `body(vars) -> vars`; the outputs are the loop vars.
//! - Gradient: the body is replayed and differentiated; loop-invariant residuals stay loop
//!   variables and every other residual gets a stack. The forward loop carries `(vars, trip
//!   count, stacks)` and pushes each iteration; the gradient loop carries `(cotangents, count,
//!   stacks, invariants)`, pops, and runs the body's backward function until the count reaches
//!   zero. Stack pushes and pops have gradients, so the gradient loop differentiates again.
//! - Interpretation: a Rust loop of two calls per trip, so the stack stays flat.
//! - MLIR: `scf.while` with the trip count and stack bounds, through the region helpers of
//!   `mlir::regions`.

use std::sync::Arc;

mod batching;
mod bounds;
mod checkpointed;
mod dense;
mod hybrid;
mod loop_vars;
mod schedule;
mod stablehlo;
pub(crate) mod trips;

use crate::dataflow::{DfKind, FunctionLowered, Lower, LowerNode, Lowered, Scope};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_call;
use crate::graph::Node;
use crate::graph::{
    inline_into, Constant, Function, FunctionBuilder, NodeId, NodeKind, Port, StackOp,
};
use crate::graph::{AttrReader, Check, Library, NodeRule, ParseNode, ValueType, While};
use crate::interpret::nodes::{check_results, scalar};
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::function::one;
use crate::mlir::function::{flat_names, flat_types_of};
use crate::mlir::regions::Terminator;
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::attrs::Attr;
use crate::ops::binary;
use crate::ops::Context;
use crate::passes::{PassRules, Threading};
use crate::runtime_values::RtValue;
use crate::shape::TensorType;
use crate::tape::GradientFunction;
use crate::tensor::Tensor;
use crate::trace::captures::{tracer_of, unify, union, LoopFunctions};
use crate::trace::gradients::{
    add_function, carries_cotangent, differentiate, function, is_differentiable, is_float_resource,
    is_float_stack, Augment, Built, ControlGradient, Differentiate, ExtraInput,
};
use crate::trace::variables::{thread_variables, Carrier};
use crate::trace::{TracerRef, Val};
use bounds::loop_pushes_at;
use trips::Countdown;

impl NodeRule for While {
    fn keyword(&self) -> &'static str {
        "while"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let mut attrs = vec![
            ("cond", FuncName(&self.cond).to_string()),
            ("body", FuncName(&self.body).to_string()),
        ];
        if let Some(m) = self.maximum_iterations {
            attrs.push(("maximum_iterations", Attr::Int(m).to_string()));
        }
        attrs.push(("parallel_iterations", self.parallel_iterations.to_string()));
        if let Some(c) = self.checkpoints {
            attrs.push(("checkpoints", c.to_string()));
        }
        attrs
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.cond, &self.body]
    }

    fn with_callees(&self, names: Vec<String>) -> NodeKind {
        let mut names = names.into_iter();
        let mut next = |old: &String| names.next().unwrap_or_else(|| old.clone());
        NodeKind::While(While {
            cond: next(&self.cond),
            body: next(&self.body),
            maximum_iterations: self.maximum_iterations,
            parallel_iterations: self.parallel_iterations,
            checkpoints: self.checkpoints,
        })
    }

    fn check(&self, library: &Library, vars: &[&ValueType], outs: &[&ValueType]) -> Check {
        if self.maximum_iterations.is_some_and(|m| m < 0)
            || self.parallel_iterations == 0
            || self.checkpoints == Some(0)
        {
            return Err(
                "maximum_iterations must be >= 0, parallel_iterations and checkpoints >= 1".into(),
            );
        }
        let bool_scalar = ValueType::Tensor(TensorType::scalar(DType::Bool));
        check_call(library, "cond", &self.cond, vars, &[&bool_scalar])?;
        check_call(library, "body", &self.body, vars, outs)?;
        let body = library.get(&self.body).map_err(|e| e.message)?;
        for (k, (p, o)) in body.params.iter().zip(outs).enumerate() {
            if !p.compatible(o) {
                return Err(format!(
                    "loop var {k}: body @{} takes {p} but the node's output {k} is {o}",
                    self.body
                ));
            }
        }
        Ok(())
    }

    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        Ok(library.get(&self.body)?.params.clone())
    }
}

impl ParseNode for While {
    const KEYWORDS: &'static [&'static str] = &["while"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(While {
            cond: attrs.function("cond")?,
            body: attrs.function("body")?,
            maximum_iterations: attrs.optional_int("maximum_iterations")?,
            parallel_iterations: attrs.int("parallel_iterations")?,
            checkpoints: attrs.optional_int("checkpoints")?,
        })
    }
}

impl Interpret for While {
    /// A loop in Rust: each iteration is two calls that return before the next, so the stack
    /// stays flat however many iterations run. Once the maximum is reached `cond` is not
    /// called.
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let mut vars = run.take_all()?;
        let (cond, body) = (run.callee(0)?, run.callee(1)?);
        let maximum = self.maximum_iterations;
        if let Some(m) = maximum.filter(|&m| m < 0) {
            let msg = format!("maximum_iterations must be at least 0, got {m}");
            return Err(Error::invalid("while", msg));
        }
        let body_fn = run.function(body)?;
        let mut trip: i64 = 0;
        while maximum.is_none_or(|m| trip < m) {
            // The condition gets clones; its frame is gone before the body runs, so the body
            // again holds the only handle to each stack it carries.
            let go = run
                .call(cond, vars.clone())
                .and_then(|r| single(r).and_then(|c| scalar::<bool>(c, "while", "condition")))
                .map_err(|e| in_iteration(e, trip))?;
            if !go {
                break;
            }
            vars = run.call(body, vars).map_err(|e| in_iteration(e, trip))?;
            check_results(&vars, run.outputs(), body_fn).map_err(|e| in_iteration(e, trip))?;
            trip += 1;
        }
        Ok(run.store(vars))
    }
}

/// The one result of a `While` condition function.
fn single(mut results: Vec<RtValue>) -> Result<RtValue> {
    match (results.pop(), results.is_empty()) {
        (Some(value), true) => Ok(value),
        _ => {
            let msg = format!(
                "the condition returned {} values; it must return one",
                results.len() + 1
            );
            Err(Error::new(ErrorKind::ControlFlow, "while", msg))
        }
    }
}

fn in_iteration(mut e: Error, trip: i64) -> Error {
    e.message.push_str(&format!("\n  in iteration {trip}"));
    e
}

impl EmitMlir for While {
    /// `While` -> `scf.while`, the loop vars typed as the node's outputs; a countdown loop
    /// (`trips::countdown`) -> an unrolled `scf.while` then one for the remaining trips.
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        if l.e.options.pure_stablehlo {
            return self.emit_stablehlo(l, node, inputs);
        }
        match trips::countdown(l, self)? {
            Some(countdown) => {
                let unrolled = self.emit_loop(l, node, inputs, Trips::Exact(countdown))?;
                self.emit_loop(l, node, unrolled, Trips::One)
            }
            None => self.emit_loop(l, node, inputs, Trips::Predicated),
        }
    }

    fn module_facts(&self, facts: &mut ModuleFacts) {
        facts.loops = true;
        facts.regions = true;
    }

    fn stack_pushes(&self, flow: &PushFlow<'_>, ins: &[Pushes], _n: usize) -> Option<Vec<Pushes>> {
        let trips = |k| loop_pushes_at(flow, &self.body, k, self.maximum_iterations);
        let counts = ins.iter().enumerate().map(|(k, c)| match c {
            Pushes::Unrelated => Pushes::Unrelated,
            c => c.plus(trips(k)),
        });
        Some(counts.collect())
    }
}

/// How a `scf.while` runs a loop's iterations (`trips`).
#[derive(Clone, Copy)]
enum Trips {
    /// One iteration per trip.
    One,
    /// `trips::predication` iterations per trip, each after the first kept where the
    /// condition holds.
    Predicated,
    /// `per_trip` iterations per trip while the count is at least that.
    Exact(Countdown),
}

impl While {
    /// A loop node whose own gradient keeps stacks (the loops a gradient transform builds).
    pub(crate) fn stacked(
        cond: String,
        body: String,
        maximum_iterations: Option<i64>,
        parallel_iterations: u32,
    ) -> NodeKind {
        NodeKind::While(While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
            checkpoints: None,
        })
    }

    fn emit_loop(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
        trips: Trips,
    ) -> Result<Vec<Bound>> {
        let While {
            cond,
            body,
            maximum_iterations,
            ..
        } = self;
        let types = &node.outputs;
        let mut inputs = inputs;
        let library = l.library;
        let pushes = |k| bounds::loop_pushes(library, body, k, *maximum_iterations);
        let reserve = l.reserve_stacks(&pushes, &mut inputs);
        let body_fn = l.library.get(body)?;
        let exposed = loop_vars::exposed(body_fn);
        let (fixed, carried_inputs, ctypes) =
            loop_vars::split_invariants(l, body_fn, inputs, types)?;
        let mut inits = l.carried_all(carried_inputs, &ctypes)?;
        let pushed: Vec<bool> = match l.e.options.list_stacks {
            true => loop_vars::pushed(body_fn),
            false => vec![false; fixed.len()],
        };
        let pushed: Vec<bool> = (fixed.iter().zip(pushed))
            .filter(|(f, _)| f.is_none())
            .map(|(_, p)| p)
            .collect();
        l.distinct_inits(&mut inits, &pushed);
        let loc = l.e.loc();
        let mut init_names = flat_names(&inits);
        let mut flat = flat_types_of(&l.e, &ctypes)?;
        let limits = match maximum_iterations {
            Some(max) => {
                let (zero, limit, one) = (l.e.fresh(), l.e.fresh(), l.e.fresh());
                for (name, v) in [(&zero, 0), (&limit, *max), (&one, 1)] {
                    l.e.line(&format!("{name} = arith.constant {v} : i64 {loc}"));
                }
                init_names.insert(0, zero);
                flat.insert(0, "i64".to_string());
                Some((limit, one))
            }
            None => None,
        };
        let counted = usize::from(limits.is_some());
        let (per_trip, nodes, host_vars) = match trips {
            Trips::One => (1, 0, None),
            Trips::Predicated => {
                let p = trips::predication(l, self)?;
                (p.per_trip, p.nodes, p.host_vars)
            }
            Trips::Exact(c) => (c.per_trip, c.nodes, None),
        };
        trips::charge_unrolled(l, per_trip, nodes);
        l.unrolled_loops |= per_trip > 1;
        // A predicated trip's pushes and counter advance by the iterations it kept.
        let counts = limits.is_some() || types.iter().any(|t| matches!(t, ValueType::Stack(_)));
        let predicated = matches!(trips, Trips::Predicated) && per_trip > 1;
        let host_vars = host_vars.filter(|_| predicated);
        let kept_name = (predicated && counts).then(|| l.e.fresh());
        let (prefix, names) = l.result_names(&flat);
        let before: Vec<String> = flat.iter().map(|_| l.e.fresh()).collect();
        let after: Vec<String> = flat.iter().map(|_| l.e.fresh()).collect();
        let carried: Vec<String> = before
            .iter()
            .zip(&init_names)
            .map(|(b, i)| format!("{b} = {i}"))
            .collect();
        let site = l.e.site().clone();
        let sig = flat.join(", ");
        l.e.line(&format!(
            "{prefix}scf.while ({}) : ({sig}) -> ({sig}) {{",
            carried.join(", ")
        ));
        let counter = limits
            .as_ref()
            .map(|(limit, _)| (before[0].as_str(), limit.as_str()));
        let term = Terminator::Condition {
            vars: &before,
            types: &flat,
            counter,
        };
        let pred = [ValueType::tensor(DType::Bool, &[])];
        let test = |l: &mut Lowering<'_>| {
            let carried = l.unpack(&ctypes, &before[counted..])?;
            let vars = l.with_fixed(&fixed, carried)?;
            match trips {
                Trips::Exact(c) => Ok(vec![l.at_least(&vars[c.count], c.per_trip)?]),
                _ => l.inline(cond, vars),
            }
        };
        l.region(None, &pred, test, term)?;
        l.e.line("} do {");
        let block_args: Vec<String> = after
            .iter()
            .zip(&flat)
            .map(|(a, t)| format!("{a}: {t}"))
            .collect();
        let header = format!("^bb0({}):", block_args.join(", "));
        let term = match &limits {
            Some((_, one)) => Terminator::YieldCounting {
                counter: &after[0],
                one: kept_name.as_deref().unwrap_or(one),
            },
            None => Terminator::Yield,
        };
        let next = |l: &mut Lowering<'_>| {
            let carried = l.unpack(&ctypes, &after[counted..])?;
            let mut vars = l.with_fixed(&fixed, carried)?;
            let device_rank0 = l.device_rank0;
            if let Some(host) = &host_vars {
                l.device_rank0 = true;
                for (var, &on_host) in vars.iter_mut().zip(host) {
                    if !on_host {
                        *var = l.on_device(var.clone())?;
                    }
                }
            }
            for (var, _) in vars.iter().zip(&reserve).filter(|(_, &r)| r) {
                if let Bound::Stack { buffer, .. } = var {
                    l.reserved.insert(buffer.name.clone());
                }
            }
            let args = vars.clone();
            if predicated {
                l.deferred_pushes = Some(Vec::new());
            }
            let only_pops = body_fn
                .nodes
                .iter()
                .all(|n| n.kind != NodeKind::Stack(StackOp::Push));
            let pops_at = match trips {
                Trips::Exact(_) if only_pops => {
                    l.hoisted_pops = Some(String::new());
                    Some(l.e.mark())
                }
                _ => None,
            };
            let mut next = l.inline(body, vars)?;
            next = l.coerce_all(next, types)?;
            // Iterations after the first of a trip: in a countdown, all of them run; otherwise
            // they run on speculatively, each from the one before, with whether the condition
            // has held at every one so far. The iterations kept are a prefix, so each variable
            // is chosen from its values at the trip's end (`Lowering::choose_kept`).
            let mut alive: Vec<Bound> = Vec::new();
            let mut speculated: Vec<Vec<Bound>> = next.iter().map(|v| vec![v.clone()]).collect();
            for j in 1..per_trip {
                if let Trips::Exact(_) = trips {
                    let stepped = l.inline(body, next)?;
                    next = l.coerce_all(stepped, types)?;
                    continue;
                }
                let go = l.inline(cond, next.clone())?;
                let [mut go] = one(l, go)?;
                if let Some((limit, _)) = &limits {
                    let below = l.counter_below(&after[0], j, limit);
                    go = l.both(go, below)?;
                }
                if let Some(before) = alive.last() {
                    go = l.both(before.clone(), go)?;
                }
                let stepped = l.inline(body, next)?;
                next = l.coerce_all(stepped, types)?;
                for (values, value) in speculated.iter_mut().zip(&next) {
                    values.push(value.clone());
                }
                alive.push(go);
            }
            l.flush_pushes();
            if let (Some(at), Some(pops)) = (pops_at, l.hoisted_pops.take()) {
                l.e.insert_at(at, &pops);
            }
            if !alive.is_empty() {
                let kept = trips::Kept {
                    alive,
                    counted: kept_name.as_deref(),
                    host_vars: host_vars.as_deref(),
                };
                l.choose_kept(kept, &args, &mut next, speculated)?;
            }
            l.device_rank0 = device_rank0;
            let next = l.loop_barrier(&args, next, &exposed)?;
            Ok(loop_vars::carried_only(next, &fixed))
        };
        l.region(Some(header), &ctypes, next, term)?;
        l.e.set_site(site);
        l.e.line(&format!("}} {loc}"));
        let results = l.unpack(&ctypes, &names[counted..])?;
        l.with_fixed(&fixed, results)
    }
}

/// The tangent of a loop is a loop carrying the tangents of the loop variables a tangent
/// reaches beside them: its body is the body's tangent function, its condition the condition
/// on the loop variables alone. Nothing is stacked: memory does not grow with the trip count.
impl crate::trace::tangents::Tangent for While {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        use crate::trace::gradients::function;
        use crate::trace::tangents::{
            ignoring_tangents, or_zero, split, takes_tangent, tangent_function, tracer_of,
        };
        let tracer = tracer_of(ctx, "while_loop")?;
        let takes: Vec<bool> = inputs
            .iter()
            .map(|v| takes_tangent(&v.value_type()))
            .collect();
        // The loop variables that carry a tangent: those given one, and those a trip gives
        // one to from them (a fixed point, at most one step per variable).
        let f = function(&tracer, &self.body)?;
        let mut carried: Vec<bool> = tangents.iter().map(Option::is_some).collect();
        let body = loop {
            let body = tangent_function(&tracer, &f, &carried, Some(&carried))?;
            let grown: Vec<bool> = (0..carried.len())
                .map(|i| carried[i] || (takes[i] && body.reached[i]))
                .collect();
            if grown == carried {
                break body;
            }
            carried = grown;
        };
        if body.tangent_out != carried {
            return Err(Error::internal(
                "while_loop",
                "the body's tangents do not match its loop variables",
            ));
        }
        let extra = inputs
            .iter()
            .zip(&carried)
            .filter(|(_, &c)| c)
            .map(|(v, _)| v.value_type())
            .collect();
        let cond = ignoring_tangents(&tracer, &function(&tracer, &self.cond)?, extra)?;
        let node = NodeKind::While(While {
            cond,
            body: body.name,
            ..self.clone()
        });
        let mut args = inputs.to_vec();
        for (i, v) in inputs.iter().enumerate() {
            if carried[i] {
                args.push(or_zero(ctx, &tangents[i], v)?);
            }
        }
        let outputs = ctx.apply_node(&node, &args)?;
        Ok(Some(split(outputs, &carried)))
    }
}

impl Differentiate for While {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(ControlGradient::boxed(self.clone(), inputs, outputs)))
    }
}

/// The body is replayed and differentiated; residuals that are loop invariant (variables the
/// body passes through) stay loop variables and every other residual gets a stack. Captured
/// outer tensors are loop variables, so their gradients accumulate through the cotangent chain.
impl Augment for While {
    fn api_name(&self) -> &'static str {
        "while_loop"
    }

    fn augment(
        &self,
        _g: &ControlGradient,
        tracer: &TracerRef,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Built> {
        let While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
            checkpoints,
        } = self;
        let body_fn = function(tracer, body)?;
        let cond_fn = function(tracer, cond)?;
        let n = body_fn.params.len();
        let types = body_fn.params.clone();
        let wanted = wanted_vars(&body_fn, needs);
        // A variable carries a cotangent once one reaches it: from the node's outputs, or
        // through the body from another (the fixpoint below). One that none reaches (a running
        // sum read only by the condition) keeps no residuals for its own derivative.
        let mut carried: Vec<usize> = (0..n)
            .filter(|&i| {
                wanted[i]
                    && (is_float_resource(&types[i])
                        || (carries_cotangent(&types[i])
                            && grad_outputs.get(i).is_some_and(Option::is_some)))
            })
            .collect();
        let float_vars: Vec<usize> = (0..n)
            .filter(|&i| wanted[i] && (is_differentiable(&types[i]) || is_float_stack(&types[i])))
            .collect();
        let d = loop {
            let d = differentiate(tracer, &body_fn, &carried, &float_vars)?;
            let grown: Vec<usize> = float_vars
                .iter()
                .zip(&d.nonzero)
                .filter(|(i, nz)| **nz && !carried.contains(i))
                .map(|(&i, _)| i)
                .collect();
            if grown.is_empty() {
                break d;
            }
            carried.extend(grown);
            carried.sort_unstable();
        };
        // the user's checkpoints bound the memory in states; fixed-size state asks for a size
        let residuals_allowed = checkpoints.is_none();
        let checkpoints =
            checkpoints.or_else(|| fixed_state(tracer, &body_fn, *maximum_iterations));
        if let Some(c) = checkpoints {
            let lp = checkpointed::Loop {
                cond: &cond_fn,
                body: &body_fn,
                carried: &carried,
                float_vars: &float_vars,
                maximum_iterations: *maximum_iterations,
                parallel_iterations: *parallel_iterations,
            };
            // every state fits: a row per trip, no schedule
            if let Some(m) = maximum_iterations.filter(|&m| m <= i64::from(c)) {
                let rows = usize::try_from(m).unwrap_or(0);
                return dense::augment(tracer, &lp, &d, rows, residuals_allowed);
            }
            // fixed-size state with no bound: rows while the trips fit them
            if residuals_allowed {
                if let Some(rows) = hybrid::rows(tracer, &lp, &d, c)? {
                    return hybrid::augment(tracer, &lp, &d, rows, c);
                }
            }
            return checkpointed::augment(tracer, &lp, &d, c);
        }
        // Which residuals are stacked, which are loop invariant.
        let mut stacked: Vec<usize> = Vec::new();
        let mut invariant: Vec<(usize, usize)> = Vec::new(); // (residual, var)
        for (r, param) in d.residual_params.iter().enumerate() {
            match param {
                Some(i) if d.passthrough[*i] => invariant.push((r, *i)),
                _ => stacked.push(r),
            }
        }
        let i64_scalar = ValueType::tensor(DType::I64, &[]);
        let stack_types: Vec<ValueType> = stacked
            .iter()
            .map(|&r| ValueType::Stack(d.residual_types[r].inner().clone()))
            .collect();
        let mut aug_params = types.clone();
        aug_params.push(i64_scalar.clone());
        aug_params.extend(stack_types.iter().cloned());

        // Forward body: run the body, count, push the residuals.
        let fwd = function(tracer, &d.forward)?;
        let (mut b, args) = FunctionBuilder::new(format!("{body}_fwd"), aug_params.clone());
        let (res, effects) = inline_into(&mut b, &fwd, &args[..n])?;
        let one = b.add_const(Tensor::scalar(1i64));
        let count = b.add_op1(binary::Add, &[args[n], one], None)?;
        let mut results: Vec<Port> = res[..n].to_vec();
        results.push(count);
        for (k, &r) in stacked.iter().enumerate() {
            let pushed = b.add_node(
                NodeKind::Stack(StackOp::Push),
                &[args[n + 1 + k], res[n + r]],
                vec![stack_types[k].clone()],
            )?;
            results.push(pushed[0]);
        }
        let fwd_body = add_function(tracer, b.finish(&results, &effects)?)?;
        let (mut b, args) = FunctionBuilder::new(format!("{cond}_fwd"), aug_params);
        let (res, _) = inline_into(&mut b, &cond_fn, &args[..n])?;
        let fwd_cond = add_function(tracer, b.finish(&res, &[])?)?;

        // Backward loop vars: (cotangents, count, stacks, invariants).
        let bwd = function(tracer, &d.backward)?;
        let nc = carried.len();
        let mut bparams: Vec<ValueType> = bwd.params[..nc].to_vec();
        bparams.push(i64_scalar);
        bparams.extend(stack_types.iter().cloned());
        let inv_types: Vec<ValueType> = invariant
            .iter()
            .map(|&(r, _)| d.residual_types[r].clone())
            .collect();
        bparams.extend(inv_types.iter().cloned());
        let (mut b, args) = FunctionBuilder::new(format!("{body}_grad"), bparams.clone());
        let mut residual_ports: Vec<Option<Port>> = vec![None; d.residual_types.len()];
        let mut stacks_out = Vec::new();
        for (k, &r) in stacked.iter().enumerate() {
            let popped = b.add_node(
                NodeKind::Stack(StackOp::Pop),
                &[args[nc + 1 + k]],
                vec![
                    stack_types[k].clone(),
                    ValueType::Tensor(stack_types[k].inner().clone()),
                ],
            )?;
            stacks_out.push(popped[0]);
            residual_ports[r] = Some(popped[1]);
        }
        for (j, &(r, _)) in invariant.iter().enumerate() {
            residual_ports[r] = Some(args[nc + 1 + stacked.len() + j]);
        }
        let mut bargs: Vec<Port> = args[..nc].to_vec();
        bargs.extend(
            residual_ports
                .into_iter()
                .map(|p| p.expect("every residual is bound")),
        );
        let (grads, _) = inline_into(&mut b, &bwd, &bargs)?;
        // `grads` follow `float_vars`; the new cotangents follow `carried`.
        let mut results: Vec<Port> = carried
            .iter()
            .map(|i| {
                grads[float_vars
                    .iter()
                    .position(|v| v == i)
                    .expect("carried vars are float")]
            })
            .collect();
        let one = b.add_const(Tensor::scalar(1i64));
        results.push(b.add_op1(binary::Sub, &[args[nc], one], None)?);
        results.extend(stacks_out);
        results.extend((0..invariant.len()).map(|j| args[nc + 1 + stacked.len() + j]));
        let grad_body = add_function(tracer, b.finish(&results, &[])?)?;
        let (mut b, args) = FunctionBuilder::new(format!("{cond}_grad"), bparams);
        let zero = b.add_const(Tensor::scalar(0i64));
        let more = b.add_op1(binary::Greater, &[args[nc], zero], None)?;
        let grad_cond = add_function(tracer, b.finish(&[more], &[])?)?;

        let mut forward_extra = vec![ExtraInput::Zero(DType::I64)];
        forward_extra.extend(
            stack_types
                .iter()
                .map(|t| ExtraInput::EmptyStack(t.inner().clone())),
        );
        Ok(Built {
            forward: While::stacked(
                fwd_cond,
                fwd_body,
                *maximum_iterations,
                *parallel_iterations,
            ),
            forward_extra,
            backward: While::stacked(grad_cond, grad_body, None, *parallel_iterations),
            backward_outputs: (n..n + 1 + stacked.len()).collect(),
            backward_inputs: invariant.iter().map(|&(_, i)| i).collect(),
            cotangents: carried.clone(),
            differentiable: carried,
        })
    }
}

/// Per loop variable of `body`: whether the backward loop needs its cotangent. A float tensor
/// variable whose gradient `needs` asks for does, and so does every float variable whose next
/// value depends on one that does (its cotangent flows into theirs); float stacks always may.
/// The others (a loop-invariant input nobody differentiates) are left out, with the
/// residuals only their gradients would use (the RFC's `skip_input_indices`).
fn wanted_vars(body: &Function, needs: &[bool]) -> Vec<bool> {
    let n = body.params.len();
    let float = |i: usize| is_differentiable(&body.params[i]) || is_float_stack(&body.params[i]);
    let mut wanted: Vec<bool> = (0..n)
        .map(|i| {
            is_float_stack(&body.params[i]) || (float(i) && needs.get(i).copied().unwrap_or(true))
        })
        .collect();
    let deps = result_dependencies(body);
    let mut changed = true;
    while changed {
        changed = false;
        for j in 0..n {
            let depends = deps
                .get(j)
                .is_some_and(|d| (0..n).any(|i| wanted[i] && d[i]));
            if !wanted[j] && float(j) && depends {
                wanted[j] = true;
                changed = true;
            }
        }
    }
    wanted
}

/// Per result of `f`: which of its parameters it depends on (through any node: a node's
/// outputs all depend on all its inputs).
fn result_dependencies(f: &Function) -> Vec<Vec<bool>> {
    let n = f.params.len();
    let mut deps: Vec<Vec<bool>> = Vec::with_capacity(f.nodes.len());
    for node in &f.nodes {
        let mut d = vec![false; n];
        if let NodeKind::Arg(k) = node.kind {
            if let Some(x) = d.get_mut(k) {
                *x = true;
            }
        }
        for p in &node.inputs {
            if let Some(from) = deps.get(p.node) {
                for (x, y) in d.iter_mut().zip(from) {
                    *x |= *y;
                }
            }
        }
        deps.push(d);
    }
    f.results
        .iter()
        .map(|p| deps.get(p.node).cloned().unwrap_or_else(|| vec![true; n]))
        .collect()
}

impl Lower for While {
    fn is_loop(&self) -> bool {
        true
    }

    /// A frame: per loop variable `enter -> merge(enter, next_iteration) -> switch(merge,
    /// cond)`, the body on the switches' true side feeding `next_iteration`, `exit` on the
    /// false side. A variable the body returns unchanged is an invariant: a constant `enter`,
    /// switched into the body, and the node's output is the input itself. With
    /// `maximum_iterations` a trip counter is one more variable and the condition becomes
    /// `count < maximum and cond(vars)`, `cond` running only while the count is below.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let library = cx.b.library();
        let body = library.get(&self.body)?;
        let n = cx.inputs.len();
        if n == 0 || body.results.len() != n {
            let msg = format!(
                "a loop needs variables, and @{} must return each",
                self.body
            );
            return Err(Error::new(ErrorKind::Graph, "while", msg));
        }
        let returned_unchanged = |k: usize| {
            let r = body.results[k];
            r.output == 0
                && matches!(body.nodes.get(r.node), Some(Node { kind: NodeKind::Arg(a), .. }) if *a == k)
        };
        let mut invariant: Vec<bool> = (0..n).map(returned_unchanged).collect();
        if invariant.iter().all(|&i| i) {
            invariant[0] = false;
        }
        let stateful = self.state(library)?.0;
        let frame = cx.b.new_frame(cx.scope.frame, self, stateful);
        let outer = cx.scope.clone();
        let inner = Scope {
            frame,
            gate: None,
            origin: outer.origin.clone(),
        };
        let types: Vec<ValueType> = cx
            .inputs
            .iter()
            .map(|&p| cx.b.port_type(p))
            .collect::<Result<_>>()?;
        let counter_ty = ValueType::Tensor(TensorType::scalar(DType::I64));
        let counter = self.maximum_iterations.map(|m| {
            let zero = cx.b.add1(
                &outer,
                DfKind::Const(Constant(Tensor::scalar(0i64))),
                Vec::new(),
                counter_ty.clone(),
            );
            (m, zero)
        });
        // Enters (ordered after the node's control inputs), then merges for the variables
        // that change; the merges' second input is patched to the next_iteration below.
        let mut entries: Vec<(Port, ValueType, bool)> = cx
            .inputs
            .iter()
            .zip(&types)
            .zip(&invariant)
            .map(|((&x, ty), &inv)| (x, ty.clone(), inv))
            .collect();
        if let Some((_, zero)) = counter {
            entries.push((zero, counter_ty.clone(), false));
        }
        let mut current = Vec::with_capacity(entries.len());
        let mut merges = Vec::new();
        for (x, ty, constant) in &entries {
            let enter = DfKind::Enter {
                frame,
                constant: *constant,
            };
            let e = cx.b.add_ordered(
                &outer,
                enter,
                vec![*x],
                cx.control.clone(),
                vec![ty.clone()],
            );
            if *constant {
                current.push(Port::new(e, 0));
                continue;
            }
            let merge = DfKind::Merge { loop_merge: true };
            let m = cx.b.add(
                &inner,
                merge,
                vec![Port::new(e, 0), Port::new(e, 0)],
                vec![ty.clone()],
            );
            merges.push((current.len(), m));
            current.push(Port::new(m, 0));
        }
        let first_merge = merges.first().map(|&(_, m)| m);
        let cond_scope = Scope {
            gate: first_merge,
            ..inner.clone()
        };
        let vars = &current[..n];
        let go = match counter {
            None => single_result(cx.b.lower_function(&self.cond, vars, &cond_scope)?)?,
            Some((m, _)) => {
                let bound = Constant(Tensor::scalar(m));
                let bound = cx.b.add1(
                    &cond_scope,
                    DfKind::Const(bound),
                    Vec::new(),
                    counter_ty.clone(),
                );
                let below = cx.b.add1(
                    &cond_scope,
                    DfKind::Op(binary::Less.into()),
                    vec![current[n], bound],
                    bool_ty(),
                );
                let cond = &self.cond;
                let lowered = cx.b.branches(
                    &cond_scope,
                    below,
                    2,
                    vars,
                    &[bool_ty()],
                    false,
                    &mut |b, scope, k, args| {
                        if k == 1 {
                            return b.lower_function(cond, args, scope);
                        }
                        let no = DfKind::Const(Constant(Tensor::scalar(false)));
                        let no = b.add1(scope, no, Vec::new(), bool_ty());
                        Ok(FunctionLowered {
                            results: vec![no],
                            effects: Vec::new(),
                        })
                    },
                )?;
                single_result(FunctionLowered {
                    results: lowered.outputs,
                    effects: Vec::new(),
                })?
            }
        };
        let switch = DfKind::Switch { outputs: 2 };
        let switched: Vec<NodeId> = current
            .iter()
            .zip(&entries)
            .map(|(&v, (_, ty, _))| {
                cx.b.add(&inner, switch.clone(), vec![v, go], vec![ty.clone(); 2])
            })
            .collect();
        let pivot = cx.b.add1(
            &inner,
            DfKind::Identity,
            vec![Port::new(switched[0], 1)],
            types[0].clone(),
        );
        let body_scope = inner.gated(pivot.node);
        let body_args: Vec<Port> = switched.iter().map(|&s| Port::new(s, 1)).collect();
        let mut next =
            cx.b.lower_function(&self.body, &body_args[..n], &body_scope)?
                .results;
        if counter.is_some() {
            let one = DfKind::Const(Constant(Tensor::scalar(1i64)));
            let one = cx.b.add1(&body_scope, one, Vec::new(), counter_ty.clone());
            let add = DfKind::Op(binary::Add.into());
            next.push(cx.b.add1(
                &body_scope,
                add,
                vec![body_args[n], one],
                counter_ty.clone(),
            ));
        }
        let mut outputs = cx.inputs.clone();
        let mut exits = Vec::new();
        for &(k, m) in &merges {
            let ty = entries[k].1.clone();
            let ni =
                cx.b.add1(&inner, DfKind::NextIteration, vec![next[k]], ty.clone());
            cx.b.set_input(m, 1, ni)?;
            let exit =
                cx.b.add1(&inner, DfKind::Exit, vec![Port::new(switched[k], 0)], ty);
            if k < n {
                outputs[k] = exit;
            }
            exits.push(exit);
        }
        let done = cx
            .needs_done
            .then(|| cx.b.add(&outer, DfKind::NoOp, exits, Vec::new()));
        Ok(Lowered { outputs, done })
    }
}

fn bool_ty() -> ValueType {
    ValueType::Tensor(TensorType::scalar(DType::Bool))
}

/// The one result of a lowered condition.
fn single_result(lowered: FunctionLowered) -> Result<Port> {
    match lowered.results.as_slice() {
        [one] => Ok(*one),
        many => {
            let msg = format!(
                "the condition returned {} values; it must return one",
                many.len()
            );
            Err(Error::new(ErrorKind::ControlFlow, "while", msg))
        }
    }
}

/// `While(vars..., captures...)`; cond and body were traced with the loop variables as
/// parameters. Captures become extra loop variables the body passes through. Returns the
/// final loop variables (without the captures).
pub fn emit_while(
    ctx: &mut dyn Context<Val>,
    functions: &LoopFunctions,
    vars: &[Val],
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "while_loop")?;
    let mut captures = union(&[&functions.cond, &functions.body]);
    let cond = unify(&tracer, &[&functions.cond], vars.len(), &captures, false)?;
    let body = unify(&tracer, &[&functions.body], vars.len(), &captures, true)?;
    if let Some(c) = functions.checkpoints {
        refuse_side_effects(&tracer, &body[0], c)?;
    }
    let names = [cond[0].clone(), body[0].clone()];
    let threaded = thread_variables(
        ctx,
        &tracer,
        &names,
        vars.len(),
        Carrier::Loop,
        &mut captures,
    )?;
    let kind = NodeKind::While(While {
        cond: cond[0].clone(),
        body: body[0].clone(),
        maximum_iterations: functions.maximum_iterations,
        parallel_iterations: functions.parallel_iterations,
        checkpoints: functions.checkpoints,
    });
    let mut inputs = vars.to_vec();
    inputs.extend(captures);
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, vars.len(), Carrier::Loop)
}

/// The most trips a bounded loop's fixed-size gradient state keeps one slot each for
/// (`fixed_state`): past it a bound is a safety net more than a size, and a buffer of every
/// state could exhaust memory, so the loop checkpoints instead.
pub const ALL_STATES_UP_TO: i64 = 4096;

/// The snapshots a loop's gradient keeps where the trace asks for fixed-size state
/// (`Tracer::fixed_state_loops`, as pure StableHLO needs) and the loop names none: one per
/// possible trip when `maximum_iterations` bounds it by at most `ALL_STATES_UP_TO` (every
/// state kept, nothing recomputed), else the trace's default. A body that assigns a Variable
/// cannot be recomputed: it keeps stacks (which such an export then refuses, naming them).
fn fixed_state(
    tracer: &TracerRef,
    body: &Function,
    maximum_iterations: Option<i64>,
) -> Option<u32> {
    let default = crate::trace::lock(tracer).fixed_state_loops?;
    if !body.control_outputs.is_empty() {
        return None;
    }
    match maximum_iterations {
        Some(m) if m <= ALL_STATES_UP_TO => u32::try_from(m.max(1)).ok(),
        _ => Some(default),
    }
}

/// A checkpointed loop runs its body again to recompute states: a body with side effects
/// (a Variable assigned) would repeat them.
fn refuse_side_effects(tracer: &TracerRef, body: &str, c: u32) -> Result<()> {
    let effects = !crate::trace::lock(tracer)
        .library()
        .get(body)?
        .control_outputs
        .is_empty();
    if effects {
        let msg = format!(
            "checkpoints={c} runs the loop body again to recompute the states its gradient \
             needs, which would repeat the body's side effects: it assigns a Variable (reading \
             one is fine); assign outside the loop, or leave checkpoints=None"
        );
        return Err(Error::new(ErrorKind::ControlFlow, "while_loop", msg));
    }
    Ok(())
}

impl PassRules for While {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::Loop {
            cond: &self.cond,
            body: &self.body,
        }
    }

    fn constant_choice(&self, _selector: &Tensor) -> Result<Option<usize>> {
        Ok(None)
    }
}
