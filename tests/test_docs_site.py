"""`make docs`: the documentation site builds in strict mode (a broken link, a page left out of
the navigation or a docstring that does not parse fails it), and its API reference documents
every public name of `gradloop` (the ops' docstrings come from the extension's stub)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import gradloop as gl

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs", reason="the site is built with MkDocs (requirements-dev.txt)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = pathlib.Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_without_warnings(site: pathlib.Path) -> None:
    assert (site / "index.html").exists()
    for page in ("getting-started", "guides/while_loop", "modes/jit", "api"):
        assert (site / page / "index.html").exists(), page


def test_every_page_is_in_the_navigation() -> None:
    listed = set(re.findall(r":\s*([\w/-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - listed == set(), "pages the site's navigation leaves out"
    assert listed - pages == set(), "the navigation names pages that do not exist"


def test_the_api_reference_documents_the_public_names(site: pathlib.Path) -> None:
    html = (site / "api" / "index.html").read_text()
    documented = set(re.findall(r'id="gradloop\.(\w+)"', html))
    undocumented = [name for name in gl.__all__ if name not in documented]
    # `gradloop.function` is also a submodule's name, which the reference documents instead.
    assert undocumented == ["function"], undocumented
