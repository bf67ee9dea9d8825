//! The gradient machinery of constructs: the registry, the dispatch to each construct's
//! `Differentiate` (in `crate::control`), and the driver shared by the constructs that call
//! functions.
//!
//! A node calling functions (`If`, `Case`, `While`, `Call`) is differentiated by a program
//! transform its construct supplies (`Augment`): replay the callees under a tape into forward
//! functions that also return their residuals and backward functions that take them
//! (`differentiate`), emit a NEW forward node that supersedes the old one, and a gradient node
//! over the backward functions. `ControlGradient` caches the pair per node (so a node
//! differentiated twice keeps one forward node), runs a node that assigns Variables once, and
//! feeds the gradient node its cotangents and residuals.

use std::sync::Arc;

use smallvec::smallvec;

use super::tracer::lock;
use super::{replay, TraceContext, TracerRef, Val};
use crate::error::{Error, Result};

use crate::graph::{
    Function, FunctionBuilder, NodeId, NodeKind, NodeRule, Port, StackOp, ValueType,
};
use crate::ops::Context;
use crate::ops::{build, Grads};
use crate::shape::{TensorType, DYN};
use crate::tape::{compute_gradient, GradientFunction, GradientRegistry, Tape, TapeContext};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::DType;

/// The registry of graph mode: every op's rule, plus control flow and stacks.
pub fn graph_registry() -> GradientRegistry<Val> {
    let mut r = GradientRegistry::with_op_table();
    r.register_nodes(node_gradient);
    r.register_node_tangents(super::tangents::node_tangent);
    r
}

/// The process's one registry: every op's rule plus control flow, stacks and custom gradients,
/// for eager and symbolic values alike (`Val` is either). Built once, on first use.
pub fn registry() -> &'static GradientRegistry<Val> {
    static REGISTRY: std::sync::OnceLock<GradientRegistry<Val>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(graph_registry)
}

/// How the tape differentiates a construct's node.
pub(crate) trait Differentiate {
    /// The gradient function of a node of this construct with these inputs and outputs, or
    /// `None` when nothing flows back through it.
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>>;
}

fn node_gradient(
    kind: &NodeKind,
    inputs: &[Val],
    outputs: &[Val],
) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
    match kind {
        // ops have the op table's rules; arguments and constants end the chain
        NodeKind::Arg(_) | NodeKind::Const(_) | NodeKind::Op(_) => Ok(None),
        NodeKind::If(c) => c.gradient(inputs, outputs),
        NodeKind::Case(c) => c.gradient(inputs, outputs),
        NodeKind::While(c) => c.gradient(inputs, outputs),
        NodeKind::Call(c) => c.gradient(inputs, outputs),
        NodeKind::Variable(c) => c.gradient(inputs, outputs),
        NodeKind::Stack(c) => c.gradient(inputs, outputs),
    }
}

pub(crate) fn gradient_error(op: &str, message: impl Into<String>) -> Error {
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

pub(crate) fn is_float_tensor(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Tensor(t) if t.dtype.is_float())
}

/// A float variable: its cotangent is a tensor of the variable's type, the sum of the
/// cotangents of every value read from it (TensorFlow's resource gradients).
pub(crate) fn is_float_resource(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Resource(t) if t.dtype.is_float())
}

/// A value that takes a tensor cotangent: a float tensor or a float variable.
pub(crate) fn is_differentiable(ty: &ValueType) -> bool {
    is_float_tensor(ty) || is_float_resource(ty)
}

/// The type of a cotangent of a value of type `ty` (a variable's is its value's tensor type).
fn cotangent_type(ty: ValueType) -> ValueType {
    match ty {
        ValueType::Resource(t) => ValueType::Tensor(t),
        other => other,
    }
}

pub(crate) fn is_float_stack(ty: &ValueType) -> bool {
    matches!(ty, ValueType::Stack(t) if t.dtype.is_float())
}

/// A value whose cotangent a construct's gradient node can take: a float tensor or stack.
pub(crate) fn carries_cotangent(ty: &ValueType) -> bool {
    is_float_tensor(ty) || is_float_stack(ty)
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

pub(crate) fn function(tracer: &TracerRef, name: &str) -> Result<Function> {
    Ok(lock(tracer).library().get(name)?.clone())
}

pub(crate) fn add_function(tracer: &TracerRef, f: Function) -> Result<String> {
    let mut t = lock(tracer);
    let name = t.fresh_name(&f.name);
    let mut f = f;
    f.name = name.clone();
    t.add_function(f)?;
    Ok(name)
}

/// A value of type `ty` for a branch that does not compute it: zeros, with unknown dimensions
/// of size 0 (the branch that runs decides the real shape).
pub(crate) fn mirror(builder: &mut FunctionBuilder, ty: &ValueType) -> Result<Port> {
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
pub(crate) fn zero_like(ctx: &mut dyn Context<Val>, like: &Val) -> Result<Val> {
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
pub(crate) struct Differentiated {
    /// Forward function name: `f`'s results, then the residuals.
    pub forward: String,
    /// Backward function name: `(cotangents of cot_outputs..., residuals...)` -> gradients of
    /// the `sources` parameters (zeros where none flows; empty stacks for stacks).
    pub backward: String,
    pub residual_types: Vec<ValueType>,
    /// For each residual, the forward parameter it is, if it is one.
    pub residual_params: Vec<Option<usize>>,
    /// Which forward results were the parameter of the same index (loop pass-through).
    pub passthrough: Vec<bool>,
    /// Sources whose gradient was not structurally zero.
    pub nonzero: Vec<bool>,
}

impl Differentiated {
    /// Residuals that are not forward parameters (those a branch yields).
    pub fn slot_residuals(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.residual_params.len()).filter(|&r| self.residual_params[r].is_none())
    }
}

pub(crate) fn differentiate(
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
fn assigns_variables(tracer: &TracerRef, callees: Vec<&str>) -> Result<bool> {
    let t = lock(tracer);
    for callee in callees {
        if !t.library().get(callee)?.control_outputs.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How a construct that calls functions is differentiated: the program transform that builds
/// a new forward node (returning residuals too) and the gradient node that goes with it.
pub(crate) trait Augment: NodeRule + Send + Sync {
    /// The user-facing name (`cond`, `while_loop`, ...), for errors.
    fn api_name(&self) -> &'static str;

    /// Builds the forward and gradient nodes for the node `g` differentiates.
    fn augment(
        &self,
        g: &ControlGradient,
        tracer: &TracerRef,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Built>;
}

/// The gradient function of a node that calls functions (`If`, `Case`, `While`, `Call`).
pub(crate) struct ControlGradient {
    construct: Arc<dyn Augment>,
    pub inputs: Vec<Val>,
    pub outputs: Vec<Val>,
}

impl GradientFunction<Val> for ControlGradient {
    fn compute(
        &self,
        ctx: &mut dyn Context<Val>,
        grad_outputs: &[Option<Val>],
        needs: &[bool],
    ) -> Result<Grads<Val>> {
        let name = self.construct.keyword();
        let tracer = ctx
            .tracer()
            .ok_or_else(|| gradient_error(name, "control flow outside a traced function"))?;
        let (frame, node) = node_of(&self.outputs, name)?;
        let key = (frame, node);
        // A node that assigns Variables must run once: it is augmented for every input at
        // the first request, so that no later gradient adds a second forward node.
        let effects = assigns_variables(&tracer, self.construct.callees())?;
        let every = vec![true; needs.len()];
        let needs = if effects { &every[..] } else { needs };
        let cached = lock(&tracer).augmented.get(&key).cloned();
        let aug = match cached {
            Some(a) if self.covers(&a, needs, grad_outputs) => a,
            cached => {
                let index = lock(&tracer).frame_index(frame).ok_or_else(|| {
                    gradient_error(name, "the function holding this node is finished")
                })?;
                let depth = lock(&tracer).depth();
                // Build over the node's own frame; the new forward node joins the current one.
                lock(&tracer).stash_above(index);
                let built = self.construct.augment(self, &tracer, grad_outputs, needs);
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
                            self.construct.api_name()
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
pub(crate) struct Built {
    pub forward: NodeKind,
    pub forward_extra: Vec<ExtraInput>,
    pub backward: NodeKind,
    /// Forward outputs the backward node takes after the cotangents (by index), and original
    /// inputs it takes after those.
    pub backward_outputs: Vec<usize>,
    pub backward_inputs: Vec<usize>,
    pub cotangents: Vec<usize>,
    pub differentiable: Vec<usize>,
}

/// Inputs of a new forward node beyond the old node's.
pub(crate) enum ExtraInput {
    Zero(DType),
    EmptyStack(TensorType),
    /// A tensor of this type, every element the value.
    Fill(TensorType, f64),
}

impl ControlGradient {
    /// Whether `aug` gives a gradient for every float tensor input that `needs` one and takes
    /// every cotangent given (one built for zero cotangents would drop it).
    fn covers(&self, aug: &Augmented, needs: &[bool], grad_outputs: &[Option<Val>]) -> bool {
        let sel = self.selector();
        let gradients = self.inputs.iter().enumerate().skip(sel).all(|(i, input)| {
            !(needs.get(i).copied().unwrap_or(true) && is_differentiable(&input.value_type()))
                || aug.differentiable.contains(&(i - sel))
        });
        let cotangents = grad_outputs.iter().enumerate().all(|(i, g)| {
            g.is_none()
                || !carries_cotangent(&self.outputs[i].value_type())
                || aug.cotangents.contains(&i)
        });
        gradients && cotangents
    }

    /// The gradient function of a node of `construct` with these inputs and outputs.
    pub fn new(construct: impl Augment + 'static, inputs: &[Val], outputs: &[Val]) -> Self {
        ControlGradient {
            construct: Arc::new(construct),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        }
    }

    /// `new`, as the gradient function a construct's `Differentiate` returns.
    pub fn boxed(
        construct: impl Augment + 'static,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Arc<dyn GradientFunction<Val>> {
        Arc::new(ControlGradient::new(construct, inputs, outputs))
    }

    /// How many leading inputs are not operands.
    pub fn selector(&self) -> usize {
        self.construct.operand_start()
    }

    /// A node of the same construct over other functions.
    pub fn with_callees(&self, names: Vec<String>) -> NodeKind {
        self.construct.with_callees(names)
    }

    /// The functions the node calls.
    pub fn callees(&self) -> Vec<&str> {
        self.construct.callees()
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
                ExtraInput::Fill(t, value) => build::fill(ctx, t.dtype, &t.shape, *value)?,
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
        let sel = self.selector();
        let mut inputs: Vec<Val> = Vec::new();
        if sel == 1 {
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
