//! Local simplifications, Grappler's cheapest: `fold_constants` (an op whose inputs are all
//! constants becomes the constant it computes), `eliminate_common_subexpressions` (a pure node
//! equal to an earlier one, same kind and inputs, is replaced by it) and
//! `eliminate_dead_branches` (an `If`/`Case` on a constant becomes a `Call` of the branch it
//! takes, which `inline_calls` can then inline).
//!
//! Each keeps the program's semantics, lazy ones included: an op that fails on its constant
//! inputs is left in place to fail when (and only if) it runs, and nothing that touches state
//! or calls a function is merged.

use std::collections::HashMap;

use crate::error::Result;
use crate::graph::{Call, Function, FunctionBuilder, Graph, Library, Node, NodeKind, Port};
use crate::ops::execute;
use crate::tensor::Tensor;

/// A folded constant larger than this many elements stays an op: the graph would carry it.
const FOLD_AT_MOST: usize = 4096;

/// Every op whose inputs are all constants, evaluated into constants.
pub fn fold_constants(graph: &Graph) -> Result<Graph> {
    rewrite(graph, &mut |b, node, inputs, consts| {
        let NodeKind::Op(op) = &node.kind else {
            return Ok(None);
        };
        let values: Option<Vec<Tensor>> = inputs.iter().map(|p| consts.get(p).cloned()).collect();
        let Some(values) = values.filter(|_| node.control_inputs.is_empty()) else {
            return Ok(None);
        };
        // An op that fails stays, to fail only if it runs (it may sit in an untaken branch).
        let Ok(outs) = execute(op, &values) else {
            return Ok(None);
        };
        if outs.iter().any(|t| t.numel() > FOLD_AT_MOST) {
            return Ok(None);
        }
        Ok(Some(outs.into_iter().map(|t| b.add_const(t)).collect()))
    })
}

/// Pure nodes (ops and constants) equal to an earlier node of the same function, with the same
/// inputs, replaced by that node's outputs.
pub fn eliminate_common_subexpressions(graph: &Graph) -> Result<Graph> {
    let mut library = Library::new();
    for f in graph.library.iter() {
        let mut seen = Seen::new();
        library.add(rewrite_function(f, &mut |b, node, inputs, _| {
            let pure = matches!(node.kind, NodeKind::Op(_) | NodeKind::Const(_));
            if !pure || !node.control_inputs.is_empty() {
                return Ok(None);
            }
            let key = (node.kind.name(), inputs.to_vec());
            let earlier = seen.entry(key).or_default();
            if let Some((_, ports)) = earlier.iter().find(|(k, _)| *k == node.kind) {
                return Ok(Some(ports.clone()));
            }
            let ports = b.add_node(node.kind.clone(), inputs, node.outputs.clone())?;
            earlier.push((node.kind.clone(), ports.clone()));
            Ok(Some(ports))
        })?)?;
    }
    Graph::new(library, graph.entry.clone())
}

/// Per function: (name, inputs) -> the earlier pure nodes of that name over those inputs, each
/// with its outputs in the new function.
type Seen = HashMap<(&'static str, Vec<Port>), Vec<(NodeKind, Vec<Port>)>>;

/// Every node that runs one of its callees by a constant selector (an `If` on a constant
/// predicate, a `Case` on a constant index: `PassRules::constant_choice`), replaced by a
/// `Call` of the callee it runs.
pub fn eliminate_dead_branches(graph: &Graph) -> Result<Graph> {
    rewrite(graph, &mut |b, node, inputs, consts| {
        let Some(rules) = super::construct_rules(&node.kind) else {
            return Ok(None);
        };
        let Some(selector) = inputs.first().and_then(|p| consts.get(p)) else {
            return Ok(None);
        };
        let Some(chosen) = rules.constant_choice(selector)? else {
            return Ok(None);
        };
        let callees = node.kind.callees();
        let Some(function) = callees.get(chosen) else {
            return Ok(None);
        };
        let call = NodeKind::Call(Call {
            function: function.to_string(),
            ..Default::default()
        });
        Ok(Some(b.add_node(
            call,
            &inputs[1..],
            node.outputs.clone(),
        )?))
    })
}

/// The values of the constants a rewritten function holds so far, by port.
type Constants = HashMap<Port, Tensor>;

/// What a rewrite makes of one node (its inputs already mapped into the new function): its
/// new outputs, or `None` to copy it unchanged.
type NodeRewrite<'a> =
    dyn FnMut(&mut FunctionBuilder, &Node, &[Port], &Constants) -> Result<Option<Vec<Port>>> + 'a;

/// `graph` with every function rebuilt through `each`.
fn rewrite(graph: &Graph, each: &mut NodeRewrite<'_>) -> Result<Graph> {
    let mut library = Library::new();
    for f in graph.library.iter() {
        library.add(rewrite_function(f, each)?)?;
    }
    Graph::new(library, graph.entry.clone())
}

/// `f` rebuilt node by node: `each` decides a node's new outputs, control inputs and source
/// locations carry over, and a replaced node's side effects cannot be lost (only pure nodes
/// and branch nodes are replaced, the latter by a call that keeps their callees' effects).
fn rewrite_function(f: &Function, each: &mut NodeRewrite<'_>) -> Result<Function> {
    let (mut b, params) = FunctionBuilder::new(&f.name, f.params.clone());
    let mut ports: Vec<Vec<Port>> = Vec::with_capacity(f.nodes.len());
    let mut ids: Vec<Option<usize>> = Vec::with_capacity(f.nodes.len());
    let mut consts = Constants::new();
    for node in &f.nodes {
        if let NodeKind::Arg(k) = node.kind {
            ports.push(vec![params[k]]);
            ids.push(Some(k));
            continue;
        }
        let inputs: Vec<Port> = node
            .inputs
            .iter()
            .map(|p| ports[p.node][p.output])
            .collect();
        let before = b.len();
        let out = match each(&mut b, node, &inputs, &consts)? {
            Some(out) => out,
            None => b.add_node(node.kind.clone(), &inputs, node.outputs.clone())?,
        };
        for id in before..b.len() {
            if let Some(l) = &node.location {
                b.set_location(id, l.clone())?;
            }
            let control: Vec<usize> = node.control_inputs.iter().filter_map(|&c| ids[c]).collect();
            if !control.is_empty() {
                b.add_control_inputs(id, &control)?;
            }
            if let NodeKind::Const(c) = &b.node(id)?.kind {
                consts.insert(Port::new(id, 0), c.0.clone());
            }
        }
        // What later control inputs on this node now wait for: the node its outputs come from.
        ids.push(
            out.first()
                .map(|p| p.node)
                .or_else(|| b.len().checked_sub(1)),
        );
        ports.push(out);
    }
    let results: Vec<Port> = f.results.iter().map(|p| ports[p.node][p.output]).collect();
    let effects: Vec<usize> = f.control_outputs.iter().filter_map(|&c| ids[c]).collect();
    b.finish(&results, &effects)
}
