//! `ConcreteFunction` (a finished trace, run on the frame executor or the reference
//! interpreter), `Graph` (its graph: text form, verification, node counts, passes) and
//! `LoweredGraph` (the dataflow form the executor runs).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use gradloop::dataflow::DataflowGraph;
use gradloop::executor::{Executor, Loops};
use gradloop::graph::{verify, Function, Graph};
use gradloop::interpret::{run_graph, RtValue};
use gradloop::trace::{Captured, Traced};
use gradloop::ErrorKind;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySequence};

use crate::convert::concrete_input;
use crate::errors::{new_err, IntoPyResult};
use crate::runtime;
use crate::tensor::PyTensor;
use crate::variable::PyVariableHandle;

/// Nodes of `kind_name` (an op name such as "sin", or "if", "while", "stack_push", ...) in
/// every function of `graph`.
fn count_nodes(graph: &Graph, kind_name: &str) -> usize {
    graph
        .library
        .iter()
        .flat_map(|f| &f.nodes)
        .filter(|n| n.kind.name() == kind_name)
        .count()
}

/// A graph: a library of functions and the entry that runs first.
#[pyclass(frozen, name = "Graph", module = "gradloop._core")]
pub struct PyGraph {
    graph: Arc<Graph>,
}

impl PyGraph {
    fn function(&self, py: Python<'_>, name: Option<&str>) -> PyResult<&Function> {
        self.graph
            .library
            .get(name.unwrap_or(&self.graph.entry))
            .py(py)
    }
}

#[pymethods]
impl PyGraph {
    /// Name of the entry function.
    #[getter]
    fn entry(&self) -> &str {
        &self.graph.entry
    }

    /// Names of the library's functions (the entry first).
    fn function_names(&self) -> Vec<String> {
        self.graph.library.iter().map(|f| f.name.clone()).collect()
    }

    /// Checks the graph's structure and types; raises GraphError naming the bad node.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        verify(&self.graph).py(py)
    }

    /// Number of nodes of `function` (the entry when None), parameters included.
    #[pyo3(signature = (function=None))]
    fn num_nodes(&self, py: Python<'_>, function: Option<&str>) -> PyResult<usize> {
        Ok(self.function(py, function)?.nodes.len())
    }

    /// Nodes of kind `kind_name` ("sin", "if", "while", "stack_push", ...) over all functions.
    fn count_nodes(&self, kind_name: &str) -> usize {
        count_nodes(&self.graph, kind_name)
    }

    /// A new graph whose `call` nodes are replaced by their callees' nodes.
    fn inline(&self, py: Python<'_>) -> PyResult<PyGraph> {
        let graph = gradloop::passes::inline_calls(&self.graph).py(py)?;
        Ok(PyGraph {
            graph: Arc::new(graph),
        })
    }

    /// A new graph returning the entry's results at `fetches` (indices), without the nodes
    /// neither they nor a side effect need.
    fn prune(&self, py: Python<'_>, fetches: Vec<usize>) -> PyResult<PyGraph> {
        let graph = gradloop::passes::prune(&self.graph, &fetches).py(py)?;
        Ok(PyGraph {
            graph: Arc::new(graph),
        })
    }

    /// The entry lowered to dataflow (every call inlined; switch / merge / enter / exit /
    /// next_iteration for the control flow): what the frame executor runs.
    fn lower(&self, py: Python<'_>) -> PyResult<PyLoweredGraph> {
        let graph = gradloop::dataflow::lower(&self.graph).py(py)?;
        Ok(PyLoweredGraph {
            graph: Arc::new(graph),
        })
    }

    /// The text form (parsed back by the graph parser).
    fn __str__(&self) -> String {
        self.graph.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "<gl.Graph @{} ({} functions)>",
            self.graph.entry,
            self.graph.library.len()
        )
    }
}

/// A graph's entry lowered to dataflow (`gl.lower`).
#[pyclass(frozen, name = "LoweredGraph", module = "gradloop._core")]
pub struct PyLoweredGraph {
    graph: Arc<DataflowGraph>,
}

#[pymethods]
impl PyLoweredGraph {
    /// Nodes named `kind_name` ("switch", "merge", "enter", "exit", "next_iteration", an op).
    fn count_nodes(&self, kind_name: &str) -> usize {
        self.graph.count(kind_name)
    }

    /// Number of loop frames (the root frame not counted).
    #[getter]
    fn num_frames(&self) -> usize {
        self.graph.frames.len() - 1
    }

    fn __str__(&self) -> String {
        self.graph.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "<gl.LoweredGraph @{} ({} nodes, {} loop frames)>",
            self.graph.name,
            self.graph.nodes.len(),
            self.graph.frames.len() - 1
        )
    }
}

/// What runs graph functions: the executor with cheap loops fused (0), the executor with every
/// loop a frame of tokens (1), or the reference interpreter (2).
static RUNNER: AtomicU8 = AtomicU8::new(0);

const RUNNERS: [&str; 3] = ["executor", "frames", "interpreter"];

/// Chooses what runs graph functions: "executor" (the default: loops of cheap nodes fused into
/// sequential programs), "frames" (the executor, every loop a frame of tokens) or
/// "interpreter" (the reference semantics, strict and sequential).
#[pyfunction]
pub fn set_graph_runner(py: Python<'_>, name: &str) -> PyResult<()> {
    let Some(index) = RUNNERS.iter().position(|&r| r == name) else {
        let msg = format!(
            "the graph runner is \"executor\", \"frames\" or \"interpreter\", not {name:?}"
        );
        return Err(new_err(
            py,
            ErrorKind::InvalidArgument,
            "set_graph_runner",
            msg,
        ));
    };
    RUNNER.store(index as u8, Ordering::Relaxed);
    Ok(())
}

/// What runs graph functions now: "executor", "frames" or "interpreter".
#[pyfunction]
pub fn graph_runner() -> &'static str {
    RUNNERS[usize::from(RUNNER.load(Ordering::Relaxed)).min(RUNNERS.len() - 1)]
}

/// Chooses how fused frames run: "on" (the default: compiled to machine code and kernel calls
/// on buffers where every value has a static type), "buffers" (the same kernel calls, the steps
/// run one by one), "off" (always their register programs) or "check"
/// (both, with any difference an internal error: what the tests run).
#[pyfunction]
pub fn set_compiled_frames(py: Python<'_>, mode: &str) -> PyResult<()> {
    use gradloop::executor::CompiledFrames;
    let Some(mode) = CompiledFrames::from_name(mode) else {
        let msg =
            format!("compiled frames are \"on\", \"buffers\", \"off\" or \"check\", not {mode:?}");
        return Err(new_err(
            py,
            ErrorKind::InvalidArgument,
            "set_compiled_frames",
            msg,
        ));
    };
    gradloop::executor::set_compiled_frames(mode);
    Ok(())
}

/// Flushes subnormal floats to zero (`enabled`), as XLA's CPU code does, or keeps them (the
/// default), on the calling thread and gradloop's worker threads; false where the CPU has no
/// such mode (`gradloop::subnormals`).
#[pyfunction]
pub fn set_flush_subnormals(py: Python<'_>, enabled: bool) -> PyResult<bool> {
    // Without the GIL: a worker busy with a callback into Python finishes it first.
    py.detach(|| gradloop::subnormals::set_flush_subnormals(enabled))
        .py(py)
}

/// Whether the calling thread flushes subnormal floats to zero.
#[pyfunction]
pub fn flushes_subnormals() -> bool {
    gradloop::subnormals::flushes_subnormals()
}

/// How fused frames run now: "on", "buffers", "off" or "check".
#[pyfunction]
pub fn compiled_frames() -> &'static str {
    gradloop::executor::compiled_frames().name()
}

/// What the process's fused frames have done since it started (`executor::FrameStatistics`):
/// how many were compiled to register programs, to kernel calls on buffers and to machine
/// code, and how many runs each made.
#[pyfunction]
pub fn frame_statistics() -> std::collections::BTreeMap<&'static str, u64> {
    let s = gradloop::executor::frame_statistics();
    std::collections::BTreeMap::from([
        ("programs_compiled", s.programs_compiled),
        ("buffer_frames_compiled", s.buffer_frames_compiled),
        ("native_frames_compiled", s.native_frames_compiled),
        ("fused_passes_compiled", s.fused_passes_compiled),
        ("program_runs", s.program_runs),
        ("buffer_runs", s.buffer_runs),
        ("native_runs", s.native_runs),
    ])
}

/// Sets when native code runs elementwise ops over many lanes as one pass, for frames compiled
/// from now on: ops over `from_elements` or more elements, in runs of `min_ops` or more (both
/// at least 2). Tests lower them so that a few lanes take the passes' code.
#[pyfunction]
pub fn set_fused_passes(py: Python<'_>, from_elements: usize, min_ops: usize) -> PyResult<()> {
    if from_elements < 2 || min_ops < 2 {
        let msg = format!(
            "fused passes need at least 2 elements and 2 ops, not {from_elements} and {min_ops}"
        );
        return Err(new_err(
            py,
            ErrorKind::InvalidArgument,
            "set_fused_passes",
            msg,
        ));
    }
    gradloop::executor::set_fused_passes(gradloop::executor::FusedPasses {
        from_elements,
        min_ops,
    });
    Ok(())
}

/// When native code runs elementwise ops as one pass now: `(from_elements, min_ops)`.
#[pyfunction]
pub fn fused_passes() -> (usize, usize) {
    let p = gradloop::executor::fused_passes();
    (p.from_elements, p.min_ops)
}

/// The trips every `While` of the process has run (`graph::While::trips_run`), whichever
/// runner ran it.
#[pyfunction]
pub fn loop_trips() -> u64 {
    gradloop::graph::While::trips_run()
}

/// Threads the executor runs on (`GRADLOOP_NUM_THREADS`, else the machine's cores).
#[pyfunction]
pub fn executor_threads() -> usize {
    gradloop::executor::default_threads()
}

/// `ConcreteFunction.from_graph`'s arguments: graph text, parameter count, captured inputs.
type FromGraphArgs = (String, usize, Vec<Py<PyAny>>);

/// A traced function: its graph and the values it captured, callable on concrete tensors.
#[pyclass(frozen, name = "ConcreteFunction", module = "gradloop._core")]
pub struct PyConcreteFunction {
    graph: Arc<Graph>,
    num_params: usize,
    captured_inputs: Vec<Captured>,
    /// Lowered and planned at the first call on the executor, then reused: loops fused, and
    /// loops as frames.
    executors: [OnceLock<gradloop::Result<Arc<Executor>>>; 2],
}

impl PyConcreteFunction {
    pub fn new(traced: Traced) -> Self {
        PyConcreteFunction {
            graph: Arc::new(traced.graph),
            num_params: traced.num_params,
            captured_inputs: traced.captured_inputs,
            executors: [OnceLock::new(), OnceLock::new()],
        }
    }

    fn executor(&self, py: Python<'_>, loops: Loops) -> PyResult<Arc<Executor>> {
        let (graph, cell) = (
            &self.graph,
            &self.executors[usize::from(loops == Loops::Frames)],
        );
        let built = match cell.get() {
            Some(built) => built,
            // Without the GIL while waiting too: a thread that waited for another's first call
            // holding the GIL kept that thread from taking it back once its executor was built.
            None => {
                py.detach(|| cell.get_or_init(|| Executor::with_loops(graph, loops).map(Arc::new)))
            }
        };
        built.clone().py(py)
    }
}

impl PyConcreteFunction {
    /// A function of `graph` taking every input as an argument (nothing captured).
    fn derived(graph: Arc<Graph>, num_params: usize) -> Self {
        PyConcreteFunction {
            graph,
            num_params,
            captured_inputs: Vec::new(),
            executors: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The function of `transform(graph, "<entry>_<what>")`, taking every input; derivatives
    /// need every input explicit (`explicit`).
    fn derive(
        &self,
        py: Python<'_>,
        what: &'static str,
        transform: impl FnOnce(&Graph, &str) -> gradloop::Result<Graph> + Send,
    ) -> PyResult<PyConcreteFunction> {
        if !self.captured_inputs.is_empty() {
            let msg = "the function captures inputs: derive from `explicit()` instead";
            return Err(new_err(py, ErrorKind::Internal, what, msg));
        }
        let name = format!("{}_{what}", self.graph.entry);
        let graph = py.detach(|| transform(&self.graph, &name)).py(py)?;
        let params = graph.entry_function().py(py)?.params.len();
        Ok(PyConcreteFunction::derived(Arc::new(graph), params))
    }

    fn emit(
        &self,
        py: Python<'_>,
        embed_captures: bool,
        list_stacks: bool,
        yield_barriers: &str,
        unroll_loops: bool,
        pure_stablehlo: bool,
    ) -> PyResult<(String, gradloop::mlir::ModuleFacts)> {
        let yield_barriers =
            gradloop::mlir::YieldBarriers::from_name(yield_barriers).ok_or_else(|| {
                new_err(
                    py,
                    ErrorKind::InvalidArgument,
                    "to_mlir",
                    format!(
                        "yield_barriers must be \"none\", \"repeats\", \"constants\" or \
                         \"all\", not {yield_barriers:?}"
                    ),
                )
            })?;
        let options = gradloop::mlir::EmitOptions {
            list_stacks,
            yield_barriers,
            unroll_loops,
            pure_stablehlo,
        };
        if !embed_captures {
            return gradloop::mlir::emit_module_facts(&self.graph, options).py(py);
        }
        let mut values: Vec<Option<gradloop::Tensor>> = vec![None; self.num_params];
        values.extend(self.captured_inputs.iter().map(|c| match c {
            Captured::Tensor(t) => Some(t.clone()),
            Captured::Variable(_) => None,
        }));
        let graph = gradloop::passes::bind_params(&self.graph, &values).py(py)?;
        gradloop::mlir::emit_module_facts(&graph, options).py(py)
    }
}

#[pymethods]
impl PyConcreteFunction {
    /// The function of a graph's text (`str(fn.graph)`) taking `num_params` arguments followed
    /// by `captured_inputs` (tensors and variables, as `captured_inputs` lists them): how a
    /// pickled function is rebuilt in another process. The graph is verified first.
    #[staticmethod]
    fn from_graph(
        py: Python<'_>,
        text: &str,
        num_params: usize,
        captured_inputs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let graph = gradloop::graph::parse_graph(text).py(py)?;
        verify(&graph).py(py)?;
        let captured = captured_inputs
            .iter()
            .map(|c| match c.cast::<PyVariableHandle>() {
                Ok(v) => Ok(Captured::Variable(v.get().inner().clone())),
                Err(_) => concrete_input(c, "ConcreteFunction.from_graph").map(Captured::Tensor),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let params = graph.library.get(&graph.entry).py(py)?.params.len();
        if params != num_params + captured.len() {
            let msg = format!(
                "@{} has {params} parameters, not {num_params} arguments and {} captured inputs",
                graph.entry,
                captured.len()
            );
            let kind = ErrorKind::InvalidArgument;
            return Err(new_err(py, kind, "ConcreteFunction.from_graph", msg));
        }
        Ok(PyConcreteFunction {
            graph: Arc::new(graph),
            num_params,
            captured_inputs: captured,
            executors: [OnceLock::new(), OnceLock::new()],
        })
    }

    /// Pickles as its graph's text and captured inputs (`from_graph` rebuilds it): graph
    /// functions travel to other processes (`gl.distributed`) without their Python.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, FromGraphArgs)> {
        let this = slf.get();
        let rebuild = slf.get_type().getattr("from_graph")?;
        let captured = this.captured_inputs(slf.py())?;
        Ok((rebuild, (this.graph.to_string(), this.num_params, captured)))
    }

    #[getter]
    fn graph(&self) -> PyGraph {
        PyGraph {
            graph: self.graph.clone(),
        }
    }

    /// The graph as MLIR text (StableHLO inside `scf`). With `embed_captures` the captured
    /// tensors become constants and the module takes the `num_params` arguments followed by
    /// the variables' values (what an exported artifact needs); otherwise it takes every
    /// captured input after those. Variables are values: the module returns, after the
    /// results, the final value of each variable in `assigned_variables`. `list_stacks` keeps
    /// tensor stacks as lists of buffer views; `yield_barriers` ("none", "repeats",
    /// "constants" or "all") puts branch results through barriers; `pure_stablehlo` writes
    /// only `func` and `stablehlo` ops (`EmitOptions`).
    #[pyo3(signature = (embed_captures=false, list_stacks=false, yield_barriers="none", pure_stablehlo=false))]
    fn to_mlir(
        &self,
        py: Python<'_>,
        embed_captures: bool,
        list_stacks: bool,
        yield_barriers: &str,
        pure_stablehlo: bool,
    ) -> PyResult<String> {
        let emitted = self.emit(
            py,
            embed_captures,
            list_stacks,
            yield_barriers,
            false,
            pure_stablehlo,
        )?;
        Ok(emitted.0)
    }

    /// `to_mlir`'s text and what compile policy needs to know of it, so that it never reads
    /// the text: `{"dtypes": [numpy names], "tensor_stacks": bool, "regions": bool,
    /// "yield_barriers": the barriers actually put, "loops": bool, "unrolled_loops": bool,
    /// "heaviest_op": the largest work of one op}` (`gradloop::mlir::ModuleFacts`).
    /// `unroll_loops` runs loops of cheap ops several iterations per trip.
    #[pyo3(signature = (embed_captures=false, list_stacks=false, yield_barriers="none", unroll_loops=false))]
    fn mlir_module<'py>(
        &self,
        py: Python<'py>,
        embed_captures: bool,
        list_stacks: bool,
        yield_barriers: &str,
        unroll_loops: bool,
    ) -> PyResult<(String, Bound<'py, PyDict>)> {
        let (text, facts) = self.emit(
            py,
            embed_captures,
            list_stacks,
            yield_barriers,
            unroll_loops,
            false,
        )?;
        let dict = PyDict::new(py);
        let dtypes: Vec<&str> = facts.dtypes.iter().map(|d| d.name()).collect();
        dict.set_item("dtypes", dtypes)?;
        dict.set_item("tensor_stacks", facts.tensor_stacks)?;
        dict.set_item("regions", facts.regions)?;
        dict.set_item("yield_barriers", facts.yield_barriers.name())?;
        dict.set_item("loops", facts.loops)?;
        dict.set_item("unrolled_loops", facts.unrolled_loops)?;
        dict.set_item("heaviest_op", facts.heaviest_op)?;
        Ok((text, dict))
    }

    /// Positions in `captured_inputs` of the variables the function may assign, in order:
    /// compiled, it returns their final values after its own results.
    #[getter]
    fn assigned_variables(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let params = gradloop::passes::assigned_variables(&self.graph).py(py)?;
        Ok(params
            .into_iter()
            .filter_map(|p| p.checked_sub(self.num_params))
            .collect())
    }

    /// Number of arguments a call takes (the captured inputs are passed automatically).
    #[getter]
    fn num_params(&self) -> usize {
        self.num_params
    }

    /// Values passed after the arguments on every call: tensors the traced code closed over
    /// and variables it read or wrote.
    #[getter]
    fn captured_inputs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.captured_inputs
            .iter()
            .map(|c| match c {
                Captured::Tensor(t) => Ok(Py::new(py, PyTensor::new(t.clone()))?.into_any()),
                Captured::Variable(v) => {
                    Ok(Py::new(py, PyVariableHandle::new(v.clone()))?.into_any())
                }
            })
            .collect()
    }

    /// Nodes of kind `kind_name` ("sin", "if", "while", "stack_push", ...) over all functions.
    fn count_nodes(&self, kind_name: &str) -> usize {
        count_nodes(&self.graph, kind_name)
    }

    /// The same function taking its captured inputs as arguments, after its own: every input
    /// explicit, as derivatives of it take them (`vjp`, `jvp`).
    fn explicit(&self) -> PyConcreteFunction {
        let params = self.num_params + self.captured_inputs.len();
        PyConcreteFunction::derived(self.graph.clone(), params)
    }

    /// This function on `lanes` lanes at once (whose inputs must all be explicit): argument `k`
    /// holds every lane's value along axis 0 where `batched[k]`, and every result holds every
    /// lane's; each lane makes its own trips and takes its own branches.
    fn over_lanes(
        &self,
        py: Python<'_>,
        batched: Vec<bool>,
        lanes: usize,
    ) -> PyResult<PyConcreteFunction> {
        self.derive(py, "lanes", |g, name| {
            gradloop::batch::lanes_graph(g, &batched, lanes, name)
        })
    }

    /// The vector-Jacobian product of this function (whose inputs must all be explicit):
    /// arguments, then one cotangent per result; returns the gradients of the arguments `wrt`.
    fn vjp(&self, py: Python<'_>, wrt: Vec<usize>) -> PyResult<PyConcreteFunction> {
        self.derive(py, "vjp", |g, name| {
            gradloop::trace::vjp_graph(g, &wrt, name)
        })
    }

    /// The Jacobian-vector product of this function (whose inputs must all be explicit):
    /// arguments, then one tangent per argument in `wrt`; returns the results, then one
    /// tangent per float result.
    fn jvp(&self, py: Python<'_>, wrt: Vec<usize>) -> PyResult<PyConcreteFunction> {
        self.derive(py, "jvp", |g, name| {
            gradloop::trace::jvp_graph(g, &wrt, name)
        })
    }

    /// Runs the entry function on `args` (concrete tensors) followed by the captured inputs, on
    /// the frame executor (or the interpreter, `set_graph_runner`) with the GIL released;
    /// returns the results.
    fn __call__(&self, py: Python<'_>, args: &Bound<'_, PyAny>) -> PyResult<Vec<PyTensor>> {
        if runtime::active_tracer().is_some() {
            return Err(new_err(
                py,
                ErrorKind::ControlFlow,
                "ConcreteFunction",
                "a ConcreteFunction cannot be called while a function is being traced \
                 (nested functions are traced inline)",
            ));
        }
        let seq = args.cast::<PySequence>()?;
        let n = seq.len()?;
        if n != self.num_params {
            return Err(new_err(
                py,
                ErrorKind::InvalidArgument,
                "ConcreteFunction",
                format!(
                    "@{} takes {} arguments, got {n}",
                    self.graph.entry, self.num_params
                ),
            ));
        }
        let mut values = Vec::with_capacity(n + self.captured_inputs.len());
        for i in 0..n {
            let item = seq.get_item(i)?;
            // A variable argument: a function whose captured inputs are explicit (`explicit`).
            values.push(match item.cast::<PyVariableHandle>() {
                Ok(v) => RtValue::Resource(v.get().inner().clone()),
                Err(_) => RtValue::Tensor(concrete_input(&item, "ConcreteFunction")?),
            });
        }
        values.extend(self.captured_inputs.iter().map(Captured::runtime_value));
        // Graph execution may run long: always release the GIL.
        let loops = match graph_runner() {
            "interpreter" => None,
            "frames" => Some(Loops::Frames),
            _ => Some(Loops::Fused),
        };
        let results = match loops {
            None => {
                let graph = self.graph.clone();
                runtime::call(py, usize::MAX, move || run_graph(&graph, values))?
            }
            Some(loops) => {
                let executor = self.executor(py, loops)?;
                runtime::call(py, usize::MAX, move || executor.run(values))?
            }
        };
        results
            .into_iter()
            .map(|v| v.into_tensor().py(py).map(PyTensor::new))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<gl.ConcreteFunction @{} params={} captured={}>",
            self.graph.entry,
            self.num_params,
            self.captured_inputs.len()
        )
    }
}
