"""`gl.distributed` on a real local Ray instance (`ray.init(num_cpus=2)`, started once for this
module): results in input order and equal to local runs, payloads loaded once per worker,
typed errors per item, bad input refused before anything is sent, `mean_gradient` against the
single-process gradient. The multi-node and fault cases are in `test_distributed_cluster.py`."""

from __future__ import annotations

import math
import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

import gradloop as gl
from gradloop.distributed import _pool, _staging, _worker
from gradloop.examples import projectile

ray = pytest.importorskip("ray", reason="gradloop[ray] is installed by make test")

#: One Ray instance at a time: `make test` keeps the Ray modules on one of its processes.
pytestmark = pytest.mark.xdist_group("ray")

F64 = gl.float64


@pytest.fixture(scope="module", autouse=True)
def local_ray(ray_alone):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    gl.distributed.shutdown()
    ray.shutdown()


def _items(n: int = 24) -> list[tuple[gl.Tensor, gl.Tensor]]:
    thetas = np.linspace(0.05, 1.3, n)
    targets = np.linspace(20.0, 40.0, n)
    pairs = zip(thetas, targets, strict=True)
    return [(gl.tensor(t, dtype=F64), gl.tensor(d, dtype=F64)) for t, d in pairs]


def _leaves(x):
    return [np.asarray(v) for v in gl.nest.flatten(x)]


value_and_grad = gl.value_and_grad(projectile.loss, has_aux=True)
jitted = gl.jit(value_and_grad)
graph = gl.function(value_and_grad)


def test_compiled_map_agrees_with_eager_mode_in_input_order() -> None:
    items = _items()
    results = gl.distributed.map(jitted, items, chunk_size=3)
    assert len(results) == len(items)
    for item, result in zip(items, results, strict=True):
        (_, trips), grad = result  # the function's own output structure
        eager = value_and_grad(*item)
        np.testing.assert_allclose(_leaves(result)[0], _leaves(eager)[0], rtol=1e-12)
        assert int(trips) == int(eager[0][1])
        np.testing.assert_allclose(np.asarray(grad), np.asarray(eager[1]), rtol=1e-12)
    trips = [int(r[0][1]) for r in results]
    assert min(trips) < 100 and max(trips) > 400  # uneven items, balanced dynamically


def test_graph_map_equals_the_local_graph_function_bit_for_bit() -> None:
    items = _items(10)
    results = gl.distributed.map(graph, items)
    for item, result in zip(items, results, strict=True):
        for got, want in zip(_leaves(result), _leaves(graph(*item)), strict=True):
            assert got.dtype == want.dtype and np.array_equal(got, want)


def test_each_worker_loads_a_payload_once_and_keeps_it_between_maps() -> None:
    fn = gl.jit(lambda x: gl.sin(x) * 2.0)
    items = [(np.full(3, float(i)),) for i in range(40)]
    first = gl.distributed.map(fn, items, chunk_size=2)
    pool = gl.distributed._pools[None]
    before = sum(ray.get([a.loaded.remote() for a in pool.live]))
    second = gl.distributed.map(fn, items, chunk_size=2)
    after = sum(ray.get([a.loaded.remote() for a in pool.live]))
    assert after == before  # 20 chunks, no payload loaded again
    for a, b, (x,) in zip(first, second, items, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.sin(x) * 2.0, rtol=1e-12)
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_compiled_workers_do_not_import_gradloop() -> None:
    """A fresh actor that serves a compiled module runs without gradloop in its process."""
    fn = gl.jit(lambda x: gl.exp(x) + 1.0)
    signature, inputs, _ = _staging.signature(fn, (gl.tensor(np.arange(3.0)),))
    actor = ray.remote(num_cpus=0)(_worker.Worker).remote(1)
    boxed = [ray.put(signature.payload)]
    stacked, seconds = ray.get(actor.run.remote(signature.key, boxed, 1, _worker.stack([inputs])))
    assert seconds > 0.0
    [result] = _worker.unstack(stacked, 1)
    np.testing.assert_allclose(result[0], np.exp(np.arange(3.0)) + 1.0, rtol=1e-12)
    assert not ray.get(actor.imports_gradloop.remote())
    ray.kill(actor)


def test_the_worker_module_runs_a_compiled_payload_where_gradloop_cannot_be_imported(
    tmp_path: pathlib.Path,
) -> None:
    fn = gl.jit(lambda x, y: gl.matmul(x, y) * 3.0)
    x, y = np.arange(6.0).reshape(2, 3), np.arange(3.0)
    signature, inputs, _ = _staging.signature(fn, (gl.tensor(x), gl.tensor(y)))
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(_worker)
    blob = tmp_path / "call.pkl"
    blob.write_bytes(cloudpickle.dumps((_worker._compiled_caller, signature.payload, inputs)))
    script = (
        "import sys, pickle\n"
        "sys.modules['gradloop'] = None  # any import of gradloop fails\n"
        f"caller, payload, inputs = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
        "print(caller(payload, {})(tuple(inputs))[0].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == ((x @ y) * 3.0).tolist()


def test_an_item_that_fails_to_trace_raises_naming_its_index() -> None:
    fn = gl.jit(lambda w, x: gl.matmul(w, x))
    w = np.eye(3)
    items = [(w, np.ones(3)), (w, np.ones(3)), (w, np.ones(4)), (w, np.ones(3))]
    with pytest.raises(gl.errors.ShapeError, match=r"^item 2: .*matmul"):
        gl.distributed.map(fn, items)
    results = gl.distributed.map(fn, items, errors="return")
    assert isinstance(results[2], gl.errors.ShapeError) and "item 2" in str(results[2])
    for k in (0, 1, 3):
        np.testing.assert_array_equal(np.asarray(results[k]), np.ones(3))


def test_an_item_that_fails_on_its_worker_keeps_its_error_class() -> None:
    @gl.function
    def pick(x, i):
        return gl.take(x, i) * 2.0

    x = np.array([1.0, 2.0, 3.0])
    items = [(x, np.array([k % 3])) for k in range(8)]
    items[5] = (x, np.array([7]))  # out of bounds: the graph raises when it runs
    results = gl.distributed.map(pick, items, errors="return", chunk_size=2)
    assert isinstance(results[5], gl.errors.IndexError)
    assert str(results[5]).startswith("item 5: take: index 7 is out of bounds")
    for k in (0, 1, 2, 3, 4, 6, 7):
        assert np.asarray(results[k]).tolist() == [2.0 * x[k % 3]]
    with pytest.raises(gl.errors.IndexError, match=r"^item 5: take: index 7"):
        gl.distributed.map(pick, items, chunk_size=2)


def test_a_map_that_raises_raises_the_failing_item_of_lowest_index() -> None:
    """Chunks come back in any order and hold items spread over the input: the error raised
    is the lowest failing index's, every time, and items after it are not all run."""

    @gl.function
    def pick(x, i):
        return gl.take(x, i) * 2.0

    x = np.array([1.0, 2.0, 3.0])
    items = [(x, np.array([k % 3])) for k in range(64)]
    for bad in (9, 30, 60):
        items[bad] = (x, np.array([7 + bad]))
    sent: list[int] = []
    send = _pool.chunks

    def recording(*args: object) -> object:
        for chunk in send(*args):  # type: ignore[arg-type]
            sent.extend(chunk.indices)
            yield chunk

    for chunk_size in (1, 4, None):
        sent.clear()
        _pool.chunks = recording  # type: ignore[assignment]
        try:
            with pytest.raises(gl.errors.IndexError, match=r"^item 9: take: index 16"):
                gl.distributed.map(pick, items, chunk_size=chunk_size)
        finally:
            _pool.chunks = send  # type: ignore[assignment]
        assert set(range(9)) <= set(sent)  # every item before the failure ran
        if chunk_size == 1:
            assert len(sent) < 64  # items after it stopped being sent


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ((1.5, gl.tensor(2.0)), r"item 1, arguments\[0\]: .*not float.*static"),
        ((gl.tensor(1.0), "x"), r"item 1, arguments\[1\]: .*not str"),
        (([np.ones(2), {"a": object()}],), r"item 1, arguments\[0\]\[1\]\['a'\]: .*not object"),
    ],
)
def test_arguments_that_are_not_tensors_are_refused_before_anything_is_sent(item, match):
    fn = gl.jit(lambda *args: args[0])
    with pytest.raises(gl.errors.InvalidArgumentTypeError, match=match):
        gl.distributed.map(fn, [(gl.tensor(1.0),), item])


def test_a_function_that_is_not_staged_is_refused() -> None:
    with pytest.raises(gl.errors.InvalidArgumentTypeError, match=r"staged function.*gl.jit"):
        gl.distributed.map(lambda x: x, [(np.ones(2),)])
    with pytest.raises(gl.errors.InvalidArgumentError, match="errors must be one of"):
        gl.distributed.map(jitted, _items(2), errors="ignore")
    with pytest.raises(gl.errors.InvalidArgumentError, match="workers must be"):
        gl.distributed.map(jitted, _items(2), workers=0)
    with pytest.raises(gl.errors.InvalidArgumentError, match="chunk_size must be"):
        gl.distributed.map(jitted, _items(2), chunk_size=0)


def test_variables_are_read_at_staging_and_assignments_refused() -> None:
    scale = gl.Variable(np.array([2.0, 3.0]))
    read = gl.jit(lambda x: x * scale.read())
    results = gl.distributed.map(read, [(np.array([1.0, 1.0]) * k,) for k in range(4)])
    assert [np.asarray(r).tolist() for r in results] == [[2.0 * k, 3.0 * k] for k in range(4)]

    def assigns(x):
        scale.assign(x)
        return x

    for fn in (gl.jit(assigns), gl.function(assigns)):
        with pytest.raises(gl.errors.InvalidArgumentError, match="assigns Variables"):
            gl.distributed.map(fn, [(np.ones(2),)], errors="return")


def test_an_empty_map_returns_nothing_and_numpy_items_work() -> None:
    assert gl.distributed.map(jitted, []) == []
    single = gl.distributed.map(gl.jit(lambda x: x + 1.0), [np.zeros(2), np.ones(2)])
    assert [np.asarray(r).tolist() for r in single] == [[1.0, 1.0], [2.0, 2.0]]


def test_graph_functions_pickle_as_their_graph() -> None:
    concrete = graph.concrete_function(*_items(1)[0])
    copy = pickle.loads(pickle.dumps(concrete))
    assert str(copy.graph) == str(concrete.graph)
    for got, want in zip(copy(list(_items(1)[0])), concrete(list(_items(1)[0])), strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(gl.errors.InvalidArgumentError, match="parameters"):
        type(concrete).from_graph(str(concrete.graph), 5, [])
    t = gl.tensor(np.arange(4, dtype=np.int32))
    assert np.array_equal(np.asarray(pickle.loads(pickle.dumps(t))), np.arange(4))
    assert pickle.loads(pickle.dumps(t)).dtype == gl.int32


def test_chunks_hold_one_signature_each_and_items_spread_over_the_input() -> None:
    staged = [(0, "a", []), (1, "a", []), (2, "b", []), (3, "a", []), (4, "a", []), (5, "a", [])]
    got = [(c.key, c.indices) for c in _pool.chunks(staged, 1, 2)]
    assert got == [("a", [0, 5]), ("a", [3, 1]), ("a", [4]), ("b", [2])]
    assert _pool.spread(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    for n in (1, 2, 3, 37, 64, 100):
        assert sorted(_pool.spread(n)) == list(range(n))


def test_spread_chunks_of_a_rising_cost_cost_about_the_same() -> None:
    """A sweep whose cost rises with the item's place (W10's trip counts): chunks cut in input
    order would cost 1:3 between halves, spread ones nearly the same."""
    cost = np.linspace(1.0, 5.0, 64)
    staged = [(i, "a", []) for i in range(64)]
    sums = [cost[c.indices].sum() for c in _pool.chunks(staged, 2, None, lambda key: 100)]
    assert len(sums) == 2 and abs(sums[0] - sums[1]) / sum(sums) < 0.02


def test_guided_chunks_shrink_to_single_items() -> None:
    staged = [(i, "a", []) for i in range(64)]
    sizes = [len(c.indices) for c in _pool.chunks(staged, 2, None)]
    assert sum(sizes) == 64 and sizes[0] == 64 // (2 * _pool.GUIDED) and sizes[-3:] == [1, 1, 1]
    assert sizes == sorted(sizes, reverse=True)
    many = [len(c.indices) for c in _pool.chunks([(i, "a", []) for i in range(5000)], 2, None)]
    assert max(many) == _pool.MAX_CHUNK and sum(many) == 5000


def test_chunks_hold_at_least_the_floor_up_to_a_fair_share() -> None:
    staged = [(i, "a", []) for i in range(64)]
    sizes = [len(c.indices) for c in _pool.chunks(staged, 2, None, lambda key: 10)]
    # A round of guided chunks (16), then the floor, then the fair share of the 12 left.
    assert sizes == [16, 16, 10, 10, 6, 6]
    floors = iter([1, 1, 30, 30, 30, 30])  # the pace is measured after two chunks
    sizes = [len(c.indices) for c in _pool.chunks(staged, 2, None, lambda key: next(floors))]
    assert sizes == [16, 16, 16, 16]
    # Items cheap against a round trip: one chunk per worker, the items split evenly.
    assert [len(c.indices) for c in _pool.chunks(staged, 2, None, lambda key: 50)] == [32, 32]
    assert [len(c.indices) for c in _pool.chunks(staged[:7], 2, None, lambda key: 50)] == [4, 3]
    asked = []
    list(_pool.chunks([(0, "a", []), (1, "b", [])], 2, None, lambda key: asked.append(key) or 1))
    assert asked == ["a", "b"]  # each signature's floor is its own
    fixed = [len(c.indices) for c in _pool.chunks(staged, 2, 5, lambda key: 30)]
    assert set(fixed[:-1]) == {5}  # an explicit chunk_size wins


def test_the_pace_sizes_chunks_so_that_work_outweighs_a_round_trip() -> None:
    pace = _pool.Pace()
    assert pace.floor() == 1  # nothing measured: guided chunks alone
    pace.record(10, 0.010, 0.013)  # 1 ms an item, 3 ms besides
    assert pace.floor() == math.ceil(_pool.WORK_PER_ROUND_TRIP * 3)
    pace.record(10, 0.010, 0.009)  # a busy span shorter than the work: no negative cost
    assert pace.overheads[-1] == 0.0
    slow = _pool.Pace()
    slow.record(1, 1e-6, 1.0)
    assert slow.floor() == _pool.MAX_CHUNK
    for _ in range(16):  # items that grew costlier: the pace follows the recent chunks
        slow.record(10, 1.0, 1.001)
    assert slow.floor() == 1


def test_a_map_of_tiny_items_runs_in_few_round_trips() -> None:
    """Items far cheaper than a round trip: after the first chunks the rest go in chunks
    whose work outweighs the measured cost of one."""
    fn = gl.jit(lambda x: x + 1.0)
    items = [np.full(2, float(i)) for i in range(400)]
    sent: list[int] = []
    floors: list[int] = []  # the pace's floor when each map cut its first chunk
    send = _pool.chunks

    def recording(*args: object) -> object:
        staged, floor = args[0], args[3]
        floors.append(floor(staged[0][1]))  # type: ignore[index, operator]
        for chunk in send(*args):  # type: ignore[arg-type]
            sent.append(len(chunk.indices))
            yield chunk

    _pool.chunks = recording  # type: ignore[assignment]
    try:
        results = gl.distributed.map(fn, items)
    finally:
        _pool.chunks = send  # type: ignore[assignment]
    for i, r in enumerate(results):
        np.testing.assert_array_equal(np.asarray(r), np.full(2, i + 1.0))
    assert sum(sent) == 399  # the first item ran on the driver when it was staged
    # Guided chunks alone would be 20, ending in single items: [64, 64, 64, 52, 39, ..., 1].
    # How many fewer depends on the measured ratio of a round trip to an item (the machine's).
    assert len(sent) < 20, sent
    # The pace is kept: a second map of the function cuts even its first chunks by it (a
    # fresh pace's floor is 1; guided chunks of 128 items over 2 workers start at 32).
    sent.clear()
    _pool.chunks = recording  # type: ignore[assignment]
    try:
        again = gl.distributed.map(fn, items[:128])
    finally:
        _pool.chunks = send  # type: ignore[assignment]
    assert [np.asarray(r)[0] for r in again] == [i + 1.0 for i in range(128)]
    assert floors[1] > 1, floors
    assert sent[0] == max(32, min(64, floors[1])), (sent, floors)


def test_a_second_map_of_the_same_signature_computes_its_own_first_item() -> None:
    """Staging a gl.jit signature runs its first item on the driver; a later map of that
    signature sends every item (its first item's values are new)."""
    fn = gl.jit(lambda x: x * 2.0)
    first = gl.distributed.map(fn, [np.ones(2), np.zeros(2)])
    second = gl.distributed.map(fn, [np.full(2, 5.0), np.ones(2)])
    assert [np.asarray(r).tolist() for r in first] == [[2.0, 2.0], [0.0, 0.0]]
    assert [np.asarray(r).tolist() for r in second] == [[10.0, 10.0], [2.0, 2.0]]


def test_the_progress_bar_is_off_unless_asked_for_on_a_pipe() -> None:
    assert _pool.progress_bar(10, "f", None) is None  # pytest's stderr is not a terminal
    assert _pool.progress_bar(10, "f", False) is None
    bar = _pool.progress_bar(10, "f", True)
    assert bar is not None and bar.total == 10
    bar.close()


# mean_gradient ------------------------------------------------------------------------------


def _rows_loss(params, xs, ys):
    """Mean squared error over the rows, one row per trip of a data-dependent while_loop."""
    w, b = params

    def body(i, total):
        err = gl.sum(w * xs[i]) + b - ys[i]
        return i + 1, total + err * err

    n = xs.shape[0]
    _, total = gl.while_loop(lambda i, t: i < n, body, (gl.tensor(0), gl.tensor(0.0, F64)))
    return total / n


def _data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((rows, 3))
    return xs, xs @ np.array([0.5, -1.0, 2.0]) + 0.3 + 0.01 * rng.standard_normal(rows)


@pytest.mark.parametrize("staging", [gl.jit, gl.function])
def test_mean_gradient_equals_the_single_process_gradient_of_the_mean_loss(staging) -> None:
    xs, ys = _data(48)
    params = (gl.tensor(np.array([0.1, 0.2, 0.3])), gl.tensor(0.0, F64))
    step = staging(gl.value_and_grad(_rows_loss))
    shards = [(xs[k : k + 12], ys[k : k + 12]) for k in range(0, 48, 12)]
    value, (gw, gb) = gl.distributed.mean_gradient(step, params, shards)
    want_value, (want_w, want_b) = gl.value_and_grad(_rows_loss)(params, xs, ys)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(want_w), rtol=1e-12)
    np.testing.assert_allclose(float(gb), float(want_b), rtol=1e-12)


def test_mean_gradient_weights_unequal_shards() -> None:
    xs, ys = _data(30)
    params = (gl.tensor(np.array([0.1, 0.2, 0.3])), gl.tensor(0.5, F64))
    step = gl.jit(gl.value_and_grad(_rows_loss))
    bounds = [(0, 4), (4, 19), (19, 30)]
    shards = [(xs[a:b], ys[a:b]) for a, b in bounds]
    value, grads = gl.distributed.mean_gradient(
        step, params, shards, weights=[b - a for a, b in bounds]
    )
    want_value, want = gl.value_and_grad(_rows_loss)(params, xs, ys)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-12)
    for got, expected in zip(_leaves(grads), _leaves(want), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    with pytest.raises(gl.errors.InvalidArgumentError, match="weights must be 3"):
        gl.distributed.mean_gradient(step, params, shards, weights=[1.0, 2.0])
    bad = [*shards[:2], (xs[:4, :2], ys[:4])]  # two features where the model has three
    with pytest.raises(gl.errors.ShapeError, match=r"^shard 2: "):
        gl.distributed.mean_gradient(step, params, bad)


# examples -----------------------------------------------------------------------------------


def _example(name: str):
    import importlib

    folder = str(pathlib.Path(__file__).resolve().parent.parent / "examples")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def test_the_ensemble_example_fits_every_target() -> None:
    ensemble = _example("ensemble_ray")
    targets = np.array([15.0, 22.0, 31.0, 38.0])
    thetas, _, trips = ensemble.fit_all(targets, steps=40, log=False)
    for target, theta in zip(targets, thetas, strict=True):
        landing, _ = projectile.simulate(gl.tensor(theta, dtype=F64))
        assert abs(float(landing) - target) < 0.05
    assert len(set(trips.tolist())) == 4  # flights of different lengths


def test_data_parallel_training_descends_as_the_single_process_training() -> None:
    train = _example("train_ray")
    ray_params, ray_losses = train.train(20, 4, log=False)
    one_params, one_losses = train.train(20, None, log=False)
    np.testing.assert_allclose(ray_losses, one_losses, rtol=1e-10)
    for a, b in zip(ray_params, one_params, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13)
    assert ray_losses[-1] < ray_losses[0] / 1000


def test_a_map_with_no_worker_left_raises_instead_of_waiting() -> None:
    """Every actor gone and none starting: the map says so at once, with the cluster's
    state."""
    pool = _pool.Pool.__new__(_pool.Pool)
    pool.live, pool.starting, pool.payloads, pool.last_death = [], {}, {}, ""
    chunk = _pool.Chunk("k", [0], [[np.ones(1)]])
    with pytest.raises(gl.errors.ExecutionError, match=r"no worker is left .*1 nodes alive"):
        _pool.run(pool, [chunk], {"k": None}, lambda i, r: True, None)


def test_an_actor_unreachable_for_a_moment_keeps_serving_and_its_chunk_runs_again() -> None:
    """Ray's `ActorUnavailableError` (an actor it could not reach, which may answer later) is
    not a death: the actor is neither killed nor replaced, and the chunk runs again."""

    class UnreachableOnce:  # local: it travels by value
        def __init__(self, threads: int) -> None:
            self.calls = 0

        def ping(self) -> int:
            return os.getpid()

        def run(self, key, boxed, count, stacked):
            self.calls += 1
            if self.calls == 1:
                raise ray.exceptions.ActorUnavailableError("unreachable for a moment", None)
            return [[np.asarray(2.0 * stacked[0][j])] for j in range(count)], 0.0

    pool = _pool.Pool.__new__(_pool.Pool)
    pool._actor_class = ray.remote(num_cpus=0, max_restarts=0)(UnreachableOnce)
    pool.size, pool.live, pool.starting, pool.payloads = 1, [], {}, {}
    pool.failed_starts, pool.last_death = 0, ""
    pool.start_actor()
    (ref,) = pool.starting
    pool.started(ref)
    (actor,) = pool.live
    chunks = [_pool.Chunk("k", [i], [[np.asarray(float(i))]]) for i in range(3)]
    got: dict[int, float] = {}

    def done(index, result) -> bool:
        got[index] = float(result[0])
        return True

    _pool.run(pool, chunks, {"k": None}, done, None)
    assert got == {0: 0.0, 1: 2.0, 2: 4.0}
    assert pool.live == [actor] and not pool.starting and pool.last_death == ""
    assert chunks[0].attempts + chunks[1].attempts + chunks[2].attempts == 1


def test_workers_that_die_starting_are_replaced_a_few_times_then_the_map_says_why() -> None:
    """An actor that dies before it answers is replaced (at most `RETRIES` times per worker),
    so a pool does not shrink for good on one failed start; when none can start, the map's
    error carries Ray's reason for the last death instead of waiting for ever."""

    class DiesAtBirth:  # local: it travels by value
        def __init__(self, threads: int) -> None:
            raise RuntimeError("this worker cannot start")

        def ping(self) -> None:
            pass

    pool = _pool.Pool.__new__(_pool.Pool)
    pool._actor_class = ray.remote(num_cpus=0, max_restarts=0)(
        DiesAtBirth
    )  # placed beside the pools
    pool.size, pool.live, pool.starting, pool.payloads = 2, [], {}, {}
    pool.failed_starts, pool.last_death = 0, ""
    for _ in range(pool.size):
        pool.start_actor()
    chunk = _pool.Chunk("k", [0], [[np.ones(1)]])
    with pytest.raises(gl.errors.ExecutionError, match="this worker cannot start") as caught:
        _pool.run(pool, [chunk], {"k": None}, lambda i, r: True, None)
    assert "1 chunks not run" in str(caught.value)
    assert pool.failed_starts == pool.size * (_pool.RETRIES + 1)
    assert not pool.starting and not pool.live
