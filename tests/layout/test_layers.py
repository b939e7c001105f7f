"""The layout shows the architecture: layers point one way.

    quorumgate.proto     the formats every process shares        imports only itself
    quorumgate.runtime   what every process runs on: channels,   + proto
                         read authorization, process start-up
    quorumgate.replica   consensus core, simulator, replica      + runtime
    quorumgate.sidecar   governance engine, execution sidecar    + replica
    quorumgate.sdk       (and `quorumgate` itself) the SDK       + sidecar
                         and the seams built on it: the model-API proxy (`proxy`) and
                         the MCP gateway (`mcpgw`)
    quorumgate.examples  the orchestrator example                + sdk
    quorumgate.ops       processes, drills, the main job, and    + examples
                         the approvals console (`console`: an operator's process)
    quorumgate.bench     the benchmark (it starts clusters)      + ops
    quorumgate.cli       the `quorumgate` command line           everything

Every import statement of every module counts, including those inside functions and under
`TYPE_CHECKING`: a lazy upward import is still an upward dependency. Between modules there
are no import circles. The checks run on the source files, so they need no import of the
code and see what a reader sees.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_layout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# package -> the folder setuptools maps it from, read where pyproject.toml declares it
PACKAGE_DIRS: dict[str, Path] = _load_layout().package_dirs(ROOT)
LAYER_ORDER = ("proto", "runtime", "replica", "sidecar", "sdk", "examples", "ops", "bench", "cli")
# each layer may import itself and the layers before it in LAYER_ORDER
ALLOWED: dict[str, frozenset[str]] = {
    layer: frozenset(LAYER_ORDER[: i + 1]) for i, layer in enumerate(LAYER_ORDER)
}
OLD_TOP_LEVEL = ("replica", "sidecar", "cluster", "qgpb")
# subpackages that belong to a layer of another name
SUBPACKAGE_LAYERS = {"proxy": "sdk", "mcpgw": "sdk", "console": "ops"}


def layer_of(module: str) -> str:
    """The layer a `quorumgate` module belongs to; the package itself is the SDK."""
    parts = module.split(".")
    assert parts[0] == "quorumgate", module
    if len(parts) == 1:
        return "sdk"
    if parts[1] == "__main__":
        return "cli"  # `python -m quorumgate` is the command line
    if parts[1] in SUBPACKAGE_LAYERS:
        return SUBPACKAGE_LAYERS[parts[1]]
    return parts[1] if parts[1] in ALLOWED else "sdk"


def source_modules() -> dict[str, Path]:
    """Every module of the installed package, named as it is imported, from its folder."""
    modules: dict[str, Path] = {}
    mapped = {d.resolve() for d in PACKAGE_DIRS.values()}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            if any(p.resolve() in mapped and p.resolve() != folder.resolve() for p in path.parents):
                continue  # a folder mapped to a package of its own
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(source: str) -> set[str]:
    """Every module name an import statement of `source` names (and `from X import Y` also
    names X.Y, which is a module when Y is one)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            if node.module:
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def dependency_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        named = imports_of(path.read_text(encoding="utf-8"))
        graph[name] = {m for m in named if m in modules and m != name}
    return graph


def upward_imports(graph: Mapping[str, Iterable[str]]) -> list[str]:
    problems = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module)
        for dep in sorted(deps):
            # a package's own __init__ is imported on the way to its modules: not a dependency
            if any(m == dep for m in _parents(module)):
                continue
            if layer_of(dep) not in ALLOWED[mine]:
                problems.append(f"{module} ({mine}) imports {dep} ({layer_of(dep)})")
    return problems


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return dependency_graph(source_modules())


def test_every_layer_has_modules_and_the_graph_has_edges(graph: dict[str, set[str]]) -> None:
    layers = {layer_of(m) for m in graph}
    assert layers == set(ALLOWED), layers
    assert sum(len(d) for d in graph.values()) > 200  # the scan sees real imports


def test_no_module_imports_a_layer_above_its_own(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_no_import_circles_between_modules(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_the_checks_catch_an_upward_import_and_a_circle() -> None:
    """Neither check is vacuous: a replica module reaching into the sidecar, a sidecar
    module into the SDK, and two modules importing each other are all reported."""
    graph = {
        "quorumgate.replica.mempool": {"quorumgate.sidecar.engine.core", "quorumgate.proto.tx"},
        "quorumgate.sidecar.node": {"quorumgate.proto.clusterfile", "quorumgate.sdk.client"},
        "quorumgate.sdk.client": {"quorumgate.sdk.governed", "quorumgate"},
        "quorumgate.sdk.governed": {"quorumgate.sdk.client"},
        "quorumgate.sidecar.engine.core": set(),
        "quorumgate.proto.tx": set(),
        "quorumgate.proto.clusterfile": set(),
        "quorumgate": set(),
    }
    assert upward_imports(graph) == [
        "quorumgate.replica.mempool (replica) imports quorumgate.sidecar.engine.core (sidecar)",
        "quorumgate.sidecar.node (sidecar) imports quorumgate.sdk.client (sdk)",
    ]
    assert cycles(graph) == [["quorumgate.sdk.client", "quorumgate.sdk.governed"]]
    # an import inside a function or under TYPE_CHECKING counts
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from quorumgate.ops import drill\n"
        "def f():\n    import quorumgate.sidecar.store\n"
    )
    assert {"quorumgate.ops.drill", "quorumgate.sidecar.store"} <= imports_of(source)


def test_nothing_imports_the_old_top_level_names() -> None:
    """`replica`, `sidecar`, `cluster` and `qgpb` are folders, not importable names: the
    repository root is on sys.path while tests run, so such an import would still work
    here and fail for every user."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if {".venv", "build"} & set(path.parts) or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for name in imports_of(path.read_text(encoding="utf-8")):
            if name.split(".")[0] in OLD_TOP_LEVEL:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_the_public_sdk_is_one_all_and_every_name_resolves() -> None:
    import quorumgate

    exported = quorumgate._EXPORTS  # the name -> module table behind lazy loading
    assert sorted(quorumgate.__all__) == sorted(exported)
    assert len(set(quorumgate.__all__)) == len(quorumgate.__all__)
    for name in quorumgate.__all__:
        value = getattr(quorumgate, name)
        module = getattr(value, "__module__", None)
        if module is not None and not isinstance(value, str):
            assert module == exported[name], (name, module)
    for name in ("Client", "SyncClient", "governed_tool", "Executor"):
        assert name in quorumgate.__all__
    with pytest.raises(AttributeError):
        _ = quorumgate.NoSuchName  # type: ignore[attr-defined]
