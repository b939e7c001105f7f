"""The repository's folders as the installed `quorumgate` package, read from the one place
that declares them: `[tool.setuptools.package-dir]` in `pyproject.toml`.

Setuptools maps `cluster/` to `quorumgate` and `replica/`, `sidecar/`, `proto/` beneath it.
Tools that read source files rather than an installed package (mypy, the layout tests, the
before/after bench) need the same mapping; they take it from here, never from a copy.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGE = "quorumgate"


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Each mapped package (`quorumgate`, `quorumgate.replica`, ...) and its folder."""
    with (root / "pyproject.toml").open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in mapping.items()}


def link_tree(into: Path, root: Path = ROOT) -> Path:
    """Make `into/quorumgate/` a tree of links laid out as the installed package, over the
    source folders of `root`, and return `into` (the directory to put on a search path).
    An existing tree is replaced, so a renamed module never lingers."""
    dirs = package_dirs(root)
    package = into / TOP_PACKAGE
    if package.exists():
        for link in package.iterdir():
            link.unlink()
    package.mkdir(parents=True, exist_ok=True)
    subpackages = {name.removeprefix(TOP_PACKAGE + "."): path for name, path in dirs.items()
                   if name != TOP_PACKAGE}  # fmt: skip
    for entry in dirs[TOP_PACKAGE].iterdir():
        if entry.name != "__pycache__" and entry.name not in subpackages:
            (package / entry.name).symlink_to(entry)
    for name, path in subpackages.items():
        (package / name).symlink_to(path)
    return into
