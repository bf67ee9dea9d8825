//! `Call`: `(operands...) -> function(operands...)`, optionally with a custom gradient
//! function (`gl.custom_gradient` traced in graph mode) `gradient(operands, results,
//! cotangents) -> gradients of the leading operands`.
//!
//! - Type rule: the callee's signature; a custom gradient takes operands, results and their
//!   cotangents and returns at most one gradient per operand, typed like it.
//! - Gradient: the custom gradient's call, or else the branch gradient of `control::branches`
//!   with one branch. Interpretation: the call. MLIR: `func.call`.

use std::sync::Arc;

use super::branches::branch_gradient;
use crate::dataflow::{Lower, LowerNode, Lowered};
use crate::error::Result;
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::{check_call, check_params};
use crate::graph::Node;
use crate::graph::NodeKind;
use crate::graph::{AttrReader, Call, Check, Library, NodeRule, ParseNode, ValueType};
use crate::interpret::{Interpret, NodeRun};
use crate::mlir::{Bound, EmitMlir, Lowering};
use crate::ops::{build, Context, Grads};
use crate::tape::GradientFunction;
use crate::trace::gradients::is_float_tensor;
use crate::trace::gradients::{ControlGradient, Differentiate};
use crate::trace::Val;
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
        attrs
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.function]
    }

    fn referenced(&self) -> Vec<&str> {
        let mut names = self.callees();
        names.extend(self.gradient.as_deref());
        names
    }

    fn with_callees(&self, names: Vec<String>) -> NodeKind {
        NodeKind::Call(Call {
            function: names
                .into_iter()
                .next()
                .unwrap_or_else(|| self.function.clone()),
            gradient: None,
        })
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        check_call(library, "callee", &self.function, ins, outs)?;
        match &self.gradient {
            Some(g) => check_custom_gradient(library, g, ins, outs),
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
        })
    }
}

/// A custom gradient function takes `(operands, results, cotangents of the results)` and
/// returns one gradient per leading operand, typed like it.
fn check_custom_gradient(
    library: &Library,
    name: &str,
    operands: &[&ValueType],
    outs: &[&ValueType],
) -> Check {
    let g = library
        .get(name)
        .map_err(|_| format!("gradient @{name} is not in the library"))?;
    let mut expected: Vec<&ValueType> = operands.to_vec();
    expected.extend(outs.iter().copied());
    expected.extend(outs.iter().copied());
    check_params("gradient", name, &g.params, &expected)?;
    let results = g.result_types().map_err(|e| e.message)?;
    if results.len() > operands.len() {
        return Err(format!(
            "gradient @{name} returns {} value(s) for {} operand(s)",
            results.len(),
            operands.len()
        ));
    }
    for (k, (r, o)) in results.iter().zip(operands).enumerate() {
        if !r.compatible(o) {
            return Err(format!(
                "gradient @{name} returns {r} for operand {k}, which is {o}"
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
}

impl crate::trace::tangents::Tangent for Call {
    fn tangent(
        &self,
        ctx: &mut dyn crate::ops::Context<Val>,
        inputs: &[Val],
        tangents: &[Option<Val>],
    ) -> Result<crate::trace::tangents::Built> {
        if self.gradient.is_some() {
            return Err(crate::error::Error::gradient(
                "custom_gradient",
                "a custom_gradient function has no forward-mode rule, and jvp, jacfwd and \
                 hessian need one: define the function with gl.custom_jvp",
            ));
        }
        crate::trace::tangents::over_callees(ctx, self, inputs, tangents)
    }
}

impl Differentiate for Call {
    fn gradient(
        &self,
        inputs: &[Val],
        outputs: &[Val],
    ) -> Result<Option<Arc<dyn GradientFunction<Val>>>> {
        Ok(Some(match &self.gradient {
            Some(gradient) => Arc::new(CustomGradient {
                gradient: gradient.clone(),
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
            }),
            None => ControlGradient::boxed(self.clone(), inputs, outputs),
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

impl Lower for Call {
    /// The callee inlined; the call's control inputs gate its inputs and constants.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        cx.b.inline_call(
            cx.scope,
            &self.function,
            &cx.inputs,
            &cx.control,
            cx.needs_done,
        )
    }
}
