//! The token cursor under the graph-text parser: peeking, expecting, errors at positions, and
//! the pieces every part of the syntax shares (types, numbers, function names).

use super::ir::ValueType;
use super::lexer::{error_at, tokenize, Pos, Tok};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Shape, TensorType, DYN};

/// Tokens of one text and the position reached.
pub(crate) struct Parser<'a> {
    src: &'a str,
    toks: Vec<(Tok, Pos)>,
    i: usize,
}

impl<'a> Parser<'a> {
    pub(crate) fn new(src: &'a str) -> Result<Self> {
        Ok(Parser {
            src,
            toks: tokenize(src)?,
            i: 0,
        })
    }

    pub(crate) fn peek(&self) -> &Tok {
        self.peek_at(0)
    }

    pub(crate) fn peek_at(&self, k: usize) -> &Tok {
        let last = self.toks.len().saturating_sub(1);
        self.toks
            .get((self.i + k).min(last))
            .map_or(&Tok::Eof, |(t, _)| t)
    }

    pub(crate) fn pos(&self) -> Pos {
        let last = self.toks.len().saturating_sub(1);
        self.toks
            .get(self.i.min(last))
            .map_or(Pos { line: 1, col: 1 }, |(_, p)| *p)
    }

    pub(crate) fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.i < self.toks.len() {
            self.i += 1;
        }
        t
    }

    pub(crate) fn error(&self, pos: Pos, message: impl std::fmt::Display) -> Error {
        error_at(self.src, pos, message)
    }

    /// An error at the current token: "expected X, found Y".
    pub(crate) fn expected(&self, what: &str) -> Error {
        self.error(
            self.pos(),
            format!("expected {what}, found {}", self.peek()),
        )
    }

    pub(crate) fn expect(&mut self, tok: &Tok, what: &str) -> Result<()> {
        if self.peek() != tok {
            return Err(self.expected(what));
        }
        self.next();
        Ok(())
    }

    pub(crate) fn punct(&mut self, p: &'static str) -> Result<()> {
        self.expect(&Tok::Punct(p), &format!("`{p}`"))
    }

    pub(crate) fn eat(&mut self, p: &'static str) -> bool {
        let found = self.peek() == &Tok::Punct(p);
        if found {
            self.next();
        }
        found
    }

    pub(crate) fn keyword(&mut self, kw: &str) -> Result<()> {
        self.expect(&Tok::Ident(kw.to_string()), &format!("`{kw}`"))
    }

    pub(crate) fn func_name(&mut self) -> Result<String> {
        match self.peek().clone() {
            Tok::Func(name) => {
                self.next();
                Ok(name)
            }
            _ => Err(self.expected("a function name `@name`")),
        }
    }

    /// A number token parsed as `T`.
    pub(crate) fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<T> {
        if let Tok::Number(s) = self.peek() {
            if let Ok(v) = s.parse::<T>() {
                self.next();
                return Ok(v);
            }
        }
        Err(self.expected(what))
    }

    /// `f32[2, ?]`.
    pub(crate) fn tensor_type(&mut self) -> Result<TensorType> {
        let dtype = match self.peek() {
            Tok::Ident(name) => DType::from_name(name).ok(),
            _ => None,
        };
        let Some(dtype) = dtype else {
            return Err(self.expected("a type such as `f32[2, 3]`"));
        };
        self.next();
        self.punct("[")?;
        let mut shape = Shape::new();
        while !self.eat("]") {
            if !shape.is_empty() {
                self.punct(",")?;
            }
            shape.push(if self.eat("?") {
                DYN
            } else {
                self.number("a dimension or `?`")?
            });
        }
        Ok(TensorType { dtype, shape })
    }

    /// A tensor type, `resource<T>` or `stack<T>`.
    pub(crate) fn value_type(&mut self) -> Result<ValueType> {
        let wrap: Option<fn(TensorType) -> ValueType> = match self.peek() {
            Tok::Ident(w) if w == "resource" => Some(ValueType::Resource),
            Tok::Ident(w) if w == "stack" => Some(ValueType::Stack),
            _ => None,
        };
        let Some(wrap) = wrap else {
            return Ok(ValueType::Tensor(self.tensor_type()?));
        };
        self.next();
        self.punct("<")?;
        let t = self.tensor_type()?;
        self.punct(">")?;
        Ok(wrap(t))
    }

    /// One type, or `(T, ...)`, each with its position.
    pub(crate) fn types(&mut self) -> Result<Vec<(ValueType, Pos)>> {
        if !self.eat("(") {
            let pos = self.pos();
            return Ok(vec![(self.value_type()?, pos)]);
        }
        let mut out = Vec::new();
        while !self.eat(")") {
            if !out.is_empty() {
                self.punct(",")?;
            }
            let pos = self.pos();
            out.push((self.value_type()?, pos));
        }
        Ok(out)
    }
}
