//! Building a lowered graph: the `Builder`, the `Lower` trait each construct implements, and
//! the lowering of one function's nodes into the flat graph (calls recurse into it).

use std::collections::HashSet;
use std::sync::Arc;

use super::{DataflowGraph, DfKind, DfNode, FrameId, FrameInfo, Origin};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::node_site;
use crate::graph::{Library, Node, NodeId, NodeKind, Port, ValueType, While};

/// How deep calls, branches and loops may nest while inlining: far beyond real programs, low
/// enough that a recursive graph is an error rather than a stack overflow.
const MAX_NESTING: usize = 200;

/// Where nodes being added go: their frame, the gate that input-less nodes wait for (a branch
/// pivot; none at the top of a frame that needs none), and the site errors name.
#[derive(Clone, Debug)]
pub struct Scope {
    pub frame: FrameId,
    pub gate: Option<NodeId>,
    pub origin: Option<Arc<Origin>>,
}

impl Scope {
    /// The same place with another gate.
    pub fn gated(&self, gate: NodeId) -> Scope {
        Scope {
            gate: Some(gate),
            ..self.clone()
        }
    }
}

/// What lowering a function produced: its results, and the nodes standing for its control
/// outputs (side effects that later nodes may be ordered after).
#[derive(Clone, Debug, Default)]
pub struct FunctionLowered {
    pub results: Vec<Port>,
    pub effects: Vec<NodeId>,
}

/// What lowering one node produced: a port per output, and the node that completes after it
/// (its side effects included), for nodes with a control input on it.
#[derive(Clone, Debug, Default)]
pub struct Lowered {
    pub outputs: Vec<Port>,
    pub done: Option<NodeId>,
}

/// One node being lowered.
pub struct LowerNode<'a, 'l> {
    pub b: &'a mut Builder<'l>,
    /// The node's frame and gate; its origin is the node's own site.
    pub scope: &'a Scope,
    pub node: &'a Node,
    /// Its data inputs, lowered.
    pub inputs: Vec<Port>,
    /// The lowered nodes it must run after.
    pub control: Vec<NodeId>,
    /// Whether a later node has a control input on it (then `Lowered::done` is wanted).
    pub needs_done: bool,
}

/// How a construct becomes dataflow: implemented by each construct in `crate::control`.
pub trait Lower {
    fn lower(&self, cx: &mut LowerNode<'_, '_>) -> Result<Lowered>;
    /// Whether its node repeats (an error inside it names the iteration).
    fn is_loop(&self) -> bool;
}

/// Lowers branch `k` on its arguments behind the branch's gate (see `Builder::branches`).
pub type BranchLowering<'a, 'l> =
    dyn FnMut(&mut Builder<'l>, &Scope, usize, &[Port]) -> Result<FunctionLowered> + 'a;

/// The graph under construction.
pub struct Builder<'l> {
    library: &'l Library,
    nodes: Vec<DfNode>,
    frames: Vec<FrameInfo>,
    targets: Vec<NodeId>,
    /// Functions being inlined, outermost first (recursion is an error).
    stack: Vec<String>,
}

impl<'l> Builder<'l> {
    pub fn new(library: &'l Library) -> Self {
        let root = FrameInfo {
            parent: 0,
            parallel_iterations: 1,
            stateful: false,
        };
        Builder {
            library,
            nodes: Vec::new(),
            frames: vec![root],
            targets: Vec::new(),
            stack: Vec::new(),
        }
    }

    pub fn library(&self) -> &'l Library {
        self.library
    }

    /// Adds a node; one without inputs or control inputs waits for the scope's gate.
    pub fn add(
        &mut self,
        scope: &Scope,
        kind: DfKind,
        inputs: Vec<Port>,
        outputs: Vec<ValueType>,
    ) -> NodeId {
        self.add_ordered(scope, kind, inputs, Vec::new(), outputs)
    }

    /// `add` with control inputs.
    pub fn add_ordered(
        &mut self,
        scope: &Scope,
        kind: DfKind,
        inputs: Vec<Port>,
        mut control_inputs: Vec<NodeId>,
        outputs: Vec<ValueType>,
    ) -> NodeId {
        if inputs.is_empty() && control_inputs.is_empty() {
            control_inputs.extend(scope.gate);
        }
        let id = self.nodes.len();
        if kind.has_side_effect() {
            self.targets.push(id);
        }
        self.nodes.push(DfNode {
            kind,
            inputs,
            control_inputs,
            outputs,
            frame: scope.frame,
            origin: scope.origin.clone(),
        });
        id
    }

    /// `add` for a node with one output; returns that output.
    pub fn add1(&mut self, scope: &Scope, kind: DfKind, inputs: Vec<Port>, ty: ValueType) -> Port {
        Port::new(self.add(scope, kind, inputs, vec![ty]), 0)
    }

    /// Replaces input `k` of `node` (a loop merge learns its `next_iteration` last).
    pub fn set_input(&mut self, node: NodeId, k: usize, port: Port) -> Result<()> {
        let slot = self
            .nodes
            .get_mut(node)
            .and_then(|n| n.inputs.get_mut(k))
            .ok_or_else(|| Error::internal("lower", format!("no input {k} of node {node}")))?;
        *slot = port;
        Ok(())
    }

    /// The type of `port`.
    pub fn port_type(&self, port: Port) -> Result<ValueType> {
        self.nodes
            .get(port.node)
            .and_then(|n| n.outputs.get(port.output))
            .cloned()
            .ok_or_else(|| {
                Error::internal("lower", format!("no port %{}#{}", port.node, port.output))
            })
    }

    /// A new loop frame inside `parent`.
    pub fn new_frame(&mut self, parent: FrameId, w: &While, stateful: bool) -> FrameId {
        self.frames.push(FrameInfo {
            parent,
            parallel_iterations: w.parallel_iterations.max(1),
            stateful,
        });
        self.frames.len() - 1
    }

    /// `identity(port)` ordered after `control` (the port itself when there is none).
    pub fn ordered(&mut self, scope: &Scope, port: Port, control: &[NodeId]) -> Result<Port> {
        if control.is_empty() {
            return Ok(port);
        }
        let ty = self.port_type(port)?;
        let id = self.add_ordered(
            scope,
            DfKind::Identity,
            vec![port],
            control.to_vec(),
            vec![ty],
        );
        Ok(Port::new(id, 0))
    }

    /// Lowers function `name` of the library on `args` in `scope`, inlining its nodes.
    pub fn lower_function(
        &mut self,
        name: &str,
        args: &[Port],
        scope: &Scope,
    ) -> Result<FunctionLowered> {
        let library = self.library;
        let f = library.get(name)?;
        if self.stack.len() >= MAX_NESTING || self.stack.iter().any(|s| s == name) {
            let msg = format!(
                "@{name} is reached again through {} (a recursive graph?)",
                self.stack.join(" -> ")
            );
            return Err(Error::new(ErrorKind::Graph, "lower", msg));
        }
        if args.len() != f.params.len() {
            let msg = format!(
                "@{name} takes {} argument(s), got {}",
                f.params.len(),
                args.len()
            );
            return Err(Error::new(ErrorKind::Graph, "lower", msg));
        }
        self.stack.push(name.to_string());
        let controlled: HashSet<NodeId> = f
            .nodes
            .iter()
            .flat_map(|n| n.control_inputs.iter().copied())
            .chain(f.control_outputs.iter().copied())
            .collect();
        let mut ports: Vec<Vec<Port>> = Vec::with_capacity(f.nodes.len());
        let mut done: Vec<Option<NodeId>> = Vec::with_capacity(f.nodes.len());
        for (id, node) in f.nodes.iter().enumerate() {
            let port = |p: &Port| {
                ports
                    .get(p.node)
                    .and_then(|outs| outs.get(p.output))
                    .copied()
                    .ok_or_else(|| {
                        let msg =
                            format!("@{name}: %{}#{} is not an earlier output", p.node, p.output);
                        Error::new(ErrorKind::Graph, "lower", msg)
                    })
            };
            let inputs = node.inputs.iter().map(port).collect::<Result<Vec<_>>>()?;
            let control: Vec<NodeId> = node
                .control_inputs
                .iter()
                .filter_map(|&c| done.get(c).copied().flatten())
                .collect();
            let site = Scope {
                origin: Some(Arc::new(Origin {
                    site: node_site(f, id),
                    is_loop: construct_lowering(&node.kind).is_some_and(|c| c.is_loop()),
                    parent: scope.origin.clone(),
                })),
                ..scope.clone()
            };
            let lowered = match &node.kind {
                NodeKind::Arg(k) => {
                    let arg = args.get(*k).copied().ok_or_else(|| {
                        let msg = format!("@{name}: %{id} = arg {k} is past the parameters");
                        Error::new(ErrorKind::Graph, "lower", msg)
                    })?;
                    Lowered {
                        outputs: vec![arg],
                        done: None,
                    }
                }
                NodeKind::Const(c) => {
                    self.plain(&site, DfKind::Const(c.clone()), inputs, control, node)
                }
                NodeKind::Op(op) => {
                    self.plain(&site, DfKind::Op(op.clone()), inputs, control, node)
                }
                kind => {
                    let mut cx = LowerNode {
                        b: self,
                        scope: &site,
                        node,
                        inputs,
                        control,
                        needs_done: controlled.contains(&id),
                    };
                    lower_construct(kind, &mut cx)?
                }
            };
            ports.push(lowered.outputs);
            done.push(lowered.done);
        }
        let results = f
            .results
            .iter()
            .map(|p| {
                ports
                    .get(p.node)
                    .and_then(|o| o.get(p.output))
                    .copied()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Graph,
                            "lower",
                            format!("@{name}: a result names no value"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let effects = f
            .control_outputs
            .iter()
            .filter_map(|&c| done.get(c).copied().flatten())
            .collect();
        self.stack.pop();
        Ok(FunctionLowered { results, effects })
    }

    fn plain(
        &mut self,
        scope: &Scope,
        kind: DfKind,
        inputs: Vec<Port>,
        control: Vec<NodeId>,
        node: &Node,
    ) -> Lowered {
        let id = self.add_ordered(scope, kind, inputs, control, node.outputs.clone());
        Lowered {
            outputs: (0..node.outputs.len()).map(|k| Port::new(id, k)).collect(),
            done: Some(id),
        }
    }

    /// Branches on `selector` (a bool: else = 0, then = 1; or an i32 index over `n`): each
    /// operand is switched, branch `k` is lowered by `branch` on the operands' `k`-th side
    /// behind its pivot, and each result is the merge of the branches' results.
    #[allow(clippy::too_many_arguments)]
    pub fn branches(
        &mut self,
        scope: &Scope,
        selector: Port,
        n: usize,
        operands: &[Port],
        result_types: &[ValueType],
        needs_done: bool,
        branch: &mut BranchLowering<'_, 'l>,
    ) -> Result<Lowered> {
        let switch = DfKind::Switch { outputs: n };
        let sel_ty = self.port_type(selector)?;
        let pivots_switch = self.add(
            scope,
            switch.clone(),
            vec![selector, selector],
            vec![sel_ty.clone(); n],
        );
        let mut switched = Vec::with_capacity(operands.len());
        for &x in operands {
            let ty = self.port_type(x)?;
            switched.push(self.add(scope, switch.clone(), vec![x, selector], vec![ty; n]));
        }
        let mut lowered = Vec::with_capacity(n);
        let mut collectors = Vec::new();
        for k in 0..n {
            let pivot = self.add1(
                scope,
                DfKind::Identity,
                vec![Port::new(pivots_switch, k)],
                sel_ty.clone(),
            );
            let inner = scope.gated(pivot.node);
            let args: Vec<Port> = switched.iter().map(|&s| Port::new(s, k)).collect();
            let out = branch(self, &inner, k, &args)?;
            if out.results.len() != result_types.len() {
                let msg = format!(
                    "branch {k} returns {} value(s); the node has {} output(s)",
                    out.results.len(),
                    result_types.len()
                );
                return Err(Error::new(ErrorKind::ControlFlow, "lower", msg));
            }
            if needs_done {
                let c = self.add_ordered(
                    &inner,
                    DfKind::Identity,
                    vec![pivot],
                    out.effects.clone(),
                    vec![sel_ty.clone()],
                );
                collectors.push(Port::new(c, 0));
            }
            lowered.push(out);
        }
        let merge = DfKind::Merge { loop_merge: false };
        let outputs = result_types
            .iter()
            .enumerate()
            .map(|(i, ty)| {
                let ins = lowered.iter().map(|l| l.results[i]).collect();
                Port::new(self.add(scope, merge.clone(), ins, vec![ty.clone()]), 0)
            })
            .collect();
        let done =
            needs_done.then(|| self.add(scope, merge.clone(), collectors, vec![sel_ty.clone()]));
        Ok(Lowered { outputs, done })
    }

    /// The finished graph (`name`, `params` and `results` of the entry).
    pub fn finish(self, name: &str, params: Vec<ValueType>, results: Vec<Port>) -> DataflowGraph {
        DataflowGraph {
            name: name.to_string(),
            params,
            nodes: self.nodes,
            frames: self.frames,
            results,
            targets: self.targets,
        }
    }
}

/// A construct's `Lower` implementation (`None` for arguments, constants and ops).
fn construct_lowering(kind: &NodeKind) -> Option<&dyn Lower> {
    crate::graph::construct_as!(kind, Lower)
}

fn lower_construct(kind: &NodeKind, cx: &mut LowerNode<'_, '_>) -> Result<Lowered> {
    construct_lowering(kind)
        .ok_or_else(|| Error::internal("lower", "not a construct"))?
        .lower(cx)
}

impl Builder<'_> {
    /// Function `name` inlined on `inputs`, its nodes ordered after `control` (through a
    /// `no_op` gate and gated inputs); `done` waits for its results and side effects.
    pub fn inline_call(
        &mut self,
        scope: &Scope,
        name: &str,
        inputs: &[Port],
        control: &[NodeId],
        needs_done: bool,
    ) -> Result<Lowered> {
        let (inner, args) = if control.is_empty() {
            (scope.clone(), inputs.to_vec())
        } else {
            let gate = self.add_ordered(
                scope,
                DfKind::NoOp,
                Vec::new(),
                control.to_vec(),
                Vec::new(),
            );
            let args = inputs
                .iter()
                .map(|&x| self.ordered(scope, x, &[gate]))
                .collect::<Result<Vec<_>>>()?;
            (scope.gated(gate), args)
        };
        let out = self.lower_function(name, &args, &inner)?;
        let done = needs_done.then(|| {
            self.add_ordered(
                &inner,
                DfKind::NoOp,
                out.results.clone(),
                out.effects.clone(),
                Vec::new(),
            )
        });
        Ok(Lowered {
            outputs: out.results,
            done,
        })
    }

    /// A node that is not control flow (a variable or stack op): one lowered node.
    pub fn single(
        &mut self,
        cx_scope: &Scope,
        kind: DfKind,
        node: &Node,
        inputs: Vec<Port>,
        control: Vec<NodeId>,
    ) -> Lowered {
        self.plain(cx_scope, kind, inputs, control, node)
    }
}
