"""The VM IR repair (`gradloop._vm_refs`): a branch that passes one reference twice gets a copy
for the repeat, which IREE 3.13's bytecode would otherwise move out, leaving null."""

from __future__ import annotations

from gradloop._vm_refs import separate_repeated_refs

B, F = "!vm.ref<!hal.buffer>", "!vm.ref<!hal.fence>"
BB2 = f"^bb2(%0, %0, %f, %f : {B}, {B}, {F}, {F})"
# A branch's operand list and types are printed on the branch's one line, however long.
MODULE = f"""module {{
  vm.module public @module {{
    vm.func private @f(%arg0: {B}, %arg1: i64) {{
      vm.br ^bb1(%arg0, %arg1, %arg0, %arg1 : {B}, i64, {B}, i64)
    ^bb1(%0: {B}, %1: i64, %2: {B}, %3: i64):
      vm.cond_br %c, ^bb1(%0, %1, %2, %3 : {B}, i64, {B}, i64), {BB2}
    ^bb2(%4: {B}, %5: {B}, %6: {F}, %7: {F}):
      vm.return
    }}
  }}
}}"""


def test_a_repeated_reference_in_a_branch_gets_a_copy() -> None:
    text, copies = separate_repeated_refs(MODULE)
    assert copies == 3
    lines = [line.strip() for line in text.splitlines()]
    # one identity function per reference type, never inlined
    buffer_copy = "@__gradloop_ref_copy_0"
    fence_copy = "@__gradloop_ref_copy_1"
    assert (
        f"vm.func private {buffer_copy}(%ref: !vm.ref<!hal.buffer>) -> !vm.ref<!hal.buffer> "
        "attributes {inlining_policy = #util.inline.never} {" in lines
    )
    assert any(
        line.startswith(f"vm.func private {fence_copy}(%ref: !vm.ref<!hal.fence>)")
        for line in lines
    )
    entry = lines.index(
        "vm.br ^bb1(%arg0, %arg1, %__gradloop_ref_copy1, %arg1 : "
        "!vm.ref<!hal.buffer>, i64, !vm.ref<!hal.buffer>, i64)"
    )
    assert lines[entry - 1] == (
        f"%__gradloop_ref_copy1 = vm.call {buffer_copy}(%arg0) : "
        "(!vm.ref<!hal.buffer>) -> !vm.ref<!hal.buffer>"
    )
    # distinct references and repeated integers stay; each successor is repaired on its own
    branch = next(line for line in lines if line.startswith("vm.cond_br"))
    assert "^bb1(%0, %1, %2, %3 : " in branch
    assert "^bb2(%0, %__gradloop_ref_copy2, %f, %__gradloop_ref_copy3 : " in branch
    assert lines.index(branch) > lines.index(next(x for x in lines if "copy3 = vm.call" in x))


def test_a_module_without_repeats_is_unchanged() -> None:
    plain = MODULE.replace("^bb1(%arg0, %arg1, %arg0,", "^bb1(%arg0, %arg1, %x,").replace(
        "^bb2(%0, %0, %f, %f :", "^bb2(%0, %2, %f, %g :"
    )
    assert separate_repeated_refs(plain) == (plain, 0)
