//! `If`: `(pred: bool[], operands...) -> results`, calling `then_branch(operands)` when the
//! predicate holds and `else_branch(operands)` otherwise (`gl.cond`).
//!
//! - Type rule: a bool scalar predicate; both branches take the operands and return the
//!   node's outputs, agreeing with each other.
//! - Gradient: the branch gradient of `control::branches` (each branch replayed into a forward
//!   function that also returns its residuals, an `If` over the backward functions).
//! - Interpretation: runs one branch. MLIR: `scf.if` (`mlir::regions` has the region helpers).

use std::sync::Arc;

use super::branch_batching::batch_branches;
use super::branches::branch_gradient;
use crate::batch::{BatchNode, NodeBatch};
use crate::dataflow::{Lower, LowerNode, Lowered};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_branches;
use crate::graph::verify_nodes::scalar as scalar_type;
use crate::graph::Node;
use crate::graph::NodeKind;
use crate::graph::{
    joined_results, AttrReader, Check, If, Library, NodeRule, ParseNode, ValueType,
};
use crate::interpret::nodes::scalar;
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::function::flat_types_of;
use crate::mlir::regions::{arrow, split_first, Terminator};
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::Context;
use crate::ops::{build, Values};
use crate::passes::{PassRules, Threading};
use crate::tape::GradientFunction;
use crate::tensor::Tensor;
use crate::trace::captures::{tracer_of, unify, union, Branch};
use crate::trace::gradients::{ControlGradient, Differentiate};
use crate::trace::lock;
use crate::trace::variables::{thread_variables, Carrier};
use crate::trace::Val;

impl NodeRule for If {
    fn keyword(&self) -> &'static str {
        "if"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("then", FuncName(&self.then_branch).to_string()),
            ("else", FuncName(&self.else_branch).to_string()),
        ]
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.then_branch, &self.else_branch]
    }

    fn operand_start(&self) -> usize {
        1
    }

    fn with_callees(&self, names: Vec<String>) -> NodeKind {
        let mut names = names.into_iter();
        let mut next = |old: &String| names.next().unwrap_or_else(|| old.clone());
        NodeKind::If(If {
            then_branch: next(&self.then_branch),
            else_branch: next(&self.else_branch),
        })
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let pred = ins.first().ok_or("if needs a predicate input")?;
        scalar_type("predicate", pred, DType::Bool)?;
        let names = [&self.then_branch, &self.else_branch];
        let roles = ["then branch", "else branch"];
        check_branches(library, &names, &roles, &ins[1..], outs)
    }

    /// The branches' result types joined (a dimension they disagree on is unknown).
    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        joined_results("if", library, &self.callees())
    }
}

impl ParseNode for If {
    const KEYWORDS: &'static [&'static str] = &["if"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(If {
            then_branch: attrs.function("then")?,
            else_branch: attrs.function("else")?,
        })
    }
}

impl Interpret for If {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let (pred, operands) = run.split_first()?;
        let pred = scalar::<bool>(pred, "if", "predicate")?;
        let results = run.call_callee(usize::from(!pred), operands)?;
        Ok(run.store(results))
    }
}

impl EmitMlir for If {
    /// `If` -> `scf.if` on the predicate extracted from its `tensor<i1>`.
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let If {
            then_branch,
            else_branch,
        } = self;
        let (pred, operands) = split_first(l, inputs)?;
        if l.e.options.pure_stablehlo {
            let p = l.tensor_input(&pred)?;
            let branches = [then_branch.as_str(), else_branch.as_str()];
            return l.stablehlo_branches("stablehlo.if", &p, &branches, &operands, &node.outputs);
        }
        if l.e.options.unroll_loops && selectable(l.library, then_branch, else_branch, node) {
            return select_branches(l, self, pred, operands, node);
        }
        let p = l.scalar_input(&pred)?;
        let flat = flat_types_of(&l.e, &node.outputs)?;
        let (prefix, names) = l.result_names(&flat);
        let (site, loc) = (l.e.site().clone(), l.e.loc());
        l.e.line(&format!("{prefix}scf.if {p}{} {{", arrow(&flat)));
        let then_body = |l: &mut Lowering<'_>| l.inline(then_branch, operands.clone());
        l.region(None, &node.outputs, then_body, Terminator::BranchYield)?;
        l.e.line("} else {");
        let else_body = |l: &mut Lowering<'_>| l.inline(else_branch, operands);
        l.region(None, &node.outputs, else_body, Terminator::BranchYield)?;
        l.e.set_site(site);
        l.e.line(&format!("}} {loc}"));
        l.unpack(&node.outputs, &names)
    }

    fn module_facts(&self, facts: &mut ModuleFacts) {
        facts.regions = true;
    }

    fn stack_pushes(&self, flow: &PushFlow<'_>, ins: &[Pushes], n: usize) -> Option<Vec<Pushes>> {
        flow.branches(&[&self.then_branch, &self.else_branch], ins.get(1..)?, n)
    }
}

impl crate::trace::tangents::Tangent for If {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        crate::trace::tangents::over_callees(ctx, self, inputs, tangents)
    }
}

impl BatchNode for If {
    fn batch(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>> {
        batch_branches(cx, self, inputs, batched, |cx, pred, _| {
            Ok(vec![pred.clone(), build::logical_not(cx.ctx, pred)?])
        })
    }
}

impl Differentiate for If {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(ControlGradient::boxed(self.clone(), inputs, outputs)))
    }
}

branch_gradient!(If, "cond");

impl Lower for If {
    fn is_loop(&self) -> bool {
        false
    }

    /// A switch per operand on the predicate, both branches inlined behind their pivots, a
    /// merge per result.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let Some((&pred, operands)) = cx.inputs.split_first() else {
            return Err(Error::new(ErrorKind::Graph, "if", "takes a predicate"));
        };
        let pred = cx.b.ordered(cx.scope, pred, &cx.control)?;
        let names = [&self.else_branch, &self.then_branch];
        cx.b.branches(
            cx.scope,
            pred,
            2,
            operands,
            &cx.node.outputs,
            cx.needs_done,
            &mut |b, scope, k, args| b.lower_function(names[k], args, scope),
        )
    }
}

/// The most work (`OpDef::work`) and ops both branches of an `If` may hold to run as selects.
const SELECT_BUDGET: usize = 1 << 12;
const SELECT_NODES: usize = 64;

/// Whether `node`'s branches are cheap ops alone (no stacks, no control flow, static shapes,
/// within `SELECT_BUDGET`) returning tensors: then both run and their results are selected
/// (`select_branches`). An `scf.if` makes IREE wait for its predicate on the host and splits
/// the command buffer of the trip it is in; a select does neither. The ops cannot fail or
/// trap (integer division is not an op), so running the branch not taken changes nothing.
fn selectable(library: &Library, then_branch: &str, else_branch: &str, node: &Node) -> bool {
    let work = |name: &str| {
        library
            .get(name)
            .ok()
            .and_then(|f| crate::mlir::work::ops_work(f, false))
    };
    let (Some((a, m)), Some((b, n))) = (work(then_branch), work(else_branch)) else {
        return false;
    };
    a.saturating_add(b) <= SELECT_BUDGET
        && m + n <= SELECT_NODES
        && node
            .outputs
            .iter()
            .all(|t| matches!(t, ValueType::Tensor(_)))
}

/// Both branches inlined, each result the then-branch's where `pred` holds: tensors selected
/// on the device (the predicate uploaded once if it is on the host), host scalars on the host.
fn select_branches(
    l: &mut Lowering<'_>,
    branches: &If,
    pred: Bound,
    operands: Vec<Bound>,
    node: &Node,
) -> Result<Vec<Bound>> {
    let taken = l.inline(&branches.then_branch, operands.clone())?;
    let taken = l.coerce_all(taken, &node.outputs)?;
    let other = l.inline(&branches.else_branch, operands)?;
    let other = l.coerce_all(other, &node.outputs)?;
    let mut on_device = None;
    taken
        .into_iter()
        .zip(other)
        .map(|(a, b)| match (&a, &pred) {
            _ if a == b => Ok(a),
            (Bound::Tensor(_), Bound::Scalar(_)) => {
                if on_device.is_none() {
                    on_device = Some(Bound::Tensor(l.tensor_input(&pred)?));
                }
                let p = on_device.clone().expect("set above");
                l.select(&p, a, b)
            }
            _ => l.select(&pred, a, b),
        })
        .collect()
}

/// `If(pred, captures...)` over two traced branches (no own parameters); returns its outputs.
pub fn emit_if(
    ctx: &mut dyn Context<Val>,
    pred: &Val,
    then_branch: &Branch,
    else_branch: &Branch,
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "cond")?;
    let branches = [then_branch, else_branch];
    let mut captures = union(&branches);
    let names = unify(&tracer, &branches, 0, &captures, false)?;
    let own = lock(&tracer).library().get(&names[0])?.results.len();
    let threaded = thread_variables(ctx, &tracer, &names, 0, Carrier::Branches, &mut captures)?;
    let kind = NodeKind::If(If {
        then_branch: names[0].clone(),
        else_branch: names[1].clone(),
    });
    let mut inputs = vec![pred.clone()];
    inputs.extend(captures);
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, own, Carrier::Branches)
}

impl PassRules for If {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::AfterResults
    }

    fn constant_choice(&self, selector: &Tensor) -> Result<Option<usize>> {
        Ok(match selector.as_slice::<bool>()?.first() {
            Some(true) => Some(0),
            Some(false) => Some(1),
            None => None,
        })
    }
}
