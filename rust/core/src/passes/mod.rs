//! Graph-to-graph passes. Each returns a NEW graph; the input is never edited.
//!
//! - `inline_calls`: replaces every `Call` node by the nodes of its callee (recursively), so a
//!   program is one function plus the branch and loop functions of its control flow.
//! - `prune`: keeps what the fetched results need, plus every side effect (control outputs and
//!   their ancestors: a write to a Variable is never dropped).
//! - `eliminate_dead_code` is `prune` with the function's own results as fetches.
//! - `bind_params`: entry parameters replaced by constants (captured tensors of an export).
//! - `fold_constants`, `eliminate_common_subexpressions`, `eliminate_dead_branches`: local
//!   simplifications that keep lazy semantics (a failing op is not folded; only pure nodes
//!   merge; an `If`/`Case` on a constant becomes a `Call` of its branch).
//! - `elide_discarded_stand_ins`: a batched loop's stand-in lanes compute on their own values
//!   where what they compute is discarded and cannot fail.
//! - `functionalize_variables`: variables become values threaded through control flow (the
//!   value on entry a parameter, the value on exit an extra result), for the MLIR emitter.

mod bind;
mod functionalize;
mod functionalize_rewrite;
mod inline;
mod prune;
mod simplify;
mod stand_ins;

#[cfg(test)]
mod functionalize_tests;
#[cfg(test)]
mod simplify_tests;
#[cfg(test)]
mod stand_ins_tests;

pub use bind::bind_params;
pub use functionalize::{
    assigned_value_functions, assigned_variables, functionalize_variables, thread_variables,
    Assignments,
};
pub use inline::inline_calls;
pub use prune::{eliminate_dead_code, prune};
pub use simplify::{eliminate_common_subexpressions, eliminate_dead_branches, fold_constants};
pub use stand_ins::elide_discarded_stand_ins;

use crate::error::Result;
use crate::graph::NodeKind;
use crate::tensor::Tensor;

/// What the passes need of a construct (implemented in `control`, beside its other layers).
pub(crate) trait PassRules {
    /// How the variables its callees assign come back out of it (`functionalize_variables`).
    fn variable_threading(&self) -> Threading<'_>;

    /// The callee that runs when its selector (first input) is the constant `selector`, for a
    /// construct that runs one of its callees by it; None otherwise (`eliminate_dead_branches`).
    fn constant_choice(&self, selector: &Tensor) -> Result<Option<usize>>;
}

/// How a construct passes on the variables its callees assign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threading<'a> {
    /// Each callee takes a variable's value in its resource's place and returns, after its
    /// results, the final value of every variable that any callee assigns (`If`, `Case`, `Call`).
    AfterResults,
    /// A loop: a variable is a loop variable, which `body` returns with its final value (and
    /// already passes through); a `cond` that assigns one has no such form (`While`).
    Loop { cond: &'a str, body: &'a str },
    /// It calls no function (variable and stack nodes).
    NoCallees,
}

/// A construct's `PassRules` (`None` for arguments, constants and ops).
pub(crate) fn construct_rules(kind: &NodeKind) -> Option<&dyn PassRules> {
    crate::graph::construct_as!(kind, PassRules)
}

/// `kind`'s threading; `NoCallees` for what is not a construct.
pub(crate) fn threading(kind: &NodeKind) -> Threading<'_> {
    construct_rules(kind).map_or(Threading::NoCallees, |c| c.variable_threading())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{parse_graph, verify, Graph};
    use crate::interpret::{run_graph, RtValue, VariableRef};
    use crate::tensor::Tensor;

    const CALLS: &str = r#"graph @main

func @main(%0: f64[2], %1: resource<f64[2]>) -> (f64[2], f64[2]) {
  %2 = call(%0) {function=@twice} : f64[2]
  %3 = call(%2) {function=@twice} : f64[2]
  %4 = sin(%0) : f64[2]
  %5 = assign_add_variable(%1, %4) : ()
  %6 = cos(%3) : f64[2]
  return %3, %6 ctrl(%5)
}

func @twice(%0: f64[2]) -> (f64[2]) {
  %1 = add(%0, %0) : f64[2]
  return %1
}
"#;

    fn run(g: &Graph, x: &Tensor, v: &VariableRef) -> Vec<Vec<f64>> {
        verify(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
        let args = vec![RtValue::Tensor(x.clone()), RtValue::Resource(v.clone())];
        run_graph(g, args)
            .unwrap()
            .into_iter()
            .map(|r| r.into_tensor().unwrap().to_f64_vec())
            .collect()
    }

    #[test]
    fn inlining_and_pruning_keep_results_and_side_effects() {
        let g = parse_graph(CALLS).unwrap();
        let x = Tensor::from_vec(vec![0.5f64, -1.0], &[2]).unwrap();
        let v = VariableRef::new(Tensor::from_vec(vec![0.0f64, 0.0], &[2]).unwrap());
        let want = run(&g, &x, &v);

        let inlined = inline_calls(&g).unwrap();
        assert_eq!(inlined.library.len(), 1, "{inlined}");
        assert!(!inlined.to_string().contains("call("), "{inlined}");
        assert_eq!(run(&inlined, &x, &v), want);

        let pruned = prune(&inlined, &[0]).unwrap();
        let text = pruned.to_string();
        assert!(!text.contains("cos("), "{text}");
        assert!(
            text.contains("assign_add_variable"),
            "side effects are never pruned: {text}"
        );
        let before = v.read().to_f64_vec();
        assert_eq!(run(&pruned, &x, &v), vec![want[0].clone()]);
        let after = v.read().to_f64_vec();
        assert!((after[0] - before[0] - 0.5f64.sin()).abs() < 1e-15);
        assert!(prune(&g, &[2]).is_err());
        assert_eq!(
            eliminate_dead_code(&g)
                .unwrap()
                .entry_function()
                .unwrap()
                .nodes
                .len(),
            7
        );
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;
    use crate::graph::parse_graph;
    use crate::interpret::{run_graph, RtValue};
    use crate::tensor::Tensor;

    #[test]
    fn bound_parameters_become_constants() {
        let g = parse_graph(
            "graph @f\n\nfunc @f(%0: f64[2], %1: f64[2]) -> (f64[2]) {\n  %2 = mul(%0, %1) : f64[2]\n  return %2\n}\n",
        )
        .unwrap();
        let w = Tensor::from_vec(vec![2.0f64, -1.0], &[2]).unwrap();
        let bound = bind_params(&g, &[None, Some(w)]).unwrap();
        assert_eq!(bound.entry_function().unwrap().params.len(), 1);
        let x = Tensor::from_vec(vec![3.0f64, 4.0], &[2]).unwrap();
        let out = run_graph(&bound, vec![RtValue::Tensor(x)]).unwrap();
        assert_eq!(out[0].as_tensor().unwrap().to_f64_vec(), vec![6.0, -4.0]);
        let wrong = Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap();
        assert!(bind_params(&g, &[None, Some(wrong)]).is_err());
        assert!(bind_params(&g, &[None]).is_err());
    }
}
