//! MLIR attributes of the generic form: what the importer reads (integers, arrays, `array<i64:
//! ...>`, `dense<...>` constants with their hex form, dictionaries, dialect enums such as
//! `#stablehlo<comparison_direction LT>` and structs such as `#stablehlo.dot<...>`), and the
//! rest kept as written (`Other`): only an op that needs an attribute looks at it.

use super::cursor::Cursor;
use super::types::{parse_type, Type};
use crate::dtype::{DType, Storage};
use crate::error::{Error, ErrorKind, Result};
use crate::shape::numel;
use crate::tensor::Tensor;

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attribute {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// `@name` (without the `@`).
    Symbol(String),
    Unit,
    Array(Vec<Attribute>),
    /// `array<i64: 1, 2>` (booleans as 0 and 1).
    DenseArray(Vec<i64>),
    Dense(DenseElements),
    Dict(Vec<(String, Attribute)>),
    /// `#dialect<body>` or `#dialect.name<body>`, the body as written.
    Dialect {
        name: String,
        body: String,
    },
    Type(Type),
    Other(String),
}

/// `dense<...> : type`: the literals (flattened) or the hex bytes, and the type.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseElements {
    pub literals: Vec<String>,
    pub hex: Option<Vec<u8>>,
    pub ty: Type,
}

fn import_error(message: String) -> Error {
    Error::new(ErrorKind::Compile, "mlir import", message)
}

impl DenseElements {
    /// The constant as a tensor: a single literal (or element of hex data) is a splat.
    pub fn to_tensor(&self) -> Result<Tensor> {
        let tt = self.ty.tensor_type().ok_or_else(|| {
            import_error(format!("constants of type {} are not supported", self.ty))
        })?;
        let n = numel(&tt.shape);
        let values: Vec<Number> = match &self.hex {
            Some(bytes) => hex_values(bytes, tt.dtype, n)?,
            None => self
                .literals
                .iter()
                .map(|l| literal_value(l, tt.dtype))
                .collect::<Result<_>>()?,
        };
        let values = match values.len() {
            1 if n != 1 => vec![values[0]; n],
            len if len == n => values,
            len => {
                return Err(import_error(format!(
                    "dense constant with {len} elements for type {}",
                    self.ty
                )))
            }
        };
        let float = |v: &Number| match *v {
            Number::Float(f) => f,
            Number::Int(i) => i as f64,
        };
        let int = |v: &Number| match *v {
            Number::Float(f) => f as i64,
            Number::Int(i) => i,
        };
        let storage = match tt.dtype {
            DType::F32 => Storage::F32(values.iter().map(|v| float(v) as f32).collect()),
            DType::F64 => Storage::F64(values.iter().map(float).collect()),
            DType::I32 => Storage::I32(values.iter().map(|v| int(v) as i32).collect()),
            DType::I64 => Storage::I64(values.iter().map(int).collect()),
            DType::Bool => Storage::Bool(values.iter().map(|v| int(v) != 0).collect()),
        };
        Tensor::new(storage, &tt.shape)
    }
}

/// An element read from a literal: integers stay exact (int64 beyond 2^53 included).
#[derive(Clone, Copy, Debug)]
enum Number {
    Int(i64),
    Float(f64),
}

/// One literal of a `dense<...>` list: a number, `true`/`false`, or a float's bit pattern.
fn literal_value(text: &str, dtype: DType) -> Result<Number> {
    let bad = || import_error(format!("bad {dtype} literal `{text}` in a dense constant"));
    match text {
        "true" => return Ok(Number::Int(1)),
        "false" => return Ok(Number::Int(0)),
        _ => {}
    }
    if let Some(hex) = text.strip_prefix("0x") {
        let bits = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
        return Ok(bits_value(bits, dtype));
    }
    if let Ok(v) = text.parse::<i64>() {
        return Ok(Number::Int(v));
    }
    text.parse::<f64>().map(Number::Float).map_err(|_| bad())
}

/// The element of `dtype` whose bits (zero-extended) are `bits`.
fn bits_value(bits: u64, dtype: DType) -> Number {
    match dtype {
        DType::F32 => Number::Float(f64::from(f32::from_bits(bits as u32))),
        DType::F64 => Number::Float(f64::from_bits(bits)),
        DType::I32 => Number::Int(i64::from(bits as u32 as i32)),
        DType::I64 => Number::Int(bits as i64),
        DType::Bool => Number::Int(i64::from(bits != 0)),
    }
}

/// Elements of hex data (little-endian, one byte per boolean, as MLIR prints `dense<"0x..">`).
fn hex_values(bytes: &[u8], dtype: DType, n: usize) -> Result<Vec<Number>> {
    let size = dtype.size();
    if !bytes.len().is_multiple_of(size) || (bytes.len() / size != n && bytes.len() != size) {
        return Err(import_error(format!(
            "hex constant of {} bytes for {n} {dtype} elements",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks(size)
        .map(|b| {
            let mut word = [0u8; 8];
            word[..size].copy_from_slice(b);
            bits_value(u64::from_le_bytes(word), dtype)
        })
        .collect())
}

impl Attribute {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attribute::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The integers of an `array<i64: ...>` or of a `[1, 2]` list of integers.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Attribute::DenseArray(v) => Some(v.clone()),
            Attribute::Array(items) => items.iter().map(Attribute::as_int).collect(),
            _ => None,
        }
    }

    /// The value of a dialect enum, `LT` of `#stablehlo<comparison_direction LT>`.
    pub fn enum_value(&self) -> Option<&str> {
        match self {
            Attribute::Dialect { body, .. } => body.split_whitespace().nth(1),
            _ => None,
        }
    }

    /// The `key = value` fields of a dialect struct such as `#stablehlo.dot<...>`.
    pub fn fields(&self) -> Result<Vec<(String, Attribute)>> {
        match self {
            Attribute::Dialect { body, .. } => {
                let mut c = Cursor::new(body);
                let fields = parse_entries(&mut c, None)?;
                Ok(fields)
            }
            other => Err(import_error(format!(
                "expected a dialect attribute, got {other:?}"
            ))),
        }
    }
}

/// A value after `=` (or an element of a list).
pub(crate) fn parse_attribute(c: &mut Cursor<'_>) -> Result<Attribute> {
    let Some(first) = c.peek() else {
        return Err(c.error("expected an attribute"));
    };
    match first {
        '[' => {
            c.expect("[")?;
            let mut items = Vec::new();
            if !c.eat("]") {
                loop {
                    items.push(parse_attribute(c)?);
                    if c.eat("]") {
                        break;
                    }
                    c.expect(",")?;
                }
            }
            Ok(Attribute::Array(items))
        }
        '{' => {
            c.expect("{")?;
            Ok(Attribute::Dict(parse_entries(c, Some('}'))?))
        }
        '"' => Ok(Attribute::Str(c.string()?)),
        '@' => {
            let name = c.sigil_name('@')?;
            // A nested reference `@a::@b` names `a` here.
            while c.eat("::") {
                c.sigil_name('@')?;
            }
            Ok(Attribute::Symbol(name[1..].to_string()))
        }
        '#' => {
            c.expect("#")?;
            let name = c.ident()?.to_string();
            let body = if c.eat("<") {
                let b = c.balanced(&['>'])?.to_string();
                c.expect(">")?;
                b
            } else {
                String::new()
            };
            Ok(Attribute::Dialect { name, body })
        }
        '(' | '!' => Ok(Attribute::Type(parse_type(c)?)),
        '-' | '0'..='9' => parse_number(c),
        _ => parse_word(c),
    }
}

/// A number, with an optional `: type` (a float type makes an integer literal a float).
fn parse_number(c: &mut Cursor<'_>) -> Result<Attribute> {
    let text = c.number()?;
    let ty = if c.eat(":") {
        Some(parse_type(c)?)
    } else {
        None
    };
    let is_float_type = ty.as_ref().is_some_and(|t| t.0.starts_with('f'));
    if let Some(hex) = text.strip_prefix("0x").filter(|_| is_float_type) {
        let bits = u64::from_str_radix(hex, 16).map_err(|_| c.error("bad hex float"))?;
        let v = if ty.as_ref().is_some_and(|t| t.0 == "f32") {
            f64::from(f32::from_bits(bits as u32))
        } else {
            f64::from_bits(bits)
        };
        return Ok(Attribute::Float(v));
    }
    if !is_float_type && !text.contains(['.', 'e', 'E']) {
        if let Ok(v) = text.parse::<i64>() {
            return Ok(Attribute::Int(v));
        }
    }
    text.parse::<f64>()
        .map(Attribute::Float)
        .map_err(|_| c.error(format!("bad number `{text}`")))
}

/// A keyword attribute (`true`, `unit`, `dense<..>`, `array<..>`) or a type (`tensor<..>`).
fn parse_word(c: &mut Cursor<'_>) -> Result<Attribute> {
    if c.eat("dense<") {
        return parse_dense(c);
    }
    if c.eat("array<") {
        let _element = parse_type(c)?;
        let mut values = Vec::new();
        if c.eat(":") {
            loop {
                values.push(match parse_attribute(c)? {
                    Attribute::Int(v) => v,
                    Attribute::Bool(b) => i64::from(b),
                    other => return Err(c.error(format!("bad array element {other:?}"))),
                });
                if !c.eat(",") {
                    break;
                }
            }
        }
        c.expect(">")?;
        return Ok(Attribute::DenseArray(values));
    }
    for (word, attr) in [
        ("true", Attribute::Bool(true)),
        ("false", Attribute::Bool(false)),
        ("unit", Attribute::Unit),
    ] {
        if c.eat_word(word) {
            return Ok(attr);
        }
    }
    if c.peek().is_some_and(|ch| ch.is_ascii_alphabetic()) {
        return Ok(Attribute::Type(parse_type(c)?));
    }
    Ok(Attribute::Other(
        c.balanced(&[',', '}', ']', '>'])?.to_string(),
    ))
}

/// The rest of `dense<...> : type` after `dense<`.
fn parse_dense(c: &mut Cursor<'_>) -> Result<Attribute> {
    let mut literals = Vec::new();
    let mut hex = None;
    if c.at("\"") {
        let s = c.string()?;
        let digits = s
            .strip_prefix("0x")
            .ok_or_else(|| c.error("bad hex constant"))?;
        let bytes = (0..digits.len() / 2)
            .map(|i| u8::from_str_radix(&digits[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| c.error("bad hex constant"))?;
        hex = Some(bytes);
    } else {
        let body = c.balanced(&['>'])?;
        for token in body.split(|ch: char| "[], ".contains(ch)) {
            if token.starts_with('(') || token.ends_with(')') {
                return Err(c.error("complex constants are not supported"));
            }
            if !token.is_empty() {
                literals.push(token.to_string());
            }
        }
    }
    c.expect(">")?;
    c.expect(":")?;
    let ty = parse_type(c)?;
    Ok(Attribute::Dense(DenseElements { literals, hex, ty }))
}

/// `name = value` entries separated by commas, up to `close` (consumed) or the end of the text.
/// An entry without `= value` is a unit attribute.
pub(crate) fn parse_entries(
    c: &mut Cursor<'_>,
    close: Option<char>,
) -> Result<Vec<(String, Attribute)>> {
    let mut entries = Vec::new();
    let closes = |c: &mut Cursor<'_>| match close {
        Some(ch) => c.eat(&ch.to_string()),
        None => c.at_end(),
    };
    if closes(c) {
        return Ok(entries);
    }
    loop {
        let name = if c.at("\"") {
            c.string()?
        } else {
            c.ident()?.to_string()
        };
        let value = if c.eat("=") {
            parse_attribute(c)?
        } else {
            Attribute::Unit
        };
        entries.push((name, value));
        if closes(c) {
            return Ok(entries);
        }
        c.expect(",")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(text: &str) -> Attribute {
        parse_attribute(&mut Cursor::new(text)).unwrap()
    }

    #[test]
    fn the_attributes_stablehlo_ops_carry() {
        assert_eq!(attr("array<i64: 0, 1>").as_ints(), Some(vec![0, 1]));
        assert_eq!(attr("array<i64>").as_ints(), Some(vec![]));
        assert_eq!(attr("[1, -2]").as_ints(), Some(vec![1, -2]));
        assert_eq!(attr("3 : i32"), Attribute::Int(3));
        assert_eq!(attr("1.5 : f32"), Attribute::Float(1.5));
        assert_eq!(attr("0x7F800000 : f32"), Attribute::Float(f64::INFINITY));
        assert_eq!(attr("@remainder"), Attribute::Symbol("remainder".into()));
        assert_eq!(attr("true"), Attribute::Bool(true));
        let cmp = attr("#stablehlo<comparison_direction LT>");
        assert_eq!(cmp.enum_value(), Some("LT"));
        let dot =
            attr("#stablehlo.dot<lhs_contracting_dimensions = [1], rhs_batching_dimensions = []>");
        let fields = dot.fields().unwrap();
        assert_eq!(fields[0].1.as_ints(), Some(vec![1]));
        assert_eq!(fields[1].1.as_ints(), Some(vec![]));
        let Attribute::Dict(d) = attr("{jax.result_info = \"r\", unit_attr}") else {
            panic!()
        };
        assert_eq!(d[1], ("unit_attr".to_string(), Attribute::Unit));
        assert!(matches!(
            attr("(tensor<f32>) -> tensor<f32>"),
            Attribute::Type(_)
        ));
        assert!(matches!(
            attr("affine_map<(d0) -> (d0)>"),
            Attribute::Type(_)
        ));
    }

    fn dense(text: &str) -> Tensor {
        match attr(text) {
            Attribute::Dense(d) => d.to_tensor().unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dense_constants_lists_splats_and_hex() {
        let t = dense("dense<[[1.0, 2.0], [3.5, -4.0e+00]]> : tensor<2x2xf64>");
        assert_eq!(t.to_f64_vec(), [1.0, 2.0, 3.5, -4.0]);
        assert_eq!(dense("dense<7> : tensor<3xi32>").to_f64_vec(), [7.0; 3]);
        assert_eq!(dense("dense<true> : tensor<i1>").dtype(), DType::Bool);
        assert_eq!(
            dense("dense<0xFF800000> : tensor<f32>").to_f64_vec(),
            [f64::NEG_INFINITY]
        );
        let t = dense("dense<\"0x000000000000803F\"> : tensor<2xf32>");
        assert_eq!(t.to_f64_vec(), [0.0, 1.0]);
        let t = dense("dense<\"0x0000803F\"> : tensor<3xf32>");
        assert_eq!(t.to_f64_vec(), [1.0; 3]);
        assert_eq!(dense("dense<> : tensor<0xf32>").numel(), 0);
        let big = "dense<9007199254740993> : tensor<i64>";
        assert_eq!(dense(big).as_slice::<i64>().unwrap(), [9007199254740993]);
        let bad = attr("dense<[1, 2]> : tensor<3xf32>");
        let Attribute::Dense(d) = bad else { panic!() };
        assert!(d.to_tensor().is_err());
    }
}
