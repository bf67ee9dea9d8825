"""Every file the README and `docs/` name exists: a pointer to a file that moved or was removed
sends the reader nowhere."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benches" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_file_a_doc_names_exists(doc: pathlib.Path) -> None:
    names = named_files(doc)
    assert names, f"{doc} names no file: the pattern no longer matches its pointers"
    missing = [name for name in names if not exists(name)]
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def test_a_missing_file_is_caught() -> None:
    assert exists("rust/core/src/ops/pack.rs") and exists("schedule.rs")
    assert not exists("rust/core/src/ops/no_such_op.rs") and not exists("no_such_file.py")
