//! Lowering graph functions: the entry function becomes a public `func.func`; every function it
//! calls (`If`/`Case`/`While` branches and bodies, `Call`) is inlined where it is called, into
//! the `scf` region or the current block. Inlining keeps each region self-contained (a loop body
//! reads like the Python that was traced, and every op keeps its `loc`), needs no function
//! signatures for values that lower to several SSA values, and is what IREE would do anyway.
//!
//! A graph value lowers to a `Bound`: one SSA value for a tensor, a buffer and a size for a
//! stack (`stacks.rs`). Where a value's type is more or less static than the type expected
//! where it flows (an argument of a `f32[?]` parameter, a branch result of a `f32[?]` output),
//! a `tensor.cast` is inserted, so every value has exactly the type its node declares.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::emitter::{element_type, string_literal, type_text, Emitter, MlirValue, Site, TypeText};
use super::scalar::carrier_type;
use super::stack_bounds::{PushFlow, Pushes};
use super::stacks::{buffer_type, storage_type};
use super::ModuleFacts;
use crate::dtype::DType;
use crate::emit::host_elements;
use crate::error::{Error, Result};
use crate::graph::{Function, Library, Node, NodeId, NodeKind, ValueType};
use crate::ops::Op;
use crate::shape::{numel, TensorType};

/// A graph value in MLIR.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Bound {
    Tensor(MlirValue),
    /// A rank-0 value held as an MLIR scalar (`f64`, `i1`, ...; see `scalar.rs`); `ty` is
    /// its rank-0 tensor type.
    Scalar(MlirValue),
    /// A small tensor of static shape held as one MLIR scalar per element, in row-major order
    /// (`emit::host_elements`, `scalar.rs`).
    Elements {
        names: Vec<String>,
        ty: TensorType,
    },
    /// A stack: a buffer of `tensor<? x element>` and the number of rows in use, an `index`
    /// (see `stacks.rs`).
    Stack {
        buffer: MlirValue,
        size: String,
    },
}

impl Bound {
    /// The SSA names this value is made of (what regions carry, yield and take as arguments).
    pub fn names(&self) -> Vec<String> {
        match self {
            Bound::Tensor(v) | Bound::Scalar(v) => vec![v.name.clone()],
            Bound::Elements { names, .. } => names.clone(),
            Bound::Stack { buffer, size } => vec![buffer.name.clone(), size.clone()],
        }
    }

    /// The tensor type of a tensor or scalar value (`None` for a stack).
    pub fn tensor_type(&self) -> Option<&TensorType> {
        match self {
            Bound::Tensor(v) | Bound::Scalar(v) => Some(&v.ty),
            Bound::Elements { ty, .. } => Some(ty),
            Bound::Stack { .. } => None,
        }
    }

    /// Whether the value is held on the host (as scalars).
    pub fn on_host(&self) -> bool {
        matches!(self, Bound::Scalar(_) | Bound::Elements { .. })
    }

    /// The value of type `ty` made of the SSA names `names` yields (as many as `flat_types`;
    /// `host`: small tensors are held as scalars, see `flat_types`).
    pub fn from_names(
        ty: &ValueType,
        names: &mut impl Iterator<Item = String>,
        host: bool,
    ) -> Result<Bound> {
        let mut next = || {
            names
                .next()
                .ok_or_else(|| Error::internal("mlir", "too few SSA names for a value"))
        };
        match ty {
            ValueType::Tensor(t) if host && host_elements(t) => {
                let names = (0..numel(&t.shape))
                    .map(|_| next())
                    .collect::<Result<Vec<_>>>()?;
                Ok(Bound::Elements {
                    names,
                    ty: t.clone(),
                })
            }
            ValueType::Tensor(t) => {
                let v = MlirValue {
                    name: next()?,
                    ty: t.clone(),
                };
                Ok(if t.ndim() == 0 {
                    Bound::Scalar(v)
                } else {
                    Bound::Tensor(v)
                })
            }
            ValueType::Stack(t) => Ok(Bound::Stack {
                buffer: MlirValue {
                    name: next()?,
                    ty: buffer_type(t),
                },
                size: next()?,
            }),
            ValueType::Resource(_) => Err(Error::internal(
                "mlir",
                format!("no SSA form for a value of type {ty}"),
            )),
        }
    }
}

/// The MLIR types a value of type `ty` lowers to where regions carry it (one per SSA value, in
/// `Bound::names` order): rank-0 tensors are carried as scalars, small tensors as a scalar per
/// element (see `scalar.rs`).
pub(crate) fn flat_types(e: &Emitter, ty: &ValueType) -> Result<Vec<String>> {
    let pure = e.options.pure_stablehlo;
    match ty {
        ValueType::Tensor(t) if t.ndim() == 0 && !pure => {
            Ok(vec![carrier_type(t.dtype).to_string()])
        }
        ValueType::Tensor(t) if host_elements(t) && !pure => {
            Ok(vec![carrier_type(t.dtype).to_string(); numel(&t.shape)])
        }
        ValueType::Stack(_) if pure => Err(no_stacks_in_stablehlo(e)),
        ValueType::Tensor(t) => Ok(vec![type_text(t)]),
        ValueType::Resource(t) => Err(e.unsupported(format!(
            "variables (a resource<{}> value) are not supported by the MLIR emitter yet",
            element_type(t.dtype)
        ))),
        ValueType::Stack(t) => Ok(vec![
            storage_type(t, e.options.list_stacks),
            "index".to_string(),
        ]),
    }
}

/// Stacks are growable state, which StableHLO cannot hold: a loop gradient exported to it
/// keeps fixed-size buffers instead (checkpoints), unless its body assigns a Variable.
pub(crate) fn no_stacks_in_stablehlo(e: &Emitter) -> Error {
    e.unsupported(
        "a loop gradient here keeps growable stacks, which StableHLO cannot express: its loop \
         body assigns a Variable (so its states cannot be recomputed from checkpoints); assign \
         outside the loop to export it as StableHLO",
    )
}

/// `flat_types` of several values, concatenated.
pub(crate) fn flat_types_of(e: &Emitter, types: &[ValueType]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for t in types {
        out.extend(flat_types(e, t)?);
    }
    Ok(out)
}

/// The SSA names of several values, concatenated.
pub(crate) fn flat_names(values: &[Bound]) -> Vec<String> {
    values.iter().flat_map(Bound::names).collect()
}

/// A function name as an MLIR symbol: `@name`, or `@"..."` when it is not a bare identifier.
pub(crate) fn symbol(name: &str) -> String {
    let mut chars = name.chars();
    let bare = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_$.".contains(c));
    if bare {
        format!("@{name}")
    } else {
        format!("@{}", string_literal(name))
    }
}

/// How the MLIR emitter lowers a construct's node.
pub(crate) trait EmitMlir {
    /// The node's MLIR, given its inputs' values; returns its outputs (the caller casts them
    /// to the types the node declares).
    fn emit_mlir(
        &self,
        l: &mut Lowering<'_>,
        node: &Node,
        inputs: Vec<Bound>,
    ) -> Result<Vec<Bound>>;

    /// What its presence tells compile policy (`ModuleFacts`: regions, loops).
    fn module_facts(&self, facts: &mut ModuleFacts);

    /// How many values it pushes onto the stacks its operands are counted as (`ins`, one of
    /// which at least is related to the stack followed); None when there is no known bound
    /// (`stack_bounds`).
    fn stack_pushes(&self, flow: &PushFlow<'_>, ins: &[Pushes], n: usize) -> Option<Vec<Pushes>>;
}

/// A construct's `EmitMlir` implementation (`None` for arguments, constants and ops).
pub(crate) fn construct_emitter(kind: &NodeKind) -> Option<&dyn EmitMlir> {
    crate::graph::construct_as!(kind, EmitMlir)
}

/// Emits the functions of one library into an `Emitter`.
pub(crate) struct Lowering<'g> {
    pub library: &'g Library,
    pub e: Emitter,
    /// The capacities stack buffers were created with: each is distinct, so that no two
    /// stacks can share a buffer (see `stacks.rs`).
    pub capacities: HashSet<usize>,
    /// Scalars `narrow` made, each with the carried value it came from: `widen` gives that
    /// back, so a loop variable passed through stays the same SSA value.
    pub narrowed: HashMap<String, String>,
    /// Buffers `stack_new` made (their stacks still empty).
    pub fresh_stacks: HashSet<String>,
    /// Buffers with room for every push still to come (see `stack_bounds.rs`).
    pub reserved: HashSet<String>,
    /// Whether a loop was written with several iterations per trip.
    pub unrolled_loops: bool,
    /// Pushes onto lists held back to the end of a predicated trip (`flush_pushes`): an
    /// export between a trip's dispatches splits IREE's one submission per trip.
    pub deferred_pushes: Option<Vec<super::stacks::ListPush>>,
    /// Within a predicated trip whose condition the device decides: an op on rank-0 values
    /// any of which is on the device (not a constant) runs there, so that nothing waits for
    /// the device before the trip's end (`try_scalar_op`).
    pub device_rank0: bool,
    /// Within an exact trip whose body only pops: the pops of all its iterations, written
    /// before the first (`stack_pop`). A pop between dispatches splits IREE's one submission
    /// per trip, as a push does (`deferred_pushes`).
    pub hoisted_pops: Option<String>,
}

impl<'g> Lowering<'g> {
    pub fn new(library: &'g Library) -> Self {
        Lowering {
            library,
            e: Emitter::new(),
            capacities: HashSet::new(),
            narrowed: HashMap::new(),
            fresh_stacks: HashSet::new(),
            reserved: HashSet::new(),
            unrolled_loops: false,
            deferred_pushes: None,
            device_rank0: false,
            hoisted_pops: None,
        }
    }

    /// `f` as a public `func.func` (tensor parameters and results only).
    pub fn entry(&mut self, f: &Function) -> Result<()> {
        self.e.reset_names();
        self.narrowed.clear();
        self.fresh_stacks.clear();
        self.reserved.clear();
        self.e.set_site(Site {
            op: "func",
            location: None,
        });
        let mut params = Vec::with_capacity(f.params.len());
        let mut args = Vec::with_capacity(f.params.len());
        for (i, p) in f.params.iter().enumerate() {
            let ValueType::Tensor(t) = p else {
                let why = format!("parameter {i} of @{} has type {p}", f.name);
                let kind = if matches!(p, ValueType::Resource(_)) {
                    "variables"
                } else {
                    "stacks"
                };
                return Err(self.e.unsupported(format!(
                    "{kind} are not supported by the MLIR emitter yet: {why}"
                )));
            };
            if self.e.options.pure_stablehlo && t.shape.contains(&crate::shape::DYN) {
                return Err(self.e.unsupported(format!(
                    "parameter {i} of @{} has type {t}: pure StableHLO needs static shapes",
                    f.name
                )));
            }
            let name = format!("%arg{i}");
            params.push(format!("{name}: {}", TypeText(t)));
            args.push(Bound::Tensor(MlirValue {
                name,
                ty: t.clone(),
            }));
        }
        let result_types = f.result_types()?;
        let flat = result_types
            .iter()
            .map(|t| match t {
                ValueType::Tensor(t) => Ok(type_text(t)),
                _ => Err(self.e.unsupported(format!(
                    "@{} returns a {t}: only tensors can leave a compiled function",
                    f.name
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let arrow = if flat.is_empty() {
            String::new()
        } else {
            format!(" -> ({})", flat.join(", "))
        };
        self.e.line(&format!(
            "func.func {}({}){arrow} {{",
            symbol(&f.name),
            params.join(", ")
        ));
        self.e.indent();
        let results = self.body(f, args)?;
        let names = results
            .iter()
            .map(|b| self.tensor_input(b).map(|v| v.name))
            .collect::<Result<Vec<_>>>()?;
        if names.is_empty() {
            self.e.line("return");
        } else {
            self.e.line(&format!(
                "return {} : {}",
                names.join(", "),
                flat.join(", ")
            ));
        }
        self.e.dedent();
        self.e.line("}");
        Ok(())
    }

    /// The body of library function `name` emitted on `args` into the current block; returns
    /// its results, typed as the function declares them.
    pub fn inline(&mut self, name: &str, args: Vec<Bound>) -> Result<Vec<Bound>> {
        let f = self.library.get(name)?;
        if args.len() != f.params.len() {
            return Err(self.e.bug(format!(
                "@{name} takes {} arguments, got {}",
                f.params.len(),
                args.len()
            )));
        }
        let args = args
            .into_iter()
            .zip(&f.params)
            .map(|(a, t)| self.coerce(a, t))
            .collect::<Result<Vec<_>>>()?;
        self.body(f, args)
    }

    /// `value` with exactly the type `ty` (a `tensor.cast` between compatible types).
    pub fn coerce(&mut self, value: Bound, ty: &ValueType) -> Result<Bound> {
        match (value, ty) {
            (Bound::Tensor(v), ValueType::Tensor(t)) => Ok(Bound::Tensor(self.e.cast(&v, t))),
            (Bound::Scalar(v), ValueType::Tensor(t)) if v.ty == *t => Ok(Bound::Scalar(v)),
            (b @ Bound::Elements { .. }, ValueType::Tensor(t)) => {
                if b.tensor_type() == Some(t) {
                    return Ok(b);
                }
                let v = self.tensor_input(&b)?;
                Ok(Bound::Tensor(self.e.cast(&v, t)))
            }
            (Bound::Stack { buffer, size }, ValueType::Stack(t)) if buffer.ty == buffer_type(t) => {
                Ok(Bound::Stack { buffer, size })
            }
            (v, t) => Err(self
                .e
                .bug(format!("a value {v:?} cannot flow where {t} is expected"))),
        }
    }

    /// `value` as regions carry a value of type `ty`: coerced, rank-0 values as scalars of
    /// their `carrier_type` and small tensors as one per element (so the result's names are
    /// what a terminator yields, not values to compute with; `unpack` reverses it).
    pub fn carried(&mut self, value: Bound, ty: &ValueType) -> Result<Bound> {
        if self.e.options.pure_stablehlo {
            return self.coerce(value, ty);
        }
        match self.coerce(value, ty)? {
            b @ (Bound::Tensor(_) | Bound::Elements { .. })
                if b.tensor_type().is_some_and(host_elements) =>
            {
                let Some(t) = b.tensor_type().cloned() else {
                    return Err(self.e.bug("a small tensor without a type"));
                };
                let names = self
                    .element_inputs(&b)?
                    .iter()
                    .map(|x| self.widen(x, t.dtype))
                    .collect();
                Ok(Bound::Elements { names, ty: t })
            }
            b @ (Bound::Tensor(_) | Bound::Scalar(_))
                if b.tensor_type().is_some_and(|t| t.ndim() == 0) =>
            {
                let x = self.scalar_input(&b)?;
                let Some(t) = b.tensor_type().cloned() else {
                    return Err(self.e.bug("a rank-0 value without a type"));
                };
                let name = self.widen(&x, t.dtype);
                Ok(Bound::Scalar(MlirValue { name, ty: t }))
            }
            other => Ok(other),
        }
    }

    /// The values of `types` that control flow carried as the SSA `names` (block arguments,
    /// an op's results): rank-0 values narrowed back from their `carrier_type`.
    pub fn unpack(&mut self, types: &[ValueType], names: &[String]) -> Result<Vec<Bound>> {
        let mut it = names.iter().cloned();
        let mut out = Vec::with_capacity(types.len());
        for t in types {
            let pure = self.e.options.pure_stablehlo;
            let b = match Bound::from_names(t, &mut it, !pure)? {
                Bound::Scalar(v) if pure => Bound::Tensor(v),
                Bound::Scalar(v) => {
                    let name = self.narrow(&v.name, v.ty.dtype);
                    Bound::Scalar(MlirValue { name, ty: v.ty })
                }
                Bound::Elements { names, ty } => {
                    let names = names.iter().map(|x| self.narrow(x, ty.dtype)).collect();
                    Bound::Elements { names, ty }
                }
                other => other,
            };
            out.push(b);
        }
        Ok(out)
    }

    /// Values as regions carry them, one for one of `types` (see `carried`).
    pub fn carried_all(&mut self, values: Vec<Bound>, types: &[ValueType]) -> Result<Vec<Bound>> {
        if values.len() != types.len() {
            return Err(self
                .e
                .bug(format!("{} values for {} types", values.len(), types.len())));
        }
        values
            .into_iter()
            .zip(types)
            .map(|(v, t)| self.carried(v, t))
            .collect()
    }

    /// Values coerced one for one to `types`.
    pub fn coerce_all(&mut self, values: Vec<Bound>, types: &[ValueType]) -> Result<Vec<Bound>> {
        if values.len() != types.len() {
            return Err(self
                .e
                .bug(format!("{} values for {} types", values.len(), types.len())));
        }
        values
            .into_iter()
            .zip(types)
            .map(|(v, t)| self.coerce(v, t))
            .collect()
    }

    /// Emits the nodes of `f` in order on `args` (already typed as its parameters).
    fn body(&mut self, f: &Function, args: Vec<Bound>) -> Result<Vec<Bound>> {
        let mut values: Vec<Vec<Bound>> = Vec::with_capacity(f.nodes.len());
        for (id, node) in f.nodes.iter().enumerate() {
            let inputs = node
                .inputs
                .iter()
                .map(|p| {
                    values
                        .get(p.node)
                        .and_then(|outs| outs.get(p.output))
                        .cloned()
                        .ok_or_else(|| {
                            self.e
                                .bug(format!("%{}#{} is not defined", p.node, p.output))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            self.e.set_site(Site {
                op: node.kind.name(),
                location: node.location.clone(),
            });
            let outs = self
                .node(node, inputs, &args)
                .map_err(|e| with_node_context(e, f, id))?;
            if outs.len() != node.outputs.len() {
                let msg = format!(
                    "produced {} values; the node declares {}",
                    outs.len(),
                    node.outputs.len()
                );
                return Err(with_node_context(self.e.bug(msg), f, id));
            }
            values.push(outs);
        }
        f.results
            .iter()
            .map(|p| {
                values
                    .get(p.node)
                    .and_then(|outs| outs.get(p.output))
                    .cloned()
                    .ok_or_else(|| {
                        self.e
                            .bug(format!("result %{}#{} is not defined", p.node, p.output))
                    })
            })
            .collect()
    }

    /// One node's MLIR; returns its outputs typed as the node declares them.
    fn node(&mut self, node: &Node, inputs: Vec<Bound>, args: &[Bound]) -> Result<Vec<Bound>> {
        if self.e.options.pure_stablehlo {
            self.static_outputs(node)?;
        }
        let outs = match &node.kind {
            NodeKind::Arg(i) => {
                let a = args
                    .get(*i)
                    .cloned()
                    .ok_or_else(|| self.e.bug(format!("no argument {i}")))?;
                vec![a]
            }
            NodeKind::Const(c) => {
                vec![Bound::Tensor(self.e.constant(&c.0))]
            }
            NodeKind::Op(op) => self.apply(op, inputs)?,
            kind => construct_emitter(kind)
                .ok_or_else(|| self.e.bug("a construct without MLIR"))?
                .emit_mlir(self, node, inputs)?,
        };
        self.coerce_all(outs, &node.outputs)
    }

    /// StableHLO's shapes are static: a node with a dynamically shaped output cannot be
    /// exported as pure StableHLO.
    fn static_outputs(&self, node: &Node) -> Result<()> {
        for ty in &node.outputs {
            match ty {
                ValueType::Tensor(t) if t.shape.contains(&crate::shape::DYN) => {
                    return Err(self.e.unsupported(format!(
                        "its result type {t} has a dimension known only at run time; pure \
                         StableHLO needs static shapes"
                    )));
                }
                ValueType::Stack(_) => return Err(no_stacks_in_stablehlo(&self.e)),
                _ => {}
            }
        }
        Ok(())
    }

    /// The results of `op` on `inputs`: on the host where `try_scalar_op` takes it, else its
    /// StableHLO.
    pub(crate) fn apply(&mut self, op: &Op, inputs: Vec<Bound>) -> Result<Vec<Bound>> {
        let types: Vec<TensorType> = inputs
            .iter()
            .map(|b| {
                b.tensor_type()
                    .cloned()
                    .ok_or_else(|| self.e.bug("a stack where a tensor is expected"))
            })
            .collect::<Result<_>>()?;
        let inferred = op.infer(&types)?;
        if let Some(outs) = self.try_scalar_op(op, &inputs, &inferred)? {
            return Ok(outs);
        }
        if let Some(outs) = self.empty_results(&inferred)? {
            return Ok(outs);
        }
        let values = self.tensor_operands(op, inputs)?;
        let outs = op.emit(&mut self.e, &values, &inferred)?;
        Ok(outs.into_iter().map(Bound::Tensor).collect())
    }

    /// Empty constants for an op whose results all have no elements (whatever it computes):
    /// iree-compile 3.13 crashes (SIGFPE) on some ops over zero-sized tensors.
    fn empty_results(&mut self, outputs: &[TensorType]) -> Result<Option<Vec<Bound>>> {
        let empty = |t: &TensorType| t.shape.contains(&0);
        if outputs.is_empty() || !outputs.iter().all(empty) {
            return Ok(None);
        }
        let outs = outputs
            .iter()
            .map(|t| self.e.splat(t.dtype, &t.shape, 0.0).map(Bound::Tensor))
            .collect::<Result<_>>()?;
        Ok(Some(outs))
    }

    /// Names for the results of a region op with `types`: the `%r = ` / `%r:n = ` prefix and
    /// the values (`%r`, or `%r#i`).
    pub fn result_names(&mut self, types: &[String]) -> (String, Vec<String>) {
        match types.len() {
            0 => (String::new(), Vec::new()),
            1 => {
                let r = self.e.fresh();
                (format!("{r} = "), vec![r])
            }
            n => {
                let r = self.e.fresh();
                let names = (0..n).map(|i| format!("{r}#{i}")).collect();
                (format!("{r}:{n} = "), names)
            }
        }
    }

    /// `on_true` where the rank-0 bool `pred` holds, else `on_false` (values of one type):
    /// `stablehlo.select` on tensors (the predicate broadcast; it stays on the device when it
    /// is a tensor), `arith.select` on scalars.
    pub fn select(&mut self, pred: &Bound, on_true: Bound, on_false: Bound) -> Result<Bound> {
        match (&on_true, &on_false) {
            (Bound::Tensor(a), Bound::Tensor(b)) => {
                let p = self.tensor_input(pred)?;
                let ops = self
                    .e
                    .broadcast_operands(&[p, a.clone(), b.clone()], &a.ty.shape)?;
                let ty = TypeText(&a.ty);
                let body = format!(
                    "stablehlo.select {}, {}, {} : {}, {ty}",
                    ops[0].name,
                    ops[1].name,
                    ops[2].name,
                    TypeText(&ops[0].ty)
                );
                Ok(Bound::Tensor(self.e.op(&body, &a.ty)))
            }
            (Bound::Stack { .. }, _) | (_, Bound::Stack { .. }) => {
                Err(self.e.bug("a select between stacks"))
            }
            // a predicate on the device selects there: on the host it would be waited for
            _ if matches!(pred, Bound::Tensor(_)) => {
                let a = Bound::Tensor(self.tensor_input(&on_true)?);
                let b = Bound::Tensor(self.tensor_input(&on_false)?);
                self.select(pred, a, b)
            }
            // on the host, element by element (rank 0: one)
            _ => {
                let ty = on_true
                    .tensor_type()
                    .cloned()
                    .ok_or_else(|| self.e.bug("a select without a type"))?;
                let p = self.scalar_input(pred)?;
                let (a, b) = (
                    self.element_inputs(&on_true)?,
                    self.element_inputs(&on_false)?,
                );
                let scalar = super::emitter::element_type(ty.dtype);
                let loc = self.e.loc();
                let mut names = Vec::with_capacity(a.len());
                for (a, b) in a.iter().zip(&b) {
                    let name = self.e.fresh();
                    self.e.line(&format!(
                        "{name} = arith.select {p}, {a}, {b} : {scalar} {loc}"
                    ));
                    names.push(name);
                }
                Ok(host_value(names, ty))
            }
        }
    }

    /// An input that must be a tensor (an op's operand, a predicate or an index).
    pub fn tensor_input(&mut self, b: &Bound) -> Result<MlirValue> {
        match b {
            Bound::Tensor(v) => Ok(v.clone()),
            Bound::Scalar(v) if v.ty.dtype == DType::Bool => {
                // Through an i64 tensor and a compare: IREE 3.13 stores bool tensors as i8 and
                // rejects `tensor.from_elements %b : tensor<i1>` once it has converted the type.
                let wide = self.widen(&v.name, DType::Bool);
                let ty = TensorType::scalar(DType::I64);
                let t = self
                    .e
                    .op(&format!("tensor.from_elements {wide} : tensor<i64>"), &ty);
                let zero = self.e.scalar(DType::I64, 0.0);
                Ok(self.e.compare("NE", &t, &zero))
            }
            Bound::Scalar(v) => {
                let body = format!("tensor.from_elements {v} : {}", TypeText(&v.ty));
                Ok(self.e.op(&body, &v.ty))
            }
            Bound::Elements { names, ty } if ty.dtype == DType::Bool => {
                // as a rank-0 bool is: through an i64 tensor and a compare
                let wide: Vec<String> = names.iter().map(|x| self.widen(x, DType::Bool)).collect();
                let ty = ty.with_dtype(DType::I64);
                let t = self.build_from_elements(&wide, &ty);
                let zero = self.e.splat(DType::I64, &ty.shape, 0.0)?;
                Ok(self.e.compare("NE", &t, &zero))
            }
            Bound::Elements { names, ty } => Ok(self.build_from_elements(names, ty)),
            Bound::Stack { .. } => Err(self.e.bug("a stack where a tensor is expected")),
        }
    }
}

impl Lowering<'_> {
    /// A tensor of type `ty` made of the scalars `names`: a 1-D `tensor.from_elements` through
    /// an optimization barrier, reshaped. IREE 3.13 computes a `from_elements` into a tensor of
    /// rank 2 or more wrongly (each element of a 2x1 the last one; a 2x2 fails to compile),
    /// and folds a reshape or a broadcast of a 1-D one into that (`py/gradloop/_workarounds.py`: `multi_dim_from_elements`).
    fn build_from_elements(&mut self, names: &[String], ty: &TensorType) -> MlirValue {
        let flat = TensorType::new(ty.dtype, &[names.len()]);
        let body = format!(
            "tensor.from_elements {} : {}",
            names.join(", "),
            TypeText(&flat)
        );
        let mut t = self.e.op(&body, &flat);
        if names.len() > 1 {
            let body = format!("stablehlo.optimization_barrier {t} : {}", TypeText(&flat));
            t = self.e.op(&body, &flat);
        }
        if flat == *ty {
            return t;
        }
        let body = format!(
            "stablehlo.reshape {t} : ({}) -> {}",
            TypeText(&flat),
            TypeText(ty)
        );
        self.e.op(&body, ty)
    }
}

/// A host value of type `ty` made of the scalars `names` (one per element, row-major).
pub(crate) fn host_value(names: Vec<String>, ty: TensorType) -> Bound {
    match <[String; 1]>::try_from(names) {
        Ok([name]) if ty.ndim() == 0 => Bound::Scalar(MlirValue { name, ty }),
        Ok([name]) => Bound::Elements {
            names: vec![name],
            ty,
        },
        Err(names) => Bound::Elements { names, ty },
    }
}

/// Exactly one input.
pub(crate) fn one(l: &Lowering<'_>, inputs: Vec<Bound>) -> Result<[Bound; 1]> {
    <[Bound; 1]>::try_from(inputs)
        .map_err(|v| l.e.bug(format!("expected 1 input, got {}", v.len())))
}

/// Exactly two inputs.
pub(crate) fn two(l: &Lowering<'_>, inputs: Vec<Bound>) -> Result<[Bound; 2]> {
    <[Bound; 2]>::try_from(inputs)
        .map_err(|v| l.e.bug(format!("expected 2 inputs, got {}", v.len())))
}

/// `names : types` as `scf.yield` / `return` write them (nothing when empty).
pub(crate) fn operand_list(names: &[String], types: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" {} : {}", names.join(", "), types.join(", "))
    }
}

/// Adds `  at %7 = mul in @f (model.py:12)` to an error crossing node `id` of `f`.
fn with_node_context(mut e: Error, f: &Function, id: NodeId) -> Error {
    let node = &f.nodes[id];
    let _ = write!(
        e.message,
        "\n  at %{id} = {} in @{}",
        node.kind.name(),
        f.name
    );
    if let Some(l) = &node.location {
        let _ = write!(e.message, " ({}:{})", l.file, l.line);
    }
    e
}
