"""Govern a LangChain tool, as LangGraph's `ToolNode` runs it (docs/frameworks/langgraph.md).

`governed(tool, target="url")` returns a `StructuredTool` with the tool's name,
description and argument schema whose body first proposes the call to the cluster and
runs the original tool only with a certificate (docs/sdk.md, "A governed tool"). A tool's
return value is what `ToolNode` puts in the `ToolMessage` the model reads, so a denial is
returned as the fixed sentence and nothing else reaches the model. A pending call waits
for the principal for at most `confirm_wait_s`, then says it awaits approval.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from quorumgate.adapters.judging import AWAITING_TEXT, CONFIRM_WAIT_S, Judge
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import (
    ActionDenied,
    agent_context,
    agent_context_async,
    current_binding,
)
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Grant

__all__ = ["AWAITING_TEXT", "CONFIRM_WAIT_S", "governed"]


def governed(
    tool: BaseTool,
    *,
    name: str | None = None,
    target: str | None = None,
    client: Client | SyncClient | None = None,
    run_id: str | None = None,
    grant: Grant | bytes | None = None,
    confirm_wait_s: float = CONFIRM_WAIT_S,
) -> StructuredTool:
    """A copy of `tool` judged by the cluster on each call. `name`: the registered
    QuorumGate tool (default: the tool's own name); `target`: the argument that is its
    target. With `client` (and `run_id`, `grant`), the calls are that agent's; without,
    the caller's `agent_context`."""
    judge = Judge.of(name or tool.name, target, confirm_wait_s)

    def run(**arguments: Any) -> Any:
        if client is None:
            return _judged(judge, tool, arguments)
        with agent_context(client, run_id=run_id or _run_label(), grant=grant):
            return _judged(judge, tool, arguments)

    async def arun(**arguments: Any) -> Any:
        if client is None:
            return await _ajudged(judge, tool, arguments)
        async with agent_context_async(client, run_id=run_id or _run_label(), grant=grant):
            return await _ajudged(judge, tool, arguments)

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        infer_schema=False,
        return_direct=tool.return_direct,
    )


def _run_label() -> str:
    binding = current_binding()
    if binding is not None:
        return binding.run_id
    raise ValueError("governed(...): give run_id= or call inside agent_context")


def _judged(judge: Judge, tool: BaseTool, arguments: dict[str, Any]) -> Any:
    try:
        call = judge.authorize_blocking(arguments)
    except ActionDenied:
        return DENIAL_TEXT  # the reason is for operators (ActionDenied.reason), never the model
    if call is None:
        return AWAITING_TEXT
    return tool.invoke(judge.certified(arguments, call))


async def _ajudged(judge: Judge, tool: BaseTool, arguments: dict[str, Any]) -> Any:
    try:
        call = await judge.authorize(arguments)
    except ActionDenied:
        return DENIAL_TEXT
    if call is None:
        return AWAITING_TEXT
    return await tool.ainvoke(judge.certified(arguments, call))
