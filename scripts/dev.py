#!/usr/bin/env python3
"""Set up a development environment and run QuorumGate's main job or its tests.

Needs only Python 3.11+. It creates `.venv/` beside the repository root, installs the
project with its dev extra into it (again only when `pyproject.toml` changed), and then
runs the requested job inside that environment:

    python3 scripts/dev.py run  [args...]   # start a local cluster (the main job)
    python3 scripts/dev.py test [pytest args...]
    python3 scripts/dev.py lint             # ruff + mypy
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

MIN_PYTHON = (3, 11)
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".dev-stamp"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env() -> Path:
    if sys.version_info < MIN_PYTHON:
        sys.exit(f"QuorumGate needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+, found {sys.version}")
    python = venv_python()
    if not python.exists():
        print(f"[dev] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    have = STAMP.read_text().strip() if STAMP.exists() else ""
    if want != have:
        print("[dev] installing quorumgate[dev] into .venv", flush=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
        STAMP.write_text(want + "\n")
    return python


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"run", "test", "lint"}:
        print(__doc__)
        return 2
    job, rest = argv[0], argv[1:]
    python = ensure_env()
    os.chdir(ROOT)
    if job == "run":
        cmd = [str(python), "-m", "quorumgate.cli", "demo", *rest]
    elif job == "test":
        cmd = [str(python), "-m", "pytest", *rest]
    else:
        rc = subprocess.call([str(python), "-m", "ruff", "check", "."])
        return rc or subprocess.call([str(python), "-m", "mypy"])
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
