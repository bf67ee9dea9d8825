//! The Cranelift function for a compiled frame: `extern "C" fn(*mut Ctx) -> u32`, 0 when the
//! steps ran, else 1 + the failing step (its failure kept in the `Ctx`).

use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    types, AbiParam, Block, InstBuilder, MemFlagsData, SigRef, Type, Value,
};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};

use super::calls::{
    address_of_elements, call_kernel, clear_value, copy_bytes, map_lanes, pop_in_place,
    push_in_place, run_step, share_value, stack_step, Ctx, Entry,
};
use super::elementwise::{apply, value_type, Elementwise};
use super::runs;
use crate::dtype::{DType, Storage};
use crate::executor::frame::registers::Read;
use crate::executor::frame::steps::{BufferAction, BufferStep, RawState, Slot, Steps};
use crate::graph::ValueType;
use crate::ops::lanes::LaneMap;
use crate::shape::numel;

/// Frames with more steps stay interpreted: compile time grows with the steps, and a frame
/// that large spends its time in kernels.
pub(super) const MAX_STEPS: usize = 4096;

/// Copies up to this many bytes are inline loads and stores; larger ones call `copy_bytes`.
const INLINE_COPY: usize = 128;

/// The host's instruction set, once per process.
fn isa() -> Option<OwnedTargetIsa> {
    static ISA: OnceLock<Option<OwnedTargetIsa>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").ok()?;
        let builder = cranelift_native::builder().ok()?;
        builder.finish(settings::Flags::new(flags)).ok()
    })
    .clone()
}

/// The frame's function and the module holding it, or `None` where it stays interpreted.
pub(super) fn compile(frame: &Steps) -> Option<(Entry, JITModule)> {
    let generic = |s: &BufferStep| needs_step(s);
    if frame.steps.len() > MAX_STEPS || frame.steps.iter().all(generic) {
        return None;
    }
    let mut module = JITModule::new(JITBuilder::with_isa(isa()?, default_libcall_names()));
    let built = define(&mut module, frame);
    let Some(id) = built else {
        // SAFETY: nothing was finalised, so no code of this module can be running.
        unsafe { module.free_memory() };
        return None;
    };
    let code = module.get_finalized_function(id);
    // SAFETY: the function was declared with `Entry`'s signature (one pointer in, a u32 out,
    // the platform's C convention).
    let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
    Some((entry, module))
}

fn define(module: &mut JITModule, frame: &Steps) -> Option<cranelift_module::FuncId> {
    let ptr = module.target_config().pointer_type();
    let mut context = module.make_context();
    context.func.signature.params.push(AbiParam::new(ptr));
    context
        .func
        .signature
        .returns
        .push(AbiParam::new(types::I32));
    let signature = |params: &[Type], returns: &[Type]| {
        let mut s = module.make_signature();
        s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        s.returns.extend(returns.iter().map(|&t| AbiParam::new(t)));
        s
    };
    let i32 = types::I32;
    let signatures = [
        signature(&[ptr, i32, types::I64], &[i32]),
        signature(&[ptr, i32, ptr, ptr, ptr, ptr], &[i32]),
        signature(&[ptr, ptr, ptr], &[]),
        signature(&[ptr, i32, i32], &[]),
        signature(&[ptr, i32], &[]),
        signature(&[ptr, i32], &[i32]),
        signature(&[ptr, ptr], &[i32]),
        signature(&[ptr, i32, ptr, ptr, ptr], &[i32]),
    ];
    let mut builder_context = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut context.func, &mut builder_context);
    let [run_step_sig, call_kernel_sig, copy_sig, share_sig, clear_sig, stack_sig, in_place_sig, map_lanes_sig] =
        signatures.map(|s| b.import_signature(s));
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let ctx = b.block_params(entry)[0];
    let field =
        |b: &mut FunctionBuilder, offset: usize| b.ins().load(ptr, flags(), ctx, offset as i32);
    let live = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, live));
    let dead = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, dead));
    let phys = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, phys));
    let data = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, data));
    let buffers = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, buffers));
    let values = field(&mut b, offset_of!(Ctx, raw) + offset_of!(RawState, values));
    let iteration = b.declare_var(types::I64);
    let failed = b.declare_var(types::I32);
    let zero = b.ins().iconst(types::I64, 0);
    b.def_var(iteration, zero);
    let fail = b.create_block();
    let head = b.create_block();
    b.ins().jump(head, &[]);
    b.switch_to_block(head);
    let mut controlled = vec![false; frame.fused.nodes.len()];
    for step in &frame.steps {
        for &c in &step.controls {
            controlled[c as usize] = true;
        }
    }
    let mut e = Emitter {
        b,
        frame,
        ptr,
        ctx,
        live,
        dead,
        phys,
        data,
        buffers,
        values,
        iteration,
        failed,
        fail,
        run_step_sig,
        call_kernel_sig,
        copy_sig,
        share_sig,
        clear_sig,
        stack_sig,
        in_place_sig,
        map_lanes_sig,
        controlled,
        readers: runs::readers(frame),
    };
    let mut k = 0;
    while k < frame.steps.len() {
        let next = e.b.create_block();
        match runs::run_at(&frame.steps, k) {
            Some(end) => {
                e.fused_run(k..end, next)?;
                k = end;
            }
            None => {
                e.step(k, &frame.steps[k], next)?;
                k += 1;
            }
        }
        e.b.switch_to_block(next);
    }
    // Another iteration while a value is carried (a root's one pass carries none).
    let carried = if frame.fused.repeats {
        e.any_live(&frame.carried)
    } else {
        e.b.ins().iconst(types::I8, 0)
    };
    let done = e.b.create_block();
    let again = e.b.create_block();
    e.b.ins().brif(carried, again, &[], done, &[]);
    e.b.switch_to_block(again);
    let i = e.b.use_var(iteration);
    let i = e.b.ins().iadd_imm_s(i, 1);
    e.b.def_var(iteration, i);
    e.b.ins().jump(head, &[]);
    e.b.switch_to_block(done);
    // The trips made, for the caller's count.
    let i = e.b.use_var(iteration);
    e.b.ins()
        .store(flags(), i, ctx, offset_of!(Ctx, iteration) as i32);
    let ok = e.b.ins().iconst(types::I32, 0);
    e.b.ins().return_(&[ok]);
    e.b.switch_to_block(fail);
    let i = e.b.use_var(iteration);
    e.b.ins()
        .store(flags(), i, ctx, offset_of!(Ctx, iteration) as i32);
    let k = e.b.use_var(failed);
    let code = e.b.ins().iadd_imm_s(k, 1);
    e.b.ins().return_(&[code]);
    e.b.seal_all_blocks();
    e.b.finalize(module.target_config());
    let id = module
        .declare_function("frame", Linkage::Local, &context.func.signature)
        .ok()?;
    module.define_function(id, &mut context).ok()?;
    module.finalize_definitions().ok()?;
    Some(id)
}

/// The elements of a step whose vector function the code calls directly (`map_lanes`): a
/// kernel (not an update) with a `LaneMap` whose one input and output registers are buffers of
/// the map's element type and one shape.
pub(super) fn lane_map_elements(frame: &Steps, step: &BufferStep) -> Option<usize> {
    let map = step.lane_map?;
    if !matches!(step.action, BufferAction::Kernel(_)) || step.data.len() != 1 {
        return None;
    }
    let dtype = match map {
        LaneMap::F32(..) => DType::F32,
        LaneMap::F64(..) => DType::F64,
    };
    let input = frame.slots[step.data[0] as usize].tensor()?;
    let output = frame.slots[step.out as usize].tensor()?;
    (input == output && output.dtype == dtype).then(|| numel(&output.shape))
}

pub(super) fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Whether a step runs through the interpreter's step rather than inline or as a kernel call.
fn needs_step(step: &BufferStep) -> bool {
    match &step.action {
        BufferAction::Pass | BufferAction::Merge | BufferAction::NoOp | BufferAction::Const(_) => {
            false
        }
        BufferAction::Push | BufferAction::Pop => false,
        BufferAction::LoopMerge => step.reads.len() < 2,
        BufferAction::Switch(n) => *n > 64,
        BufferAction::Kernel(_) | BufferAction::Update(_) => {
            step.reads.len() > 3 || step.outputs > 1
        }
        BufferAction::Node | BufferAction::Loop(..) => true,
    }
}

pub(super) struct Emitter<'a, 'f> {
    pub(super) b: FunctionBuilder<'f>,
    pub(super) frame: &'a Steps,
    pub(super) ptr: Type,
    ctx: Value,
    pub(super) live: Value,
    dead: Value,
    phys: Value,
    data: Value,
    buffers: Value,
    values: Value,
    iteration: Variable,
    failed: Variable,
    fail: Block,
    run_step_sig: SigRef,
    call_kernel_sig: SigRef,
    copy_sig: SigRef,
    share_sig: SigRef,
    clear_sig: SigRef,
    stack_sig: SigRef,
    in_place_sig: SigRef,
    map_lanes_sig: SigRef,
    /// Per node, whether a step reads its dead bit (only those are written).
    controlled: Vec<bool>,
    /// Per register, the steps that read it (`runs::readers`).
    pub(super) readers: Vec<u32>,
}

impl Emitter<'_, '_> {
    pub(super) fn step(&mut self, k: usize, step: &BufferStep, next: Block) -> Option<()> {
        if needs_step(step) {
            let i = self.b.use_var(self.iteration);
            let index = self.b.ins().iconst(types::I32, k as i64);
            let ctx = self.ctx;
            let f = self.address_of(run_step as *const u8);
            let call = self
                .b
                .ins()
                .call_indirect(self.run_step_sig, f, &[ctx, index, i]);
            let code = self.b.inst_results(call)[0];
            self.check(k, code, next);
            return Some(());
        }
        match &step.action {
            BufferAction::LoopMerge => {
                let i = self.b.use_var(self.iteration);
                let later = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, i, 0);
                let (first, then) = (self.b.create_block(), self.b.create_block());
                self.b.ins().brif(later, then, &[], first, &[]);
                self.b.switch_to_block(first);
                self.merge(step, &step.reads[..1], next);
                self.b.switch_to_block(then);
                self.merge(step, &step.reads[1..2], next);
            }
            BufferAction::Merge => self.merge(step, &step.reads, next),
            _ => {
                self.guard(step, next);
                self.action(k, step, next)?;
            }
        }
        Some(())
    }

    /// A pointer-sized constant.
    fn address_of(&mut self, p: *const u8) -> Value {
        self.b.ins().iconst(self.ptr, p as i64)
    }

    /// Continues at `next` when `code` is 0, else fails at step `k`.
    fn check(&mut self, k: usize, code: Value, next: Block) {
        let index = self.b.ins().iconst(types::I32, k as i64);
        self.b.def_var(self.failed, index);
        self.b.ins().brif(code, self.fail, &[], next, &[]);
    }

    pub(super) fn load_byte(&mut self, base: Value, index: usize) -> Value {
        self.b.ins().load(types::I8, flags(), base, index as i32)
    }

    fn store_byte(&mut self, base: Value, index: usize, value: u8) {
        let v = self.b.ins().iconst(types::I8, i64::from(value));
        self.b.ins().store(flags(), v, base, index as i32);
    }

    pub(super) fn set_live(&mut self, reg: usize, live: bool) {
        self.store_byte(self.live, reg, u8::from(live));
    }

    pub(super) fn set_dead(&mut self, node: usize, dead: bool) {
        if self.controlled[node] {
            self.store_byte(self.dead, node, u8::from(dead));
        }
    }

    /// 1 when any of `regs` is live, else 0.
    fn any_live(&mut self, regs: &[u32]) -> Value {
        let mut any = self.b.ins().iconst(types::I8, 0);
        for &r in regs {
            let l = self.load_byte(self.live, r as usize);
            any = self.b.ins().bor(any, l);
        }
        any
    }

    /// 1 when a control input of `step` is dead.
    pub(super) fn control_dead(&mut self, step: &BufferStep) -> Value {
        let mut dead = self.b.ins().iconst(types::I8, 0);
        for &c in &step.controls {
            let d = self.load_byte(self.dead, c as usize);
            dead = self.b.ins().bor(dead, d);
        }
        dead
    }

    /// A step other than a merge is dead when a control is or an input is not live: its
    /// outputs are then not live and the code goes on at `next`.
    fn guard(&mut self, step: &BufferStep, next: Block) {
        let mut alive = self.control_dead(step);
        alive = self.b.ins().bxor_imm_u(alive, 1);
        for r in &step.reads {
            let l = self.load_byte(self.live, r.reg as usize);
            alive = self.b.ins().band(alive, l);
        }
        let (run, skip) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(alive, run, &[], skip, &[]);
        self.b.switch_to_block(skip);
        self.set_dead(step.node, true);
        for o in step.out..step.out + step.outputs {
            self.set_live(o as usize, false);
        }
        self.b.ins().jump(next, &[]);
        self.b.switch_to_block(run);
        self.set_dead(step.node, false);
    }

    /// A merge of `considered`: its first live input, unless a control is dead.
    fn merge(&mut self, step: &BufferStep, considered: &[Read], next: Block) {
        let out = step.out as usize;
        let (live_end, dead_end) = (self.b.create_block(), self.b.create_block());
        let control_dead = self.control_dead(step);
        let first = self.b.create_block();
        self.b.ins().brif(control_dead, dead_end, &[], first, &[]);
        self.b.switch_to_block(first);
        for &r in considered {
            let (take, other) = (self.b.create_block(), self.b.create_block());
            let l = self.load_byte(self.live, r.reg as usize);
            self.b.ins().brif(l, take, &[], other, &[]);
            self.b.switch_to_block(take);
            self.transfer(r, out);
            self.b.ins().jump(live_end, &[]);
            self.b.switch_to_block(other);
        }
        self.b.ins().jump(dead_end, &[]);
        for (end, live) in [(live_end, true), (dead_end, false)] {
            self.b.switch_to_block(end);
            self.release(considered);
            self.set_live(out, live);
            self.set_dead(step.node, !live);
            self.b.ins().jump(next, &[]);
        }
    }

    /// What a live step does (its guard passed).
    fn action(&mut self, k: usize, step: &BufferStep, next: Block) -> Option<()> {
        let out = step.out as usize;
        match &step.action {
            BufferAction::Pass => {
                if step.in_place & 1 == 0 {
                    self.transfer(step.reads[0], out);
                }
                self.release(&step.reads);
                self.set_live(out, true);
            }
            BufferAction::Switch(n) => self.switch(step, *n),
            BufferAction::Kernel(_) | BufferAction::Update(_) => {
                if matches!(step.action, BufferAction::Update(_)) {
                    // The accumulator's buffer becomes the output before the kernel adds into it.
                    self.transfer(step.reads[0], out);
                }
                match &step.inline {
                    Some(e) if e.unrolls() => self.elementwise(step, e)?,
                    _ => {
                        let code = match lane_map_elements(self.frame, step) {
                            Some(n) => self.map_lanes(k, step, n),
                            None => self.call_kernel(k, step),
                        };
                        let cont = self.b.create_block();
                        self.check(k, code, cont);
                        self.b.switch_to_block(cont);
                    }
                }
                self.release(&step.reads);
                self.set_live(out, true);
            }
            BufferAction::Const(storage) => {
                let bytes = storage.len() * storage.dtype().size();
                let src = self.address_of(address_of_elements(storage));
                let dst = self.address(out);
                self.copy(dst, src, bytes);
                self.set_live(out, true);
            }
            BufferAction::Push | BufferAction::Pop if self.in_place_stack(step) => {
                self.stack_in_place(k, step)
            }
            BufferAction::Push | BufferAction::Pop => {
                let ctx = self.ctx;
                let index = self.b.ins().iconst(types::I32, k as i64);
                let f = self.address_of(stack_step as *const u8);
                let call = self.b.ins().call_indirect(self.stack_sig, f, &[ctx, index]);
                let code = self.b.inst_results(call)[0];
                let cont = self.b.create_block();
                self.check(k, code, cont);
                self.b.switch_to_block(cont);
            }
            BufferAction::NoOp => {}
            _ => return None,
        }
        self.b.ins().jump(next, &[]);
        Some(())
    }

    /// Whether a push or pop can run in place on its stack (`push_in_place`, `pop_in_place`):
    /// the stack moves on (its last read) and the buffer has the stack's static item type.
    fn in_place_stack(&self, step: &BufferStep) -> bool {
        let slots = &self.frame.slots;
        let buffer = match step.action {
            BufferAction::Push => step.reads.get(1).map(|r| r.reg),
            _ => Some(step.out + 1),
        };
        let item = |reg: u32| slots.get(reg as usize).and_then(|s| s.tensor());
        let Some(Slot::Value(ValueType::Stack(element))) = slots.get(step.reads[0].reg as usize)
        else {
            return false;
        };
        step.reads[0].take && buffer.and_then(item) == Some(element)
    }

    /// A push or pop on the stack where it lies, then the stack moved to the output inline;
    /// where that cannot be done (a stack of tensors, an empty one) `stack_step` runs the
    /// step, errors included.
    fn stack_in_place(&mut self, k: usize, step: &BufferStep) {
        let out = step.out as usize;
        let slot = self.value_slot(step.reads[0].reg as usize);
        let (f, buffer) = match step.action {
            BufferAction::Push => (push_in_place as *const u8, step.data[1] as usize),
            _ => (pop_in_place as *const u8, out + 1),
        };
        let buffer = self.storage(buffer);
        let f = self.address_of(f);
        let call = self
            .b
            .ins()
            .call_indirect(self.in_place_sig, f, &[slot, buffer]);
        let missed = self.b.inst_results(call)[0];
        let (done, general, after) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        self.b.set_cold_block(general);
        self.b.ins().brif(missed, general, &[], done, &[]);
        self.b.switch_to_block(general);
        let ctx = self.ctx;
        let index = self.b.ins().iconst(types::I32, k as i64);
        let f = self.address_of(stack_step as *const u8);
        let call = self.b.ins().call_indirect(self.stack_sig, f, &[ctx, index]);
        let code = self.b.inst_results(call)[0];
        self.check(k, code, after);
        self.b.switch_to_block(done);
        self.transfer(step.reads[0], out);
        self.release(&step.reads);
        self.set_live(out, true);
        if matches!(step.action, BufferAction::Pop) {
            self.set_live(out + 1, true);
        }
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(after);
    }

    fn switch(&mut self, step: &BufferStep, n: usize) {
        let out = step.out as usize;
        let selector = step.reads[1].reg as usize;
        let is_bool = matches!(
            self.frame.slots[selector].tensor().map(|t| t.dtype),
            Some(DType::Bool)
        );
        let address = self.address(selector);
        let k = if is_bool {
            let v = self.b.ins().load(types::I8, flags(), address, 0);
            self.b.ins().uextend(types::I32, v)
        } else {
            // The switch's rule (`executor::switch`): an index out of range, negative
            // included, picks the last output.
            let v = self.b.ins().load(types::I32, flags(), address, 0);
            let last = self.b.ins().iconst(types::I32, n as i64 - 1);
            let inside = self
                .b
                .ins()
                .icmp_imm_s(IntCC::UnsignedLessThan, v, n as i64);
            self.b.ins().select(inside, v, last)
        };
        for o in out..out + n {
            self.set_live(o, false);
        }
        let after = self.b.create_block();
        for j in 0..n {
            let (chosen, other) = (self.b.create_block(), self.b.create_block());
            if j + 1 < n {
                let is_j = self.b.ins().icmp_imm_s(IntCC::Equal, k, j as i64);
                self.b.ins().brif(is_j, chosen, &[], other, &[]);
            } else {
                self.b.ins().jump(chosen, &[]);
            }
            self.b.switch_to_block(chosen);
            if j >= 32 || step.in_place & (1 << j) == 0 {
                self.transfer(step.reads[0], out + j);
            }
            self.set_live(out + j, true);
            self.b.ins().jump(after, &[]);
            self.b.switch_to_block(other);
        }
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(after);
        self.release(&step.reads);
    }

    /// Registers read for the last time are not live afterwards (a value's reference dropped).
    pub(super) fn release(&mut self, reads: &[Read]) {
        for r in reads.iter().filter(|r| r.take) {
            self.set_live(r.reg as usize, false);
            if self.frame.holds_value[r.reg as usize] {
                // Mostly empty already (a move left it so): only a slot holding a value is
                // cleared by a call.
                let slot = self.value_slot(r.reg as usize);
                let held = self.b.ins().load(self.ptr, flags(), slot, 0);
                let (clear, after) = (self.b.create_block(), self.b.create_block());
                self.b.set_cold_block(clear);
                self.b.ins().brif(held, clear, &[], after, &[]);
                self.b.switch_to_block(clear);
                let reg = self.b.ins().iconst(types::I32, i64::from(r.reg));
                let f = self.address_of(clear_value as *const u8);
                let ctx = self.ctx;
                self.b.ins().call_indirect(self.clear_sig, f, &[ctx, reg]);
                self.b.ins().jump(after, &[]);
                self.b.switch_to_block(after);
            }
        }
    }

    /// The address of value register `reg`'s slot (an `Option<Box<RtValue>>`, null when empty).
    fn value_slot(&mut self, reg: usize) -> Value {
        let p = self.buffer_index(reg);
        let offset = self.b.ins().imul_imm_u(p, size_of::<usize>() as i64);
        self.b.ins().iadd(self.values, offset)
    }

    /// Register `reg`'s buffer index.
    fn buffer_index(&mut self, reg: usize) -> Value {
        let p = self
            .b
            .ins()
            .load(types::I32, flags(), self.phys, 4 * reg as i32);
        self.b.ins().uextend(self.ptr, p)
    }

    /// The address of register `reg`'s first element.
    pub(super) fn address(&mut self, reg: usize) -> Value {
        let p = self.buffer_index(reg);
        let offset = self.b.ins().ishl_imm_u(p, 3);
        let at = self.b.ins().iadd(self.data, offset);
        self.b.ins().load(self.ptr, flags(), at, 0)
    }

    /// The address of register `reg`'s `Storage`.
    fn storage(&mut self, reg: usize) -> Value {
        let p = self.buffer_index(reg);
        let offset = self.b.ins().imul_imm_u(p, size_of::<Storage>() as i64);
        self.b.ins().iadd(self.buffers, offset)
    }

    /// Register `from`'s value into register `to`: a move exchanges their buffers, a read
    /// before the last copies the elements.
    fn transfer(&mut self, from: Read, to: usize) {
        let r = from.reg as usize;
        if self.frame.holds_value[r] && !from.take {
            let ctx = self.ctx;
            let args = [
                ctx,
                self.b.ins().iconst(types::I32, r as i64),
                self.b.ins().iconst(types::I32, to as i64),
            ];
            let f = self.address_of(share_value as *const u8);
            self.b.ins().call_indirect(self.share_sig, f, &args);
            return;
        }
        // A move exchanges the registers' slots, values' as buffers' (`State::value`).
        if from.take {
            let a = self
                .b
                .ins()
                .load(types::I32, flags(), self.phys, 4 * r as i32);
            let c = self
                .b
                .ins()
                .load(types::I32, flags(), self.phys, 4 * to as i32);
            self.b.ins().store(flags(), c, self.phys, 4 * r as i32);
            self.b.ins().store(flags(), a, self.phys, 4 * to as i32);
            return;
        }
        let bytes = self.frame.slots[r]
            .tensor()
            .map_or(0, |t| numel(&t.shape) * t.dtype.size());
        let (src, dst) = (self.address(r), self.address(to));
        self.copy(dst, src, bytes);
    }

    fn copy(&mut self, dst: Value, src: Value, bytes: usize) {
        if bytes > INLINE_COPY {
            let f = self.address_of(copy_bytes as *const u8);
            let n = self.b.ins().iconst(self.ptr, bytes as i64);
            self.b.ins().call_indirect(self.copy_sig, f, &[dst, src, n]);
            return;
        }
        let mut at = 0;
        for (width, ty) in [
            (16, types::I8X16),
            (8, types::I64),
            (4, types::I32),
            (2, types::I16),
            (1, types::I8),
        ] {
            while bytes - at >= width {
                let v = self.b.ins().load(ty, flags(), src, at as i32);
                self.b.ins().store(flags(), v, dst, at as i32);
                at += width;
            }
        }
    }

    fn call_kernel(&mut self, k: usize, step: &BufferStep) -> Value {
        let null = self.b.ins().iconst(self.ptr, 0);
        let mut args = vec![self.ctx, self.b.ins().iconst(types::I32, k as i64)];
        // An update's first input is the output's buffer, moved there.
        let skip = usize::from(matches!(step.action, BufferAction::Update(_)));
        for j in 0..3 {
            let a = match step.data.get(skip + j) {
                Some(&reg) => self.storage(reg as usize),
                None => null,
            };
            args.push(a);
        }
        let out = self.storage(step.out as usize);
        args.push(out);
        let f = self.address_of(call_kernel as *const u8);
        let call = self.b.ins().call_indirect(self.call_kernel_sig, f, &args);
        self.b.inst_results(call)[0]
    }

    fn map_lanes(&mut self, k: usize, step: &BufferStep, n: usize) -> Value {
        let args = [
            self.ctx,
            self.b.ins().iconst(types::I32, k as i64),
            self.address(step.data[0] as usize),
            self.address(step.out as usize),
            self.b.ins().iconst(self.ptr, n as i64),
        ];
        let f = self.address_of(map_lanes as *const u8);
        let call = self.b.ins().call_indirect(self.map_lanes_sig, f, &args);
        self.b.inst_results(call)[0]
    }

    /// An elementwise op computed inline: vectors of 16 bytes where the form is one vector
    /// instruction, then single elements.
    fn elementwise(&mut self, step: &BufferStep, e: &Elementwise) -> Option<()> {
        let inputs: Vec<Value> = step
            .data
            .iter()
            .map(|&r| self.address(r as usize))
            .collect();
        let out = self.address(step.out as usize);
        let lanes = e.lanes();
        let mut at = 0;
        while at < e.elements {
            let width = if lanes > 1 && at + lanes <= e.elements {
                lanes
            } else {
                1
            };
            let args: Vec<Value> = (0..inputs.len())
                .map(|j| self.operand(e, j, inputs[j], at, width))
                .collect();
            let v = apply(&mut self.b, e, &args)?;
            let offset = (at * e.result.size()) as i32;
            self.b.ins().store(flags(), v, out, offset);
            at += width;
        }
        Some(())
    }

    /// Elements `at..at + width` of operand `j` (its one element, splat, where broadcast).
    fn operand(
        &mut self,
        e: &Elementwise,
        j: usize,
        base: Value,
        at: usize,
        width: usize,
    ) -> Value {
        let dtype = e.operands[j];
        if e.broadcast[j] {
            let x = self.b.ins().load(value_type(dtype, 1), flags(), base, 0);
            if width == 1 {
                return x;
            }
            return self.b.ins().splat(value_type(dtype, width), x);
        }
        let offset = (at * dtype.size()) as i32;
        self.b
            .ins()
            .load(value_type(dtype, width), flags(), base, offset)
    }
}
