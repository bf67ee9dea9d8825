//! Contractions and reductions: `dot_general` (and `dot`) as one batched matrix product, and
//! `reduce` whose region is a single `add`, `maximum`, `minimum`, `and` or `or`.
//!
//! `dot_general` with batch dimensions B, contracting dimensions K and free dimensions M (lhs)
//! and N (rhs) is `[B.., M.., N..] = reshape(lhs as [B.., M, K] @ rhs as [B.., K, N])`: each
//! operand is transposed to that order and flattened, so every form is one `matmul`.

use super::elementwise::operands;
use super::importer::{import_error, Importer};
use super::layout::{result_type, sizes};
use super::syntax::Operation;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::build;
use crate::ops::matmul::matmul_transposed;
use crate::ops::Context;
use crate::shape::{numel, Shape, DYN};
use crate::trace::Val;
use crate::value::Value;

/// Dimension numbers of a `dot_general`.
#[derive(Default)]
struct Dims {
    lhs_batch: Vec<usize>,
    rhs_batch: Vec<usize>,
    lhs_contract: Vec<usize>,
    rhs_contract: Vec<usize>,
}

fn dot_dims(op: &Operation) -> Result<Dims> {
    let attr = op
        .attr("dot_dimension_numbers")
        .ok_or_else(|| import_error(&op.name, "missing `dot_dimension_numbers`"))?;
    let mut dims = Dims::default();
    for (name, value) in attr.fields()? {
        let list = value
            .as_ints()
            .and_then(|v| v.into_iter().map(|d| usize::try_from(d).ok()).collect())
            .ok_or_else(|| import_error(&op.name, format!("bad `{name}`")))?;
        match name.as_str() {
            "lhs_batching_dimensions" => dims.lhs_batch = list,
            "rhs_batching_dimensions" => dims.rhs_batch = list,
            "lhs_contracting_dimensions" => dims.lhs_contract = list,
            "rhs_contracting_dimensions" => dims.rhs_contract = list,
            _ => {}
        }
    }
    Ok(dims)
}

/// `x` transposed to `batch ++ first ++ second` (the dimensions not listed, in order, are the
/// `free` ones, put where `free_first` says) and flattened to `[batch.., a, b]`.
fn arrange(
    ctx: &mut dyn Context<Val>,
    x: &Val,
    batch: &[usize],
    contract: &[usize],
    free_first: bool,
) -> Result<(Val, Shape)> {
    let shape = x.ty().shape.clone();
    let free: Vec<usize> = (0..shape.len())
        .filter(|d| !batch.contains(d) && !contract.contains(d))
        .collect();
    let (a, b) = if free_first {
        (&free, contract)
    } else {
        (&contract.to_vec(), free.as_slice())
    };
    let perm: Vec<usize> = batch
        .iter()
        .chain(a.iter())
        .chain(b.iter())
        .copied()
        .collect();
    let x = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x.clone()
    } else {
        build::transpose(ctx, x, &perm)?
    };
    let size = |dims: &[usize]| {
        let d: Vec<usize> = dims.iter().map(|&i| shape[i]).collect();
        if d.contains(&DYN) {
            DYN
        } else {
            numel(&d)
        }
    };
    let mut flat: Shape = batch.iter().map(|&i| shape[i]).collect();
    flat.push(size(a));
    flat.push(size(b));
    let free_shape: Shape = free.iter().map(|&i| shape[i]).collect();
    let x = if x.ty().shape == flat {
        x
    } else {
        build::reshape(ctx, &x, &flat)?
    };
    Ok((x, free_shape))
}

/// `stablehlo.dot_general` (see the module doc).
pub(crate) fn dot_general(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let dims = dot_dims(op)?;
    contract(im, op, x, &dims)
}

/// `stablehlo.dot`: vector·vector, matrix·vector or matrix·matrix (the last lhs dimension
/// with the first rhs dimension).
pub(crate) fn dot(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    let [a, _] = operands(op, x)?;
    let dims = Dims {
        lhs_contract: vec![a.ty().ndim().saturating_sub(1)],
        rhs_contract: vec![0],
        ..Dims::default()
    };
    contract(im, op, x, &dims)
}

fn contract(im: &mut Importer<'_>, op: &Operation, x: &[Val], dims: &Dims) -> Result<Vec<Val>> {
    let [a, b] = operands(op, x)?;
    let out = result_type(op)?;
    let ctx = im.ctx();
    let (a2, a_free) = arrange(ctx, a, &dims.lhs_batch, &dims.lhs_contract, true)?;
    let (b2, b_free) = arrange(ctx, b, &dims.rhs_batch, &dims.rhs_contract, false)?;
    let c = matmul_transposed(ctx, &a2, &b2, false, false)?;
    let mut shape: Shape = dims.lhs_batch.iter().map(|&i| a.ty().shape[i]).collect();
    shape.extend(a_free);
    shape.extend(b_free);
    let c = if c.ty().shape == shape {
        c
    } else {
        build::reshape(ctx, &c, &shape)?
    };
    // `preferred_element_type` may ask for another result dtype.
    if c.ty().dtype != out.dtype {
        return Ok(vec![build::cast(ctx, &c, out.dtype)?]);
    }
    Ok(vec![c])
}

/// What a reduction region computes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combiner {
    Add,
    Max,
    Min,
    And,
    Or,
}

/// The combiner of a `reduce` region: one binary op on the two block arguments, then return.
pub(crate) fn combiner(op: &Operation) -> Result<Combiner> {
    let unsupported = || {
        import_error(
            &op.name,
            "only reductions whose region is one add, maximum, minimum, and or or are supported",
        )
    };
    let block = match op.regions.first().map(|r| r.blocks.as_slice()) {
        Some([block]) => block,
        _ => return Err(unsupported()),
    };
    let [body, ret] = block.ops.as_slice() else {
        return Err(unsupported());
    };
    let returns_body = ret.operands.len() == 1
        && body.results.first().map(|r| &r.0) == Some(&ret.operands[0].name);
    if !returns_body || body.operands.len() != 2 {
        return Err(unsupported());
    }
    Ok(match body.name.as_str() {
        "stablehlo.add" => Combiner::Add,
        "stablehlo.maximum" => Combiner::Max,
        "stablehlo.minimum" => Combiner::Min,
        "stablehlo.and" => Combiner::And,
        "stablehlo.or" => Combiner::Or,
        "stablehlo.multiply" => {
            return Err(import_error(
                &op.name,
                "product reductions are not supported",
            ))
        }
        _ => return Err(unsupported()),
    })
}

/// Whether `init` is the identity of `combiner` (then it need not be combined in).
fn is_identity(init: Option<&crate::tensor::Tensor>, combiner: Combiner, dtype: DType) -> bool {
    let Some(t) = init else { return false };
    let v = t.to_f64_vec();
    let Some(&first) = v.first() else {
        return false;
    };
    let lowest = if dtype.is_float() {
        f64::NEG_INFINITY
    } else {
        dtype_min(dtype)
    };
    let highest = if dtype.is_float() {
        f64::INFINITY
    } else {
        -dtype_min(dtype) - 1.0
    };
    v.len() == 1
        && match combiner {
            Combiner::Add => first == 0.0,
            Combiner::Max => first == lowest,
            Combiner::Min => first == highest,
            Combiner::And => first != 0.0,
            Combiner::Or => first == 0.0,
        }
}

fn dtype_min(dtype: DType) -> f64 {
    match dtype {
        DType::I32 => f64::from(i32::MIN),
        DType::I64 => i64::MIN as f64,
        _ => 0.0,
    }
}

/// `stablehlo.reduce` of one operand over `dimensions`, with its initial value combined in.
pub(crate) fn reduce(im: &mut Importer<'_>, op: &Operation, x: &[Val]) -> Result<Vec<Val>> {
    if x.len() != 2 {
        return Err(import_error(
            &op.name,
            "reductions of several operands at once (argmax-like) are not supported",
        ));
    }
    let (v, init) = (&x[0], &x[1]);
    let combiner = combiner(op)?;
    let axes = sizes(op, "dimensions")?;
    let skip_init = is_identity(im.known_constant(init), combiner, v.ty().dtype);
    let ctx = im.ctx();
    let dtype = v.ty().dtype;
    // An empty axis list means "every axis" to gradloop's reductions: nothing to reduce here.
    let reduced = if axes.is_empty() {
        v.clone()
    } else {
        match combiner {
            Combiner::Add => build::sum(ctx, v, &axes, false)?,
            Combiner::Max => build::reduce_max(ctx, v, &axes, false)?,
            Combiner::Min => build::reduce_min(ctx, v, &axes, false)?,
            Combiner::And | Combiner::Or => {
                let ints = build::cast(ctx, v, DType::I32)?;
                let r = if combiner == Combiner::And {
                    build::reduce_min(ctx, &ints, &axes, false)?
                } else {
                    build::reduce_max(ctx, &ints, &axes, false)?
                };
                build::cast(ctx, &r, dtype)?
            }
        }
    };
    if skip_init {
        return Ok(vec![reduced]);
    }
    let out = match combiner {
        Combiner::Add => build::add(ctx, &reduced, init)?,
        Combiner::Max => build::maximum(ctx, &reduced, init)?,
        Combiner::Min => build::minimum(ctx, &reduced, init)?,
        Combiner::And => build::logical_and(ctx, &reduced, init)?,
        Combiner::Or => build::logical_or(ctx, &reduced, init)?,
    };
    Ok(vec![out])
}
