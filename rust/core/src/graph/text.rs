//! Printing graphs as text (parsed back by `parse`). The syntax, MLIR-like:
//!
//! ```text
//! graph @main
//!
//! func @main(%0: bool[], %1: f32[3], %2: resource<f32[]>) -> (f32[3], f32[]) {
//!   %3 = sin(%1) : f32[3] loc("model.py":12)
//!   %4 = sum(%3) {axes=[0], keepdims=false} : f32[]
//!   %5 = if(%0, %3, %4) {then=@t, else=@e} : (f32[3], f32[])
//!   %6 = assign_variable(%2, %5#1) ctrl(%5) : ()
//!   %7 = const() {value=[1.5, -0.0, NaN]} : f32[3]
//!   return %5#0, %4 ctrl(%6)
//! }
//! ```
//!
//! - Values are `%<node>`; output `k` of a node with other than one output is `%<node>#k`.
//! - A node is `%id = name(inputs) {attrs} ctrl(nodes) : types loc("file":line)`; the attrs,
//!   ctrl and loc parts are left out when empty. `types` is one type, or `(t, ...)` otherwise.
//! - Types: `f32[2, ?]` (`?` unknown), `f32[]` scalar, `resource<T>`, `stack<T>`.
//! - Built-in nodes and their attributes: `arg {index}`, `const {value}` (elements row-major,
//!   floats in shortest round-trip form), `if {then, else}`, `case {branches=[@a, ...]}`,
//!   `while {cond, body, maximum_iterations (when set), parallel_iterations}`,
//!   `call {function}`, `stack_new {element=T}`, `read_variable`, `assign_variable`,
//!   `assign_add_variable`, `stack_push`, `stack_pop`.
//! - Parameters are written `%i: T` in the header when nodes `0..n` are exactly the plain
//!   `Arg` nodes; otherwise (a malformed or located `Arg`) as bare types with explicit `arg`
//!   lines, so every function prints and parses back unchanged.
//! - Function names are `@name`, or `@"quoted"` when they hold other characters.

use std::fmt::{self, Write};

use super::ir::{Constant, Function, Node, NodeId, NodeKind, Port, ValueType};
use super::library::{Graph, Library};
use crate::dtype::Elements;
use crate::ops::attrs::{dtype_short_name, write_list, write_size};
use crate::shape::TensorType;

/// A tensor type in graph text: `f32[2, ?]`.
pub struct TypeText<'a>(pub &'a TensorType);

impl fmt::Display for TypeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(dtype_short_name(self.0.dtype))?;
        write_list(f, &self.0.shape, |f, d| write_size(f, *d))
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Tensor(t) => write!(f, "{}", TypeText(t)),
            ValueType::Resource(t) => write!(f, "resource<{}>", TypeText(t)),
            ValueType::Stack(t) => write!(f, "stack<{}>", TypeText(t)),
        }
    }
}

/// `@name`, quoted when the name is not a bare identifier.
pub struct FuncName<'a>(pub &'a str);

pub(crate) fn is_bare_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$'))
}

impl fmt::Display for FuncName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_bare_name(self.0) {
            write!(f, "@{}", self.0)
        } else {
            write!(f, "@{}", Quoted(self.0))
        }
    }
}

/// A string literal: `"..."` with `\\`, `\"`, `\n`, `\t`, `\r` and `\u{..}` escapes.
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\t' => f.write_str("\\t")?,
                '\r' => f.write_str("\\r")?,
                c if c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// A function as lines of text, with the line of each node and of `return` (for errors that
/// show the code around a node).
pub(crate) struct Listing {
    pub lines: Vec<String>,
    pub node_lines: Vec<Option<usize>>,
    pub return_line: usize,
}

/// Whether the params print in the header as `%i: T` (their `Arg` nodes then print nowhere).
fn header_args(f: &Function) -> bool {
    f.params.iter().enumerate().all(|(i, ty)| {
        f.nodes.get(i).is_some_and(|n| {
            n.kind == NodeKind::Arg(i)
                && n.inputs.is_empty()
                && n.control_inputs.is_empty()
                && n.location.is_none()
                && n.outputs.len() == 1
                && n.outputs[0] == *ty
        })
    })
}

pub(crate) fn listing(f: &Function) -> Listing {
    let folded = if header_args(f) { f.params.len() } else { 0 };
    let mut lines = vec![header(f, folded)];
    let mut node_lines = vec![None; f.nodes.len()];
    for (id, node) in f.nodes.iter().enumerate().skip(folded) {
        node_lines[id] = Some(lines.len());
        lines.push(format!("  {}", NodeText { f, id, node }));
    }
    let mut ret = String::from("  return");
    for (i, &p) in f.results.iter().enumerate() {
        let sep = if i == 0 { " " } else { ", " };
        let _ = write!(ret, "{sep}{}", PortText(f, p));
    }
    ret.push_str(&ctrl_text(&f.control_outputs));
    let return_line = lines.len();
    lines.push(ret);
    lines.push("}".to_string());
    Listing {
        lines,
        node_lines,
        return_line,
    }
}

fn header(f: &Function, folded: usize) -> String {
    let params: Vec<String> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            if i < folded {
                format!("%{i}: {ty}")
            } else {
                ty.to_string()
            }
        })
        .collect();
    let results: Vec<String> = f
        .results
        .iter()
        .map(|&p| {
            f.port_type(p)
                .map_or("<invalid>".to_string(), |t| t.to_string())
        })
        .collect();
    format!(
        "func {}({}) -> ({}) {{",
        FuncName(&f.name),
        params.join(", "),
        results.join(", ")
    )
}

fn ctrl_text(nodes: &[NodeId]) -> String {
    if nodes.is_empty() {
        return String::new();
    }
    let ids: Vec<String> = nodes.iter().map(|n| format!("%{n}")).collect();
    format!(" ctrl({})", ids.join(", "))
}

/// `%n`, or `%n#k` unless the node has exactly one output and `k` is 0.
struct PortText<'a>(&'a Function, Port);

impl fmt::Display for PortText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Port { node, output } = self.1;
        let single = self.0.nodes.get(node).is_some_and(|n| n.outputs.len() == 1);
        if output == 0 && single {
            write!(f, "%{node}")
        } else {
            write!(f, "%{node}#{output}")
        }
    }
}

struct NodeText<'a> {
    f: &'a Function,
    id: NodeId,
    node: &'a Node,
}

impl fmt::Display for NodeText<'_> {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self.node;
        write!(out, "%{} = {}(", self.id, node.kind.name())?;
        for (i, &p) in node.inputs.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(out, "{sep}{}", PortText(self.f, p))?;
        }
        out.write_str(")")?;
        write_attrs(out, &node.kind)?;
        out.write_str(&ctrl_text(&node.control_inputs))?;
        out.write_str(" : ")?;
        match node.outputs.as_slice() {
            [one] => write!(out, "{one}")?,
            many => {
                let types: Vec<String> = many.iter().map(ToString::to_string).collect();
                write!(out, "({})", types.join(", "))?;
            }
        }
        if let Some(loc) = &node.location {
            write!(out, " loc({}:{})", Quoted(&loc.file), loc.line)?;
        }
        Ok(())
    }
}

/// The attributes of a node kind as (name, text) pairs, in their fixed order.
fn kind_attrs(kind: &NodeKind) -> Vec<(&'static str, String)> {
    match kind {
        NodeKind::Arg(i) => vec![("index", i.to_string())],
        NodeKind::Const(c) => vec![("value", const_text(c))],
        NodeKind::Op(op) => op
            .attrs()
            .into_iter()
            .map(|(n, a)| (n, a.to_string()))
            .collect(),
        NodeKind::If(_)
        | NodeKind::Case(_)
        | NodeKind::While(_)
        | NodeKind::Call(_)
        | NodeKind::Variable(_)
        | NodeKind::Stack(_) => kind.construct().map_or_else(Vec::new, |c| c.attrs()),
    }
}

fn write_attrs(out: &mut fmt::Formatter<'_>, kind: &NodeKind) -> fmt::Result {
    let attrs = kind_attrs(kind);
    if attrs.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = attrs.iter().map(|(n, v)| format!("{n}={v}")).collect();
    write!(out, " {{{}}}", parts.join(", "))
}

/// The elements of a constant, row-major, each in its shortest exact form.
pub(crate) fn const_text(c: &Constant) -> String {
    fn list<T>(v: &[T], item: impl Fn(&T) -> String) -> String {
        let items: Vec<String> = v.iter().map(item).collect();
        format!("[{}]", items.join(", "))
    }
    match c.0.elements() {
        // `{:?}` of an f32 is the shortest text that reads back as the same f32.
        Elements::F32(v) => list(v, |x| format!("{x:?}")),
        Elements::F64(v) => list(v, |x| format!("{x:?}")),
        Elements::I32(v) => list(v, ToString::to_string),
        Elements::I64(v) => list(v, ToString::to_string),
        Elements::Bool(v) => list(v, ToString::to_string),
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in listing(self).lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, func) in self.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{func}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {}", FuncName(&self.entry))?;
        for func in self.library.iter() {
            writeln!(f)?;
            write!(f, "{func}")?;
        }
        Ok(())
    }
}

/// `at %7 = mul(%3, %5) in @f (model.py:12)`: where node `id` of `function` sits, as error
/// messages name it (the interpreter's and the executor's alike).
pub fn node_site(function: &Function, id: NodeId) -> String {
    let header = NodeHeader { function, id };
    let mut site = format!("at {header} in @{}", function.name);
    if let Some(loc) = function.nodes.get(id).and_then(|n| n.location.as_ref()) {
        let _ = write!(site, " ({}:{})", loc.file, loc.line);
    }
    site
}

/// `%7 = mul(%3, %5#1)`: a node as graph text writes it, without attributes or types.
struct NodeHeader<'a> {
    function: &'a Function,
    id: NodeId,
}

impl fmt::Display for NodeHeader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(node) = self.function.nodes.get(self.id) else {
            return write!(f, "%{}", self.id);
        };
        write!(f, "%{} = {}(", self.id, node.kind.name())?;
        for (i, &port) in node.inputs.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{}", PortText(self.function, port))?;
        }
        f.write_str(")")
    }
}
