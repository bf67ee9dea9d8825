//! A character cursor over MLIR text: whitespace and comments, punctuation, identifiers, string
//! and number literals, and raw balanced text (for the attributes and types the importer reads
//! only when it needs them). Errors give the line and column reached.

use crate::error::{Error, ErrorKind, Result};

/// Where a parse is in `src` (a byte offset at a character boundary).
pub(crate) struct Cursor<'a> {
    src: &'a str,
    pos: usize,
}

/// Characters an identifier may continue with (MLIR's `bare-id` and `suffix-id`).
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_$.-".contains(c)
}

impl<'a> Cursor<'a> {
    pub fn new(src: &'a str) -> Self {
        Cursor { src, pos: 0 }
    }

    /// The byte offset reached.
    pub fn pos(&self) -> usize {
        self.pos
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    /// Skips whitespace and `//` comments.
    pub fn skip_ws(&mut self) {
        loop {
            let rest = self.rest();
            let trimmed = rest.trim_start();
            self.pos += rest.len() - trimmed.len();
            if trimmed.starts_with("//") {
                self.pos += trimmed.find('\n').unwrap_or(trimmed.len());
            } else {
                return;
            }
        }
    }

    /// The next character after whitespace, not consumed.
    pub fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.rest().chars().next()
    }

    /// Whether the text after whitespace starts with `s` (not consumed).
    pub fn at(&mut self, s: &str) -> bool {
        self.skip_ws();
        self.rest().starts_with(s)
    }

    pub fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos >= self.src.len()
    }

    /// Consumes `s` if the text continues with it.
    pub fn eat(&mut self, s: &str) -> bool {
        if self.at(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Consumes the keyword `w` if the text continues with it as a whole word.
    pub fn eat_word(&mut self, w: &str) -> bool {
        let whole = self.at(w) && !self.rest()[w.len()..].starts_with(id_char);
        if whole {
            self.pos += w.len();
        }
        whole
    }

    pub fn expect(&mut self, s: &str) -> Result<()> {
        if self.eat(s) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{s}`")))
        }
    }

    /// An identifier (`sym_name`, `tensor`, `stablehlo.dot`): letters, digits and `_$.-`.
    pub fn ident(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let rest = self.rest();
        let first_ok = rest
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok {
            return Err(self.error("expected an identifier"));
        }
        let len = rest.find(|c: char| !id_char(c)).unwrap_or(rest.len());
        self.pos += len;
        Ok(&rest[..len])
    }

    /// A name with a sigil: `%17`, `%arg0`, `^bb0`, `@main` (the sigil included). A quoted
    /// symbol `@"a b"` is returned as `@a b`.
    pub fn sigil_name(&mut self, sigil: char) -> Result<String> {
        self.skip_ws();
        if !self.rest().starts_with(sigil) {
            return Err(self.error(format!("expected a `{sigil}` name")));
        }
        self.pos += 1;
        if self.rest().starts_with('"') {
            return Ok(format!("{sigil}{}", self.string()?));
        }
        let rest = self.rest();
        let len = rest.find(|c: char| !id_char(c)).unwrap_or(rest.len());
        if len == 0 {
            return Err(self.error(format!("expected a name after `{sigil}`")));
        }
        self.pos += len;
        Ok(format!("{sigil}{}", &rest[..len]))
    }

    /// A string literal with MLIR's escapes (`\"`, `\\`, `\n`, `\t` and `\XX` hex bytes).
    pub fn string(&mut self) -> Result<String> {
        self.expect("\"")?;
        let mut bytes = Vec::new();
        let src = self.src.as_bytes();
        while let Some(&b) = src.get(self.pos) {
            self.pos += 1;
            match b {
                b'"' => return Ok(String::from_utf8_lossy(&bytes).into_owned()),
                b'\\' => {
                    let Some(&e) = src.get(self.pos) else { break };
                    self.pos += 1;
                    match e {
                        b'n' => bytes.push(b'\n'),
                        b't' => bytes.push(b'\t'),
                        b'"' | b'\\' => bytes.push(e),
                        _ => {
                            let hex = self.src.get(self.pos - 1..self.pos + 1).unwrap_or("");
                            let v = u8::from_str_radix(hex, 16)
                                .map_err(|_| self.error("bad escape in a string"))?;
                            self.pos += 1;
                            bytes.push(v);
                        }
                    }
                }
                _ => bytes.push(b),
            }
        }
        Err(self.error("unterminated string"))
    }

    /// A number literal as written: `-3`, `1.5e-07`, `0x7FC00000`.
    pub fn number(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let rest = self.rest();
        let body = rest.strip_prefix('-').unwrap_or(rest);
        let len = if let Some(hex) = body.strip_prefix("0x") {
            2 + hex
                .find(|c: char| !c.is_ascii_hexdigit())
                .unwrap_or(hex.len())
        } else {
            let mut end = body
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(body.len());
            if body[end..].starts_with('.') {
                end += 1 + body[end + 1..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(body.len() - end - 1);
            }
            let exp = &body[end..];
            if exp.starts_with(['e', 'E']) {
                let signed = exp[1..].strip_prefix(['+', '-']).unwrap_or(&exp[1..]);
                let digits = signed
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(signed.len());
                end += exp.len() - signed.len() + digits;
            }
            end
        };
        if len == 0 || !body.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(self.error("expected a number"));
        }
        let total = rest.len() - body.len() + len;
        self.pos += total;
        Ok(&rest[..total])
    }

    /// Raw text up to (not including) the first of `stops` outside brackets and strings;
    /// `(`/`[`/`{`/`<` nest (the `>` of `->` does not close anything).
    pub fn balanced(&mut self, stops: &[char]) -> Result<&'a str> {
        self.skip_ws();
        let start = self.pos;
        let mut depth = 0usize;
        let mut prev = ' ';
        let mut chars = self.rest().char_indices().peekable();
        let mut in_string = false;
        while let Some((i, c)) = chars.next() {
            if in_string {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => in_string = false,
                    _ => {}
                }
                prev = c;
                continue;
            }
            if depth == 0 && stops.contains(&c) && !(c == '>' && prev == '-') {
                self.pos = start + i;
                return Ok(self.src[start..self.pos].trim_end());
            }
            match c {
                '"' => in_string = true,
                '(' | '[' | '{' | '<' => depth += 1,
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                '>' if prev != '-' => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
        Err(self.error(format!("unbalanced text: expected one of {stops:?}")))
    }

    /// A `Compile` error at the current position (line:column of the text being read).
    pub fn error(&self, message: impl std::fmt::Display) -> Error {
        let before = &self.src[..self.pos.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        Error::new(
            ErrorKind::Compile,
            "mlir import",
            format!("generic MLIR text, line {line} column {col}: {message}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_names_and_balanced_text() {
        let mut c = Cursor::new("  // note\n %17:3 = \"a\\22b\" -1.5e+01 0x7FC00000 12x");
        assert_eq!(c.sigil_name('%').unwrap(), "%17");
        c.expect(":").unwrap();
        assert_eq!(c.number().unwrap(), "3");
        c.expect("=").unwrap();
        assert_eq!(c.string().unwrap(), "a\"b");
        assert_eq!(c.number().unwrap(), "-1.5e+01");
        assert_eq!(c.number().unwrap(), "0x7FC00000");
        assert_eq!(c.number().unwrap(), "12");
        assert_eq!(c.ident().unwrap(), "x");
        assert!(c.at_end());
        let mut c = Cursor::new("#a<(x) -> y, [1, 2]>, next}");
        assert_eq!(c.balanced(&[',', '}']).unwrap(), "#a<(x) -> y, [1, 2]>");
        let err = Cursor::new("\n  ?").number().unwrap_err();
        assert!(err.message.contains("line 2 column 3"), "{err}");
    }
}
