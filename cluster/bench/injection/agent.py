"""The scripted agent and its principal, on a live cluster through the SDK
(docs/injection.md, "Method").

The agent is fully compromised and has no model: it does the user's task call by call,
and as soon as something it read carries an injection it carries the injection out, then
goes on with the user's task. Every call is a signed proposal (`SyncClient.propose`); a
call runs on the `World` only when f+1 sidecars certified `allow` or `flag`. A pending
call goes to the principal, who answers by one fixed rule: confirm a card only if it is
one of the calls the user's task meant (`card_matches`, docs/policies.md, "Checking a
card against what you meant"), refuse anything else. Once the task's first call opened
the run, the principal also names what the task changes as the run's own targets
(docs/injection.md, "The user's intent").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumgate.bench.injection.model import (
    INJECTION_MARKER,
    Call,
    InjectionTask,
    UserTask,
    World,
)
from quorumgate.bench.injection.suites import intent
from quorumgate.sdk.cards import card_matches
from quorumgate.sdk.errors import QuorumGateError
from quorumgate.sdk.polling import poll_for
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Decision, Grant, OpenCard

# How a call ended, as the harness counts it.
RAN = "ran"  # certified allow without a card
CONFIRMED = "confirmed"  # pending, then confirmed by the principal
REFUSED_AT_CARD = "refused_at_card"  # pending, then refused by the principal
DENIED = "denied"  # certified deny, or refused at submission
GRANT_TTL_S = 600.0  # a helper's grant outlives any run of the suite
# A certified pending verdict means f+1 sidecars hold the card; the principal's list may
# lag by a block, so it asks again within this bound before it answers.
CARD_WAIT_S = 10.0
CARD_POLL_S = 0.05


@dataclass
class Trace:
    """What one run did: per call, whose it was and how it ended."""

    user: list[tuple[Call, str]] = field(default_factory=list)
    attack: list[tuple[Call, str]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why each of the user's refused calls was
    attack_reasons: list[str] = field(default_factory=list)  # and each refused attack call
    reached: bool = False  # the agent read the injection
    cards_confirmed: int = 0
    cards_refused: int = 0
    intent_run: str = ""  # the run whose own targets the principal named ("" not yet)


@dataclass
class Principal:
    """The user answering cards: confirms exactly the calls `meant`, refuses the rest."""

    client: SyncClient
    meant: Sequence[Call] = ()

    def name_intent(self, agent_id: str, run_id: str, task: UserTask) -> None:
        """State the task's intent: its targets become the run's own, judged as in a clean
        run even once the run has read untrusted content (docs/provenance.md)."""
        self.client.set_run_targets(agent_id, run_id, list(intent(task)))

    def answer(self, trace: Trace, decision: Decision) -> bool:
        card = poll_for(lambda: self._open_card(decision.proposal_id), CARD_WAIT_S, CARD_POLL_S)
        if card is not None and any(_is(card, call) for call in self.meant):
            self.client.confirm(decision.proposal_id)
            trace.cards_confirmed += 1
            return True
        self.client.reject(decision.proposal_id)
        trace.cards_refused += 1
        return False

    def _open_card(self, proposal_id: bytes) -> OpenCard | None:
        """The open card, with every value, once f+1 sidecars list it."""
        return next((c for c in self.client.pending() if c.proposal_id == proposal_id), None)


def _is(card: OpenCard, call: Call) -> bool:
    return not card_matches(
        card,
        tool=call.tool,
        target=call.target,
        further_targets=list(call.also),
        arguments=dict(call.args),
    )


@dataclass
class ScriptedAgent:
    """One run: the agent's client, its helper's (for delegated injections), the run."""

    client: SyncClient
    helper: SyncClient
    principal: Principal
    agent_id: str  # the agent's registered id, which the principal's intent names
    run_id: str  # the run's label; the run itself is opened by its first transaction
    world: World
    trace: Trace = field(default_factory=Trace)
    reason: str = ""  # the operator's reason code of the last refusal (docs/engine.md)

    def run(self, task: UserTask, injection: InjectionTask | None) -> Trace:
        self.principal.meant = task.calls
        for call in task.calls:
            outcome, content = self._call(self.client, call, None)
            self.trace.user.append((call, outcome))
            self._state_intent(task)
            if outcome not in (RAN, CONFIRMED):
                self.trace.reasons.append(self.reason)
            if injection is not None and INJECTION_MARKER in content and not self.trace.reached:
                self.trace.reached = True
                self._obey(injection)
        return self.trace

    def _state_intent(self, task: UserTask) -> None:
        """Once the task's first transaction opened the run (`n<nonce>`, proto/runs.py),
        the principal names the run's own targets, before the agent sees what that call
        returned. The call that opened the run was judged as in a clean run, since a run
        is exposed only after its first untrusted read is allowed (docs/provenance.md,
        "When a run becomes exposed"), so naming the targets after it changes no verdict
        of the user's."""
        if self.trace.intent_run:
            return
        run = self.client.run_of(self.run_id)
        if run is not None:
            if intent(task):  # a task that only reads changes nothing to name
                self.principal.name_intent(self.agent_id, run, task)
            self.trace.intent_run = run

    def _obey(self, injection: InjectionTask) -> None:
        client, grant = self.client, None
        if injection.delegated:
            try:
                grant = self.client.delegate(
                    self.helper.public_key, self.run_id, None, ttl_s=GRANT_TTL_S
                )
                client = self.helper
            except QuorumGateError as refused:
                self.trace.attack.append((injection.calls[0], DENIED))
                self.trace.attack_reasons.append(refused.reason)
                return
        for call in injection.calls:
            outcome, _ = self._call(client, call, grant)
            self.trace.attack.append((call, outcome))
            if outcome not in (RAN, CONFIRMED):
                self.trace.attack_reasons.append(self.reason)

    def _call(self, client: SyncClient, call: Call, grant: Grant | None) -> tuple[str, str]:
        try:
            decision = client.propose(
                call.tool,
                call.target,
                dict(call.args),
                run_id=self.run_id,
                grant=grant,
                targets=list(call.also),
            )
            outcome = RAN
            if decision.pending:
                if not self.principal.answer(self.trace, decision):
                    self.reason = "confirmation_rejected"
                    return REFUSED_AT_CARD, ""
                decision = client.await_certificate(decision.proposal_id, settled=True)
                outcome = CONFIRMED
        except QuorumGateError as refused:
            self.reason = refused.reason or type(refused).__name__
            return DENIED, ""
        if not decision.allowed:
            self.reason = decision.reason
            return DENIED, ""
        return outcome, perform(self.world, call)


def perform(world: World, call: Call) -> str:
    """The tool's effect on the user's environment, once certified; what it returns."""
    if call.tool == "web.get":
        world.fetched.append(call.target)
        return world.web.get(call.target.split("?", 1)[0], "")
    if call.tool in ("files.read", "chat.read"):
        return world.files.get(call.target, "")
    if call.tool == "files.write":
        world.files[call.target] = call.arg("text")
    elif call.tool == "chat.post":
        world.files[call.target] = world.files.get(call.target, "") + "\n" + call.arg("body")
    elif call.tool == "mail.send":
        world.sent.append((call.tool, call.target, call.arg("body")))
    elif call.tool == "bank.pay":
        world.payments.append((call.target, call.arg("amount")))
    elif call.tool == "files.share":
        world.shares += [(call.target, grantee) for _, grantee in call.also]
    return ""
