"""What a user installs: one top-level name, `quorumgate`.

The wheel is built from this checkout the way `pip install .` builds it, and its contents
are checked; then it is installed into an empty directory and imported from there by a
fresh interpreter, away from the repository, so the folders of the checkout cannot stand in
for what the wheel forgot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = (
    "quorumgate.proto",
    "quorumgate.replica",
    "quorumgate.sidecar",
    "quorumgate.sidecar.engine",
    "quorumgate.sdk",
    "quorumgate.ops",
    "quorumgate.bench",
    "quorumgate.examples",
)
PROBE = """
import importlib, json, sys
import quorumgate
mods = {}
for name in sys.argv[1:]:
    mods[name] = importlib.import_module(name).__file__
from quorumgate import Client, SyncClient, governed_tool, Executor
from quorumgate.proto import consensus_pb2, client_pb2_grpc
from quorumgate.replica.core import Core
from quorumgate.sidecar.engine.core import Engine
from quorumgate.cli import main
print(json.dumps({"quorumgate": quorumgate.__file__, "modules": mods}))
"""


SOURCES = ("pyproject.toml", "README.md", "cluster", "replica", "runtime", "sidecar", "proto")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools builds in the source tree (build/), and a build/ left
    # by an older layout would slip stale modules into the wheel.
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            skip = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("quorumgate-*.whl")
    return built


def test_the_wheel_installs_only_quorumgate(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"quorumgate"}, tops
    for package in SUBPACKAGES:
        assert package.replace(".", "/") + "/__init__.py" in names, package
    # generated code, its stubs and the schemas travel with the package
    for suffix in ("consensus_pb2.py", "client_pb2_grpc.py", "tx_pb2.pyi", "tx.proto"):
        assert f"quorumgate/proto/{suffix}" in names, suffix
    assert "quorumgate/sidecar/examples/policy.toml" in names
    assert "quorumgate = quorumgate.cli:main" in scripts
    assert not any("/tests/" in n or n.startswith(("tests/", "scripts/")) for n in names)


def test_the_installed_wheel_imports_away_from_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *SUBPACKAGES],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    found = json.loads(out.stdout)
    assert Path(found["quorumgate"]).is_relative_to(target), found
    for name, path in found["modules"].items():
        assert Path(path).is_relative_to(target), (name, path)
    assert not any((target / old).exists() for old in ("replica", "sidecar", "cluster", "qgpb"))
