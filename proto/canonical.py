"""Canonical bytes: the one place that decides what gets hashed and signed.

One module owns canonical bytes for hashing and signing (docs/development.md). Every
hash and every signature in QuorumGate is computed over bytes built here, never over
protobuf encodings, so re-encoding a message on the wire cannot change what was signed.

The encoding is deliberately dull: fixed-width big-endian integers, and byte strings and
text prefixed with their length as a u32. Every signed or hashed statement starts with a
domain tag (`b"qg/vote/v2"` and so on) so that a signature made for one purpose can never
be replayed as another, nor one made under an earlier statement as a later one.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

from quorumgate.proto.domains import BLOCK, HELLO, HELLO_REPLY, PROPOSAL, QC, TIMEOUT, VOTE

HASH_BYTES = 32
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

# The consensus statements' domain tags (every tag is declared in proto/domains.py). A vote
# signs its block's height too (docs/consensus/messages.md): the v1 statement (chain id,
# view, block hash) left the height to whoever relayed the vote.
TAG_BLOCK = BLOCK
TAG_VOTE = VOTE
TAG_TIMEOUT = TIMEOUT
TAG_PROPOSAL = PROPOSAL
TAG_QC = QC
TAG_HELLO = HELLO
TAG_HELLO_REPLY = HELLO_REPLY

# Precompiled packers: the encoder runs some hundred times per executed transaction.
# Each raises struct.error for a value outside its width, so no value is ever truncated.
_U8 = struct.Struct(">B").pack
_U32 = struct.Struct(">I").pack
_U64 = struct.Struct(">Q").pack
_I64 = struct.Struct(">q").pack


class Encoder:
    """Builds canonical bytes field by field; `bytes()` returns the result."""

    __slots__ = ("_parts",)

    def __init__(self, tag: bytes = b"") -> None:
        self._parts: list[bytes] = []
        if tag:
            self.raw(tag)

    def raw(self, data: bytes) -> Encoder:
        """Append bytes as they are: only for fixed-size values such as hashes and tags."""
        self._parts.append(data)
        return self

    def u8(self, value: int) -> Encoder:
        self._parts.append(_U8(value))
        return self

    def u32(self, value: int) -> Encoder:
        self._parts.append(_U32(value))
        return self

    def u64(self, value: int) -> Encoder:
        self._parts.append(_U64(value))
        return self

    def u64s(self, values: Sequence[int]) -> Encoder:
        """A counted list of u64: the count as a u32, then each value (one pack call)."""
        parts = self._parts
        parts.append(_U32(len(values)))
        parts.append(struct.pack(f">{len(values)}Q", *values))
        return self

    def i64(self, value: int) -> Encoder:
        self._parts.append(_I64(value))
        return self

    def boolean(self, value: bool) -> Encoder:
        self._parts.append(b"\x01" if value else b"\x00")
        return self

    def blob(self, data: bytes) -> Encoder:
        """Length-prefixed bytes."""
        parts = self._parts
        parts.append(_U32(len(data)))
        parts.append(data)
        return self

    def text(self, value: str) -> Encoder:
        """Length-prefixed UTF-8 text."""
        data = value.encode("utf-8")
        parts = self._parts
        parts.append(_U32(len(data)))
        parts.append(data)
        return self

    def blobs(self, items: Iterable[bytes]) -> Encoder:
        """A counted list of length-prefixed byte strings."""
        seq = list(items)
        self.u32(len(seq))
        for item in seq:
            self.blob(item)
        return self

    def texts(self, items: Iterable[str]) -> Encoder:
        seq = list(items)
        self.u32(len(seq))
        for item in seq:
            self.text(item)
        return self

    def optional_blob(self, data: bytes | None) -> Encoder:
        """Absent and empty are different values: presence is its own byte."""
        if data is None:
            return self.u8(0)
        return self.u8(1).blob(data)

    def __bytes__(self) -> bytes:
        return b"".join(self._parts)

    def digest(self) -> bytes:
        return sha256(bytes(self))


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
