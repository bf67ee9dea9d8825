//! MLIR types as the importer meets them: kept as written, and read as a gradloop `TensorType`
//! when they are ranked tensors (or scalars) of f32, f64, i32, i64 or i1. Scalars (`i1` from
//! `tensor.extract`, `index` of `scf.index_switch`) become rank-0 tensors; `index` is int64.

use std::fmt;

use super::cursor::Cursor;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::{TensorType, DYN};

/// A type as written in the generic form (`tensor<2x?xf32>`, `i1`, `!stablehlo.token`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Type(pub String);

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The gradloop dtype of an MLIR element type, if it has one.
fn element(name: &str) -> Option<DType> {
    Some(match name {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "i32" => DType::I32,
        "i64" | "index" => DType::I64,
        "i1" => DType::Bool,
        _ => return None,
    })
}

impl Type {
    /// The tensor type this is (a scalar type is a rank-0 tensor), or `None` when gradloop has
    /// no such type (another element type, an unranked tensor, a tuple, a token, ...).
    pub fn tensor_type(&self) -> Option<TensorType> {
        let text = self.0.trim();
        if let Some(dtype) = element(text) {
            return Some(TensorType::scalar(dtype));
        }
        let body = text.strip_prefix("tensor<")?.strip_suffix('>')?;
        // `tensor<2x3xf32, #encoding>`: an encoding is not something gradloop can keep.
        if body.contains(',') {
            return None;
        }
        let mut parts: Vec<&str> = body.split('x').collect();
        let dtype = element(parts.pop()?)?;
        let mut shape = Vec::with_capacity(parts.len());
        for p in parts {
            shape.push(match p {
                "?" => DYN,
                _ => p.parse().ok()?,
            });
        }
        Some(TensorType::new(dtype, &shape))
    }

    /// Whether this is a scalar type (not a tensor): `i1`, `index`, `f32`, ...
    pub fn is_scalar(&self) -> bool {
        element(self.0.trim()).is_some()
    }
}

/// Reads one type: `[!]name` followed by a `<...>` body if any, or a parenthesised function
/// type `(..) -> ..`.
pub(crate) fn parse_type(c: &mut Cursor<'_>) -> Result<Type> {
    if c.at("(") {
        let inputs = parse_type_list(c)?;
        c.expect("->")?;
        let outputs = parse_results(c)?;
        let join = |ts: &[Type]| {
            ts.iter()
                .map(|t| t.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Ok(Type(format!("({}) -> ({})", join(&inputs), join(&outputs))));
    }
    let bang = c.eat("!");
    let name = c.ident()?;
    let mut text = format!("{}{name}", if bang { "!" } else { "" });
    if c.eat("<") {
        let body = c.balanced(&['>'])?;
        c.expect(">")?;
        text = format!("{text}<{body}>");
    }
    Ok(Type(text))
}

/// `(t1, t2, ...)`.
pub(crate) fn parse_type_list(c: &mut Cursor<'_>) -> Result<Vec<Type>> {
    c.expect("(")?;
    let mut types = Vec::new();
    if !c.eat(")") {
        loop {
            types.push(parse_type(c)?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    Ok(types)
}

/// The result side of a function type: one type, or a parenthesised list.
pub(crate) fn parse_results(c: &mut Cursor<'_>) -> Result<Vec<Type>> {
    if c.at("(") {
        parse_type_list(c)
    } else {
        Ok(vec![parse_type(c)?])
    }
}

/// `(inputs) -> results` of an operation.
pub(crate) fn parse_function_type(c: &mut Cursor<'_>) -> Result<(Vec<Type>, Vec<Type>)> {
    let inputs = parse_type_list(c)?;
    c.expect("->")?;
    Ok((inputs, parse_results(c)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(s: &str) -> Option<TensorType> {
        Type(s.to_string()).tensor_type()
    }

    #[test]
    fn tensor_types_and_scalars() {
        assert_eq!(
            ty("tensor<2x?xf32>"),
            Some(TensorType::new(DType::F32, &[2, DYN]))
        );
        assert_eq!(ty("tensor<i1>"), Some(TensorType::scalar(DType::Bool)));
        assert_eq!(ty("index"), Some(TensorType::scalar(DType::I64)));
        for unsupported in [
            "tensor<2xbf16>",
            "tensor<*xf32>",
            "!stablehlo.token",
            "tuple<>",
        ] {
            assert_eq!(ty(unsupported), None, "{unsupported}");
        }
        let mut c = Cursor::new("(tensor<3xf64>, i1) -> (tensor<f64>, index) tail");
        let (ins, outs) = parse_function_type(&mut c).unwrap();
        assert_eq!(ins, [Type("tensor<3xf64>".into()), Type("i1".into())]);
        assert_eq!(outs.len(), 2);
        let mut c = Cursor::new("() -> tensor<f32> loc");
        let (ins, outs) = parse_function_type(&mut c).unwrap();
        assert!(ins.is_empty());
        assert_eq!(outs, [Type("tensor<f32>".into())]);
    }
}
