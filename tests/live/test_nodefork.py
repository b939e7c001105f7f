"""A node forked from the tests' warm process (tests/support/nodefork.py) must be, for
anything a test observes, the node started afresh: its pid, command line, session,
descriptors, signal handlers, environment and exit status, and its own random state; and
it must not outlive the tests that started it. Each is compared here with a fresh start
of the same program (tests/support/nodeprobe.py stands in for a node)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import pytest

from quorumgate.ops import nodes
from tests.polling import wait_until
from tests.support import nodefork

WAIT_S = 60.0
Launcher = Callable[[list[str], Mapping[str, str] | None, IO[bytes]], subprocess.Popen[bytes]]


def _command(directory: Path) -> list[str]:
    return [sys.executable, "-m", "tests.support.nodeprobe", "--dir", str(directory), "--node", "0"]


def _start(
    launcher: Launcher, directory: Path, name: str, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    out_path = directory / f"{name}.out"
    with open(out_path, "ab") as out:
        proc = launcher(_command(directory), env, out)
    return proc, out_path


def _report(launcher: Launcher, directory: Path, name: str) -> tuple[int, dict[str, object]]:
    proc, out_path = _start(launcher, directory, name)
    code = proc.wait(timeout=WAIT_S)
    return code, json.loads(out_path.read_text().splitlines()[-1])


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_forked_node_reads_as_one_started_afresh(tmp_path: Path) -> None:
    assert nodes.launch_node is nodefork.launch  # the suite's conftest installs it
    fresh_code, fresh = _report(nodes.popen_node, tmp_path, "fresh")
    forked_code, forked = _report(nodefork.launch, tmp_path, "forked")
    _, again = _report(nodefork.launch, tmp_path, "again")
    assert forked_code == fresh_code == 3
    assert forked["cmdline"] == fresh["cmdline"] == _command(tmp_path)
    assert forked["own_session"] is fresh["own_session"] is True
    for key in ("name", "argv", "path0", "cwd", "fds", "signals", "blocked", "threads"):
        assert forked[key] == fresh[key], key
    for key in ("env", "line_buffering"):
        assert forked[key] == fresh[key], key
    assert forked["fd_targets"][1] == str(tmp_path / "forked.out")
    # Each forked node draws its own random numbers: none is shared with a sibling.
    for mine, sibling in zip(forked["random"], again["random"], strict=True):
        assert mine != sibling


def test_the_handle_holds_the_nodes_own_pid_and_status(tmp_path: Path) -> None:
    proc, out_path = _start(
        nodefork.launch, tmp_path, "sleeper", {**os.environ, "QG_PROBE": "sleep"}
    )
    try:
        wait_until(
            "the node writing its pid", lambda: out_path.read_text().strip() != "", WAIT_S, 0.02
        )
        assert int(out_path.read_text().split()[0]) == proc.pid
        assert _cmdline(proc.pid) == _command(tmp_path)
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the pid a test signals is the node
        assert proc.wait(timeout=WAIT_S) == -signal.SIGKILL
        wait_until("the node reaped", lambda: _gone(proc.pid), WAIT_S, 0.02)
    finally:
        proc.kill()


def test_a_dead_test_process_leaves_no_node(tmp_path: Path) -> None:
    script = (
        "import os, sys, time\n"
        "from tests.support import nodefork\n"
        f"command = {_command(tmp_path)!r}\n"
        "out = open(sys.argv[1], 'ab')\n"
        "proc = nodefork.launch(command, {**os.environ, 'QG_PROBE': 'sleep'}, out)\n"
        "print(proc.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    tests = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "node.out")],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert tests.stdout is not None
        pid = int(tests.stdout.readline())
        assert _cmdline(pid) == _command(tmp_path)
        tests.kill()  # as a crashed pytest worker: nothing of its own runs to clean up
        tests.wait()
        wait_until("the orphaned node killed", lambda: _gone(pid), WAIT_S, 0.05)
    finally:
        tests.kill()
        tests.wait()


def test_a_dropped_handle_leaves_its_node_running_as_a_popen_does(tmp_path: Path) -> None:
    sleep = {**os.environ, "QG_PROBE": "sleep"}
    proc, _ = _start(nodefork.launch, tmp_path, "dropped", sleep)
    pid = proc.pid
    del proc
    gc.collect()  # its connection to the warm process closes
    # The warm process saw that close before it forks the next node (the same select).
    other, _ = _start(nodefork.launch, tmp_path, "other", sleep)
    try:
        assert not _gone(pid) and _cmdline(pid) == _command(tmp_path)
        os.kill(pid, signal.SIGTERM)  # as `stop_nodes` does, by its pid file
        wait_until(
            "the dropped node reaped", lambda: not Path(f"/proc/{pid}").exists(), WAIT_S, 0.02
        )
    finally:
        other.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
