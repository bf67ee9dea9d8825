//! The loop lowered to the dataflow primitives (`Enter`, `Merge`, `Switch`, `NextIteration`,
//! `Exit`) of one frame per loop instance.

use crate::dataflow::{DfKind, FunctionLowered, Lower, LowerNode, Lowered, Scope};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Node;
use crate::graph::{Constant, Function, NodeId, NodeKind, Port};
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
        let stateful = self.state(library)?.0;
        let frame = cx.b.new_frame(cx.scope.frame, self, stateful);
        let outer = cx.scope.clone();
        let inner = Scope {
            frame,
            gate: None,
            origin: outer.origin.clone(),
        };
        let entered = self.enter(cx, &outer, &inner, invariants(body))?;
        let cond_scope = Scope {
            gate: entered.merges.first().map(|&(_, m)| m),
            ..inner.clone()
        };
        let go = self.lower_condition(cx, &cond_scope, &entered.current, n)?;
        let exits = self.lower_trips(cx, &inner, &entered, go, n)?;
        let mut outputs = cx.inputs.clone();
        for (&(k, _), &exit) in entered.merges.iter().zip(&exits) {
            if k < n {
                outputs[k] = exit;
            }
        }
        let done = cx
            .needs_done
            .then(|| cx.b.add(&outer, DfKind::NoOp, exits, Vec::new()));
        Ok(Lowered { outputs, done })
    }
}

/// A loop's frame entered: per entry (each loop variable, then the trip counter), its port
/// outside, type and whether it is an invariant (a constant `enter`); its value in the frame
/// (the merge's, or the constant enter's); and the merges, by entry.
struct Entered {
    entries: Vec<(Port, ValueType, bool)>,
    current: Vec<Port>,
    merges: Vec<(usize, NodeId)>,
}

/// Per loop variable of `body`, whether it is an invariant: one the body returns unchanged
/// (not all of them: a loop changes something).
fn invariants(body: &Function) -> Vec<bool> {
    let returned_unchanged = |k: usize| {
        let r = body.results[k];
        r.output == 0
            && matches!(body.nodes.get(r.node), Some(Node { kind: NodeKind::Arg(a), .. }) if *a == k)
    };
    let mut invariant: Vec<bool> = (0..body.results.len()).map(returned_unchanged).collect();
    if invariant.iter().all(|&i| i) {
        invariant[0] = false;
    }
    invariant
}

fn counter_ty() -> ValueType {
    ValueType::Tensor(TensorType::scalar(DType::I64))
}

impl While {
    /// The enters (ordered after the node's control inputs), then merges for the variables
    /// that change; each merge's second input is patched to its `next_iteration` later.
    fn enter(
        &self,
        cx: &mut LowerNode<'_, '_>,
        outer: &Scope,
        inner: &Scope,
        invariant: Vec<bool>,
    ) -> Result<Entered> {
        let types: Vec<ValueType> = (cx.inputs.iter())
            .map(|&p| cx.b.port_type(p))
            .collect::<Result<_>>()?;
        let mut entries: Vec<(Port, ValueType, bool)> = (cx.inputs.iter().zip(types))
            .zip(invariant)
            .map(|((&x, ty), inv)| (x, ty, inv))
            .collect();
        if self.maximum_iterations.is_some() {
            let zero = DfKind::Const(Constant(Tensor::scalar(0i64)));
            let zero = cx.b.add1(outer, zero, Vec::new(), counter_ty());
            entries.push((zero, counter_ty(), false));
        }
        let mut current = Vec::with_capacity(entries.len());
        let mut merges = Vec::new();
        for (x, ty, constant) in &entries {
            let enter = DfKind::Enter {
                frame: inner.frame,
                constant: *constant,
            };
            let control = cx.control.clone();
            let e =
                cx.b.add_ordered(outer, enter, vec![*x], control, vec![ty.clone()]);
            if *constant {
                current.push(Port::new(e, 0));
                continue;
            }
            let merge = DfKind::Merge { loop_merge: true };
            let ins = vec![Port::new(e, 0), Port::new(e, 0)];
            let m = cx.b.add(inner, merge, ins, vec![ty.clone()]);
            merges.push((current.len(), m));
            current.push(Port::new(m, 0));
        }
        Ok(Entered {
            entries,
            current,
            merges,
        })
    }

    /// Whether the loop goes on: `cond` of the first `n` values of `current`; with
    /// `maximum_iterations`, `count < maximum and cond(vars)`, `cond` running only while the
    /// count (the value after them) is below.
    fn lower_condition(
        &self,
        cx: &mut LowerNode<'_, '_>,
        scope: &Scope,
        current: &[Port],
        n: usize,
    ) -> Result<Port> {
        let vars = &current[..n];
        let Some(m) = self.maximum_iterations else {
            return single_result(cx.b.lower_function(&self.cond, vars, scope)?);
        };
        let bound = DfKind::Const(Constant(Tensor::scalar(m)));
        let bound = cx.b.add1(scope, bound, Vec::new(), counter_ty());
        let less = DfKind::Op(binary::Less.into());
        let below = cx.b.add1(scope, less, vec![current[n], bound], bool_ty());
        let cond = &self.cond;
        let lowered = cx.b.branches(
            scope,
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
        })
    }

    /// The trips: each value switched on `go`, the body (and the counter's increment) on the
    /// true side feeding `next_iteration` into its merge, `exit` on the false side. Returns
    /// the exits, by merge.
    fn lower_trips(
        &self,
        cx: &mut LowerNode<'_, '_>,
        inner: &Scope,
        entered: &Entered,
        go: Port,
        n: usize,
    ) -> Result<Vec<Port>> {
        let Entered {
            entries,
            current,
            merges,
        } = entered;
        let switch = DfKind::Switch { outputs: 2 };
        let switched: Vec<NodeId> = (current.iter().zip(entries))
            .map(|(&v, (_, ty, _))| {
                cx.b.add(inner, switch.clone(), vec![v, go], vec![ty.clone(); 2])
            })
            .collect();
        let pivot_ty = entries[0].1.clone();
        let pivot = cx.b.add1(
            inner,
            DfKind::Identity,
            vec![Port::new(switched[0], 1)],
            pivot_ty,
        );
        let body_scope = inner.gated(pivot.node);
        let body_args: Vec<Port> = switched.iter().map(|&s| Port::new(s, 1)).collect();
        let lowered =
            cx.b.lower_function(&self.body, &body_args[..n], &body_scope)?;
        let mut next = lowered.results;
        if self.maximum_iterations.is_some() {
            let one = DfKind::Const(Constant(Tensor::scalar(1i64)));
            let one = cx.b.add1(&body_scope, one, Vec::new(), counter_ty());
            let add = DfKind::Op(binary::Add.into());
            let count =
                cx.b.add1(&body_scope, add, vec![body_args[n], one], counter_ty());
            next.push(count);
        }
        let mut exits = Vec::new();
        for &(k, m) in merges {
            let ty = entries[k].1.clone();
            let ni =
                cx.b.add1(inner, DfKind::NextIteration, vec![next[k]], ty.clone());
            cx.b.set_input(m, 1, ni)?;
            let exit = DfKind::Exit;
            exits.push(cx.b.add1(inner, exit, vec![Port::new(switched[k], 0)], ty));
        }
        Ok(exits)
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
