"""The large-state preset (`quorumgate bench --state large`), built at a
small scale on a live cluster: every agent, mandate, grant and pending card it claims is
there, and nothing it submitted was refused. (The full preset is 10,100 agents, 10,000
grants and 5,000 cards; that takes a minute or two, a benchmark's time, not a test's.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumgate.bench import state
from quorumgate.ops.nodes import start_cluster, stop_nodes
from quorumgate.proto.clusterfile import init_cluster
from quorumgate.sdk.client import Client

pytestmark = pytest.mark.live


def test_the_preset_builds_the_state_it_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "STATE_AGENTS", 24)
    monkeypatch.setattr(state, "STATE_PARENTS", 3)
    monkeypatch.setattr(state, "STATE_PRINCIPALS", 3)
    monkeypatch.setattr(state, "STATE_GRANTS", 24)
    monkeypatch.setattr(state, "STATE_CARDS", 12)
    spec = init_cluster(tmp_path / "c", 4, capacities=state.STATE_CAPACITIES)
    procs = start_cluster(spec, list(range(4)))
    try:
        built = asyncio.run(state.fill_large_state(spec, lambda line: None))
        assert built["agents"] == 27 and built["grants"] == 24 and built["pending_cards"] == 12

        async def registry_agents() -> int:
            async with Client.as_owner(spec.directory) as owner:
                return len((await owner.registry()).agents)

        assert asyncio.run(registry_agents()) == 27
        applied = state.sidecar_metric(spec, 'qg_sidecar_verdicts_total{outcome="applied"')
        assert applied == 2 + 3 + 27 + 27 + 24  # tools, principals, agents, mandates, grants
    finally:
        stop_nodes(spec, list(range(4)))
        for proc in procs:
            proc.wait()
