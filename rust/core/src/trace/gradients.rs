//! Gradients of control flow and stacks: program transforms run when the tape reaches an `If`,
//! `Case`, `Call` or `While` node.
//!
//! Branching nodes (`If`, `Case`, `Call`): each branch `B` is replayed under a tape into a new
//! function `B_fwd`; its backward function `B_bwd(cotangents)` is built in a frame above, so
//! every forward value a gradient rule uses is captured: those captures are the residuals. A NEW
//! forward node calls the `B_fwd`s, returning `results ++ residuals(B_1) ++ ... ++
//! residuals(B_n)` (each branch fills the other branches' slots with a cheap zero-size or zero
//! mirror); it supersedes the old node, which the frame drops when it finishes. The gradient is
//! the same kind of node over the backward functions, taking the residuals.
//!
//! `While`: the body is replayed and differentiated the same way. Residuals that are loop
//! invariant (variables the body passes through) stay loop variables; every other residual gets
//! a stack. The new forward loop carries `(vars, trip count, stacks)` and pushes the residuals
//! each iteration; the gradient loop carries `(cotangents, count, stacks, invariants)`, pops,
//! and runs the body's backward function until the count reaches zero. Captured outer tensors
//! are loop variables, so their gradients accumulate through the cotangent chain. `StackPush`
//! and `StackPop` have gradients (each is the other's transpose), so the gradient loop itself
//! differentiates again.

use crate::graph::{Call, Case, If, StackOp, VariableOp, While};
use std::sync::Arc;

use smallvec::smallvec;

use super::tracer::lock;
use super::{replay, TraceContext, TracerRef, Val};
use crate::error::{Error, Result};
use crate::graph::{inline_into, with_params};
use crate::graph::{Function, FunctionBuilder, NodeId, NodeKind, Port, ValueType};
use crate::ops::Context;
use crate::ops::{binary, build, Grads};
use crate::shape::{TensorType, DYN};
use crate::tape::{compute_gradient, GradientFunction, GradientRegistry, Tape, TapeContext};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::DType;

/// The registry of graph mode: every op's rule, plus control flow and stacks.
pub fn graph_registry() -> GradientRegistry<Val> {
    let mut r = GradientRegistry::with_op_table();
    r.register_nodes(node_gradient);
    r
}

/// The process's one registry: every op's rule plus control flow, stacks and custom gradients,
/// for eager and symbolic values alike (`Val` is either). Built once, on first use.
pub fn registry() -> &'static GradientRegistry<Val> {
    static REGISTRY: std::sync::OnceLock<GradientRegistry<Val>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(graph_registry)
}

fn node_gradient(
    kind: &NodeKind,
    inputs: &[Val],
    outputs: &[Val],
) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
    Ok(match kind {
        NodeKind::Call(Call {
            gradient: Some(gradient),
            ..
        }) => Some(Arc::new(CustomGradient {
            gradient: gradient.clone(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        })),
        NodeKind::If(If { .. })
        | NodeKind::Case(Case { .. })
        | NodeKind::Call(Call { .. })
        | NodeKind::While(While { .. }) => Some(Arc::new(ControlGradient {
            kind: kind.clone(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        })),
        NodeKind::Variable(VariableOp::Read) if is_float_resource(&inputs[0].value_type()) => {
            Some(Arc::new(ReadVariableGradient))
        }
        NodeKind::Stack(StackOp::Push) => Some(Arc::new(StackPushGradient)),
        NodeKind::Stack(StackOp::Pop) => Some(Arc::new(StackPopGradient {
            value: outputs[1].clone(),
        })),
        _ => None,
    })
}

fn gradient_error(op: &str, message: impl Into<String>) -> Error {
    Error::gradient(op.to_string(), message.into())
}

/// What a gradient built for one forward node (reused when the node is differentiated again).
pub struct Augmented {
    /// Outputs of the new forward node (the old outputs first).
    forward: Vec<Val>,
    /// The gradient node and the inputs it takes after the cotangents.
    backward: NodeKind,
    extra_inputs: Vec<Val>,
    /// Loop variables / outputs that carry a cotangent, and the operands that get gradients.
    cotangents: Vec<usize>,
    differentiable: Vec<usize>,
}

fn is_float_tensor(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Tensor(t) if t.dtype.is_float())
}

/// A float variable: its cotangent is a tensor of the variable's type, the sum of the
/// cotangents of every value read from it (TensorFlow's resource gradients).
fn is_float_resource(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Resource(t) if t.dtype.is_float())
}

/// A value that takes a tensor cotangent: a float tensor or a float variable.
fn is_differentiable(ty: &ValueType) -> bool {
    is_float_tensor(ty) || is_float_resource(ty)
}

/// The type of a cotangent of a value of type `ty` (a variable's is its value's tensor type).
fn cotangent_type(ty: ValueType) -> ValueType {
    match ty {
        ValueType::Resource(t) => ValueType::Tensor(t),
        other => other,
    }
}

fn is_float_stack(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Stack(t) if t.dtype.is_float())
}

/// The frame and node of a symbolic node output.
fn node_of(outputs: &[Val], what: &str) -> Result<(super::FrameId, NodeId)> {
    match outputs.first() {
        Some(Val::Symbol(s)) => Ok((s.frame, s.port.node)),
        _ => Err(gradient_error(
            what,
            "control flow outside a traced function",
        )),
    }
}

fn function(tracer: &TracerRef, name: &str) -> Result<Function> {
    Ok(lock(tracer).library().get(name)?.clone())
}

fn add_function(tracer: &TracerRef, f: Function) -> Result<String> {
    let mut t = lock(tracer);
    let name = t.fresh_name(&f.name);
    let mut f = f;
    f.name = name.clone();
    t.add_function(f)?;
    Ok(name)
}

/// A value of type `ty` for a branch that does not compute it: zeros, with unknown dimensions
/// of size 0 (the branch that runs decides the real shape).
fn mirror(builder: &mut FunctionBuilder, ty: &ValueType) -> Result<Port> {
    let t = ty.inner();
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| if d == DYN { 0 } else { d })
        .collect();
    match ty {
        ValueType::Tensor(_) => Ok(builder.add_const(Tensor::filled(t.dtype, &shape, 0.0))),
        // The branch not taken pushed nothing: its backward never pops this stack.
        ValueType::Stack(element) => Ok(builder.add_node(
            NodeKind::Stack(StackOp::New {
                element: element.clone(),
            }),
            &[],
            vec![ty.clone()],
        )?[0]),
        _ => Err(gradient_error(
            "cond",
            format!("a branch residual of type {ty} cannot be mirrored"),
        )),
    }
}

/// Zeros (a tensor) or an empty stack shaped like `like`, through `ctx`.
fn zero_like(ctx: &mut dyn Context<Val>, like: &Val) -> Result<Val> {
    match like.value_type() {
        ValueType::Stack(t) => Ok(ctx
            .apply_node(&NodeKind::Stack(StackOp::New { element: t }), &[])?
            .remove(0)),
        ValueType::Resource(t) if !t.shape.contains(&DYN) => {
            build::fill(ctx, t.dtype, &t.shape, 0.0)
        }
        _ => build::zeros_like(ctx, like),
    }
}

/// Replays `f` on fresh parameters under a tape and builds its backward function.
struct Differentiated {
    /// Forward function name: `f`'s results, then the residuals.
    forward: String,
    /// Backward function name: `(cotangents of cot_outputs..., residuals...)` -> gradients of
    /// the `sources` parameters (zeros where none flows; empty stacks for stacks).
    backward: String,
    residual_types: Vec<ValueType>,
    /// For each residual, the forward parameter it is, if it is one.
    residual_params: Vec<Option<usize>>,
    /// Which forward results were the parameter of the same index (loop pass-through).
    passthrough: Vec<bool>,
    /// Sources whose gradient was not structurally zero.
    nonzero: Vec<bool>,
}

impl Differentiated {
    /// Residuals that are not forward parameters (those a branch yields).
    fn slot_residuals(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.residual_params.len()).filter(|&r| self.residual_params[r].is_none())
    }
}

fn differentiate(
    tracer: &TracerRef,
    f: &Function,
    cot_outputs: &[usize],
    sources: &[usize],
) -> Result<Differentiated> {
    let params = lock(tracer).push_function(&format!("{}_fwd", f.name), f.params.clone());
    let tape = Tape::new_ref(false);
    {
        let mut t = tape.lock().unwrap_or_else(|e| e.into_inner());
        for &i in sources {
            t.watch(&params[i])?;
        }
    }
    let mut inner = TraceContext::new(Some(tracer.clone()));
    let results = {
        let tapes = [tape.clone()];
        let mut ctx = TapeContext {
            inner: &mut inner,
            tapes: &tapes,
            registry: registry(),
        };
        replay(&mut ctx, f, &params)
    };
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            lock(tracer).abandon_function();
            return Err(e);
        }
    };
    let cot_types: Vec<ValueType> = cot_outputs
        .iter()
        .map(|&i| cotangent_type(results[i].value_type()))
        .collect();
    let cots = lock(tracer).push_function(&format!("{}_bwd", f.name), cot_types);
    let built = (|| {
        let targets: Vec<Val> = cot_outputs.iter().map(|&i| results[i].clone()).collect();
        let srcs: Vec<Val> = sources.iter().map(|&i| params[i].clone()).collect();
        let seeds: Vec<Option<Val>> = cots.iter().cloned().map(Some).collect();
        let grads = compute_gradient(&tape, &mut inner, &targets, &srcs, Some(&seeds))?;
        let nonzero: Vec<bool> = grads.iter().map(Option::is_some).collect();
        let mut outs = Vec::with_capacity(grads.len());
        for (g, s) in grads.into_iter().zip(&srcs) {
            outs.push(match g {
                Some(g) => g,
                None => zero_like(&mut inner, s)?,
            });
        }
        Ok((outs, nonzero))
    })();
    let (outs, nonzero) = match built {
        Ok(b) => b,
        Err(e) => {
            let mut t = lock(tracer);
            t.abandon_function();
            t.abandon_function();
            return Err(e);
        }
    };
    let (backward, residuals) = lock(tracer).pop_function(&outs)?;
    let passthrough: Vec<bool> = (0..f.params.len())
        .map(|i| results.get(i).is_some_and(|r| r.id() == params[i].id()))
        .collect();
    let mut fwd_results = results.clone();
    fwd_results.extend(residuals.iter().cloned());
    let (forward, fwd_captures) = lock(tracer).pop_function(&fwd_results)?;
    if !fwd_captures.is_empty() {
        return Err(Error::internal(
            "gradient",
            format!("@{forward} captured {} outer values", fwd_captures.len()),
        ));
    }
    // Read from the finished function: the tracer may have resolved a residual (a resource
    // passed through a nested node) to the parameter it is.
    let finished = function(tracer, &forward)?;
    let residual_params: Vec<Option<usize>> = finished.results[results.len()..]
        .iter()
        .map(|port| (port.node < params.len()).then_some(port.node))
        .collect();
    Ok(Differentiated {
        forward,
        backward,
        residual_types: residuals.iter().map(Val::value_type).collect(),
        residual_params,
        passthrough,
        nonzero,
    })
}

/// Whether a control-flow node assigns Variables (its callees have side effects).
fn assigns_variables(tracer: &TracerRef, kind: &NodeKind) -> Result<bool> {
    let t = lock(tracer);
    for callee in kind.callees() {
        if !t.library().get(callee)?.control_outputs.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The user-facing name of a control-flow node kind.
fn construct(kind: &NodeKind) -> &'static str {
    match kind {
        NodeKind::If(If { .. }) => "cond",
        NodeKind::Case(Case { .. }) => "switch_case",
        NodeKind::While(While { .. }) => "while_loop",
        _ => "function call",
    }
}

/// The gradient function of a control-flow node.
struct ControlGradient {
    kind: NodeKind,
    inputs: Vec<Val>,
    outputs: Vec<Val>,
}

impl GradientFunction<Val> for ControlGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Grads<Val>> {
        let name = self.kind.name();
        let tracer = ctx
            .tracer()
            .ok_or_else(|| gradient_error(name, "control flow outside a traced function"))?;
        let (frame, node) = node_of(&self.outputs, name)?;
        let key = (frame, node);
        // A node that assigns Variables must run once: it is augmented for every input at
        // the first request, so that no later gradient adds a second forward node.
        let effects = assigns_variables(&tracer, &self.kind)?;
        let every = vec![true; needs.len()];
        let needs = if effects { &every[..] } else { needs };
        let cached = lock(&tracer).augmented.get(&key).cloned();
        let aug = match cached {
            Some(a) if self.covers(&a, needs) => a,
            cached => {
                let index = lock(&tracer).frame_index(frame).ok_or_else(|| {
                    gradient_error(name, "the function holding this node is finished")
                })?;
                let depth = lock(&tracer).depth();
                // Build over the node's own frame; the new forward node joins the current one.
                lock(&tracer).stash_above(index);
                let built = match &self.kind {
                    NodeKind::While(While { .. }) => {
                        self.augment_while(&tracer, grad_outputs, needs)
                    }
                    _ => self.augment_branches(&tracer),
                };
                lock(&tracer).unstash();
                let built = built?;
                // A node augmented before for other inputs gets a second forward node (the
                // first one stays where it is and keeps serving the earlier gradient).
                let first = cached.is_none();
                let same_frame = first && index + 1 == depth;
                if effects && !same_frame {
                    // The forward node would be emitted again where the gradient is built.
                    return Err(gradient_error(
                        name,
                        format!(
                            "differentiating a {} nested in another cond, switch_case or \
                             while_loop, which assigns a Variable in its loop condition or \
                             passes one to a custom gradient, is not supported under \
                             @gl.function or gl.jit (its assignments would run twice); assign \
                             it in a loop body instead, or differentiate eagerly",
                            construct(&self.kind)
                        ),
                    ));
                }
                let aug = Arc::new(self.emit_forward(ctx, &tracer, built, same_frame, node)?);
                if first {
                    lock(&tracer).augmented.insert(key, aug.clone());
                }
                aug
            }
        };
        self.emit_backward(ctx, &aug, grad_outputs)
    }
}

/// A forward node to emit and the gradient node that goes with it.
struct Built {
    forward: NodeKind,
    forward_extra: Vec<ExtraInput>,
    backward: NodeKind,
    /// Forward outputs the backward node takes after the cotangents (by index), and original
    /// inputs it takes after those.
    backward_outputs: Vec<usize>,
    backward_inputs: Vec<usize>,
    cotangents: Vec<usize>,
    differentiable: Vec<usize>,
}

/// Inputs of a new forward node beyond the old node's.
enum ExtraInput {
    Zero(DType),
    EmptyStack(TensorType),
}

impl ControlGradient {
    /// Whether `aug` gives a gradient for every float tensor input that `needs` one.
    fn covers(&self, aug: &Augmented, needs: &[bool]) -> bool {
        let sel = self.selector();
        self.inputs.iter().enumerate().skip(sel).all(|(i, input)| {
            !(needs.get(i).copied().unwrap_or(true) && is_differentiable(&input.value_type()))
                || aug.differentiable.contains(&(i - sel))
        })
    }

    fn selector(&self) -> usize {
        match self.kind {
            NodeKind::If(If { .. }) | NodeKind::Case(Case { .. }) => 1,
            _ => 0,
        }
    }

    fn augment_branches(&self, tracer: &TracerRef) -> Result<Built> {
        let sel = self.selector();
        let operands = &self.inputs[sel..];
        let cotangents: Vec<usize> = (0..self.outputs.len())
            .filter(|&i| is_float_tensor(&self.outputs[i].value_type()))
            .collect();
        let differentiable: Vec<usize> = (0..operands.len())
            .filter(|&i| is_differentiable(&operands[i].value_type()))
            .collect();
        let callees: Vec<String> = self.kind.callees().iter().map(|s| s.to_string()).collect();
        let mut parts = Vec::new();
        for callee in &callees {
            let f = function(tracer, callee)?;
            parts.push(differentiate(tracer, &f, &cotangents, &differentiable)?);
        }
        // A residual that is a branch operand (a resource read in the branch, an input the
        // gradient reuses) is passed to the backward node from outside: every branch sees the
        // same operands, so it needs no slot, and a resource could not be mirrored in one.
        let mut operand_inputs: Vec<usize> = parts
            .iter()
            .flat_map(|p| p.residual_params.iter().flatten().copied())
            .collect();
        operand_inputs.sort_unstable();
        operand_inputs.dedup();
        // Residual slots: branch k's other residuals at offsets[k].
        let mut offsets = Vec::new();
        let mut slot_types: Vec<ValueType> = Vec::new();
        for p in &parts {
            offsets.push(slot_types.len());
            slot_types.extend(p.slot_residuals().map(|r| p.residual_types[r].clone()));
        }
        let n_out = self.outputs.len();
        let operand_types: Vec<ValueType> = operands.iter().map(Val::value_type).collect();
        let mut fwd_names = Vec::new();
        let mut bwd_names = Vec::new();
        for (k, p) in parts.iter().enumerate() {
            let fwd = function(tracer, &p.forward)?;
            let (mut b, args) = FunctionBuilder::new(&p.forward, operand_types.clone());
            let (res, effects) = inline_into(&mut b, &fwd, &args)?;
            let mut results: Vec<Port> = res[..n_out].to_vec();
            for (j, q) in parts.iter().enumerate() {
                for r in q.slot_residuals() {
                    results.push(if j == k {
                        res[n_out + r]
                    } else {
                        mirror(&mut b, &q.residual_types[r])?
                    });
                }
            }
            fwd_names.push(add_function(tracer, b.finish(&results, &effects)?)?);
            // Backward: (cotangents, residual slots, operand residuals) -> gradients.
            let bwd = function(tracer, &p.backward)?;
            let n_cot = cotangents.len();
            let mut params: Vec<ValueType> = bwd.params[..n_cot].to_vec();
            params.extend(slot_types.iter().cloned());
            params.extend(operand_inputs.iter().map(|&i| operand_types[i].clone()));
            let mut mapping: Vec<usize> = (0..n_cot).collect();
            let mut slot = n_cot + offsets[k];
            for param in &p.residual_params {
                mapping.push(match param {
                    Some(i) => {
                        let at = operand_inputs.binary_search(i).expect("collected above");
                        n_cot + slot_types.len() + at
                    }
                    None => {
                        slot += 1;
                        slot - 1
                    }
                });
            }
            let g = with_params(&bwd, &p.backward, params, &mapping, &[])?;
            bwd_names.push(add_function(tracer, g)?);
        }
        let (forward, backward) = match &self.kind {
            NodeKind::If(If { .. }) => (
                NodeKind::If(If {
                    then_branch: fwd_names[0].clone(),
                    else_branch: fwd_names[1].clone(),
                }),
                NodeKind::If(If {
                    then_branch: bwd_names[0].clone(),
                    else_branch: bwd_names[1].clone(),
                }),
            ),
            NodeKind::Case(Case { .. }) => (
                NodeKind::Case(Case {
                    branches: fwd_names,
                }),
                NodeKind::Case(Case {
                    branches: bwd_names,
                }),
            ),
            _ => (
                NodeKind::Call(Call {
                    function: fwd_names[0].clone(),
                    gradient: None,
                }),
                NodeKind::Call(Call {
                    function: bwd_names[0].clone(),
                    gradient: None,
                }),
            ),
        };
        Ok(Built {
            forward,
            forward_extra: Vec::new(),
            backward,
            backward_outputs: (n_out..n_out + slot_types.len()).collect(),
            backward_inputs: operand_inputs.iter().map(|i| sel + i).collect(),
            cotangents,
            differentiable,
        })
    }

    fn augment_while(
        &self,
        tracer: &TracerRef,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Built> {
        let NodeKind::While(While {
            cond,
            body,
            maximum_iterations,
            parallel_iterations,
        }) = &self.kind
        else {
            unreachable!("augment_while is called for While nodes")
        };
        let body_fn = function(tracer, body)?;
        let cond_fn = function(tracer, cond)?;
        let n = body_fn.params.len();
        let types = body_fn.params.clone();
        let wanted = wanted_vars(&body_fn, needs);
        // Float tensors always carry a cotangent; a stack only once one reaches it.
        let mut carried: Vec<usize> = (0..n)
            .filter(|&i| {
                wanted[i]
                    && (is_differentiable(&types[i])
                        || (is_float_stack(&types[i])
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
            forward: NodeKind::While(While {
                cond: fwd_cond,
                body: fwd_body,
                maximum_iterations: *maximum_iterations,
                parallel_iterations: *parallel_iterations,
            }),
            forward_extra,
            backward: NodeKind::While(While {
                cond: grad_cond,
                body: grad_body,
                maximum_iterations: None,
                parallel_iterations: *parallel_iterations,
            }),
            backward_outputs: (n..n + 1 + stacked.len()).collect(),
            backward_inputs: invariant.iter().map(|&(_, i)| i).collect(),
            cotangents: carried.clone(),
            differentiable: carried,
        })
    }

    fn emit_forward(
        &self,
        ctx: &mut dyn Context<Val>,
        tracer: &TracerRef,
        built: Built,
        same_frame: bool,
        old: NodeId,
    ) -> Result<Augmented> {
        let mut inputs = self.inputs.clone();
        for extra in &built.forward_extra {
            inputs.push(match extra {
                ExtraInput::Zero(dtype) => build::fill(ctx, *dtype, &[], 0.0)?,
                ExtraInput::EmptyStack(t) => ctx
                    .apply_node(&NodeKind::Stack(StackOp::New { element: t.clone() }), &[])?
                    .remove(0),
            });
        }
        let forward = ctx.apply_node(&built.forward, &inputs)?.into_vec();
        if same_frame {
            if let Some(Val::Symbol(s)) = forward.first() {
                lock(tracer).supersede(old, s.port.node)?;
            }
        }
        let mut extra_inputs: Vec<Val> = built
            .backward_outputs
            .iter()
            .map(|&i| forward[i].clone())
            .collect();
        extra_inputs.extend(
            built
                .backward_inputs
                .iter()
                .map(|&i| self.inputs[i].clone()),
        );
        Ok(Augmented {
            forward,
            backward: built.backward,
            extra_inputs,
            cotangents: built.cotangents,
            differentiable: built.differentiable,
        })
    }

    fn emit_backward(
        &self,
        ctx: &mut dyn Context<Val>,
        aug: &Augmented,
        grad_outputs: &[Option<Val>],
    ) -> Result<Grads<Val>> {
        let is_while = matches!(self.kind, NodeKind::While(While { .. }));
        let sel = if is_while { 0 } else { self.selector() };
        let mut inputs: Vec<Val> = Vec::new();
        if !is_while && sel == 1 {
            inputs.push(self.inputs[0].clone());
        }
        for &i in &aug.cotangents {
            inputs.push(match grad_outputs.get(i).cloned().flatten() {
                Some(g) => g,
                None => zero_like(ctx, &aug.forward[i])?,
            });
        }
        inputs.extend(aug.extra_inputs.iter().cloned());
        let outputs = ctx.apply_node(&aug.backward, &inputs)?;
        let mut grads: Grads<Val> = smallvec![None; self.inputs.len()];
        for (k, &i) in aug.differentiable.iter().enumerate() {
            grads[sel + i] = Some(outputs[k].clone());
        }
        Ok(grads)
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

/// A `Call` with a custom gradient function (`gl.custom_gradient` traced in graph mode): a call
/// of `gradient(operands, results, cotangents)`, whose results are the gradients of the leading
/// operands. Its ops are recorded by the tapes active now, so it differentiates again.
struct CustomGradient {
    gradient: String,
    inputs: Vec<Val>,
    outputs: Vec<Val>,
}

impl GradientFunction<Val> for CustomGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        let mut args = self.inputs.clone();
        args.extend(self.outputs.iter().cloned());
        for (g, y) in grad_outputs.iter().zip(&self.outputs) {
            args.push(match g {
                Some(g) => g.clone(),
                None => build::zeros_like(ctx, y)?,
            });
        }
        let call = NodeKind::Call(Call {
            function: self.gradient.clone(),
            gradient: None,
        });
        let out = ctx.apply_node(&call, &args)?;
        let mut grads: Grads<Val> = smallvec![None; self.inputs.len()];
        for (k, g) in out.into_iter().enumerate() {
            if is_float_tensor(&self.inputs[k].value_type()) {
                grads[k] = Some(g);
            }
        }
        Ok(grads)
    }
}

/// `read_variable(resource) -> value`: the value's cotangent is the resource's.
struct ReadVariableGradient;

impl GradientFunction<Val> for ReadVariableGradient {
    fn compute(
        &self,
        _ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        Ok(smallvec![grad_outputs[0].clone()])
    }
}

/// `push(stack, value) -> stack'`: the cotangent stack pops to give both gradients.
struct StackPushGradient;

impl GradientFunction<Val> for StackPushGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        match &grad_outputs[0] {
            None => Ok(smallvec![None, None]),
            Some(ds) => {
                let out =
                    ctx.apply_node(&NodeKind::Stack(StackOp::Pop), std::slice::from_ref(ds))?;
                Ok(smallvec![Some(out[0].clone()), Some(out[1].clone())])
            }
        }
    }
}

/// `pop(stack) -> (stack', value)`: the value's cotangent is pushed back on the stack's.
struct StackPopGradient {
    value: Val,
}

impl GradientFunction<Val> for StackPopGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        let (ds, dv) = (&grad_outputs[0], &grad_outputs.get(1).cloned().flatten());
        if ds.is_none() && dv.is_none() {
            return Ok(smallvec![None]);
        }
        let ds = match ds {
            Some(ds) => ds.clone(),
            None => ctx
                .apply_node(
                    &NodeKind::Stack(StackOp::New {
                        element: self.value.ty().clone(),
                    }),
                    &[],
                )?
                .remove(0),
        };
        let dv = match dv {
            Some(dv) => dv.clone(),
            None => build::zeros_like(ctx, &self.value)?,
        };
        let out = ctx.apply_node(&NodeKind::Stack(StackOp::Push), &[ds, dv])?;
        Ok(smallvec![Some(out[0].clone())])
    }
}
