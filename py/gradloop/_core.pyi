"""Type stub of the Rust extension `gradloop._core` (thin bindings over the Rust core)."""

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

TensorLike: TypeAlias = Tensor | float | int | bool | Sequence[Any] | np.ndarray

class DType:
    """An element type: float32, float64, int32, int64 or bool."""

    @property
    def name(self) -> str: ...
    @property
    def is_floating(self) -> bool: ...
    @property
    def is_integer(self) -> bool: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def numpy(self) -> np.dtype[Any]: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

float32: DType
float64: DType
int32: DType
int64: DType
bool_: DType

class Tensor:
    """An immutable, contiguous tensor held by the Rust core, or (inside `@gl.function`) a
    symbolic tensor standing for a value of the function being traced.

    A symbolic tensor has a dtype and a shape (dimensions known only at run time are None) but
    no value: `numpy()`, `__array__`, `item()`, `tolist()`, `bool()`, `float()`, `int()` and
    `__index__` raise `gradloop.errors.ControlFlowError` on it. Ops and indexing (including
    with a symbolic scalar int index) work on it and add nodes to the trace.
    """

    def __init__(self, data: TensorLike, dtype: DType | str | type | None = None) -> None: ...
    @property
    def shape(self) -> tuple[int | None, ...]:
        """The dimensions; None for a dimension of a symbolic tensor known only at run time."""
    @property
    def dtype(self) -> DType: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int | None:
        """Number of elements; None when a dimension is unknown (symbolic tensors)."""
    @property
    def is_symbolic(self) -> bool:
        """True for a symbolic tensor: a value of the function being traced."""
    @property
    def _tape_id(self) -> int:
        """The identity gradient tapes track: two Python handles of one value share it."""
    @property
    def T(self) -> Tensor: ...
    def numpy(self) -> np.ndarray:
        """A read-only numpy array sharing the tensor's memory (concrete tensors only)."""
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray: ...
    def item(self) -> float | int | bool: ...
    def tolist(self) -> Any: ...
    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __float__(self) -> float: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __getitem__(self, index: Any) -> Tensor: ...
    @property
    def at(self) -> Any: ...
    def __add__(self, other: Any) -> Tensor: ...
    def __mod__(self, other: Any) -> Tensor: ...
    def __rmod__(self, other: Any) -> Tensor: ...
    def __floordiv__(self, other: Any) -> Tensor: ...
    def __rfloordiv__(self, other: Any) -> Tensor: ...
    def __radd__(self, other: Any) -> Tensor: ...
    def __sub__(self, other: Any) -> Tensor: ...
    def __rsub__(self, other: Any) -> Tensor: ...
    def __mul__(self, other: Any) -> Tensor: ...
    def __rmul__(self, other: Any) -> Tensor: ...
    def __truediv__(self, other: Any) -> Tensor: ...
    def __rtruediv__(self, other: Any) -> Tensor: ...
    def __pow__(self, other: Any) -> Tensor: ...
    def __rpow__(self, other: Any) -> Tensor: ...
    def __matmul__(self, other: Any) -> Tensor: ...
    def __rmatmul__(self, other: Any) -> Tensor: ...
    def __neg__(self) -> Tensor: ...
    def __pos__(self) -> Tensor: ...
    def __abs__(self) -> Tensor: ...
    def __lt__(self, other: Any) -> Tensor: ...
    def __le__(self, other: Any) -> Tensor: ...
    def __gt__(self, other: Any) -> Tensor: ...
    def __ge__(self, other: Any) -> Tensor: ...
    def __eq__(self, other: Any) -> Tensor: ...  # type: ignore[override]
    def __ne__(self, other: Any) -> Tensor: ...  # type: ignore[override]
    def __and__(self, other: Any) -> Tensor: ...
    def __or__(self, other: Any) -> Tensor: ...
    def __invert__(self) -> Tensor: ...
    def reshape(self, *shape: int | Sequence[int]) -> Tensor: ...
    def transpose(self, *axes: int) -> Tensor: ...
    def any(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def all(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def argmax(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def argmin(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def argsort(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def prod(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def cumsum(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def cumprod(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def clip(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def diagonal(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def trace(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def repeat(self, *args: Any, **kwargs: Any) -> Tensor: ...
    def sum(
        self,
        axis: int | Sequence[int] | None = None,
        dtype: DType | str | type | None = None,
        out: None = None,
        keepdims: bool = False,
    ) -> Tensor: ...
    def mean(
        self,
        axis: int | Sequence[int] | None = None,
        dtype: DType | str | type | None = None,
        out: None = None,
        keepdims: bool = False,
    ) -> Tensor: ...
    def max(
        self, axis: int | Sequence[int] | None = None, out: None = None, keepdims: bool = False
    ) -> Tensor: ...
    def min(
        self, axis: int | Sequence[int] | None = None, out: None = None, keepdims: bool = False
    ) -> Tensor: ...
    def astype(self, dtype: DType | str | type) -> Tensor: ...

def tensor_in_place(array: Any) -> Tensor:
    """`array`'s elements read where they lie, for a numpy array whose memory no one writes
    again (XLA's results): the tensor keeps the array alive. An array that cannot be read in
    place (not contiguous or aligned, bool, another byte order) is copied."""

def tensor_like(data: Any, like: Tensor) -> Tensor:
    """`data` as a tensor, a Python scalar taking `like`'s dtype where it adapts to it (ints to
    numeric dtypes, floats to float dtypes, bools to bool) and its own default otherwise."""

def tensor(data: TensorLike, dtype: DType | str | type | None = None) -> Tensor:
    """`gl.tensor(data, dtype=None)`: from Python scalars, nested lists, numpy arrays or tensors."""

def as_dtype(dtype: DType | str | type | np.dtype[Any]) -> DType:
    """`as_dtype(x)`: the gradloop dtype for any dtype spelling."""

def user_location() -> str:
    """`file:line` of the innermost stack frame outside the gradloop package."""

# ops (numpy names; broadcasting; Python scalars adapt to the other operand's dtype)
def add(a: TensorLike, b: TensorLike) -> Tensor:
    """`add(a, b)`: a + b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def sub(a: TensorLike, b: TensorLike) -> Tensor:
    """`sub(a, b)`: a - b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def mul(a: TensorLike, b: TensorLike) -> Tensor:
    """`mul(a, b)`: a * b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def div(a: TensorLike, b: TensorLike) -> Tensor:
    """`div(a, b)`: a / b, elementwise (true division), with numpy's broadcasting; Python scalars
    adapt to the tensor's dtype."""

def pow(a: TensorLike, b: TensorLike) -> Tensor:
    """`pow(a, b)`: a to the power b, elementwise, with numpy's broadcasting; Python scalars adapt
    to the tensor's dtype."""

def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """`maximum(a, b)`: the larger of a and b, elementwise, with numpy's broadcasting; Python
    scalars adapt to the tensor's dtype."""

def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    """`minimum(a, b)`: the smaller of a and b, elementwise, with numpy's broadcasting; Python
    scalars adapt to the tensor's dtype."""

def equal(a: TensorLike, b: TensorLike) -> Tensor:
    """`equal(a, b)`: a == b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def not_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """`not_equal(a, b)`: a != b, elementwise, with numpy's broadcasting; Python scalars adapt to
    the tensor's dtype."""

def less(a: TensorLike, b: TensorLike) -> Tensor:
    """`less(a, b)`: a < b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def less_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """`less_equal(a, b)`: a <= b, elementwise, with numpy's broadcasting; Python scalars adapt to
    the tensor's dtype."""

def greater(a: TensorLike, b: TensorLike) -> Tensor:
    """`greater(a, b)`: a > b, elementwise, with numpy's broadcasting; Python scalars adapt to the
    tensor's dtype."""

def greater_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """`greater_equal(a, b)`: a >= b, elementwise, with numpy's broadcasting; Python scalars adapt
    to the tensor's dtype."""

def logical_and(a: TensorLike, b: TensorLike) -> Tensor:
    """`logical_and(a, b)`: a and b, on bools, elementwise, with numpy's broadcasting; Python
    scalars adapt to the tensor's dtype."""

def bitwise_and(a: TensorLike, b: TensorLike) -> Tensor:
    """`bitwise_and(a, b)`: a & b, on integers and bools, elementwise, with numpy's broadcasting;
    Python scalars adapt to the tensor's dtype."""

def bitwise_or(a: TensorLike, b: TensorLike) -> Tensor:
    """`bitwise_or(a, b)`: a | b, on integers and bools, elementwise, with numpy's broadcasting;
    Python scalars adapt to the tensor's dtype."""

def bitwise_xor(a: TensorLike, b: TensorLike) -> Tensor:
    """`bitwise_xor(a, b)`: a ^ b, on integers and bools, elementwise, with numpy's broadcasting;
    Python scalars adapt to the tensor's dtype."""

def logical_or(a: TensorLike, b: TensorLike) -> Tensor:
    """`logical_or(a, b)`: a or b, on bools, elementwise, with numpy's broadcasting; Python scalars
    adapt to the tensor's dtype."""

def logical_not(x: TensorLike) -> Tensor:
    """`logical_not(x)`: not x, on bools, elementwise."""

def neg(x: TensorLike) -> Tensor:
    """`neg(x)`: -x, elementwise."""

def exp(x: TensorLike) -> Tensor:
    """`exp(x)`: e to the x, elementwise."""

def log(x: TensorLike) -> Tensor:
    """`log(x)`: the natural logarithm, elementwise."""

def sin(x: TensorLike) -> Tensor:
    """`sin(x)`: the sine, elementwise."""

def cos(x: TensorLike) -> Tensor:
    """`cos(x)`: the cosine, elementwise."""

def tanh(x: TensorLike) -> Tensor:
    """`tanh(x)`: the hyperbolic tangent, elementwise."""

def sigmoid(x: TensorLike) -> Tensor:
    """`sigmoid(x)`: the logistic function 1 / (1 + e^-x), elementwise."""

def relu(x: TensorLike) -> Tensor:
    """`relu(x)`: max(x, 0), elementwise."""

def sqrt(x: TensorLike) -> Tensor:
    """`sqrt(x)`: the square root, elementwise."""

def abs(x: TensorLike) -> Tensor:
    """`abs(x)`: the absolute value, elementwise."""

def sign(x: TensorLike) -> Tensor:
    """`sign(x)`: -1, 0 or 1 by the sign of x (its gradient is zero), elementwise."""

def floor(x: TensorLike) -> Tensor:
    """`floor(x)`: the largest integer not above x, elementwise."""

def ceil(x: TensorLike) -> Tensor:
    """`ceil(x)`: the smallest integer not below x, elementwise."""

def round(x: TensorLike) -> Tensor:
    """`round(x)`: x rounded to the nearest integer, halves to even, elementwise."""

def tan(x: TensorLike) -> Tensor:
    """`tan(x)`: the tangent, elementwise."""

def arcsin(x: TensorLike) -> Tensor:
    """`arcsin(x)`: the inverse sine, elementwise."""

def arccos(x: TensorLike) -> Tensor:
    """`arccos(x)`: the inverse cosine, elementwise."""

def arctan(x: TensorLike) -> Tensor:
    """`arctan(x)`: the inverse tangent, elementwise."""

def sinh(x: TensorLike) -> Tensor:
    """`sinh(x)`: the hyperbolic sine, elementwise."""

def cosh(x: TensorLike) -> Tensor:
    """`cosh(x)`: the hyperbolic cosine, elementwise."""

def arcsinh(x: TensorLike) -> Tensor:
    """`arcsinh(x)`: the inverse hyperbolic sine, elementwise."""

def arccosh(x: TensorLike) -> Tensor:
    """`arccosh(x)`: the inverse hyperbolic cosine, elementwise."""

def arctanh(x: TensorLike) -> Tensor:
    """`arctanh(x)`: the inverse hyperbolic tangent, elementwise."""

def erf(x: TensorLike) -> Tensor:
    """`erf(x)`: the error function, elementwise."""

def log1p(x: TensorLike) -> Tensor:
    """`log1p(x)`: log(1 + x), accurate for small x, elementwise."""

def expm1(x: TensorLike) -> Tensor:
    """`expm1(x)`: e^x - 1, accurate for small x, elementwise."""

def arctan2(a: TensorLike, b: TensorLike) -> Tensor:
    """`arctan2(a, b)`: the angle of the point (b, a), elementwise, with numpy's broadcasting;
    Python scalars adapt to the tensor's dtype."""

def scatter_add(updates: TensorLike, indices: TensorLike, axis: int, dim_size: int) -> Tensor:
    """Zeros with `dim_size` along `axis`, `updates` summed in at `indices` (repeats accumulate)."""

def dynamic_slice(x: TensorLike, starts: Sequence[TensorLike], sizes: Sequence[int]) -> Tensor:
    """The window of `sizes` at `starts` (scalar integer tensors, clamped so the window fits)."""

def dynamic_update_slice(x: TensorLike, update: TensorLike, starts: Sequence[TensorLike]) -> Tensor:
    """`x` with `update` written at `starts` (scalar integer tensors, clamped so it fits)."""

def rem(a: TensorLike, b: TensorLike) -> Tensor:
    """`rem(a, b)`: the remainder of a / b truncated toward zero (the sign of a, as C's `%`),
    elementwise, with numpy's broadcasting; Python scalars adapt to the tensor's dtype."""

def quotient(a: TensorLike, b: TensorLike) -> Tensor:
    """`quotient(a, b)`: a / b truncated toward zero, elementwise, with numpy's broadcasting; Python
    scalars adapt to the tensor's dtype."""

def where(cond: TensorLike, x: TensorLike, y: TensorLike) -> Tensor:
    """`where(cond, x, y)`: x where cond is true, else y (broadcasting)."""

def matmul(a: TensorLike, b: TensorLike) -> Tensor:
    """`matmul(a, b)`: the matrix product, as numpy's `matmul` (leading dimensions are a batch),
    with numpy's broadcasting; Python scalars adapt to the tensor's dtype."""

def sum(x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """`sum` over `axis` (None: all axes; an int or a tuple of ints)."""

def mean(x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """`mean` over `axis` (None: all axes; an int or a tuple of ints)."""

def max(x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """`max` over `axis` (None: all axes; an int or a tuple of ints)."""

def min(x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """`min` over `axis` (None: all axes; an int or a tuple of ints)."""

def reshape(x: TensorLike, shape: Sequence[int]) -> Tensor:
    """Same elements in a new shape (one dimension may be -1)."""

def transpose(x: TensorLike, axes: Sequence[int] | None = None) -> Tensor:
    """Permutes axes (reverses them when `axes` is None)."""

def broadcast_to(x: TensorLike, shape: Sequence[int]) -> Tensor:
    """numpy's broadcast_to."""

def concatenate(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    """Joins tensors along an existing axis."""

def stack(xs: Sequence[TensorLike], axis: int = 0) -> Tensor:
    """Joins tensors along a new axis."""

def expand_dims(x: TensorLike, axis: int) -> Tensor:
    """Inserts a size-1 axis at `axis`."""

def squeeze(x: TensorLike, axis: int | Sequence[int] | None = None) -> Tensor:
    """Removes size-1 axes (all of them when `axis` is None)."""

def zeros(shape: int | Sequence[int], dtype: DType | str | type = ...) -> Tensor:
    """A tensor of `shape` filled with zeros."""

def ones(shape: int | Sequence[int], dtype: DType | str | type = ...) -> Tensor:
    """A tensor of `shape` filled with ones."""

def full(
    shape: int | Sequence[int], value: float, dtype: DType | str | type | None = None
) -> Tensor:
    """A tensor of `shape` filled with `value` (dtype from the value when not given)."""

def zeros_like(x: TensorLike, dtype: DType | str | type | None = None) -> Tensor:
    """Zeros shaped like `x` (its dtype unless `dtype` is given)."""

def ones_like(x: TensorLike, dtype: DType | str | type | None = None) -> Tensor:
    """Ones shaped like `x` (its dtype unless `dtype` is given)."""

def arange(
    start: float,
    stop: float | None = None,
    step: float = 1,
    dtype: DType | str | type | None = None,
) -> Tensor:
    """numpy's arange: `arange(stop)` or `arange(start, stop, step)`; int32 when all are ints."""

def cast(x: TensorLike, dtype: DType | str | type) -> Tensor:
    """Converts elements to `dtype`."""

def bitcast_convert(x: TensorLike, dtype: DType | str | type) -> Tensor:
    """The same bits read as `dtype` of the same width (JAX's `lax.bitcast_convert_type`)."""

def take(x: TensorLike, indices: TensorLike, axis: int | None = None) -> Tensor:
    """numpy's take: elements of `x` at `indices` along `axis` (flattened x when None)."""

def stop_gradient(x: TensorLike) -> Tensor:
    """`stop_gradient(x)`: x itself, through which no gradient flows, elementwise."""

# the tape (Rust); the Python API in gradloop.autodiff wraps it
class Tape:
    """A gradient tape. Recording happens only while it is on the active stack (push/pop)."""

    def __init__(self, persistent: bool = False) -> None: ...
    @property
    def persistent(self) -> bool: ...
    @property
    def key(self) -> int:
        """Identifies this tape among the recording ones (`recording_tape_keys`)."""
    def watch(self, t: Tensor) -> None: ...
    def is_watched(self, t: Tensor) -> bool: ...
    def __len__(self) -> int: ...
    def push(self) -> None:
        """Makes this tape active (innermost) on the current thread."""
    def pop(self) -> None:
        """Removes this tape from the active stack of the current thread."""
    def gradient(
        self,
        targets: Sequence[Tensor],
        sources: Sequence[Tensor],
        output_gradients: Sequence[Tensor | None] | None = None,
    ) -> list[Tensor | None]: ...

class ForwardAccumulator:
    """Tangents of values (forward mode). Takes tangents only while on the active stack."""

    def __init__(self) -> None: ...
    def watch(self, primal: Tensor, tangent: Tensor) -> None:
        """Gives `primal` the tangent `tangent` (a float tensor of the primal's type)."""
    def tangent(self, t: Tensor) -> Tensor | None: ...
    def __len__(self) -> int: ...
    def push(self) -> None:
        """Starts taking tangents on the current thread, innermost."""
    def pop(self) -> tuple[int, int] | None:
        """Stops taking tangents; where it stood (for `push_at`), None if it was not active."""
    def push_at(self, place: tuple[int, int]) -> None:
        """Takes tangents again where `pop` took it from."""

def active_accumulators() -> list[ForwardAccumulator]:
    """The accumulators taking tangents on this thread, innermost last."""

def watch_on_active_tapes(t: Tensor) -> None:
    """Watches `t` on every active tape (how a Variable read is seen by tapes)."""

def any_tape_active() -> bool:
    """Whether a tape is recording on this thread."""

def any_tape_records(inputs: Sequence[Tensor]) -> bool:
    """Whether an active tape would record an op on `inputs` (one is watched, or computed from
    a watched value)."""

def mode() -> str:
    """What this thread is doing: 'eager', 'recording' (tapes record or accumulators take
    tangents) or 'tracing'."""

def recording_tape_keys() -> list[int]:
    """The `Tape.key`s of the tapes recording on this thread, innermost last."""

def pause_recording(above_level: int | None = None) -> int:
    """Stops recording on all active tapes of this thread (with `above_level`, on those pushed
    after the tape or accumulator of that level); returns a token for resume_recording."""

def resume_recording(token: int) -> None:
    """Records again on the tapes that `pause_recording` set aside (its `token`)."""

def record_custom_gradient(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    grad_fn: Callable[..., Sequence[Tensor | None]],
    takes_needs: bool = False,
    above_level: int | None = None,
) -> None:
    """Records an op on the active tapes whose gradient is `grad_fn(*output_grads)` (with
    `takes_needs`, `grad_fn(*output_grads, needs=(bool per input))`: which gradients are asked;
    with `above_level`, only the tapes pushed after the tape or accumulator of that level).

    `output_grads[i]` is a Tensor (zeros filled in for outputs that got no gradient). `grad_fn`
    returns one gradient (or None) per input. Ops it runs are recorded by outer tapes, so custom
    gradients compose with higher-order differentiation.
    """

def identity(x: Tensor) -> Tensor:
    """The same value under a new identity (no copy); differentiable (gradient passes through)."""

# tracing (the Python @gl.function layer is built on these; one active trace per thread)

class Branch:
    """A traced inner function (cond branch, loop cond or body) and the outer values it
    captured; made by `trace_pop`, consumed by `emit_if`, `emit_case` and `emit_while`."""

    @property
    def name(self) -> str:
        """The function's name in the graph's library."""
    @property
    def captures(self) -> list[Tensor]:
        """Outer values the function captured (its parameters after its own, in order)."""

class Graph:
    """A graph: a library of functions and the entry function that runs first."""

    @property
    def entry(self) -> str:
        """Name of the entry function."""
    def function_names(self) -> list[str]:
        """Names of the library's functions, the entry first."""
    def verify(self) -> None:
        """Checks structure and types; raises `gradloop.errors.GraphError` naming the node."""
    def num_nodes(self, function: str | None = None) -> int:
        """Nodes of `function` (the entry when None), parameters included."""
    def count_nodes(self, kind_name: str) -> int:
        """Nodes of kind `kind_name` ("sin", "if", "while", "stack_push", ...) in all functions."""
    def inline(self) -> Graph:
        """A new graph whose `call` nodes are replaced by their callees' nodes."""
    def prune(self, fetches: Sequence[int]) -> Graph:
        """A new graph returning the entry's results at `fetches` (indices), without the nodes
        neither they nor a side effect need (writes to Variables are never pruned)."""
    def lower(self) -> LoweredGraph:
        """The entry lowered to dataflow: calls inlined, control flow as switch / merge / enter /
        exit / next_iteration (what the frame executor runs)."""

class LoweredGraph:
    """A graph's entry as one dataflow graph; `str()` is its text."""

    def count_nodes(self, kind_name: str) -> int:
        """Nodes named `kind_name` ("switch", "merge", "enter", "exit", "next_iteration", an op)."""
    @property
    def num_frames(self) -> int:
        """Loop frames (one per `while`, the root frame not counted)."""

def set_graph_runner(name: str) -> None:
    """What runs graph functions: "executor" (the default) or "interpreter" (the reference)."""

def graph_runner() -> str:
    """What runs graph functions now: "executor" or "interpreter"."""

def set_compiled_frames(mode: str) -> None:
    """How fused frames run: "on" (where every value has a static type, compiled to kernels on
    buffers, and a loop's steps to machine code; the default), "buffers" (the same kernels, the
    steps run one by one), "off" (their register programs) or "check" (machine code and
    programs, compared bit for bit: a difference is an internal error)."""

def compiled_frames() -> str:
    """How fused frames run now: "on", "buffers", "off" or "check"."""

def set_flush_subnormals(enabled: bool) -> bool:
    """Flushes subnormal floats to zero (`enabled`) or keeps them, on the calling thread and
    gradloop's worker threads; False where the CPU has no such mode."""

def flushes_subnormals() -> bool:
    """Whether the calling thread flushes subnormal floats to zero."""

def frame_statistics() -> dict[str, int]:
    """What the process's fused frames have done since it started: `programs_compiled`,
    `buffer_frames_compiled`, `native_frames_compiled` (each tier a frame was compiled to),
    `fused_passes_compiled` (runs of elementwise ops that machine code computes as one pass
    over their lanes) and `program_runs`, `buffer_runs`, `native_runs` (runs of each tier; a
    loop's run is all its trips)."""

def set_fused_passes(from_elements: int, min_ops: int) -> None:
    """When machine code runs elementwise ops as one pass over their lanes, for frames compiled
    from now on: ops over `from_elements` or more elements (default 65), in runs of `min_ops`
    or more (default 4); both at least 2. Tests lower them so that a few lanes take the pass."""

def fused_passes() -> tuple[int, int]:
    """`(from_elements, min_ops)` now (`set_fused_passes`)."""

def loop_trips() -> int:
    """The trips every `While` of the process has run, in the interpreter and in each of the
    executor's tiers (in check mode a fused loop runs on two tiers and counts twice)."""

def executor_threads() -> int:
    """Threads the frame executor uses (`GRADLOOP_NUM_THREADS`, else the machine's cores)."""

class VariableHandle:
    """A variable cell of a fixed dtype and shape. Eagerly, `read`/`assign`/`assign_add` act on
    the cell at once; while tracing they add `read_variable` / `assign_variable` /
    `assign_add_variable` nodes (the variable becomes a captured input of the function) and act
    when the function runs. Symbolic values are never stored in the cell."""

    def __init__(self, initial: TensorLike) -> None:
        """A variable holding `initial` (a concrete tensor); it keeps that dtype and shape."""
    @property
    def dtype(self) -> DType: ...
    @property
    def shape(self) -> tuple[int | None, ...]: ...
    def read(self) -> Tensor:
        """The current value; while tracing, a symbolic `read_variable` result."""
    def resource(self) -> Tensor | None:
        """While tracing, the resource value tapes watch (reads in bodies differentiate)."""
    def assign(self, value: TensorLike) -> None:
        """Stores `value` (same dtype and shape; Python scalars take the variable's dtype)."""
    def assign_add(self, delta: TensorLike) -> None:
        """Adds `delta` (broadcast to the variable's shape)."""
    def same(self, other: VariableHandle) -> bool:
        """Whether `other` is a handle to the same variable."""

class ConcreteFunction:
    """A finished trace: its graph and the values it captured, callable on concrete tensors.
    It pickles as its graph's text and captured values."""

    @staticmethod
    def from_graph(
        text: str, num_params: int, captured_inputs: Sequence[Tensor | VariableHandle]
    ) -> ConcreteFunction:
        """The function of a graph's text (`str(fn.graph)`) taking `num_params` arguments
        followed by `captured_inputs`: how a pickled function is rebuilt. The graph is
        verified first."""

    def to_mlir(
        self,
        embed_captures: bool = False,
        list_stacks: bool = False,
        yield_barriers: str = "none",
        pure_stablehlo: bool = False,
    ) -> str:
        """The graph as MLIR text (StableHLO inside `scf`). With `embed_captures` the captured
        tensors become constants and the module takes the `num_params` arguments followed by
        the variables' values; otherwise it takes every captured input after those. Variables
        are values: the module returns, after the results, the final value of each variable
        in `assigned_variables`. `list_stacks` keeps tensor stacks as lists of buffer views;
        `yield_barriers` puts repeated branch results through optimization barriers: "none",
        "repeats", "constants" (constants among them) or "all" (every tensor a branch yields)."""

    def mlir_module(
        self,
        embed_captures: bool = False,
        list_stacks: bool = False,
        yield_barriers: str = "none",
        unroll_loops: bool = False,
    ) -> tuple[str, dict[str, Any]]:
        """`to_mlir`'s text and what compile policy needs to know of it, so that it never
        reads the text: `{"dtypes": [numpy names], "tensor_stacks": bool, "regions": bool,
        "yield_barriers": the barriers actually put ("none" when the option changed nothing),
        "loops": bool, "unrolled_loops": bool, "heaviest_op": the largest work of one op}`.
        `unroll_loops` runs loops of cheap ops several predicated iterations per trip."""

    @property
    def assigned_variables(self) -> list[int]:
        """Positions in `captured_inputs` of the variables the function may assign, in order:
        compiled, it returns their final values after its own results."""
    @property
    def graph(self) -> Graph: ...
    @property
    def num_params(self) -> int:
        """Number of arguments a call takes (captured inputs are passed automatically)."""
    @property
    def captured_inputs(self) -> list[Tensor | VariableHandle]:
        """Values passed after the arguments on every call: closed-over tensors, variables."""
    def count_nodes(self, kind_name: str) -> int:
        """Nodes of kind `kind_name` ("sin", "if", "while", "stack_push", ...) in all functions."""
    def explicit(self) -> ConcreteFunction:
        """The same function taking its captured inputs as arguments, after its own."""
    def over_lanes(self, batched: Sequence[bool], lanes: int) -> ConcreteFunction:
        """(Every input explicit.) This function on `lanes` lanes at once: argument k holds
        every lane's value along axis 0 where `batched[k]`, and so does every result."""
    def vjp(self, wrt: Sequence[int]) -> ConcreteFunction:
        """(Every input explicit.) Arguments, then one cotangent per result -> the gradients
        of the arguments `wrt`."""
    def jvp(self, wrt: Sequence[int]) -> ConcreteFunction:
        """(Every input explicit.) Arguments, then one tangent per argument `wrt` -> the
        results, then one tangent per float result."""
    def __call__(self, args: Sequence[TensorLike | VariableHandle]) -> list[Tensor]:
        """Runs the entry function on `args` (concrete; `num_params` of them) followed by the
        captured inputs, on the graph interpreter with the GIL released. Errors are
        `gradloop.errors` exceptions naming the failing node, its function and the source line
        it was traced from. Raises ControlFlowError when called while a trace is active."""

def vmap_begin(lanes: int) -> int:
    """Starts a batching level (one `vmap` call) of `lanes` lanes, innermost; returns it."""

def vmap_end(level: int) -> bool:
    """Ends batching level `level`; False when it was not active."""

def vmap_levels() -> list[int]:
    """The active batching levels, innermost last."""

def vmap_suspend() -> None:
    """Sets every active batching level aside until `vmap_resume`: a function traced in between
    is one lane's (a custom rule's function, whose call is then batched as a node)."""

def vmap_resume() -> bool:
    """Makes the levels the last `vmap_suspend` set aside active again; false when none were."""

def vmap_lanes(level: int) -> int | None:
    """How many lanes level `level` holds now (None when known only at run time)."""

def lanes_wrap(t: Tensor, level: int) -> Tensor:
    """One lane's view of `t`, whose axis 0 holds the current lanes of `level`."""

def lanes_unwrap(t: Tensor, level: int) -> Tensor | None:
    """Every current lane of `level` of `t` (lanes along axis 0), or None if `t` is not
    batched at `level`; a value of wider lanes is gathered to the current ones."""

def lanes_levels(t: Tensor) -> list[int]:
    """The levels `t` is batched at, innermost `vmap` first."""

def lanes_narrow(level: int, rows: Tensor) -> None:
    """Narrows level `level` to `rows` (int64 indices into its current lanes) until
    `lanes_widen(level)`."""

def lanes_stand_in(level: int, mask: Tensor) -> None:
    """Narrows level `level` to stand-ins: each lane outside `mask` computes on a copy of the
    first lane inside it, until `lanes_widen(level)`."""

def lanes_widen(level: int) -> None:
    """Undoes the last `lanes_narrow(level)`."""

def trace_begin(
    name: str,
    params: Sequence[tuple[DType | str | type, Sequence[int | None]]],
    fixed_state_loops: int | None = None,
    closed_over_inputs: bool = False,
) -> list[Tensor]:
    """Starts tracing function `name` on this thread with parameters `[(dtype, shape), ...]`
    (None in a shape: a dimension known only at run time); returns the symbolic parameters.
    With `fixed_state_loops`, loop gradients keep fixed-size state (`maximum_iterations` slots,
    else that many checkpoints), as pure StableHLO needs. With `closed_over_inputs`, every
    tensor made before the trace that the traced code uses is a captured input (scalars too)
    and ops on such tensors are traced. Raises ControlFlowError if this thread is already
    tracing."""

def trace_active() -> bool:
    """Whether a function is being traced on this thread."""

def trace_push(
    name: str, params: Sequence[tuple[DType | str | type, Sequence[int | None]]]
) -> list[Tensor]:
    """Opens an inner function frame (a branch or loop function) with parameters of the given
    types; returns its symbolic parameters. Values of outer frames used inside are captured."""

def trace_pop(results: Sequence[Tensor]) -> Branch:
    """Closes the innermost frame with `results`; returns the traced function."""

def trace_abort() -> None:
    """Drops this thread's active trace and all its frames (after an exception). Never fails."""

def trace_finish(results: Sequence[Tensor]) -> ConcreteFunction:
    """Finishes the traced function with `results` and ends the trace (also when it fails)."""

def emit_if(pred: TensorLike, then_branch: Branch, else_branch: Branch) -> list[Tensor]:
    """An `if` node over two branches traced without parameters (their captures are unified);
    returns its outputs. Active tapes record it: its gradient is an `if` over gradients."""

def emit_case(index: TensorLike, branches: Sequence[Branch]) -> list[Tensor]:
    """A `case` node over branches traced without parameters; an out-of-range index runs the
    last branch. Returns its outputs; active tapes record it."""

def emit_while(
    cond: Branch,
    body: Branch,
    loop_vars: Sequence[TensorLike],
    maximum_iterations: int | None = None,
    parallel_iterations: int = 10,
    checkpoints: int | None = None,
) -> list[Tensor]:
    """A `while` node: `cond` and `body` were traced with the loop variables' types as their
    parameters (`body` returns the next loop variables). Returns the final loop variables;
    active tapes record it (its gradient is a reverse `while` over stacks, or over
    `checkpoints` snapshots of the loop variables when given)."""

def emit_custom_call(
    inputs: Sequence[TensorLike],
    params: Sequence[Tensor],
    results: Sequence[Tensor],
    grad: Branch | None = None,
    tangent: Branch | None = None,
    refused: str | None = None,
    kernel: str | None = None,
) -> list[Tensor]:
    """Closes the innermost frame (a custom function traced on `params` that returned
    `results`) and calls it on `inputs` through a node whose gradient is `grad` (traced above
    that frame on one cotangent per result) and whose tangent is `tangent` (traced there on one
    tangent per parameter, returning one per result); `refused` is why it has neither, raised
    when a derivative is asked; `kernel` (an op's graph text) makes it a composite that the
    frame executor runs as that op. Returns the call's results."""

def factor_kernel(kernel: str, inputs: Sequence[Tensor]) -> list[Tensor]:
    """The factorisation kernel named by its graph text (`lu_factor`,
    `triangular_solve{lower=true, unit_diagonal=false}`, ...) on `inputs`, eagerly."""

def mlir_gradient_module(
    text: str,
    function: str,
    wrt: Sequence[int],
    source: str,
    checkpoints: int | None = None,
    pure_stablehlo: bool = False,
    fixed_state: int | None = None,
) -> str:
    """The generic-form MLIR module `text` with a public `func.func @<function>_grad` added (the
    gradient of `@function` with respect to its arguments `wrt`). `source` names the text in
    error locations; `checkpoints` is what every loop's gradient keeps, or else `fixed_state`
    (fixed-size state each loop chooses, that many snapshots where nothing bounds it), or else
    stacks; `pure_stablehlo` writes the gradient as `func` and `stablehlo` ops alone. Raises
    CompileError for ops or types the importer does not support."""

def mlir_jvp_module(
    text: str, function: str, wrt: Sequence[int], source: str, pure_stablehlo: bool = False
) -> str:
    """The generic-form MLIR module `text` with a public `func.func @<function>_jvp` added (its
    results and their tangents along the arguments `wrt`)."""

def op_names() -> list[str]:
    """Names of the op table's ops, in table order."""

def mlir_run_reference(text: str, function: str, args: Sequence[Any]) -> list[Tensor]:
    """`function` of the generic-form MLIR module `text` imported and run on the graph
    interpreter on `args` (concrete tensors): the reference semantics of a module."""

def mlir_supported_ops() -> list[str]:
    """Names of the MLIR ops the importer converts."""
