//! Tokens of graph text, each with its line and column (1-based) for error messages.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `%name`: a value.
    Value(String),
    /// `@name` or `@"name"`: a function.
    Func(String),
    /// A bare word: keywords, op names, dtypes, `true`, `NaN`, `inf`.
    Ident(String),
    /// A number as written (`3`, `-0.5`, `1e-7`, `-inf`); converted where its type is known.
    Number(String),
    Str(String),
    /// One of `( ) [ ] { } < > , = : ? #` or `->`.
    Punct(&'static str),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Value(v) => write!(f, "`%{v}`"),
            Tok::Func(v) => write!(f, "`@{v}`"),
            Tok::Ident(v) | Tok::Number(v) => write!(f, "`{v}`"),
            Tok::Str(v) => write!(f, "string {v:?}"),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

/// A position in the text (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A parse error at `pos`, quoting the line with a caret under the column.
pub(crate) fn error_at(src: &str, pos: Pos, message: impl fmt::Display) -> Error {
    let line = src.lines().nth(pos.line.saturating_sub(1)).unwrap_or("");
    let caret = " ".repeat(pos.col.saturating_sub(1));
    Error::new(
        ErrorKind::Graph,
        "parse",
        format!(
            "line {}, column {}: {message}\n  {line}\n  {caret}^",
            pos.line, pos.col
        ),
    )
}

const PUNCT: &[&str] = &[
    "->", "(", ")", "[", "]", "{", "}", "<", ">", ",", "=", ":", "?", "#",
];

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$')
}

struct Lexer {
    chars: Vec<char>,
    i: usize,
    pos: Pos,
}

/// Splits `src` into tokens; `//` starts a comment to the end of the line (for hand-written
/// text; the printer writes none).
pub(crate) fn tokenize(src: &str) -> Result<Vec<(Tok, Pos)>> {
    let mut lx = Lexer {
        chars: src.chars().collect(),
        i: 0,
        pos: Pos { line: 1, col: 1 },
    };
    let mut out = Vec::new();
    loop {
        lx.skip_space();
        let pos = lx.pos;
        let Some(c) = lx.peek(0) else {
            out.push((Tok::Eof, pos));
            return Ok(out);
        };
        let tok = lx.token(c).map_err(|m| error_at(src, pos, m))?;
        out.push((tok, pos));
    }
}

impl Lexer {
    fn peek(&self, k: usize) -> Option<char> {
        self.chars.get(self.i + k).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.i += 1;
        if c == '\n' {
            self.pos.line += 1;
            self.pos.col = 1;
        } else {
            self.pos.col += 1;
        }
        Some(c)
    }

    fn skip_space(&mut self) {
        loop {
            if self.peek(0).is_some_and(char::is_whitespace) {
                self.bump();
            } else if self.peek(0) == Some('/') && self.peek(1) == Some('/') {
                while self.peek(0).is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else {
                return;
            }
        }
    }

    fn word(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek(0).filter(|&c| is_word(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn token(&mut self, c: char) -> Result<Tok, String> {
        match c {
            '%' => {
                self.bump();
                let name = self.word();
                if name.is_empty() {
                    return Err("expected a value name after `%`".into());
                }
                Ok(Tok::Value(name))
            }
            '@' => {
                self.bump();
                let name = if self.peek(0) == Some('"') {
                    self.string()?
                } else {
                    self.word()
                };
                if name.is_empty() {
                    return Err("expected a function name after `@`".into());
                }
                Ok(Tok::Func(name))
            }
            '"' => Ok(Tok::Str(self.string()?)),
            '-' if self.peek(1) != Some('>') => Ok(Tok::Number(self.number())),
            c if c.is_ascii_digit() => Ok(Tok::Number(self.number())),
            c if c.is_ascii_alphabetic() || c == '_' => Ok(Tok::Ident(self.word())),
            _ => self.punct(),
        }
    }

    /// A number: `-`? then digits, `.`, exponents (`1e-7`), or a word (`-inf`).
    fn number(&mut self) -> String {
        let mut s = String::new();
        if self.peek(0) == Some('-') {
            s.push('-');
            self.bump();
        }
        while let Some(c) = self.peek(0) {
            let exp_sign = matches!(c, '+' | '-') && matches!(s.chars().last(), Some('e' | 'E'));
            if !(is_word(c) || exp_sign) {
                break;
            }
            s.push(c);
            self.bump();
        }
        s
    }

    fn punct(&mut self) -> Result<Tok, String> {
        for p in PUNCT {
            if p.chars().enumerate().all(|(k, c)| self.peek(k) == Some(c)) {
                for _ in 0..p.len() {
                    self.bump();
                }
                return Ok(Tok::Punct(p));
            }
        }
        let c = self.peek(0).unwrap_or(' ');
        Err(format!("unexpected character {c:?}"))
    }

    /// A `"..."` literal with the escapes `Quoted` writes.
    fn string(&mut self) -> Result<String, String> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.bump() {
                None => return Err("unterminated string".into()),
                Some('"') => return Ok(s),
                Some('\\') => s.push(self.escape()?),
                Some(c) => s.push(c),
            }
        }
    }

    fn escape(&mut self) -> Result<char, String> {
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('t') => Ok('\t'),
            Some('r') => Ok('\r'),
            Some(c @ ('"' | '\\')) => Ok(c),
            Some('u') if self.peek(0) == Some('{') => {
                self.bump();
                let mut hex = String::new();
                while let Some(c) = self.bump().filter(|&c| c != '}') {
                    hex.push(c);
                }
                u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("bad unicode escape \\u{{{hex}}}"))
            }
            other => Err(format!("unknown escape \\{}", other.unwrap_or(' '))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_positions() {
        let toks = tokenize("%a#1 = f32[?]\n  @\"x y\" -> -1.5e-3 -inf").unwrap();
        let kinds: Vec<Tok> = toks.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Tok::Value("a".into()),
                Tok::Punct("#"),
                Tok::Number("1".into()),
                Tok::Punct("="),
                Tok::Ident("f32".into()),
                Tok::Punct("["),
                Tok::Punct("?"),
                Tok::Punct("]"),
                Tok::Func("x y".into()),
                Tok::Punct("->"),
                Tok::Number("-1.5e-3".into()),
                Tok::Number("-inf".into()),
                Tok::Eof,
            ]
        );
        assert_eq!(toks[8].1, Pos { line: 2, col: 3 });
        let err = tokenize("a\n  ;").unwrap_err();
        assert!(
            err.message
                .starts_with("line 2, column 3: unexpected character ';'"),
            "{err}"
        );
    }
}
