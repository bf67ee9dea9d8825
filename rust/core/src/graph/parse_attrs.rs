//! Attribute values in graph text, and turning a node's head and attributes into a `NodeKind`
//! (an op of the table through `Op::from_name`, or a built-in kind).

use super::cursor::Parser;
use super::ir::{Constant, NodeKind, ValueType};
use super::lexer::{Pos, Tok};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::attrs::{Attr, AttrMap};
use crate::ops::Op;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;

/// An attribute value as written; its meaning depends on the attribute it is given to.
#[derive(Clone, Debug)]
pub(crate) enum PValue {
    Num(String),
    Dyn,
    Word(String),
    Func(String),
    List(Vec<(PValue, Pos)>),
    Type(ValueType),
    Str(String),
}

/// One `name=value` with the positions of the name and of the value.
struct RawAttr {
    name: String,
    at: Pos,
    value: PValue,
    value_at: Pos,
}

/// `{name=value, ...}` in written order; each name once.
#[derive(Default)]
pub(crate) struct RawAttrs {
    items: Vec<RawAttr>,
}

impl RawAttrs {
    pub(crate) fn parse(p: &mut Parser<'_>) -> Result<Self> {
        p.punct("{")?;
        let mut items: Vec<RawAttr> = Vec::new();
        while !p.eat("}") {
            if !items.is_empty() {
                p.punct(",")?;
            }
            let pos = p.pos();
            let Tok::Ident(name) = p.peek().clone() else {
                return Err(p.expected("an attribute name"));
            };
            if items.iter().any(|a| a.name == name) {
                return Err(p.error(pos, format!("attribute `{name}` is given twice")));
            }
            p.next();
            p.punct("=")?;
            let value_at = p.pos();
            let value = value(p)?;
            items.push(RawAttr {
                name,
                at: pos,
                value,
                value_at,
            });
        }
        Ok(RawAttrs { items })
    }

    fn take(&mut self, name: &str) -> Option<(PValue, Pos)> {
        let i = self.items.iter().position(|a| a.name == name)?;
        let a = self.items.remove(i);
        Some((a.value, a.value_at))
    }

    fn require(
        &mut self,
        p: &Parser<'_>,
        at: Pos,
        head: &str,
        name: &str,
    ) -> Result<(PValue, Pos)> {
        self.take(name)
            .ok_or_else(|| p.error(at, format!("{head}: missing attribute `{name}`")))
    }

    /// Fails on an attribute nobody took.
    fn finish(self, p: &Parser<'_>, head: &str) -> Result<()> {
        match self.items.first() {
            None => Ok(()),
            Some(a) => Err(p.error(a.at, format!("{head}: unknown attribute `{}`", a.name))),
        }
    }
}

fn value(p: &mut Parser<'_>) -> Result<PValue> {
    match p.peek().clone() {
        Tok::Number(s) => {
            p.next();
            Ok(PValue::Num(s))
        }
        Tok::Func(f) => {
            p.next();
            Ok(PValue::Func(f))
        }
        Tok::Str(s) => {
            p.next();
            Ok(PValue::Str(s))
        }
        Tok::Punct("?") => {
            p.next();
            Ok(PValue::Dyn)
        }
        Tok::Punct("[") => {
            p.next();
            let mut items = Vec::new();
            while !p.eat("]") {
                if !items.is_empty() {
                    p.punct(",")?;
                }
                let pos = p.pos();
                items.push((value(p)?, pos));
            }
            Ok(PValue::List(items))
        }
        Tok::Ident(w) => {
            let is_type = matches!(w.as_str(), "resource" | "stack")
                || (DType::from_name(&w).is_ok() && p.peek_at(1) == &Tok::Punct("["));
            if is_type {
                return Ok(PValue::Type(p.value_type()?));
            }
            p.next();
            Ok(PValue::Word(w))
        }
        _ => Err(p.expected("an attribute value")),
    }
}

fn is_float_text(s: &str) -> bool {
    s.contains(['.', 'e', 'E']) || s.ends_with("inf") || s.ends_with("NaN")
}

/// The closest `Attr` for an untyped value (the op's field types decide the rest).
fn to_attr(v: &PValue) -> Option<Attr> {
    match v {
        PValue::Num(s) if is_float_text(s) => s.parse().ok().map(Attr::Float),
        PValue::Num(s) => match s.parse::<i64>() {
            Ok(i) => Some(Attr::Int(i)),
            Err(_) => s.parse::<usize>().ok().map(Attr::Size),
        },
        PValue::Dyn => Some(Attr::Size(DYN)),
        PValue::Word(w) => match w.as_str() {
            "true" => Some(Attr::Bool(true)),
            "false" => Some(Attr::Bool(false)),
            "NaN" | "inf" => w.parse().ok().map(Attr::Float),
            other => DType::from_name(other).ok().map(Attr::DType),
        },
        PValue::List(items) => list_attr(items),
        PValue::Func(_) | PValue::Type(_) | PValue::Str(_) => None,
    }
}

/// A list of integers: `Ints`, or `Shape` when it holds `?` or a value beyond i64.
fn list_attr(items: &[(PValue, Pos)]) -> Option<Attr> {
    let attrs: Option<Vec<Attr>> = items.iter().map(|(v, _)| to_attr(v)).collect();
    let attrs = attrs?;
    let ints: Option<Vec<i64>> = attrs
        .iter()
        .map(|a| match a {
            Attr::Int(i) => Some(*i),
            _ => None,
        })
        .collect();
    if let Some(ints) = ints {
        return Some(Attr::Ints(ints));
    }
    let sizes: Option<Vec<usize>> = attrs
        .iter()
        .map(|a| match a {
            Attr::Size(d) => Some(*d),
            Attr::Int(i) => usize::try_from(*i).ok(),
            _ => None,
        })
        .collect();
    sizes.map(Attr::Shape)
}

/// The kind of a node written `head(...) {attrs} : outputs`.
pub(crate) fn build_kind(
    p: &Parser<'_>,
    head: &str,
    at: Pos,
    mut attrs: RawAttrs,
    outputs: &[ValueType],
) -> Result<NodeKind> {
    let kind = match head {
        "arg" => NodeKind::Arg(int(p, attrs.require(p, at, head, "index")?)?),
        "const" => NodeKind::Const(constant(
            p,
            at,
            attrs.require(p, at, head, "value")?,
            outputs,
        )?),
        _ => {
            let mut reader = AttrReader {
                p,
                at,
                head,
                attrs: &mut attrs,
            };
            match NodeKind::parse_construct(head, &mut reader) {
                Some(kind) => kind?,
                None => return op_kind(p, head, at, attrs),
            }
        }
    };
    attrs.finish(p, head)?;
    Ok(kind)
}

/// A construct's attributes as it reads them (`ParseNode::parse`): each read takes one.
pub struct AttrReader<'p, 'a> {
    p: &'a Parser<'p>,
    at: Pos,
    head: &'a str,
    attrs: &'a mut RawAttrs,
}

impl AttrReader<'_, '_> {
    fn require(&mut self, name: &str) -> Result<(PValue, Pos)> {
        self.attrs.require(self.p, self.at, self.head, name)
    }

    /// A required function name `@f`.
    pub fn function(&mut self, name: &str) -> Result<String> {
        let v = self.require(name)?;
        func(self.p, v)
    }

    /// An optional function name.
    pub fn optional_function(&mut self, name: &str) -> Result<Option<String>> {
        let p = self.p;
        self.attrs.take(name).map(|v| func(p, v)).transpose()
    }

    /// An optional string `"..."`.
    pub fn optional_string(&mut self, name: &str) -> Result<Option<String>> {
        let p = self.p;
        self.attrs
            .take(name)
            .map(|(v, pos)| match v {
                PValue::Str(s) => Ok(s),
                _ => Err(p.error(pos, "expected a string")),
            })
            .transpose()
    }

    /// A required list of function names `[@a, @b]`.
    pub fn functions(&mut self, name: &str) -> Result<Vec<String>> {
        let v = self.require(name)?;
        funcs(self.p, v)
    }

    /// A required integer.
    pub fn int<T: std::str::FromStr>(&mut self, name: &str) -> Result<T> {
        let v = self.require(name)?;
        int(self.p, v)
    }

    /// An optional integer.
    pub fn optional_int<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>> {
        let p = self.p;
        self.attrs.take(name).map(|v| int(p, v)).transpose()
    }

    /// A required tensor type such as `f32[3]`.
    pub fn tensor_type(&mut self, name: &str) -> Result<TensorType> {
        match self.require(name)? {
            (PValue::Type(ValueType::Tensor(t)), _) => Ok(t),
            (_, pos) => Err(self.p.error(pos, "expected a tensor type such as `f32[3]`")),
        }
    }
}

fn op_kind(p: &Parser<'_>, head: &str, at: Pos, attrs: RawAttrs) -> Result<NodeKind> {
    let mut map = AttrMap::new();
    for a in attrs.items {
        let msg = || format!("`{}` is not an op attribute value", a.name);
        let attr = to_attr(&a.value).ok_or_else(|| p.error(a.value_at, msg()))?;
        map.insert(a.name, attr)
            .map_err(|e| p.error(a.at, e.message))?;
    }
    let op =
        Op::from_name(head, &map).map_err(|e| p.error(at, format!("{}: {}", e.op, e.message)))?;
    Ok(NodeKind::Op(op))
}

fn int<T: std::str::FromStr>(p: &Parser<'_>, (v, pos): (PValue, Pos)) -> Result<T> {
    match &v {
        PValue::Num(s) => s
            .parse()
            .map_err(|_| p.error(pos, format!("expected an integer in range, found `{s}`"))),
        _ => Err(p.error(pos, "expected an integer")),
    }
}

fn func(p: &Parser<'_>, (v, pos): (PValue, Pos)) -> Result<String> {
    match v {
        PValue::Func(f) => Ok(f),
        _ => Err(p.error(pos, "expected a function name `@name`")),
    }
}

fn funcs(p: &Parser<'_>, (v, pos): (PValue, Pos)) -> Result<Vec<String>> {
    match v {
        PValue::List(items) => items.into_iter().map(|item| func(p, item)).collect(),
        _ => Err(p.error(pos, "expected a list of functions `[@a, @b]`")),
    }
}

/// A constant's elements, typed by its single output type (which must be a static tensor).
fn constant(
    p: &Parser<'_>,
    at: Pos,
    (v, pos): (PValue, Pos),
    outputs: &[ValueType],
) -> Result<Constant> {
    let [ValueType::Tensor(ty)] = outputs else {
        return Err(p.error(at, "const: expected one tensor output type"));
    };
    let PValue::List(items) = v else {
        return Err(p.error(pos, "expected a list of elements `[...]`"));
    };
    let tensor = crate::with_dtype!(ty.dtype, T, { elements::<T>(p, pos, &items, ty)? });
    Ok(Constant(tensor))
}

fn elements<T: crate::dtype::Element + std::str::FromStr>(
    p: &Parser<'_>,
    at: Pos,
    items: &[(PValue, Pos)],
    ty: &TensorType,
) -> Result<Tensor> {
    let mut data = Vec::with_capacity(items.len());
    for (v, pos) in items {
        let parsed = match v {
            PValue::Num(s) | PValue::Word(s) => s.parse::<T>().ok(),
            _ => None,
        };
        data.push(
            parsed.ok_or_else(|| {
                p.error(*pos, format!("expected an element of dtype {}", ty.dtype))
            })?,
        );
    }
    Tensor::from_vec(data, &ty.shape).map_err(|e| p.error(at, format!("const: {}", e.message)))
}
