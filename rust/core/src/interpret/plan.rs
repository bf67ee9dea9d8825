//! The per-function plan: built once per function and shared by every call of it (a loop body
//! runs its plan once per iteration), kept apart from the per-call value table.
//!
//! The plan flattens every node output into one slot of the table, resolves callee names to
//! library positions, and marks the last use of each value. At its last use a value is moved
//! out of the table instead of cloned: that frees tensors as early as possible and, above all,
//! leaves a stack with a single owner, so `StackPush`/`StackPop` mutate it in place.

use smallvec::SmallVec;

use crate::error::{Error, ErrorKind, Result};
use crate::graph::{Function, NodeKind, Port};

/// One read of a value: its slot, and whether no later node or result reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Use {
    pub slot: usize,
    pub last: bool,
}

/// What the interpreter needs about one node beyond the node itself.
#[derive(Clone, Debug)]
pub(crate) struct NodePlan {
    /// Slot of output 0; output `k` is at `first_slot + k`.
    pub first_slot: usize,
    pub inputs: SmallVec<[Use; 4]>,
    /// Per output: whether anything reads it (an unread output is dropped at once).
    pub read: SmallVec<[bool; 2]>,
    /// Library positions of the node's callees, in `NodeKind::callees` order.
    pub callees: SmallVec<[usize; 2]>,
}

/// The plan of one function.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub nodes: Vec<NodePlan>,
    pub results: Vec<Use>,
    /// Number of slots in the value table (outputs of all nodes).
    pub slots: usize,
}

fn graph_error(function: &Function, message: String) -> Error {
    Error::new(
        ErrorKind::Graph,
        "interpret",
        format!("@{}: {message}", function.name),
    )
}

impl Plan {
    /// Plans `function`; `resolve` maps a callee name to its library position. Ports that name
    /// no earlier node's output, `Arg` indices past the parameters and unknown callees are
    /// `Graph` errors (a verified graph has none).
    pub fn build(function: &Function, resolve: impl Fn(&str) -> Result<usize>) -> Result<Plan> {
        let mut first_slots = Vec::with_capacity(function.nodes.len());
        let mut slots = 0usize;
        for node in &function.nodes {
            first_slots.push(slots);
            slots += node.outputs.len();
        }
        let slot_of = |port: Port, before: usize| -> Result<usize> {
            let node = function.nodes.get(port.node).filter(|_| port.node < before);
            match node {
                Some(n) if port.output < n.outputs.len() => {
                    Ok(first_slots[port.node] + port.output)
                }
                _ => Err(graph_error(
                    function,
                    format!(
                        "%{}#{} is not an output of an earlier node",
                        port.node, port.output
                    ),
                )),
            }
        };
        let mut nodes = Vec::with_capacity(function.nodes.len());
        for (id, node) in function.nodes.iter().enumerate() {
            // Nodes run in order, which satisfies control inputs only if they point backwards.
            if let Some(&bad) = node.control_inputs.iter().find(|&&c| c >= id) {
                let msg = format!("%{id} has a control input %{bad} that is not an earlier node");
                return Err(graph_error(function, msg));
            }
            if let NodeKind::Arg(i) = node.kind {
                if i >= function.params.len() {
                    let n = function.params.len();
                    let msg = format!("%{id} = arg {i}, but the function has {n} parameter(s)");
                    return Err(graph_error(function, msg));
                }
            }
            let inputs = node
                .inputs
                .iter()
                .map(|&p| slot_of(p, id).map(|slot| Use { slot, last: false }))
                .collect::<Result<_>>()?;
            let callees = node
                .kind
                .callees()
                .into_iter()
                .map(&resolve)
                .collect::<Result<_>>()?;
            nodes.push(NodePlan {
                first_slot: first_slots[id],
                inputs,
                read: SmallVec::from_elem(false, node.outputs.len()),
                callees,
            });
        }
        let results = function
            .results
            .iter()
            .map(|&p| slot_of(p, function.nodes.len()).map(|slot| Use { slot, last: false }))
            .collect::<Result<Vec<_>>>()?;
        let mut plan = Plan {
            nodes,
            results,
            slots,
        };
        plan.mark_last_uses(&first_slots);
        Ok(plan)
    }

    /// Walks the uses backwards (results, then nodes from last to first, inputs right to left):
    /// the first time a slot is met is its last use in execution order.
    fn mark_last_uses(&mut self, first_slots: &[usize]) {
        let mut seen = vec![false; self.slots];
        let mut visit = |u: &mut Use| {
            u.last = !seen[u.slot];
            seen[u.slot] = true;
        };
        self.results.iter_mut().rev().for_each(&mut visit);
        for np in self.nodes.iter_mut().rev() {
            np.inputs.iter_mut().rev().for_each(&mut visit);
        }
        for (np, &first) in self.nodes.iter_mut().zip(first_slots) {
            for (k, read) in np.read.iter_mut().enumerate() {
                *read = seen[first + k];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::{FunctionBuilder, ValueType};
    use crate::ops::binary;

    #[test]
    fn last_uses_move_and_unread_outputs_are_marked() {
        // f(x, y, z) = (x * x + y, x): mul reads x twice, the results read it last; z is unread.
        let f32s = ValueType::tensor(DType::F32, &[]);
        let (mut b, a) = FunctionBuilder::new("f", vec![f32s.clone(), f32s.clone(), f32s]);
        let sq = b.add_op1(binary::Mul, &[a[0], a[0]], None).unwrap();
        let s = b.add_op1(binary::Add, &[sq, a[1]], None).unwrap();
        let f = b.finish(&[s, a[0]], &[]).unwrap();
        let plan = Plan::build(&f, |_| Ok(0)).unwrap();
        let lasts =
            |n: usize| -> Vec<bool> { plan.nodes[n].inputs.iter().map(|u| u.last).collect() };
        assert_eq!(lasts(3), [false, false]);
        assert_eq!(lasts(4), [true, true]);
        assert_eq!(
            plan.results,
            [
                Use {
                    slot: 4,
                    last: true
                },
                Use {
                    slot: 0,
                    last: true
                }
            ]
        );
        assert_eq!(
            plan.nodes[2].read.as_slice(),
            [false],
            "the third argument is never read"
        );
    }

    #[test]
    fn bad_ports_and_args_are_graph_errors() {
        let f32s = ValueType::tensor(DType::F32, &[]);
        let (b, a) = FunctionBuilder::new("g", vec![f32s]);
        let mut f = b.finish(&a, &[]).unwrap();
        f.results = vec![Port::new(0, 3)];
        let err = Plan::build(&f, |_| Ok(0)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Graph);
        assert!(err.message.contains("@g: %0#3"), "{err}");
        f.results.clear();
        f.nodes[0].kind = NodeKind::Arg(2);
        let err = Plan::build(&f, |_| Ok(0)).unwrap_err();
        assert!(err.message.contains("has 1 parameter(s)"), "{err}");
        f.nodes[0].kind = NodeKind::Arg(0);
        f.nodes[0].control_inputs = vec![0];
        let err = Plan::build(&f, |_| Ok(0)).unwrap_err();
        assert!(
            err.message
                .contains("control input %0 that is not an earlier"),
            "{err}"
        );
    }
}
