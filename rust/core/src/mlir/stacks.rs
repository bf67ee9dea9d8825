//! Stacks (the loop-gradient intermediates) as a buffer and a size, threaded like any value
//! (see notes/reverse-while-growable-stack.mlir, checked with IREE 3.13):
//!
//! ```text
//!   stack<f32[3]>  ──►  %buf: tensor<?x3xf32> (capacity rows, the first %n in use), %n: index
//!   stack_new        tensor.empty(16), 0
//!   stack_push(s, v) if %n == capacity: copy %buf into a tensor.empty of twice the capacity;
//!                    tensor.insert_slice %v into %buf[%n, 0][1, 3][1, 1]; %n + 1
//!   stack_pop(s)     %n - 1; tensor.extract_slice %buf[%n - 1, 0][1, 3][1, 1]
//! ```
//!
//! A stack of numeric scalars (`stack<f64[]>`, whose values loops carry as `f64`, see
//! `scalar.rs`) is a host-side `!util.list<f64>` instead, and its size (a small tensor held as
//! scalars, `stack<f64[2]>`, takes that many entries a row):
//!
//! ```text
//!   stack_new        util.list.create 16, 0
//!   stack_push(s, x) util.list.resize %l, %n + 1; util.list.set %l[%n], %x; %n + 1
//!   stack_pop(s)     %n - 1; util.list.get %l[%n - 1]
//! ```
//!
//! With IREE 3.13 a tensor buffer costs a device write and a read-back per push and pop; the
//! list, set and read by IREE's VM, costs a small fraction of that, linear in the iterations
//! (`docs/notes.md`). A list is mutable, so a push is visible through every SSA name of the list; the
//! gradient's stacks are used linearly (pushed by one loop, then only popped), and a pop reads
//! without removing, so that is safe. Bool elements keep the tensor buffer (an `i1` list is
//! not a VM type).
//!
//! A stack a bounded loop fills is made full size before the loop (`stack_bounds.rs`,
//! `reserve_stacks`): its buffer is in `Lowering::reserved`, and a push onto it is the insert
//! alone.
//!
//! Doubling makes the copies O(1) amortised per push as far as the IR goes, but IREE 3.13 does
//! not update a buffer that `scf.while` carries in place: it copies the whole buffer on every
//! trip, static shape or not (`benches/iree_loop_stacks.py` measures the cost per push growing
//! with the rows). With `EmitOptions::list_stacks` a stack of tensors is a `!util.list<?>` of
//! buffer views instead, O(1) per push:
//!
//! ```text
//!   stack_push(s, v) %b = hal.tensor.export %v; util.list.resize; util.list.set %l[%n], %b
//!   stack_pop(s)     %b = util.list.get %l[%n - 1]; hal.tensor.import %b
//! ```
//!
//! IREE compiles that form for some modules only (`py/gradloop/_workarounds.py`: `list_stacks`), so `gl.jit` tries it
//! first and falls back to the buffers. Popping an empty
//! stack is undefined here (the interpreter reports it); the gradient's loops never do.
//!
//! `stack_add(a, b)` (two cotangents of one stack, summed) is a new stack filled by `scf.for`
//! loops: the bottom rows only the longer stack has, then the sums of the rows as far from
//! both tops.

use super::emitter::{element_type, type_text, MlirValue, TypeText};
use super::function::{host_value, Bound, Lowering};
use crate::emit::host_elements;
use crate::error::Result;
use crate::ops::Op;
use crate::shape::{numel, ShapeDisplay, TensorType, DYN};

/// A push onto a list of buffer views (`stack_push`): `value` set at `at`, the list `size` long.
pub(crate) struct ListPush {
    list: String,
    at: String,
    size: String,
    value: MlirValue,
}

/// Rows a new stack's buffer has room for before it first grows (plus one per stack made
/// before it in the module).
const INITIAL_CAPACITY: usize = 16;

/// The largest buffer (bytes) made up front for a bounded loop's pushes: a larger bound (a
/// generous `maximum_iterations`) keeps the doubling buffer, which grows only as needed.
const MAX_RESERVED: u64 = 1 << 28;

/// The buffer type of a stack of `element`s: `tensor<? x element>`.
pub(crate) fn buffer_type(element: &TensorType) -> TensorType {
    let mut shape = vec![DYN];
    shape.extend_from_slice(&element.shape);
    TensorType::new(element.dtype, &shape)
}

/// Whether a stack of `element`s is a host-side `!util.list` (numeric scalars, or small
/// tensors held as scalars: `width` list entries per row).
pub(crate) fn on_host(element: &TensorType) -> bool {
    (element.ndim() == 0 || host_elements(element)) && element.dtype != crate::dtype::DType::Bool
}

/// List entries per row of a host stack of `element`s.
fn width(element: &TensorType) -> usize {
    numel(&element.shape)
}

/// Whether a stack of `element`s is a `!util.list<?>` of buffer views (tensors, when the
/// module has `list_stacks`).
fn ref_list(element: &TensorType, list_stacks: bool) -> bool {
    list_stacks && element.ndim() > 0 && !on_host(element)
}

/// The MLIR type of a stack's storage: `!util.list<f64>`, `!util.list<?>` or
/// `tensor<? x element>`.
pub(crate) fn storage_type(element: &TensorType, list_stacks: bool) -> String {
    if ref_list(element, list_stacks) {
        "!util.list<?>".to_string()
    } else if on_host(element) {
        format!("!util.list<{}>", element_type(element.dtype))
    } else {
        type_text(&buffer_type(element))
    }
}

impl Lowering<'_> {
    /// An `index` constant.
    pub(crate) fn index(&mut self, v: usize) -> String {
        let name = self.e.fresh();
        let loc = self.e.loc();
        self.e
            .line(&format!("{name} = arith.constant {v} : index {loc}"));
        name
    }

    /// A `Compile` error unless the element shape is static (the slices need static sizes).
    fn check_element(&self, element: &TensorType) -> Result<()> {
        if element.shape.contains(&DYN) {
            return Err(self.e.unsupported(format!(
                "a stack of elements with unknown dimensions {} is not supported by the MLIR \
                 emitter",
                ShapeDisplay(&element.shape)
            )));
        }
        Ok(())
    }

    /// `[offset, 0, ...][rows, sizes...][1, ...]`: `rows` rows from `offset` of a buffer of
    /// `element`s, as `tensor.insert_slice` / `extract_slice` write it.
    fn rows(offset: &str, rows: &str, element: &TensorType) -> String {
        let rest = element.ndim();
        let zeros = ", 0".repeat(rest);
        let sizes: String = element.shape.iter().map(|d| format!(", {d}")).collect();
        let ones = ", 1".repeat(rest);
        format!("[{offset}{zeros}][{rows}{sizes}][1{ones}]")
    }

    /// The smallest capacity of at least `rows` that no stack of the module has yet. Each
    /// stack's first buffer has its own: IREE 3.13 merges equal `tensor.empty` ops (CSE), then
    /// updates the one buffer in place for two stacks, or fails as it runs ("indirect buffer
    /// reference slot 0 is out range").
    fn distinct_capacity(&mut self, rows: usize) -> usize {
        let mut cap = rows;
        while !self.capacities.insert(cap) {
            cap += 1;
        }
        cap
    }

    pub(crate) fn stack_new(&mut self, element: &TensorType) -> Result<Bound> {
        self.check_element(element)?;
        let ty = buffer_type(element);
        let cap = self.distinct_capacity(INITIAL_CAPACITY);
        let cap = self.index(cap);
        let buffer = self.e.fresh();
        let loc = self.e.loc();
        if on_host(element) || ref_list(element, self.e.options.list_stacks) {
            let list = storage_type(element, self.e.options.list_stacks);
            self.e
                .line(&format!("{buffer} = util.list.create {cap} : {list} {loc}"));
        } else {
            self.e.line(&format!(
                "{buffer} = tensor.empty({cap}) : {} {loc}",
                TypeText(&ty)
            ));
            self.fresh_stacks.insert(buffer.clone());
        }
        let size = self.index(0);
        Ok(Bound::Stack {
            buffer: MlirValue { name: buffer, ty },
            size,
        })
    }

    pub(crate) fn stack_push(&mut self, stack: Bound, value: Bound) -> Result<Bound> {
        let Bound::Stack { buffer, size } = stack else {
            return Err(self.e.bug("stack_push takes a stack and a tensor"));
        };
        let Some(ty) = value.tensor_type().cloned() else {
            return Err(self.e.bug("stack_push takes a stack and a tensor"));
        };
        self.check_element(&ty)?;
        if on_host(&ty) {
            let xs = self.element_inputs(&value)?;
            let list = storage_type(&ty, self.e.options.list_stacks);
            let loc = self.e.loc();
            let one = self.index(1);
            let next = self.e.fresh();
            self.e
                .line(&format!("{next} = arith.addi {size}, {one} : index {loc}"));
            let (entries, first) = (self.row_start(&next, &ty), self.row_start(&size, &ty));
            self.e.line(&format!(
                "util.list.resize {buffer}, {entries} : {list} {loc}"
            ));
            for (j, x) in xs.iter().enumerate() {
                let at = self.list_entry(&first, j);
                self.e
                    .line(&format!("util.list.set {buffer}[{at}], {x} : {list} {loc}"));
            }
            return Ok(Bound::Stack { buffer, size: next });
        }
        let v = match &value {
            Bound::Tensor(v) | Bound::Scalar(v) => v.clone(),
            other => self.tensor_input(other)?,
        };
        if ref_list(&v.ty, self.e.options.list_stacks) {
            let loc = self.e.loc();
            let one = self.index(1);
            let next = self.e.fresh();
            self.e
                .line(&format!("{next} = arith.addi {size}, {one} : index {loc}"));
            let push = ListPush {
                list: buffer.name.clone(),
                at: size,
                size: next.clone(),
                value: v,
            };
            match &mut self.deferred_pushes {
                Some(pushes) => pushes.push(push),
                None => self.list_push(&push),
            }
            return Ok(Bound::Stack { buffer, size: next });
        }
        // a rank-0 value is stored as an element: no rank-0 tensor to build
        let scalar = (v.ty.ndim() == 0)
            .then(|| self.scalar_input(&value))
            .transpose()?;
        let bt = type_text(&buffer.ty);
        let loc = self.e.loc();
        let reserved = self.reserved.contains(&buffer.name);
        let grown = if reserved {
            buffer.name.clone()
        } else {
            self.grow_if_full(&buffer, &size, &v.ty)?
        };
        let pushed = self.e.fresh();
        if let Some(x) = scalar {
            self.e.line(&format!(
                "{pushed} = tensor.insert {x} into {grown}[{size}] : {bt} {loc}"
            ));
        } else {
            self.e.line(&format!(
                "{pushed} = tensor.insert_slice {v} into {grown}{} : {} into {bt} {loc}",
                Self::rows(&size, "1", &v.ty),
                TypeText(&v.ty)
            ));
        }
        if reserved {
            self.reserved.insert(pushed.clone());
        }
        let one = self.index(1);
        let next = self.e.fresh();
        self.e
            .line(&format!("{next} = arith.addi {size}, {one} : index {loc}"));
        Ok(Bound::Stack {
            buffer: MlirValue {
                name: pushed,
                ty: buffer.ty,
            },
            size: next,
        })
    }

    /// For a host stack of `element`s: the first list entry of row `row` (also the entries
    /// `row` rows take; `row` itself when a row is one entry).
    fn row_start(&mut self, row: &str, element: &TensorType) -> String {
        let w = width(element);
        if w == 1 {
            return row.to_string();
        }
        let loc = self.e.loc();
        let w = self.index(w);
        let first = self.e.fresh();
        self.e
            .line(&format!("{first} = arith.muli {row}, {w} : index {loc}"));
        first
    }

    /// Entry `j` of a host stack's row that starts at entry `first`.
    fn list_entry(&mut self, first: &str, j: usize) -> String {
        if j == 0 {
            return first.to_string();
        }
        let loc = self.e.loc();
        let j = self.index(j);
        let at = self.e.fresh();
        self.e
            .line(&format!("{at} = arith.addi {first}, {j} : index {loc}"));
        at
    }

    /// A push onto a list of buffer views: the value exported, the list resized, the view set.
    fn list_push(&mut self, push: &ListPush) {
        let ListPush {
            list,
            at,
            size,
            value,
        } = push;
        let loc = self.e.loc();
        let view = self.e.fresh();
        self.e.line(&format!(
            "{view} = hal.tensor.export {value} : {} -> !hal.buffer_view {loc}",
            TypeText(&value.ty)
        ));
        self.e.line(&format!(
            "util.list.resize {list}, {size} : !util.list<?> {loc}"
        ));
        self.e.line(&format!(
            "util.list.set {list}[{at}], {view} : !hal.buffer_view -> !util.list<?> {loc}"
        ));
    }

    /// Writes the pushes onto lists held back since `deferred_pushes` was set, and stops
    /// holding them back.
    pub(crate) fn flush_pushes(&mut self) {
        for push in self.deferred_pushes.take().unwrap_or_default() {
            self.list_push(&push);
        }
    }

    /// The buffer of a stack of `size` `element`s, copied into one of twice the capacity when
    /// it is full.
    fn grow_if_full(
        &mut self,
        buffer: &MlirValue,
        size: &str,
        element: &TensorType,
    ) -> Result<String> {
        let bt = type_text(&buffer.ty);
        let loc = self.e.loc();
        let zero = self.index(0);
        let (cap, full, grown) = (self.e.fresh(), self.e.fresh(), self.e.fresh());
        self.e
            .line(&format!("{cap} = tensor.dim {buffer}, {zero} : {bt} {loc}"));
        self.e.line(&format!(
            "{full} = arith.cmpi eq, {size}, {cap} : index {loc}"
        ));
        self.e
            .line(&format!("{grown} = scf.if {full} -> ({bt}) {{"));
        self.e.indent();
        let (twice, empty, copied) = (self.e.fresh(), self.e.fresh(), self.e.fresh());
        self.e
            .line(&format!("{twice} = arith.addi {cap}, {cap} : index {loc}"));
        self.e
            .line(&format!("{empty} = tensor.empty({twice}) : {bt} {loc}"));
        let all = Self::rows(&zero, &cap, element);
        self.e.line(&format!(
            "{copied} = tensor.insert_slice {buffer} into {empty}{all} : {bt} into {bt} {loc}"
        ));
        self.e.line(&format!("scf.yield {copied} : {bt}"));
        self.e.dedent();
        self.e.line("} else {");
        self.e.indent();
        self.e.line(&format!("scf.yield {buffer} : {bt}"));
        self.e.dedent();
        self.e.line(&format!("}} {loc}"));
        Ok(grown)
    }

    /// Per loop variable of a `While` (`inputs`, its initial values): whether it is a stack
    /// with room for every push of the loop. An empty stack `stack_new` made gets a buffer of
    /// `pushes(k)` rows when the loop bounds the pushes onto variable `k` (`stack_bounds.rs`);
    /// a stack an enclosing loop reserved for stays reserved.
    pub(crate) fn reserve_stacks(
        &mut self,
        pushes: &dyn Fn(usize) -> Option<u64>,
        inputs: &mut [Bound],
    ) -> Vec<bool> {
        let mut reserve = Vec::with_capacity(inputs.len());
        for (k, input) in inputs.iter_mut().enumerate() {
            let Bound::Stack { buffer, .. } = input else {
                reserve.push(false);
                continue;
            };
            let fresh = self.fresh_stacks.contains(&buffer.name);
            let reserved = self.reserved.contains(&buffer.name);
            let rows = (fresh || reserved).then(|| pushes(k)).flatten();
            let row_bytes = crate::shape::numel(&buffer.ty.shape[1..]) * buffer.ty.dtype.size();
            let Some(rows) = rows.filter(|&r| r.saturating_mul(row_bytes as u64) <= MAX_RESERVED)
            else {
                reserve.push(false);
                continue;
            };
            if !reserved {
                let rows = usize::try_from(rows).unwrap_or(usize::MAX).max(1);
                let cap = self.distinct_capacity(rows);
                let cap = self.index(cap);
                let name = self.e.fresh();
                let loc = self.e.loc();
                self.e.line(&format!(
                    "{name} = tensor.empty({cap}) : {} {loc}",
                    TypeText(&buffer.ty)
                ));
                self.reserved.insert(name.clone());
                buffer.name = name;
            }
            reserve.push(true);
        }
        reserve
    }

    /// Returns the stack without its top, and the top; written into `hoisted_pops` when set.
    pub(crate) fn stack_pop(&mut self, stack: Bound, element: &TensorType) -> Result<[Bound; 2]> {
        let Some(mut hoisted) = self.hoisted_pops.take() else {
            return self.pop_here(stack, element);
        };
        self.e.swap_out(&mut hoisted);
        let popped = self.pop_here(stack, element);
        self.e.swap_out(&mut hoisted);
        self.hoisted_pops = Some(hoisted);
        popped
    }

    fn pop_here(&mut self, stack: Bound, element: &TensorType) -> Result<[Bound; 2]> {
        let Bound::Stack { buffer, size } = stack else {
            return Err(self.e.bug("stack_pop takes a stack"));
        };
        self.check_element(element)?;
        let loc = self.e.loc();
        let one = self.index(1);
        let top = self.e.fresh();
        self.e
            .line(&format!("{top} = arith.subi {size}, {one} : index {loc}"));
        let value = self.read_row(&buffer, &top, element);
        let stack = Bound::Stack { buffer, size: top };
        Ok([stack, value])
    }

    /// Row `at` of a stack's storage `buffer`.
    fn read_row(&mut self, buffer: &MlirValue, top: &str, element: &TensorType) -> Bound {
        let loc = self.e.loc();
        if on_host(element) {
            let list = storage_type(element, self.e.options.list_stacks);
            let first = self.row_start(top, element);
            let names = (0..width(element))
                .map(|j| {
                    let at = self.list_entry(&first, j);
                    let value = self.e.fresh();
                    self.e.line(&format!(
                        "{value} = util.list.get {buffer}[{at}] : {list} {loc}"
                    ));
                    value
                })
                .collect();
            return host_value(names, element.clone());
        }
        let value = self.e.fresh();
        if ref_list(element, self.e.options.list_stacks) {
            let view = self.e.fresh();
            self.e.line(&format!(
                "{view} = util.list.get {buffer}[{top}] : !util.list<?> -> !hal.buffer_view {loc}"
            ));
            self.e.line(&format!(
                "{value} = hal.tensor.import {view} : !hal.buffer_view -> {} {loc}",
                TypeText(element)
            ));
            let value = MlirValue {
                name: value,
                ty: element.clone(),
            };
            return Bound::Tensor(value);
        }
        if element.ndim() == 0 {
            self.e.line(&format!(
                "{value} = tensor.extract {buffer}[{top}] : {} {loc}",
                TypeText(&buffer.ty)
            ));
            let value = MlirValue {
                name: value,
                ty: element.clone(),
            };
            return Bound::Scalar(value);
        }
        self.e.line(&format!(
            "{value} = tensor.extract_slice {buffer}{} : {} to {} {loc}",
            Self::rows(top, "1", element),
            TypeText(&buffer.ty),
            TypeText(element)
        ));
        Bound::Tensor(MlirValue {
            name: value,
            ty: element.clone(),
        })
    }

    /// `stack_add` (see the module doc): a new stack of `max(na, nb)` rows, filled by three
    /// loops with no branch inside (IREE 3.13 miscompiled an `scf.if` reading a list there):
    /// the bottom rows the longer stack alone has (one of the first two loops is empty), then
    /// the `min(na, nb)` sums of the rows as far from both tops.
    pub(crate) fn stack_add(&mut self, a: Bound, b: Bound, element: &TensorType) -> Result<Bound> {
        let (
            Bound::Stack {
                buffer: ba,
                size: na,
            },
            Bound::Stack {
                buffer: bb,
                size: nb,
            },
        ) = (a, b)
        else {
            return Err(self.e.bug("stack_add takes two stacks"));
        };
        self.check_element(element)?;
        if !element.dtype.is_float() {
            return Err(self
                .e
                .bug("stack_add of a stack that is not a float cotangent"));
        }
        let loc = self.e.loc();
        let (m, a_only, b_only) = (self.e.fresh(), self.e.fresh(), self.e.fresh());
        self.e
            .line(&format!("{m} = arith.minui {na}, {nb} : index {loc}"));
        self.e
            .line(&format!("{a_only} = arith.subi {na}, {m} : index {loc}"));
        self.e
            .line(&format!("{b_only} = arith.subi {nb}, {m} : index {loc}"));
        let mut sum = self.stack_new(element)?;
        // Pushes here are written here, not with an unrolled trip's deferred ones.
        let deferred = self.deferred_pushes.take();
        for (only, buffer) in [(&a_only, &ba), (&b_only, &bb)] {
            sum = self.rows_loop(
                sum,
                only,
                element,
                |l, k| Ok(l.read_row(buffer, k, element)),
            )?;
        }
        sum = self.rows_loop(sum, &m, element, |l, k| {
            let (at_a, at_b) = (l.e.fresh(), l.e.fresh());
            let loc = l.e.loc();
            l.e.line(&format!("{at_a} = arith.addi {a_only}, {k} : index {loc}"));
            l.e.line(&format!("{at_b} = arith.addi {b_only}, {k} : index {loc}"));
            let rows = vec![
                l.read_row(&ba, &at_a, element),
                l.read_row(&bb, &at_b, element),
            ];
            let added = l.apply(&Op::Add(Default::default()), rows)?;
            let [added] = super::function::one(l, added)?;
            Ok(added)
        })?;
        self.deferred_pushes = deferred;
        Ok(sum)
    }

    /// `stack` with `row(k)` pushed for each `k` below `count`, by an `scf.for`.
    fn rows_loop(
        &mut self,
        stack: Bound,
        count: &str,
        element: &TensorType,
        row: impl FnOnce(&mut Self, &str) -> Result<Bound>,
    ) -> Result<Bound> {
        let Bound::Stack { buffer, size } = stack else {
            return Err(self.e.bug("rows_loop takes a stack"));
        };
        let loc = self.e.loc();
        let (zero, one) = (self.index(0), self.index(1));
        let storage = storage_type(element, self.e.options.list_stacks);
        let (out, k, buf, rows) = (
            self.e.fresh(),
            self.e.fresh(),
            self.e.fresh(),
            self.e.fresh(),
        );
        self.e.line(&format!(
            "{out}:2 = scf.for {k} = {zero} to {count} step {one} iter_args({buf} = {buffer}, \
             {rows} = {size}) -> ({storage}, index) {{"
        ));
        self.e.indent();
        let value = row(self, &k)?;
        let carried = Bound::Stack {
            buffer: MlirValue {
                name: buf,
                ty: buffer.ty.clone(),
            },
            size: rows,
        };
        let Bound::Stack {
            buffer: pushed,
            size: pushed_rows,
        } = self.stack_push(carried, value)?
        else {
            return Err(self.e.bug("stack_push made a stack"));
        };
        self.e.line(&format!(
            "scf.yield {pushed}, {pushed_rows} : {storage}, index"
        ));
        self.e.dedent();
        self.e.line(&format!("}} {loc}"));
        Ok(Bound::Stack {
            buffer: MlirValue {
                name: format!("{out}#0"),
                ty: buffer.ty,
            },
            size: format!("{out}#1"),
        })
    }
}
