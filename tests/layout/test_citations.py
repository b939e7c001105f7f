"""Comments and pages cite what a reader has: the repository, an RFC, a paper.

A reader has only the repository. A comment that says why by pointing at a ticket number,
a review round or a design document kept elsewhere says nothing to them; the reason belongs
in the sentence, or in a page of `docs/` it cites. So no tracked source, page or schema
names an issue, stop, item or hole by number, or cites a design document, a style guide
or a folder that is not in the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = (".py", ".md", ".toml", ".proto")
# the project's process, or a document that is not in the repository
OUTSIDE = re.compile(
    r"\b(issue|stop|item|hole)s? #?\d+\b|\bDESIGN(\.md|\s*§)|STYLE\.md|\.\./shared", re.I
)

# The whole tree: every tracked file with one of SUFFIXES, wherever it is.
CLEAN = [""]
NOT_YET: list[str] = []


def _under(path: str, entries: list[str]) -> bool:
    return any(e in ("", path) or path.startswith(e + "/") for e in entries)


def tracked_files() -> list[str]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files are tracked is unknown")
    return [p for p in listing.decode().split("\0") if p]


def in_scope(files: list[str]) -> list[str]:
    return [
        p
        for p in files
        if p.endswith(SUFFIXES)
        and _under(p, CLEAN)
        and not _under(p, NOT_YET)
        and (ROOT / p).is_file()
    ]


def test_every_listed_part_exists() -> None:
    """A misspelt entry would quietly check nothing."""
    files = tracked_files()
    missing = [e for e in CLEAN + NOT_YET if not any(_under(p, [e]) for p in files)]
    assert not missing, f"no tracked file under {missing}"
    assert len(in_scope(files)) > 100


def test_no_tracked_file_cites_the_process_or_a_document_outside() -> None:
    hits = []
    for path in in_scope(tracked_files()):
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            hits += [f"{path}:{number}: {m.group(0)}" for m in OUTSIDE.finditer(line)]
    assert not hits, "cite the reason, a docs/ page, an RFC or a paper:\n" + "\n".join(hits)


# Spelt with placeholders ({n} a number, {md} ".md", {sec} " §"), so that this file passes
# its own check.
@pytest.mark.parametrize(
    "text",
    [
        "(issue {n}, item {n})",
        "Issue {n} found a replica",
        "stop {n}",
        "items {n}-4",
        "issue {n}'s 256-byte",
        "hole {n}",
        "DESIGN{sec}{n}.2",
        "see DESIGN{md}",
        "STYLE{md} rule {n}",
    ],
)
def test_the_pattern_finds_the_process(text: str) -> None:
    assert OUTSIDE.search(text.format(n=14, md=".md", sec=" §"))


@pytest.mark.parametrize(
    "text",
    [
        "the BRAH paper, §6.3",
        "RFC 6265 §8.5",
        "stop the process",
        "the design beneath them",
        "a stop of 2 replicas",
    ],
)
def test_the_pattern_leaves_plain_prose_alone(text: str) -> None:
    assert not OUTSIDE.search(text)
