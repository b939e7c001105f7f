"""The README and `docs/` say only what is true of the repository.

- every relative link leads to a file or folder that exists;
- every `quorumgate ...` command a shell block shows is one the command line accepts,
  with those options (parsed by the real parser, never run);
- every Python block compiles, and every name it imports from `quorumgate` exists.

That nothing cites a document outside the repository or the project's process is checked
for them and for the code alike (`test_citations.py`).

What the commands *do* is tested where their behaviour is: the live tests run the same
commands against real clusters (`tests/live/test_cli.py`, `tests/client/`), and the
policy guide's example is run by the policy test kit (`tests/engine/test_policykit.py`),
and the SDK guide's example runs as written against a live cluster
(`tests/client/test_docs_examples_live.py`).
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

from quorumgate.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for lang, body in FENCE.findall(page.read_text()):
            if lang == language:
                found.append((_page_id(page), body))
    return found


def test_the_docs_exist_and_the_readme_stays_short() -> None:
    assert len(PAGES) > 10
    assert len((ROOT / "README.md").read_text().splitlines()) < 150


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    missing = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{_page_id(page)} links to what does not exist: {missing}"


def shown_commands(body: str) -> list[str]:
    """The `quorumgate` invocations of a shell block: comments dropped, a line continued
    with a backslash joined, `&&`, `;` and pipes split, optional `[...]` parts kept as
    plain options (so both spellings are checked), and `A|B` choices taking the first."""
    text = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for raw_line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw_line).strip()
        for raw_part in re.split(r"&&|;|\|(?!\w)|>", line):
            part = raw_part.strip()
            if not part.startswith("quorumgate "):
                continue
            part = re.sub(r"(\S+)\|\S+", r"\1", re.sub(r"\[([^\]]*)\]", r"\1", part))
            commands.append(part.replace("...", "").strip())
    return commands


COMMANDS = [(page, cmd) for page, body in blocks("sh") for cmd in shown_commands(body)]


def test_the_shell_blocks_show_commands() -> None:
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("command", [c for _, c in COMMANDS], ids=[p for p, _ in COMMANDS])
def test_every_shown_command_parses(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # placeholders a page writes for numbers (`--node I`, `--from-height H`) become one
    argv = ["1" if re.fullmatch(r"[A-Z]{1,2}", a) else a for a in shlex.split(command)[1:]]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`{command}` is refused by the command line: {capsys.readouterr().err}")
        raise AssertionError from exc


PYTHON_BLOCKS = blocks("python")


@pytest.mark.parametrize("body", [b for _, b in PYTHON_BLOCKS], ids=[p for p, _ in PYTHON_BLOCKS])
def test_every_python_block_compiles_and_imports_what_exists(body: str) -> None:
    tree = ast.parse(body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quorumgate"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
