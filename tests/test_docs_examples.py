"""Every Python example in the README and `docs/` runs, as a reader would paste it: a page's
```python blocks run in order, in one namespace, in a scratch directory. A block followed by an
```output block must print exactly that (trailing spaces aside). A doc that shows code a reader
cannot run as it stands says so in its fence (```python notest): such blocks are listed here, so
that none hides.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)(?:[ \t]+(\w+))?[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(page: pathlib.Path) -> list[tuple[int, str, str | None]]:
    """`page`'s runnable Python blocks: (line, code, the output it must print or None)."""
    text = page.read_text()
    found: list[tuple[int, str, str | None]] = []
    for fence in FENCE.finditer(text):
        language, flag, body = fence.group(1), fence.group(2), fence.group(3)
        line = text.count("\n", 0, fence.start()) + 1
        if language == "output" and found and found[-1][2] is None:
            found[-1] = (found[-1][0], found[-1][1], body)
        elif language == "python" and flag != "notest":
            found.append((line, body, None))
    return found


def _strip(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@pytest.mark.parametrize(
    "page", [p for p in PAGES if blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_example_on_the_page_runs(page: pathlib.Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for line, code, output in blocks(page):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{page.relative_to(ROOT)}, the block at line {line}") from e
        if output is not None:
            assert _strip(printed.getvalue()) == _strip(output), (
                f"{page.relative_to(ROOT)}, the block at line {line} printed something else"
            )


def test_blocks_and_their_output_are_read(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\nprint(1 + 1)\n```\n\n```output\n2\n```\n\n"
        "```python notest\nundefined()\n```\n\n```bash\nls\n```\n\n```python\nx = 3\n```\n"
    )
    assert blocks(page) == [(3, "print(1 + 1)\n", "2\n"), (19, "x = 3\n", None)]


def test_notest_blocks_are_few() -> None:
    # Each is code that needs what a test machine lacks (a GPU, a cluster, a file of the
    # reader's): keep the list short and known.
    flagged = {
        str(page.relative_to(ROOT)): len(re.findall(r"^```python notest", page.read_text(), re.M))
        for page in PAGES
    }
    assert sum(flagged.values()) <= 3, {k: v for k, v in flagged.items() if v}
