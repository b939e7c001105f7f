"""A scripted model for PydanticAI: its own `FunctionModel` answering from a list of turns
(a tool call, or a final text), recording what it was given, so a real agent run needs no
model and no network (the example and the adapter's tests)."""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel


def tool_call(name: str, call_id: str, **arguments: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, arguments, tool_call_id=call_id)])


def text(content: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content)])


class ScriptedModel(FunctionModel):
    """Answers turn i with `turns[i]`; `seen` keeps every message history it was given."""

    def __init__(self, turns: list[ModelResponse]) -> None:
        self.turns = list(turns)
        self.seen: list[list[ModelMessage]] = []
        super().__init__(self._answer, model_name="scripted")

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        return self.turns.pop(0)

    def tool_outputs(self) -> dict[str, str]:
        """Every tool result the model was shown, by call id, as the model reads it."""
        found: dict[str, str] = {}
        for messages in self.seen:
            for message in messages:
                for part in message.parts if isinstance(message, ModelRequest) else ():
                    if isinstance(part, ToolReturnPart):
                        found[part.tool_call_id] = part.model_response_str()
        return found
