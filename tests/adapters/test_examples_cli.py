"""The framework examples from the command line, as docs/frameworks/README.md tells a
developer to run them: a cluster started by `quorumgate init` and `quorumgate up --detach`
in a directory, then `python -m quorumgate.examples.<name>_example --dir DIR` as its own
process, one after another against the same cluster. Each prints the verdicts the model
read: the fetched invoice, then the fixed sentence for the injected post."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumgate.examples.invoice_agent import INJECTION
from quorumgate.ops.live import cluster_pids
from quorumgate.proto.model import DENIAL_TEXT

CLI_TIMEOUT_S = 60.0  # one command: init, up (until the cluster serves), down
EXAMPLE_TIMEOUT_S = 90.0  # one example: its framework's import, registration and the run
_SCRIPT = Path(sys.executable).parent / "quorumgate"
QUORUMGATE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "quorumgate.cli"]
EXAMPLES = ("openai_agents_example", "langgraph_example", "pydantic_ai_example")


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster started the way a developer starts one; stopped with `quorumgate down`,
    and any replica or sidecar still running for it killed, whether the tests passed."""
    directory = tmp_path_factory.mktemp("cli") / "c4"
    try:
        for command in (["init", "--nodes", "4"], ["up", "--detach"]):
            done = _run([*QUORUMGATE, *command, "--dir", str(directory)], CLI_TIMEOUT_S)
            assert done.returncode == 0, done.stderr
        yield directory
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _run([*QUORUMGATE, "down", "--dir", str(directory)], CLI_TIMEOUT_S)
        for pid in cluster_pids(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("example", EXAMPLES)
def test_an_example_runs_from_the_command_line_against_a_started_cluster(
    cluster_dir: Path, example: str
) -> None:
    argv = [sys.executable, "-m", f"quorumgate.examples.{example}", "--dir", str(cluster_dir)]
    done = _run(argv, EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"tool output c1: {INJECTION}",
        f"tool output c2: {DENIAL_TEXT}",
        "final: Invoice read.; forms sent: []",
    ]
