//! Control flow as a table: one module per construct, each implementing every layer's trait
//! for it, the way `ops::OpDef` holds an op's rule, kernel, gradient and emission together.
//!
//! | construct | node kind | module |
//! |---|---|---|
//! | `gl.cond` | `If` | `if_else` |
//! | `gl.switch_case` | `Case` | `case` |
//! | `gl.while_loop` | `While` | `while_loop` |
//! | function calls, `custom_gradient` | `Call` | `call` |
//! | `gl.Variable` reads and writes | `Variable(VariableOp)` | `variables` |
//! | loop-gradient stacks | `Stack(StackOp)` | `stacks` |
//!
//! The node kinds are plain data in `graph::constructs`; each layer defines the trait it needs
//! and dispatches through one exhaustive match over `NodeKind`, so a construct missing an
//! implementation does not compile:
//!
//! - `graph::NodeRule` + `graph::ParseNode`: text keyword and attributes, callees, type rule;
//! - `interpret::Interpret`: running a node in the reference interpreter;
//!
//! `Construct` names them together; `every_construct_is_complete` checks each kind against it.
//!
//! Adding a construct: its data in `graph::constructs` and a `NodeKind` variant, one module
//! here implementing `Construct`, and the variant in each layer's match (the compiler lists
//! them).

mod call;
mod case;
mod if_else;
mod stacks;
mod variables;
mod while_loop;

use crate::graph::{NodeRule, ParseNode};
use crate::interpret::Interpret;

/// Everything a construct implements, one trait per layer.
pub trait Construct: NodeRule + ParseNode + Interpret {}

impl<T: NodeRule + ParseNode + Interpret> Construct for T {}

#[cfg(test)]
mod tests {
    use super::Construct;
    use crate::graph::{Call, Case, If, StackOp, VariableOp, While};

    #[test]
    fn every_construct_is_complete() {
        fn complete<C: Construct>() {}
        complete::<If>();
        complete::<Case>();
        complete::<While>();
        complete::<Call>();
        complete::<VariableOp>();
        complete::<StackOp>();
    }
}
