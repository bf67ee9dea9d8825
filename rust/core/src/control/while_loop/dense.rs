//! The gradient of a bounded `While` whose every trip fits its snapshots (`checkpoints = c`
//! with `maximum_iterations = m <= c`, which fixed-size state asks for up to
//! `ALL_STATES_UP_TO` trips): no schedule, each trip in its own row of m-row buffers.
//!
//! ```text
//!   residual rows (every residual a tensor of static shape), a scan's gradient:
//!     forward:  (vars, step, bufs) -> (x_{step+1}, residuals) = body_fwd(x_step);
//!               bufs[d][step] = the residuals of dtype d, flattened and joined (`Pack`)
//!     backward: (cotangents, g = trips, bufs, invariants) while g > 0:
//!               body_bwd(cotangents, bufs[.][g - 1]): cotangents of x_{g-1}; g -= 1
//!   state rows (a residual is a stack or of unknown shape):
//!     forward:  bufs[d][step] = the changing states of dtype d; x_{step+1} = body(x_step)
//!     backward: x = bufs[.][g - 1]; body_fwd then body_bwd on x; g -= 1
//! ```
//!
//! Residual rows are for fixed-size state (pure StableHLO), which asks for a size; a user's
//! `checkpoints` bound the memory in states, which a trip's residuals can outgrow, so they get
//! state rows. Residuals that are loop variables the body passes through come from the loop's
//! inputs.
//! `checkpointed.rs` does the same with c < m rows through an online schedule whose integer
//! logic works on `[c]` vectors every trip (O(c) a trip) and an inner loop that advances from
//! the nearest snapshot. With a row per trip neither is needed: a trip of either loop writes or
//! reads its rows (`dynamic_update_slice`, `dynamic_slice`) and runs the body's functions once.

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{inline_into, Function, FunctionBuilder, Port, ValueType, While};
use crate::ops::concat::Concatenate;
use crate::ops::layout;
use crate::ops::slicing::Slice;
use crate::shape::{TensorType, DYN};
use crate::trace::gradients::{add_function, function, Built, Differentiated, ExtraInput};
use crate::trace::TracerRef;

use super::checkpointed::Loop;
use super::schedule::{i64_type, Ir};

/// What a row holds: each trip's residuals (the body's forward function's), or its state.
enum Rows {
    /// (residual index, type) of the residuals kept per trip.
    Residuals(Vec<(usize, TensorType)>),
    /// (loop variable, type) of the variables kept per trip.
    States(Vec<(usize, TensorType)>),
}

impl Rows {
    fn types(&self) -> &[(usize, TensorType)] {
        match self {
            Rows::Residuals(r) | Rows::States(r) => r,
        }
    }
}

/// Kept values flattened into one row: a trip writes them with one `dynamic_update_slice`
/// and a backward trip reads them with one `dynamic_slice` (an ODE step's few dozen scalar
/// residuals would otherwise cost a kernel each, every trip).
struct Pack {
    /// `[total]` elements of the dtype.
    row: TensorType,
    /// (position among the kept values, type, offset in the row).
    members: Vec<(usize, TensorType, usize)>,
}

impl Pack {
    /// One pack per dtype for the scalars, in the order the dtypes first appear, and one of
    /// its own for each other value: XLA fuses a read of a slice of a joined row into its
    /// consumers (an RNN's outer products), which then run several times slower than from a
    /// row of their own.
    fn of(kept: &[(usize, TensorType)]) -> Vec<Pack> {
        let mut packs: Vec<Pack> = Vec::new();
        for (pos, (_, ty)) in kept.iter().enumerate() {
            let joined = |p: &Pack| p.row.dtype == ty.dtype && p.members[0].1.shape.is_empty();
            let at = match packs
                .iter()
                .position(joined)
                .filter(|_| ty.shape.is_empty())
            {
                Some(at) => at,
                None => {
                    packs.push(Pack {
                        row: TensorType::new(ty.dtype, &[0]),
                        members: Vec::new(),
                    });
                    packs.len() - 1
                }
            };
            let pack = &mut packs[at];
            let offset = pack.row.shape[0];
            pack.members.push((pos, ty.clone(), offset));
            pack.row = TensorType::new(ty.dtype, &[offset + ty.shape.iter().product::<usize>()]);
        }
        packs
    }

    /// The members of `values` (indexed by position) flattened and joined.
    fn pack(&self, ir: &mut Ir<'_>, values: &[Port]) -> Result<Port> {
        let mut flat = Vec::with_capacity(self.members.len());
        for (pos, ty, _) in &self.members {
            let size: usize = ty.shape.iter().product();
            let shape = vec![size];
            flat.push(ir.op(
                layout::Reshape {
                    shape: shape.into(),
                },
                &[values[*pos]],
            )?);
        }
        match flat.as_slice() {
            [one] => Ok(*one),
            _ => ir.op(Concatenate { axis: 0 }, &flat),
        }
    }

    /// Each member of `row` into `out` at its position, in its shape.
    fn unpack(&self, ir: &mut Ir<'_>, row: Port, out: &mut [Option<Port>]) -> Result<()> {
        for (pos, ty, offset) in &self.members {
            let size: usize = ty.shape.iter().product();
            let part = match self.members.len() {
                1 => row,
                _ => ir.op(
                    Slice {
                        start: vec![*offset],
                        stop: vec![offset + size],
                        step: vec![1],
                    },
                    &[row],
                )?,
            };
            out[*pos] = Some(ir.op(
                layout::Reshape {
                    shape: ty.shape.clone(),
                },
                &[part],
            )?);
        }
        Ok(())
    }
}

/// Static-shape tensor types of `values`, or None.
fn static_tensors(
    values: impl Iterator<Item = (usize, ValueType)>,
) -> Option<Vec<(usize, TensorType)>> {
    values
        .map(|(k, t)| match t {
            ValueType::Tensor(t) if !t.shape.contains(&DYN) => Some((k, t)),
            _ => None,
        })
        .collect()
}

/// What each trip's row keeps: its residuals where `residuals_allowed` and all are static
/// tensors, else the loop variables the body changes.
fn kept_rows(lp: &Loop<'_>, d: &Differentiated, residuals_allowed: bool) -> Result<Rows> {
    let n = lp.body.params.len();
    let is_invariant = |r: usize| matches!(d.residual_params[r], Some(i) if d.passthrough[i]);
    let residuals = (0..d.residual_types.len())
        .filter(|&r| !is_invariant(r))
        .map(|r| (r, d.residual_types[r].clone()));
    if let Some(r) = static_tensors(residuals).filter(|_| residuals_allowed) {
        return Ok(Rows::Residuals(r));
    }
    let states = (0..n)
        .filter(|&i| !d.passthrough[i])
        .map(|i| (i, lp.body.params[i].clone()));
    let states = static_tensors(states).ok_or_else(|| {
        Error::new(
            ErrorKind::ControlFlow,
            "while_loop",
            "a loop gradient in fixed-size state keeps the loop variables the body changes, \
             which must be tensors of static shape"
                .to_string(),
        )
    })?;
    Ok(Rows::States(states))
}

/// The bytes one trip's row takes (`augment` with the same `residuals_allowed`).
pub(super) fn row_bytes(
    lp: &Loop<'_>,
    d: &Differentiated,
    residuals_allowed: bool,
) -> Result<usize> {
    let kept = kept_rows(lp, d, residuals_allowed)?;
    Ok(kept
        .types()
        .iter()
        .map(|(_, t)| t.shape.iter().product::<usize>() * t.dtype.size())
        .sum())
}

/// Builds the forward and backward `While` nodes of a loop of at most `rows` trips that keeps
/// every trip: its residuals where `residuals_allowed` (fixed-size state, which asks for a size,
/// not a memory bound), else its states (the user's `checkpoints` bound the memory in states,
/// which residuals can outgrow).
pub(super) fn augment(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    rows: usize,
    residuals_allowed: bool,
) -> Result<Built> {
    let n = lp.body.params.len();
    let kept = kept_rows(lp, d, residuals_allowed)?;
    // a row even for a loop of no trips: the buffers' shapes stay valid for their writes
    let rows = rows.max(1);
    let packs = Pack::of(kept.types());
    let buffer_types: Vec<ValueType> = (packs.iter())
        .map(|p| ValueType::tensor(p.row.dtype, &[rows, p.row.shape[0]]))
        .collect();
    let dense = Dense {
        invariant: (0..n).filter(|&i| d.passthrough[i]).collect(),
        kept,
        packs,
        buffer_types,
    };
    let bwd = function(tracer, &d.backward)?;
    let fwd = function(tracer, &d.forward)?;
    let (fwd_cond, fwd_body) = forward_loop(tracer, lp, &fwd, &dense)?;
    let (grad_cond, grad_body) = backward_loop(tracer, lp, d, &fwd, &bwd, &dense)?;
    let mut forward_extra = vec![ExtraInput::Zero(DType::I64)];
    forward_extra
        .extend((dense.buffer_types.iter()).map(|t| ExtraInput::Fill(t.inner().clone(), 0.0)));
    Ok(Built {
        forward: While::stacked(
            fwd_cond,
            fwd_body,
            lp.maximum_iterations,
            lp.parallel_iterations,
        ),
        forward_extra,
        backward: While::stacked(grad_cond, grad_body, None, lp.parallel_iterations),
        backward_outputs: (n..n + 1 + dense.buffer_types.len()).collect(),
        backward_inputs: dense.invariant,
        cotangents: lp.carried.to_vec(),
        differentiable: lp.carried.to_vec(),
    })
}

/// What a dense loop gradient keeps: each trip's row (`Rows`), packed into buffers of a row
/// per trip, and the loop variables the body passes through.
struct Dense {
    kept: Rows,
    packs: Vec<Pack>,
    buffer_types: Vec<ValueType>,
    invariant: Vec<usize>,
}

/// The forward loop's condition and body over (vars, step, bufs): each trip runs the body (its
/// forward function where rows keep residuals) and writes its row at `step`.
fn forward_loop(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    fwd: &Function,
    dense: &Dense,
) -> Result<(String, String)> {
    let n = lp.body.params.len();
    let nk = dense.buffer_types.len();
    let mut fparams = lp.body.params.clone();
    fparams.push(i64_type(&[]));
    fparams.extend(dense.buffer_types.iter().cloned());
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_dense_fwd", lp.body.name), fparams.clone());
    let (step, bufs) = (args[n], &args[n + 1..n + 1 + nk]);
    let (res, effects) = match &dense.kept {
        Rows::Residuals(_) => inline_into(&mut b, fwd, &args[..n])?,
        Rows::States(_) => inline_into(&mut b, lp.body, &args[..n])?,
    };
    let mut ir = Ir { b: &mut b };
    let values: Vec<Port> = (dense.kept.types().iter())
        .map(|(j, _)| match &dense.kept {
            Rows::Residuals(_) => res[n + j],
            Rows::States(_) => args[*j],
        })
        .collect();
    let mut written: Vec<Port> = Vec::with_capacity(nk);
    for (g, pack) in dense.packs.iter().enumerate() {
        let row = pack.pack(&mut ir, &values)?;
        written.push(ir.write_row(bufs[g], row, step, &pack.row)?);
    }
    let next = ir.add(step, 1)?;
    let mut results: Vec<Port> = res[..n].to_vec();
    results.push(next);
    results.extend(written);
    let fwd_body = add_function(tracer, b.finish(&results, &effects)?)?;
    let fwd_cond = lp.forward_cond(tracer, "dense_fwd", fparams)?;
    Ok((fwd_cond, fwd_body))
}

/// The backward loop's condition and body over (cotangents, trips left, bufs, invariant vars):
/// each trip reads its row back (replaying the trip from its state where rows keep states) and
/// runs the body's backward function.
fn backward_loop(
    tracer: &TracerRef,
    lp: &Loop<'_>,
    d: &Differentiated,
    fwd: &Function,
    bwd: &Function,
    dense: &Dense,
) -> Result<(String, String)> {
    let nk = dense.buffer_types.len();
    let nc = lp.carried.len();
    let mut bparams: Vec<ValueType> = bwd.params[..nc].to_vec();
    bparams.push(i64_type(&[]));
    bparams.extend(dense.buffer_types.iter().cloned());
    bparams.extend(dense.invariant.iter().map(|&i| lp.body.params[i].clone()));
    let (mut b, args) =
        FunctionBuilder::new(format!("{}_dense_grad", lp.body.name), bparams.clone());
    let trips = args[nc];
    let bufs = &args[nc + 1..nc + 1 + nk];
    let invariants = &args[nc + 1 + nk..];
    let mut ir = Ir { b: &mut b };
    let left = ir.add(trips, -1)?;
    let mut read: Vec<Option<Port>> = vec![None; dense.kept.types().len()];
    for (g, pack) in dense.packs.iter().enumerate() {
        let row = ir.read_row(bufs[g], left, &pack.row)?;
        pack.unpack(&mut ir, row, &mut read)?;
    }
    let read: Vec<Port> = (read.into_iter().collect::<Option<_>>())
        .ok_or_else(|| Error::internal("while_loop", "a kept value is in no row"))?;
    let mut bargs: Vec<Port> = args[..nc].to_vec();
    bargs.extend(backward_inputs(
        &mut b, lp, d, fwd, dense, read, invariants,
    )?);
    let (grads, _) = inline_into(&mut b, bwd, &bargs)?;
    let mut results = lp.carried_gradients(&grads)?;
    results.push(left);
    results.extend_from_slice(bufs);
    results.extend_from_slice(invariants);
    let grad_body = add_function(tracer, b.finish(&results, &[])?)?;
    let grad_cond = lp.countdown_cond(tracer, "dense_grad", bparams, nc)?;
    Ok((grad_cond, grad_body))
}

/// The backward function's residuals, from the values `read` from a trip's row and the
/// `invariants`: the kept residuals and the invariant ones in order, or the trip replayed from
/// its state.
fn backward_inputs(
    b: &mut FunctionBuilder,
    lp: &Loop<'_>,
    d: &Differentiated,
    fwd: &Function,
    dense: &Dense,
    read: Vec<Port>,
    invariants: &[Port],
) -> Result<Vec<Port>> {
    let n = lp.body.params.len();
    let of_invariant = |i: usize| {
        let j = dense.invariant.iter().position(|&v| v == i);
        j.map(|j| invariants[j])
    };
    let mut rows = read.into_iter();
    match &dense.kept {
        Rows::Residuals(_) => (0..d.residual_types.len())
            .map(|r| {
                let port = match d.residual_params[r] {
                    Some(i) if d.passthrough[i] => of_invariant(i),
                    _ => rows.next(),
                };
                port.ok_or_else(|| {
                    Error::internal("while_loop", "a residual is neither kept nor invariant")
                })
            })
            .collect(),
        Rows::States(kept) => {
            let x = (0..n)
                .map(|i| match kept.iter().any(|&(j, _)| j == i) {
                    true => rows.next(),
                    false => of_invariant(i),
                })
                .collect::<Option<Vec<Port>>>()
                .ok_or_else(|| {
                    Error::internal("while_loop", "a state is neither kept nor invariant")
                })?;
            let (replayed, _) = inline_into(b, fwd, &x)?;
            Ok(replayed[n..].to_vec())
        }
    }
}
