"""The domain tags: one table (proto/domains.py), every tag in it once, none the start of
another, and no tag written anywhere else in the source."""

from __future__ import annotations

import ast
import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from quorumgate.proto import domains

ROOT = Path(__file__).resolve().parents[2]
# The folders of the installed packages: every module that signs or hashes is in one.
SOURCE_FOLDERS = ("proto", "runtime", "replica", "sidecar", "cluster")
TAGS = {name: value for name, value in vars(domains).items() if isinstance(value, bytes)}


def test_the_table_holds_tags_only_each_declared_once() -> None:
    assert TAGS["VOTE"] == b"qg/vote/v2"  # the table is read: its tags are the module's bytes
    for name, tag in TAGS.items():
        assert name.isupper() and tag.startswith(b"qg/"), name
        assert tag.decode("ascii").isprintable(), name
    shared = {tag: n for tag, n in Counter(TAGS.values()).items() if n > 1}
    assert shared == {}, "one tag for two purposes"


def test_no_tag_is_the_start_of_another() -> None:
    """Unique tags are not enough. A tag is written as it is (`Encoder.raw`): no length
    before it, no end after it, and what follows is not always a length-prefixed field —
    a state bucket hashes raw 32-byte hashes right after its tag, a signature cache key a
    u32, an MCP pin JSON text. Were tag A a proper prefix of tag B = A || s, a statement
    under A whose first bytes happen to be s (a hash may begin with anything) would be the
    bytes of a statement under B. With no tag a prefix of another, two tags differ within
    the length of the shorter, so statements under different tags differ there, whatever
    follows them."""
    for (name_a, a), (name_b, b) in itertools.permutations(TAGS.items(), 2):
        assert not b.startswith(a), f"{name_a} ({a!r}) starts {name_b} ({b!r})"


def _tag_literals(path: Path) -> Iterator[tuple[int, bytes]]:
    """Every bytes or text constant in a module that reads as a tag (starts with qg/)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes | str):
            value = node.value.encode() if isinstance(node.value, str) else node.value
            if value.startswith(b"qg/"):
                yield node.lineno, value


def test_every_tag_written_in_the_source_is_in_the_table() -> None:
    """A new tag cannot be added beside the table: a module takes its tags from it, so the
    test above sees every tag there is. Docstrings naming a tag start with other words and
    are not read as one."""
    known = set(TAGS.values())
    seen: dict[str, bytes] = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, value in _tag_literals(path):
                seen[f"{path.relative_to(ROOT)}:{line}"] = value
    outside = {where: value for where, value in seen.items() if value not in known}
    assert outside == {}, "tags written outside proto/domains.py's table"
    # the scan reads what it should: it finds the table's own lines
    in_table = [where for where in seen if where.startswith("proto/domains.py:")]
    assert len(in_table) == len(TAGS)
