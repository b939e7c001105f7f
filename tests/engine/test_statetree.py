"""The incremental state's pieces (sidecar/engine/statetree.py): the key forms keep Python's
order, a section's root depends on its entries only (not on the order they came in, nor on
what came and went), and a TrackedDict marks every write and, for mutable records, every
read."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.sidecar.engine.statetree import (
    EMPTY_SECTION_ROOT,
    SectionTree,
    TrackedDict,
    key_bytes,
    leaf_hash,
    section_root,
)

texts = st.text(max_size=6)  # NULs and non-ASCII included
keys = st.one_of(
    texts,
    st.binary(max_size=6),
    st.lists(texts, min_size=1, max_size=3).map(tuple),
)


@given(st.lists(texts, min_size=2, max_size=8))
def test_string_key_forms_sort_as_the_strings(values: list[str]) -> None:
    assert sorted(values, key=key_bytes) == sorted(values)


@given(st.lists(st.binary(max_size=6), min_size=2, max_size=8))
def test_bytes_key_forms_sort_as_the_bytes(values: list[bytes]) -> None:
    assert sorted(values, key=key_bytes) == sorted(values)


@given(st.lists(st.lists(texts, min_size=1, max_size=4).map(tuple), min_size=2, max_size=8))
def test_tuple_key_forms_sort_as_the_tuples(values: list[tuple[str, ...]]) -> None:
    assert sorted(values, key=key_bytes) == sorted(values)


@given(keys, keys)
def test_distinct_keys_have_distinct_forms(a: object, b: object) -> None:
    if type(a) is type(b) and a != b:
        assert key_bytes(a) != key_bytes(b)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(
    st.dictionaries(st.binary(min_size=1, max_size=8), st.binary(max_size=16), max_size=40),
    st.randoms(use_true_random=False),
)
def test_a_section_root_depends_on_its_entries_only(
    entries: dict[bytes, bytes], rnd: object
) -> None:
    items = list(entries.items())
    expected = section_root(3, items)
    shuffled = items[:]
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    tree = SectionTree()
    # with an entry that comes and goes, and a value later overwritten
    tree.put(b"\xff" * 9, leaf_hash(3, b"\xff" * 9, b"gone"))
    for key, data in shuffled:
        tree.put(key, leaf_hash(3, key, b"old" + data))
    tree.root()  # a root taken half way does not stick
    for key, data in shuffled:
        tree.put(key, leaf_hash(3, key, data))
    tree.remove(b"\xff" * 9)
    assert tree.root() == expected
    assert len(tree) == len(entries)
    if entries:
        assert expected != EMPTY_SECTION_ROOT
        key = items[0][0]
        tree.remove(key)
        assert tree.root() == section_root(3, items[1:])


def test_a_leaf_binds_its_section_and_key_not_only_its_bytes() -> None:
    assert leaf_hash(1, b"k", b"v") != leaf_hash(2, b"k", b"v")
    assert leaf_hash(1, b"k", b"v") != leaf_hash(1, b"j", b"v")
    # the key's length is framed: moving a byte from the key to the data changes the leaf
    assert leaf_hash(1, b"ab", b"c") != leaf_hash(1, b"a", b"bc")


def test_a_tracked_dict_marks_every_write() -> None:
    table: TrackedDict[str, int] = TrackedDict({"a": 1})
    assert table.take_dirty() == {"a"}  # what it was built with
    table["b"] = 2
    del table["a"]
    table.pop("zz", None)
    table.setdefault("c", 3)
    table.update({"d": 4})
    table |= {"e": 5}
    assert table.take_dirty() == {"a", "b", "c", "d", "e", "zz"}
    _ = table["b"], table.get("c"), list(table.values()), list(table.items())
    assert table.take_dirty() == set()  # reads of immutable values mark nothing
    table.clear()
    assert table.take_dirty() == {"b", "c", "d", "e"}


def test_a_tracked_dict_of_mutable_records_marks_reads_too() -> None:
    table: TrackedDict[str, list[int]] = TrackedDict({"a": [1], "b": [2]}, reads_mark=True)
    table.take_dirty()
    table["a"].append(9)
    assert table.get("missing") is None
    assert table.take_dirty() == {"a"}
    for value in table.values():
        value.append(0)
    assert table.take_dirty() == {"a", "b"}
    copy = pickle.loads(pickle.dumps(table))
    assert isinstance(copy, TrackedDict) and copy.reads_mark and copy == table
