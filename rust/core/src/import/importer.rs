//! The walk: each MLIR op of a function is converted (through the mapping in `table`) into
//! gradloop ops applied to a `TraceContext`, so importing is tracing. Values live in lexical
//! scopes (a region sees the values around it); a value of an enclosing frame used in a region
//! is captured by the tracer, exactly as a Python closure is in a traced `cond` branch, and
//! constants are made again in the frame that uses them, so they stay constants there.

use std::collections::HashMap;
use std::fmt::Write;

use super::syntax::{Block, Loc, Operation, ValueRef};
use super::table;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{tensor_types_compatible, Constant, Location, NodeKind, ValueType};
use crate::ops::Context;
use crate::shape::TensorType;
use crate::tensor::{Tensor, TensorId};
use crate::trace::{lock, Branch, FrameId, TraceContext, TracerRef, Val};
use crate::value::Value;

/// Converts the ops of one module's functions into the trace of `tracer`.
pub(crate) struct Importer<'m> {
    functions: HashMap<&'m str, &'m Operation>,
    ctx: TraceContext,
    tracer: TracerRef,
    /// Innermost last; a function body starts a fresh stack (it sees no caller values).
    scopes: Vec<HashMap<ValueRef, Val>>,
    /// Values known to be constants (by identity), with their value.
    constants: HashMap<TensorId, Tensor>,
    /// Constants made again in another frame: (frame, original id) -> the copy.
    copies: HashMap<(FrameId, TensorId), Val>,
    /// Functions being inlined (a call back into one of them is recursion).
    calls: Vec<String>,
    /// Shown instead of `-` (the name MLIR gives text parsed from memory) in locations.
    source: &'m str,
    /// What every imported loop's gradient keeps (`While::checkpoints`).
    pub checkpoints: Option<u32>,
}

/// An error from an import problem (unsupported op, attribute or type): a `Compile` error.
pub(crate) fn import_error(op: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Compile, op.to_string(), message)
}

impl<'m> Importer<'m> {
    pub fn new(module: &'m Operation, tracer: TracerRef, source: &'m str) -> Self {
        let functions = module
            .regions
            .iter()
            .flat_map(|r| &r.blocks)
            .flat_map(|b| &b.ops)
            .filter(|op| op.name == "func.func")
            .filter_map(|op| Some((symbol_name(op)?, op)))
            .collect();
        Importer {
            functions,
            ctx: TraceContext::new(Some(tracer.clone())),
            tracer,
            scopes: vec![HashMap::new()],
            constants: HashMap::new(),
            copies: HashMap::new(),
            calls: Vec::new(),
            source,
            checkpoints: None,
        }
    }

    /// The context ops are applied through.
    pub fn ctx(&mut self) -> &mut dyn Context<Val> {
        &mut self.ctx
    }

    /// The `func.func` called `name`.
    pub fn function(&self, name: &str) -> Option<&'m Operation> {
        self.functions.get(name).copied()
    }

    /// `loc` as `file:line:col`, with the source name for text parsed from memory.
    pub fn place(&self, loc: &Loc) -> String {
        match &loc.file_line_col {
            Some((file, line, col)) if file == "-" => format!("{}:{line}:{col}", self.source),
            _ => loc.to_string(),
        }
    }

    /// A constant node holding `t` in the current frame, remembered as a constant.
    pub fn constant(&mut self, t: Tensor) -> Result<Val> {
        let v = self
            .ctx
            .apply_node(&NodeKind::Const(Constant(t.clone())), &[])?
            .remove(0);
        self.constants.insert(v.id(), t);
        Ok(v)
    }

    /// The value of `v` if it is a constant.
    pub fn known_constant(&self, v: &Val) -> Option<&Tensor> {
        self.constants.get(&v.id())
    }

    /// The value `r` names, seen from the current frame.
    pub fn value(&mut self, r: &ValueRef) -> Result<Val> {
        let v = self
            .scopes
            .iter()
            .rev()
            .find_map(|s| s.get(r))
            .cloned()
            .ok_or_else(|| import_error("mlir import", format!("{r} is not defined")))?;
        let Some(t) = self.constants.get(&v.id()).cloned() else {
            return Ok(v);
        };
        let top = lock(&self.tracer).top_frame();
        match &v {
            Val::Symbol(s) if s.frame != top => {
                if let Some(copy) = self.copies.get(&(top, v.id())) {
                    return Ok(copy.clone());
                }
                let copy = self.constant(t)?;
                self.copies.insert((top, v.id()), copy.clone());
                Ok(copy)
            }
            _ => Ok(v),
        }
    }

    pub fn bind(&mut self, r: ValueRef, v: Val) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(r, v);
        }
    }

    /// Runs `block` on `args` in a new scope; returns its terminator's operands (nothing for a
    /// block without a terminator).
    pub fn block(&mut self, block: &'m Block, args: &[Val]) -> Result<Vec<Val>> {
        if block.args.len() != args.len() {
            return Err(import_error(
                "mlir import",
                format!(
                    "a block takes {} arguments, got {}",
                    block.args.len(),
                    args.len()
                ),
            ));
        }
        self.scopes.push(HashMap::new());
        let result = (|| {
            for ((name, ty), v) in block.args.iter().zip(args) {
                check_type(
                    ty.tensor_type(),
                    v,
                    &format!("block argument {name}"),
                    &ty.0,
                )?;
                self.bind(
                    ValueRef {
                        name: name.clone(),
                        index: 0,
                    },
                    v.clone(),
                );
            }
            let (body, terminator) = match block.ops.split_last() {
                Some((last, rest)) if table::is_terminator(&last.name) => (rest, Some(last)),
                _ => (block.ops.as_slice(), None),
            };
            for op in body {
                self.op(op)?;
            }
            let values = match terminator {
                Some(t) => t
                    .operands
                    .iter()
                    .map(|r| self.value(r))
                    .collect::<Result<_>>()?,
                None => Vec::new(),
            };
            Ok(values)
        })();
        self.scopes.pop();
        result
    }

    /// Traces a new function of the library: `body` gets its parameters (of `params` types)
    /// and returns its results. Values of enclosing frames it uses become captures.
    pub fn function_of(
        &mut self,
        hint: &str,
        params: Vec<ValueType>,
        body: impl FnOnce(&mut Self, &[Val]) -> Result<Vec<Val>>,
    ) -> Result<Branch> {
        let args = lock(&self.tracer).push_function(hint, params);
        let results = body(self, &args)?;
        let popped = lock(&self.tracer).pop_function(&results)?;
        Ok(Branch::from(popped))
    }

    /// Inlines `func.func @callee` on `args` (its body sees none of the caller's values).
    pub fn call(&mut self, callee: &str, args: &[Val]) -> Result<Vec<Val>> {
        let f = self.function(callee).ok_or_else(|| {
            import_error("func.call", format!("no function @{callee} in the module"))
        })?;
        if self.calls.iter().any(|c| c == callee) {
            return Err(import_error(
                "func.call",
                format!("@{callee} calls itself (recursion is not supported)"),
            ));
        }
        let block = entry_block(f, &format!("@{callee}"))?;
        self.calls.push(callee.to_string());
        let outer = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        let result = self.block(block, args);
        self.scopes = outer;
        self.calls.pop();
        result
    }

    /// Converts one op and binds its results; errors say which op and where.
    fn op(&mut self, op: &'m Operation) -> Result<()> {
        if let Some((file, line, _)) = &op.loc.file_line_col {
            let file = if file == "-" { self.source } else { file };
            lock(&self.tracer).location = Some(Location::new(file, *line));
        }
        let Some(convert) = table::lookup(&op.name) else {
            return Err(import_error(
                &op.name,
                format!(
                    "`{}` at {} is not supported by the gradloop importer",
                    op.name,
                    self.place(&op.loc)
                ),
            ));
        };
        let converted = (|| {
            let inputs = op
                .operands
                .iter()
                .map(|r| self.value(r))
                .collect::<Result<Vec<_>>>()?;
            let outputs = convert(self, op, &inputs)?;
            let refs = op.result_refs();
            if outputs.len() != refs.len() || refs.len() != op.result_types.len() {
                return Err(Error::internal(
                    "mlir import",
                    format!(
                        "{} gave {} values for {} results",
                        op.name,
                        outputs.len(),
                        refs.len()
                    ),
                ));
            }
            for ((r, v), ty) in refs.into_iter().zip(outputs).zip(&op.result_types) {
                check_type(ty.tensor_type(), &v, &format!("result {r}"), &ty.0)?;
                self.bind(r, v);
            }
            Ok(())
        })();
        converted.map_err(|e| self.at(e, op))
    }

    /// Adds `at <op> (<place>)` to an error leaving `op`.
    fn at(&self, mut e: Error, op: &Operation) -> Error {
        let _ = write!(e.message, "\n  at {} ({})", op.name, self.place(&op.loc));
        e
    }
}

/// The `sym_name` of a function op.
pub(crate) fn symbol_name(op: &Operation) -> Option<&str> {
    match op.attr("sym_name") {
        Some(super::attr::Attribute::Str(s)) => Some(s),
        _ => None,
    }
}

/// The single block of a function or structured-control-flow region.
pub(crate) fn entry_block<'a>(op: &'a Operation, what: &str) -> Result<&'a Block> {
    match op.regions.first().map(|r| r.blocks.as_slice()) {
        Some([block]) => Ok(block),
        Some([]) | None => Err(import_error(
            &op.name,
            format!("{what} has no body (declarations cannot be imported)"),
        )),
        Some(_) => Err(import_error(
            &op.name,
            format!("{what} has several blocks (unstructured control flow is not supported)"),
        )),
    }
}

/// A value must have the type MLIR declares (gradloop must support that type first).
fn check_type(declared: Option<TensorType>, v: &Val, what: &str, text: &str) -> Result<()> {
    let Some(declared) = declared else {
        return Err(import_error(
            "mlir import",
            format!("{what} has type {text}, which gradloop does not support (tensors of f32, f64, i32, i64 or i1)"),
        ));
    };
    if !tensor_types_compatible(&declared, v.ty()) {
        return Err(Error::internal(
            "mlir import",
            format!("{what} is declared {text} but was imported as {}", v.ty()),
        ));
    }
    Ok(())
}
