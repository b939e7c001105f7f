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
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from quorumgate.adapters.judging import AWAITING_TEXT, CONFIRM_WAIT_S, Judge, acting_async
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import ActionDenied
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Grant

__all__ = ["AWAITING_TEXT", "CONFIRM_WAIT_S", "governed"]


def governed(
    tool: FunctionTool,
    *,
    name: str | None = None,
    target: str | None = None,
    client: Client | SyncClient | None = None,
    run_id: str | None = None,
    grant: Grant | bytes | None = None,
    confirm_wait_s: float = CONFIRM_WAIT_S,
    envelopes: tuple[str, ...] = (),
) -> FunctionTool:
    """A copy of `tool` judged by the cluster on each call. `name`: the registered
    QuorumGate tool (default: the tool's own name); `target`: the argument that is its
    target; `envelopes`: the arguments that carry envelope handles. With `client` (and
    `run_id`, `grant`), the calls are that agent's; without, the caller's
    `agent_context`."""
    judge = Judge.of(name or tool.name, target, confirm_wait_s, tuple(envelopes))
    inner = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        parsed = json.loads(arguments or "{}")
        async with acting_async(client, run_id, grant):
            return await _judged(judge, ctx, parsed, inner)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


async def _judged(judge: Judge, ctx: ToolContext[Any], parsed: dict[str, Any], inner: Any) -> Any:
    try:
        call = await judge.authorize(parsed)
    except ActionDenied:
        return DENIAL_TEXT  # the reason is for operators (ActionDenied.reason), never the model
    if call is None:
        return AWAITING_TEXT
    return await inner(ctx, json.dumps(judge.certified(parsed, call)))
