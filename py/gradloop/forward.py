"""Forward-mode autodiff: `jvp`, `linearize`, `jacfwd`, `jacrev`, `hessian` and `custom_jvp`,
over the core's `ForwardAccumulator`.

While `fn` runs inside `jvp`, an accumulator gives each op's outputs their tangents at once,
from the op's tangent rule; a `cond`, `switch_case` or `while_loop` traced inside a
`@gl.function` or `gl.jit` becomes the node that carries tangents beside its values (a loop
needs no stacks). Tapes record the tangent ops (reverse over forward) and accumulators see the
ops of a tape's gradient (forward over reverse: `hessian`), so everything composes with `grad`,
`GradientTape`, `@gl.function` and `gl.jit`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _core, _validate, batching, errors, nest
from . import variables as _variables
from ._custom_ops import custom_op
from ._recording import paused, perturbed
from .autodiff import GradientTape

__all__ = ["custom_jvp", "hessian", "jacfwd", "jacrev", "jvp", "linearize"]


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", "fn")


def _primal(leaf: Any) -> Any:
    leaf = leaf.read() if isinstance(leaf, _variables.Variable) else leaf
    return _validate.convert_number(leaf)


def _tangent(
    t: Any, p: _core.Tensor, where: str, path: str, mismatch: type = errors.GradientError
) -> _core.Tensor | None:
    """The tangent `t` given for primal `p`: a tensor of `p`'s type, None for integer and bool
    primals (their tangents are absent; zeros are accepted and dropped)."""
    if not p.dtype.is_floating:
        if t is None:
            return None
        values = np.asarray(t.numpy() if isinstance(t, _core.Tensor) else t)
        if values.size and np.any(values != 0):
            raise errors.GradientError(
                _validate.at_user(
                    f"{where}: primal {path} is {p.dtype.name}, which has no tangent; pass None"
                )
            )
        return None
    if t is None:
        raise errors.GradientTypeError(
            _validate.at_user(f"{where}: tangent {path} is None but its primal is {p.dtype.name}")
        )
    if not isinstance(t, _core.Tensor):
        values = np.asarray(t)
        if values.dtype.kind not in "fc":  # an int tangent of a float primal is a type error
            raise errors.GradientTypeError(
                _validate.at_user(
                    f"{where}: tangent {path} is {type(t).__name__} of {values.dtype} values but "
                    f"its primal is {p.dtype.name}: pass a float tangent"
                )
            )
        t = _core.tensor(values, dtype=p.dtype)
    if t.dtype != p.dtype:
        raise errors.GradientTypeError(
            _validate.at_user(
                f"{where}: tangent {path} is {t.dtype.name}{list(t.shape)} but its primal is "
                f"{p.dtype.name}{list(p.shape)}"
            )
        )
    if tuple(t.shape) != tuple(p.shape):
        raise mismatch(
            _validate.at_user(
                f"{where}: tangent {path} is {t.dtype.name}{list(t.shape)} but its primal is "
                f"{p.dtype.name}{list(p.shape)}"
            )
        )
    return t


def _output_tangent(acc: Any, leaf: Any) -> Any:
    """The tangent of an output leaf: zeros for a float output nothing perturbed, None for an
    integer or bool output and for a value that is not a tensor."""
    if isinstance(leaf, _variables.Variable):
        leaf = leaf.read()
    if not isinstance(leaf, _core.Tensor) or not leaf.dtype.is_floating:
        return None
    t = acc.tangent(leaf)
    return _core.zeros_like(leaf) if t is None else t


def jvp(fn: Callable[..., Any], primals: Any, tangents: Any) -> tuple[Any, Any]:
    """`(fn(*primals), J tangents)`: the Jacobian-vector product of `fn` at `primals`.

    `primals` and `tangents` are tuples (or lists) with one entry per positional argument of
    `fn`, each a tensor or a nested tuple/list/dict of them; `tangents` mirrors `primals`, a
    float tensor of its primal's dtype and shape for each float leaf and None for integer and
    bool leaves. The output tangents have `fn`'s output structure: zeros for float outputs that
    do not depend on the primals, None for integer and bool outputs. Works eagerly (Python
    control flow included), inside `@gl.function` and under `gl.jit`; a `while_loop` carries its
    tangents beside its loop variables, in memory independent of its trip count.
    """
    where = f"jvp({_name(fn)})"
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise errors.InvalidArgumentTypeError(
            _validate.at_user(
                f"{where}: primals and tangents must be tuples (one entry per argument); got "
                f"{type(primals).__name__} and {type(tangents).__name__}"
            )
        )
    if len(primals) != len(tangents):
        raise errors.InvalidArgumentTypeError(
            _validate.at_user(
                f"{where}: {len(primals)} primals but {len(tangents)} tangents were given"
            )
        )
    acc = _core.ForwardAccumulator()
    args = []
    for i, (p_arg, t_arg) in enumerate(zip(primals, tangents, strict=True)):
        p_flat = nest.flatten_with_paths(p_arg)
        t_flat = _flatten_like(p_arg, t_arg, f"{where}, argument {i}")
        leaves = []
        for (path, p), t in zip(p_flat, t_flat, strict=True):
            p = _primal(p)
            label = f"of argument {i}{nest.path_str(path)}"
            if not isinstance(p, _core.Tensor):
                raise errors.InvalidArgumentError(
                    _validate.at_user(
                        f"{where}: primal {label} must be a tensor; got {type(p).__name__}"
                    )
                )
            t = _tangent(t, p, where, label)
            if t is not None:
                # Inside vmap a primal and its tangent are lanes of the same calls.
                p, t = batching.match_lanes(p, t)
                # A value of its own: the caller's tensor keeps no tangent after the call.
                p = _core.identity(p)
                acc.watch(p, t)
            leaves.append(p)
        args.append(nest.pack_sequence_as(p_arg, leaves))
    acc.push()
    try:
        out = fn(*args)
    finally:
        acc.pop()
    return out, nest.map_structure(lambda leaf: _output_tangent(acc, leaf), out)


def _flatten_like(primal: Any, tangent: Any, where: str) -> list[Any]:
    """`tangent`'s leaves, checked to have `primal`'s structure (a None tangent stands for a
    whole integer structure)."""
    if tangent is None:
        return [None] * len(nest.flatten(primal))
    difference = nest.structure_difference(primal, tangent, check_types=False)
    if difference is not None:
        path, want, got = difference
        raise errors.InvalidArgumentTypeError(
            _validate.at_user(
                f"{where}: the tangent's structure differs from the primal's at "
                f"{nest.path_str(path) or 'the top'}: {want} vs {got}"
            )
        )
    return nest.flatten(tangent)


def linearize(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """`(fn(*primals), f_jvp)` where `f_jvp(*tangents)` is `jvp(fn, primals, tangents)[1]`.

    `f_jvp` evaluates `fn`'s primal computation again with each call (as `jvp` does); its
    results equal those of `jvp` at the same tangents.
    """
    out = fn(*primals)

    @functools.wraps(fn)
    def f_jvp(*tangents: Any) -> Any:
        return jvp(fn, primals, tangents)[1]

    return out, f_jvp


def _basis(x: _core.Tensor, n: int) -> _core.Tensor:
    """The `n` unit tensors of `x`'s type stacked along a new axis 0 (flat index order)."""
    return _core.tensor(np.eye(n).reshape((n, *x.shape)), dtype=x.dtype)


def _static_size(x: _core.Tensor, where: str) -> int:
    if any(d is None or d < 0 for d in x.shape):
        raise errors.InvalidArgumentError(
            _validate.at_user(f"{where}: a Jacobian needs static shapes; got {list(x.shape)}")
        )
    return int(np.prod(x.shape, dtype=np.int64))


def _wrt(args: tuple[Any, ...], argnums: Any, where: str) -> tuple[list[Any], tuple[int, ...]]:
    nums = _validate.check_argnums(argnums)
    return _validate.differentiable_args(args, nums, where), nums


def _assemble(out: Any, nums: tuple[int, ...], argnums: Any, args: list[Any], block: Any) -> Any:
    """The Jacobian's structure (JAX's): `out`'s, each leaf holding the argument's structure
    (a tuple of them for a tuple `argnums`) of blocks `block(out_leaf_index, arg, leaf_index)`."""
    out_leaves = nest.flatten(out)
    per_out = []
    for k in range(len(out_leaves)):
        per_arg = []
        for i in nums:
            in_leaves = nest.flatten(args[i])
            per_arg.append(
                nest.pack_sequence_as(args[i], [block(k, i, m) for m in range(len(in_leaves))])
            )
        per_out.append(per_arg[0] if isinstance(argnums, int) else tuple(per_arg))
    return nest.pack_sequence_as(out, per_out)


def _partial(fn: Callable[..., Any], args: list[Any], nums: tuple[int, ...]) -> Callable[..., Any]:
    """`fn` as a function of the arguments at `nums` only, the others fixed at `args`."""

    def call(*wrt: Any) -> Any:
        full = list(args)
        for i, a in zip(nums, wrt, strict=True):
            full[i] = a
        return fn(*full)

    return call


# Above this many columns a traced `jacfwd` batches them (one program) rather than unrolling.
_TRACED_COLUMNS = 64


def jacfwd(fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """The Jacobian of `fn` with respect to argument(s) `argnums`, by forward mode: a `jvp`
    per input element, eagerly all of them at once (`vmap` over the unit tangents). Each block has
    shape `output.shape + input.shape`; the result has `fn`'s output structure with, at each
    leaf, the argument's structure (a tuple of them for a tuple `argnums`). Integer and bool
    outputs get None."""
    where = f"jacfwd({_name(fn)})"

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        args_list, nums = _wrt(args, argnums, where)
        call = _partial(fn, args_list, nums)
        primals = tuple(args_list[i] for i in nums)
        zeros = [nest.map_structure(_core.zeros_like, p) for p in primals]
        columns: dict[tuple[int, int], list[Any] | None] = {}
        out = None
        for a, p in enumerate(primals):
            for m, x in enumerate(nest.flatten(p)):
                n = _static_size(x, where)
                if n == 0:
                    columns[(nums[a], m)] = None
                    continue
                column, basis = _Column(call, primals, zeros, a, m), _basis(x, n)
                if _core.trace_active() and n <= _TRACED_COLUMNS:
                    # Traced, one column at a time: a primal and its tangent are lanes of the
                    # same calls, so a batch would repeat the primal program for every column
                    # (`benches/jacobians.py`: slower than the columns' fused loops). The
                    # bound keeps the graph's size linear in the program, not in `n`.
                    per_column = [column(basis[j]) for j in range(n)]
                    out = per_column[0][0]
                    t_out = [
                        _core.stack(list(ts), axis=-1)
                        for ts in zip(*(nest.flatten(c[1]) for c in per_column), strict=True)
                    ]
                    columns[(nums[a], m)] = t_out
                    continue
                # the tangents' lanes last: each block is then `o.shape + (n,)`; the output
                # is every lane's (the same in all, though a loop may have made it lanes)
                outs, t_out = batching.vmap(column, out_axes=(0, -1))(basis)
                out = nest.map_structure(_first_lane, outs)
                columns[(nums[a], m)] = nest.flatten(t_out)
        if out is None:  # every argument is empty
            out = fn(*args_list)
        out_leaves = nest.flatten(out)

        def block(k: int, i: int, m: int) -> Any:
            x = nest.flatten(args_list[i])[m]
            o = out_leaves[k]
            o = o.read() if isinstance(o, _variables.Variable) else o
            if not isinstance(o, _core.Tensor) or not o.dtype.is_floating:
                return None
            cols = columns[(i, m)]
            if cols is None:
                return _core.zeros(tuple(o.shape) + tuple(x.shape), dtype=o.dtype)
            return _core.reshape(cols[k], tuple(o.shape) + tuple(x.shape))

        return _assemble(out, nums, argnums, args_list, block)

    return wrapper


def _first_lane(x: Any) -> Any:
    return x[0] if isinstance(x, _core.Tensor) else x


class _Column:
    """One lane of `jacfwd`: `fn`'s output and its tangent along unit tangent `e` of leaf `m`
    of argument `a` (zeros elsewhere)."""

    def __init__(self, call: Any, primals: tuple[Any, ...], zeros: list[Any], a: int, m: int):
        self.call, self.primals, self.zeros, self.a, self.m = call, primals, zeros, a, m

    def __call__(self, e: _core.Tensor) -> Any:
        tangents = list(self.zeros)
        flat = nest.flatten(self.zeros[self.a])
        flat[self.m] = e
        tangents[self.a] = nest.pack_sequence_as(self.zeros[self.a], flat)
        out, t_out = jvp(self.call, self.primals, tuple(tangents))
        # outputs without a tangent (integers) as zeros, so that vmap has a leaf to place
        t_flat = [
            _core.zeros_like(o) if t is None and isinstance(o, _core.Tensor) else t
            for o, t in zip(nest.flatten(out), nest.flatten(t_out), strict=True)
        ]
        return out, nest.pack_sequence_as(out, t_flat)


def jacrev(fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """The Jacobian of `fn` with respect to argument(s) `argnums`, by reverse mode: a gradient
    per output element from one forward pass, all of them at once (`vmap` over the unit
    cotangents). Shapes and structure as `jacfwd`'s."""
    where = f"jacrev({_name(fn)})"

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        args_list, nums = _wrt(args, argnums, where)
        if _core.vmap_levels():
            # Inside vmap each lane differentiates with respect to its own copy (as `grad`).
            for i in nums:
                args_list[i] = nest.map_structure(batching.lanes_everywhere, args_list[i])
        sources = [x for i in nums for x in nest.flatten(args_list[i])]
        with GradientTape(persistent=True) as tape:
            tape.watch(sources)
            out = fn(*args_list)
        rows: dict[int, list[Any] | None] = {}
        for k, o in enumerate(nest.flatten(out)):
            if isinstance(o, _variables.Variable):
                o = o.read()
            if not isinstance(o, _core.Tensor) or not o.dtype.is_floating:
                continue
            n = _static_size(o, where)
            if n == 0:
                rows[k] = None
                continue
            row, basis = _Row(tape, o, sources), _basis(o, n)
            if _core.lanes_levels(o):
                # an output that is lanes of an enclosing vmap: one row at a time (the rows'
                # lanes would nest inside the output's, which a seed cannot be yet)
                per_row = [row(basis[j]) for j in range(n)]
                rows[k] = [_core.stack(list(g), axis=0) for g in zip(*per_row, strict=True)]
            else:
                rows[k] = list(batching.vmap(row)(basis))
        out_leaves = nest.flatten(out)
        offsets = {}
        count = 0
        for i in nums:
            for m in range(len(nest.flatten(args_list[i]))):
                offsets[(i, m)] = count
                count += 1

        def block(k: int, i: int, m: int) -> Any:
            if k not in rows:
                return None
            o = out_leaves[k]
            o = o.read() if isinstance(o, _variables.Variable) else o
            x = sources[offsets[(i, m)]]
            grads = rows[k]
            if grads is None:
                return _core.zeros(tuple(o.shape) + tuple(x.shape), dtype=x.dtype)
            return _core.reshape(grads[offsets[(i, m)]], tuple(o.shape) + tuple(x.shape))

        return _assemble(out, nums, argnums, args_list, block)

    return wrapper


class _Row:
    """One lane of `jacrev`: the gradients of `sources` along unit cotangent `e` of `o`."""

    def __init__(self, tape: GradientTape, o: _core.Tensor, sources: list[Any]):
        self.tape, self.o, self.sources = tape, o, sources

    def __call__(self, e: _core.Tensor) -> Any:
        grads = self.tape.gradient(
            self.o, self.sources, output_gradients=e, unconnected_gradients="zero"
        )
        return tuple(grads)


def hessian(fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """The Hessian of scalar `fn`: `jacfwd(jacrev(fn, argnums), argnums)` (forward over
    reverse). Through a `while_loop`, the forward pass differentiates the reverse pass's
    loops, stacks included."""
    return jacfwd(jacrev(fn, argnums), argnums)


def _rule_pair(result: Any, where: str) -> tuple[Any, Any]:
    """A custom_jvp rule's `(outputs, tangents)`; anything else is a GradientTypeError (a
    TypeError, as JAX raises)."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        got = type(result).__name__
        if isinstance(result, (tuple, list)):
            got = f"a {got} of {len(result)}"
        raise errors.GradientTypeError(
            _validate.at_user(f"{where}: the rule must return (outputs, tangents); got {got}")
        )
    return result[0], result[1]


class custom_jvp:
    """Decorator: a function with its own forward-mode rule (JAX's convention).

    ```python
    @gl.custom_jvp
    def f(x): ...

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), ...   # (outputs, output tangents) in the outputs' structure
    ```

    Positional arguments are the tensor inputs; the rule receives them and their tangents
    (zeros for unperturbed float inputs, None for integer and bool ones) as tuples; keyword
    arguments pass through to `f` and the rule. Reverse mode uses the rule too, as JAX does:
    the gradient is the transpose of the rule's tangent map (the rule's tangent output is
    linear in the tangents; its gradient with respect to them, at zero tangents, is the
    vector-Jacobian product), so a rule that fixes a numerically unstable derivative fixes
    `grad` as well. Without a rule `f` runs as written. Inside `@gl.function` and `gl.jit` the
    rule holds wherever `f` is called, loop bodies and branches included; a rule that fails
    raises a `GradientError` when a derivative is asked, not when `f` is merely called.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.rule: Callable[..., Any] | None = None
        # Calls of `f` made by its own rule while it is transposed or traced run as written: a
        # rule usually computes its primal output by calling `f`.
        self._transposing = threading.local()
        # The types of `f`'s outputs by input signature (`_check_primal`).
        self._output_types: dict[Any, list[Any]] = {}
        functools.update_wrapper(self, fn)

    #: Whether tapes outside an accumulator (reverse over forward) differentiate the value the
    #: rule computes, as JAX does. A rule whose value only stands in (a linear map held at
    #: zero: `custom_linear_solve`) sets it False: the value is then `f` as one op whose
    #: gradient is the transposed rule.
    _value_from_rule = True

    def defjvp(self, rule: Callable[..., Any]) -> Callable[..., Any]:
        """Sets the forward-mode rule `rule(primals, tangents) -> (outputs, tangents)`."""
        self.rule = rule
        return rule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        where = f"custom_jvp({_name(self.fn)})"
        inputs = [_validate.input_tensor(a, i, where) for i, a in enumerate(args)]
        accs = perturbed(inputs)
        # Traced, the call is a node whose tangent is the rule traced, even where its inputs
        # have tangents now: a branch or loop body's tangents are built again from its nodes
        # (the construct's tangent), and only the node carries the rule there.
        staged = not accs or _core.trace_active()
        if staged and self.rule is not None and not getattr(self._transposing, "on", False):
            return self._reverse(inputs, kwargs, where)
        if not accs:
            return self.fn(*inputs, **kwargs)
        if self.rule is None:
            raise errors.GradientError(
                _validate.at_user(f"{where}: no forward-mode rule: define one with defjvp")
            )
        acc = accs[-1]
        tangents = tuple(
            None
            if not x.dtype.is_floating
            else (t if (t := acc.tangent(x)) is not None else _core.zeros_like(x))
            for x in inputs
        )
        # The rule runs outside its own accumulator (outer ones see it: higher order). Tapes
        # nested inside that accumulator (forward over reverse: `hessian`) do not record its
        # ops: their gradient would run under the accumulator on intermediates it never saw.
        # They record `f` as one op whose gradient is the transposed rule, run under it.
        place = acc.pop()
        try:
            # A value the rule only stands in for (`_value_from_rule`) is `f` as one op on every
            # tape, its gradient the transposed rule, before the rule runs for the tangents.
            held = None if self._value_from_rule else self._reverse(inputs, kwargs, where)
            inner = None if place is None else _core.pause_recording(place[1])
            try:
                result = self.rule(tuple(inputs), tangents, **kwargs)
                y, ty = _rule_pair(result, where)
                y_flat = [_primal(leaf) for leaf in nest.flatten(y)]
                t_flat = _flatten_like(y, ty, f"{where}, the rule's tangents")
                self._check_primal(inputs, kwargs, y_flat, where)
                fresh = [_core.identity(v) if isinstance(v, _core.Tensor) else v for v in y_flat]
            finally:
                if inner is not None:
                    _core.resume_recording(inner)
        finally:
            if place is not None:
                acc.push_at(place)
        if held is not None:
            fresh = list(nest.flatten(held))
        levels = batching.argument_levels(tuple(inputs), {})
        if levels:  # lanes wherever an input is: each lane's cotangent its own (`custom_op`)
            fresh = [batching.lanes_everywhere(v, levels) for v in fresh]
        outs = [v for v in fresh if isinstance(v, _core.Tensor)]
        if held is None and place is not None and outs and _core.any_tape_active():
            _core.record_custom_gradient(
                where,
                inputs,
                outs,
                lambda *cts: self._transposed(inputs, kwargs, where, list(cts)),
                above_level=place[1],
            )
        for k, (v, t) in enumerate(zip(fresh, t_flat, strict=True)):
            if isinstance(v, _core.Tensor):
                t = _tangent(t, v, where, f"{k} of the rule's outputs", errors.GradientTypeError)
                if t is not None:
                    # inside vmap, a primal and its tangent are lanes of the same calls
                    fresh[k], t = batching.match_lanes(v, t)
                    acc.watch(fresh[k], t)
        return nest.pack_sequence_as(y, fresh)

    def _check_primal(
        self, xs: list[Any], kwargs: dict[str, Any], y_flat: list[Any], where: str
    ) -> None:
        """Eagerly, the rule's primal outputs must be typed as `f`'s (what `f` gives is
        found by running it once per input signature, unrecorded; traced, the node's
        verification checks it)."""
        if _core.trace_active():
            return
        key = (tuple((x.dtype, tuple(x.shape)) for x in xs), tuple(sorted(kwargs)))
        types = self._output_types.get(key)
        if types is None:
            with paused():
                out = nest.flatten(self.fn(*xs, **kwargs))
            types = [(v.dtype, tuple(v.shape)) for v in map(_primal, out)]
            self._output_types[key] = types
        got = [(v.dtype, tuple(v.shape)) for v in y_flat]
        if got != types:
            show = lambda ts: ", ".join(f"{d.name}{list(s)}" for d, s in ts)  # noqa: E731
            raise errors.GradientTypeError(
                _validate.at_user(
                    f"{where}: the rule's primal outputs are ({show(got)}) but the function's "
                    f"are ({show(types)})"
                )
            )

    def _rule(self, xs: Any, ts: Any, kwargs: dict[str, Any], where: str) -> tuple[Any, Any]:
        """The rule's `(outputs, tangents)` at `xs` and tangents `ts`, calls of `f` inside it
        run as written."""
        assert self.rule is not None
        self._transposing.on = True
        try:
            result = self.rule(tuple(xs), tuple(ts), **kwargs)
        finally:
            self._transposing.on = False
        return _rule_pair(result, where)

    def _transposed(
        self, xs: list[Any], kwargs: dict[str, Any], where: str, cotangents: list[Any]
    ) -> list[Any]:
        """The gradients of inputs `xs` from the cotangents of `f`'s flat outputs: the
        rule's tangent map at `xs`, transposed (its gradient with respect to the tangents at
        zero). Its ops are recorded and see tangents as any ops do: higher order."""
        floats = [x for x in xs if x.dtype.is_floating]
        # Inside vmap each lane transposes its own map: its own tangents.
        zeros = [batching.lanes_everywhere(_core.zeros_like(x)) for x in floats]
        it = iter(zeros)
        tangents = tuple(next(it) if x.dtype.is_floating else None for x in xs)
        with GradientTape() as tape:
            tape.watch(zeros)
            y, ty = self._rule(xs, tangents, kwargs, where)
        t_flat = [
            t if isinstance(t, _core.Tensor) else None
            for t in _flatten_like(y, ty, f"{where}, the rule's tangents")
        ]
        if len(t_flat) != len(cotangents):
            raise errors.GradientTypeError(
                _validate.at_user(
                    f"{where}: the rule gives {len(t_flat)} outputs; the function "
                    f"gives {len(cotangents)}"
                )
            )
        for k, (v, c) in enumerate(zip(nest.flatten(y), cotangents, strict=True)):
            v = _primal(v)
            if (v.dtype, tuple(v.shape)) != (c.dtype, tuple(c.shape)):
                raise errors.GradientTypeError(
                    _validate.at_user(
                        f"{where}: the rule's primal output {k} is {v.dtype.name}"
                        f"{list(v.shape)} but the function's is {c.dtype.name}{list(c.shape)}"
                    )
                )
        for k, (t, c) in enumerate(zip(t_flat, cotangents, strict=True)):
            if t is not None and (t.dtype, tuple(t.shape)) != (c.dtype, tuple(c.shape)):
                raise errors.GradientTypeError(
                    _validate.at_user(
                        f"{where}: the rule's tangent {k} is {t.dtype.name}{list(t.shape)} but "
                        f"the function's output is {c.dtype.name}{list(c.shape)}"
                    )
                )
        used = [(t, c) for t, c in zip(t_flat, cotangents, strict=True) if t is not None]
        grads = iter(
            tape.gradient(
                [t for t, _ in used],
                zeros,
                output_gradients=[c for _, c in used],
                unconnected_gradients="zero",
            )
            if used
            else [None] * len(zeros)
        )
        return [next(grads) if x.dtype.is_floating else None for x in xs]

    def _reverse(self, inputs: list[Any], kwargs: dict[str, Any], where: str) -> Any:
        """`f` as one op whose gradient is the transposed rule (see the class doc)."""

        def forward(*xs: _core.Tensor) -> tuple[Any, Callable[..., Any]]:
            def backward(*cotangents: Any) -> list[Any]:
                return self._transposed(list(xs), kwargs, where, nest.flatten(list(cotangents)))

            return self.fn(*xs, **kwargs), backward

        def tangents(xs: list[_core.Tensor], ts: list[Any]) -> list[Any]:
            """The rule's output tangents, traced (`custom_op`)."""
            ts = [
                _core.zeros_like(x) if t is None and x.dtype.is_floating else t
                for x, t in zip(xs, ts, strict=True)
            ]
            y, ty = self._rule(xs, ts, kwargs, where)
            return _flatten_like(y, ty, f"{where}, the rule's tangents")

        # under an outer accumulator (the value held for tapes, `_value_from_rule`): the rule
        return custom_op(forward, where, forward_fn=self, tangent_fn=tangents)(*inputs)
