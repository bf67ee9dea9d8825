"""`--graph-runner`: what runs `@gl.function` graphs in this session: the frame executor (the
default; loops of cheap nodes fused into sequential programs), the executor with every loop a
frame of tokens (`frames`), or the reference interpreter. `make test` runs the graph-mode suites
on all three. Fused frames that compile run in check mode: compiled and interpreted, compared."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# A compile that runs away fails its test in five minutes instead of holding the suite. The
# largest modules the tests compile (a random program's jvp, gradient and both second
# derivatives, about 45,000 lines) take 90 s alone on a 2-core VM, and over 120 s while the
# other test process compiles too.
os.environ.setdefault("GRADLOOP_COMPILE_TIMEOUT_S", "300")

import gradloop as gl

# Speed is measured in benches/, not asserted here: no per-example deadline, which a loaded
# machine (the suite runs on every core) would turn into failures.
settings.register_profile("gradloop", deadline=None)
settings.load_profile("gradloop")


_OWN_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # One IREE compile cache for the session's processes (pytest-xdist's workers inherit the
    # controller's environment), fresh unless the caller names one: `make test` names one for
    # its three passes, which run the same compiled programs on different graph runners. Tests
    # of the cache itself give themselves a private one.
    if "GRADLOOP_CACHE_DIR" not in os.environ and not hasattr(config, "workerinput"):
        os.environ["GRADLOOP_CACHE_DIR"] = tempfile.mkdtemp(prefix="gradloop-test-cache-")
        config.stash[_OWN_CACHE] = os.environ["GRADLOOP_CACHE_DIR"]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_CACHE, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)
        del os.environ["GRADLOOP_CACHE_DIR"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--graph-runner",
        default="executor",
        choices=("executor", "frames", "interpreter"),
        help="what runs graph functions: the frame executor (loops fused or as frames) or the "
        "reference interpreter",
    )


@pytest.fixture(autouse=True, scope="session")
def graph_runner(request: pytest.FixtureRequest) -> str:
    runner = request.config.getoption("--graph-runner")
    gl._core.set_graph_runner(runner)
    # Every compiled frame a test runs is checked against its register program, bit for bit.
    gl._core.set_compiled_frames("check")
    yield runner
    gl._core.set_graph_runner("executor")
    gl._core.set_compiled_frames("on")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The longest tests first, the rest in their order: pytest-xdist hands tests out in order,
    # and a long one handed out last keeps one process busy while the others have finished.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # A module may define `failure_diagnostics(item) -> str`: what it returns joins the report
    # of a test that failed (say, what Ray's logs say about workers that died).
    outcome = yield
    report = outcome.get_result()
    diagnose = getattr(getattr(item, "module", None), "failure_diagnostics", None)
    if report.when == "call" and report.failed and diagnose is not None:
        report.sections.append(("diagnostics", diagnose(item)))


@pytest.fixture(scope="module")
def ray_alone(request: pytest.FixtureRequest) -> None:
    """For the module fixtures that start Ray. Two Ray instances on one machine see each other
    and cancel each other's actors, so the Ray modules share one test process (`--dist
    loadgroup`). pytest-xdist marks a grouped test by renaming its node id; where a pytest
    release breaks that, fail with the reason rather than let the modules run side by side."""
    if not getattr(request.config.option, "loadgroup", False):
        return
    for item in request.session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            pytest.fail(
                f"pytest-xdist's --dist loadgroup did not group {item.nodeid} (pytest "
                f"{pytest.__version__}): install the pytest that requirements-dev.txt names",
                pytrace=False,
            )
