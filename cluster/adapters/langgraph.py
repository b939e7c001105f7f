"""Govern a LangChain tool, as LangGraph's `ToolNode` runs it (docs/frameworks/langgraph.md).

`governed(tool, target="url")` returns a `StructuredTool` with the tool's name,
description and argument schema whose body first proposes the call to the cluster and
runs the original tool only with a certificate (docs/sdk.md, "A governed tool"). A tool's
return value is what `ToolNode` puts in the `ToolMessage` the model reads, so a denial is
returned as the fixed sentence and nothing else reaches the model. A pending call waits
for the principal for at most `confirm_wait_s`, then says it awaits approval.

Arguments `ToolNode` injects (`InjectedState("field")`, `InjectedToolArg`,
`InjectedToolCallId`) are judged with the model's and reach the tool as certified: the
graph sets them, not the model, but state is written by nodes that read untrusted
content, and what the tool acts on is what the certificate must cover
(docs/frameworks/langgraph.md, "Injected arguments"). The whole state and the store
cannot be judged, so a tool that takes them is refused at wrapping.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langgraph.prebuilt import InjectedState, InjectedStore

from quorumgate.adapters.judging import (
    AWAITING_TEXT,
    CONFIRM_WAIT_S,
    Judge,
    acting,
    acting_async,
)
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import ActionDenied
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
    envelopes: tuple[str, ...] = (),
) -> StructuredTool:
    """A copy of `tool` judged by the cluster on each call. `name`: the registered
    QuorumGate tool (default: the tool's own name); `target`: the argument that is its
    target; `envelopes`: the arguments that carry envelope handles. With `client` (and
    `run_id`, `grant`), the calls are that agent's; without, the caller's
    `agent_context`."""
    judge = Judge.of(name or tool.name, target, confirm_wait_s, tuple(envelopes))
    call_id = _call_id_param(tool)

    def run(**arguments: Any) -> Any:
        with acting(client, run_id, grant):
            return _judged(judge, tool, arguments, call_id)

    async def arun(**arguments: Any) -> Any:
        async with acting_async(client, run_id, grant):
            return await _ajudged(judge, tool, arguments, call_id)

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        infer_schema=False,
        return_direct=tool.return_direct,
    )


def _call_id_param(tool: BaseTool) -> str | None:
    """The parameter `ToolNode` fills with the call id, if any. Refuses a tool that takes
    the whole state or the store: neither is a value the cluster can judge, and the tool
    would act on them unjudged (docs/frameworks/langgraph.md, "Injected arguments")."""
    found: str | None = None
    for param, field in tool.get_input_schema().model_fields.items():
        for mark in field.metadata:
            whole_state = mark is InjectedState or (
                isinstance(mark, InjectedState) and not mark.field
            )
            if whole_state or mark is InjectedStore or isinstance(mark, InjectedStore):
                raise TypeError(
                    f"governed({tool.name!r}): argument {param!r} injects the whole state or "
                    "the store, which cannot be judged; inject the fields the tool acts on "
                    '(InjectedState("field"))'
                )
            if mark is InjectedToolCallId or isinstance(mark, InjectedToolCallId):
                found = param
    return found


def _certified_input(
    judge: Judge, tool: BaseTool, arguments: dict[str, Any], call: Any, call_id: str | None
) -> dict[str, Any]:
    """What the original tool is invoked with: the certified arguments, as the ToolCall
    LangChain requires of a tool that takes the call id."""
    certified = judge.certified(arguments, call)
    if call_id is None:
        return certified
    return {"type": "tool_call", "name": tool.name, "args": certified, "id": arguments[call_id]}


def _judged(judge: Judge, tool: BaseTool, arguments: dict[str, Any], call_id: str | None) -> Any:
    try:
        call = judge.authorize_blocking(arguments)
    except ActionDenied:
        return DENIAL_TEXT  # the reason is for operators (ActionDenied.reason), never the model
    if call is None:
        return AWAITING_TEXT
    return tool.invoke(_certified_input(judge, tool, arguments, call, call_id))


async def _ajudged(
    judge: Judge, tool: BaseTool, arguments: dict[str, Any], call_id: str | None
) -> Any:
    try:
        call = await judge.authorize(arguments)
    except ActionDenied:
        return DENIAL_TEXT
    if call is None:
        return AWAITING_TEXT
    return await tool.ainvoke(_certified_input(judge, tool, arguments, call, call_id))
