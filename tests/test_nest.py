"""gradloop.nest: flattening, packing and comparing nested tuples/lists/namedtuples/dicts."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradloop import errors, nest

Point = namedtuple("Point", ["x", "y"])


def test_flatten_orders_dict_keys_sorted_depth_first() -> None:
    s = (1, {"b": 3, "a": [2, (4,)]}, Point(5, 6))
    assert nest.flatten(s) == [1, 2, 4, 3, 5, 6]


def test_leaves_include_none_and_scalars() -> None:
    assert nest.flatten(None) == [None]
    assert nest.flatten(7) == [7]
    assert nest.flatten([]) == []
    assert nest.flatten({"a": None}) == [None]


def test_pack_sequence_as_rebuilds_types_and_key_order() -> None:
    s = {"z": 0, "a": (0, Point(0, 0)), "m": [0]}
    packed = nest.pack_sequence_as(s, [1, 2, 3, 4, 5])
    assert list(packed) == ["z", "a", "m"]  # insertion order kept
    assert packed == {"a": (1, Point(2, 3)), "m": [4], "z": 5}
    assert isinstance(packed["a"][1], Point)
    od = nest.unflatten(OrderedDict(b=0, a=0), [1, 2])
    assert isinstance(od, OrderedDict) and list(od.items()) == [("b", 2), ("a", 1)]


def test_pack_sequence_as_counts_leaves() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="3 leaves but 2 values"):
        nest.pack_sequence_as((0, [0, 0]), [1, 2])


def test_flatten_with_paths_names_positions() -> None:
    paths = [p for p, _ in nest.flatten_with_paths((0, {"b": 0, "a": Point(0, 0)}))]
    assert paths == ["[0]", "[1]['a'].x", "[1]['a'].y", "[1]['b']"]
    assert nest.path_str("") == "<root>"


def test_map_structure_applies_leafwise() -> None:
    out = nest.map_structure(lambda a, b: a + b, (1, {"k": 2}), (10, {"k": 20}))
    assert out == (11, {"k": 22})


def test_map_structure_requires_structures() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="at least one"):
        nest.map_structure(lambda: 0)


@pytest.mark.parametrize(
    ("a", "b", "where"),
    [
        ((0, {"a": 0, "b": 0}), (0, {"a": 0, "b": (0, 0)}), r"\[1\]\['b'\]"),
        ((0, {"a": 0}), (0, {"c": 0}), r"\[1\]"),
        ([0, 0], [0, 0, 0], "<root>"),
        ((0, [0]), (0, (0,)), r"\[1\]"),
        (Point(0, 0), (0, 0), "<root>"),
        ({"a": 0}, [0], "<root>"),
    ],
)
def test_assert_same_structure_names_the_path(a: object, b: object, where: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=f"differ at {where}"):
        nest.assert_same_structure(a, b)


def test_check_types_false_lets_sequences_differ_in_kind() -> None:
    nest.assert_same_structure((0, [1]), [0, (1,)], check_types=False)
    nest.assert_same_structure(Point(0, 0), [1, 2], check_types=False)
    with pytest.raises(errors.InvalidArgumentError, match="a dict"):
        nest.assert_same_structure({"a": 0}, [0], check_types=False)


def test_structure_difference_reports_both_sides() -> None:
    assert nest.structure_difference((0, 1), (0, 1)) is None
    path, left, right = nest.structure_difference((0, [1, 2]), (0, [1]))
    assert (path, left, right) == ("[1]", "a list of 2 items", "a list of 1 items")


def test_unsortable_dict_keys_are_rejected() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="sortable keys"):
        nest.flatten({1: 0, "a": 0})


def test_format_structure() -> None:
    text = nest.format_structure((1, [2], {"a": 3}, Point(4, 5), (6,)), str)
    assert text == "(1, [2], {'a': 3}, Point(x=4, y=5), (6,))"


def test_is_nested() -> None:
    assert nest.is_nested(()) and nest.is_nested([]) and nest.is_nested({})
    assert not nest.is_nested(None) and not nest.is_nested("ab")


leaves = st.integers()
structures = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), children, max_size=3),
        st.tuples(children, children).map(lambda t: Point(*t)),
    ),
    max_leaves=12,
)


@given(structures)
def test_flatten_then_pack_round_trips(s: object) -> None:
    flat = nest.flatten(s)
    assert nest.pack_sequence_as(s, flat) == s
    nest.assert_same_structure(s, nest.map_structure(lambda v: v + 1, s))
    assert nest.flatten(nest.map_structure(lambda v: -v, s)) == [-v for v in flat]
