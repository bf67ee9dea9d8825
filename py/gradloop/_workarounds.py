"""IREE's bugs that gradloop works around, one entry each: what IREE does wrong, where it is
reported upstream, the knob gradloop turns, the test that needs it (`reproducer`) and the test
that fails once IREE fixes it (`canary`, in `tests/test_iree_canaries.py` unless it names
another file). Each is a debt: when its canary fails, retire the workaround (or, for a form,
its alternative) and the entry.

The forms `gl.jit` tries (`_iree_build.forms_for`) are generated from the entries with `choices`:
each such entry is one dimension of the form, its choices in the order tried.
`docs/notes.md` ("IREE workarounds: what was tried") tells how each came to be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["WORKAROUNDS", "Workaround", "choices"]


@dataclass(frozen=True)
class Workaround:
    name: str
    #: What IREE 3.13 does wrong.
    bug: str
    #: What gradloop does about it (a form, a flag, an emission, a repair of the VM IR).
    knob: str
    #: The test whose program needs the workaround.
    reproducer: str
    #: The test that asserts the bug is still there (`path::test`), or None ...
    canary: str | None
    #: ... and then why there is none.
    no_canary: str | None = None
    #: IREE's issue, where one is filed.
    upstream: str | None = None
    #: For a dimension of the compile forms: its choices, in the order tried.
    choices: tuple[Any, ...] = ()


_CANARIES = "tests/test_iree_canaries.py::"
_AGREEMENT = "tests/test_mode_agreement.py::"

WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        name="list_stacks",
        bug="a tensor pushed onto a `!util.list` leaves IREE's tracking of its producer; on an "
        "asynchronous device a later pop reads a buffer not yet allocated ('transient buffer "
        "has not been committed' on local-task, 'has no staged Vulkan backing' on Vulkan)",
        knob="form: stacks as lists (O(1) per push) only on `local-sync`, else growable buffers",
        reproducer="tests/test_compiled.py::test_exported_loop_gradient_runs_on_an_asynchronous_"
        "device",
        canary=_CANARIES + "test_canary_list_stacks_fail_on_an_asynchronous_device",
        choices=(True, False),
    ),
    Workaround(
        name="yield_barriers",
        bug="a branch's results packed into one transient buffer that the other branch "
        "allocates apart: wrong numbers, with no error, for branch-heavy second derivatives",
        knob="form: results a branch yields through `stablehlo.optimization_barrier`s (every "
        "one, repeated ones, repeated ones and constants, none)",
        reproducer=_AGREEMENT
        + "test_fuzz_found_nested_switches_second_order_without_yield_barriers_miscompiled",
        canary=None,
        no_canary="none left: with the VM repairs the three reproducers run right in every "
        "choice (what miscompiled them was probably the encoder's bug); retiring the barriers "
        "waits for `make fuzz` to run clean without them",
        choices=("all", "repeats", "constants", "none"),
    ),
    Workaround(
        name="scf_to_cf",
        bug="IREE's stream passes reject some verified modules with nested `scf` regions "
        "('operand #N does not dominate this use', 'maximum iteration count exceeded')",
        knob="form: the module as emitted, then with `scf` lowered to `cf` (`_iree_build.to_cf`)",
        reproducer=_AGREEMENT + "test_class6_gradient_of_cond_while_cond_nesting_compiles",
        canary=_CANARIES + "test_canary_nested_regions_are_refused_as_scf",
        choices=(False, True),
    ),
    Workaround(
        name="no_multi_use_fusion",
        bug="'linalg.generic op write affecting operations on global resources are restricted "
        "to workgroup distributed contexts' for a second-order gradient without control flow",
        knob="flags: `--iree-dispatch-creation-fuse-multi-use=false`, last",
        reproducer=_AGREEMENT + "test_fuzz_found_a_module_that_compiles_only_without_multi_use_"
        "fusion",
        canary=_CANARIES + "test_canary_multi_use_fusion_refuses_a_second_order_gradient",
        choices=((), ("--iree-dispatch-creation-fuse-multi-use=false",)),
    ),
    Workaround(
        name="separate_repeated_refs",
        bug="the VM bytecode encoder moves a reference into a block argument at its last use, "
        "so a buffer passed twice on one branch arrives null the second time ('ref is null', "
        "'indirect buffer reference slot 0 is out range')",
        knob="VM repair (`_vm_repair.separate_repeated_refs`): the repeat is a copy",
        reproducer=_AGREEMENT + "test_fuzz_found_a_switch_passing_one_buffer_twice",
        canary=_CANARIES + "test_canary_a_buffer_passed_twice_arrives_null",
        upstream="https://github.com/iree-org/iree/issues/24753",
    ),
    Workaround(
        name="widen_mixed_block_arguments",
        bug="the VM bytecode encoder orders a branch's register moves by register identity, "
        "not by the words a 64-bit value covers, and overwrites a 32-bit value before moving it",
        knob="VM repair (`_vm_repair.widen_mixed_block_arguments`): 4-byte block arguments "
        "beside 8-byte ones widened to i64",
        reproducer=_AGREEMENT + "test_fuzz_found_a_predicate_overwritten_by_a_64_bit_move",
        canary="tests/test_vm_repair.py::test_the_repair_leaves_no_branch_that_overwrites_a_"
        "value_before_moving_it",
    ),
    Workaround(
        name="scalars_64_bit",
        bug="the same register-move ordering bug, for the scalars control flow carries: an "
        "f32/i32/i1 beside an f64/i64 read back as the other's bits",
        knob="emission: every carried scalar 64 bits wide (`mlir/scalar.rs`)",
        reproducer=_AGREEMENT + "test_fuzz_found_a_loop_hessian_that_failed_in_every_form",
        canary="tests/test_vm_repair.py::test_the_repair_leaves_no_branch_that_overwrites_a_"
        "value_before_moving_it",
    ),
    Workaround(
        name="distinct_inits",
        bug="a tensor that starts two loop variables is one buffer passed twice on the loop's "
        "entry branch (the encoder bug of `separate_repeated_refs`)",
        knob="emission: the second through an optimization barrier (`distinct_inits` in "
        "`mlir/regions.rs`)",
        reproducer=_AGREEMENT + "test_class4_loop_variables_whose_incoming_value_is_never_read",
        canary=_CANARIES + "test_canary_a_buffer_passed_twice_arrives_null",
        upstream="https://github.com/iree-org/iree/issues/24753",
    ),
    Workaround(
        name="bool_convert_as_select",
        bug="an i1 -> float convert fused into a consuming product fails to verify "
        "(\"'linalg.vecmat' op expected type of bb argument #0 ('i1')\")",
        knob="emission: `select(x, 1, 0)` (`Emitter::convert`)",
        reproducer=_AGREEMENT + "test_class7_a_cast_comparison_feeding_a_matmul_compiles",
        canary=_CANARIES + "test_canary_a_bool_convert_fused_into_a_product_fails_to_verify",
    ),
    Workaround(
        name="bool_scalar_through_i64",
        bug="`tensor.from_elements %b : tensor<i1>` is refused once IREE stores bools as i8",
        knob="emission: a bool scalar into a tensor through an i64 tensor and a compare "
        "(`tensor_input`)",
        reproducer=_AGREEMENT + "test_class5_scalar_booleans_through_cond_switch_and_while",
        canary=_CANARIES + "test_canary_a_bool_scalar_into_a_tensor_is_refused",
    ),
    Workaround(
        name="pow_of_negative_bases",
        bug="`stablehlo.power` with a non-constant exponent lowers to exp(b log a): NaN for "
        "every negative base",
        knob="emission: `power(|a|, b)` with the sign and special cases fixed (`emit_pow`)",
        reproducer=_AGREEMENT + "test_class3_integer_powers_of_negative_bases_in_control_flow",
        canary=_CANARIES + "test_canary_powers_of_negative_bases_are_nan",
    ),
    Workaround(
        name="stack_add_without_branches",
        bug="with stacks as lists, a `scf.for` whose rows are `scf.if` (read or zeros) returned "
        "wrong numbers, with no error, in its `scf` form",
        knob="emission: the stack sum as three loops without a branch inside (`stack_add`)",
        reproducer="tests/test_higher_order_loops.py::test_third_order_runs_right_in_every_"
        "form_iree_compiles",
        canary=None,
        no_canary="the emission with a branch per row is gone from the emitter, and no module "
        "written by hand with it has been made to reproduce the wrong numbers yet",
    ),
    Workaround(
        name="vulkan_push_constants",
        bug="Vulkan refuses to load a dispatch of an unrolled loop gradient whose push "
        "constants (152 bytes) exceed Mesa's limit of 128",
        knob="load: a form that does not load gives way to the next (`_Compiled._load`), "
        "one without unrolled loops",
        reproducer="tests/test_compiled_targets.py::test_vulkan_agrees_with_eager_mode",
        canary=_CANARIES + "test_canary_an_unrolled_loop_gradient_does_not_load_on_vulkan",
    ),
    Workaround(
        name="vulkan_idle_device_spins",
        bug="a Vulkan device on Mesa's software Vulkan (lavapipe 22.3) keeps two threads "
        "polling its semaphores at full speed for as long as it lives, idle or not",
        knob="runtime: a Vulkan device is released once no loaded function uses it "
        "(`_runtime.RELEASED_WHEN_UNUSED`)",
        reproducer="tests/test_compiled_targets.py::"
        "test_a_vulkan_device_no_function_uses_is_released",
        canary=_CANARIES + "test_canary_an_idle_vulkan_device_keeps_two_cores_busy",
    ),
    Workaround(
        name="dylib_placeholder_leak",
        bug="loading a module's system shared library leaves open (and on disk) the file whose "
        "name the loader reserved with `mkstemp`: one descriptor per load, until a process at "
        "1,024 open files cannot load another module",
        knob="runtime: the placeholders closed and removed after each load "
        "(`_runtime.close_leaked_dylib_placeholders`)",
        reproducer="tests/test_compiled.py::test_loading_many_modules_leaves_no_open_file_behind",
        canary=_CANARIES + "test_canary_loading_a_system_library_leaves_its_placeholder_open",
    ),
    Workaround(
        name="multi_dim_from_elements",
        bug="`tensor.from_elements` into a tensor of rank 2 or more, or one of rank 1 reshaped "
        "or broadcast into one: wrong numbers with no error (a 2x1 gets its last element "
        "twice) or a failed compile ('stream.async.fill' op has invalid Write access range, 2x2)",
        knob="emission: small tensors held as host scalars are rebuilt as a 1-D "
        "`from_elements` through a `stablehlo.optimization_barrier`, then reshaped "
        "(`Lowering::build_from_elements`)",
        reproducer="tests/test_compiled.py::test_small_matrices_held_as_host_scalars_agree_with_eager",
        canary=_CANARIES + "test_canary_a_tensor_built_from_elements_as_a_column_is_wrong",
    ),
    Workaround(
        name="multi_axis_sums",
        bug="a `stablehlo.reduce` (add) over two or more axes of a product with a broadcast "
        "operand (`sum(m * w)`, m 4x5, w 5) becomes a `vector.contract` that fails to verify "
        "('invalid accumulator/result vector shape')",
        knob="emission: a sum over several static axes moves them last and merges them into "
        "one first (`reduce::collapsed_sum`)",
        reproducer="tests/test_array_functions.py::test_sums_of_broadcast_products_over_several_"
        "axes_compile",
        canary=_CANARIES + "test_canary_a_sum_of_a_broadcast_product_over_two_axes_fails",
    ),
    Workaround(
        name="scf_host_scalar_loops",
        bug="the third derivative of a loop over 2-vectors held as host scalars, its loops "
        "rolled, returns wrong numbers (no error) compiled as `scf`; the same module lowered "
        "to `cf` first is right",
        knob="form: each form as `scf`, then as `cf`; the first call of a signature is checked "
        "against the interpreter and a form with other results gives way to the next",
        reproducer="tests/test_compiled.py::test_a_form_that_returns_wrong_numbers_gives_way_to_"
        "the_next",
        canary=_CANARIES + "test_canary_a_third_order_gradient_on_host_scalars_is_wrong_as_scf",
    ),
)

_BY_NAME = {w.name: w for w in WORKAROUNDS}


def choices(name: str) -> tuple[Any, ...]:
    """The choices of the form dimension `name`, in the order tried."""
    return _BY_NAME[name].choices
