"""`scripts/dev.py` runs the main job and the tests as a child process: a SIGTERM sent to
the script (a supervisor, `kill`) must reach the job, which stops what it started, and the
script must return the job's own exit status. Before, the script died alone and left the
job (and the job's cluster) running."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import polling

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
POLL_S = 0.05

# The job: says it is ready, then on SIGTERM writes what it got and exits 0, as a job
# that stops its cluster does. It ends by itself after a minute, so a failing test leaves
# nothing running.
JOB = """
import signal, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
def on_term(signum, frame):
    marker.write_text("stopped on SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
marker.write_text("ready")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
"""

# The script's forwarding, run in a process of its own as `dev.py` runs.
RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
import dev
sys.exit(dev.run_forwarding([sys.executable, "-c", sys.argv[2], sys.argv[3]]))
"""


def test_a_sigterm_to_the_dev_script_reaches_the_job_and_returns_its_status(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "job"
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(ROOT / "scripts"), JOB, str(marker)]
    )
    try:
        polling.wait_until(
            "the job ready",
            lambda: True if marker.exists() and marker.read_text() == "ready" else None,
            WAIT_S,
            POLL_S,
        )
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=WAIT_S) == 0
        assert marker.read_text() == "stopped on SIGTERM"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=WAIT_S)


def test_the_test_job_spreads_over_the_cores_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, modules whole (`loadscope`), on a machine with two or more cores; the
    caller's own `-n`, `--dist` or `-p no:xdist` wins, and one core gets no workers."""
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    spread = ["-n", "2", "--dist", "loadscope"]
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert dev.test_workers([]) == spread
    assert dev.test_workers(["tests/engine", "-k", "mandate"]) == spread
    for own in (["-n", "0"], ["-n0"], ["--numprocesses=3"], ["--dist", "load"], ["-p", "no:xdist"]):
        assert dev.test_workers(own) == [], own
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert dev.test_workers([]) == []
