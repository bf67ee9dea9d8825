//! Structural rewrites that build NEW functions from existing ones (nothing is edited in place):
//! inlining a function's nodes into a builder, and re-signing a function with more parameters.

use super::{Function, FunctionBuilder, Node, NodeId, NodeKind, Port, ValueType};
use crate::error::Result;

/// Copies `function`'s nodes into `builder`, its parameters bound to `args`. Returns the ports
/// of its results and the ids of its control outputs in `builder`.
pub fn inline_into(
    builder: &mut FunctionBuilder,
    function: &Function,
    args: &[Port],
) -> Result<(Vec<Port>, Vec<NodeId>)> {
    let mut map: Vec<Option<NodeId>> = vec![None; function.nodes.len()];
    let mut arg_of: Vec<Option<Port>> = vec![None; function.nodes.len()];
    let port = |p: &Port, map: &[Option<NodeId>], arg_of: &[Option<Port>]| -> Port {
        match arg_of[p.node] {
            Some(a) => a,
            None => Port::new(map[p.node].expect("topological order"), p.output),
        }
    };
    for (i, node) in function.nodes.iter().enumerate() {
        if let NodeKind::Arg(index) = node.kind {
            arg_of[i] = Some(*args.get(index).ok_or_else(|| {
                crate::error::Error::invalid(
                    "inline",
                    format!(
                        "@{} takes {} arguments, got {}",
                        function.name,
                        function.params.len(),
                        args.len()
                    ),
                )
            })?);
            continue;
        }
        let inputs: Vec<Port> = node.inputs.iter().map(|p| port(p, &map, &arg_of)).collect();
        let control: Vec<NodeId> = node.control_inputs.iter().filter_map(|&c| map[c]).collect();
        let mut copy = Node::new(node.kind.clone(), inputs, node.outputs.clone());
        copy.location = node.location.clone();
        builder.add_node(copy.kind, &copy.inputs, copy.outputs)?;
        let id = builder.len() - 1;
        if let Some(l) = copy.location {
            builder.set_location(id, l)?;
        }
        if !control.is_empty() {
            builder.add_control_inputs(id, &control)?;
        }
        map[i] = Some(id);
    }
    let results = function
        .results
        .iter()
        .map(|p| port(p, &map, &arg_of))
        .collect();
    let effects = function
        .control_outputs
        .iter()
        .filter_map(|&c| map[c])
        .collect();
    Ok((results, effects))
}

/// A copy of `function` named `name` with parameters `params`: old parameter `i` becomes new
/// parameter `mapping[i]`; the results are the old results followed by the new parameters
/// listed in `passthrough` (loop bodies return their captures unchanged).
pub fn with_params(
    function: &Function,
    name: &str,
    params: Vec<ValueType>,
    mapping: &[usize],
    passthrough: &[usize],
) -> Result<Function> {
    let (mut b, ports) = FunctionBuilder::new(name, params);
    let args: Vec<Port> = mapping.iter().map(|&m| ports[m]).collect();
    let (mut results, effects) = inline_into(&mut b, function, &args)?;
    results.extend(passthrough.iter().map(|&p| ports[p]));
    b.finish(&results, &effects)
}
