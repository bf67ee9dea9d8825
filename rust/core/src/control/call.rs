//! `Call`: `(operands...) -> function(operands...)`, optionally with a custom gradient
//! function (`gl.custom_gradient` traced in graph mode) `gradient(operands, results,
//! cotangents) -> gradients of the leading operands`, a custom tangent function (`gl.custom_jvp`,
//! `gl.recompute_grad`) `tangent(operands, results, operand tangents) -> result tangents`, or
//! the reason the derivatives without a rule have none (`refused`: a rule failed as it was
//! traced; a custom gradient whose tangent rule failed still differentiates in reverse).
//!
//! - Type rule: the callee's signature; a custom gradient takes operands, results and their
//!   cotangents and returns at most one gradient per operand, typed like it; a custom tangent
//!   takes operands, results and one tangent per operand and returns at most one tangent per
//!   result, typed like it.
//! - Gradient: the custom gradient's call, or else the branch gradient of `control::branches`
//!   with one branch. Tangent: the custom tangent's call, or else the callee's tangent function.
//!   A refused derivative raises its reason when it is asked. Interpretation: the call. MLIR:
//!   the callee inlined.
//! - A composite (`kernel`): the frame executor runs the kernel op in place of the callee;
//!   everything else reads the callee, which defines it.

use std::sync::Arc;

use super::branches::branch_gradient;
use crate::batch::{BatchNode, LanesFunction, NodeBatch, Want};
use crate::dataflow::{DfKind, Lower, LowerNode, Lowered};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::{FuncName, Quoted};
use crate::graph::verify_nodes::{check_call, check_params};
use crate::graph::with_params;
use crate::graph::Node;
use crate::graph::NodeKind;
use crate::graph::{AttrReader, Call, Check, Library, NodeRule, ParseNode, ValueType};
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::stack_bounds::{PushFlow, Pushes};
use crate::mlir::ModuleFacts;
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::attrs::{Attr, AttrMap};
use crate::ops::Op;
use crate::ops::{build, Context, Grads, Tangents, Values};
use crate::passes::{PassRules, Threading};
use crate::tape::GradientFunction;
use crate::tensor::Tensor;
use crate::trace::captures::{tracer_of, Branch, CustomRules};
use crate::trace::gradients::{is_float_tensor, zero_like};
use crate::trace::gradients::{ControlGradient, Differentiate};
use crate::trace::lock;
use crate::trace::Val;
use crate::value::Value;
use smallvec::smallvec;

impl NodeRule for Call {
    fn keyword(&self) -> &'static str {
        "call"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let mut attrs = vec![("function", FuncName(&self.function).to_string())];
        if let Some(g) = &self.gradient {
            attrs.push(("gradient", FuncName(g).to_string()));
        }
        if let Some(t) = &self.tangent {
            attrs.push(("tangent", FuncName(t).to_string()));
        }
        if let Some(why) = &self.refused {
            attrs.push(("refused", Quoted(why).to_string()));
        }
        if let Some(op) = &self.kernel {
            attrs.push(("kernel", Quoted(&kernel_text(op)).to_string()));
        }
        attrs
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.function]
    }

    fn referenced(&self) -> Vec<&str> {
        let mut names = self.callees();
        names.extend(self.gradient.as_deref());
        names.extend(self.tangent.as_deref());
        names
    }

    fn with_callees(&self, names: Vec<String>) -> NodeKind {
        NodeKind::Call(Call {
            function: names
                .into_iter()
                .next()
                .unwrap_or_else(|| self.function.clone()),
            ..Default::default()
        })
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        check_call(library, "callee", &self.function, ins, outs)?;
        if let Some(op) = &self.kernel {
            check_kernel(op, ins, outs)?;
        }
        let node = (ins, outs);
        if let Some(g) = &self.gradient {
            check_rule(library, "gradient", g, node, (outs, ins, "operand"))?;
        }
        match &self.tangent {
            Some(t) => check_rule(library, "tangent", t, node, (ins, outs, "result")),
            None => Ok(()),
        }
    }

    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        library.get(&self.function)?.result_types()
    }
}

impl ParseNode for Call {
    const KEYWORDS: &'static [&'static str] = &["call"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(Call {
            function: attrs.function("function")?,
            gradient: attrs.optional_function("gradient")?,
            tangent: attrs.optional_function("tangent")?,
            refused: attrs.optional_string("refused")?,
            kernel: match attrs.optional_string("kernel")? {
                Some(text) => Some(parse_kernel(&text)?),
                None => None,
            },
        })
    }
}

/// A composite's kernel in graph text: the op's name and its attributes, as an op node
/// prints them (`triangular_solve{lower=true, unit_diagonal=false}`).
pub fn kernel_text(op: &Op) -> String {
    let attrs: Vec<String> = op.attrs().iter().map(|(n, a)| format!("{n}={a}")).collect();
    if attrs.is_empty() {
        op.name().to_string()
    } else {
        format!("{}{{{}}}", op.name(), attrs.join(", "))
    }
}

/// The op that `kernel_text` wrote (its attributes are booleans and integers).
pub fn parse_kernel(text: &str) -> Result<Op> {
    let bad = |why: &str| Error::new(ErrorKind::Graph, "call", format!("kernel `{text}`: {why}"));
    let (name, rest) = match text.split_once('{') {
        Some((name, rest)) => (
            name,
            rest.strip_suffix('}')
                .ok_or_else(|| bad("no closing brace"))?,
        ),
        None => (text, ""),
    };
    let mut map = AttrMap::new();
    for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad("an attribute without `=`"))?;
        let attr = match v.trim() {
            "true" => Attr::Bool(true),
            "false" => Attr::Bool(false),
            v => Attr::Int(
                v.parse()
                    .map_err(|_| bad("an attribute that is not a bool or int"))?,
            ),
        };
        map.insert(k.trim(), attr)?;
    }
    Op::from_name(name, &map)
}

/// A kernel takes the call's operands and gives its results, typed alike.
fn check_kernel(op: &Op, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
    let types = ins
        .iter()
        .map(|t| match t {
            ValueType::Tensor(t) => Ok(t.clone()),
            other => Err(format!("kernel {op} takes tensors, not {other}")),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let given = op
        .infer(&types)
        .map_err(|e| format!("kernel {op}: {}", e.message))?;
    let fits = given.len() == outs.len()
        && given
            .iter()
            .zip(outs)
            .all(|(g, o)| ValueType::Tensor(g.clone()).compatible(o));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "kernel {op} gives {given:?}, not the callee's results"
        ))
    }
}

/// A custom rule `@name` takes `(operands, results, then one value per `each`)` and returns at
/// most one value per `each` (`kind`s), typed like it: a gradient takes the results'
/// cotangents and gives the operands', a tangent takes the operands' tangents and gives the
/// results'.
fn check_rule(
    library: &Library,
    what: &str,
    name: &str,
    (operands, outs): (&[&ValueType], &[&ValueType]),
    (takes, each, kind): (&[&ValueType], &[&ValueType], &str),
) -> Check {
    let mut params: Vec<&ValueType> = operands.to_vec();
    params.extend(outs.iter().copied());
    params.extend(takes.iter().copied());
    let params = &params[..];
    let f = library
        .get(name)
        .map_err(|_| format!("{what} @{name} is not in the library"))?;
    check_params(what, name, &f.params, params)?;
    let results = f.result_types().map_err(|e| e.message)?;
    if results.len() > each.len() {
        return Err(format!(
            "{what} @{name} returns {} value(s) for {} {kind}(s)",
            results.len(),
            each.len()
        ));
    }
    for (k, (r, o)) in results.iter().zip(each).enumerate() {
        if !r.compatible(o) {
            return Err(format!(
                "{what} @{name} returns {r} for {kind} {k}, which is {o}"
            ));
        }
    }
    Ok(())
}

impl Interpret for Call {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let args = run.take_all()?;
        let results = run.call_callee(0, args)?;
        Ok(run.store(results))
    }
}

impl EmitMlir for Call {
    /// The callee inlined where it is called.
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        _node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>> {
        let site = l.e.site().clone();
        let outs = l.inline(&self.function, inputs)?;
        l.e.set_site(site);
        Ok(outs)
    }

    /// Inlined: nothing of its own.
    fn module_facts(&self, _facts: &mut ModuleFacts) {}

    fn stack_pushes(&self, flow: &PushFlow<'_>, ins: &[Pushes], _n: usize) -> Option<Vec<Pushes>> {
        flow.function(&self.function, ins)
    }
}

impl crate::trace::tangents::Tangent for Call {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        if let Some(tangent) = &self.tangent {
            return custom_tangent(ctx, self, tangent, inputs, tangents);
        }
        if let Some(why) = &self.refused {
            return Err(refusal(why));
        }
        if self.gradient.is_some() {
            return Err(Error::gradient(
                "custom_gradient",
                "a custom_gradient function has no forward-mode rule, and jvp, jacfwd and \
                 hessian need one: define the function with gl.custom_jvp",
            ));
        }
        crate::trace::tangents::over_callees(ctx, self, inputs, tangents)
    }
}

impl BatchNode for Call {
    /// The call of the callee over lanes, with its rules over the same lanes. Operands and
    /// results over lanes stay so in the rules (a cotangent or tangent is over lanes where its
    /// value is); the gradient of an operand the same in every lane is summed over them.
    fn batch(
        &self,
        cx: &mut NodeBatch<'_>,
        inputs: &[Val],
        batched: &[bool],
    ) -> Result<Values<Val>> {
        let mut function = cx.function(&self.function, batched, &|_| Want::AsItComes)?;
        let mut tangent = None;
        if let Some(t) = &self.tangent {
            let mut built = lanes_tangent(cx, t, batched, &function.batched)?;
            // A tangent over lanes for a result that is not: that result over lanes too.
            let wider: Vec<bool> = (function.batched.iter().zip(&built.batched))
                .map(|(&r, &t)| r || t)
                .collect();
            if wider != function.batched {
                let want = |k: usize| {
                    if wider[k] {
                        Want::Lanes
                    } else {
                        Want::AsItComes
                    }
                };
                function = cx.function(&self.function, batched, &want)?;
                built = lanes_tangent(cx, t, batched, &function.batched)?;
            }
            tangent = Some(built.name);
        }
        let gradient = match &self.gradient {
            Some(g) => {
                let mut flags = batched.to_vec();
                flags.extend(&function.batched);
                flags.extend(&function.batched);
                let want = |k: usize| match batched.get(k) {
                    Some(true) => Want::Lanes,
                    _ => Want::Summed,
                };
                Some(cx.function(g, &flags, &want)?.name)
            }
            None => None,
        };
        let call = Call {
            function: function.name,
            gradient,
            tangent,
            refused: self.refused.clone(),
            kernel: None,
        };
        let outputs = cx.ctx.apply_node(&NodeKind::Call(call), inputs)?;
        cx.wrap_all(outputs, &function.batched)
    }
}

/// A custom tangent `(operands, results, operand tangents)` over lanes, each tangent over
/// lanes where its value is.
fn lanes_tangent(
    cx: &mut NodeBatch<'_>,
    tangent: &str,
    operands: &[bool],
    results: &[bool],
) -> Result<LanesFunction> {
    let mut flags = operands.to_vec();
    flags.extend(results);
    flags.extend(operands);
    let want = |k: usize| match results.get(k) {
        Some(true) => Want::Lanes,
        _ => Want::AsItComes,
    };
    cx.function(tangent, &flags, &want)
}

impl Differentiate for Call {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(match (&self.gradient, &self.refused) {
            (Some(gradient), _) => Arc::new(CustomGradient {
                gradient: gradient.clone(),
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
            }),
            (None, Some(why)) => Arc::new(Refused(why.clone())),
            (None, None) => ControlGradient::boxed(self.clone(), inputs, outputs),
        }))
    }
}

branch_gradient!(Call, "function call");

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
            ..Default::default()
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

/// The outputs of `call` and their tangents, from its custom `tangent` function: the call
/// itself, then `tangent(operands, results, operand tangents)`, zeros for operands without one.
/// A float result past those the rule gives tangents for (a residual its custom gradient
/// reads) is an error: zeros would be a wrong tangent.
fn custom_tangent(
    ctx: &mut dyn Context<Val>,
    call: &Call,
    tangent: &str,
    inputs: &[Val],
    tangents: &[Option<Val>],
) -> Result<crate::trace::tangents::Built> {
    let outputs = ctx.apply_node(&NodeKind::Call(call.clone()), inputs)?;
    let mut args = inputs.to_vec();
    args.extend(outputs.iter().cloned());
    for (t, x) in tangents.iter().zip(inputs) {
        args.push(match t {
            Some(t) => t.clone(),
            None => zero_like(ctx, x)?,
        });
    }
    let kind = NodeKind::Call(Call {
        function: tangent.to_string(),
        ..Default::default()
    });
    let computed = ctx.apply_node(&kind, &args)?;
    let residual = outputs[computed.len()..]
        .iter()
        .any(|r| is_float_tensor(&r.value_type()));
    if residual {
        return Err(Error::gradient(
            "custom_jvp",
            "the function's gradient reads values computed inside it, which its tangent rule \
             does not give tangents for: forward mode over its gradient is not available",
        ));
    }
    let mut out_tangents: Tangents<Val> = smallvec![None; outputs.len()];
    for (k, t) in computed.into_iter().enumerate() {
        if is_float_tensor(&outputs[k].value_type()) {
            out_tangents[k] = Some(t);
        }
    }
    Ok(Some((outputs, out_tangents)))
}

/// The gradient of a call whose rule failed as it was traced: the failure, once asked.
struct Refused(String);

impl GradientFunction<Val> for Refused {
    fn compute(
        &self,
        _ctx: &mut dyn Context<Val>,
        _grad_outputs: &[Option<Val>],
        _needs: &[bool],
    ) -> Result<Grads<Val>> {
        Err(refusal(&self.0))
    }
}

/// The error of a refused call: `why` reads `"<api>(<function>): <message>"`.
/// A rule that returned values of the wrong structure or type (`MALFORMED` in `why`) is a
/// GradientTypeError, as JAX raises a TypeError for it.
fn refusal(why: &str) -> Error {
    let kind = if why.contains(MALFORMED) {
        crate::ErrorKind::GradientType
    } else {
        crate::ErrorKind::Gradient
    };
    match why.split_once(": ") {
        Some((op, message)) => Error::new(kind, op.to_string(), message.to_string()),
        None => Error::new(kind, "custom rule", why.to_string()),
    }
}

/// What a refusal says of a rule whose results were malformed (`refusal`).
const MALFORMED: &str = "its rule is malformed";

impl Lower for Call {
    fn is_loop(&self) -> bool {
        false
    }

    /// The callee inlined; the call's control inputs gate its inputs and constants. A
    /// composite is its kernel, one node.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        if let Some(op) = &self.kernel {
            let inputs = std::mem::take(&mut cx.inputs);
            let control = std::mem::take(&mut cx.control);
            return Ok(cx
                .b
                .single(cx.scope, DfKind::Op(op.clone()), cx.node, inputs, control));
        }
        cx.b.inline_call(
            cx.scope,
            &self.function,
            &cx.inputs,
            &cx.control,
            cx.needs_done,
        )
    }
}

/// Closes the innermost frame, a custom function traced on `params` that computed `results`,
/// and calls it through a `Call` node whose gradient and tangent are the `rules` (the user's
/// functions, traced above that frame).
///
/// What a rule captured of the frame's own values (not its parameters) becomes extra results
/// of the function: the residuals, as cond_v2 exposes intermediates. The gradient is then
/// re-signed to take `(operands, results, cotangents)` and the tangent `(operands, results,
/// operand tangents)` (`NodeKind::Call`), so a gradient it takes of an operand flows into that
/// operand when differentiated again, while residuals are constants, as the eager forward pass
/// of a custom gradient is not recorded. Returns the call's `results`.
pub fn emit_custom_call(
    ctx: &mut dyn Context<Val>,
    inputs: &[Val],
    params: &[Val],
    results: &[Val],
    rules: &CustomRules,
) -> Result<Vec<Val>> {
    let tracer = tracer_of(ctx, "custom_gradient")?;
    let (call, operands) = {
        let mut t = lock(&tracer);
        let frame = t.top_frame();
        let mut residuals: Vec<Val> = Vec::new();
        for c in [&rules.gradient, &rules.tangent]
            .into_iter()
            .flatten()
            .flat_map(|b| &b.captures)
        {
            let own = matches!(c, Val::Symbol(s) if s.frame == frame);
            let param = params.iter().any(|p| p.id() == c.id());
            if own && !param && !residuals.iter().any(|r| r.id() == c.id()) {
                residuals.push(c.clone());
            }
        }
        let mut outs = results.to_vec();
        outs.extend(residuals.iter().cloned());
        let (function, captures) = t.pop_function(&outs)?;
        let f = t.library().get(&function)?.clone();
        let (n, n_out) = (f.params.len(), outs.len());
        let out_types = f.result_types()?;
        // Where a rule's capture is found among `(operands, results)`.
        let slot = |c: &Val| -> Result<usize> {
            let id = c.id();
            if let Some(k) = params.iter().position(|p| p.id() == id) {
                Ok(k)
            } else if let Some(q) = captures.iter().position(|v| v.id() == id) {
                Ok(params.len() + q)
            } else if let Some(r) = residuals.iter().position(|v| v.id() == id) {
                Ok(n + results.len() + r)
            } else {
                Err(Error::internal(
                    "custom_gradient",
                    "a value a custom rule captured is neither an operand nor a residual",
                ))
            }
        };
        // Each rule re-signed: `(operands, results, then its own leading parameters)`.
        let mut resign = |branch: &Branch, suffix: &str, leading: &[ValueType]| -> Result<String> {
            let g0 = t.library().get(&branch.name)?.clone();
            let own = g0.params.len() - branch.captures.len();
            let mut types = f.params.clone();
            types.extend(out_types.iter().cloned());
            types.extend(leading.iter().cloned());
            let mut mapping: Vec<usize> = (0..own).map(|i| n + n_out + i).collect();
            for c in &branch.captures {
                mapping.push(slot(c)?);
            }
            let name = t.fresh_name(&format!("{function}_{suffix}"));
            let g = with_params(&g0, &name, types, &mapping, &[])?;
            t.add_function(g)?;
            Ok(name)
        };
        let gradient = match &rules.gradient {
            Some(b) => Some(resign(b, "grad", &out_types)?),
            None => None,
        };
        let tangent = match &rules.tangent {
            Some(b) => Some(resign(b, "jvp", &f.params)?),
            None => None,
        };
        // a composite's callee takes its operands alone (it captured nothing): else the
        // kernel would not fit, and the plain call stands
        let kernel = rules.kernel.clone().filter(|_| captures.is_empty());
        let call = Call {
            function,
            gradient,
            tangent,
            refused: rules.refused.clone(),
            kernel,
        };
        let mut operands = inputs.to_vec();
        operands.extend(captures);
        (call, operands)
    };
    let mut outputs = ctx.apply_node(&NodeKind::Call(call), &operands)?.into_vec();
    outputs.truncate(results.len());
    Ok(outputs)
}

impl PassRules for Call {
    fn variable_threading(&self) -> Threading<'_> {
        Threading::AfterResults
    }

    fn constant_choice(&self, _selector: &Tensor) -> Result<Option<usize>> {
        Ok(None)
    }
}
