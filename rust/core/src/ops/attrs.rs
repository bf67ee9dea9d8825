//! Op attributes as data: every op turns into (name, attributes) and back, so graph text can
//! print and parse any op without a second list of ops.
//!
//! Each op struct states its attributes once, beside its definition, with
//! `op_attrs!(Sum = "sum" { axes, keepdims })`; the field types decide the conversion through
//! `AttrValue`. `OpDef` requires `OpAttrs`, so an op without that line does not compile.
//!
//! The text form of an attribute is untyped (`3`, `[0, ?]`, `1.5`, `true`, `f32`): the parser
//! produces the closest `Attr`, and `AttrValue::from_attr` accepts every form its field type can
//! take (a `usize` field reads `Int(3)` as well as `Size(3)`). So ops, not `Attr`s, round-trip.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::shape::{Shape, DYN};

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Bool(bool),
    DType(DType),
    /// A size or axis (`usize`); `DYN` prints as `?`.
    Size(usize),
    /// Sizes, axes or a shape (`usize`s); `DYN` prints as `?`.
    Shape(Vec<usize>),
}

/// The short dtype names of graph text (`f32`, `i64`, `bool`); `DType::from_name` reads them.
pub fn dtype_short_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "bool",
    }
}

/// Writes a size, `?` for `DYN`.
pub fn write_size(f: &mut fmt::Formatter<'_>, d: usize) -> fmt::Result {
    if d == DYN {
        f.write_str("?")
    } else {
        write!(f, "{d}")
    }
}

/// Writes `[a, b, c]`, each item with `item`.
pub fn write_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    item: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        item(f, x)?;
    }
    f.write_str("]")
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Ints(v) => write_list(f, v, |f, x| write!(f, "{x}")),
            // `{:?}` is the shortest text that parses back to the same f64 (and keeps `.0`,
            // so a float never reads back as an integer).
            Attr::Float(v) => write!(f, "{v:?}"),
            Attr::Bool(v) => write!(f, "{v}"),
            Attr::DType(d) => f.write_str(dtype_short_name(*d)),
            Attr::Size(d) => write_size(f, *d),
            Attr::Shape(v) => write_list(f, v, |f, d| write_size(f, *d)),
        }
    }
}

/// A Rust field type that can be an attribute.
pub trait AttrValue: Sized {
    fn to_attr(&self) -> Attr;
    /// `None` when `attr` is not a form of this type.
    fn from_attr(attr: &Attr) -> Option<Self>;
}

impl AttrValue for i64 {
    fn to_attr(&self) -> Attr {
        Attr::Int(*self)
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Int(v) => Some(*v),
            Attr::Size(d) if *d != DYN => i64::try_from(*d).ok(),
            _ => None,
        }
    }
}

impl AttrValue for usize {
    fn to_attr(&self) -> Attr {
        Attr::Size(*self)
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Size(d) => Some(*d),
            Attr::Int(v) => usize::try_from(*v).ok(),
            _ => None,
        }
    }
}

impl AttrValue for Vec<i64> {
    fn to_attr(&self) -> Attr {
        Attr::Ints(self.clone())
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Ints(v) => Some(v.clone()),
            Attr::Shape(v) => v.iter().map(|&d| i64::from_attr(&Attr::Size(d))).collect(),
            _ => None,
        }
    }
}

impl AttrValue for Vec<usize> {
    fn to_attr(&self) -> Attr {
        Attr::Shape(self.clone())
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Shape(v) => Some(v.clone()),
            Attr::Ints(v) => v.iter().map(|&x| usize::try_from(x).ok()).collect(),
            _ => None,
        }
    }
}

impl AttrValue for Shape {
    fn to_attr(&self) -> Attr {
        Attr::Shape(self.to_vec())
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        Vec::<usize>::from_attr(attr).map(Shape::from_vec)
    }
}

impl AttrValue for f64 {
    fn to_attr(&self) -> Attr {
        Attr::Float(*self)
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Float(v) => Some(*v),
            // Hand-written text may say `value=1`; integers this large are exact in f64 anyway
            // or were never meant to be.
            Attr::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
}

impl AttrValue for bool {
    fn to_attr(&self) -> Attr {
        Attr::Bool(*self)
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::Bool(v) => Some(*v),
            _ => None,
        }
    }
}

impl AttrValue for DType {
    fn to_attr(&self) -> Attr {
        Attr::DType(*self)
    }
    fn from_attr(attr: &Attr) -> Option<Self> {
        match attr {
            Attr::DType(d) => Some(*d),
            _ => None,
        }
    }
}

/// Named attributes as read from text: each name at most once, in the order written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttrMap {
    entries: Vec<(String, Attr)>,
}

impl AttrMap {
    pub fn new() -> Self {
        AttrMap::default()
    }

    /// Adds `name`; a name given twice is an error.
    pub fn insert(&mut self, name: impl Into<String>, attr: Attr) -> Result<()> {
        let name = name.into();
        if self.entries.iter().any(|(n, _)| *n == name) {
            return Err(attr_error(
                "attrs",
                format!("attribute `{name}` is given twice"),
            ));
        }
        self.entries.push((name, attr));
        Ok(())
    }

    /// The map of an op's own attributes (what `OpAttrs::attrs` returns).
    pub fn from_pairs(pairs: Vec<(&'static str, Attr)>) -> Self {
        let entries = pairs.into_iter().map(|(n, a)| (n.to_string(), a)).collect();
        AttrMap { entries }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Attr)> {
        self.entries.iter().map(|(n, a)| (n.as_str(), a))
    }

    /// Attribute `name` of op `op` as the field type `T`.
    pub fn get<T: AttrValue>(&self, op: &'static str, name: &str) -> Result<T> {
        let attr = self
            .entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
            .ok_or_else(|| attr_error(op, format!("missing attribute `{name}`")))?;
        T::from_attr(attr).ok_or_else(|| {
            let ty = std::any::type_name::<T>();
            attr_error(
                op,
                format!("attribute `{name}` = {attr} is not a valid {ty}"),
            )
        })
    }

    /// Fails on any attribute not in `known` (a typo must not be silently dropped).
    pub fn expect_only(&self, op: &'static str, known: &[&str]) -> Result<()> {
        match self
            .entries
            .iter()
            .find(|(n, _)| !known.contains(&n.as_str()))
        {
            None => Ok(()),
            Some((n, _)) => {
                let expected = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                Err(attr_error(
                    op,
                    format!("unknown attribute `{n}` (expected: {expected})"),
                ))
            }
        }
    }
}

fn attr_error(op: &'static str, message: String) -> Error {
    Error::new(ErrorKind::Graph, op, message)
}

/// An op as data: its text name and attributes. Written with `op_attrs!`, never by hand.
pub trait OpAttrs: Sized {
    /// The op's name in graph text; equal to `OpDef::name` (a test checks every op).
    const NAME: &'static str;
    /// The attributes, in field order.
    fn attrs(&self) -> Vec<(&'static str, Attr)>;
    /// The op from its attributes; missing, unknown or ill-typed attributes are `Graph` errors.
    fn from_attrs(attrs: &AttrMap) -> Result<Self>;
}

/// `op_attrs!(Type = "name" { field, ... })` implements `OpAttrs` for an op struct (unit
/// structs too: `op_attrs!(Neg = "neg" {})`). Field types must implement `AttrValue`.
macro_rules! op_attrs {
    ($ty:ident = $name:literal { $($field:ident),* $(,)? }) => {
        impl $crate::ops::attrs::OpAttrs for $ty {
            const NAME: &'static str = $name;

            fn attrs(&self) -> Vec<(&'static str, $crate::ops::attrs::Attr)> {
                vec![$( (stringify!($field), $crate::ops::attrs::AttrValue::to_attr(&self.$field)), )*]
            }

            fn from_attrs(attrs: &$crate::ops::attrs::AttrMap) -> $crate::error::Result<Self> {
                attrs.expect_only($name, &[$( stringify!($field), )*])?;
                Ok($ty { $( $field: attrs.get($name, stringify!($field))?, )* })
            }
        }
    };
}
pub(crate) use op_attrs;

#[cfg(test)]
#[path = "attrs_tests.rs"]
pub(crate) mod tests;
