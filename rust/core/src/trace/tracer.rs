//! `Tracer` (frames of functions under construction, captures, the library being built) and
//! `TraceContext` (the `Context` that runs ops eagerly or adds them to the trace).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use super::{Symbol, Val};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::{
    Constant, FunctionBuilder, Graph, Library, Location, NodeId, NodeKind, Port, ValueType,
};
use crate::ops::{execute, Context};
use crate::ops::{Op, Values};
use crate::runtime_values::{RtValue, VariableRef};
use crate::shape::TensorType;
use crate::tensor::{Tensor, TensorId};

/// Identifies a frame across all tracers (a symbol of another trace is never mistaken for one
/// of this trace).
pub type FrameId = u64;

static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// A tracer shared by the code that traces and the gradient functions that extend the trace.
/// It is locked per node added, never while user code or a gradient rule runs.
pub type TracerRef = Arc<Mutex<Tracer>>;

/// Locks `tracer` (a poisoned lock only means a panic elsewhere; the trace is still whole).
pub fn lock(tracer: &TracerRef) -> MutexGuard<'_, Tracer> {
    tracer.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a capture is keyed by: an outer symbol's port (several `Symbol`s may name one port),
/// or a concrete tensor's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CaptureKey {
    Port(FrameId, Port),
    Tensor(TensorId),
}

fn capture_key(v: &Val) -> CaptureKey {
    match v {
        Val::Symbol(s) => CaptureKey::Port(s.frame, s.port),
        Val::Tensor(t) => CaptureKey::Tensor(t.id()),
        Val::Batched(lanes) => CaptureKey::Tensor(lanes.id()),
    }
}

/// The error for a lane of a `vmap` used where no batching context holds it: it was kept
/// past the end of its `vmap` call.
pub(crate) fn escaped_lanes(op: &'static str) -> Error {
    Error::invalid(
        op,
        "a batched value was used outside the vmap call, branch or loop body that computed it \
         (kept past its end): return it from there instead",
    )
}

struct Frame {
    id: FrameId,
    builder: FunctionBuilder,
    /// Outer values captured, in the order of the parameters they became.
    captures: Vec<Val>,
    /// Outer value (or constant) -> its port in this frame.
    captured: HashMap<CaptureKey, Port>,
    /// The last stateful node: the next one runs after it (program order).
    last_stateful: Option<NodeId>,
    /// Nodes with side effects: the function's control outputs.
    effects: Vec<NodeId>,
}

impl Frame {
    fn new(name: &str, params: Vec<ValueType>) -> (Frame, Vec<Val>) {
        let id = NEXT_FRAME.fetch_add(1, Ordering::Relaxed);
        let types = params.clone();
        let (builder, ports) = FunctionBuilder::new(name, params);
        let vals = ports
            .into_iter()
            .zip(types)
            .map(|(p, ty)| Val::Symbol(Symbol::new(id, p, ty)))
            .collect();
        let frame = Frame {
            id,
            builder,
            captures: Vec::new(),
            captured: HashMap::new(),
            last_stateful: None,
            effects: Vec::new(),
        };
        (frame, vals)
    }
}

/// A value the entry function captured: passed after the own parameters on every call.
#[derive(Clone, Debug)]
pub enum Captured {
    /// A concrete tensor the traced code closed over.
    Tensor(Tensor),
    /// A variable the traced code read or wrote (a resource parameter).
    Variable(VariableRef),
}

impl Captured {
    /// The value to pass to the interpreter.
    pub fn runtime_value(&self) -> RtValue {
        match self {
            Captured::Tensor(t) => RtValue::Tensor(t.clone()),
            Captured::Variable(v) => RtValue::Resource(v.clone()),
        }
    }
}

/// A finished trace: the graph, and the values the entry captured (they follow the
/// `num_params` own parameters and are passed on every call).
#[derive(Clone, Debug)]
pub struct Traced {
    pub graph: Graph,
    pub num_params: usize,
    pub captured_inputs: Vec<Captured>,
}

/// Functions under construction (a stack of frames) and the library they join.
pub struct Tracer {
    library: Library,
    frames: Vec<Frame>,
    stashed: Vec<Vec<Frame>>,
    names: HashSet<String>,
    captured_inputs: Vec<Captured>,
    /// Variables captured by the entry, with their resource parameters.
    variables: Vec<(VariableRef, Val)>,
    num_params: usize,
    /// Source location stamped on the nodes added next.
    pub location: Option<Location>,
    /// Gradient constructions already made for a node (see `gradients`).
    pub(super) augmented: HashMap<(FrameId, NodeId), Arc<super::gradients::Augmented>>,
    /// The assignment helpers of `passes::Assignments::Credited`, by variable type.
    assignment_helpers: HashMap<TensorType, (String, String)>,
    /// Loop gradients in fixed-size state (`While::fixed_state`): what a loop without
    /// `checkpoints` keeps when it has no `maximum_iterations`; None: stacks.
    pub fixed_state_loops: Option<u32>,
    /// Values made before this id (`tensor::id_epoch`) are inputs of the trace: scalars are
    /// captured rather than folded into constants, and ops on them are traced rather than run
    /// at once. An eager construct staged as a graph (`gl.while_loop(..., checkpoints=c)`
    /// under a tape) so differentiates every tensor it closes over. None: what `@gl.function`
    /// does (scalars are constants, concrete work runs while tracing).
    pub closed_over_before: Option<TensorId>,
    /// One lane's frames (`begin_lane_frames`): from frame index `.0` on, values of the levels
    /// `.1` are captured as one lane's values, to be batched where the frame is called.
    lane_frames: Vec<(usize, Vec<u64>)>,
}

fn control_flow_error(message: String) -> Error {
    Error::new(ErrorKind::ControlFlow, "trace", message)
}

impl Tracer {
    /// Starts tracing function `name` with parameters of `params` types (entry of the graph).
    pub fn new(name: &str, params: Vec<ValueType>) -> (TracerRef, Vec<Val>) {
        Self::with_library(Library::new(), name, params)
    }

    /// Starts tracing `name` into an existing library (adding a function to imported graphs).
    pub fn with_library(
        library: Library,
        name: &str,
        params: Vec<ValueType>,
    ) -> (TracerRef, Vec<Val>) {
        let num_params = params.len();
        let names = library.iter().map(|f| f.name.clone()).collect();
        let mut tracer = Tracer {
            library,
            frames: Vec::new(),
            stashed: Vec::new(),
            names,
            captured_inputs: Vec::new(),
            variables: Vec::new(),
            num_params,
            location: None,
            augmented: HashMap::new(),
            assignment_helpers: HashMap::new(),
            lane_frames: Vec::new(),
            fixed_state_loops: None,
            closed_over_before: None,
        };
        let name = tracer.unique_name(name);
        let (frame, vals) = Frame::new(&name, params);
        tracer.frames.push(frame);
        (Arc::new(Mutex::new(tracer)), vals)
    }

    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Replaces a function this trace built (capture unification re-signs branches).
    pub(super) fn replace_function(&mut self, function: crate::graph::Function) -> Result<()> {
        self.library.replace(function)
    }

    /// Number of open frames (1 while only the entry is being built).
    pub fn depth(&self) -> usize {
        self.frames.len()
    }

    /// Id of the innermost open frame.
    pub fn top_frame(&self) -> FrameId {
        self.frames.last().map_or(0, |f| f.id)
    }

    /// Position of an open frame in the stack.
    pub fn frame_index(&self, id: FrameId) -> Option<usize> {
        self.frames.iter().position(|f| f.id == id)
    }

    fn unique_name(&mut self, hint: &str) -> String {
        let mut name = hint.to_string();
        let mut n = 1;
        while self.names.contains(&name) {
            name = format!("{hint}_{n}");
            n += 1;
        }
        self.names.insert(name.clone());
        name
    }

    /// A function name not used yet in this trace.
    pub(crate) fn fresh_name(&mut self, hint: &str) -> String {
        self.unique_name(hint)
    }

    /// The assignment helpers for variables of `types` (`passes::Assignments::Credited`),
    /// added to the library the first time a type needs one.
    pub(super) fn assignment_helpers(
        &mut self,
        types: &[TensorType],
    ) -> Result<HashMap<TensorType, (String, String)>> {
        for ty in types {
            if self.assignment_helpers.contains_key(ty) || !ty.dtype.is_float() {
                continue;
            }
            let name = self.unique_name("assigned_value");
            let gradient = self.unique_name(&format!("{name}_grad"));
            let (value, grad) = crate::passes::assigned_value_functions(ty, &name, &gradient)?;
            self.library.add(value)?;
            self.library.add(grad)?;
            self.assignment_helpers
                .insert(ty.clone(), (name.clone(), gradient));
        }
        Ok(self.assignment_helpers.clone())
    }

    /// Adds `function` under a name no frame of this trace uses, or replaces the function of
    /// that name this trace built.
    pub(super) fn put_function(&mut self, function: crate::graph::Function) -> Result<()> {
        if self.library.contains(&function.name) {
            return self.library.replace(function);
        }
        if !self.names.insert(function.name.clone()) {
            return Err(Error::internal(
                "trace",
                format!("@{} is the name of a function being traced", function.name),
            ));
        }
        self.library.add(function)
    }

    /// Adds a function built outside the frames (gradient transforms); its name must be fresh.
    pub(crate) fn add_function(&mut self, function: crate::graph::Function) -> Result<()> {
        self.library.add(function)
    }

    /// Drops the innermost frame without adding its function (a failed construction).
    pub fn abandon_function(&mut self) {
        if self.frames.len() > 1 {
            self.frames.pop();
        }
    }

    /// Opens a frame for a new function (a branch, a loop body); returns its parameters.
    pub fn push_function(&mut self, hint: &str, params: Vec<ValueType>) -> Vec<Val> {
        let name = self.unique_name(hint);
        let (frame, vals) = Frame::new(&name, params);
        self.frames.push(frame);
        vals
    }

    /// Closes the innermost frame with `results`; the function joins the library. Returns its
    /// name and the outer values it captured (its parameters after its own, in order).
    pub fn pop_function(&mut self, results: &[Val]) -> Result<(String, Vec<Val>)> {
        if self.frames.len() < 2 {
            return Err(control_flow_error(
                "no inner function is being traced".into(),
            ));
        }
        let top = self.frames.len() - 1;
        let ports = results
            .iter()
            .map(|v| self.port(top, v))
            .collect::<Result<Vec<_>>>()?;
        let frame = self.frames.pop().expect("checked above");
        let name = frame.builder.name().to_string();
        let function = frame.builder.finish(&ports, &frame.effects)?;
        self.library.add(function)?;
        Ok((name, frame.captures))
    }

    /// Finishes the entry function with `results`; functions nothing calls are dropped.
    pub fn finish(&mut self, results: &[Val]) -> Result<Traced> {
        if self.frames.len() != 1 {
            return Err(control_flow_error(format!(
                "{} inner functions are still open",
                self.frames.len() - 1
            )));
        }
        let ports = results
            .iter()
            .map(|v| self.port(0, v))
            .collect::<Result<Vec<_>>>()?;
        let frame = self.frames.pop().expect("checked above");
        let entry = frame.builder.name().to_string();
        let function = frame.builder.finish(&ports, &frame.effects)?;
        let mut library = std::mem::take(&mut self.library);
        library.add(function)?;
        let library = reachable(&library, &entry)?;
        Ok(Traced {
            graph: Graph::new(library, entry)?,
            num_params: self.num_params,
            captured_inputs: std::mem::take(&mut self.captured_inputs),
        })
    }

    /// The resource value of `variable` (a parameter of the entry, captured inward as needed):
    /// apply `ReadVariable`/`AssignVariable` nodes to it.
    pub fn capture_variable(&mut self, variable: &VariableRef) -> Val {
        if let Some((_, v)) = self.variables.iter().find(|(r, _)| r.same(variable)) {
            return v.clone();
        }
        let ty = ValueType::Resource(variable.ty().clone());
        let port = self.frames[0].builder.add_param(ty.clone());
        self.captured_inputs
            .push(Captured::Variable(variable.clone()));
        let v = Val::Symbol(Symbol::new(self.frames[0].id, port, ty));
        self.variables.push((variable.clone(), v.clone()));
        v
    }

    /// Sets aside the frames above `index` (gradients build functions over the frame a node
    /// lives in); `unstash` puts them back.
    pub(super) fn stash_above(&mut self, index: usize) {
        let above = self.frames.split_off(index + 1);
        self.stashed.push(above);
    }

    pub(super) fn unstash(&mut self) {
        if let Some(mut above) = self.stashed.pop() {
            self.frames.append(&mut above);
        }
    }

    /// The port of `v` in frame `k`, capturing it (through every frame between) if it lives
    /// outside.
    /// The frames opened from now on until `end_lane_frames` are one lane's, inside `vmap`
    /// calls of `levels`, which are set aside meanwhile: a value of those levels they use is
    /// captured as one lane's value (a parameter of the outermost of them), and the call of
    /// that frame's function is batched as a node.
    pub fn begin_lane_frames(&mut self, levels: Vec<u64>) {
        self.lane_frames.push((self.frames.len(), levels));
    }

    pub fn end_lane_frames(&mut self) {
        self.lane_frames.pop();
    }

    /// The first of the lane frames that may capture `v` (a lane view), if any does.
    fn lane_frame_of(&self, v: &Val) -> Option<usize> {
        let level = v.as_lanes()?.level();
        self.lane_frames
            .iter()
            .rev()
            .find(|(_, levels)| levels.contains(&level))
            .map(|(first, _)| *first)
    }

    /// Whether every lane view among `inputs` can be captured by the current frame.
    pub(crate) fn captures_lanes(&self, inputs: &[Val]) -> bool {
        let top = self.frames.len().saturating_sub(1);
        inputs
            .iter()
            .filter(|v| v.as_lanes().is_some())
            .all(|v| self.lane_frame_of(v).is_some_and(|first| first <= top))
    }

    fn port(&mut self, k: usize, v: &Val) -> Result<Port> {
        if let Val::Batched(_) = v {
            let Some(first) = self.lane_frame_of(v).filter(|&f| f <= k && f > 0) else {
                return Err(escaped_lanes("trace"));
            };
            let key = capture_key(v);
            if let Some(&p) = self.frames[k].captured.get(&key) {
                return Ok(p);
            }
            if k > first {
                self.port(k - 1, v)?;
            }
            let frame = &mut self.frames[k];
            frame.captures.push(v.clone());
            let port = frame.builder.add_param(v.value_type());
            frame.captured.insert(key, port);
            return Ok(port);
        }
        if let Val::Symbol(s) = v {
            if s.frame == self.frames[k].id {
                return Ok(s.port);
            }
        }
        let key = capture_key(v);
        if let Some(&p) = self.frames[k].captured.get(&key) {
            return Ok(p);
        }
        if let Val::Symbol(s) = v {
            if let Some(p) = self.rematerialize(k, s)? {
                return Ok(p);
            }
        }
        let port = match v {
            Val::Tensor(t) if t.ndim() == 0 && !self.closed_over(t) => {
                self.frames[k].builder.add_const(t.clone())
            }
            Val::Tensor(t) if k == 0 => {
                self.captured_inputs.push(Captured::Tensor(t.clone()));
                self.frames[0].builder.add_param(v.value_type())
            }
            Val::Symbol(s) if k == 0 || self.frame_index(s.frame).is_none_or(|j| j >= k) => {
                return Err(control_flow_error(format!(
                    "a {} traced inside a cond branch, loop body or another function \
                     cannot be used outside of it; return it from that function instead",
                    s.value_type()
                )));
            }
            _ => {
                self.port(k - 1, v)?;
                let frame = &mut self.frames[k];
                frame.captures.push(v.clone());
                frame.builder.add_param(v.value_type())
            }
        };
        self.frames[k].captured.insert(key, port);
        Ok(port)
    }

    /// Whether concrete `t` is an input of the trace (see `closed_over_before`): made before
    /// the trace began, a value the traced code closes over rather than one it made.
    pub fn closed_over(&self, t: &Tensor) -> bool {
        self.closed_over_before.is_some_and(|first| t.id() < first)
    }

    /// A stack of an enclosing frame is recomputed in frame `k` instead of captured: stacks
    /// never become residuals (a loop would need a stack of stacks). Gradients of nested loops
    /// use this: the inner loop's stacks are rebuilt by rerunning the (side-effect free) node
    /// that made them from captured tensors. `None` when `s` is not such a stack.
    fn rematerialize(&mut self, k: usize, s: &Symbol) -> Result<Option<Port>> {
        if !matches!(s.value_type(), ValueType::Stack(_)) {
            return Ok(None);
        }
        let Some(j) = self.frame_index(s.frame).filter(|&j| j < k) else {
            return Ok(None);
        };
        let node = self.frames[j].builder.node(s.port.node)?.clone();
        if matches!(node.kind, NodeKind::Arg(_)) || self.statefulness(&node.kind)?.0 {
            return Ok(None);
        }
        let mut ports = Vec::with_capacity(node.inputs.len());
        for &p in &node.inputs {
            let ty = self.frames[j].builder.port_type(p)?.clone();
            let input = Val::Symbol(Symbol::new(s.frame, p, ty));
            ports.push(self.port(k, &input)?);
        }
        let b = &mut self.frames[k].builder;
        let new = b.add_node(node.kind.clone(), &ports, node.outputs.clone())?;
        if let Some(l) = node.location {
            let id = b.len() - 1;
            b.set_location(id, l)?;
        }
        for (o, &p) in new.iter().enumerate() {
            let key = CaptureKey::Port(s.frame, Port::new(s.port.node, o));
            self.frames[k].captured.insert(key, p);
        }
        Ok(Some(new[s.port.output]))
    }

    fn symbols(&self, ports: Vec<Port>) -> Result<Values<Val>> {
        let frame = self.frames.last().expect("a tracer always has a frame");
        ports
            .into_iter()
            .map(|p| {
                let ty = frame.builder.port_type(p)?.clone();
                Ok(Val::Symbol(Symbol::new(frame.id, p, ty)))
            })
            .collect()
    }

    fn top_ports(&mut self, inputs: &[Val]) -> Result<SmallVec<[Port; 4]>> {
        let top = self.frames.len() - 1;
        inputs.iter().map(|v| self.port(top, v)).collect()
    }

    /// Adds `op` applied to `inputs` to the innermost frame.
    pub fn add_op(&mut self, op: &Op, inputs: &[Val]) -> Result<Values<Val>> {
        let ports = self.top_ports(inputs)?;
        let location = self.location.clone();
        let builder = &mut self.frames.last_mut().expect("open frame").builder;
        let outputs = builder.add_op(op.clone(), &ports, location)?;
        self.symbols(outputs)
    }

    /// Adds a non-op node (control flow, constant, variable or stack) to the innermost frame.
    /// Stateful nodes are chained in program order; side effects become control outputs.
    pub fn add_node(&mut self, kind: &NodeKind, inputs: &[Val]) -> Result<Values<Val>> {
        let ports = self.top_ports(inputs)?;
        let outputs = self.node_outputs(kind, inputs)?;
        let (stateful, effect) = self.statefulness(kind)?;
        let location = self.location.clone();
        let frame = self.frames.last_mut().expect("open frame");
        let b = &mut frame.builder;
        let new = b.add_node(kind.clone(), &ports, outputs)?;
        let id = b.len() - 1;
        if let Some(l) = location {
            b.set_location(id, l)?;
        }
        if stateful {
            if let Some(prev) = frame.last_stateful {
                b.add_control_inputs(id, &[prev])?;
            }
            frame.last_stateful = Some(id);
        }
        if effect {
            frame.effects.push(id);
        }
        self.symbols(new)
    }

    /// Declares that the node producing `new_first` supersedes the node producing `old_first`
    /// in the innermost frame (see `FunctionBuilder::supersede`).
    pub(super) fn supersede(&mut self, old: NodeId, new: NodeId) -> Result<()> {
        let frame = self.frames.last_mut().expect("open frame");
        if frame.last_stateful == Some(new) {
            // `new` was chained after the last stateful node; it takes `old`'s place instead.
            let before = frame.builder.node(new)?.control_inputs.last().copied();
            frame.last_stateful = before.filter(|&b| b != old).or(Some(new));
        } else if frame.last_stateful == Some(old) {
            frame.last_stateful = Some(new);
        }
        frame.effects.retain(|&e| e != old);
        frame.builder.supersede(old, new)
    }

    /// (stateful, side effect) for a node kind.
    fn statefulness(&self, kind: &NodeKind) -> Result<(bool, bool)> {
        match kind.construct() {
            Some(c) => c.state(&self.library),
            None => Ok((false, false)),
        }
    }

    fn node_outputs(&self, kind: &NodeKind, inputs: &[Val]) -> Result<Vec<ValueType>> {
        let types: Vec<ValueType> = inputs.iter().map(Val::value_type).collect();
        let types: Vec<&ValueType> = types.iter().collect();
        match kind {
            NodeKind::Const(Constant(t)) => Ok(vec![ValueType::Tensor(t.ty().clone())]),
            _ => match kind.construct() {
                Some(c) => c.output_types(&self.library, &types),
                None => Err(Error::internal(kind.name(), "not a non-op node")),
            },
        }
    }
}

/// The functions of `library` that `entry` reaches (in the library's order).
fn reachable(library: &Library, entry: &str) -> Result<Library> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut todo = vec![entry.to_string()];
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            for node in &library.get(&name)?.nodes {
                todo.extend(node.kind.referenced().into_iter().map(str::to_string));
            }
        }
    }
    let mut out = Library::new();
    // The entry first, so the text reads top-down.
    out.add(library.get(entry)?.clone())?;
    for f in library
        .iter()
        .filter(|f| f.name != entry && seen.contains(&f.name))
    {
        out.add(f.clone())?;
    }
    Ok(out)
}

/// Runs ops eagerly when every input is concrete, and adds them to the trace otherwise (an op
/// without inputs joins the trace when there is one, so `zeros` inside a function is a node).
#[derive(Clone, Default)]
pub struct TraceContext {
    pub tracer: Option<TracerRef>,
    /// Concrete outputs keep their elements on the heap (`Tensor::on_heap`), so that forward
    /// mode can tell when a value is gone; set while accumulators are active.
    pub heap_outputs: bool,
}

impl TraceContext {
    pub fn new(tracer: Option<TracerRef>) -> Self {
        TraceContext {
            tracer,
            heap_outputs: false,
        }
    }

    /// Whether concrete `inputs` include a value the trace closes over: the op is then traced,
    /// so that the trace stays a function of it.
    fn traces_inputs(&self, inputs: &[Val]) -> bool {
        let Some(tracer) = &self.tracer else {
            return false;
        };
        let tracer = lock(tracer);
        tracer.closed_over_before.is_some()
            && inputs
                .iter()
                .any(|v| v.as_tensor().is_some_and(|t| tracer.closed_over(t)))
    }

    /// Whether lane views among `inputs`, if any, are one lane's values the current frame
    /// captures (`Tracer::begin_lane_frames`); else they were kept past their `vmap`.
    fn takes_lanes(&self, inputs: &[Val]) -> bool {
        if !inputs.iter().any(|v| v.as_lanes().is_some()) {
            return true;
        }
        self.tracer
            .as_ref()
            .is_some_and(|t| lock(t).captures_lanes(inputs))
    }

    fn tracer_ref(&self, what: &str) -> Result<&TracerRef> {
        self.tracer.as_ref().ok_or_else(|| {
            control_flow_error(format!(
                "{what} got a symbolic value but no function is being traced"
            ))
        })
    }
}

impl Context<Val> for TraceContext {
    fn apply(&mut self, op: &Op, inputs: &[Val]) -> Result<Values<Val>> {
        if !self.takes_lanes(inputs) {
            return Err(escaped_lanes(op.name()));
        }
        let concrete = inputs.iter().all(Val::is_concrete);
        if concrete && (self.tracer.is_none() || !inputs.is_empty()) && !self.traces_inputs(inputs)
        {
            let tensors: SmallVec<[Tensor; 2]> = inputs
                .iter()
                .filter_map(|v| v.as_tensor().cloned())
                .collect();
            let outputs = execute(op, &tensors)?;
            let heap = self.heap_outputs;
            return Ok(outputs
                .into_iter()
                .map(|t| Val::Tensor(if heap { t.on_heap() } else { t }))
                .collect());
        }
        lock(self.tracer_ref(op.name())?).add_op(op, inputs)
    }

    fn apply_node(&mut self, kind: &NodeKind, inputs: &[Val]) -> Result<Values<Val>> {
        if !self.takes_lanes(inputs) {
            return Err(escaped_lanes(kind.name()));
        }
        lock(self.tracer_ref(kind.name())?).add_node(kind, inputs)
    }

    fn tracer(&self) -> Option<TracerRef> {
        self.tracer.clone()
    }
}
