"""The canonical encoder (proto/canonical.py): exact bytes, and no value ever truncated."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumgate.proto.canonical import U32_MAX, U64_MAX, Encoder


def test_fields_have_their_documented_layout() -> None:
    data = bytes(
        Encoder(b"tag")
        .u8(7)
        .u32(0x01020304)
        .u64(U64_MAX)
        .i64(-2)
        .boolean(True)
        .boolean(False)
        .blob(b"ab")
        .text("é")
        .optional_blob(None)
        .optional_blob(b"")
        .u64s([1, 2])
    )
    assert data == (
        b"tag" + b"\x07" + b"\x01\x02\x03\x04" + b"\xff" * 8 + b"\xff" * 7 + b"\xfe"
        + b"\x01" + b"\x00" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x02\xc3\xa9"
        + b"\x00" + b"\x01\x00\x00\x00\x00"
        + b"\x00\x00\x00\x02" + (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    )  # fmt: skip


@given(st.lists(st.integers(min_value=0, max_value=U64_MAX), max_size=300))
def test_u64s_is_a_u32_count_then_each_value_as_u64(values: list[int]) -> None:
    one_by_one = Encoder().u32(len(values))
    for v in values:
        one_by_one.u64(v)
    assert bytes(Encoder().u64s(values)) == bytes(one_by_one)


@pytest.mark.parametrize(
    "write",
    [
        lambda e: e.u8(256),
        lambda e: e.u8(-1),
        lambda e: e.u32(U32_MAX + 1),
        lambda e: e.u32(-1),
        lambda e: e.u64(U64_MAX + 1),
        lambda e: e.u64(-1),
        lambda e: e.u64s([0, U64_MAX + 1]),
        lambda e: e.u64s([-1]),
        lambda e: e.i64(2**63),
    ],
)
def test_a_value_outside_its_width_raises_and_is_never_truncated(write) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(struct.error):
        write(Encoder())
