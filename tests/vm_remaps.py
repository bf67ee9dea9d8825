"""Replays the register moves of IREE's bytecode branches, as its annotated output lists them
(`--iree-vm-bytecode-module-output-format=annotated-mlir-text`: `remap_registers = [["i20+21->
i52+53", "i52->i33"], ...]` per successor), to find a branch whose moves overwrite a value before
moving it out (`test_vm_repair.py`).

Registers are 4-byte words: `i52` is one, `i52+53` (an i64 or f64) two, `r7`/`R7` a reference
(`R`: moved rather than retained). A move into a register above every register the module's ops
use is into IREE's scratch space, which breaks a cycle of moves: a value that goes through it
counts as moved from where it came.
"""

from __future__ import annotations

import re

_REGISTER = re.compile(r"([iRr])(\d+)(?:\+(\d+))?")


def _words(register: str) -> list[tuple[str, int]]:
    m = _REGISTER.fullmatch(register)
    if m is None:
        raise ValueError(f"not a register: {register!r}")
    bank = "i" if m.group(1) == "i" else "r"
    first = int(m.group(2))
    last = int(m.group(3)) if m.group(3) else first
    return [(bank, k) for k in range(first, last + 1)]


def _misordered(moves: list[tuple[str, str]], top: dict[str, int]) -> bool:
    """Whether moving `moves` one after another leaves some destination without the value
    its source held before the branch."""
    held: dict[tuple[str, int], tuple[str, int]] = {}
    wanted: dict[tuple[tuple[str, int], ...], list[tuple[str, int]]] = {}
    via_scratch: dict[tuple[tuple[str, int], ...], list[tuple[str, int]]] = {}
    for src, dst in moves:
        source, destination = _words(src), _words(dst)
        origin = via_scratch.get(tuple(source), source)
        values = [held.get(w, w) for w in source]
        held.update(zip(destination, values, strict=True))
        if all(k > top[bank] for bank, k in destination):
            via_scratch[tuple(destination)] = origin
        else:
            wanted[tuple(destination)] = origin
    return any(
        [held.get(w, w) for w in destination] != origin for destination, origin in wanted.items()
    )


def misordered_branches(annotated: str) -> int:
    """How many branch successors of `annotated` move a value after overwriting it."""
    top = {"i": -1, "r": -1}
    used = re.findall(
        r"(?:operand_registers|result_registers|block_registers) = \[([^\]]*)\]", annotated
    )
    for registers in used:
        for register in re.findall(r'"([iRr]\d+(?:\+\d+)?)"', registers):
            for bank, k in _words(register):
                top[bank] = max(top[bank], k)
    count = 0
    for remaps in re.findall(r"remap_registers = \[(.*?)\]\}", annotated):
        for successor in re.findall(r"\[([^\[\]]*)\]", remaps):
            moves = re.findall(r'"([^"]+)->([^"]+)"', successor)
            count += bool(moves) and _misordered(moves, top)
    return count
