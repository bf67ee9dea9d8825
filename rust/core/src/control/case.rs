//! `Case`: `(index: i32[], operands...) -> results`, calling `branches[index](operands)`; an
//! index out of range, negative included, runs the last branch (`gl.switch_case`).
//!
//! - Type rule: an i32 scalar index, at least one branch; every branch takes the operands and
//!   returns the node's outputs.
//! - Gradient: the branch gradient of `control::branches`, a `Case` over backward functions.
//! - Interpretation: runs one branch. MLIR: `scf.index_switch` (`mlir::control`).

use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_branches;
use crate::graph::verify_nodes::scalar as scalar_type;
use crate::graph::{AttrReader, Case, Check, Library, NodeRule, ParseNode, ValueType};
use crate::interpret::nodes::scalar;
use crate::interpret::{Interpret, NodeRun};

impl NodeRule for Case {
    fn keyword(&self) -> &'static str {
        "case"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let names: Vec<String> = self
            .branches
            .iter()
            .map(|b| FuncName(b).to_string())
            .collect();
        vec![("branches", format!("[{}]", names.join(", ")))]
    }

    fn callees(&self) -> Vec<&str> {
        self.branches.iter().map(String::as_str).collect()
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let index = ins.first().ok_or("case needs an index input")?;
        scalar_type("branch index", index, DType::I32)?;
        if self.branches.is_empty() {
            return Err("case needs at least one branch".into());
        }
        let names: Vec<&String> = self.branches.iter().collect();
        let roles: Vec<String> = (0..names.len()).map(|i| format!("branch {i}")).collect();
        let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
        check_branches(library, &names, &roles, &ins[1..], outs)
    }

    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        match self.branches.last() {
            Some(f) => library.get(f)?.result_types(),
            None => Err(Error::new(
                ErrorKind::Graph,
                "case",
                "a case node needs a branch",
            )),
        }
    }
}

impl ParseNode for Case {
    const KEYWORDS: &'static [&'static str] = &["case"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(Case {
            branches: attrs.functions("branches")?,
        })
    }
}

impl Interpret for Case {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let (index, operands) = run.split_first()?;
        let index = scalar::<i32>(index, "case", "branch index")?;
        // Out of range, negative included, runs the last branch (the default).
        let last = run.callee_count().checked_sub(1).ok_or_else(|| {
            let msg = "a case node needs at least one branch";
            Error::new(ErrorKind::Graph, "case", msg)
        })?;
        let branch = usize::try_from(index).map_or(last, |i| i.min(last));
        let results = run.call_callee(branch, operands)?;
        Ok(run.store(results))
    }
}
