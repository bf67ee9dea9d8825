//! The op table: every primitive op defined once — shape/dtype rule, CPU kernel, gradient rule —
//! and listed once in `op_table!`, which generates the closed `Op` enum and its dispatch.
//!
//! Adding an op: implement `OpDef` for a struct holding its attributes (in the file of its
//! family) and state them with `op_attrs!` beside the struct (graph text prints and parses ops
//! through it), then add one line to `op_table!` below. Eager execution, tracing, the tape and
//! the MLIR emitter all go through `Op`, so nothing else needs a list of ops.
//!
//! Attributes are stored normalised (absolute, sorted axes; explicit shapes): the builder
//! functions in `build` do that once, so rules and kernels never re-validate user input.

use smallvec::SmallVec;
use std::fmt;

use crate::dtype::DType;
use crate::emit::{Emitter, MlirValue, ScalarForm};
use crate::error::{Error, ErrorKind, Result};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::value::Value;
use attrs::{Attr, AttrMap, OpAttrs};
pub use context::{execute, Context, EagerContext};
pub use dest::{through_compute, DestKernel, GatherTable};

pub mod attrs;
pub mod batching;
pub mod binary;
pub mod binary_math;
pub mod build;
pub mod concat;
pub mod context;
pub mod creation;
pub mod dest;
pub mod factor;
pub mod gather;
pub mod index;
mod index_batching;
pub mod indexing;
pub mod kernels;
pub mod lanes;
pub mod layout;
pub mod matmul;
pub mod matvec;
pub mod pack;
pub mod parallel;
pub mod permute;
pub mod reduce;
pub mod rules;
pub mod slicing;
pub mod special;
pub mod tangents;
pub mod tiles;
pub mod unary;
pub mod unary_math;
mod wide_trig;

/// Output types of a shape rule (most ops have one output: no allocation).
pub type Types = SmallVec<[TensorType; 1]>;
/// Values produced by an op.
pub type Values<V> = SmallVec<[V; 1]>;
/// Input gradients returned by a gradient rule: `None` where an input gets no gradient.
pub type Grads<V> = SmallVec<[Option<V>; 2]>;
/// Output tangents returned by a tangent rule: `None` where an output's tangent is zero or it
/// has none (an integer or bool output).
pub type Tangents<V> = SmallVec<[Option<V>; 1]>;

/// Which forward values an op's gradient keeps (bit `i` = input/output `i`). Types of all
/// inputs and outputs are always kept: they are small and rules need shapes to unbroadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saves {
    /// The op has no gradient; the reason is shown when someone asks for one.
    NotDifferentiable(&'static str),
    Values {
        inputs: u32,
        outputs: u32,
    },
}

impl Saves {
    pub const NOTHING: Saves = Saves::Values {
        inputs: 0,
        outputs: 0,
    };
    pub const INPUTS: Saves = Saves::Values {
        inputs: u32::MAX,
        outputs: 0,
    };
    pub const OUTPUT: Saves = Saves::Values {
        inputs: 0,
        outputs: 1,
    };

    pub fn inputs(mask: u32) -> Saves {
        Saves::Values {
            inputs: mask,
            outputs: 0,
        }
    }
}

/// What a gradient rule sees of its forward op: attributes live on the op itself; this holds
/// the types of every input and output and only the values `saves()` asked for.
#[derive(Clone, Debug)]
pub struct Saved<V> {
    pub input_types: SmallVec<[TensorType; 2]>,
    pub output_types: Types,
    inputs: SmallVec<[Option<V>; 2]>,
    outputs: SmallVec<[Option<V>; 1]>,
}

impl<V: Value> Saved<V> {
    /// Keeps from `inputs`/`outputs` what `saves` names.
    pub fn capture(saves: Saves, inputs: &[V], outputs: &[V]) -> Saved<V> {
        let (im, om) = match saves {
            Saves::NotDifferentiable(_) => (0, 0),
            Saves::Values { inputs, outputs } => (inputs, outputs),
        };
        let keep = |mask: u32, i: usize, v: &V| (i < 32 && mask & (1 << i) != 0).then(|| v.clone());
        Saved {
            input_types: inputs.iter().map(|v| v.ty().clone()).collect(),
            output_types: outputs.iter().map(|v| v.ty().clone()).collect(),
            inputs: inputs
                .iter()
                .enumerate()
                .map(|(i, v)| keep(im, i, v))
                .collect(),
            outputs: outputs
                .iter()
                .enumerate()
                .map(|(i, v)| keep(om, i, v))
                .collect(),
        }
    }

    /// Saved input `i`; asking for one the op did not save is a bug in its rule.
    pub fn input(&self, i: usize) -> Result<&V> {
        self.inputs.get(i).and_then(Option::as_ref).ok_or_else(|| {
            Error::internal(
                "gradient",
                format!("input {i} was not saved by the forward op"),
            )
        })
    }

    pub fn output(&self, i: usize) -> Result<&V> {
        self.outputs.get(i).and_then(Option::as_ref).ok_or_else(|| {
            Error::internal(
                "gradient",
                format!("output {i} was not saved by the forward op"),
            )
        })
    }
}

/// One primitive op. Implemented by a struct holding the op's (normalised) attributes; the
/// `OpAttrs` bound (written with `op_attrs!` beside the struct) makes every op printable.
pub trait OpDef: Clone + fmt::Debug + PartialEq + Into<Op> + OpAttrs {
    /// The op's name in errors, graph text and MLIR locations (declared once, by `op_attrs!`).
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// Shape and dtype rule: validates the inputs and gives the output types.
    fn infer(&self, inputs: &[TensorType]) -> Result<Types>;

    /// CPU kernel. `outputs` is what `infer` returned for these inputs.
    fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>>;

    /// `compute` on inputs the caller gives up: an elementwise op writes into an input that
    /// holds its buffer alone and has the output's type, instead of allocating (what the
    /// executor does with values at their last use). `inputs` may be left changed.
    fn compute_owned(
        &self,
        inputs: &mut Vec<Tensor>,
        outputs: &[TensorType],
    ) -> Result<Values<Tensor>> {
        self.compute(inputs, outputs)
    }

    /// A kernel for inputs and outputs of exactly these static types that writes into buffers
    /// the caller owns (`dest`), computing what `compute` does bit for bit; `None` (the
    /// default) where the op has no such form, and a compiled frame keeps its interpreted
    /// program.
    fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
        let _ = (inputs, outputs);
        None
    }

    /// Whether the output holds the input's elements unchanged and in order (a reshape, a
    /// rename): a compiled frame moves or copies the input's buffer instead of calling a kernel.
    fn same_elements(&self) -> bool {
        false
    }

    /// An estimate of the kernel's work on inputs and outputs of these shapes, in elements
    /// (or multiply-adds): what an executor weighs to decide whether a node is worth another
    /// thread. By default every input element is read once. `outputs` is empty when unknown.
    fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
        let _ = outputs;
        inputs.iter().map(|s| s.iter().product::<usize>()).sum()
    }

    /// What the gradient rule needs from the forward pass.
    fn saves(&self) -> Saves;

    /// MLIR emission: writes the op's StableHLO into `e` on `inputs` (SSA values typed as the
    /// inputs `infer` saw) and returns its values, typed `outputs` (what `infer` gave). The
    /// shape rule broadcasts implicitly; emission makes it explicit (`Emitter::broadcast_*`).
    /// An op or form with no StableHLO lowering returns `e.unsupported(..)`: a `Compile`
    /// error naming the op (the emitter adds the node and source line).
    fn emit(
        &self,
        e: &mut Emitter,
        inputs: &[MlirValue],
        outputs: &[TensorType],
    ) -> Result<Values<MlirValue>>;

    /// The op on rank-0 operands of `dtype` as host scalars (`ScalarForm`), where a form with
    /// exactly its semantics exists; None (the default) emits its StableHLO on rank-0 tensors.
    fn scalar(&self, dtype: DType) -> Option<ScalarForm> {
        let _ = dtype;
        None
    }

    /// For an op whose kernel on `dtype` is a `Lanes` map of its one input: that map as plain
    /// functions (`LaneMap`), which machine code calls directly. None (the default): not such
    /// an op.
    fn lane_map(&self, dtype: DType) -> Option<lanes::LaneMap> {
        let _ = dtype;
        None
    }

    /// For an op that only moves elements (a slice, a pad, a concatenation, a broadcast):
    /// where each element of the output comes from, as its gather kernel reads it. The MLIR
    /// emitter moves small tensors held as host scalars with it (`mlir/scalar.rs`). None (the
    /// default): not such an op, or shapes too large for a table.
    fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
        let _ = (inputs, output);
        None
    }

    /// For a reduction: the op on two host scalars of `dtype` that folds its elements (`Add`'s
    /// form for a sum), and the axes it folds. None (the default): not a reduction.
    fn fold(&self, dtype: DType) -> Option<(ScalarForm, &[usize])> {
        let _ = dtype;
        None
    }

    /// Input gradients from output gradients, built through `ctx` (so they run eagerly, trace
    /// into a graph, and are recorded by outer tapes for higher order). `grads[i]` is `None`
    /// when output `i` received no gradient; rules make their own zeros when they need them.
    /// `needs[i]` is false for inputs nobody watches: their gradient may be skipped.
    fn gradient<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        saved: &Saved<V>,
        grads: &[Option<V>],
        needs: &[bool],
    ) -> Result<Grads<V>>;

    /// Output tangents from input tangents (forward mode), built through `ctx` like the
    /// gradient (so they run eagerly, trace, and are recorded by tapes and outer accumulators
    /// for higher order). A rule of its own, beside the gradient: nothing is transposed.
    /// `tangents[i]` is `None` for an input with no tangent (not perturbed, or not float); at
    /// least one is `Some`. `inputs` and `outputs` are the op's own values.
    fn tangent<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        outputs: &[V],
        tangents: &[Option<V>],
    ) -> Result<Tangents<V>>;

    /// Batching (`vmap`): the op over every lane at once. `inputs` hold lanes along axis 0
    /// where `batched` says so (at least one does; the others are the same in every lane); the
    /// outputs hold lanes along axis 0. Built through `ctx` from ops of the table, like the
    /// gradient, so batched programs run eagerly, trace, and are differentiated alike
    /// (`batching` holds the rules op families share).
    fn batch<V: Value>(
        &self,
        ctx: &mut dyn Context<V>,
        inputs: &[V],
        batched: &[bool],
    ) -> Result<Values<V>>;
}

/// The work of an op that writes its outputs from as many input elements (a slice, a
/// gather, a reshape): the outputs' size, or the inputs' when the outputs are unknown.
pub fn output_work(inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
    let size = |shapes: &[&[usize]]| shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    if outputs.is_empty() {
        size(inputs)
    } else {
        size(outputs)
    }
}

/// Checks the number of inputs an op received.
pub fn expect_arity(op: &'static str, inputs: &[TensorType], n: usize) -> Result<()> {
    if inputs.len() != n {
        return Err(Error::invalid(
            op,
            format!("expected {n} inputs, got {}", inputs.len()),
        ));
    }
    Ok(())
}

/// Error for a rule asked for the gradient of an op that has none.
pub fn not_differentiable<V>(op: &'static str, reason: &str) -> Result<Grads<V>> {
    Err(Error::gradient(
        op,
        format!("{op} is not differentiable: {reason}"),
    ))
}

macro_rules! op_table {
    ($( $variant:ident($ty:ty) ),* $(,)?) => {
        /// Every primitive op, with its attributes. Closed: a pass that matches on it without a
        /// catch-all arm stops compiling when an op is added.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Op { $( $variant($ty), )* }

        /// The op without its attributes (a key for registries and statistics).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum OpKind { $( $variant, )* }

        impl OpKind {
            pub const ALL: &'static [OpKind] = &[$( OpKind::$variant, )*];

            /// The op's name in graph text (its `OpDef::name`).
            pub fn name(self) -> &'static str {
                match self { $( OpKind::$variant => <$ty as OpAttrs>::NAME, )* }
            }
        }

        impl Op {
            pub fn kind(&self) -> OpKind {
                match self { $( Op::$variant(_) => OpKind::$variant, )* }
            }
            pub fn name(&self) -> &'static str {
                match self { $( Op::$variant(o) => o.name(), )* }
            }
            /// The op's attributes, in field order (with `name`, what graph text prints).
            pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
                match self { $( Op::$variant(o) => o.attrs(), )* }
            }
            /// The op called `name` with `attrs` (what graph text parses); an unknown name or
            /// bad attributes are `Graph` errors.
            pub fn from_name(name: &str, attrs: &AttrMap) -> Result<Op> {
                $( if name == <$ty as OpAttrs>::NAME {
                    return Ok(Op::$variant(<$ty as OpAttrs>::from_attrs(attrs)?));
                } )*
                Err(Error::new(ErrorKind::Graph, "op", format!("unknown op `{name}`")))
            }
            pub fn infer(&self, inputs: &[TensorType]) -> Result<Types> {
                match self { $( Op::$variant(o) => o.infer(inputs), )* }
            }
            pub fn compute(&self, inputs: &[Tensor], outputs: &[TensorType]) -> Result<Values<Tensor>> {
                let result = match self { $( Op::$variant(o) => o.compute(inputs, outputs), )* };
                crate::memory::checked(self.name(), result)
            }
            pub fn work(&self, inputs: &[&[usize]], outputs: &[&[usize]]) -> usize {
                match self { $( Op::$variant(o) => o.work(inputs, outputs), )* }
            }
            pub fn compute_owned(&self, inputs: &mut Vec<Tensor>, outputs: &[TensorType]) -> Result<Values<Tensor>> {
                for ty in outputs {
                    crate::tensor::check_allocation(self.name(), ty)?;
                }
                let result = match self { $( Op::$variant(o) => o.compute_owned(inputs, outputs), )* };
                crate::memory::checked(self.name(), result)
            }
            pub fn kernel_into(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<DestKernel> {
                match self { $( Op::$variant(o) => o.kernel_into(inputs, outputs), )* }
            }
            pub fn same_elements(&self) -> bool {
                match self { $( Op::$variant(o) => o.same_elements(), )* }
            }
            pub fn saves(&self) -> Saves {
                match self { $( Op::$variant(o) => o.saves(), )* }
            }
            pub fn emit(&self, e: &mut Emitter, inputs: &[MlirValue], outputs: &[TensorType]) -> Result<Values<MlirValue>> {
                match self { $( Op::$variant(o) => o.emit(e, inputs, outputs), )* }
            }
            pub fn scalar(&self, dtype: DType) -> Option<ScalarForm> {
                match self { $( Op::$variant(o) => o.scalar(dtype), )* }
            }
            pub fn lane_map(&self, dtype: DType) -> Option<lanes::LaneMap> {
                match self { $( Op::$variant(o) => o.lane_map(dtype), )* }
            }
            pub fn gather_table(&self, inputs: &[TensorType], output: &TensorType) -> Option<GatherTable> {
                match self { $( Op::$variant(o) => o.gather_table(inputs, output), )* }
            }
            pub fn fold(&self, dtype: DType) -> Option<(ScalarForm, &[usize])> {
                match self { $( Op::$variant(o) => o.fold(dtype), )* }
            }
            pub fn gradient<V: Value>(
                &self,
                ctx: &mut dyn Context<V>,
                saved: &Saved<V>,
                grads: &[Option<V>],
                needs: &[bool],
            ) -> Result<Grads<V>> {
                match self { $( Op::$variant(o) => o.gradient(ctx, saved, grads, needs), )* }
            }
            pub fn tangent<V: Value>(
                &self,
                ctx: &mut dyn Context<V>,
                inputs: &[V],
                outputs: &[V],
                tangents: &[Option<V>],
            ) -> Result<Tangents<V>> {
                match self { $( Op::$variant(o) => o.tangent(ctx, inputs, outputs, tangents), )* }
            }
            pub fn batch<V: Value>(
                &self,
                ctx: &mut dyn Context<V>,
                inputs: &[V],
                batched: &[bool],
            ) -> Result<Values<V>> {
                match self { $( Op::$variant(o) => o.batch(ctx, inputs, batched), )* }
            }
        }

        $( impl From<$ty> for Op { fn from(o: $ty) -> Op { Op::$variant(o) } } )*
    };
}

op_table! {
    // creation
    Fill(creation::Fill),
    FillLike(creation::FillLike),
    Arange(creation::Arange),
    StopGradient(creation::StopGradient),
    Identity(creation::Identity),
    Cast(creation::Cast),
    BitcastConvert(creation::BitcastConvert),
    // unary elementwise
    Neg(unary::Neg),
    Exp(unary::Exp),
    Log(unary::Log),
    Sin(unary::Sin),
    Cos(unary::Cos),
    Tanh(unary::Tanh),
    Sigmoid(unary::Sigmoid),
    Relu(unary::Relu),
    Sqrt(unary::Sqrt),
    Abs(unary::Abs),
    Sign(unary::Sign),
    Floor(unary::Floor),
    Ceil(unary::Ceil),
    Round(unary::Round),
    LogicalNot(unary::LogicalNot),
    Tan(unary_math::Tan),
    Arcsin(unary_math::Arcsin),
    Arccos(unary_math::Arccos),
    Arctan(unary_math::Arctan),
    Sinh(unary_math::Sinh),
    Cosh(unary_math::Cosh),
    Arcsinh(unary_math::Arcsinh),
    Arccosh(unary_math::Arccosh),
    Arctanh(unary_math::Arctanh),
    Erf(special::Erf),
    Log1p(unary_math::Log1p),
    Expm1(unary_math::Expm1),
    // binary elementwise (numpy broadcasting)
    Add(binary::Add),
    Sub(binary::Sub),
    Mul(binary::Mul),
    Div(binary::Div),
    Pow(binary::Pow),
    Maximum(binary::Maximum),
    Minimum(binary::Minimum),
    ReluGrad(binary::ReluGrad),
    Equal(binary::Equal),
    NotEqual(binary::NotEqual),
    Less(binary::Less),
    LessEqual(binary::LessEqual),
    Greater(binary::Greater),
    GreaterEqual(binary::GreaterEqual),
    LogicalAnd(binary::LogicalAnd),
    LogicalOr(binary::LogicalOr),
    BitwiseAnd(binary::BitwiseAnd),
    BitwiseOr(binary::BitwiseOr),
    BitwiseXor(binary::BitwiseXor),
    Select(binary::Select),
    Arctan2(binary_math::Arctan2),
    Rem(binary_math::Rem),
    Quotient(binary_math::Quotient),
    // reductions
    Sum(reduce::Sum),
    ReduceMax(reduce::ReduceMax),
    ReduceMin(reduce::ReduceMin),
    // linear algebra
    MatMul(matmul::MatMul),
    LuFactor(factor::LuFactor),
    LuPermutation(factor::LuPermutation),
    LuSolve(factor::LuSolve),
    TriangularSolve(factor::TriangularSolve),
    Cholesky(factor::Cholesky),
    HouseholderQr(factor::HouseholderQr),
    // layout
    Reshape(layout::Reshape),
    Transpose(layout::Transpose),
    BroadcastTo(layout::BroadcastTo),
    Concatenate(layout::Concatenate),
    Slice(layout::Slice),
    Pad(layout::Pad),
    Reverse(layout::Reverse),
    // data-dependent indexing
    DynamicSlice(index::DynamicSlice),
    DynamicUpdateSlice(index::DynamicUpdateSlice),
    Take(index::Take),
    ScatterAdd(index::ScatterAdd),
    PackIndices(pack::PackIndices),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
