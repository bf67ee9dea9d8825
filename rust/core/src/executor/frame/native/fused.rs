//! Runs of elementwise ops over the same many lanes (the frame's order puts them side by side:
//! `frame::cluster`) as one loop over the lanes. Each lane's values stay in machine registers
//! from op to op, and only what a step outside the run reads is stored: a batched loop body
//! of thirty ops over 1,024 lanes reads and writes its lanes a few times, not ninety.
//!
//! ```text
//!   when every control of the run is alive and every input it reads from outside is live:
//!     for each block of `width` lanes (16 bytes of the widest dtype), then the tail lane by
//!     lane: each op on the block (one vector instruction where its form is one, else
//!     lane by lane); the outputs read outside the run stored
//!     then the run's bits, step by step as the steps would leave them
//!   else: the steps one by one (some are dead: the kernels and the guards, as elsewhere)
//! ```
//!
//! The forms are the ops' own scalar forms (`elementwise::apply`), so the bits are the
//! kernels': check mode compares them.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ops::Range;

use cranelift_codegen::ir::{types, Block, InstBuilder, Value};
use smallvec::SmallVec;

use cranelift_codegen::ir::condcodes::IntCC;

use super::elementwise::{apply, value_type, Elementwise};
use super::emit::{flags, Emitter};
use super::runs::readers_inside;
use crate::dtype::DType;
use crate::emit::ScalarForm;
use crate::executor::frame::steps::BufferStep;

/// A block of lanes of one value inside the loop.
#[derive(Clone)]
enum Lanes {
    /// One vector of the block's lanes.
    Vector(Value),
    /// One scalar per lane.
    Scalars(SmallVec<[Value; 4]>),
    /// One element for every lane (a broadcast operand, loaded before the loop).
    Splat(Value),
    /// Bools as a vector of lanes each all ones or all zeros (a vector comparison's result).
    Mask(Value),
}

impl Emitter<'_, '_> {
    /// The run `range` of steps (`run_at`), continuing at `next`.
    pub(super) fn fused_run(&mut self, range: Range<usize>, next: Block) -> Option<()> {
        let steps = &self.frame.steps[range.clone()];
        let produced: Vec<u32> = steps.iter().map(|s| s.out).collect();
        let (fast, slow) = (self.b.create_block(), self.b.create_block());
        let mut alive = self.b.ins().iconst(types::I8, 1);
        for step in steps {
            let dead = self.control_dead(step);
            let live = self.b.ins().bxor_imm_u(dead, 1);
            alive = self.b.ins().band(alive, live);
            for r in step.reads.iter().filter(|r| !produced.contains(&r.reg)) {
                let l = self.load_byte(self.live, r.reg as usize);
                alive = self.b.ins().band(alive, l);
            }
        }
        self.b.ins().brif(alive, fast, &[], slow, &[]);

        self.b.switch_to_block(slow);
        for k in range.clone() {
            let after = if k + 1 == range.end {
                next
            } else {
                self.b.create_block()
            };
            self.step(k, &self.frame.steps[k], after)?;
            if k + 1 != range.end {
                self.b.switch_to_block(after);
            }
        }

        self.b.switch_to_block(fast);
        self.fused_pass(range.clone())?;
        for step in &self.frame.steps[range] {
            self.set_dead(step.node, false);
            self.release(&step.reads);
            self.set_live(step.out as usize, true);
        }
        self.b.ins().jump(next, &[]);
        Some(())
    }

    /// The loop over the lanes of the run `range`, its inputs live.
    fn fused_pass(&mut self, range: Range<usize>) -> Option<()> {
        let steps = &self.frame.steps[range.clone()];
        fn inline(s: &BufferStep) -> Option<&Elementwise> {
            s.inline.as_ref()
        }
        let elements = inline(&steps[0])?.elements;
        let widest = steps
            .iter()
            .filter_map(inline)
            .flat_map(|e| e.operands.iter().copied().chain([e.result]))
            .filter(|&d| d != DType::Bool)
            .map(DType::size)
            .max()
            .unwrap_or(4);
        let width = 16 / widest;
        let produced: HashMap<u32, usize> =
            steps.iter().enumerate().map(|(j, s)| (s.out, j)).collect();
        // Addresses and broadcast elements, read once: no buffer moves during the run.
        let mut base: HashMap<u32, Value> = HashMap::new();
        let mut splat: HashMap<u32, Value> = HashMap::new();
        let mut stored = Vec::with_capacity(steps.len());
        for step in steps {
            let e = inline(step)?;
            for (j, &d) in step.data.iter().enumerate() {
                if produced.contains_key(&d) {
                    continue;
                }
                if e.broadcast[j] {
                    if let Entry::Vacant(slot) = splat.entry(d) {
                        let at = self.address(d as usize);
                        let ty = value_type(e.operands[j], 1);
                        slot.insert(self.b.ins().load(ty, flags(), at, 0));
                    }
                } else if let Entry::Vacant(slot) = base.entry(d) {
                    slot.insert(self.address(d as usize));
                }
            }
            let store = self.readers[step.out as usize] > readers_inside(steps, step.out);
            stored.push(store.then(|| self.address(step.out as usize)));
        }

        let blocks = elements / width * width;
        let (head, body, tail) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        let i0 = self.b.ins().iconst(self.ptr, 0);
        self.b.append_block_param(head, self.ptr);
        self.b.ins().jump(head, &[i0.into()]);
        self.b.switch_to_block(head);
        let i = self.b.block_params(head)[0];
        let more = self
            .b
            .ins()
            .icmp_imm_u(IntCC::UnsignedLessThan, i, blocks as i64);
        self.b.ins().brif(more, body, &[], tail, &[]);
        self.b.switch_to_block(body);
        self.fused_block(steps, &base, &splat, &stored, i, width)?;
        let i = self.b.ins().iadd_imm_s(i, width as i64);
        self.b.ins().jump(head, &[i.into()]);
        self.b.switch_to_block(tail);
        for at in blocks..elements {
            let at = self.b.ins().iconst(self.ptr, at as i64);
            self.fused_block(steps, &base, &splat, &stored, at, 1)?;
        }
        Some(())
    }

    /// The run's ops on lanes `at..at + width`.
    fn fused_block(
        &mut self,
        steps: &[BufferStep],
        base: &HashMap<u32, Value>,
        splat: &HashMap<u32, Value>,
        stored: &[Option<Value>],
        at: Value,
        width: usize,
    ) -> Option<()> {
        let mut values: HashMap<u32, Lanes> = HashMap::new();
        // Operands read from outside the run, by register and whether read as one vector.
        let mut loaded: HashMap<(u32, bool), Lanes> = HashMap::new();
        let mut offsets: HashMap<usize, Value> = HashMap::new();
        for (step, store) in steps.iter().zip(stored) {
            let e = step.inline.as_ref()?;
            let how = How::of(e, width);
            let mut operands = Vec::with_capacity(step.data.len());
            for (j, &d) in step.data.iter().enumerate() {
                let dtype = e.operands[j];
                let vector = how.vector_operand(dtype);
                let lanes = if let Some(v) = values.get(&d) {
                    v.clone()
                } else if let Some(&x) = splat.get(&d) {
                    Lanes::Splat(x)
                } else if let Some(v) = loaded.get(&(d, vector)) {
                    v.clone()
                } else {
                    let size = dtype.size();
                    let off = *offsets
                        .entry(size)
                        .or_insert_with(|| self.b.ins().imul_imm_u(at, size as i64));
                    let address = self.b.ins().iadd(*base.get(&d)?, off);
                    let v = self.load(address, dtype, width, vector);
                    loaded.insert((d, vector), v.clone());
                    v
                };
                operands.push(lanes);
            }
            let result = self.compute(e, how, &operands, width)?;
            if let Some(out) = store {
                let size = e.result.size();
                let off = *offsets
                    .entry(size)
                    .or_insert_with(|| self.b.ins().imul_imm_u(at, size as i64));
                let address = self.b.ins().iadd(*out, off);
                self.store(&result, address, e.result, width);
            }
            values.insert(step.out, result);
        }
        Some(())
    }

    /// The op on a block of lanes, as `how` says.
    fn compute(
        &mut self,
        e: &Elementwise,
        how: How,
        operands: &[Lanes],
        width: usize,
    ) -> Option<Lanes> {
        let vectors = |em: &mut Self| -> Vec<Value> {
            operands
                .iter()
                .zip(&e.operands)
                .map(|(l, &d)| em.as_vector(l, d, width))
                .collect()
        };
        Some(match how {
            How::Vector => {
                let args = vectors(self);
                Lanes::Vector(apply(&mut self.b, e, &args)?)
            }
            // A vector comparison gives each lane all ones or all zeros.
            How::Compare => {
                let args = vectors(self);
                Lanes::Mask(apply(&mut self.b, e, &args)?)
            }
            How::Select => {
                let mask = self.as_mask(&operands[0], width);
                let ty = value_type(e.result, width);
                let mask = self.b.ins().bitcast(ty, lanes_in_order(), mask);
                let (x, y) = (
                    self.as_vector(&operands[1], e.result, width),
                    self.as_vector(&operands[2], e.result, width),
                );
                Lanes::Vector(self.b.ins().bitselect(mask, x, y))
            }
            How::Logic => {
                let masks: Vec<Value> = operands.iter().map(|l| self.as_mask(l, width)).collect();
                Lanes::Mask(match e.form {
                    ScalarForm::Not => self.b.ins().bnot(masks[0]),
                    _ => apply(&mut self.b, e, &masks)?,
                })
            }
            How::Lanes => {
                let mut out = SmallVec::new();
                for lane in 0..width {
                    let args: Vec<Value> = operands.iter().map(|l| self.lane(l, lane)).collect();
                    out.push(apply(&mut self.b, e, &args)?);
                }
                Lanes::Scalars(out)
            }
        })
    }

    fn load(&mut self, at: Value, dtype: DType, width: usize, vector: bool) -> Lanes {
        if vector {
            let ty = value_type(dtype, width);
            return Lanes::Vector(self.b.ins().load(ty, flags(), at, 0));
        }
        let ty = value_type(dtype, 1);
        Lanes::Scalars(
            (0..width)
                .map(|k| {
                    let offset = (k * dtype.size()) as i32;
                    self.b.ins().load(ty, flags(), at, offset)
                })
                .collect(),
        )
    }

    fn store(&mut self, lanes: &Lanes, at: Value, dtype: DType, width: usize) {
        if let Lanes::Vector(v) = lanes {
            self.b.ins().store(flags(), *v, at, 0);
            return;
        }
        for k in 0..width {
            let x = self.lane(lanes, k);
            let offset = (k * dtype.size()) as i32;
            self.b.ins().store(flags(), x, at, offset);
        }
    }

    fn as_vector(&mut self, lanes: &Lanes, dtype: DType, width: usize) -> Value {
        let ty = value_type(dtype, width);
        match lanes {
            Lanes::Vector(v) => *v,
            Lanes::Splat(x) => self.b.ins().splat(ty, *x),
            Lanes::Scalars(xs) => {
                let mut v = self.b.ins().splat(ty, xs[0]);
                for (k, &x) in xs.iter().enumerate().skip(1) {
                    v = self.b.ins().insertlane(v, x, k as u8);
                }
                v
            }
            // A comparison's lanes as the bools they are (only a select reads them otherwise).
            Lanes::Mask(m) => {
                let bools: SmallVec<[Value; 4]> =
                    (0..width).map(|k| self.mask_lane(*m, k)).collect();
                self.as_vector(&Lanes::Scalars(bools), dtype, width)
            }
        }
    }

    /// Bools as a mask: each lane all ones (true) or all zeros, lanes as wide as the block's.
    fn as_mask(&mut self, lanes: &Lanes, width: usize) -> Value {
        let lane = mask_type(width).lane_type();
        let widen = |em: &mut Self, b: Value| {
            let wide = em.b.ins().uextend(lane, b);
            em.b.ins().ineg(wide)
        };
        match lanes {
            Lanes::Mask(m) => *m,
            Lanes::Splat(b) => {
                let x = widen(self, *b);
                self.b.ins().splat(mask_type(width), x)
            }
            Lanes::Scalars(bs) => {
                let first = widen(self, bs[0]);
                let mut v = self.b.ins().splat(mask_type(width), first);
                for (k, &b) in bs.iter().enumerate().skip(1) {
                    let x = widen(self, b);
                    v = self.b.ins().insertlane(v, x, k as u8);
                }
                v
            }
            Lanes::Vector(_) => unreachable!("bools are never vectors of values"),
        }
    }

    /// Lane `k` of a mask as a bool (a byte, 0 or 1).
    fn mask_lane(&mut self, mask: Value, k: usize) -> Value {
        let x = self.b.ins().extractlane(mask, k as u8);
        let byte = self.b.ins().ireduce(types::I8, x);
        self.b.ins().band_imm_u(byte, 1)
    }

    fn lane(&mut self, lanes: &Lanes, k: usize) -> Value {
        match lanes {
            Lanes::Vector(v) => self.b.ins().extractlane(*v, k as u8),
            Lanes::Scalars(xs) => xs[k],
            Lanes::Splat(x) => *x,
            Lanes::Mask(m) => self.mask_lane(*m, k),
        }
    }
}

/// How an op computes a block of lanes.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// One vector instruction on vectors of values.
    Vector,
    /// A vector comparison, giving a mask.
    Compare,
    /// A select of vectors of values by a mask.
    Select,
    /// A logical op on masks.
    Logic,
    /// Lane by lane, on scalars.
    Lanes,
}

impl How {
    fn of(e: &Elementwise, width: usize) -> How {
        if width == 1 {
            return How::Lanes;
        }
        let fills = |d: DType| d != DType::Bool && d.size() * width == 16;
        match e.form {
            ScalarForm::Op("arith.andi" | "arith.ori") if e.result == DType::Bool => How::Logic,
            ScalarForm::Not => How::Logic,
            _ if e.lanes() == width => How::Vector,
            ScalarForm::Compare(..) if fills(e.operands[0]) => How::Compare,
            ScalarForm::Select if fills(e.result) => How::Select,
            _ => How::Lanes,
        }
    }

    /// Whether an operand of `dtype` is read as one vector of values.
    fn vector_operand(self, dtype: DType) -> bool {
        matches!(self, How::Vector | How::Compare | How::Select) && dtype != DType::Bool
    }
}

/// The vector type of a mask over `width` lanes (16 bytes).
fn mask_type(width: usize) -> types::Type {
    match width {
        2 => types::I64X2,
        4 => types::I32X4,
        8 => types::I16X8,
        _ => types::I8X16,
    }
}

/// A bitcast between vector types keeps each lane where it was (little-endian, as stored).
fn lanes_in_order() -> cranelift_codegen::ir::MemFlagsData {
    cranelift_codegen::ir::MemFlagsData::new()
        .with_endianness(cranelift_codegen::ir::Endianness::Little)
}
