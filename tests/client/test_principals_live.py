"""Split authority on a live cluster (docs/security/approvals.md): the proposer cannot confirm its
own call; its principal reads the open card with every value from f+1 sidecars, confirms
or rejects it, and the waiting agent learns the answer from its certificate."""

from __future__ import annotations

import pytest

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Mandate, RuleKind, TargetRule, ToolMode, ToolRules
from quorumgate.sdk.client import Refused, TransactionRejected
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent, new_principal, wait_until


def _pending_ids(client: SyncClient) -> set[bytes]:
    return {card.proposal_id for card in client.pending()}


def test_only_the_principal_answers_and_sees_every_value(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person_id, person_key = new_principal(owner)
    agent_id, agent_key = new_agent(owner, ["pay"], principal=person_id)
    with (
        SyncClient(cluster, agent_key) as agent,
        SyncClient(cluster, person_key) as person,
    ):
        pending = agent.propose(
            "pay",
            "https://bank.example/acct/1",
            {"amount": "120.00", "memo": "rent\nTo be confirmed by: agent"},
            run_id="principals-1",
        )
        assert pending.pending and pending.card is not None
        assert pending.card.confirmer == f"principal:{person_id}"
        # the proposer's own key is refused: an agent that could confirm its own call would
        # need no person at all
        with pytest.raises(TransactionRejected) as refused:
            agent.confirm(pending.proposal_id, pending.card.digest)
        assert refused.value.reason == "confirmer_not_authorized"
        assert agent.pending() == []  # an agent key answers no card
        assert pending.proposal_id not in _pending_ids(owner)  # nor the owner's, here
        # the principal's open card: f+1 sidecars agree, values read from the signed body
        [card] = [c for c in person.pending() if c.proposal_id == pending.proposal_id]
        assert card.card.digest == pending.card.digest
        assert len(card.sidecars) >= cluster.f + 1
        assert card.values == (("amount", "120.00"), ("memo", "rent\nTo be confirmed by: agent"))
        text = card.render()
        assert '  memo = "rent\\u{a}To be confirmed by: agent"' in text
        assert f"To be confirmed or rejected by: principal {person_id} only" in text
        confirmed = person.confirm(pending.proposal_id)  # digest from the open card
        assert (confirmed.outcome.value, confirmed.kind) == ("allow", "confirm")
        # the waiting agent learns the answer from its proposal's certificate
        after = agent.await_certificate(pending.proposal_id)
        assert (after.outcome.value, after.tx_id) == ("allow", confirmed.tx_id)
        wait_until(
            "the answered card left every sidecar's list",
            lambda: pending.proposal_id not in _pending_ids(person) or None,
        )
        assert agent_id  # registered under its own id, acting for the person


def test_the_principal_rejects_and_the_agent_is_denied(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person_id, person_key = new_principal(owner)
    other_id, other_key = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    with (
        SyncClient(cluster, agent_key) as agent,
        SyncClient(cluster, person_key) as person,
        SyncClient(cluster, other_key) as other,
    ):
        pending = agent.propose("pay", "https://bank.example/acct/2", run_id="principals-2")
        assert pending.pending and pending.card is not None
        assert other.pending() == []  # another principal sees nothing of it
        with pytest.raises(TransactionRejected) as refused:
            other.reject(pending.proposal_id, pending.card.digest)
        assert refused.value.reason == "confirmer_not_authorized"
        declined = person.reject(pending.proposal_id)
        assert (declined.outcome.value, declined.reason) == ("deny", "confirmation_rejected")
        after = agent.await_certificate(pending.proposal_id)
        assert (after.outcome.value, after.reason) == ("deny", "confirmation_rejected")
        with pytest.raises(TransactionRejected) as late:
            person.confirm(pending.proposal_id, pending.card.digest)
        assert late.value.reason == "unknown_proposal"
        assert other_id != person_id


def test_the_principal_adds_a_confirmed_payee_and_the_next_payment_runs_directly(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person_id, person_key = new_principal(owner)
    agent_id, agent_key = new_agent(owner, ["pay"], principal=person_id)
    rules = (
        ToolRules(
            "pay", (TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT), TargetRule(RuleKind.ANY))
        ),
    )
    owner.set_mandate(agent_id, Mandate(allowed_tools=("pay",), rules=rules))
    payee = "https://bank.example/acct/77"
    with (
        SyncClient(cluster, agent_key) as agent,
        SyncClient(cluster, person_key) as person,
    ):
        first = agent.propose("pay", payee, {"amount": "10"}, run_id="payees")
        assert first.pending
        assert person.confirm(first.proposal_id).outcome.value == "allow"
        with pytest.raises(Refused) as refused:  # the agent keeps no set: refused on arrival
            agent.set_entries(agent_id, "payees", [TargetRule(RuleKind.EXACT, payee)])
        assert refused.value.reason == "not_owner"
        added = person.set_entries(agent_id, "payees", [TargetRule(RuleKind.EXACT, payee)])
        assert added.outcome.value == "applied"
        again = agent.propose("pay", payee, {"amount": "10"}, run_id="payees")
        assert (again.outcome.value, again.reason) == ("allow", "ok")
        newcomer = agent.propose("pay", "https://bank.example/acct/99", run_id="payees")
        assert newcomer.pending  # what is new still goes to the person


def test_a_deputy_the_principal_names_answers_its_cards(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person_id, person_key = new_principal(owner)
    deputy_id, deputy_key = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    with (
        SyncClient(cluster, agent_key) as agent,
        SyncClient(cluster, person_key) as person,
        SyncClient(cluster, deputy_key) as deputy,
    ):
        pending = agent.propose("pay", "https://bank.example/acct/3", run_id="deputy")
        assert pending.pending and deputy.pending() == []
        # the principal names its deputy itself, with its own key
        named = person.register_principal(
            person_id, bytes(person_key.verify_key), deputies=[deputy_id]
        )
        assert named.outcome.value == "applied"
        [card] = [c for c in deputy.pending() if c.proposal_id == pending.proposal_id]
        assert "(or a deputy it names)" in card.render()
        confirmed = deputy.confirm(pending.proposal_id)
        assert (confirmed.outcome.value, confirmed.kind) == ("allow", "confirm")
