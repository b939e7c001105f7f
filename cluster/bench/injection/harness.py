"""Running the suites on a live cluster (docs/injection.md, "Method").

Every run — one user task with one injection task, or with none — gets a fresh agent and
a fresh helper (the sub-agent a run may delegate to), registered for the suite's
principal with the suite's policy, and a fresh copy of the user's environment with the
injection planted in every resource an attacker can write. A fresh agent is a fresh
denial latch: one run's refusals never decide another's.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nacl.signing import SigningKey

from quorumgate.bench.injection.agent import (
    CONFIRMED,
    RAN,
    Principal,
    ScriptedAgent,
    Trace,
)
from quorumgate.bench.injection.model import INJECTION_MARKER, InjectionTask, Suite, World
from quorumgate.bench.injection.policy import helper_mandate, suite_mandate, suite_sets
from quorumgate.bench.injection.suites import TOOLS
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.sync import SyncClient


@dataclass(frozen=True)
class RunResult:
    """One run, as the report counts it."""

    suite: str
    user_task: str
    injection: str | None  # None: the user task alone
    kind: str | None
    completed: bool  # the user task's check holds at the end
    user_calls: int
    user_calls_refused: int  # the user's own calls that did not run
    refusal_reasons: tuple[str, ...]  # their reason codes (docs/engine.md, "Verdicts")
    user_confirmations: int  # cards the principal confirmed (the user's calls)
    cards_refused: int
    reached: bool  # the agent read the injection
    attack_outcomes: tuple[str, ...]  # per attack call: ran, confirmed, refused_at_card, denied
    attack_reasons: tuple[str, ...]  # the reason codes of the refused ones
    through: bool  # an attack call ran (without a card, or on a card for the user's call)
    effect: bool  # the attacker's goal holds at the end


def _key(seed: int, *names: str) -> SigningKey:
    return SigningKey(hashlib.sha256("/".join((str(seed), *names)).encode()).digest())


def _planted(world: World, suite: Suite, injection: InjectionTask) -> World:
    text = f"\n{INJECTION_MARKER} {injection.goal} </INFORMATION>"
    for slot in suite.slots:
        if slot in world.files:
            world.files[slot] += text
        if slot in world.web:
            world.web[slot] += text
    return world


class Harness:
    """The owner's client on a live cluster, the suites' principals and tools."""

    def __init__(self, spec: ClusterSpec, owner: SyncClient, seed: int = 0) -> None:
        self.spec, self.owner, self.seed = spec, owner, seed
        self.principals: dict[str, SyncClient] = {}
        self.serial = 0

    def register_tools(self) -> None:
        for name, spec in TOOLS.items():
            self.owner.register_tool(tool_spec(name, **spec))

    def principal(self, suite: Suite) -> SyncClient:
        if suite.principal not in self.principals:
            key = _key(self.seed, "principal", suite.principal)
            principal_id = f"{suite.principal}-{self.seed}"
            self.owner.register_principal(principal_id, bytes(key.verify_key))
            self.principals[suite.principal] = self.owner.with_key(key)
        return self.principals[suite.principal]

    def _agents(self, suite: Suite) -> tuple[str, SyncClient, SyncClient]:
        """A fresh agent with the suite's policy (its id and client), and its helper (same
        tools, no rules)."""
        self.serial += 1
        principal = self.principal(suite)
        principal_id = f"{suite.principal}-{self.seed}"
        clients, agent_ids = [], []
        for role in ("agent", "helper"):
            key = _key(self.seed, suite.name, role, str(self.serial))
            agent_id = f"{suite.name}-{role}-{self.seed}-{self.serial}"
            self.owner.register_agent(agent_id, bytes(key.verify_key), principal=principal_id)
            mandate = suite_mandate(suite) if role == "agent" else helper_mandate(suite)
            self.owner.set_mandate(agent_id, mandate)
            if role == "agent":
                for name, entries in suite_sets(suite).items():
                    principal.set_entries(agent_id, name, entries)
            clients.append(self.owner.with_key(key))
            agent_ids.append(agent_id)
        return agent_ids[0], clients[0], clients[1]

    def run(self, suite: Suite, task_name: str, injection_name: str | None) -> RunResult:
        task = next(t for t in suite.user_tasks if t.name == task_name)
        injection = next((i for i in suite.injection_tasks if i.name == injection_name), None)
        world = suite.world() if injection is None else _planted(suite.world(), suite, injection)
        agent_id, agent, helper = self._agents(suite)
        principal = Principal(self.principal(suite))
        run_id = f"{suite.name}-{task.name}-{injection_name or 'none'}"
        scripted = ScriptedAgent(agent, helper, principal, agent_id, run_id, world)
        trace = scripted.run(task, injection)
        return _result(suite, task.name, injection, world, trace)

    def runs(self, suites: Sequence[Suite]) -> Iterator[RunResult]:
        """Every user task alone and with every injection task, in an order `seed` picks."""
        plan = [
            (suite, task.name, inj)
            for suite in suites
            for task in suite.user_tasks
            for inj in [None, *(i.name for i in suite.injection_tasks)]
        ]
        random.Random(self.seed).shuffle(plan)
        for suite, task_name, injection_name in plan:
            yield self.run(suite, task_name, injection_name)


def _result(
    suite: Suite, task: str, injection: InjectionTask | None, world: World, trace: Trace
) -> RunResult:
    user_task = next(t for t in suite.user_tasks if t.name == task)
    outcomes = tuple(outcome for _, outcome in trace.attack)
    return RunResult(
        suite=suite.name,
        user_task=task,
        injection=None if injection is None else injection.name,
        kind=None if injection is None else injection.kind,
        completed=user_task.done(world),
        user_calls=len(trace.user),
        user_calls_refused=sum(1 for _, o in trace.user if o not in (RAN, CONFIRMED)),
        refusal_reasons=tuple(trace.reasons),
        user_confirmations=sum(1 for _, o in trace.user if o == CONFIRMED),
        cards_refused=trace.cards_refused,
        reached=trace.reached,
        attack_outcomes=outcomes,
        attack_reasons=tuple(trace.attack_reasons),
        through=any(o in (RAN, CONFIRMED) for o in outcomes),
        effect=injection is not None and injection.effect(world),
    )
