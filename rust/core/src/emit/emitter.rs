//! `Emitter`: the text buffer every op writes its StableHLO into, with SSA naming, indentation,
//! the current node's `loc(...)`, constants, and the typed Compile errors of the emitter.
//!
//! Ops see only this API (`OpDef::emit`): they get their operands as `MlirValue`s (an SSA name
//! and its tensor type) and return the values they produced. Shape helpers shared by many ops
//! (explicit broadcasting, reshapes, dynamic dimensions) live in `shapes.rs` on the same type.

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::dtype::{DType, Elements};
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;

/// An SSA value of tensor type: what ops consume and produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlirValue {
    /// `%12`, `%7#1` or `%arg0`.
    pub name: String,
    pub ty: TensorType,
}

impl fmt::Display for MlirValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The MLIR element type of a dtype (`bool` is `i1`; integers are signless).
pub fn element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "i1",
    }
}

/// A tensor type in MLIR syntax: `tensor<2x?xf32>`, `tensor<i1>`.
pub struct TypeText<'a>(pub &'a TensorType);

impl fmt::Display for TypeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for &d in &self.0.shape {
            if d == DYN {
                f.write_str("?x")?;
            } else {
                write!(f, "{d}x")?;
            }
        }
        write!(f, "{}>", element_type(self.0.dtype))
    }
}

/// `tensor<..>` of `ty`, as a `String`.
pub fn type_text(ty: &TensorType) -> String {
    TypeText(ty).to_string()
}

/// Types joined by ", ".
pub fn types_text<'a>(types: impl IntoIterator<Item = &'a TensorType>) -> String {
    let texts: Vec<String> = types.into_iter().map(type_text).collect();
    texts.join(", ")
}

/// Names joined by ", ".
pub fn names_text<'a>(values: impl IntoIterator<Item = &'a MlirValue>) -> String {
    let names: Vec<&str> = values.into_iter().map(|v| v.name.as_str()).collect();
    names.join(", ")
}

/// An MLIR string literal (`"..."` with `\"`, `\\` and non-printable bytes escaped as `\XX`).
pub fn string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:02X}");
            }
        }
    }
    out.push('"');
    out
}

/// A float literal MLIR reads back exactly: the shortest round-trip decimal with a `.` before
/// any exponent (`1.0e-7`), or the bit pattern for NaN and infinities (`0x7FC00000`).
pub fn float_literal(v: f64, dtype: DType) -> String {
    let single = dtype == DType::F32;
    if !v.is_finite() {
        return if single {
            format!("0x{:08X}", (v as f32).to_bits())
        } else {
            format!("0x{:016X}", v.to_bits())
        };
    }
    let s = if single {
        format!("{:?}", v as f32)
    } else {
        format!("{v:?}")
    };
    match (s.contains('.'), s.find('e')) {
        (true, _) => s,
        (false, Some(i)) => format!("{}.0{}", &s[..i], &s[i..]),
        (false, None) => format!("{s}.0"),
    }
}

/// One element of `dtype` with value `v` (converted as the interpreter converts fills).
pub fn scalar_literal(v: f64, dtype: DType) -> String {
    match dtype {
        DType::F32 | DType::F64 => float_literal(v, dtype),
        DType::I32 => (v as i32).to_string(),
        DType::I64 => (v as i64).to_string(),
        DType::Bool => (v != 0.0).to_string(),
    }
}

/// The elements of a constant as literals, row-major.
fn element_literals(t: &Tensor) -> Vec<String> {
    match t.elements() {
        Elements::F32(v) => v
            .iter()
            .map(|&x| float_literal(f64::from(x), DType::F32))
            .collect(),
        Elements::F64(v) => v.iter().map(|&x| float_literal(x, DType::F64)).collect(),
        Elements::I32(v) => v.iter().map(i32::to_string).collect(),
        Elements::I64(v) => v.iter().map(i64::to_string).collect(),
        Elements::Bool(v) => v.iter().map(bool::to_string).collect(),
    }
}

/// The body of a `dense<...>` attribute: a splat when every element is the same, else nested
/// lists following `shape`.
fn dense_body(shape: &[usize], elements: &[String]) -> String {
    if elements.is_empty() {
        return String::new();
    }
    if elements.iter().all(|e| *e == elements[0]) {
        return elements[0].clone();
    }
    fn nest(shape: &[usize], elements: &[String], out: &mut String) {
        let Some((&n, rest)) = shape.split_first() else {
            out.push_str(&elements[0]);
            return;
        };
        let inner: usize = rest.iter().product();
        out.push('[');
        for i in 0..n {
            if i > 0 {
                out.push_str(", ");
            }
            nest(rest, &elements[i * inner..(i + 1) * inner], out);
        }
        out.push(']');
    }
    let mut out = String::new();
    nest(shape, elements, &mut out);
    out
}

/// What is being emitted: shown in `loc(...)` and in error messages.
#[derive(Clone, Debug, Default)]
pub(crate) struct Site {
    pub op: &'static str,
    pub location: Option<Location>,
}

/// The text buffer of one module: ops append lines to the current block.
#[derive(Debug, Default)]
pub struct Emitter {
    out: String,
    indent: usize,
    next: usize,
    site: Site,
    /// How the module is written (`EmitOptions`).
    pub(crate) options: super::EmitOptions,
    /// Values IREE folds to constants (constants, and ops of constants only), each with a key
    /// equal for equal values: the index in `constant_keys` of the op's text over its
    /// operands' keys. Interned, so that a key stays one op long: nested keys written out grow
    /// with the depth of the expression, and doubled at each step of a predicated loop's
    /// selects (an unrolled trip of 32 iterations: keys of 2^32 characters).
    constants: HashMap<String, usize>,
    constant_keys: HashMap<String, usize>,
    /// The barriers put on branch results (`EmitOptions::yield_barriers`).
    pub(crate) yield_barriers: super::YieldBarriers,
    /// Bytes of text written, in every buffer: past `MAX_MODULE_BYTES` nothing more is written
    /// and the module is refused (`over_budget`).
    written: usize,
    /// Nodes that unrolled loop trips have added to the module so far (each iteration of a
    /// trip after its first): `control::while_loop::trips` stops unrolling at its module budget.
    pub(crate) unrolled_nodes: usize,
}

/// The most MLIR text one module may hold. An emission that could grow without bound (an
/// unrolled loop, say) stops here with a `Compile` error instead of taking the machine's
/// memory; the caller can try a smaller form.
pub const MAX_MODULE_BYTES: usize = 1 << 28;

impl Emitter {
    pub fn new() -> Self {
        Emitter::default()
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }

    /// A `Compile` error once the module has outgrown `MAX_MODULE_BYTES`.
    pub fn check_budget(&self) -> Result<()> {
        if self.written <= MAX_MODULE_BYTES {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Compile,
            "mlir",
            format!(
                "the module outgrew {} MiB of MLIR text: the program is too large to compile \
                 (an unrolled loop, or large tensors embedded as constants)",
                MAX_MODULE_BYTES >> 20
            ),
        ))
    }

    /// The position after the text written so far (for `insert_at`).
    pub(crate) fn mark(&self) -> usize {
        self.out.len()
    }

    /// Writes `text` at `mark`, above lines written since.
    pub(crate) fn insert_at(&mut self, mark: usize, text: &str) {
        self.out.insert_str(mark, text);
    }

    /// Exchanges the text written so far with `other`: lines go to another buffer until the
    /// next exchange.
    pub(crate) fn swap_out(&mut self, other: &mut String) {
        std::mem::swap(&mut self.out, other);
    }

    pub(crate) fn set_site(&mut self, site: Site) {
        self.site = site;
    }

    pub(crate) fn site(&self) -> &Site {
        &self.site
    }

    /// For an op `body` IREE folds to a constant, a key equal for equal values.
    fn constant_key(&mut self, body: &str) -> Option<usize> {
        let key = self.constant_text(body)?;
        let next = self.constant_keys.len();
        Some(*self.constant_keys.entry(key).or_insert(next))
    }

    /// `body` with each operand replaced by its key, where every operand is a constant.
    fn constant_text(&self, body: &str) -> Option<String> {
        if body.starts_with("stablehlo.constant ") {
            return Some(body.to_string());
        }
        let mut key = String::with_capacity(body.len());
        let mut operands = 0;
        let mut rest = body;
        while let Some(at) = rest.find('%') {
            key.push_str(&rest[..at]);
            let len = rest[at + 1..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(rest.len() - at, |n| n + 1);
            let operand = &rest[at..at + len];
            key.push_str(&format!("(#{})", self.constants.get(operand)?));
            operands += 1;
            rest = &rest[at + len..];
        }
        key.push_str(rest);
        (operands > 0).then_some(key)
    }

    /// A key equal for values IREE folds to equal constants (see `op`), else the value's name.
    pub(crate) fn value_key(&self, value: &MlirValue) -> String {
        match self.constants.get(&value.name) {
            Some(key) => format!("#{key}"),
            None => value.name.clone(),
        }
    }

    /// Whether IREE folds `value` to a constant.
    pub(crate) fn is_constant(&self, value: &MlirValue) -> bool {
        self.constants.contains_key(&value.name)
    }

    /// A new SSA name (unique in the module, so regions never shadow a value from outside).
    pub fn fresh(&mut self) -> String {
        let n = self.next;
        self.next += 1;
        format!("%{n}")
    }

    /// Starts a new function: SSA numbering restarts.
    pub(crate) fn reset_names(&mut self) {
        self.next = 0;
    }

    /// Writes one line at the current indentation.
    pub fn line(&mut self, text: &str) {
        self.written = self
            .written
            .saturating_add(text.len() + 2 * self.indent + 1);
        if self.written > MAX_MODULE_BYTES {
            return;
        }
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// Indents the lines that follow one more level (a region's body) or one less.
    pub fn indent(&mut self) {
        self.indent += 1;
    }

    pub fn dedent(&mut self) {
        self.indent = self.indent.saturating_sub(1);
    }

    /// `loc("file":line:0)` of the node being emitted, or `loc(unknown)`.
    pub fn loc(&self) -> String {
        match &self.site.location {
            Some(l) => format!("loc({}:{}:0)", string_literal(&l.file), l.line),
            None => "loc(unknown)".to_string(),
        }
    }

    /// Writes `%r = <body> loc(..)` and returns `%r` typed `ty`. `body` is the op after `=`.
    pub fn op(&mut self, body: &str, ty: &TensorType) -> MlirValue {
        let name = self.fresh();
        let loc = self.loc();
        self.line(&format!("{name} = {body} {loc}"));
        if let Some(key) = self.constant_key(body) {
            self.constants.insert(name.clone(), key);
        }
        MlirValue {
            name,
            ty: ty.clone(),
        }
    }

    /// An op whose operands and result all have type `ty`: `name %a, %b : tensor<..>`.
    pub fn elementwise(
        &mut self,
        name: &str,
        operands: &[&MlirValue],
        ty: &TensorType,
    ) -> MlirValue {
        let args: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let body = format!("{name} {} : {}", args.join(", "), TypeText(ty));
        self.op(&body, ty)
    }

    /// `stablehlo.select`: `a` where `pred`, else `b` (all of one shape).
    pub fn select(&mut self, pred: &MlirValue, a: &MlirValue, b: &MlirValue) -> MlirValue {
        let body = format!(
            "stablehlo.select {pred}, {a}, {b} : ({}, {}, {}) -> {}",
            TypeText(&pred.ty),
            TypeText(&a.ty),
            TypeText(&b.ty),
            TypeText(&a.ty)
        );
        self.op(&body, &a.ty)
    }

    /// `stablehlo.compare` of two same-typed operands; `direction` is EQ, NE, LT, LE, GT or GE.
    pub fn compare(&mut self, direction: &str, a: &MlirValue, b: &MlirValue) -> MlirValue {
        let kind = match a.ty.dtype {
            DType::F32 | DType::F64 => "FLOAT",
            DType::I32 | DType::I64 => "SIGNED",
            DType::Bool => "UNSIGNED",
        };
        let out = a.ty.with_dtype(DType::Bool);
        let body = format!(
            "stablehlo.compare {direction}, {a}, {b}, {kind} : ({}, {}) -> {}",
            TypeText(&a.ty),
            TypeText(&b.ty),
            TypeText(&out)
        );
        self.op(&body, &out)
    }

    /// A constant of static `shape`, every element `value` (converted to `dtype`).
    pub fn splat(&mut self, dtype: DType, shape: &[usize], value: f64) -> Result<MlirValue> {
        let ty = TensorType::new(dtype, shape);
        if shape.contains(&DYN) {
            return Err(self.unsupported(format!(
                "a constant of unknown shape {} needs a shape source",
                TypeText(&ty)
            )));
        }
        let body = format!(
            "stablehlo.constant dense<{}> : {}",
            scalar_literal(value, dtype),
            TypeText(&ty)
        );
        Ok(self.op(&body, &ty))
    }

    /// A scalar constant.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> MlirValue {
        let ty = TensorType::scalar(dtype);
        let body = format!(
            "stablehlo.constant dense<{}> : {}",
            scalar_literal(value, dtype),
            TypeText(&ty)
        );
        self.op(&body, &ty)
    }

    /// A constant holding `t`'s elements.
    pub fn constant(&mut self, t: &Tensor) -> MlirValue {
        let body = dense_body(t.shape(), &element_literals(t));
        let text = format!("stablehlo.constant dense<{body}> : {}", TypeText(t.ty()));
        self.op(&text, t.ty())
    }

    /// `stablehlo.convert` to `dtype` (no op when the dtype is already `dtype`). Bool results
    /// are `x != 0`, as the interpreter's cast.
    pub fn convert(&mut self, x: &MlirValue, dtype: DType) -> Result<MlirValue> {
        if x.ty.dtype == dtype {
            return Ok(x.clone());
        }
        if dtype == DType::Bool {
            let zero = self.splat_like(x, 0.0)?;
            return Ok(self.compare("NE", x, &zero));
        }
        if x.ty.dtype == DType::Bool {
            // `select(x, 1, 0)`, not `stablehlo.convert`: IREE 3.13 fuses an i1 -> float
            // convert into a consuming matmul as an i1 operand over i8 storage, which fails to
            // verify ("'linalg.vecmat' op expected type of bb argument #0 ('i1')").
            let like = MlirValue {
                name: x.name.clone(),
                ty: x.ty.with_dtype(dtype),
            };
            let one = self.splat_like(&like, 1.0)?;
            let zero = self.splat_like(&like, 0.0)?;
            let ty = TypeText(&like.ty);
            let body = format!(
                "stablehlo.select {x}, {one}, {zero} : ({}, {ty}, {ty}) -> {ty}",
                TypeText(&x.ty)
            );
            return Ok(self.op(&body, &like.ty));
        }
        let ty = x.ty.with_dtype(dtype);
        let body = format!(
            "stablehlo.convert {x} : ({}) -> {}",
            TypeText(&x.ty),
            TypeText(&ty)
        );
        Ok(self.op(&body, &ty))
    }

    /// `tensor.cast` to a compatible type that is more or less static (no op when equal).
    pub fn cast(&mut self, x: &MlirValue, ty: &TensorType) -> MlirValue {
        if x.ty == *ty {
            return x.clone();
        }
        let body = format!("tensor.cast {x} : {} to {}", TypeText(&x.ty), TypeText(ty));
        self.op(&body, ty)
    }

    /// The `i1` (or other scalar) element of a rank-0 tensor, for `scf` conditions.
    pub fn extract_scalar(&mut self, x: &MlirValue) -> String {
        let name = self.fresh();
        let loc = self.loc();
        self.line(&format!(
            "{name} = tensor.extract {x}[] : {} {loc}",
            TypeText(&x.ty)
        ));
        name
    }

    /// A `Compile` error: this op or form has no MLIR lowering (yet). It names the op; the
    /// function walk adds the node and the user's source line as the error leaves each node.
    pub fn unsupported(&self, why: impl fmt::Display) -> Error {
        let op = if self.site.op.is_empty() {
            "mlir"
        } else {
            self.site.op
        };
        Error::new(ErrorKind::Compile, op, why.to_string())
    }

    /// An internal error: a bug in the emitter, never the user's fault.
    pub fn bug(&self, why: impl fmt::Display) -> Error {
        Error::internal("mlir", why.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_exact_mlir() {
        assert_eq!(float_literal(1e-7, DType::F64), "1.0e-7");
        assert_eq!(float_literal(0.1, DType::F32), "0.1");
        assert_eq!(float_literal(3.0, DType::F64), "3.0");
        assert_eq!(float_literal(-0.0, DType::F64), "-0.0");
        assert_eq!(float_literal(1e300, DType::F64), "1.0e300");
        assert_eq!(float_literal(f64::NAN, DType::F32), "0x7FC00000");
        assert_eq!(float_literal(f64::NEG_INFINITY, DType::F32), "0xFF800000");
        assert_eq!(
            float_literal(f64::INFINITY, DType::F64),
            "0x7FF0000000000000"
        );
        assert_eq!(scalar_literal(-2.7, DType::I32), "-2");
        assert_eq!(scalar_literal(0.5, DType::Bool), "true");
        assert_eq!(string_literal("a \"b\"\\c\n"), "\"a \\\"b\\\"\\\\c\\0A\"");
    }

    #[test]
    fn dense_bodies_nest_by_shape() {
        let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        assert_eq!(
            dense_body(t.shape(), &element_literals(&t)),
            "[[1, 2, 3], [4, 5, 6]]"
        );
        let s = Tensor::from_vec(vec![true; 4], &[2, 2]).unwrap();
        assert_eq!(dense_body(s.shape(), &element_literals(&s)), "true");
        let e = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
        assert_eq!(dense_body(e.shape(), &element_literals(&e)), "");
        let ty = TensorType::new(DType::Bool, &[DYN, 3]);
        assert_eq!(type_text(&ty), "tensor<?x3xi1>");
        assert_eq!(type_text(&TensorType::scalar(DType::F64)), "tensor<f64>");
    }

    #[test]
    fn constant_keys_stay_one_op_long_and_equal_for_equal_values() {
        // Each select reads the one before twice, through two operands: written-out keys
        // double with every step (the predicated loop of issue 28 reached 2^32 bytes).
        let mut e = Emitter::new();
        let ty = TensorType::scalar(DType::F64);
        let (mut a, mut b) = (
            e.constant(&Tensor::scalar(1.0f64)),
            e.constant(&Tensor::scalar(1.0f64)),
        );
        assert_eq!(e.value_key(&a), e.value_key(&b));
        for _ in 0..64 {
            let s = e.elementwise("stablehlo.add", &[&a, &b], &ty);
            let t = e.elementwise("stablehlo.add", &[&b, &a], &ty);
            (a, b) = (s, t);
        }
        assert!(e.is_constant(&a));
        assert!(e.value_key(&a).len() < 16);
        assert!(e.constant_keys.values().all(|&k| k < 200));
        assert!(e.constant_keys.keys().all(|k| k.len() < 100));
        let c = e.elementwise("stablehlo.add", &[&a, &b], &ty);
        let d = e.elementwise("stablehlo.add", &[&a, &b], &ty);
        assert_eq!(e.value_key(&c), e.value_key(&d));
    }

    #[test]
    fn a_module_past_the_budget_is_refused_and_stops_growing() {
        let mut e = Emitter::new();
        assert!(e.check_budget().is_ok());
        let line = "x".repeat(1 << 20);
        for _ in 0..(MAX_MODULE_BYTES >> 20) + 2 {
            e.line(&line);
        }
        let err = e.check_budget().unwrap_err();
        assert_eq!(err.kind, ErrorKind::Compile);
        assert!(err.to_string().contains("MiB of MLIR text"), "{err}");
        assert!(e.finish().len() <= MAX_MODULE_BYTES);
    }
}
