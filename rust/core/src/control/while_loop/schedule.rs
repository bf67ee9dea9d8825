//! The schedule of `checkpointed.rs` as graph IR: where the forward loop keeps a state
//! (Stumm and Walther's Algorithm I, then Wang, Moin and Iaccarino's levels) and where the
//! backward loop's advance keeps one (treeverse), over `steps: i64[c]`, the trip whose state
//! each slot holds (-1: empty). `py/gradloop/_checkpoints.py` is the same schedule in Python.

use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{Function, FunctionBuilder, If, NodeKind, Port, ValueType};
use crate::ops::{binary, creation, index, layout, reduce, unary, Op};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use crate::trace::gradients::ExtraInput;

pub(super) fn i64_type(shape: &[usize]) -> ValueType {
    ValueType::tensor(DType::I64, shape)
}

/// A function builder with the scalar and `[c]` integer arithmetic the schedule is made of.
pub(super) struct Ir<'a> {
    pub b: &'a mut FunctionBuilder,
}

impl Ir<'_> {
    pub(super) fn i64(&mut self, v: i64) -> Port {
        self.b.add_const(Tensor::scalar(v))
    }

    pub(super) fn op(&mut self, op: impl Into<Op>, inputs: &[Port]) -> Result<Port> {
        self.b.add_op1(op, inputs, None)
    }

    pub(super) fn add(&mut self, x: Port, v: i64) -> Result<Port> {
        let v = self.i64(v);
        self.op(binary::Add, &[x, v])
    }

    /// `x <op> v` for a constant `v`.
    pub(super) fn cmp(&mut self, op: impl Into<Op>, x: Port, v: i64) -> Result<Port> {
        let v = self.i64(v);
        self.op(op, &[x, v])
    }

    pub(super) fn select(&mut self, cond: Port, a: Port, b: Port) -> Result<Port> {
        self.op(binary::Select, &[cond, a, b])
    }

    pub(super) fn and(&mut self, a: Port, b: Port) -> Result<Port> {
        self.op(binary::LogicalAnd, &[a, b])
    }

    pub(super) fn max(&mut self, x: Port) -> Result<Port> {
        self.op(
            reduce::ReduceMax {
                axes: vec![0],
                keepdims: false,
            },
            &[x],
        )
    }

    pub(super) fn min(&mut self, x: Port) -> Result<Port> {
        self.op(
            reduce::ReduceMin {
                axes: vec![0],
                keepdims: false,
            },
            &[x],
        )
    }

    pub(super) fn cast(&mut self, x: Port, to: DType) -> Result<Port> {
        self.op(creation::Cast { to }, &[x])
    }

    /// `buf` with row `row` replaced by `x` (of type `ty`).
    pub(super) fn write_row(
        &mut self,
        buf: Port,
        x: Port,
        row: Port,
        ty: &TensorType,
    ) -> Result<Port> {
        let mut shape = vec![1];
        shape.extend_from_slice(&ty.shape);
        let update = self.op(
            layout::Reshape {
                shape: shape.into(),
            },
            &[x],
        )?;
        let mut inputs = vec![buf, update, row];
        for _ in &ty.shape {
            inputs.push(self.i64(0));
        }
        self.op(index::DynamicUpdateSlice {}, &inputs)
    }

    /// Row `row` of `buf`, as a value of type `ty`.
    pub(super) fn read_row(&mut self, buf: Port, row: Port, ty: &TensorType) -> Result<Port> {
        let mut sizes = vec![1];
        sizes.extend_from_slice(&ty.shape);
        let mut inputs = vec![buf, row];
        for _ in &ty.shape {
            inputs.push(self.i64(0));
        }
        let sliced = self.op(index::DynamicSlice { sizes }, &inputs)?;
        self.op(
            layout::Reshape {
                shape: ty.shape.clone(),
            },
            &[sliced],
        )
    }
}

/// The schedule's integer logic over `steps` (`i64[c]`: the trip whose state each slot holds,
/// -1 when empty).
pub(super) struct Schedule {
    pub c: usize,
}

impl Schedule {
    pub(super) fn new(c: usize) -> Self {
        Schedule { c }
    }

    pub(super) fn slots(&self, ir: &mut Ir<'_>) -> Result<Port> {
        let arange = Tensor::collect::<i64>(&[self.c], 0..self.c as i64)?;
        Ok(ir.b.add_const(arange))
    }

    /// The buffer row a state goes to: its slot, or the spare row c when it is not kept.
    pub(super) fn row(&self, ir: &mut Ir<'_>, slot: Port) -> Result<Port> {
        let none = ir.cmp(binary::Less, slot, 0)?;
        let spare = ir.i64(self.c as i64);
        ir.select(none, spare, slot)
    }

    /// `steps` with `step` recorded in `slot` (a slot of -1 or c changes nothing).
    pub(super) fn record(
        &self,
        ir: &mut Ir<'_>,
        steps: Port,
        slot: Port,
        step: Port,
    ) -> Result<Port> {
        let slots = self.slots(ir)?;
        let hit = ir.op(binary::Equal, &[slots, slot])?;
        ir.select(hit, step, steps)
    }

    /// The lowest empty slot (c when none is).
    pub(super) fn first_free(&self, ir: &mut Ir<'_>, steps: Port) -> Result<Port> {
        let slots = self.slots(ir)?;
        let empty = ir.cmp(binary::Less, steps, 0)?;
        let none = ir.i64(self.c as i64);
        let candidates = ir.select(empty, slots, none)?;
        ir.min(candidates)
    }

    /// How many slots are empty.
    pub(super) fn free(&self, ir: &mut Ir<'_>, steps: Port) -> Result<Port> {
        let empty = ir.cmp(binary::Less, steps, 0)?;
        let empty = ir.cast(empty, DType::I64)?;
        ir.op(
            reduce::Sum {
                axes: vec![0],
                keepdims: false,
            },
            &[empty],
        )
    }

    /// `steps` with the slots of states at or past trip `from` emptied.
    pub(super) fn free_from(&self, ir: &mut Ir<'_>, steps: Port, from: Port) -> Result<Port> {
        let past = ir.op(binary::GreaterEqual, &[steps, from])?;
        let empty = ir.i64(-1);
        ir.select(past, empty, steps)
    }

    /// The latest kept trip before `trips`, and its slot.
    pub(super) fn latest_below(
        &self,
        ir: &mut Ir<'_>,
        steps: Port,
        trips: Port,
    ) -> Result<(Port, Port)> {
        let slots = self.slots(ir)?;
        let below = ir.op(binary::Less, &[steps, trips])?;
        let none = ir.i64(-1);
        let candidates = ir.select(below, steps, none)?;
        let at = ir.max(candidates)?;
        let found = ir.op(binary::Equal, &[steps, at])?;
        let found = ir.and(found, below)?;
        let candidates = ir.select(found, slots, none)?;
        Ok((at, ir.max(candidates)?))
    }

    /// Treeverse's next state to keep, advancing from x_at toward trip `trips - 1` with `free`
    /// slots: every state when they cover the gap, else halfway; none (-1) within two trips.
    /// As `_checkpoints._next_keep`.
    pub(super) fn next_keep(
        &self,
        ir: &mut Ir<'_>,
        at: Port,
        trips: Port,
        free: Port,
    ) -> Result<Port> {
        let gap = ir.op(binary::Sub, &[trips, at])?;
        let no_slot = ir.cmp(binary::LessEqual, free, 0)?;
        let near = ir.cmp(binary::LessEqual, gap, 2)?;
        let none = ir.op(binary::LogicalOr, &[no_slot, near])?;
        let beyond = ir.add(gap, -2)?;
        let dense = ir.op(binary::LessEqual, &[beyond, free])?;
        // Halved in f32: the IR has no integer division, and IREE's VM has no f64 (past 2^24
        // trips the halfway point moves by a trip or so, which only the cost sees).
        let gap_f = ir.cast(gap, DType::F32)?;
        let half = ir.b.add_const(Tensor::scalar(0.5f32));
        let half = ir.op(binary::Mul, &[gap_f, half])?;
        let half = ir.op(unary::Floor, &[half])?;
        let half = ir.cast(half, DType::I64)?;
        let halfway = ir.op(binary::Add, &[at, half])?;
        let next = ir.add(at, 1)?;
        let target = ir.select(dense, next, halfway)?;
        let never = ir.i64(-1);
        ir.select(none, never, target)
    }

    /// The slot that keeps the state before trip `step` (-1 for none), and the placement's
    /// next state. As `_checkpoints.Placement.keep`.
    /// `add` adds a function to the graph's library and returns its name (the dynamic
    /// placement's branches, named after `name`).
    pub(super) fn place(
        &self,
        ir: &mut Ir<'_>,
        step: Port,
        steps: Port,
        p: &Placement,
        name: &str,
        add: &mut dyn FnMut(Function) -> Result<String>,
    ) -> Result<(Port, Placement)> {
        let c = self.c as i64;
        let last_binomial = (c + 1) * (c + 2) / 2 - 1;
        let binomial = ir.cmp(binary::Less, step, last_binomial)?;
        // Stumm and Walther, Algorithm I: (next slot, checkpoints left, next pivot, saving).
        let none = ir.i64(-1);
        let slot_sw = ir.select(p.saving, p.next, none)?;
        let inc = ir.add(p.next, 1)?;
        let wraps = ir.op(binary::Greater, &[inc, p.left])?;
        let one = ir.i64(1);
        let wrapped = ir.select(wraps, one, inc)?;
        let next = ir.select(p.saving, wrapped, p.next)?;
        let after = ir.add(step, 1)?;
        let before_pivot = ir.op(binary::NotEqual, &[after, p.pivot])?;
        let saving = ir.and(p.saving, before_pivot)?;
        let at_pivot = ir.op(binary::Equal, &[step, p.pivot])?;
        let left_less = ir.add(p.left, -1)?;
        let left = ir.select(at_pivot, left_less, p.left)?;
        let moved = ir.op(binary::Add, &[p.pivot, p.left])?;
        let pivot = ir.select(at_pivot, moved, p.pivot)?;
        let next = ir.select(at_pivot, left, next)?;
        let any_left = ir.cmp(binary::Greater, left, 0)?;
        let saving = ir.select(at_pivot, any_left, saving)?;
        // Past the binomial trips, Wang, Moin and Iaccarino's placement (`dynamic`), in a
        // branch: its work is over the c slots, and a loop of fewer trips never needs it.
        let zero = ir.i64(0);
        let (slot_wm, level_wm, levels, dispensable) = if self.c == 1 {
            (none, zero, p.levels, p.dispensable)
        } else {
            let past = ir.cmp(binary::GreaterEqual, step, last_binomial)?;
            let branches = self.dynamic_branches(name, add)?;
            let inputs = [
                past,
                steps,
                p.levels,
                p.dispensable,
                p.last_slot,
                p.last_level,
            ];
            let types = vec![
                i64_type(&[]),
                i64_type(&[]),
                i64_type(&[self.c]),
                ValueType::tensor(DType::Bool, &[self.c]),
            ];
            let out = ir.b.add_node(NodeKind::If(branches), &inputs, types)?;
            (out[0], out[1], out[2], out[3])
        };
        let slot = ir.select(binomial, slot_sw, slot_wm)?;
        let stored = ir.cmp(binary::GreaterEqual, slot, 0)?;
        let last_slot = ir.select(stored, slot, p.last_slot)?;
        let level = ir.select(binomial, zero, level_wm)?;
        let last_level = ir.select(stored, level, p.last_level)?;
        Ok((
            slot,
            Placement {
                next,
                left,
                pivot,
                saving,
                last_slot,
                last_level,
                levels,
                dispensable,
            },
        ))
    }

    /// The branches of the dynamic placement, `(steps, levels, dispensable, last slot, last
    /// level) -> (slot, level, levels, dispensable)`: Wang, Moin and Iaccarino's (a new state
    /// takes an empty slot, else the latest dispensable one, else the latest one, one level
    /// up, which makes the lower ones dispensable; slot 0 keeps x_0 for good), and, within the
    /// binomial trips, nothing. Past them every slot is full (Algorithm I fills them by trip
    /// c - 1), and the latest state is the last one kept: its slot and level are carried.
    fn dynamic_branches(
        &self,
        name: &str,
        add: &mut dyn FnMut(Function) -> Result<String>,
    ) -> Result<If> {
        let c = self.c;
        let params = vec![
            i64_type(&[c]),
            i64_type(&[c]),
            ValueType::tensor(DType::Bool, &[c]),
            i64_type(&[]),
            i64_type(&[]),
        ];
        let (mut b, args) = FunctionBuilder::new(format!("{name}_place_dynamic"), params.clone());
        let (steps, levels, dispensable, last_slot, last_level) =
            (args[0], args[1], args[2], args[3], args[4]);
        let mut ir = Ir { b: &mut b };
        let none = ir.i64(-1);
        let zero = ir.i64(0);
        let slots = self.slots(&mut ir)?;
        let d_steps = ir.select(dispensable, steps, none)?;
        let best = ir.max(d_steps)?;
        let reuse = ir.cmp(binary::GreaterEqual, best, 0)?;
        let is_best = ir.op(binary::Equal, &[steps, best])?;
        let d_slots = ir.select(is_best, slots, none)?;
        let slot_d = ir.max(d_slots)?;
        let slot = ir.select(reuse, slot_d, last_slot)?;
        let lower = ir.op(binary::Less, &[levels, last_level])?;
        let not_first = self.not_first(&mut ir)?;
        let lower = ir.and(lower, not_first)?;
        let grown = ir.op(binary::LogicalOr, &[dispensable, lower])?;
        let dispensable = ir.select(reuse, dispensable, grown)?;
        let hit = ir.op(binary::Equal, &[slots, slot])?;
        let kept = ir.op(unary::LogicalNot, &[hit])?;
        let dispensable = ir.and(dispensable, kept)?;
        let up = ir.add(last_level, 1)?;
        let new_level = ir.select(reuse, zero, up)?;
        let levels = ir.select(hit, new_level, levels)?;
        let then_branch = add(b.finish(&[slot, new_level, levels, dispensable], &[])?)?;
        let (mut b, args) = FunctionBuilder::new(format!("{name}_place_binomial"), params);
        let mut ir = Ir { b: &mut b };
        let none = ir.i64(-1);
        let zero = ir.i64(0);
        let else_branch = add(b.finish(&[none, zero, args[1], args[2]], &[])?)?;
        Ok(If {
            then_branch,
            else_branch,
        })
    }

    /// `[c]` bools: every slot but 0 (x_0's, never given up).
    pub(super) fn not_first(&self, ir: &mut Ir<'_>) -> Result<Port> {
        let mask = Tensor::collect::<bool>(&[self.c], (0..self.c).map(|k| k > 0))?;
        Ok(ir.b.add_const(mask))
    }
}

/// The placement's state, carried by the forward loop.
pub(super) struct Placement {
    next: Port,
    left: Port,
    pivot: Port,
    saving: Port,
    /// The slot and level of the latest kept state.
    last_slot: Port,
    last_level: Port,
    levels: Port,
    dispensable: Port,
}

impl Placement {
    pub(super) fn types(c: usize) -> Vec<ValueType> {
        let mut t = vec![i64_type(&[]); 3];
        t.push(ValueType::tensor(DType::Bool, &[]));
        t.extend([i64_type(&[]), i64_type(&[])]);
        t.push(i64_type(&[c]));
        t.push(ValueType::tensor(DType::Bool, &[c]));
        t
    }

    pub(super) fn initial(c: usize) -> Vec<ExtraInput> {
        let scalar = |v: f64| ExtraInput::Fill(TensorType::new(DType::I64, &[]), v);
        vec![
            scalar(0.0),
            scalar(c as f64),
            scalar(c as f64),
            ExtraInput::Fill(TensorType::new(DType::Bool, &[]), 1.0),
            scalar(0.0),
            scalar(0.0),
            ExtraInput::Fill(TensorType::new(DType::I64, &[c]), 0.0),
            ExtraInput::Fill(TensorType::new(DType::Bool, &[c]), 0.0),
        ]
    }

    pub(super) fn from_ports(ports: &[Port]) -> Self {
        Placement {
            next: ports[0],
            left: ports[1],
            pivot: ports[2],
            saving: ports[3],
            last_slot: ports[4],
            last_level: ports[5],
            levels: ports[6],
            dispensable: ports[7],
        }
    }

    pub(super) fn ports(&self) -> [Port; 8] {
        [
            self.next,
            self.left,
            self.pivot,
            self.saving,
            self.last_slot,
            self.last_level,
            self.levels,
            self.dispensable,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Graph, Library};
    use crate::interpret::{run_graph, RtValue};
    use crate::testing::interpret::while_kind;

    /// `_checkpoints.Placement` (Python): the slot each trip's state goes to, and the trip
    /// each slot holds after `n` trips.
    fn reference(c: usize, n: usize) -> Vec<i64> {
        let mut steps = vec![-1i64; c];
        let (mut i, mut o, mut p, mut s) = (0i64, c as i64, c as i64, true);
        let mut levels = vec![0i64; c];
        levels[0] = 1 << 62;
        let mut dispensable = vec![false; c];
        let last_binomial = ((c + 1) * (c + 2) / 2 - 1) as i64;
        for step in 0..n as i64 {
            let slot = if step < last_binomial {
                let slot = s.then_some(i as usize);
                if s {
                    i += 1;
                    if i > o {
                        i = 1;
                    }
                }
                if step + 1 == p {
                    s = false;
                }
                if step == p {
                    (p, o) = (p + o, o - 1);
                    (i, s) = (o, o > 0);
                }
                slot
            } else if c == 1 {
                None
            } else {
                let disp = (0..c).filter(|&k| dispensable[k] && steps[k] >= 0);
                let slot = if let Some(k) = disp.max_by_key(|&k| steps[k]) {
                    dispensable[k] = false;
                    levels[k] = 0;
                    k
                } else {
                    let k = (0..c).max_by_key(|&k| steps[k]).unwrap();
                    let level = levels[k];
                    for j in 0..c {
                        dispensable[j] |= levels[j] < level;
                    }
                    levels[k] = level + 1;
                    k
                };
                Some(slot)
            };
            if let Some(k) = slot {
                steps[k] = step;
            }
        }
        steps
    }

    /// The forward loop's placement alone, as IR, run by the interpreter for `n` trips.
    fn placed(c: usize, n: i64) -> Vec<i64> {
        let schedule = Schedule::new(c);
        let mut params = vec![i64_type(&[]), i64_type(&[]), i64_type(&[c])];
        params.extend(Placement::types(c));
        let (mut b, args) = FunctionBuilder::new("body", params.clone());
        let placement = Placement::from_ports(&args[3..]);
        let mut ir = Ir { b: &mut b };
        let mut branches = Vec::new();
        let mut add = |f: Function| {
            let name = f.name.clone();
            branches.push(f);
            Ok(name)
        };
        let (slot, placement) = schedule
            .place(&mut ir, args[0], args[2], &placement, "place", &mut add)
            .unwrap();
        let steps = schedule.record(&mut ir, args[2], slot, args[0]).unwrap();
        let next = ir.add(args[0], 1).unwrap();
        let mut results = vec![next, args[1], steps];
        results.extend(placement.ports());
        let body = b.finish(&results, &[]).unwrap();
        let (mut b, args) = FunctionBuilder::new("cond", params.clone());
        let more = b.add_op1(binary::Less, &[args[0], args[1]], None).unwrap();
        let cond = b.finish(&[more], &[]).unwrap();
        let (mut b, args) = FunctionBuilder::new("main", params.clone());
        let lib_for_types = params.clone();
        let out = b
            .add_node(while_kind("cond", "body", None), &args, lib_for_types)
            .unwrap();
        let main = b.finish(&[out[2]], &[]).unwrap();
        let mut library = Library::new();
        for f in [body, cond, main].into_iter().chain(branches) {
            library.add(f).unwrap();
        }
        let graph = Graph::new(library, "main").unwrap();
        let mut inputs = vec![
            RtValue::Tensor(Tensor::scalar(0i64)),
            RtValue::Tensor(Tensor::scalar(n)),
            RtValue::Tensor(Tensor::filled(DType::I64, &[c], -1.0)),
        ];
        for extra in Placement::initial(c) {
            let ExtraInput::Fill(t, v) = extra else {
                panic!("a placement input that is not a fill")
            };
            inputs.push(RtValue::Tensor(Tensor::filled(t.dtype, &t.shape, v)));
        }
        let out = run_graph(&graph, inputs).unwrap();
        let RtValue::Tensor(steps) = &out[0] else {
            panic!("steps is not a tensor")
        };
        steps.as_slice::<i64>().unwrap().to_vec()
    }

    #[test]
    fn the_graph_placement_is_the_reference_placement() {
        for c in [1, 2, 3, 5, 8] {
            let last = (c + 1) * (c + 2) / 2 - 1;
            for n in [0, 1, 2, c, c + 1, last, last + 1, last + 7, 3 * last + 11] {
                assert_eq!(placed(c, n as i64), reference(c, n), "c={c} n={n}");
            }
        }
    }
}
