"""The PydanticAI example (examples/pydantic_ai_example.py) on a live cluster: the fetch runs,
the injected post is refused and the model reads the fixed sentence only."""

from __future__ import annotations

from quorumgate.examples import pydantic_ai_example as example
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.sync import SyncClient


async def test_the_examples_injected_post_is_refused(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    lines: list[str] = []
    outputs = await example.run_example(cluster, say=lines.append)
    assert outputs == {"c1": example.INJECTION, "c2": DENIAL_TEXT}
    assert example.SENT == []
    assert lines[-1] == "final: Invoice read.; forms sent: []"
