"""The consensus core is sans-I/O (docs/architecture/0006-sans-io-core-and-simulator.md; as h11 is):
no asyncio, gRPC, SQLite, clock, randomness, sockets, threads or OS access in its modules.

Checked twice: statically, on every import statement of each module's source (including
imports inside functions and `__import__`/`importlib` tricks), and dynamically, by
importing the core in a fresh interpreter and comparing its `sys.modules` with that of an
interpreter that imported nothing (CPython itself preloads `os` and `time`, and PyNaCl
may pull in what it likes, so the dynamic check names only modules nothing preloads).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

CORE_MODULES = (
    "quorumgate.proto.canonical",
    "quorumgate.proto.domains",
    "quorumgate.proto.membership",
    "quorumgate.replica.types",
    "quorumgate.replica.config",
    "quorumgate.proto.crypto",
    "quorumgate.replica.certs",
    "quorumgate.replica.safety",
    "quorumgate.replica.blocktree",
    "quorumgate.replica.actions",
    "quorumgate.replica.validate",
    "quorumgate.replica.core",
    "quorumgate.replica.epochs",
    "quorumgate.replica.sync",
)

FORBIDDEN = frozenset(
    {
        "asyncio",
        "grpc",
        "sqlite3",
        "aiosqlite",
        "time",
        "datetime",
        "random",
        "secrets",
        "socket",
        "selectors",
        "ssl",
        "threading",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "signal",
        "os",
        "uuid",
        "importlib",
        # protobuf stays in the wire codec
        "google",
    }
)
# Third-party packages allowed in the core, and where: only crypto touches the key library.
THIRD_PARTY = {"nacl": {"quorumgate.proto.crypto"}}
# What nothing in CPython preloads, so its presence after `import quorumgate.replica.core` is ours.
ABSENT_AFTER_IMPORT = ("random", "asyncio", "grpc", "sqlite3", "aiosqlite", "socket", "datetime")


def module_source(name: str) -> tuple[Path, str]:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    path = Path(spec.origin)
    return path, path.read_text(encoding="utf-8")


def imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_nothing_that_does_io_or_reads_time_or_randomness(
    module: str,
) -> None:
    path, source = module_source(module)
    assert path.parent.name in {"replica", "proto"}
    tree = ast.parse(source, filename=str(path))
    names = imported_names(tree)
    assert names, f"{module}: no imports found (wrong file?)"
    for name in names:
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"{module} imports {name}"
        if top == "quorumgate":
            # within QuorumGate, the core imports only the core: not the wire codec, the
            # shells, the sidecar or the SDK
            assert name in CORE_MODULES, f"{module} imports {name}, outside the core"
        elif top in THIRD_PARTY:
            assert module in THIRD_PARTY[top], f"{module} imports {name}"
        elif top != "__future__":
            assert top in sys.stdlib_module_names, f"{module} imports third-party {name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"__import__", "open", "eval", "exec"}, (
                f"{module} calls {node.func.id}()"
            )


def test_the_ast_check_catches_a_forbidden_import() -> None:
    """The checker is not vacuous: it sees top-level, nested and from-imports."""
    sample = "import hashlib\ndef f():\n    import random\nfrom time import monotonic\n"
    names = imported_names(ast.parse(sample))
    assert sorted(names) == ["hashlib", "random", "time"]
    assert {n.split(".")[0] for n in names} & FORBIDDEN == {"random", "time"}


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return set(json.loads(out.stdout))


def test_importing_the_core_loads_no_forbidden_module_in_a_fresh_interpreter() -> None:
    imports = "; ".join(f"import {m}" for m in CORE_MODULES)
    report = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    baseline = _modules_after(report)
    loaded = _modules_after(f"{imports}; {report}")
    assert set(CORE_MODULES) <= loaded and not set(CORE_MODULES) & baseline
    new = loaded - baseline
    for name in ABSENT_AFTER_IMPORT:
        assert name not in baseline, f"CPython preloads {name}: the check would be empty"
        assert not any(m == name or m.startswith(name + ".") for m in new), (
            f"importing the core loaded {name}"
        )
