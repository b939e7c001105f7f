"""What every framework adapter does with a tool call (docs/frameworks/README.md): judge
it, and for a pending call wait a bounded time for the principal's answer. Framework-free,
so an adapter's extra is the only thing its framework needs.

Arguments named in `envelopes` travel as envelope handles (docs/sdk.md). Arguments the
call cannot carry (a raw value where a handle belongs, a value no argument can hold) are
refused like a denial: the model chose them, and the fixed sentence is all it is told;
nothing leaves the process (the reason, which names the argument and never its value, is
`ActionDenied.reason` for operators)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import (
    ActionDenied,
    ArgumentMappingError,
    ConfirmationRequired,
    Gate,
    GovernedCall,
    agent_context,
    agent_context_async,
    current_binding,
    resume_confirmed,
)
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Grant

# How long a pending call waits for the principal before the turn goes on without it.
CONFIRM_WAIT_S = 120.0
# How long one wait for the confirmed certificate lasts before asking again.
CONFIRM_POLL_S = 1.0
AWAITING_TEXT = "This action awaits the principal's approval; it has not run."


@dataclass(frozen=True)
class Judge:
    """One tool's gates: the first proposal, and the asks for its confirmed certificate."""

    tool: str
    target: str | None
    confirm_wait_s: float
    gate: Gate
    waiter: Gate

    @classmethod
    def of(
        cls,
        tool: str,
        target: str | None,
        confirm_wait_s: float,
        envelopes: tuple[str, ...] = (),
    ) -> Judge:
        if confirm_wait_s < 0:
            raise ValueError("confirm_wait_s must not be negative")
        gate, waiter = Gate(), Gate()
        gate.tool(tool, target=target, envelopes=envelopes)
        waiter.tool(tool, target=target, envelopes=envelopes, deadline_s=CONFIRM_POLL_S)
        return cls(tool, target, confirm_wait_s, gate, waiter)

    async def authorize(self, arguments: Mapping[str, Any]) -> GovernedCall | None:
        """The certified call (raises `ActionDenied`); None when the principal did not
        answer within `confirm_wait_s`."""
        first = await self.propose(arguments)
        if isinstance(first, ConfirmationRequired):
            return await self.confirmed(first, arguments, self.confirm_wait_s)
        return first

    async def propose(self, arguments: Mapping[str, Any]) -> GovernedCall | ConfirmationRequired:
        """The first proposal's outcome: the certified call, or the pending card (raises
        `ActionDenied`)."""
        try:
            return await self.gate.aauthorize(self.tool, arguments)
        except ConfirmationRequired as pending:
            return pending
        except ArgumentMappingError as err:
            raise ActionDenied(f"arguments: {err}") from None

    async def confirmed(
        self, pending: ConfirmationRequired, arguments: Mapping[str, Any], wait_s: float
    ) -> GovernedCall | None:
        """The confirmed certificate of `pending`, asked for until `wait_s` has passed
        (raises `ActionDenied` when the principal rejected it); None while unanswered."""
        stop = time.monotonic() + wait_s
        while True:
            try:
                with resume_confirmed(pending):
                    return await self.waiter.aauthorize(self.tool, arguments)
            except ConfirmationRequired:
                if time.monotonic() >= stop:
                    return None

    def authorize_blocking(self, arguments: Mapping[str, Any]) -> GovernedCall | None:
        """`authorize` for a synchronous tool (the binding's client may be a SyncClient)."""
        try:
            return self.gate.authorize(self.tool, arguments)
        except ArgumentMappingError as err:
            raise ActionDenied(f"arguments: {err}") from None
        except ConfirmationRequired as pending:
            stop = time.monotonic() + self.confirm_wait_s
            while True:
                try:
                    with resume_confirmed(pending):
                        return self.waiter.authorize(self.tool, arguments)
                except ConfirmationRequired:
                    if time.monotonic() >= stop:
                        return None

    def certified(self, arguments: Mapping[str, Any], call: GovernedCall) -> dict[str, Any]:
        """The arguments the body runs on: the target in the certified spelling."""
        if self.target is None or call.canonical_target is None:
            return dict(arguments)
        return {**arguments, self.target: call.canonical_target}


def acting_async(
    client: Client | SyncClient | None, run_id: str | None, grant: Grant | bytes | None
) -> contextlib.AbstractAsyncContextManager[object]:
    """Whose calls a governed tool proposes: with `client`, that agent's, in `run_id` (or
    the caller's run) under `grant`; without, the caller's `agent_context` as it stands."""
    if client is None:
        return contextlib.nullcontext()
    return agent_context_async(client, run_id=run_id or run_label(), grant=grant)


def acting(
    client: Client | SyncClient | None, run_id: str | None, grant: Grant | bytes | None
) -> contextlib.AbstractContextManager[object]:
    """`acting_async` for a framework that calls its tools synchronously."""
    if client is None:
        return contextlib.nullcontext()
    return agent_context(client, run_id=run_id or run_label(), grant=grant)


def run_label() -> str:
    """The run of the caller's `agent_context`, for an adapter given a client but no run."""
    binding = current_binding()
    if binding is not None:
        return binding.run_id
    raise ValueError("governed(...): give run_id= or call inside agent_context")
