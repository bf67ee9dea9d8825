//! Structured control flow: `stablehlo.while` / `if` / `case`, their `scf` forms
//! (`scf.while`, `scf.if`, `scf.index_switch`), and `func.call` (inlined). Each region becomes a
//! function of the graph's library through the tracer (values from around it are captured),
//! and the node is emitted as a traced `while_loop` / `cond` / `switch_case` is.

use super::attr::Attribute;
use super::importer::{import_error, Importer};
use super::syntax::{Block, Operation, Region};
use crate::control::{emit_case, emit_if, emit_while};
use crate::error::Result;
use crate::graph::ValueType;
use crate::ops::build;
use crate::tensor::Tensor;
use crate::trace::{Branch, LoopFunctions, Val};
use crate::value::Value;

fn types_of(x: &[Val]) -> Vec<ValueType> {
    x.iter().map(Val::value_type).collect()
}

/// The one block of a region of `op`.
fn block_of<'m>(op: &Operation, region: &'m Region) -> Result<&'m Block> {
    match region.blocks.as_slice() {
        [block] => Ok(block),
        [] => Err(import_error(&op.name, "a region has no block")),
        _ => Err(import_error(
            &op.name,
            "a region has several blocks (unstructured control flow is not supported)",
        )),
    }
}

/// Exactly `N` regions.
fn regions<const N: usize>(op: &Operation) -> Result<&[Region; N]> {
    op.regions.as_slice().try_into().map_err(|_| {
        import_error(
            &op.name,
            format!("expected {N} regions, got {}", op.regions.len()),
        )
    })
}

/// A function of no own parameters running `region` (an `if` or `case` branch).
fn branch<'m>(
    im: &mut Importer<'m>,
    op: &Operation,
    region: &'m Region,
    hint: &str,
) -> Result<Branch> {
    let block = block_of(op, region)?;
    im.function_of(hint, vec![], |im, _| im.block(block, &[]))
}

/// A loop condition: `region` on the loop variables, returning its predicate (the first value
/// of its terminator: `stablehlo.return %p` or `scf.condition(%p) ...`).
fn loop_cond<'m>(
    im: &mut Importer<'m>,
    op: &Operation,
    region: &'m Region,
    types: Vec<ValueType>,
) -> Result<Branch> {
    let block = block_of(op, region)?;
    let name = op.name.clone();
    im.function_of("while_cond", types, move |im, args| {
        let out = im.block(block, args)?;
        match out.first() {
            Some(p) => Ok(vec![p.clone()]),
            None => Err(import_error(&name, "the loop condition returns nothing")),
        }
    })
}

fn run_loop(im: &mut Importer<'_>, cond: Branch, body: Branch, x: &[Val]) -> Result<Vec<Val>> {
    let functions = LoopFunctions {
        cond,
        body,
        maximum_iterations: None,
        parallel_iterations: 10,
        checkpoints: im.checkpoints,
    };
    emit_while(im.ctx(), &functions, x)
}

/// `stablehlo.while(vars) cond {..} do {..}`.
pub(crate) fn stablehlo_while<'m>(
    im: &mut Importer<'m>,
    op: &'m Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [cond, body] = regions::<2>(op)?;
    let cond = loop_cond(im, op, cond, types_of(x))?;
    let block = block_of(op, body)?;
    let body = im.function_of("while_body", types_of(x), |im, args| im.block(block, args))?;
    run_loop(im, cond, body, x)
}

/// `scf.while`: the `before` region computes the predicate and the values passed on (to the
/// `after` region, or out as results). When it passes its own arguments on, it is a plain
/// condition; otherwise the body runs `before` then `after`, and the results are `before`
/// applied once more to the final loop variables.
pub(crate) fn scf_while<'m>(
    im: &mut Importer<'m>,
    op: &'m Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [before, after] = regions::<2>(op)?;
    let (before_block, after_block) = (block_of(op, before)?, block_of(op, after)?);
    let forwards_args = before_block.ops.last().is_some_and(|t| {
        t.operands.len() == before_block.args.len() + 1
            && t.operands[1..]
                .iter()
                .zip(&before_block.args)
                .all(|(r, (name, _))| r.index == 0 && &r.name == name)
    });
    let cond = loop_cond(im, op, before, types_of(x))?;
    let body = im.function_of("while_body", types_of(x), |im, args| {
        let passed = if forwards_args {
            args.to_vec()
        } else {
            im.block(before_block, args)?.split_off(1)
        };
        im.block(after_block, &passed)
    })?;
    let finals = run_loop(im, cond, body, x)?;
    if forwards_args {
        return Ok(finals);
    }
    Ok(im.block(before_block, &finals)?.split_off(1))
}

/// `stablehlo.if` and `scf.if`: a predicate and two regions (an `scf.if` without results has
/// nothing to compute: its ops have no side effects).
pub(crate) fn if_op<'m>(im: &mut Importer<'m>, op: &'m Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [pred] = super::elementwise::operands(op, x)?;
    if op.result_types.is_empty() {
        return Ok(Vec::new());
    }
    let [then_region, else_region] = regions::<2>(op)?;
    let then_branch = branch(im, op, then_region, "if_then")?;
    let else_branch = branch(im, op, else_region, "if_else")?;
    emit_if(im.ctx(), pred, &then_branch, &else_branch)
}

/// `stablehlo.case`: an i32 index; an index out of range runs the last branch (the semantics
/// of both StableHLO and gradloop's `Case`).
pub(crate) fn case<'m>(im: &mut Importer<'m>, op: &'m Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [index] = super::elementwise::operands(op, x)?;
    let branches = op
        .regions
        .iter()
        .map(|r| branch(im, op, r, "case_branch"))
        .collect::<Result<Vec<_>>>()?;
    emit_case(im.ctx(), index, &branches)
}

/// `scf.index_switch %i cases [c0, c1, ..] default {..} case c0 {..} ..`: a `Case` over the
/// case regions then the default, indexed by the position of `%i` among the case values (the
/// default's position when none matches).
pub(crate) fn index_switch<'m>(
    im: &mut Importer<'m>,
    op: &'m Operation,
    x: &[Val],
) -> Result<Vec<Val>> {
    let [value] = super::elementwise::operands(op, x)?;
    let cases = op
        .attr("cases")
        .and_then(Attribute::as_ints)
        .ok_or_else(|| import_error(&op.name, "missing `cases`"))?;
    let Some((default, case_regions)) = op.regions.split_first() else {
        return Err(import_error(&op.name, "missing the default region"));
    };
    if case_regions.len() != cases.len() {
        return Err(import_error(
            &op.name,
            "one region per case value is needed",
        ));
    }
    let dtype = value.ty().dtype;
    let mut index = im.constant(Tensor::scalar(cases.len() as i32))?;
    for (k, &c) in cases.iter().enumerate() {
        let c = im.constant(Tensor::filled(dtype, &[], c as f64))?;
        let k = im.constant(Tensor::scalar(k as i32))?;
        let ctx = im.ctx();
        let hit = build::equal(ctx, value, &c)?;
        index = build::select(ctx, &hit, &k, &index)?;
    }
    let mut branches = case_regions
        .iter()
        .map(|r| branch(im, op, r, "switch_case"))
        .collect::<Result<Vec<_>>>()?;
    branches.push(branch(im, op, default, "switch_default")?);
    emit_case(im.ctx(), &index, &branches)
}

/// `func.call @f(args)`: `@f`'s body inlined.
pub(crate) fn call<'m>(im: &mut Importer<'m>, op: &'m Operation, x: &[Val]) -> Result<Vec<Val>> {
    let callee = match op.attr("callee") {
        Some(Attribute::Symbol(s)) => s.clone(),
        _ => return Err(import_error(&op.name, "missing `callee`")),
    };
    im.call(&callee, x)
}

/// `tensor.extract %t[%i, ..]`: the element as a rank-0 tensor (scalars are rank-0 tensors).
pub(crate) fn extract(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let Some((t, indices)) = x.split_first() else {
        return Err(import_error(&op.name, "expected a tensor"));
    };
    if indices.is_empty() {
        return Ok(vec![t.clone()]);
    }
    let ones = vec![1; t.ty().ndim()];
    let ctx = im.ctx();
    let window = build::dynamic_slice(ctx, t, indices, &ones)?;
    Ok(vec![build::reshape(ctx, &window, &[])?])
}
