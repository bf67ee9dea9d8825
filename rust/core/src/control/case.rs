//! `Case`: `(index: i32[], operands...) -> results`, calling `branches[index](operands)`; an
//! index out of range, negative included, runs the last branch (`gl.switch_case`).
//!
//! - Type rule: an i32 scalar index, at least one branch; every branch takes the operands and
//!   returns the node's outputs.
//! - Gradient: the branch gradient of `control::branches`, a `Case` over backward functions.
//! - Interpretation: runs one branch. MLIR: a chain of `scf.if` comparing the index with 0,
//!   1, ... (IREE rejects `scf.index_switch`; see `mlir::regions`).

use std::sync::Arc;

use super::branch_batching::batch_branches;
use super::branches::branch_gradient;
use crate::batch::{BatchNode, NodeBatch};
use crate::dataflow::{Lower, LowerNode, Lowered};
use crate::dtype::DType;
use crate::emit::element_type;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_branches;
use crate::graph::verify_nodes::scalar as scalar_type;
use crate::graph::Node;
use crate::graph::NodeKind;
use crate::graph::{
    joined_results, AttrReader, Case, Check, Library, NodeRule, ParseNode, ValueType,
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
use crate::value::Value;

impl NodeRule for Case {
    fn keyword(&self) -> &'static str {
        "case"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let names: Vec<String> = self
            .branches
            .iter()
            .map(|b| FuncName(b).to_string())
            .collect();
        vec![("branches", format!("[{}]", names.join(", ")))]
    }

    fn callees(&self) -> Vec<&str> {
        self.branches.iter().map(String::as_str).collect()
    }

    fn operand_start(&self) -> usize {
        1
    }

    fn with_callees(&self, branches: Vec<String>) -> NodeKind {
        NodeKind::Case(Case { branches })
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let index = ins.first().ok_or("case needs an index input")?;
        scalar_type("branch index", index, DType::I32)?;
        if self.branches.is_empty() {
            return Err("case needs at least one branch".into());
        }
        let names: Vec<&String> = self.branches.iter().collect();
        let roles: Vec<String> = (0..names.len()).map(|i| format!("branch {i}")).collect();
        let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
        check_branches(library, &names, &roles, &ins[1..], outs)
    }

    /// The branches' result types joined (a dimension they disagree on is unknown).
    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        if self.branches.is_empty() {
            let msg = "a case node needs a branch";
            return Err(Error::new(ErrorKind::Graph, "case", msg));
        }
        joined_results("case", library, &self.callees())
    }
}

impl ParseNode for Case {
    const KEYWORDS: &'static [&'static str] = &["case"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(Case {
            branches: attrs.functions("branches")?,
        })
    }
}

impl Interpret for Case {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let (index, operands) = run.split_first()?;
        let index = scalar::<i32>(index, "case", "branch index")?;
        // Out of range, negative included, runs the last branch (the default).
        let last = run.callee_count().checked_sub(1).ok_or_else(|| {
            let msg = "a case node needs at least one branch";
            Error::new(ErrorKind::Graph, "case", msg)
        })?;
        let branch = usize::try_from(index).map_or(last, |i| i.min(last));
        let results = run.call_callee(branch, operands)?;
        Ok(run.store(results))
    }
}

impl EmitMlir for Case {
    /// `Case` -> `branches[0]` if the index is 0, else `branches[1]` if it is 1, ..., else the
    /// last branch (which so takes every out-of-range index, as the IR says).
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let Case { branches } = self;
        let (index, operands) = split_first(l, inputs)?;
        if l.e.options.pure_stablehlo {
            // stablehlo.case runs the last branch for an index out of range, as the IR says
            let index = l.tensor_input(&index)?;
            let i = l.e.convert(&index, crate::dtype::DType::I32)?;
            let names: Vec<&str> = branches.iter().map(String::as_str).collect();
            return l.stablehlo_branches("stablehlo.case", &i, &names, &operands, &node.outputs);
        }
        let i = l.scalar_input(&index)?;
        let dtype = index.tensor_type().map(|t| t.dtype);
        let int = element_type(dtype.ok_or_else(|| l.e.bug("a stack as a case index"))?);
        case_chain(l, &i, int, branches, 0, &operands, &node.outputs)
    }

    fn module_facts(&self, facts: &mut ModuleFacts) {
        facts.regions = true;
    }

    fn stack_pushes(&self, flow: &PushFlow<'_>, ins: &[Pushes], n: usize) -> Option<Vec<Pushes>> {
        let names: Vec<&str> = self.branches.iter().map(String::as_str).collect();
        flow.branches(&names, ins.get(1..)?, n)
    }
}

/// `branches[0]` when `i == k`, else the chain of the others; the last one alone is
/// inlined in place.
fn case_chain(
    l: &mut Lowering<'_>,
    i: &str,
    int: &str,
    branches: &[String],
    k: usize,
    operands: &[Bound],
    types: &[ValueType],
) -> Result<Vec<Bound>> {
    let Some((first, rest)) = branches.split_first() else {
        return Err(l.e.bug("a case node without branches"));
    };
    if rest.is_empty() {
        let results = l.inline(first, operands.to_vec())?;
        return l.coerce_all(results, types);
    }
    let (site, loc) = (l.e.site().clone(), l.e.loc());
    let (c, eq) = (l.e.fresh(), l.e.fresh());
    l.e.line(&format!("{c} = arith.constant {k} : {int} {loc}"));
    l.e.line(&format!("{eq} = arith.cmpi eq, {i}, {c} : {int} {loc}"));
    let flat = flat_types_of(&l.e, types)?;
    let (prefix, names) = l.result_names(&flat);
    l.e.line(&format!("{prefix}scf.if {eq}{} {{", arrow(&flat)));
    let then_body = |l: &mut Lowering<'_>| l.inline(first, operands.to_vec());
    l.region(None, types, then_body, Terminator::BranchYield)?;
    l.e.line("} else {");
    let else_body = |l: &mut Lowering<'_>| case_chain(l, i, int, rest, k + 1, operands, types);
    l.region(None, types, else_body, Terminator::BranchYield)?;
    l.e.set_site(site);
    l.e.line(&format!("}} {loc}"));
    l.unpack(types, &names)
}

impl crate::trace::tangents::Tangent for Case {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        crate::trace::tangents::over_callees(ctx, self, inputs, tangents)
    }
}

impl BatchNode for Case {
    /// An index out of range takes the last branch, as when unbatched.
    fn batch(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>> {
        batch_branches(cx, self, inputs, batched, |cx, index, n| {
            let mut masks = Vec::with_capacity(n);
            let mut others: Option<Val> = None;
            for k in 0..n - 1 {
                let kth = build::scalar(cx.ctx, DType::I32, k as f64)?;
                let mask = build::equal(cx.ctx, index, &kth)?;
                others = Some(match others {
                    Some(o) => build::logical_or(cx.ctx, &o, &mask)?,
                    None => mask.clone(),
                });
                masks.push(mask);
            }
            masks.push(match others {
                Some(o) => build::logical_not(cx.ctx, &o)?,
                None => build::fill(cx.ctx, DType::Bool, &index.ty().shape, 1.0)?,
            });
            Ok(masks)
        })
    }
}

impl Differentiate for Case {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(ControlGradient::boxed(self.clone(), inputs, outputs)))
    }
}

branch_gradient!(Case, "switch_case");

impl Lower for Case {
    fn is_loop(&self) -> bool {
        false
    }

    /// An n-way switch per operand on the index, every branch inlined behind its pivot, a
    /// merge per result; a single branch is a call.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let Some((&index, operands)) = cx.inputs.split_first() else {
            return Err(Error::new(ErrorKind::Graph, "case", "takes an index"));
        };
        if let [only] = self.branches.as_slice() {
            return cx
                .b
                .inline_call(cx.scope, only, operands, &cx.control, cx.needs_done);
        }
        let index = cx.b.ordered(cx.scope, index, &cx.control)?;
        let names = &self.branches;
        cx.b.branches(
            cx.scope,
            index,
            names.len(),
            operands,
            &cx.node.outputs,
            cx.needs_done,
            &mut |b, scope, k, args| b.lower_function(&names[k], args, scope),
        )
    }
}

/// `Case(index, captures...)` over traced branches; an out-of-range index runs the last.
pub fn emit_case(ctx: &mut dyn Context<Val>, index: &Val, branches: &[Branch]) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "switch_case")?;
    let refs: Vec<&Branch> = branches.iter().collect();
    let mut captures = union(&refs);
    let names = unify(&tracer, &refs, 0, &captures, false)?;
    let own = match names.first() {
        Some(first) => lock(&tracer).library().get(first)?.results.len(),
        None => 0,
    };
    let threaded = thread_variables(ctx, &tracer, &names, 0, Carrier::Branches, &mut captures)?;
    let mut inputs = vec![index.clone()];
    inputs.extend(captures);
    let kind = NodeKind::Case(Case { branches: names });
    let outputs = ctx.apply_node(&kind, &inputs)?.into_vec();
    threaded.assign_after(ctx, outputs, own, Carrier::Branches)
}

impl PassRules for Case {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::AfterResults
    }

    /// An index out of range runs the last branch, as in the IR.
    fn constant_choice(&self, selector: &Tensor) -> Result<Option<usize>> {
        let Some(&index) = selector.as_slice::<i32>()?.first() else {
            return Ok(None);
        };
        let last = self.branches.len().saturating_sub(1);
        Ok(Some(usize::try_from(index).map_or(last, |i| i.min(last))))
    }
}
