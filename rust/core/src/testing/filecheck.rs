//! A small FileCheck for golden tests of emitted text (LLVM's FileCheck, reduced to what the
//! MLIR tests need). Check lines, each optionally after `//`:
//!
//! - `CHECK: pattern`: the next line (after the previous match) that contains `pattern`;
//! - `CHECK-NEXT: pattern`: the line right after the previous match must contain it;
//! - `CHECK-NOT: pattern`: no line between the previous match and the next one contains it.
//!
//! In a pattern, `{{*}}` matches any run of characters within the line.

/// Whether `line` contains the parts of `pattern` (split at `{{*}}`) in order.
fn matches(line: &str, pattern: &str) -> bool {
    let mut rest = line;
    for part in pattern.split("{{*}}") {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

enum Check<'a> {
    Line(&'a str),
    Next(&'a str),
    Not(&'a str),
}

fn parse(checks: &str) -> Vec<Check<'_>> {
    checks
        .lines()
        .map(|l| l.trim().trim_start_matches("//").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            if let Some(p) = l.strip_prefix("CHECK-NEXT:") {
                Check::Next(p.trim())
            } else if let Some(p) = l.strip_prefix("CHECK-NOT:") {
                Check::Not(p.trim())
            } else if let Some(p) = l.strip_prefix("CHECK:") {
                Check::Line(p.trim())
            } else {
                panic!("not a check line: {l}")
            }
        })
        .collect()
}

/// Panics, showing `text`, unless it satisfies `checks` (see the module doc).
pub(crate) fn filecheck(text: &str, checks: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let mut next = 0; // first line the next CHECK may match
    let mut nots: Vec<&str> = Vec::new();
    let fail = |what: String| -> ! { panic!("FileCheck: {what}\n--- text ---\n{text}") };
    for check in parse(checks) {
        match check {
            Check::Not(p) => nots.push(p),
            Check::Line(p) => {
                let Some(i) = (next..lines.len()).find(|&i| matches(lines[i], p)) else {
                    fail(format!("CHECK: `{p}` not found after line {next}"));
                };
                if let Some(n) = nots
                    .iter()
                    .find(|n| lines[next..i].iter().any(|l| matches(l, n)))
                {
                    fail(format!("CHECK-NOT: `{n}` found before `{p}`"));
                }
                nots.clear();
                next = i + 1;
            }
            Check::Next(p) => {
                if next >= lines.len() || !matches(lines[next], p) {
                    let got = lines.get(next).copied().unwrap_or("<end of text>");
                    fail(format!("CHECK-NEXT: `{p}` is not on line {next}: `{got}`"));
                }
                next += 1;
            }
        }
    }
    if let Some(n) = nots
        .iter()
        .find(|n| lines[next..].iter().any(|l| matches(l, n)))
    {
        fail(format!("CHECK-NOT: `{n}` found after the last match"));
    }
}

#[test]
fn filecheck_matches_in_order() {
    let text = "a = 1\nb = foo(2)\nc = 3\n";
    filecheck(
        text,
        "CHECK: a = 1\nCHECK-NEXT: foo({{*}})\nCHECK-NOT: bar\nCHECK: c",
    );
    let r = std::panic::catch_unwind(|| filecheck(text, "CHECK: c\nCHECK: a"));
    assert!(r.is_err());
    let r = std::panic::catch_unwind(|| filecheck(text, "CHECK: a\nCHECK-NOT: foo\nCHECK: c"));
    assert!(r.is_err());
}
