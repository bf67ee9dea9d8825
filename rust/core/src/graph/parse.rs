//! Parsing graph text (the syntax is described in `text.rs`). Errors are `Graph` errors naming
//! the line and column, what was expected, and quoting the line.
//!
//! Values may have any `%name` in hand-written text; nodes are numbered in order of
//! definition, so printed text (`%0`, `%1`, ...) parses back to the same node ids. References
//! to later nodes parse (the verifier rejects them), so malformed graphs can be written down.

use std::collections::HashMap;

use super::cursor::Parser;
use super::ir::{Function, Location, Node, NodeKind, Port, ValueType};
use super::lexer::{Pos, Tok};
use super::library::{Graph, Library};
use super::parse_attrs::{build_kind, RawAttrs};
use crate::error::Result;

/// Parses a whole graph: `graph @entry` followed by its functions.
pub fn parse_graph(src: &str) -> Result<Graph> {
    let mut p = Parser::new(src)?;
    let start = p.pos();
    p.keyword("graph")?;
    let entry = p.func_name()?;
    let mut library = Library::new();
    while p.peek() != &Tok::Eof {
        let at = p.pos();
        let f = p.function()?;
        library.add(f).map_err(|e| p.error(at, e.message))?;
    }
    Graph::new(library, entry).map_err(|e| p.error(start, e.message))
}

/// Parses one function.
pub fn parse_function(src: &str) -> Result<Function> {
    let mut p = Parser::new(src)?;
    let f = p.function()?;
    p.expect(&Tok::Eof, "end of input")?;
    Ok(f)
}

/// `%name` or `%name#k` before names are resolved to nodes.
struct RawRef {
    name: String,
    output: usize,
    pos: Pos,
}

/// What a function body refers to by name, resolved once every node is known.
#[derive(Default)]
struct Pending {
    names: HashMap<String, usize>,
    inputs: Vec<Vec<RawRef>>,
    ctrl: Vec<Vec<RawRef>>,
}

impl Parser<'_> {
    fn value_ref(&mut self) -> Result<RawRef> {
        let pos = self.pos();
        let Tok::Value(name) = self.peek().clone() else {
            return Err(self.expected("a value `%name`"));
        };
        self.next();
        let output = if self.eat("#") {
            self.number("an output index")?
        } else {
            0
        };
        Ok(RawRef { name, output, pos })
    }

    /// `%a, %b#1, ...` up to (not including) `close`.
    fn refs_until(&mut self, close: &'static str) -> Result<Vec<RawRef>> {
        let mut out = Vec::new();
        while !self.eat(close) {
            if !out.is_empty() {
                self.punct(",")?;
            }
            out.push(self.value_ref()?);
        }
        Ok(out)
    }

    /// ` ctrl(%a, %b)` if present.
    fn ctrl(&mut self) -> Result<Vec<RawRef>> {
        if self.peek() != &Tok::Ident("ctrl".into()) {
            return Ok(Vec::new());
        }
        self.next();
        self.punct("(")?;
        self.refs_until(")")
    }

    fn function(&mut self) -> Result<Function> {
        self.keyword("func")?;
        let name = self.func_name()?;
        let mut pending = Pending::default();
        let mut nodes = Vec::new();
        let params = self.params(&mut pending, &mut nodes)?;
        self.punct("->")?;
        self.punct("(")?;
        let declared = if self.eat(")") {
            Vec::new()
        } else {
            self.types_until_close()?
        };
        self.punct("{")?;
        while self.peek() != &Tok::Ident("return".into()) {
            self.node(&mut pending, &mut nodes)?;
        }
        self.next();
        let results = if matches!(self.peek(), Tok::Value(_)) {
            self.result_refs()?
        } else {
            vec![]
        };
        let control = self.ctrl()?;
        self.punct("}")?;
        let mut f = Function {
            name,
            params,
            nodes,
            results: Vec::new(),
            control_outputs: Vec::new(),
        };
        self.resolve(&mut f, pending, results, control)?;
        self.check_declared(&f, &declared)?;
        Ok(f)
    }

    fn types_until_close(&mut self) -> Result<Vec<(ValueType, Pos)>> {
        let mut out = Vec::new();
        loop {
            let pos = self.pos();
            out.push((self.value_type()?, pos));
            if self.eat(")") {
                return Ok(out);
            }
            self.punct(",")?;
        }
    }

    fn result_refs(&mut self) -> Result<Vec<RawRef>> {
        let mut out = vec![self.value_ref()?];
        while self.eat(",") {
            out.push(self.value_ref()?);
        }
        Ok(out)
    }

    /// `(%a: T, U, ...)`: a named parameter also defines its `Arg` node.
    fn params(&mut self, pending: &mut Pending, nodes: &mut Vec<Node>) -> Result<Vec<ValueType>> {
        self.punct("(")?;
        let mut params = Vec::new();
        while !self.eat(")") {
            if !params.is_empty() {
                self.punct(",")?;
            }
            if matches!(self.peek(), Tok::Value(_)) {
                let r = self.value_ref()?;
                self.punct(":")?;
                let ty = self.value_type()?;
                self.define(pending, nodes.len(), &r)?;
                nodes.push(Node::new(
                    NodeKind::Arg(params.len()),
                    vec![],
                    vec![ty.clone()],
                ));
                params.push(ty);
            } else {
                params.push(self.value_type()?);
            }
        }
        Ok(params)
    }

    fn define(&self, pending: &mut Pending, id: usize, r: &RawRef) -> Result<()> {
        if pending.names.insert(r.name.clone(), id).is_some() {
            return Err(self.error(r.pos, format!("value %{} is defined twice", r.name)));
        }
        pending.inputs.resize_with(id + 1, Vec::new);
        pending.ctrl.resize_with(id + 1, Vec::new);
        Ok(())
    }

    /// `%name = head(inputs) {attrs} ctrl(...) : types loc("file":line)`.
    fn node(&mut self, pending: &mut Pending, nodes: &mut Vec<Node>) -> Result<()> {
        let def = self.value_ref()?;
        self.punct("=")?;
        let head_pos = self.pos();
        let Tok::Ident(head) = self.next() else {
            return Err(self.error(head_pos, "expected an op or node kind"));
        };
        self.punct("(")?;
        let inputs = self.refs_until(")")?;
        let attrs = if self.peek() == &Tok::Punct("{") {
            RawAttrs::parse(self)?
        } else {
            RawAttrs::default()
        };
        let ctrl = self.ctrl()?;
        self.punct(":")?;
        let outputs: Vec<ValueType> = self.types()?.into_iter().map(|(t, _)| t).collect();
        let location = self.location()?;
        let kind = build_kind(self, &head, head_pos, attrs, &outputs)?;
        let id = nodes.len();
        self.define(pending, id, &def)?;
        pending.inputs[id] = inputs;
        pending.ctrl[id] = ctrl;
        let mut node = Node::new(kind, vec![], outputs);
        node.location = location;
        nodes.push(node);
        Ok(())
    }

    fn location(&mut self) -> Result<Option<Location>> {
        if self.peek() != &Tok::Ident("loc".into()) {
            return Ok(None);
        }
        self.next();
        self.punct("(")?;
        let Tok::Str(file) = self.peek().clone() else {
            return Err(self.expected("a file name string"));
        };
        self.next();
        self.punct(":")?;
        let line = self.number("a line number")?;
        self.punct(")")?;
        Ok(Some(Location { file, line }))
    }

    fn lookup(&self, pending: &Pending, r: &RawRef) -> Result<usize> {
        pending
            .names
            .get(&r.name)
            .copied()
            .ok_or_else(|| self.error(r.pos, format!("undefined value %{}", r.name)))
    }

    fn resolve(
        &self,
        f: &mut Function,
        pending: Pending,
        results: Vec<RawRef>,
        ctrl: Vec<RawRef>,
    ) -> Result<()> {
        let port = |r: &RawRef| self.lookup(&pending, r).map(|n| Port::new(n, r.output));
        for (id, node) in f.nodes.iter_mut().enumerate() {
            let inputs = pending.inputs.get(id).map_or(&[][..], |v| v.as_slice());
            node.inputs = inputs.iter().map(port).collect::<Result<_>>()?;
            let ctrl = pending.ctrl.get(id).map_or(&[][..], |v| v.as_slice());
            node.control_inputs = ctrl
                .iter()
                .map(|r| self.lookup(&pending, r))
                .collect::<Result<_>>()?;
        }
        f.results = results.iter().map(port).collect::<Result<_>>()?;
        f.control_outputs = ctrl
            .iter()
            .map(|r| self.lookup(&pending, r))
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// The header's `-> (types)` must agree with what `return` names.
    fn check_declared(&self, f: &Function, declared: &[(ValueType, Pos)]) -> Result<()> {
        let end = declared.last().map_or(self.pos(), |(_, p)| *p);
        if declared.len() != f.results.len() {
            let (d, r) = (declared.len(), f.results.len());
            return Err(self.error(
                end,
                format!("@{} declares {d} results but returns {r}", f.name),
            ));
        }
        for ((ty, pos), &port) in declared.iter().zip(&f.results) {
            if let Ok(actual) = f.port_type(port) {
                if actual != ty {
                    let msg = format!(
                        "declared result type {ty}, but %{}#{} is {actual}",
                        port.node, port.output
                    );
                    return Err(self.error(*pos, msg));
                }
            }
        }
        Ok(())
    }
}
