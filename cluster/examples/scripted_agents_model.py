"""A scripted model for the OpenAI Agents SDK: the SDK's `Model` interface answering
from a list of turns (a tool call, or a final text), recording what it was given, so a
real `Runner` runs with no model and no network (the example and the adapter's tests)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def tool_call(name: str, call_id: str, **arguments: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", name=name, call_id=call_id, arguments=json.dumps(arguments)
    )


def text(content: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=content, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers turn i with `turns[i]`; `seen` keeps each turn's input items."""

    def __init__(self, turns: list[Any]) -> None:
        self.turns = list(turns)
        self.seen: list[Any] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.seen.append(input)
        return ModelResponse(output=[self.turns.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")

    def tool_outputs(self) -> dict[str, str]:
        """Every function-call output the model was shown, by call id."""
        found: dict[str, str] = {}
        for items in self.seen:
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    found[item["call_id"]] = str(item["output"])
        return found
