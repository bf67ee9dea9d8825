"""`gl.distributed` on a two-node Ray cluster (`ray.cluster_utils.Cluster`: a head and a
worker node of one CPU each, started once for this module): items spread over both nodes, a
worker process killed in the middle of a map and a node lost in the middle of one, with the
results equal to a clean run's."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import time

import numpy as np
import pytest

import gradloop as gl

ray = pytest.importorskip("ray", reason="gradloop[ray] is installed by make test")

#: One Ray instance at a time: `make test` keeps the Ray modules on one of its processes.
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def cluster(ray_alone):
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker_node = nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes, worker_node
    gl.distributed.shutdown()
    ray.shutdown()
    nodes.shutdown()


def failure_diagnostics(item: pytest.Item) -> str:
    """What Ray's own logs say about workers that died or would not start, for a failed
    test's report (see conftest): on a loaded machine the map's error alone may not say why."""
    cluster = item.funcargs.get("cluster")
    if cluster is None:
        return "(no cluster)"
    logs = pathlib.Path(cluster[0].head_node.get_session_dir_path()) / "logs"
    notable = re.compile(r"kill|memory|died|dead|exit|timed? ?out|fail|error", re.IGNORECASE)
    lines = []
    for path in [
        p
        for pattern in ("raylet*.out", "gcs_server*.out", "worker-*.err")
        for p in sorted(logs.glob(pattern))
    ]:
        text = path.read_text(errors="replace").splitlines()
        found = [line[:300] for line in text if notable.search(line) and "state-dump" not in line]
        lines += [f"{path.name}: {line}" for line in found[-20:]]
    return "\n".join(lines) or "(nothing notable in Ray's logs)"


def spin_loop(x, n):
    """n trips of W5's body: tens of milliseconds an item, so that a map takes a while."""

    def body(i, x):
        return i + 1, 0.999 * x + 0.001 * gl.sin(x)

    return gl.while_loop(lambda i, x: i < n, body, (gl.tensor(0), x))[1]


compiled_spin = gl.jit(spin_loop)
graph_spin = gl.function(spin_loop)


def _items(count: int, trips: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    # uneven trip counts, as data-dependent loops have
    return [
        (rng.standard_normal(16), np.array(int(trips * (0.5 + rng.random())), np.int32))
        for _ in range(count)
    ]


def _values(results: list) -> list[np.ndarray]:
    return [np.asarray(r) for r in results]


def _pids_and_nodes() -> list[tuple[int, str]]:
    pool = gl.distributed._pools[None]
    return ray.get([actor.ping.remote() for actor in pool.live])


def test_items_run_on_both_nodes_and_agree_with_local_runs(cluster) -> None:
    nodes, _ = cluster
    items = _items(12, 100_000)
    # the first map joins the cluster at its address
    results = gl.distributed.map(compiled_spin, items, address=nodes.address, chunk_size=1)
    assert ray.is_initialized()
    # The map may end before the other node's actor is up; wait for it, then map again: with
    # both actors live, each takes chunks from the start.
    pool = gl.distributed._pools[None]
    for ref in list(pool.starting):
        pool.started(ref)
    again = gl.distributed.map(compiled_spin, items, chunk_size=1)
    for (x, n), got, got_again in zip(items, results, again, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(graph_spin(x, n)), rtol=1e-12)
        assert np.array_equal(np.asarray(got), np.asarray(got_again))
    nodes = {node for _, node in _pids_and_nodes()}
    assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2


class _OnFirstResult:
    """A stand-in for the map's progress bar that runs `action` when the first chunk's
    results arrive, in the middle of the map (the other chunks are running or queued)."""

    def __init__(self, action) -> None:
        self.action, self.done, self.acted_at = action, 0, None

    def update(self, n: int) -> None:
        if self.acted_at is None:
            self.acted_at = self.done + n
            self.action()
        self.done += n

    def close(self) -> None:
        pass


def _map_with(monkeypatch, action, fn, items) -> tuple[list, _OnFirstResult]:
    trigger = _OnFirstResult(action)
    monkeypatch.setattr(gl.distributed._pool, "progress_bar", lambda *_: trigger)
    results = gl.distributed.map(fn, items, chunk_size=1)
    # every item ran on a worker: the clean run before staged the signature
    assert trigger.acted_at is not None and trigger.acted_at < len(items)
    assert trigger.done == len(items)
    return results, trigger


@pytest.mark.parametrize("fn", [compiled_spin, graph_spin], ids=["compiled", "graph"])
def test_a_worker_killed_mid_map_loses_no_item(cluster, monkeypatch, fn) -> None:
    items = _items(16, 100_000)
    clean = _values(gl.distributed.map(fn, items, chunk_size=1))
    victim = _pids_and_nodes()[0][0]
    results, _ = _map_with(monkeypatch, lambda: os.kill(victim, signal.SIGKILL), fn, items)
    assert victim not in {pid for pid, _ in _pids_and_nodes()}  # a new actor took its place
    got = _values(results)
    assert len(got) == len(clean)
    for a, b in zip(got, clean, strict=True):
        assert np.array_equal(a, b)


def test_a_node_lost_mid_map_loses_no_item(cluster, monkeypatch) -> None:
    """The worker node is removed while the map runs: its actor's chunks run on the head's.
    Its replacement cannot be placed (no CPU left): the map does not wait for it."""
    nodes, worker_node = cluster
    items = _items(16, 100_000)
    clean = _values(gl.distributed.map(graph_spin, items, chunk_size=1))
    results, _ = _map_with(monkeypatch, lambda: nodes.remove_node(worker_node), graph_spin, items)
    for a, b in zip(_values(results), clean, strict=True):
        assert np.array_equal(a, b)
    # Ray marks the node dead once its health checks fail, which may come after the map ends.
    deadline = time.monotonic() + 60
    while len([n for n in ray.nodes() if n["Alive"]]) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len([n for n in ray.nodes() if n["Alive"]]) == 1
