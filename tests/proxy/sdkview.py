"""What the official SDKs make of a model API's answer: the tool calls `anthropic` (Messages)
and `openai` (Chat Completions, Responses) hand an agent, from a status, headers and body
chunks exactly as given. The SDKs run unchanged over an in-memory transport, so their own
SSE decoders, JSON parsing and delta assembly decide; the proxy's tests compare what the
proxy judged with this.

A call is `(id, name, arguments)`, arguments as the agent reads them (Anthropic's `input`,
OpenAI's arguments text parsed as JSON, or the text itself when it is not JSON). `complete`
holds the calls the SDK reports finished (a block's stop, a finished choice, a done item or
the completed response); `seen` every call in the SDK's final state, finished or not."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
import openai

Call = tuple[str, str, object]
REQUEST_MESSAGES = [{"role": "user", "content": "go"}]


@dataclass
class Seen:
    complete: list[Call] = field(default_factory=list)
    seen: list[Call] = field(default_factory=list)
    error: str | None = None  # the SDK raised (after yielding what it had)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    chunks: list[bytes]


def _transport(answer: Answer) -> httpx2.MockTransport:
    def handler(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            answer.status, headers=answer.headers, content=iter(list(answer.chunks))
        )

    return httpx2.MockTransport(handler)


def _parsed(text: object) -> object:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _guard(seen: Seen, body: Callable[[], None]) -> Seen:
    try:
        body()
    except Exception as err:  # the SDK refused: what it handed over before counts
        seen.error = type(err).__name__
    return seen


# ---------------------------------------------------------------------------- Anthropic


def _claude(answer: Answer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k", base_url="http://up.test", max_retries=0,
        http_client=httpx2.Client(transport=_transport(answer)),
    )  # fmt: skip


def _tool_uses(blocks: Any) -> Iterator[Call]:
    for block in blocks or []:
        if getattr(block, "type", None) == "tool_use":
            yield (str(block.id), str(block.name), block.input)


def anthropic_view(answer: Answer, *, stream: bool) -> Seen:
    seen = Seen()
    client = _claude(answer)
    args: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": REQUEST_MESSAGES}
    if not stream:

        def plain() -> None:
            calls = list(_tool_uses(client.messages.create(**args).content))
            seen.complete, seen.seen = calls, calls

        return _guard(seen, plain)
    holder: dict[str, Any] = {}

    def streamed() -> None:
        with client.messages.stream(**args) as events:
            holder["stream"] = events
            for event in events:
                if event.type == "content_block_stop":
                    seen.complete += _tool_uses([event.content_block])

    _guard(seen, streamed)
    snapshot = getattr(holder.get("stream"), "_MessageStream__final_message_snapshot", None)
    seen.seen = list(_tool_uses(getattr(snapshot, "content", None)))
    return seen


# ---------------------------------------------------------------------------- OpenAI


def _gpt(answer: Answer) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k", base_url="http://up.test/v1", max_retries=0,
        http_client=httpx2.Client(transport=_transport(answer)),
    )  # fmt: skip


def _chat_calls(message: Any) -> Iterator[Call]:
    for entry in getattr(message, "tool_calls", None) or []:
        function = getattr(entry, "function", None)
        if function is not None:
            yield (str(entry.id), str(function.name), _parsed(function.arguments))
        custom = getattr(entry, "custom", None)
        if custom is not None:
            yield (str(entry.id), str(custom.name), custom.input)
    legacy = getattr(message, "function_call", None)
    if legacy is not None:
        yield ("function_call", str(legacy.name), _parsed(legacy.arguments))


def chat_view(answer: Answer, *, stream: bool) -> Seen:
    seen = Seen()
    client = _gpt(answer)
    args: dict[str, Any] = {"model": "m", "messages": REQUEST_MESSAGES}
    if not stream:

        def plain() -> None:
            for choice in client.chat.completions.create(**args).choices:
                seen.complete += _chat_calls(choice.message)
            seen.seen = list(seen.complete)

        return _guard(seen, plain)
    holder: dict[str, Any] = {}

    def streamed() -> None:
        with client.chat.completions.stream(**args) as events:
            holder["stream"] = events
            for _ in events:
                pass

    _guard(seen, streamed)
    state = getattr(holder.get("stream"), "_state", None)
    snapshot = getattr(state, "_ChatCompletionStreamState__current_completion_snapshot", None)
    for choice in getattr(snapshot, "choices", None) or []:
        calls = list(_chat_calls(choice.message))
        seen.seen += calls
        if choice.finish_reason:
            seen.complete += calls
    return seen


_RUN_LOCALLY = ("function_call", "custom_tool_call", "computer_call", "local_shell_call",
                "shell_call", "apply_patch_call")  # fmt: skip


def _response_calls(items: Any) -> Iterator[Call]:
    for item in items or []:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            yield (str(item.call_id), str(item.name), _parsed(item.arguments))
        elif kind in _RUN_LOCALLY:
            yield (str(getattr(item, "call_id", "")), str(kind), getattr(item, "input", None))


def responses_view(answer: Answer, *, stream: bool) -> Seen:
    seen = Seen()
    client = _gpt(answer)
    args: dict[str, Any] = {"model": "m", "input": "go"}
    if not stream:

        def plain() -> None:
            seen.complete = list(_response_calls(client.responses.create(**args).output))
            seen.seen = list(seen.complete)

        return _guard(seen, plain)

    def streamed() -> None:
        with client.responses.stream(**args) as events:
            for event in events:
                if event.type == "response.output_item.done":
                    seen.complete += _response_calls([event.item])
                elif event.type == "response.completed":
                    seen.complete += _response_calls(event.response.output)
                    seen.seen += _response_calls(event.response.output)

    return _guard(seen, streamed)


VIEWS = {"anthropic": anthropic_view, "openai": chat_view, "responses": responses_view}
