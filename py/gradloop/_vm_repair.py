"""Repairs of IREE 3.13's VM IR before it is serialized to bytecode: two bugs in how its bytecode
encoder moves values into a block's arguments, each of which made some modules fail as they ran
or, worse, return wrong numbers (`_workarounds`: `separate_repeated_refs`,
`widen_mixed_block_arguments`).

1. **A reference passed twice in one branch** (`separate_repeated_refs`). The encoder moves a
   reference into a block argument at its last use; passed twice, the first operand moves it and
   the second gets null ("ref is null" in `hal.buffer.subspan`, "indirect buffer reference slot
   0 is out range" in `hal.command_buffer.copy_buffer`), typically on the entry branch of a loop
   whose two carried tensors IREE packed into one allocation. The repeat gets a copy: a call to
   an identity function that is never inlined, so no folding brings it back.
2. **4-byte and 8-byte values moved by one branch** (`widen_mixed_block_arguments`). i32/f32 take
   one slot of the VM's integer registers and i64/f64 two; the encoder orders a branch's moves
   so that none overwrites a source still to be read, but compares registers by identity, not
   by the slots they cover: moving an i64 into slots 52-53 before the i32 in slot 52 has moved
   out overwrites it. A branch-recorded predicate read back as 0 and a gradient came back
   silently wrong. Each block whose arguments mix the two widths gets its 4-byte arguments
   widened to i64 (extended before each branch to it, truncated at its top), so that every move
   into it covers whole pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

__all__ = ["repair", "separate_repeated_refs", "widen_mixed_block_arguments"]

#: One successor of `vm.br` / `vm.cond_br` with operands: `^bb3(%a, %b : T, U)`.
_SUCCESSOR = re.compile(r"(\^bb\d+)\(([^()]*?) : ([^()]*)\)")
#: The start of a block header with arguments: `^bb3(%a: T, %b: U):  // preds ...`.
_BLOCK_START = re.compile(r"^(\s*)(\^bb\d+)\(")
#: A block named anywhere in a line.
_LABEL = re.compile(r"\^bb\d+")
#: The start of a function-like op, whose region's block labels are its own.
_FUNCTION = re.compile(r"^\s*vm\.(func|initializer)\b")

_NARROW = ("i32", "f32")
_WIDE = ("i64", "f64")


def repair(vm: str) -> str:
    """`vm` (a `vm.module` as text) with both repairs applied."""
    text, _ = separate_repeated_refs(vm)
    text, _ = widen_mixed_block_arguments(text)
    return text


def _split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets and quoted strings (types such as
    `!vm.ref<...>`, locations such as `loc(fused[callsite("f.py":1:0 at ...)])`)."""
    parts, depth, quoted, current = [], 0, False, []
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted:
            depth += {"<": 1, "(": 1, "[": 1, "{": 1, ">": -1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.append("".join(current).strip())
                current = []
                continue
        current.append(ch)
    parts.append("".join(current).strip())
    return parts


def _code(line: str) -> str:
    """`line` without its `//` comment (block headers list their predecessors in one)."""
    quoted = False
    for k, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif not quoted and line.startswith("//", k):
            return line[:k]
    return line


def _header(line: str) -> tuple[str, str, list[tuple[str, str, str]], str] | None:
    """A block header with arguments as (indent, label, [(name, type, location)], rest), or
    None. Arguments print as `%name: type` with an optional ` loc(...)`."""
    m = _BLOCK_START.match(line)
    if m is None:
        return None
    depth, quoted, end = 1, False, None
    for k in range(m.end(), len(line)):
        ch = line[k]
        if ch == '"':
            quoted = not quoted
        elif not quoted:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                end = k
                break
    if end is None or not line.startswith(":", end + 1):
        return None
    args = []
    for arg in _split_top_level(line[m.end() : end]):
        name, _, typed = arg.partition(":")
        ty, _, loc = typed.strip().partition(" loc(")
        args.append((name.strip(), ty.strip(), f" loc({loc}" if loc else ""))
    return m.group(1), m.group(2), args, line[end + 1 :]


def _branches(line: str) -> bool:
    return line.lstrip().startswith(("vm.br ", "vm.cond_br "))


class _Copies:
    """The copies made so far and the identity function of each reference type."""

    def __init__(self) -> None:
        self.count = 0
        self.functions: dict[str, str] = {}

    def successor(self, m: re.Match[str], indent: str, calls: list[str]) -> str:
        """One successor with its repeated references replaced by copies made in `calls`."""
        operands = [o.strip() for o in m.group(2).split(",")]
        types = _split_top_level(m.group(3))
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
        if _branches(line):
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


@dataclass
class _Block:
    """A block whose 4-byte arguments (positions and types) are to be widened."""

    narrow: dict[int, str]
    #: False when something other than a branch with operands names the block (a yieldable
    #: call's resumption, a branch table): its arguments are left as they are.
    rewritable: bool = True


def _mixed_blocks(lines: list[str]) -> dict[tuple[int, str], _Block]:
    """The blocks, keyed by (function, label), whose arguments mix 4- and 8-byte values."""
    blocks: dict[tuple[int, str], _Block] = {}
    scope = 0
    for line in lines:
        scope += bool(_FUNCTION.match(line))
        header = _header(line)
        if header is None:
            continue
        types = [ty for _, ty, _ in header[2]]
        narrow = {k: ty for k, ty in enumerate(types) if ty in _NARROW}
        if narrow and any(ty in _WIDE for ty in types):
            blocks[(scope, header[1])] = _Block(narrow)
    scope = 0
    for line in lines:
        scope += bool(_FUNCTION.match(line))
        if _header(line) is not None:
            continue
        code = _code(line)
        plain = _SUCCESSOR.sub("", code) if _branches(code) else code
        for label in _LABEL.findall(plain):
            if (scope, label) in blocks:
                blocks[(scope, label)].rewritable = False
    return {key: block for key, block in blocks.items() if block.rewritable}


class _Widener:
    """Widens the operands of branches to the blocks being widened."""

    def __init__(self, blocks: dict[tuple[int, str], _Block]) -> None:
        self.blocks = blocks
        self.count = 0

    def successor(self, m: re.Match[str], scope: int, indent: str, into: list[str]) -> str:
        """One successor with the operands its block widens extended by ops made in `into`."""
        block = self.blocks.get((scope, m.group(1)))
        if block is None:
            return m.group(0)
        operands = [o.strip() for o in m.group(2).split(",")]
        types = _split_top_level(m.group(3))
        for k, ty in block.narrow.items():
            self.count += 1
            wide = f"%__gradloop_widened{self.count}"
            into.extend(_widen(operands[k], wide, ty, indent, self.count))
            operands[k], types[k] = wide, "i64"
        return f"{m.group(1)}({', '.join(operands)} : {', '.join(types)})"


def widen_mixed_block_arguments(vm: str) -> tuple[str, int]:
    """`vm` with the 4-byte arguments of each block that also takes 8-byte ones widened to i64,
    and how many arguments were widened."""
    lines = vm.split("\n")
    blocks = _mixed_blocks(lines)
    if not blocks:
        return vm, 0
    widener = _Widener(blocks)
    out: list[str] = []
    scope = 0
    for line in lines:
        scope += bool(_FUNCTION.match(line))
        header = _header(line)
        if header is not None and (scope, header[1]) in blocks:
            indent, label, args, rest = header
            printed = [f"{name}: {ty}{loc}" for name, ty, loc in args]
            narrowing: list[str] = []
            for k, ty in blocks[(scope, label)].narrow.items():
                name, _, loc = args[k]
                wide = f"%__gradloop_wide_{name[1:]}"
                printed[k] = f"{wide}: i64{loc}"
                narrowing += _narrow(name, wide, ty, indent + "  ")
            out.append(f"{indent}{label}({', '.join(printed)}){rest}")
            out.extend(narrowing)
            continue
        if _branches(line):
            indent = line[: len(line) - len(line.lstrip())]
            widening: list[str] = []
            extend = partial(widener.successor, scope=scope, indent=indent, into=widening)
            line = _SUCCESSOR.sub(extend, line)
            out.extend(widening)
        out.append(line)
    return "\n".join(out), sum(len(b.narrow) for b in blocks.values())


def _widen(value: str, wide: str, ty: str, indent: str, n: int) -> list[str]:
    """Ops that extend the 4-byte `value` of type `ty` to the i64 `wide`."""
    if ty == "i32":
        return [f"{indent}{wide} = vm.ext.i32.i64.u {value} : i32 -> i64"]
    bits = f"%__gradloop_bits{n}"
    return [
        f"{indent}{bits} = vm.bitcast.f32.i32 {value} : f32 -> i32",
        f"{indent}{wide} = vm.ext.i32.i64.u {bits} : i32 -> i64",
    ]


def _narrow(name: str, wide: str, ty: str, indent: str) -> list[str]:
    """Ops that give the block argument `name` back its 4-byte type `ty` from `wide`."""
    if ty == "i32":
        return [f"{indent}{name} = vm.trunc.i64.i32 {wide} : i64 -> i32"]
    bits = f"%__gradloop_bits_{name[1:]}"
    return [
        f"{indent}{bits} = vm.trunc.i64.i32 {wide} : i64 -> i32",
        f"{indent}{name} = vm.bitcast.i32.f32 {bits} : i32 -> f32",
    ]
