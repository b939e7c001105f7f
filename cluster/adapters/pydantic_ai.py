"""Govern a PydanticAI agent's tools (docs/frameworks/pydantic-ai.md).

`governed(toolset, names={...}, targets={...})` returns a `WrapperToolset`, PydanticAI's
own hook for changing how a toolset's tools execute (the base of its
`ApprovalRequiredToolset`): its `call_tool` first proposes the call to the cluster and
calls the wrapped toolset only with a certificate (docs/sdk.md, "A governed tool").

A denial is the tool's return value, the fixed sentence and nothing else: PydanticAI's
`ToolFailed` would show the model `{"error": ...}` around it, and the sentence alone is
what every adapter shows (docs/architecture/0007-one-denial-sentence.md). A pending call
waits for the principal for at most `confirm_wait_s`; unanswered by then, it returns the
awaiting sentence, or with `defer=True` raises PydanticAI's `ApprovalRequired`, so the run
ends with `DeferredToolRequests` and the application resumes it once the principal has
answered (the framework's deferred-tools convention).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from quorumgate.adapters.judging import AWAITING_TEXT, CONFIRM_WAIT_S, Judge, acting_async
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import (
    ActionDenied,
    ConfirmationRequired,
    GovernedCall,
)
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Grant

__all__ = ["AWAITING_TEXT", "CONFIRM_WAIT_S", "PROPOSAL_METADATA", "GovernedToolset", "governed"]

# The key of the pending proposal's id (hex) in `DeferredToolRequests.metadata[call id]`.
PROPOSAL_METADATA = "quorumgate_proposal"
# Deferred cards a wrapper holds for resumption; past this the oldest is let go, and its
# call, if resumed, is proposed again (a new card), never run unjudged.
DEFERRED_HELD_MAX = 256


@dataclass(frozen=True)
class _Binding:
    """Whose calls these are: the caller's `agent_context` (client None), or this agent's."""

    client: Client | SyncClient | None
    run_id: str | None
    grant: Grant | bytes | None


# Not frozen: PydanticAI copies a wrapper with `dataclasses.replace` for each run, and its
# base class is a plain dataclass. `waiting` (pending cards by tool call id) is one dict
# shared by those copies, so a run resumed after `ApprovalRequired` finds its card.
@dataclass
class GovernedToolset(WrapperToolset[Any]):
    """The wrapped toolset's tools, each call judged by the cluster (module docstring)."""

    judges: Mapping[str, Judge] = field(default_factory=dict)
    binding: _Binding = _Binding(None, None, None)
    confirm_wait_s: float = CONFIRM_WAIT_S
    defer: bool = False
    waiting: dict[str, ConfirmationRequired] = field(default_factory=dict)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        judge = self.judges.get(name) or Judge.of(name, None, self.confirm_wait_s)
        bound = self.binding
        async with acting_async(bound.client, bound.run_id, bound.grant):
            return await self._judged(judge, name, tool_args, ctx, tool)

    async def _judged(
        self,
        judge: Judge,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        call_id = ctx.tool_call_id or ""
        try:
            outcome = await self._outcome(judge, tool_args, ctx, call_id)
        except ActionDenied:
            return DENIAL_TEXT  # the reason is for operators (ActionDenied.reason), never the model
        if isinstance(outcome, ConfirmationRequired):
            if not self.defer:
                return AWAITING_TEXT
            while len(self.waiting) >= DEFERRED_HELD_MAX:
                del self.waiting[next(iter(self.waiting))]
            self.waiting[call_id] = outcome
            raise ApprovalRequired(metadata={PROPOSAL_METADATA: outcome.proposal_id.hex()})
        certified = judge.certified(tool_args, outcome)
        return await self.wrapped.call_tool(name, certified, ctx, tool)

    async def _outcome(
        self, judge: Judge, tool_args: dict[str, Any], ctx: RunContext[Any], call_id: str
    ) -> GovernedCall | ConfirmationRequired:
        """The certified call, or the card still pending after the bounded wait. A call the
        application approved after `ApprovalRequired` waits for the card it deferred on: the
        application's approval never stands in for the principal's confirmation, and
        changed arguments do not match the card (`confirmation_mismatch`)."""
        held = self.waiting.pop(call_id, None) if ctx.tool_call_approved else None
        pending = held or await judge.propose(tool_args)
        if isinstance(pending, GovernedCall):
            return pending
        call = await judge.confirmed(pending, tool_args, self.confirm_wait_s)
        return pending if call is None else call


def governed(
    toolset: AbstractToolset[Any],
    *,
    names: Mapping[str, str] | None = None,
    targets: Mapping[str, str] | None = None,
    envelopes: Mapping[str, tuple[str, ...]] | None = None,
    client: Client | SyncClient | None = None,
    run_id: str | None = None,
    grant: Grant | bytes | None = None,
    confirm_wait_s: float = CONFIRM_WAIT_S,
    defer: bool = False,
) -> GovernedToolset:
    """`toolset` with every call judged by the cluster. `names`: the registered QuorumGate
    tool of each PydanticAI tool (default: the tool's own name); `targets`: the argument
    that is each tool's target (default: none); `envelopes`: the arguments of each tool
    that carry envelope handles. With `client` (and `run_id`, `grant`), the
    calls are that agent's; without, the caller's `agent_context`. `defer`: an unanswered
    pending call raises `ApprovalRequired` instead of returning the awaiting sentence."""
    names, targets, sealed = dict(names or {}), dict(targets or {}), dict(envelopes or {})
    if confirm_wait_s < 0:
        raise ValueError("confirm_wait_s must not be negative")
    judges = {
        tool: Judge.of(
            names.get(tool, tool), targets.get(tool), confirm_wait_s, tuple(sealed.get(tool, ()))
        )
        for tool in sorted(set(names) | set(targets) | set(sealed))
    }
    return GovernedToolset(
        wrapped=toolset,
        judges=judges,
        binding=_Binding(client, run_id, grant),
        confirm_wait_s=confirm_wait_s,
        defer=defer,
    )
