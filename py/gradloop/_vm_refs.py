"""A repair of IREE 3.13's VM IR before it is serialized: a branch that passes one reference
(a buffer, a fence) as two of its successor's operands gets a separate copy for each repeat.

Why: IREE's bytecode encoder moves a reference into a block argument at its last use; passed
twice in one branch, the first operand moves it and the second gets null. The module then fails
as it runs ("ref is null" in `hal.buffer.subspan`, "indirect buffer reference slot 0 is out
range of the declared binding capacity" in `hal.command_buffer.copy_buffer`), typically on the
entry branch of a loop whose two carried tensors IREE packed into one allocation. The copy is
a call to an identity function that is never inlined, so no folding brings the repeat back
(docs/architecture.md, "IREE workarounds").
"""

from __future__ import annotations

import re
from functools import partial

__all__ = ["separate_repeated_refs"]

#: One successor of `vm.br` / `vm.cond_br` with operands: `^bb3(%a, %b : T, U)`.
_SUCCESSOR = re.compile(r"(\^bb\d+)\(([^()]*?) : ([^()]*)\)")


def _split_types(text: str) -> list[str]:
    """`T, U<a, b>, V` split at the commas outside angle brackets."""
    types, depth, current = [], 0, []
    for ch in text:
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            types.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    types.append("".join(current).strip())
    return types


class _Copies:
    """The copies made so far and the identity function of each reference type."""

    def __init__(self) -> None:
        self.count = 0
        self.functions: dict[str, str] = {}

    def successor(self, m: re.Match[str], indent: str, calls: list[str]) -> str:
        """One successor with its repeated references replaced by copies made in `calls`."""
        operands = [o.strip() for o in m.group(2).split(",")]
        types = _split_types(m.group(3))
        if len(operands) != len(types):
            return m.group(0)
        seen: set[str] = set()
        for k, (operand, ty) in enumerate(zip(operands, types, strict=True)):
            if not ty.startswith("!vm.ref"):
                continue
            if operand in seen:
                self.count += 1
                fn = self.functions.setdefault(ty, f"@__gradloop_ref_copy_{len(self.functions)}")
                name = f"%__gradloop_ref_copy{self.count}"
                calls.append(f"{indent}{name} = vm.call {fn}({operand}) : ({ty}) -> {ty}")
                operands[k] = name
            seen.add(operand)
        return f"{m.group(1)}({', '.join(operands)} : {m.group(3)})"


def separate_repeated_refs(vm: str) -> tuple[str, int]:
    """`vm` (a `vm.module` as text) with each repeated reference operand of a branch's
    successor replaced by a copy, and how many copies were made."""
    copies = _Copies()
    out: list[str] = []
    for line in vm.split("\n"):
        body = line.lstrip()
        if body.startswith(("vm.br ", "vm.cond_br ")):
            indent = line[: len(line) - len(body)]
            calls: list[str] = []
            line = _SUCCESSOR.sub(partial(copies.successor, indent=indent, calls=calls), line)
            out.extend(calls)
        out.append(line)
    if not copies.functions:
        return vm, 0
    functions = "".join(
        f"    vm.func private {fn}(%ref: {ty}) -> {ty} attributes "
        f"{{inlining_policy = #util.inline.never}} {{\n      vm.return %ref : {ty}\n    }}\n"
        for ty, fn in copies.functions.items()
    )
    text, found = re.subn(
        r"(\n\s*vm\.module [^\n]*\{\n)", lambda m: m.group(1) + functions, "\n".join(out), count=1
    )
    return (text, copies.count) if found else (vm, 0)
