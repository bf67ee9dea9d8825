//! Graph mode's side of the `Context` seam: `Symbol` (a value of a function being built) and
//! `GraphContext`, which applies ops by adding nodes through `FunctionBuilder`.
//!
//! Because gradient rules are written against `Context`, running the tape's `compute_gradient`
//! with a `GraphContext` emits the backward pass as nodes of the same function: one autodiff
//! algorithm, two contexts. Wrapping the `GraphContext` in a `TapeContext` records those nodes
//! too, so a gradient graph can be differentiated again.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::{FunctionBuilder, Location, Port, ValueType};
use crate::ops::{Op, Values};
use crate::shape::TensorType;
use crate::tensor::{next_id, Tensor, TensorId};
use crate::value::Value;

/// A tensor-valued port of the function under construction, with a tape identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Symbol {
    id: TensorId,
    ty: TensorType,
    pub port: Port,
}

impl Symbol {
    pub fn new(port: Port, ty: TensorType) -> Symbol {
        Symbol {
            id: next_id(),
            ty,
            port,
        }
    }
}

impl Value for Symbol {
    fn id(&self) -> TensorId {
        self.id
    }

    fn ty(&self) -> &TensorType {
        &self.ty
    }
}

/// Adds each applied op as a node of `builder`, stamped with the current source location.
pub struct GraphContext<'b> {
    pub builder: &'b mut FunctionBuilder,
    /// Where the user's code that is being traced now lives (set by the tracer per call).
    pub location: Option<Location>,
}

impl<'b> GraphContext<'b> {
    pub fn new(builder: &'b mut FunctionBuilder) -> Self {
        GraphContext {
            builder,
            location: None,
        }
    }

    /// The function's parameter `index` (a port from `FunctionBuilder::new`) as a symbol.
    pub fn param(&self, port: Port) -> Result<Symbol> {
        Ok(Symbol::new(
            port,
            tensor_type(self.builder.port_type(port)?)?,
        ))
    }

    /// A constant node (a captured eager tensor or a literal).
    pub fn constant(&mut self, value: Tensor) -> Symbol {
        let ty = value.ty().clone();
        Symbol::new(self.builder.add_const(value), ty)
    }
}

fn tensor_type(ty: &ValueType) -> Result<TensorType> {
    ty.as_tensor()
        .cloned()
        .ok_or_else(|| Error::invalid("graph", format!("expected a tensor value, got {ty:?}")))
}

impl Context<Symbol> for GraphContext<'_> {
    fn apply(&mut self, op: &Op, inputs: &[Symbol]) -> Result<Values<Symbol>> {
        let ports: Vec<Port> = inputs.iter().map(|s| s.port).collect();
        let outputs = self
            .builder
            .add_op(op.clone(), &ports, self.location.clone())?;
        outputs
            .into_iter()
            .map(|port| {
                Ok(Symbol::new(
                    port,
                    tensor_type(self.builder.port_type(port)?)?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::EagerContext;
    use crate::graph::Library;
    use crate::interpret::{run, RtValue};
    use crate::ops::build;
    use crate::tape::{compute_gradient, GradientRegistry, Tape, TapeContext};

    fn f64s(values: &[f64]) -> Tensor {
        Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap()
    }

    /// loss(x) = sum(sin(x) * x), built through any context.
    fn loss<V: Value>(ctx: &mut dyn Context<V>, x: &V) -> Result<V> {
        let s = build::sin(ctx, x)?;
        let p = build::mul(ctx, &s, x)?;
        build::sum(ctx, &p, &[0], false)
    }

    fn eager_gradient(x: &Tensor) -> Vec<f64> {
        let tape = Tape::new_ref(false);
        tape.lock().unwrap().watch(x).unwrap();
        let reg = GradientRegistry::with_op_table();
        let mut eager = EagerContext;
        let tapes = [tape.clone()];
        let y = loss(
            &mut TapeContext {
                inner: &mut eager,
                tapes: &tapes,
                registry: &reg,
            },
            x,
        )
        .unwrap();
        let g = compute_gradient(
            &tape,
            &mut EagerContext,
            &[y],
            std::slice::from_ref(x),
            None,
        )
        .unwrap();
        g[0].as_ref().unwrap().to_f64_vec()
    }

    /// Builds @grad(x) = d loss / dx symbolically, with `order` nested tapes (1 or 2: the
    /// second order returns the gradient of sum(first-order gradient)).
    fn symbolic_gradient(order: usize) -> Library {
        let ty = ValueType::tensor(crate::DType::F64, &[3]);
        let (mut builder, params) = FunctionBuilder::new("grad", vec![ty]);
        let reg = GradientRegistry::with_op_table();
        let mut graph = GraphContext::new(&mut builder);
        let x = graph.param(params[0]).unwrap();
        let (outer, inner) = (Tape::new_ref(false), Tape::new_ref(false));
        for t in [&outer, &inner] {
            t.lock().unwrap().watch(&x).unwrap();
        }
        let both = [outer.clone(), inner.clone()];
        let y = loss(
            &mut TapeContext {
                inner: &mut graph,
                tapes: &both,
                registry: &reg,
            },
            &x,
        )
        .unwrap();
        let only_outer = [outer.clone()];
        let mut ctx = TapeContext {
            inner: &mut graph,
            tapes: &only_outer,
            registry: &reg,
        };
        let g = compute_gradient(&inner, &mut ctx, &[y], std::slice::from_ref(&x), None).unwrap();
        let mut result = g[0].clone().unwrap();
        if order == 2 {
            let s = build::sum(&mut ctx, &result, &[0], false).unwrap();
            let gg =
                compute_gradient(&outer, &mut graph, &[s], std::slice::from_ref(&x), None).unwrap();
            result = gg[0].clone().unwrap();
        }
        let function = builder.finish(&[result.port], &[]).unwrap();
        let mut library = Library::default();
        library.add(function).unwrap();
        library
    }

    fn run_grad(library: &Library, x: &Tensor) -> Vec<f64> {
        let out = run(library, "grad", vec![RtValue::Tensor(x.clone())]).unwrap();
        match &out[0] {
            RtValue::Tensor(t) => t.to_f64_vec(),
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    #[test]
    fn the_tape_emits_gradient_nodes_that_match_eager_gradients() {
        let x = f64s(&[0.3, -1.2, 2.5]);
        let library = symbolic_gradient(1);
        crate::graph::verify(&crate::graph::Graph::new(library.clone(), "grad").unwrap()).unwrap();
        let symbolic = run_grad(&library, &x);
        for (s, e) in symbolic.iter().zip(eager_gradient(&x)) {
            assert!((s - e).abs() < 1e-12, "{s} vs {e}");
        }
    }

    #[test]
    fn a_gradient_graph_differentiates_again() {
        // d/dx sum(cos(x) x + sin(x)) = 2 cos(x) - x sin(x)
        let x = f64s(&[0.3, -1.2, 2.5]);
        let got = run_grad(&symbolic_gradient(2), &x);
        for (g, v) in got.iter().zip(x.to_f64_vec()) {
            let want = 2.0 * v.cos() - v * v.sin();
            assert!((g - want).abs() < 1e-12, "{g} vs {want}");
        }
    }
}
