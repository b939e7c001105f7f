"""What a replica or sidecar process imports before it serves.

The live tests start a few hundred of these processes, and an operator's machine starts
them on every `up`: each spent about 0.6 s of CPU importing before it did anything
(docs/development.md, the test job's time). A module used on one path only is imported on
that path; this test keeps such a module out of a process's start, where it was taken out
for a measured reason:

- `rfc3986` and `idna` parse a target that is not already in canonical form (the
  engine's fast path takes the commonest, sidecar/engine/targets.py); their import cost a
  sidecar about 40 ms of CPU, `rfc3986` compiling its grammar's expressions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NOT_AT_START: dict[str, tuple[str, ...]] = {
    "quorumgate.replica.node": ("rfc3986", "idna"),
    "quorumgate.sidecar.node": ("rfc3986", "idna"),
}


def imported_by(module: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `module`."""
    probe = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("entry", sorted(NOT_AT_START))
def test_a_node_process_starts_without_what_only_one_path_needs(entry: str) -> None:
    loaded = imported_by(entry)
    early = sorted(
        name
        for name in NOT_AT_START[entry]
        if any(m == name or m.startswith(name + ".") for m in loaded)
    )
    assert not early, f"{entry} imports {early} at start"
