//! `bind_params`: parameters of the entry replaced by constants (a traced function's captured
//! tensors become part of a self-contained program, e.g. an exported module).

use crate::error::{Error, ErrorKind, Result};
use crate::graph::inline_into;
use crate::graph::{Function, FunctionBuilder, Graph, Library, Port, ValueType};
use crate::tensor::Tensor;

/// The graph whose entry takes only the parameters with `None` in `values` (in order); each
/// `Some(tensor)` becomes a constant node.
pub fn bind_params(graph: &Graph, values: &[Option<Tensor>]) -> Result<Graph> {
    let entry = graph.entry_function()?;
    if values.len() != entry.params.len() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "bind_params",
            format!(
                "@{} has {} parameters, got {} values",
                entry.name,
                entry.params.len(),
                values.len()
            ),
        ));
    }
    let kept: Vec<ValueType> = entry
        .params
        .iter()
        .zip(values)
        .filter(|(_, v)| v.is_none())
        .map(|(p, _)| p.clone())
        .collect();
    let (mut b, ports) = FunctionBuilder::new(&entry.name, kept);
    let mut next = ports.into_iter();
    let mut args: Vec<Port> = Vec::with_capacity(values.len());
    for (param, value) in entry.params.iter().zip(values) {
        match value {
            None => args.push(next.next().expect("one kept port per None")),
            Some(t) => {
                if ValueType::Tensor(t.ty().clone()) != *param {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        "bind_params",
                        format!("a {} cannot stand for parameter of type {param}", t.ty()),
                    ));
                }
                args.push(b.add_const(t.clone()));
            }
        }
    }
    let (results, effects) = inline_into(&mut b, entry, &args)?;
    let function: Function = b.finish(&results, &effects)?;
    let mut library = Library::new();
    library.add(function)?;
    for f in graph.library.iter().filter(|f| f.name != entry.name) {
        library.add(f.clone())?;
    }
    Graph::new(library, graph.entry.clone())
}
