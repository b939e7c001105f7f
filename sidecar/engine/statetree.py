"""The incremental, authenticated form of the engine state (docs/sidecar.md, "The state root").

The state is a header and fourteen keyed sections (tools, agents, grants, pending cards,
...). Every entry is encoded on its own; a block re-encodes and rehashes only the entries
it touched, and a store writes only those. Three pieces:

- `TrackedDict`: a section's map, which remembers the keys written (set, delete, pop,
  clear) since they were last taken; for sections whose values are mutable records, also
  the keys *read* (`get`, `[]`, `values`, `items`), since a record read may be changed in
  place. Over-marking costs an encoding that turns out equal; under-marking would be a
  wrong root, which `Engine.verify_state_cache` and every engine test check for.
- `key_bytes`: an order-preserving byte form of a section key (a string, bytes, or a tuple
  of strings): the byte order of the forms is Python's order of the keys, so a store can
  return entries in canonical order with a plain `ORDER BY` on a BLOB column.
- `SectionTree`: a two-level hash tree over one section's entries. A leaf hash covers the
  section, the key and the entry's bytes; each key falls in one of `BUCKETS` buckets by the
  first byte of the SHA-256 of its key form; a bucket's hash covers its leaves in key
  order, and the section's root covers the 256 bucket hashes. Changing one entry rehashes
  its leaf, its bucket (32 bytes per entry in it) and the 8 KiB of bucket hashes: with
  10,000 entries about 9 KiB of hashing, where hashing the whole state was 5 MB. The
  bucket is the limit: its cost grows with entries / 256 (ids chosen to share one bucket
  make that bucket's rehash grow with them; at the largest capacities, 2**32 - 1 entries,
  nothing here is constant, but every cost stays linear in what a bucket holds).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from quorumgate.proto import domains

BUCKETS = 256
TAG_LEAF = domains.STATE_LEAF
TAG_BUCKET = domains.STATE_BUCKET
TAG_SECTION = domains.STATE_SECTION

K = TypeVar("K")
V = TypeVar("V")


class TrackedDict(dict[K, V]):
    """A dict that records which keys changed since `take_dirty` (see the module doc).
    `reads_mark` also records every key read, for maps of mutable records."""

    __slots__ = ("dirty", "reads_mark")

    def __init__(self, *args: Any, reads_mark: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dirty: set[K] = set(self.keys())
        self.reads_mark = reads_mark

    # writes
    def __setitem__(self, key: K, value: V) -> None:
        self.dirty.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: K) -> None:
        self.dirty.add(key)
        super().__delitem__(key)

    def pop(self, key: K, *default: Any) -> Any:
        self.dirty.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self.dirty.add(key)
        return key, value

    def setdefault(self, key: K, default: Any = None) -> Any:
        self.dirty.add(key)
        return super().setdefault(key, default)

    def clear(self) -> None:
        self.dirty.update(self.keys())
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> TrackedDict[K, V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    # reads (of mutable records)
    def __getitem__(self, key: K) -> V:
        if self.reads_mark:
            self.dirty.add(key)
        return super().__getitem__(key)

    def get(self, key: K, default: Any = None) -> Any:
        if self.reads_mark and key in self:
            self.dirty.add(key)
        return super().get(key, default)

    def values(self) -> Any:
        if self.reads_mark:
            self.dirty.update(self.keys())
        return super().values()

    def items(self) -> Any:
        if self.reads_mark:
            self.dirty.update(self.keys())
        return super().items()

    def take_dirty(self) -> set[K]:
        taken, self.dirty = self.dirty, set()
        return taken

    def __reduce__(self) -> Any:  # pickling and copying keep the tracking dict
        return (_rebuild_tracked, (dict(self), self.reads_mark))


def _rebuild_tracked(items: dict[Any, Any], reads_mark: bool) -> TrackedDict[Any, Any]:
    return TrackedDict(items, reads_mark=reads_mark)


def _escaped(part: bytes) -> bytes:
    return part.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def key_bytes(key: str | bytes | tuple[str, ...]) -> bytes:
    """The order-preserving byte form of a section key: each component (a string as UTF-8,
    whose byte order is code-point order) with its NUL bytes escaped as 00 FF and ended by
    00 00, so a component that is a prefix of another sorts first, as in Python."""
    if isinstance(key, str):
        return _escaped(key.encode("utf-8"))
    if isinstance(key, bytes):
        return _escaped(key)
    return b"".join(_escaped(part.encode("utf-8")) for part in key)


def leaf_hash(section: int, key: bytes, data: bytes) -> bytes:
    return hashlib.sha256(
        b"".join((TAG_LEAF, section.to_bytes(1, "big"), len(key).to_bytes(4, "big"), key, data))
    ).digest()


EMPTY_BUCKET = hashlib.sha256(TAG_BUCKET).digest()


def bucket_of(key: bytes) -> int:
    return hashlib.sha256(key).digest()[0]


class SectionTree:
    """One section's hash tree (see the module doc): `put` and `remove` by key form, `root`
    rehashes only the buckets changed since the last call."""

    __slots__ = ("_buckets", "_hashes", "_root", "_stale")

    def __init__(self) -> None:
        self._buckets: list[dict[bytes, bytes]] = [{} for _ in range(BUCKETS)]
        self._hashes = [EMPTY_BUCKET] * BUCKETS
        self._stale: set[int] = set()
        self._root: bytes | None = None

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets)

    def put(self, key: bytes, leaf: bytes) -> None:
        index = bucket_of(key)
        self._buckets[index][key] = leaf
        self._stale.add(index)
        self._root = None

    def remove(self, key: bytes) -> None:
        index = bucket_of(key)
        if self._buckets[index].pop(key, None) is not None:
            self._stale.add(index)
            self._root = None

    def root(self) -> bytes:
        if self._root is None:
            for index in self._stale:
                bucket = self._buckets[index]
                self._hashes[index] = (
                    hashlib.sha256(
                        TAG_BUCKET + b"".join(bucket[key] for key in sorted(bucket))
                    ).digest()
                    if bucket
                    else EMPTY_BUCKET
                )
            self._stale.clear()
            self._root = hashlib.sha256(TAG_SECTION + b"".join(self._hashes)).digest()
        return self._root


def section_root(section: int, entries: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A section's root computed from scratch (the oracle `SectionTree` is checked with)."""
    tree = SectionTree()
    for key, data in entries:
        tree.put(key, leaf_hash(section, key, data))
    return tree.root()


def iter_sorted(entries: dict[bytes, bytes]) -> Iterator[bytes]:
    """The entries' bytes in key order (the canonical order of a section)."""
    for key in sorted(entries):
        yield entries[key]


EMPTY_SECTION_ROOT = SectionTree().root()
