"""`--graph-runner`: what runs `@gl.function` graphs in this session, the frame executor (the
default) or the reference interpreter. `make test` runs the graph-mode suites on both."""

from __future__ import annotations

import pytest

import gradloop as gl


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--graph-runner",
        default="executor",
        choices=("executor", "interpreter"),
        help="what runs graph functions: the frame executor or the reference interpreter",
    )


@pytest.fixture(autouse=True, scope="session")
def graph_runner(request: pytest.FixtureRequest) -> str:
    runner = request.config.getoption("--graph-runner")
    gl._core.set_graph_runner(runner)
    yield runner
    gl._core.set_graph_runner("executor")
