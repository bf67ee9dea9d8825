//! The loop's MLIR: `scf.while` with the trip count and stack bounds, through the region
//! helpers of `mlir::regions`; cheap bodies run several predicated iterations per trip (`trips`).

use super::bounds::loop_pushes_at;
use super::trips::Countdown;
use super::{bounds, loop_vars, trips};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::Node;
use crate::graph::{Function, ValueType, While};
use crate::graph::{NodeKind, StackOp};
use crate::mlir::function::one;
use crate::mlir::function::{flat_names, flat_types_of};
use crate::mlir::regions::Terminator;
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::mlir::{Bound, EmitMlir, Lowering};

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

/// One `scf.while` of a loop, as `While::emit_loop` writes it: the loop variables split into
/// those the body passes through (`fixed`, not carried) and the carried ones, their flat MLIR
/// types and the regions' block arguments, and how its trips run.
struct ScfWhile<'a> {
    body_fn: &'a Function,
    types: &'a [ValueType],
    trips: Trips,
    fixed: Vec<Option<Bound>>,
    ctypes: Vec<ValueType>,
    flat: Vec<String>,
    /// The condition region's block arguments, and the body region's.
    before: Vec<String>,
    after: Vec<String>,
    /// The results' names (`Lowering::result_names`).
    prefix: String,
    results: Vec<String>,
    /// A trip counter first among them (`maximum_iterations`): its limit and the constant 1.
    limits: Option<(String, String)>,
    per_trip: usize,
    predicated: bool,
    host_vars: Option<Vec<bool>>,
    /// The name of the number of iterations a predicated trip kept, where it counts them.
    kept_name: Option<String>,
    /// Per loop variable, whether its stack's rows are reserved, and whether it is exposed.
    reserve: Vec<bool>,
    exposed: Vec<bool>,
}

impl ScfWhile<'_> {
    /// How many block arguments come before the loop variables (the trip counter's one).
    fn counted(&self) -> usize {
        usize::from(self.limits.is_some())
    }
}

impl While {
    /// One `scf.while` of the loop over `inputs` whose trips run as `trips` says; its results.
    fn emit_loop(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
        trips: Trips,
    ) -> Result<Vec<Bound>> {
        let library = l.library;
        let body_fn = library.get(&self.body)?;
        let loc = l.e.loc();
        let (shape, init_names) = self.scf_while(l, body_fn, &node.outputs, inputs, trips, &loc)?;
        let counted = shape.counted();
        let carried: Vec<String> = (shape.before.iter().zip(&init_names))
            .map(|(b, i)| format!("{b} = {i}"))
            .collect();
        let site = l.e.site().clone();
        let sig = shape.flat.join(", ");
        l.e.line(&format!(
            "{}scf.while ({}) : ({sig}) -> ({sig}) {{",
            shape.prefix,
            carried.join(", ")
        ));
        let counter =
            (shape.limits.as_ref()).map(|(limit, _)| (shape.before[0].as_str(), limit.as_str()));
        let term = Terminator::Condition {
            vars: &shape.before,
            types: &shape.flat,
            counter,
        };
        let pred = [ValueType::tensor(DType::Bool, &[])];
        let test = |l: &mut Lowering<'_>| {
            let carried = l.unpack(&shape.ctypes, &shape.before[counted..])?;
            let vars = l.with_fixed(&shape.fixed, carried)?;
            match trips {
                Trips::Exact(c) => Ok(vec![l.at_least(&vars[c.count], c.per_trip)?]),
                _ => l.inline(&self.cond, vars),
            }
        };
        l.region(None, &pred, test, term)?;
        l.e.line("} do {");
        let block_args: Vec<String> = (shape.after.iter().zip(&shape.flat))
            .map(|(a, t)| format!("{a}: {t}"))
            .collect();
        let header = format!("^bb0({}):", block_args.join(", "));
        let term = match &shape.limits {
            Some((_, one)) => Terminator::YieldCounting {
                counter: &shape.after[0],
                one: shape.kept_name.as_deref().unwrap_or(one),
            },
            None => Terminator::Yield,
        };
        l.region(
            Some(header),
            &shape.ctypes,
            |l| self.emit_trip(l, &shape),
            term,
        )?;
        l.e.set_site(site);
        l.e.line(&format!("}} {loc}"));
        let results = l.unpack(&shape.ctypes, &shape.results[counted..])?;
        l.with_fixed(&shape.fixed, results)
    }

    /// The loop's `ScfWhile` and the names of its initial values: stacks reserved, invariants
    /// split off, the trip counter's constants written, the trips' unrolling charged.
    fn scf_while<'s>(
        &self,
        l: &mut Lowering<'_>,
        body_fn: &'s Function,
        types: &'s [ValueType],
        mut inputs: Vec<Bound>,
        trips: Trips,
        loc: &str,
    ) -> Result<(ScfWhile<'s>, Vec<String>)> {
        let library = l.library;
        let pushes = |k| bounds::loop_pushes(library, &self.body, k, self.maximum_iterations);
        let reserve = l.reserve_stacks(&pushes, &mut inputs);
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
        let mut init_names = flat_names(&inits);
        let mut flat = flat_types_of(&l.e, &ctypes)?;
        let limits = match self.maximum_iterations {
            Some(max) => {
                let (zero, limit, one) = (l.e.fresh(), l.e.fresh(), l.e.fresh());
                for (name, v) in [(&zero, 0), (&limit, max), (&one, 1)] {
                    l.e.line(&format!("{name} = arith.constant {v} : i64 {loc}"));
                }
                init_names.insert(0, zero);
                flat.insert(0, "i64".to_string());
                Some((limit, one))
            }
            None => None,
        };
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
        // Names in the order the module has always had them (its text is a cache key).
        let kept_name = (predicated && counts).then(|| l.e.fresh());
        let (prefix, results) = l.result_names(&flat);
        let before = flat.iter().map(|_| l.e.fresh()).collect();
        let after = flat.iter().map(|_| l.e.fresh()).collect();
        let shape = ScfWhile {
            body_fn,
            types,
            trips,
            fixed,
            ctypes,
            flat,
            before,
            after,
            prefix,
            results,
            limits,
            per_trip,
            predicated,
            host_vars: host_vars.filter(|_| predicated),
            kept_name,
            reserve,
            exposed: loop_vars::exposed(body_fn),
        };
        Ok((shape, init_names))
    }

    /// The body region of `shape`: one trip (its first iteration, and the others it runs),
    /// the carried variables it yields.
    fn emit_trip(&self, l: &mut Lowering<'_>, shape: &ScfWhile<'_>) -> Result<Vec<Bound>> {
        let carried = l.unpack(&shape.ctypes, &shape.after[shape.counted()..])?;
        let mut vars = l.with_fixed(&shape.fixed, carried)?;
        let device_rank0 = l.device_rank0;
        if let Some(host) = &shape.host_vars {
            l.device_rank0 = true;
            for (var, &on_host) in vars.iter_mut().zip(host) {
                if !on_host {
                    *var = l.on_device(var.clone())?;
                }
            }
        }
        for (var, _) in vars.iter().zip(&shape.reserve).filter(|(_, &r)| r) {
            if let Bound::Stack { buffer, .. } = var {
                l.reserved.insert(buffer.name.clone());
            }
        }
        let args = vars.clone();
        if shape.predicated {
            l.deferred_pushes = Some(Vec::new());
        }
        let only_pops =
            (shape.body_fn.nodes.iter()).all(|n| n.kind != NodeKind::Stack(StackOp::Push));
        let pops_at = match shape.trips {
            Trips::Exact(_) if only_pops => {
                l.hoisted_pops = Some(String::new());
                Some(l.e.mark())
            }
            _ => None,
        };
        let first = l.inline(&self.body, vars)?;
        let mut next = l.coerce_all(first, shape.types)?;
        let (alive, speculated) = self.later_iterations(l, shape, &mut next)?;
        l.flush_pushes();
        if let (Some(at), Some(pops)) = (pops_at, l.hoisted_pops.take()) {
            l.e.insert_at(at, &pops);
        }
        if !alive.is_empty() {
            let kept = trips::Kept {
                alive,
                counted: shape.kept_name.as_deref(),
                host_vars: shape.host_vars.as_deref(),
            };
            l.choose_kept(kept, &args, &mut next, speculated)?;
        }
        l.device_rank0 = device_rank0;
        let next = l.loop_barrier(&args, next, &shape.exposed)?;
        Ok(loop_vars::carried_only(next, &shape.fixed))
    }

    /// A trip's iterations after its first, `next` advanced through them: in a countdown, all
    /// of them run; otherwise they run on speculatively, each from the one before, with whether
    /// the condition has held at every one so far. The iterations kept are a prefix, so each
    /// variable is chosen from its values at the trip's end (`Lowering::choose_kept`): returns
    /// whether each iteration is kept, and each variable's value after each iteration.
    #[allow(clippy::type_complexity)]
    fn later_iterations(
        &self,
        l: &mut Lowering<'_>,
        shape: &ScfWhile<'_>,
        next: &mut Vec<Bound>,
    ) -> Result<(Vec<Bound>, Vec<Vec<Bound>>)> {
        let mut alive: Vec<Bound> = Vec::new();
        let mut speculated: Vec<Vec<Bound>> = next.iter().map(|v| vec![v.clone()]).collect();
        for j in 1..shape.per_trip {
            if let Trips::Exact(_) = shape.trips {
                let stepped = l.inline(&self.body, std::mem::take(next))?;
                *next = l.coerce_all(stepped, shape.types)?;
                continue;
            }
            let go = l.inline(&self.cond, next.clone())?;
            let [mut go] = one(l, go)?;
            if let Some((limit, _)) = &shape.limits {
                let below = l.counter_below(&shape.after[0], j, limit);
                go = l.both(go, below)?;
            }
            if let Some(before) = alive.last() {
                go = l.both(before.clone(), go)?;
            }
            let stepped = l.inline(&self.body, std::mem::take(next))?;
            *next = l.coerce_all(stepped, shape.types)?;
            for (values, value) in speculated.iter_mut().zip(next.iter()) {
                values.push(value.clone());
            }
            alive.push(go);
        }
        Ok((alive, speculated))
    }
}
