//! `If`: `(pred: bool[], operands...) -> results`, calling `then_branch(operands)` when the
//! predicate holds and `else_branch(operands)` otherwise (`gl.cond`).
//!
//! - Type rule: a bool scalar predicate; both branches take the operands and return the
//!   node's outputs, agreeing with each other.
//! - Gradient: the branch gradient of `control::branches` (each branch replayed into a forward
//!   function that also returns its residuals, an `If` over the backward functions).
//! - Interpretation: runs one branch. MLIR: `scf.if` (`mlir::control`).

use crate::dtype::DType;
use crate::error::Result;
use crate::graph::text::FuncName;
use crate::graph::verify_nodes::check_branches;
use crate::graph::verify_nodes::scalar as scalar_type;
use crate::graph::{AttrReader, Check, If, Library, NodeRule, ParseNode, ValueType};
use crate::interpret::nodes::scalar;
use crate::interpret::{Interpret, NodeRun};

impl NodeRule for If {
    fn keyword(&self) -> &'static str {
        "if"
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("then", FuncName(&self.then_branch).to_string()),
            ("else", FuncName(&self.else_branch).to_string()),
        ]
    }

    fn callees(&self) -> Vec<&str> {
        vec![&self.then_branch, &self.else_branch]
    }

    fn check(&self, library: &Library, ins: &[&ValueType], outs: &[&ValueType]) -> Check {
        let pred = ins.first().ok_or("if needs a predicate input")?;
        scalar_type("predicate", pred, DType::Bool)?;
        let names = [&self.then_branch, &self.else_branch];
        let roles = ["then branch", "else branch"];
        check_branches(library, &names, &roles, &ins[1..], outs)
    }

    fn output_types(&self, library: &Library, _ins: &[&ValueType]) -> Result<Vec<ValueType>> {
        library.get(&self.then_branch)?.result_types()
    }
}

impl ParseNode for If {
    const KEYWORDS: &'static [&'static str] = &["if"];

    fn parse(_keyword: &str, attrs: &mut AttrReader<'_, '_>) -> Result<Self> {
        Ok(If {
            then_branch: attrs.function("then")?,
            else_branch: attrs.function("else")?,
        })
    }
}

impl Interpret for If {
    fn interpret(&self, run: &mut NodeRun<'_, '_>) -> Result<usize> {
        let (pred, operands) = run.split_first()?;
        let pred = scalar::<bool>(pred, "if", "predicate")?;
        let results = run.call_callee(usize::from(!pred), operands)?;
        Ok(run.store(results))
    }
}
