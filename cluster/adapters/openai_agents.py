"""Govern an OpenAI Agents SDK agent's function tools (docs/frameworks/openai-agents.md).

`governed(tool, target="url")` returns a copy of a `FunctionTool` whose `on_invoke_tool`
first proposes the call to the cluster and calls the original invoker only with a
certificate (docs/sdk.md, "A governed tool"). The Agents SDK's documented convention for
a tool error the model should see is a returned string (`FunctionTool.on_invoke_tool`),
so a denial is returned as the fixed sentence and nothing else reaches the model.

A pending call (a user_confirm tool) waits for the principal's answer for at most
`confirm_wait_s`; unanswered by then, the tool's output says the call awaits approval and
the turn goes on without running it. Which agent and run: the `agent_context` around
`Runner.run`, or the `client`/`run_id`/`grant` given here (a sub-agent under a grant).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import (
    ActionDenied,
    ConfirmationRequired,
    Gate,
    GovernedCall,
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


@dataclasses.dataclass(frozen=True)
class _Options:
    tool: str
    target: str | None
    client: Client | SyncClient | None
    run_id: str | None
    grant: Grant | bytes | None
    confirm_wait_s: float


def governed(
    tool: FunctionTool,
    *,
    name: str | None = None,
    target: str | None = None,
    client: Client | SyncClient | None = None,
    run_id: str | None = None,
    grant: Grant | bytes | None = None,
    confirm_wait_s: float = CONFIRM_WAIT_S,
) -> FunctionTool:
    """A copy of `tool` judged by the cluster on each call. `name`: the registered
    QuorumGate tool (default: the tool's own name); `target`: the argument that is its
    target. With `client` (and `run_id`, `grant`), the calls are that agent's; without,
    the caller's `agent_context`."""
    if confirm_wait_s < 0:
        raise ValueError("confirm_wait_s must not be negative")
    options = _Options(name or tool.name, target, client, run_id, grant, confirm_wait_s)
    gate, waiter = Gate(), Gate()
    gate.tool(options.tool, target=target)
    waiter.tool(options.tool, target=target, deadline_s=CONFIRM_POLL_S)
    inner = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        parsed = json.loads(arguments or "{}")
        if options.client is None:
            return await _judged((gate, waiter), options, ctx, parsed, inner)
        run_id = options.run_id or _run_label(ctx)
        async with agent_context_async(options.client, run_id=run_id, grant=options.grant):
            return await _judged((gate, waiter), options, ctx, parsed, inner)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def _run_label(ctx: ToolContext[Any]) -> str:
    binding = current_binding()
    if binding is not None:
        return binding.run_id
    raise ValueError("governed(...): give run_id= or call inside agent_context")


async def _judged(
    gates: tuple[Gate, Gate],
    options: _Options,
    ctx: ToolContext[Any],
    parsed: dict[str, Any],
    inner: Any,
) -> Any:
    try:
        call = await _authorize(gates, options, parsed)
    except ActionDenied:
        return DENIAL_TEXT  # the reason is for operators (ActionDenied.reason), never the model
    if call is None:
        return AWAITING_TEXT
    if options.target is not None and call.canonical_target is not None:
        parsed = {**parsed, options.target: call.canonical_target}  # the certified spelling
    return await inner(ctx, json.dumps(parsed))


async def _authorize(
    gates: tuple[Gate, Gate], options: _Options, parsed: dict[str, Any]
) -> GovernedCall | None:
    """The certified call; None when the principal did not answer within the wait (each
    ask for the confirmed certificate lasts `CONFIRM_POLL_S`)."""
    gate, waiter = gates
    try:
        return await gate.aauthorize(options.tool, parsed)
    except ConfirmationRequired as pending:
        stop = time.monotonic() + options.confirm_wait_s
        while True:
            try:
                with resume_confirmed(pending):
                    return await waiter.aauthorize(options.tool, parsed)
            except ConfirmationRequired:
                if time.monotonic() >= stop:
                    return None
