//! The loop lowered to the dataflow primitives (`Enter`, `Merge`, `Switch`, `NextIteration`,
//! `Exit`) of one frame per loop instance.

use crate::dataflow::{DfKind, FunctionLowered, Lower, LowerNode, Lowered, Scope};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Node;
use crate::graph::{Constant, NodeId, NodeKind, Port};
use crate::graph::{NodeRule, ValueType, While};
use crate::ops::binary;
use crate::shape::TensorType;
use crate::tensor::Tensor;

impl Lower for While {
    fn is_loop(&self) -> bool {
        true
    }

    /// A frame: per loop variable `enter -> merge(enter, next_iteration) -> switch(merge,
    /// cond)`, the body on the switches' true side feeding `next_iteration`, `exit` on the
    /// false side. A variable the body returns unchanged is an invariant: a constant `enter`,
    /// switched into the body, and the node's output is the input itself. With
    /// `maximum_iterations` a trip counter is one more variable and the condition becomes
    /// `count < maximum and cond(vars)`, `cond` running only while the count is below.
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
        let library = cx.b.library();
        let body = library.get(&self.body)?;
        let n = cx.inputs.len();
        if n == 0 || body.results.len() != n {
            let msg = format!(
                "a loop needs variables, and @{} must return each",
                self.body
            );
            return Err(Error::new(ErrorKind::Graph, "while", msg));
        }
        let returned_unchanged = |k: usize| {
            let r = body.results[k];
            r.output == 0
                && matches!(body.nodes.get(r.node), Some(Node { kind: NodeKind::Arg(a), .. }) if *a == k)
        };
        let mut invariant: Vec<bool> = (0..n).map(returned_unchanged).collect();
        if invariant.iter().all(|&i| i) {
            invariant[0] = false;
        }
        let stateful = self.state(library)?.0;
        let frame = cx.b.new_frame(cx.scope.frame, self, stateful);
        let outer = cx.scope.clone();
        let inner = Scope {
            frame,
            gate: None,
            origin: outer.origin.clone(),
        };
        let types: Vec<ValueType> = cx
            .inputs
            .iter()
            .map(|&p| cx.b.port_type(p))
            .collect::<Result<_>>()?;
        let counter_ty = ValueType::Tensor(TensorType::scalar(DType::I64));
        let counter = self.maximum_iterations.map(|m| {
            let zero = cx.b.add1(
                &outer,
                DfKind::Const(Constant(Tensor::scalar(0i64))),
                Vec::new(),
                counter_ty.clone(),
            );
            (m, zero)
        });
        // Enters (ordered after the node's control inputs), then merges for the variables
        // that change; the merges' second input is patched to the next_iteration below.
        let mut entries: Vec<(Port, ValueType, bool)> = cx
            .inputs
            .iter()
            .zip(&types)
            .zip(&invariant)
            .map(|((&x, ty), &inv)| (x, ty.clone(), inv))
            .collect();
        if let Some((_, zero)) = counter {
            entries.push((zero, counter_ty.clone(), false));
        }
        let mut current = Vec::with_capacity(entries.len());
        let mut merges = Vec::new();
        for (x, ty, constant) in &entries {
            let enter = DfKind::Enter {
                frame,
                constant: *constant,
            };
            let e = cx.b.add_ordered(
                &outer,
                enter,
                vec![*x],
                cx.control.clone(),
                vec![ty.clone()],
            );
            if *constant {
                current.push(Port::new(e, 0));
                continue;
            }
            let merge = DfKind::Merge { loop_merge: true };
            let m = cx.b.add(
                &inner,
                merge,
                vec![Port::new(e, 0), Port::new(e, 0)],
                vec![ty.clone()],
            );
            merges.push((current.len(), m));
            current.push(Port::new(m, 0));
        }
        let first_merge = merges.first().map(|&(_, m)| m);
        let cond_scope = Scope {
            gate: first_merge,
            ..inner.clone()
        };
        let vars = &current[..n];
        let go = match counter {
            None => single_result(cx.b.lower_function(&self.cond, vars, &cond_scope)?)?,
            Some((m, _)) => {
                let bound = Constant(Tensor::scalar(m));
                let bound = cx.b.add1(
                    &cond_scope,
                    DfKind::Const(bound),
                    Vec::new(),
                    counter_ty.clone(),
                );
                let below = cx.b.add1(
                    &cond_scope,
                    DfKind::Op(binary::Less.into()),
                    vec![current[n], bound],
                    bool_ty(),
                );
                let cond = &self.cond;
                let lowered = cx.b.branches(
                    &cond_scope,
                    below,
                    2,
                    vars,
                    &[bool_ty()],
                    false,
                    &mut |b, scope, k, args| {
                        if k == 1 {
                            return b.lower_function(cond, args, scope);
                        }
                        let no = DfKind::Const(Constant(Tensor::scalar(false)));
                        let no = b.add1(scope, no, Vec::new(), bool_ty());
                        Ok(FunctionLowered {
                            results: vec![no],
                            effects: Vec::new(),
                        })
                    },
                )?;
                single_result(FunctionLowered {
                    results: lowered.outputs,
                    effects: Vec::new(),
                })?
            }
        };
        let switch = DfKind::Switch { outputs: 2 };
        let switched: Vec<NodeId> = current
            .iter()
            .zip(&entries)
            .map(|(&v, (_, ty, _))| {
                cx.b.add(&inner, switch.clone(), vec![v, go], vec![ty.clone(); 2])
            })
            .collect();
        let pivot = cx.b.add1(
            &inner,
            DfKind::Identity,
            vec![Port::new(switched[0], 1)],
            types[0].clone(),
        );
        let body_scope = inner.gated(pivot.node);
        let body_args: Vec<Port> = switched.iter().map(|&s| Port::new(s, 1)).collect();
        let mut next =
            cx.b.lower_function(&self.body, &body_args[..n], &body_scope)?
                .results;
        if counter.is_some() {
            let one = DfKind::Const(Constant(Tensor::scalar(1i64)));
            let one = cx.b.add1(&body_scope, one, Vec::new(), counter_ty.clone());
            let add = DfKind::Op(binary::Add.into());
            next.push(cx.b.add1(
                &body_scope,
                add,
                vec![body_args[n], one],
                counter_ty.clone(),
            ));
        }
        let mut outputs = cx.inputs.clone();
        let mut exits = Vec::new();
        for &(k, m) in &merges {
            let ty = entries[k].1.clone();
            let ni =
                cx.b.add1(&inner, DfKind::NextIteration, vec![next[k]], ty.clone());
            cx.b.set_input(m, 1, ni)?;
            let exit =
                cx.b.add1(&inner, DfKind::Exit, vec![Port::new(switched[k], 0)], ty);
            if k < n {
                outputs[k] = exit;
            }
            exits.push(exit);
        }
        let done = cx
            .needs_done
            .then(|| cx.b.add(&outer, DfKind::NoOp, exits, Vec::new()));
        Ok(Lowered { outputs, done })
    }
}

fn bool_ty() -> ValueType {
    ValueType::Tensor(TensorType::scalar(DType::Bool))
}

/// The one result of a lowered condition.
fn single_result(lowered: FunctionLowered) -> Result<Port> {
    match lowered.results.as_slice() {
        [one] => Ok(*one),
        many => {
            let msg = format!(
                "the condition returned {} values; it must return one",
                many.len()
            );
            Err(Error::new(ErrorKind::ControlFlow, "while", msg))
        }
    }
}
