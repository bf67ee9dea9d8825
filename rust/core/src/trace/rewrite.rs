//! Structural rewrites that build NEW functions from existing ones (nothing is edited in place):
//! inlining a function's nodes into a builder, and re-signing a function with more parameters.

use crate::error::Result;
use crate::graph::{Function, FunctionBuilder, Node, NodeId, NodeKind, Port, ValueType};

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

/// A copy of `function` in which the resource parameters `params` become tensor parameters
/// of their variables' types, each `ReadVariable` of one of them standing for the parameter
/// itself: a construct that reads Variables without assigning any reads them once, before it
/// runs. `None` when such a parameter has another use (a resource passed on to a node that
/// assigns it) or the function has side effects.
pub fn reads_as_tensors(function: &Function, params: &[usize]) -> Result<Option<Function>> {
    if !function.control_outputs.is_empty() {
        return Ok(None);
    }
    let types: Vec<ValueType> = function
        .params
        .iter()
        .enumerate()
        .map(|(i, ty)| match ty {
            ValueType::Resource(t) if params.contains(&i) => ValueType::Tensor(t.clone()),
            other => other.clone(),
        })
        .collect();
    let (mut b, ports) = FunctionBuilder::new(&function.name, types);
    let converted = |p: Port| params.iter().any(|&i| ports[i] == p);
    let is_converted =
        |node: NodeId| matches!(function.nodes[node].kind, NodeKind::Arg(k) if params.contains(&k));
    // Per old node: the new node it became, or the port it stands for (a parameter, a read).
    let mut new_node: Vec<Option<NodeId>> = vec![None; function.nodes.len()];
    let mut alias: Vec<Option<Port>> = vec![None; function.nodes.len()];
    for (i, node) in function.nodes.iter().enumerate() {
        let inputs: Vec<Port> = node
            .inputs
            .iter()
            .map(|&p| moved(p, &alias, &new_node))
            .collect();
        match node.kind {
            NodeKind::Arg(k) => {
                alias[i] = Some(ports[k]);
                continue;
            }
            NodeKind::ReadVariable if converted(inputs[0]) => {
                alias[i] = Some(inputs[0]);
                continue;
            }
            _ if node.inputs.iter().any(|p| is_converted(p.node)) => return Ok(None),
            _ => {}
        }
        let control: Vec<NodeId> = node
            .control_inputs
            .iter()
            .filter_map(|&c| new_node[c])
            .collect();
        b.add_node(node.kind.clone(), &inputs, node.outputs.clone())?;
        let id = b.len() - 1;
        if let Some(l) = &node.location {
            b.set_location(id, l.clone())?;
        }
        if !control.is_empty() {
            b.add_control_inputs(id, &control)?;
        }
        new_node[i] = Some(id);
    }
    let results: Vec<Port> = function
        .results
        .iter()
        .map(|&p| moved(p, &alias, &new_node))
        .collect();
    Ok(Some(b.finish(&results, &[])?))
}

/// Where old port `p` went: the port its node stands for, or the same output of its copy.
fn moved(p: Port, alias: &[Option<Port>], new_node: &[Option<NodeId>]) -> Port {
    alias[p.node]
        .unwrap_or_else(|| Port::new(new_node[p.node].expect("topological order"), p.output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::parse_function;

    #[test]
    fn reads_of_a_converted_resource_become_the_parameter() {
        let f = parse_function(
            "func @body(%0: f64[2], %1: resource<f64[2]>) -> (f64[2], resource<f64[2]>) {
               %2 = read_variable(%1) : f64[2]
               %3 = mul(%0, %2) : f64[2]
               return %3, %1
             }",
        )
        .unwrap();
        let g = reads_as_tensors(&f, &[1]).unwrap().unwrap();
        assert_eq!(g.params[1], ValueType::tensor(crate::DType::F64, &[2]));
        assert!(g.nodes.iter().all(|n| n.kind != NodeKind::ReadVariable));
        assert_eq!(g.results[1], Port::new(1, 0));
        assert_eq!(g.nodes[g.results[0].node].inputs[1], Port::new(1, 0));
    }

    #[test]
    fn an_assignment_or_another_use_of_the_resource_leaves_it_a_resource() {
        let assigns = parse_function(
            "func @body(%0: f64[2], %1: resource<f64[2]>) -> (f64[2]) {
               %2 = assign_variable(%1, %0) : ()
               return %0 ctrl(%2)
             }",
        )
        .unwrap();
        assert!(reads_as_tensors(&assigns, &[1]).unwrap().is_none());
    }
}
