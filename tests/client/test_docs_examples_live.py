"""The SDK guide's example, run as written against a live cluster.

`tests/layout/test_docs.py` checks that every Python block in the docs compiles and imports
names that exist; this runs the one a newcomer copies first (docs/sdk.md, "A governed
tool") for real. Only the two paths it names are pointed at the test's cluster and key
file, and `operator_log`, the one name it leaves to the reader, is given: with a mandate
that allows the tool, the body runs on a certificate and nothing reaches the operator's
log; with one that does not, the agent sees the fixed sentence and the operator the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.keys import generate_key
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def sdk_example() -> str:
    (block, *_) = FENCE.findall((ROOT / "docs" / "sdk.md").read_text())
    assert 'SyncClient.from_files("run/c4", "agent.key")' in block, "the example changed"
    return block


def run_example(cluster: ClusterSpec, key_file: Path) -> list[str]:
    """The example as written, with its cluster directory and key file pointed at ours;
    returns what it handed `operator_log`."""
    source = sdk_example().replace('"run/c4"', repr(str(cluster.directory)))
    source = source.replace('"agent.key"', repr(str(key_file)))
    logged: list[str] = []
    namespace: dict[str, object] = {"operator_log": logged.append, "__name__": "docs_example"}
    exec(compile(source, "docs/sdk.md", "exec"), namespace)
    return logged


@pytest.fixture(scope="module")
def files_tool(owner: SyncClient) -> str:
    owner.register_tool(tool_spec("files.write", "direct", schemes=["file"]))
    return "files.write"


def test_the_sdk_example_runs_its_tool_with_a_certificate(
    cluster: ClusterSpec, owner: SyncClient, files_tool: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "agent.key"
    key = generate_key(key_file)
    agent, _ = new_agent(owner, [files_tool], key=key)
    assert agent
    assert run_example(cluster, key_file) == []


def test_the_sdk_example_shows_the_agent_the_sentence_and_the_operator_the_reason(
    cluster: ClusterSpec, owner: SyncClient, files_tool: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "agent.key"
    key = generate_key(key_file)
    new_agent(owner, ["web.get"], key=key)  # a mandate without the example's tool
    logged = run_example(cluster, key_file)
    assert len(logged) == 1
    assert logged[0] and logged[0] != DENIAL_TEXT
