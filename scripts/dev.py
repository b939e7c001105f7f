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
import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

MIN_PYTHON = (3, 11)
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".dev-stamp"
TEST_WORKERS_MAX = 2  # pytest-xdist workers for the test job (CI has two cores)


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


MYPY_PACKAGES = ("quorumgate.runtime", "quorumgate.replica", "quorumgate.sidecar.engine")


def mypy(python: Path) -> int:
    """mypy --strict on the consensus core, the formats below it and the engine.

    mypy cannot follow setuptools' package-dir mapping, so it reads a `quorumgate/` tree of
    symbolic links to the repository's folders, made afresh each time from the mapping in
    pyproject.toml (`scripts/layout.py`); an editor's type checker can use the same tree
    (`.venv/mypy-tree`, docs/development.md).
    """
    from layout import link_tree  # scripts/layout.py, beside this file (needs 3.11's tomllib)

    tree = link_tree(VENV / "mypy-tree", ROOT)
    modules = [
        f"quorumgate.proto.{p.stem}"
        for p in sorted((ROOT / "proto").glob("*.py"))
        if p.stem != "__init__" and "_pb2" not in p.stem
    ]
    args = [a for pkg in MYPY_PACKAGES for a in ("-p", pkg)]
    args += [a for mod in modules for a in ("-m", mod)]
    config = str(ROOT / "pyproject.toml")
    env = {**os.environ, "MYPYPATH": str(tree)}
    return subprocess.call(
        [str(python), "-m", "mypy", "--config-file", config, *args], cwd=tree, env=env
    )


CHROMIUM = ("chromium", "chromium-browser")


def ensure_chromium(python: Path) -> None:
    """The console's test drives a real headless Chromium (Debian's package): install it
    with apt when it is missing and this user may (root, or sudo without a password);
    elsewhere, Playwright's own Chromium build (`playwright install chromium`)."""
    if any(shutil.which(name) for name in CHROMIUM):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if not shutil.which("apt-get") or (sudo and not shutil.which("sudo")):
        print("[dev] no Chromium and no apt: installing Playwright's Chromium", flush=True)
        subprocess.call([str(python), "-m", "playwright", "install", "chromium"])
        return
    print("[dev] installing Chromium (Debian's package) for the console's browser test", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["update", "-q"], ["install", "-y", "-q", "chromium"]):
        subprocess.call([*sudo, "apt-get", *step], stdout=subprocess.DEVNULL, env=env)


def has_postgres() -> bool:
    """initdb on PATH, or in Debian's versioned directory (not on PATH by default)."""
    import glob

    return bool(shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def ensure_postgres() -> None:
    """The audit tests start a real PostgreSQL server (docs/audit.md): install Debian's
    package with apt when it is missing and this user may (root, or sudo without a
    password); elsewhere those tests fail naming what to install."""
    if has_postgres():
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if not shutil.which("apt-get") or (sudo and not shutil.which("sudo")):
        print("[dev] no PostgreSQL and no apt: the audit tests need it installed", flush=True)
        return
    print("[dev] installing PostgreSQL (Debian's package) for the audit tests", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["update", "-q"], ["install", "-y", "-q", "postgresql"]):
        subprocess.call([*sudo, "apt-get", *step], stdout=subprocess.DEVNULL, env=env)


def test_workers(args: list[str]) -> list[str]:
    """pytest-xdist options for the test job: one worker per core up to `TEST_WORKERS_MAX`,
    each test module (or class) kept whole on one worker, in its order (`loadscope`: a
    module's cluster fixture starts once, and some tests rely on running after others).
    Nothing when the caller chose for itself (`-n`, `--dist`, `-p no:xdist`) or has one
    core."""
    chose = any(a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) for a in args)
    chose = chose or "no:xdist" in args
    workers = min(os.cpu_count() or 1, TEST_WORKERS_MAX)
    if chose or workers < 2:
        return []
    return ["-n", str(workers), "--dist", "loadscope"]


def run_forwarding(cmd: list[str]) -> int:
    """Run `cmd` and return its exit status. A SIGTERM sent to this script is passed on to
    the job, which stops what it started (the main job stops its cluster) before exiting;
    Ctrl-C reaches both through the terminal, and this script waits for the job to finish
    stopping rather than returning while it still runs."""
    proc = subprocess.Popen(cmd)

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    while True:
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            continue  # the job got the same Ctrl-C: wait while it stops
        return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + N


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
        ensure_chromium(python)
        ensure_postgres()
        cmd = [str(python), "-m", "pytest", *test_workers(rest), *rest]
    else:
        rc = subprocess.call([str(python), "-m", "ruff", "check", "."])
        return rc or mypy(python)
    return run_forwarding(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
