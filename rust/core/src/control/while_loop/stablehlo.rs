//! `While` as pure StableHLO (`EmitOptions::pure_stablehlo`), the form every StableHLO
//! consumer reads: one trip per iteration, rank-0 values as tensors, nothing unrolled.
//!
//! ```text
//!   %r:n = "stablehlo.while"(%k0, %init...) ({
//!   ^bb0(%k: tensor<i64>, %v...):  <cond(%v...)> ; and (%k < maximum) ; stablehlo.return %go
//!   }, {
//!   ^bb0(%k: tensor<i64>, %w...):  <body(%w...)> ; stablehlo.return %k + 1, %next...
//!   }) : (tensor<i64>, T...) -> (tensor<i64>, T...)
//! ```
//!
//! The counter exists only with `maximum_iterations`. Variables the body passes through are
//! not carried (`loop_vars::split_invariants`): both regions read the value from outside.

use super::loop_vars;
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{Node, ValueType, While};
use crate::mlir::function::{flat_names, flat_types_of};
use crate::mlir::regions::Terminator;
use crate::mlir::{Bound, Lowering};

impl While {
    pub(super) fn emit_stablehlo(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let types = &node.outputs;
        let body_fn = l.library.get(&self.body)?;
        let (fixed, carried_inputs, ctypes) =
            loop_vars::split_invariants(l, body_fn, inputs, types)?;
        let inits = l.coerce_all(carried_inputs, &ctypes)?;
        let mut init_names = flat_names(&inits);
        let mut flat = flat_types_of(&l.e, &ctypes)?;
        let limits = self.maximum_iterations.map(|max| {
            let zero = l.e.scalar(DType::I64, 0.0);
            init_names.insert(0, zero.name);
            flat.insert(0, "tensor<i64>".to_string());
            (
                l.e.scalar(DType::I64, max as f64).name,
                l.e.scalar(DType::I64, 1.0).name,
            )
        });
        let counted = usize::from(limits.is_some());
        let (site, loc) = (l.e.site().clone(), l.e.loc());
        let (prefix, names) = l.result_names(&flat);
        let block = |l: &mut Lowering<'_>| -> (Vec<String>, String) {
            let args: Vec<String> = flat.iter().map(|_| l.e.fresh()).collect();
            let typed: Vec<String> = (args.iter().zip(&flat))
                .map(|(a, t)| format!("{a}: {t}"))
                .collect();
            let header = format!("^bb0({}):", typed.join(", "));
            (args, header)
        };
        l.e.line(&format!(
            "{prefix}\"stablehlo.while\"({}) ({{",
            init_names.join(", ")
        ));
        let (before, header) = block(l);
        let term = Terminator::Condition {
            vars: &[],
            types: &[],
            counter: (limits.as_ref()).map(|(limit, _)| (before[0].as_str(), limit.as_str())),
        };
        let test = |l: &mut Lowering<'_>| {
            let carried = l.unpack(&ctypes, &before[counted..])?;
            let vars = l.with_fixed(&fixed, carried)?;
            l.inline(&self.cond, vars)
        };
        let pred = [ValueType::tensor(DType::Bool, &[])];
        l.region(Some(header), &pred, test, term)?;
        l.e.line("}, {");
        let (after, header) = block(l);
        let term = match &limits {
            Some((_, one)) => Terminator::YieldCounting {
                counter: &after[0],
                one,
            },
            None => Terminator::Yield,
        };
        let step = |l: &mut Lowering<'_>| {
            let carried = l.unpack(&ctypes, &after[counted..])?;
            let vars = l.with_fixed(&fixed, carried)?;
            let next = l.inline(&self.body, vars)?;
            let next = l.coerce_all(next, types)?;
            Ok(loop_vars::carried_only(next, &fixed))
        };
        l.region(Some(header), &ctypes, step, term)?;
        l.e.set_site(site);
        let sig = flat.join(", ");
        l.e.line(&format!("}}) : ({sig}) -> ({sig}) {loc}"));
        let results = l.unpack(&ctypes, &names[counted..])?;
        l.with_fixed(&fixed, results)
    }
}
