//! The emitter's seam: how one op is written as MLIR (`Emitter`, `MlirValue`, the type and
//! literal printers, the shape helpers for implicit broadcasting), below the op table so that
//! each op's `OpDef::emit` sits beside its rule, kernel and gradient without the op table
//! depending on the module emitter (`mlir`), which lowers whole graphs and sits above it.

pub(crate) mod emitter;
mod scalar_form;
pub(crate) mod shapes;

pub use emitter::{
    element_type, float_literal, names_text, string_literal, type_text, types_text, Emitter,
    MlirValue, TypeText,
};
pub use scalar_form::{broadcast_sources, host_elements, ScalarForm, HOST_ELEMENTS};
pub use shapes::i64_array;

/// Choices in how a module is written (see `stacks.rs`); the defaults run on every target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmitOptions {
    /// Tensor stacks as `!util.list<?>`s of buffer views (O(1) per push in IREE) instead of
    /// growable buffers (which IREE copies on every trip).
    pub list_stacks: bool,
    /// Which branch results go through optimization barriers (`Terminator::BranchYield` in
    /// `control.rs`).
    pub yield_barriers: YieldBarriers,
    /// Loops of cheap ops run several iterations per trip of the `scf.while`: predicated, or
    /// exactly for countdown loops such as loop gradients (`control::while_loop::trips`); and
    /// an `If` of cheap branches runs both and selects (`control::if_else`). The form `gl.jit`
    /// tries first, with the plain one after it.
    pub unroll_loops: bool,
    /// Only `func` and `stablehlo` ops, as every StableHLO consumer reads (`mlir/pure.rs`):
    /// rank-0 values stay tensors, control flow is `stablehlo.while` / `if` / `case`, shapes
    /// are static, and what needs more (stacks) is a `Compile` error naming it.
    pub pure_stablehlo: bool,
}

/// Branch results that go through their own `stablehlo.optimization_barrier` (IREE 3.13 fails
/// or miscompiles some modules with each choice; see `py/gradloop/_workarounds.py`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum YieldBarriers {
    #[default]
    None,
    /// A tensor a branch yields twice, or one equal to another (not a constant).
    Repeats,
    /// Also a constant equal to another the branch yields (zero gradients).
    Constants,
    /// Every (statically shaped) tensor a branch yields.
    All,
}

impl YieldBarriers {
    pub fn name(self) -> &'static str {
        match self {
            YieldBarriers::None => "none",
            YieldBarriers::Repeats => "repeats",
            YieldBarriers::Constants => "constants",
            YieldBarriers::All => "all",
        }
    }

    pub fn from_name(name: &str) -> Option<YieldBarriers> {
        [Self::None, Self::Repeats, Self::Constants, Self::All]
            .into_iter()
            .find(|b| b.name() == name)
    }
}
