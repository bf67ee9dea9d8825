"""Every file the README and `docs/` name exists: a pointer to a file that moved or was removed
sends the reader nowhere."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benches" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Where a path the docs give relative to a source root is looked for.
SOURCE_ROOTS = ["", "rust/core/src/", "rust/python/src/", "rust/core/", "py/gradloop/"]
#: Where a bare file name (the docs name a file of the module they describe) is looked for.
TREES = ["rust", "py", "tests", "benches", "tools", "docs", "examples"]
NAMED = re.compile(r"`([A-Za-z0-9_./-]+\.(?:rs|py|md|toml|sh|txt|json|mlir))(?:::[\w:]+)?`")


def named_files(doc: pathlib.Path) -> list[str]:
    return sorted(set(NAMED.findall(doc.read_text())))


def exists(name: str) -> bool:
    if any((ROOT / root / name).exists() for root in SOURCE_ROOTS):
        return True
    # a bare name, or a path within the module a section describes (`native/emit.rs`)
    found = ((ROOT / tree).rglob(pathlib.Path(name).name) for tree in TREES)
    return any(path.as_posix().endswith("/" + name) for paths in found for path in paths)


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if named_files(d)], ids=lambda d: str(d.relative_to(ROOT))
)
def test_every_file_a_doc_names_exists(doc: pathlib.Path) -> None:
    missing = [name for name in named_files(doc) if not exists(name)]
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def test_the_pattern_still_finds_the_pointers() -> None:
    # The contributors' pages point into the tree throughout: if none matched, the pattern broke.
    for page in ("architecture.md", "executor.md", "notes.md"):
        assert len(named_files(ROOT / "docs" / page)) > 10, page


LINK = re.compile(r"\]\((?!https?:|#)([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(doc: pathlib.Path) -> None:
    prose = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    links = LINK.findall(re.sub(r"`[^`]*`", "", prose))
    broken = [link for link in links if not (doc.parent / link).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_a_missing_file_is_caught() -> None:
    assert exists("rust/core/src/ops/pack.rs") and exists("schedule.rs")
    assert not exists("rust/core/src/ops/no_such_op.rs") and not exists("no_such_file.py")
