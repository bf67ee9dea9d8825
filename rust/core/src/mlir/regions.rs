//! What functional control flow shares as `scf` regions: each construct's `EmitMlir` (in
//! `crate::control`) writes its op — `If` -> `scf.if`, `Case` -> a chain of `scf.if`, `While` ->
//! `scf.while` — and every region through one helper here, `region`: it emits the
//! region's contents (a branch, cond or body function inlined on the region's values) and ends
//! the block with the region's terminator, results cast to the types the node declares.
//!
//! ```text
//!   %p = tensor.extract %pred[] : tensor<i1>          If: the tensor<i1> predicate as an i1
//!   %r:2 = scf.if %p -> (T0, T1) { <then> scf.yield } else { <else> scf.yield }
//!
//!   %i = tensor.extract %index[] : tensor<i32>         Case: compare with 0, 1, ..., n-2
//!   %r = scf.if (%i == 0) { <branch 0> } else { scf.if (%i == 1) { .. } else { <last> } }
//!                         (out of range, negative included, runs the last branch)
//!
//!   %r:n = scf.while (%v = %init, ...) : (T...) -> (T...) {
//!     <cond(%v...)> ; scf.condition(%c) %v...               before: test, forward the vars
//!   } do {
//!   ^bb0(%w...): <body(%w...)> ; scf.yield %next...         after: one trip
//!   }
//! ```
//!
//! `maximum_iterations` adds a leading `i64` counter to the loop-carried values: the loop goes
//! on while `cond(vars) && counter < maximum_iterations`, and the body adds 1.
//!
//! `Case` is not `scf.index_switch`: IREE 3.13's stream conversion rejects `index_switch`
//! ("expected each region to return 1 values"); a chain of `scf.if` compiles everywhere.
//!
//! A loop body can end with one `stablehlo.optimization_barrier` over some of its next values
//! and their block arguments, the body then yielding the barrier's results:
//!
//! ```text
//!   ^bb0(%n, %x, %x_prev): ...  %b:2 = stablehlo.optimization_barrier %x_prev, %x
//!                               scf.yield %n1, %x1, %b#1
//! ```
//!
//! Why: IREE 3.13 rotates most `scf.while` loops into do-while form (its loop-invariant code
//! motion wraps them in a zero-trip check) and then canonicalizes them. For a loop variable
//! the body never reads (`x_prev = x`), whose next value is loop-invariant (a gradient
//! accumulator reset to zero) or equals another's, that removes the variable's `before` or
//! its `after` block argument alone; the two blocks then differ, and the stream conversion of
//! `scf.while` (which converts both blocks with the signature of the loop's operands) crashes
//! `iree-compile` (out-of-bounds in `applySignatureConversion`). The barrier keeps such an
//! argument read and such a value opaque; `control/while_loop/loop_vars.rs` finds these variables. Only they go
//! through it: a barrier on loop-carried values makes IREE wait for them on every trip.
//! Dynamically shaped tensors (stack buffers) cannot: IREE's shape cleanup rejects them there.

use std::collections::HashSet;

use super::emitter::{names_text, type_text, MlirValue};
use super::function::{flat_names, flat_types_of, operand_list, Bound, Lowering};
use super::YieldBarriers;
use crate::error::Result;
use crate::graph::ValueType;
use crate::shape::DYN;

/// How a region's block ends.
pub(crate) enum Terminator<'a> {
    /// `scf.yield` of the results.
    Yield,
    /// `scf.yield` of a branch's results where, with `EmitOptions::yield_barriers`, tensors go
    /// through their own optimization barriers: every one (`All`), or one yielded before, or
    /// equal to one yielded before once IREE folds constants (`Repeats`; `Constants` also where
    /// it is a constant). IREE 3.13 packs and merges the buffers of a branch's results, and with
    /// fewer barriers returns wrong numbers for some modules. Each choice is a form
    /// `compiled.py` tries.
    BranchYield,
    /// `scf.condition(%c)` forwarding `vars` (typed `types`), the result being the predicate;
    /// with a counter `(name, maximum)`, also tests `name < maximum`.
    Condition {
        vars: &'a [String],
        types: &'a [String],
        counter: Option<(&'a str, &'a str)>,
    },
    /// `scf.yield` of the results, after a counter `name` incremented by the constant `one`.
    YieldCounting { counter: &'a str, one: &'a str },
}

impl Lowering<'_> {
    /// One region: the values `body` emits (usually a function inlined), cast to `types`,
    /// then `term`. `block` is the `^bb0(...)` header a region with block arguments needs.
    pub(crate) fn region(
        &mut self,
        block: Option<String>,
        types: &[ValueType],
        body: impl FnOnce(&mut Self) -> Result<Vec<Bound>>,
        term: Terminator<'_>,
    ) -> Result<()> {
        if let Some(header) = block {
            self.e.line(&header);
        }
        self.e.indent();
        let site = self.e.site().clone();
        let results = body(self)?;
        // a condition's predicate is an operand of `scf.condition`, not a carried value
        let mut results = match term {
            Terminator::Condition { .. } => self.coerce_all(results, types)?,
            _ => self.carried_all(results, types)?,
        };
        if matches!(term, Terminator::BranchYield)
            && self.e.options.yield_barriers != YieldBarriers::None
        {
            self.distinct_yields(&mut results);
        }
        self.e.set_site(site);
        if self.e.options.pure_stablehlo {
            self.stablehlo_return(results, term)?;
            self.e.dedent();
            return Ok(());
        }
        match term {
            Terminator::Yield | Terminator::BranchYield => {
                let names = flat_names(&results);
                let flat = flat_types_of(&self.e, types)?;
                self.e
                    .line(&format!("scf.yield{}", operand_list(&names, &flat)));
            }
            Terminator::YieldCounting { counter, one } => {
                let next = self.e.fresh();
                let loc = self.e.loc();
                self.e
                    .line(&format!("{next} = arith.addi {counter}, {one} : i64 {loc}"));
                let mut names = vec![next];
                names.extend(flat_names(&results));
                let mut flat = vec!["i64".to_string()];
                flat.extend(flat_types_of(&self.e, types)?);
                self.e
                    .line(&format!("scf.yield{}", operand_list(&names, &flat)));
            }
            Terminator::Condition {
                vars,
                types: var_types,
                counter,
            } => {
                let [pred] = results.as_slice() else {
                    return Err(self.e.bug("a loop condition must return one bool[]"));
                };
                let mut go = self.scalar_input(pred)?;
                if let Some((k, max)) = counter {
                    let loc = self.e.loc();
                    let below = self.e.fresh();
                    self.e
                        .line(&format!("{below} = arith.cmpi slt, {k}, {max} : i64 {loc}"));
                    let both = self.e.fresh();
                    self.e
                        .line(&format!("{both} = arith.andi {go}, {below} : i1 {loc}"));
                    go = both;
                }
                self.e.line(&format!(
                    "scf.condition({go}){}",
                    operand_list(vars, var_types)
                ));
            }
        }
        self.e.dedent();
        Ok(())
    }
}

impl Lowering<'_> {
    /// A region's end as pure StableHLO (`EmitOptions::pure_stablehlo`): `stablehlo.return` of
    /// its results, or of a loop's predicate (`and` the counter below its limit, both
    /// `tensor<i64>`); a counting body returns its counter plus one first.
    fn stablehlo_return(&mut self, results: Vec<Bound>, term: Terminator<'_>) -> Result<()> {
        let loc = self.e.loc();
        let mut values = results
            .iter()
            .map(|b| self.tensor_input(b))
            .collect::<Result<Vec<_>>>()?;
        match term {
            Terminator::Yield | Terminator::BranchYield => {}
            Terminator::YieldCounting { counter, one } => {
                let next = self.e.fresh();
                self.e.line(&format!(
                    "{next} = stablehlo.add {counter}, {one} : tensor<i64> {loc}"
                ));
                let ty = crate::shape::TensorType::scalar(crate::dtype::DType::I64);
                values.insert(0, MlirValue { name: next, ty });
            }
            Terminator::Condition { counter, .. } => {
                let [pred] = values.as_slice() else {
                    return Err(self.e.bug("a loop condition must return one bool[]"));
                };
                let mut go = pred.clone();
                if let Some((k, max)) = counter {
                    let below = self.e.fresh();
                    self.e.line(&format!(
                        "{below} = stablehlo.compare LT, {k}, {max}, SIGNED : (tensor<i64>, \
                         tensor<i64>) -> tensor<i1> {loc}"
                    ));
                    let both = self.e.fresh();
                    self.e.line(&format!(
                        "{both} = stablehlo.and {}, {below} : tensor<i1> {loc}",
                        go.name
                    ));
                    go.name = both;
                }
                values = vec![go];
            }
        }
        let flat: Vec<String> = values.iter().map(|v| type_text(&v.ty)).collect();
        self.e.line(&format!(
            "\"stablehlo.return\"({}) : ({}) -> ()",
            names_text(&values),
            flat.join(", ")
        ));
        Ok(())
    }

    /// `stablehlo.if` or `stablehlo.case` on `selector`: one region per branch, each the
    /// branch inlined on `operands` and returned as `types`.
    pub(crate) fn stablehlo_branches(
        &mut self,
        op: &str,
        selector: &MlirValue,
        branches: &[&str],
        operands: &[Bound],
        types: &[ValueType],
    ) -> Result<Vec<Bound>> {
        let flat = flat_types_of(&self.e, types)?;
        let (prefix, names) = self.result_names(&flat);
        let (site, loc) = (self.e.site().clone(), self.e.loc());
        self.e
            .line(&format!("{prefix}\"{op}\"({}) ({{", selector.name));
        for (k, branch) in branches.iter().enumerate() {
            if k > 0 {
                self.e.line("}, {");
            }
            let body = |l: &mut Self| l.inline(branch, operands.to_vec());
            self.region(None, types, body, Terminator::BranchYield)?;
        }
        self.e.set_site(site);
        self.e.line(&format!(
            "}}) : ({}) -> ({}) {loc}",
            type_text(&selector.ty),
            flat.join(", ")
        ));
        self.unpack(types, &names)
    }

    /// A tensor that starts two loop variables goes to the second through an optimization
    /// barrier: IREE 3.13's VM moves a buffer passed twice on the loop's entry branch out of
    /// one register before the other is read ("binding table slot requires a buffer", the
    /// iree-org/iree#24753 family), as when a loop variable starts equal to another and the
    /// body never reads it. A statically shaped initial tensor the body `pushed` onto a list
    /// (with list stacks) gets one too: a buffer the loop both carries and holds in a list
    /// otherwise fails alike ("ref is null"). A barrier on every initial tensor breaks other
    /// modules the same way.
    pub(crate) fn distinct_inits(&mut self, inits: &mut [Bound], pushed: &[bool]) {
        let mut seen = HashSet::new();
        for (b, &pushed) in inits.iter_mut().zip(pushed) {
            let Bound::Tensor(v) = b.clone() else {
                continue;
            };
            if seen.insert(v.name.clone()) && !(pushed && static_tensor(b).is_some()) {
                continue;
            }
            *b = Bound::Tensor(self.barrier(&v));
        }
    }

    /// See `Terminator::BranchYield`.
    fn distinct_yields(&mut self, values: &mut [Bound]) {
        let option = self.e.options.yield_barriers;
        let mut seen = HashSet::new();
        for b in values.iter_mut() {
            let Bound::Tensor(v) = b.clone() else {
                continue;
            };
            let repeated = !seen.insert(self.e.value_key(&v));
            if static_tensor(b).is_none() {
                continue; // a dynamically shaped tensor cannot go through (see the module doc)
            }
            let constant = self.e.is_constant(&v);
            let kind = match (repeated, constant) {
                (false, _) => YieldBarriers::All,
                (true, true) => YieldBarriers::Constants,
                (true, false) => YieldBarriers::Repeats,
            };
            if kind > option {
                continue;
            }
            *b = Bound::Tensor(self.barrier(&v));
            self.e.yield_barriers = self.e.yield_barriers.max(kind);
        }
    }

    fn barrier(&mut self, v: &MlirValue) -> MlirValue {
        let name = self.e.fresh();
        let loc = self.e.loc();
        self.e.line(&format!(
            "{name} = stablehlo.optimization_barrier {} : {} {loc}",
            v.name,
            type_text(&v.ty)
        ));
        MlirValue {
            name,
            ty: v.ty.clone(),
        }
    }

    /// The loop variables: the `fixed` ones (passed through unchanged) where given, else the
    /// next of the `carried` ones.
    pub(crate) fn with_fixed(
        &self,
        fixed: &[Option<Bound>],
        carried: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let mut carried = carried.into_iter();
        let vars = fixed
            .iter()
            .map(|f| f.clone().or_else(|| carried.next()))
            .collect::<Option<Vec<_>>>();
        match (vars, carried.next()) {
            (Some(vars), None) => Ok(vars),
            _ => Err(self.e.bug("loop variables and carried values disagree")),
        }
    }

    /// `next` with the values of the `exposed` loop variables (statically shaped tensors only)
    /// replaced by results of one `stablehlo.optimization_barrier` over them and their block
    /// arguments `args` (see the module doc and `control/while_loop/loop_vars.rs`).
    pub(crate) fn loop_barrier(
        &mut self,
        args: &[Bound],
        next: Vec<Bound>,
        exposed: &[bool],
    ) -> Result<Vec<Bound>> {
        let mut operands: Vec<MlirValue> = Vec::new();
        let mut slot = |v: MlirValue| match operands.iter().position(|o| o.name == v.name) {
            Some(i) => i,
            None => {
                operands.push(v);
                operands.len() - 1
            }
        };
        let mut slots = vec![None; next.len()];
        for (k, b) in next.iter().enumerate() {
            let (Some(v), true) = (static_tensor(b), exposed.get(k) == Some(&true)) else {
                continue;
            };
            if let Some(a) = args.get(k).and_then(static_tensor) {
                slot(a);
            }
            slots[k] = Some(slot(v));
        }
        if operands.is_empty() {
            return Ok(next);
        }
        let flat: Vec<String> = operands.iter().map(|v| type_text(&v.ty)).collect();
        let (prefix, names) = self.result_names(&flat);
        let loc = self.e.loc();
        self.e.line(&format!(
            "{prefix}stablehlo.optimization_barrier {} : {} {loc}",
            names_text(&operands),
            flat.join(", ")
        ));
        Ok(next
            .into_iter()
            .zip(slots)
            .map(|(b, slot)| match (slot, b) {
                (Some(i), Bound::Tensor(v)) => Bound::Tensor(MlirValue {
                    name: names[i].clone(),
                    ty: v.ty,
                }),
                (_, b) => b,
            })
            .collect())
    }
}

/// The value of a tensor of static shape (what a barrier takes), or None.
pub(crate) fn static_tensor(b: &Bound) -> Option<MlirValue> {
    match b {
        Bound::Tensor(v) if !v.ty.shape.contains(&DYN) => Some(v.clone()),
        _ => None,
    }
}

/// The first input (a predicate or index tensor) and the operands after it.
pub(crate) fn split_first(l: &Lowering<'_>, inputs: Vec<Bound>) -> Result<(Bound, Vec<Bound>)> {
    let Some((first, rest)) = inputs.split_first() else {
        return Err(l.e.bug("a control-flow node without inputs"));
    };
    Ok((first.clone(), rest.to_vec()))
}

/// ` -> (T, ...)` after an op with results, or nothing.
pub(crate) fn arrow(flat: &[String]) -> String {
    if flat.is_empty() {
        String::new()
    } else {
        format!(" -> ({})", flat.join(", "))
    }
}
