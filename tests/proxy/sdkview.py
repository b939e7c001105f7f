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


_CURRENT: list[Answer] = []  # the answer the one in-memory transport gives next


def _handler(_: httpx2.Request) -> httpx2.Response:
    answer = _CURRENT[-1]
    return httpx2.Response(answer.status, headers=answer.headers, content=iter(list(answer.chunks)))


_CLIENTS: dict[str, Any] = {}  # one client of each SDK, made once (making one is slow)


def _client(kind: str, answer: Answer) -> Any:
    _CURRENT[:] = [answer]
    if kind not in _CLIENTS:
        http = httpx2.Client(transport=httpx2.MockTransport(_handler))
        if kind == "anthropic":
            _CLIENTS[kind] = anthropic.Anthropic(
                api_key="k", base_url="http://up.test", max_retries=0, http_client=http
            )
        else:
            _CLIENTS[kind] = openai.OpenAI(
                api_key="k", base_url="http://up.test/v1", max_retries=0, http_client=http
            )
    return _CLIENTS[kind]


def _text(value: object) -> str:
    """An id or a name as an agent compares it: absent (None) is empty."""
    return "" if value is None else str(value)


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
    client: anthropic.Anthropic = _client("anthropic", answer)
    return client


def _tool_uses(blocks: Any) -> Iterator[Call]:
    for block in _items(blocks):
        if getattr(block, "type", None) == "tool_use":
            yield (_text(getattr(block, "id", None)), _text(getattr(block, "name", None)),
                   getattr(block, "input", None))  # fmt: skip


def _items(value: Any) -> list[Any]:
    """A list the SDK built, or nothing (a shape the agent's code could not walk)."""
    return list(value) if isinstance(value, list) else []


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
    client: openai.OpenAI = _client("openai", answer)
    return client


def _chat_calls(message: Any) -> Iterator[Call]:
    for entry in _items(getattr(message, "tool_calls", None)):
        ident = _text(getattr(entry, "id", None))
        function = getattr(entry, "function", None)
        if function is not None and not isinstance(function, (str, int, float, list)):
            yield (
                ident,
                _text(getattr(function, "name", None)),
                _parsed(getattr(function, "arguments", None)),
            )
        custom = getattr(entry, "custom", None)
        if custom is not None and not isinstance(custom, (str, int, float, list)):
            yield (ident, _text(getattr(custom, "name", None)), getattr(custom, "input", None))
    legacy = getattr(message, "function_call", None)
    if legacy is not None and not isinstance(legacy, (str, int, float, list)):
        yield (
            "function_call",
            _text(getattr(legacy, "name", None)),
            _parsed(getattr(legacy, "arguments", None)),
        )


def chat_view(answer: Answer, *, stream: bool) -> Seen:
    seen = Seen()
    client = _gpt(answer)
    args: dict[str, Any] = {"model": "m", "messages": REQUEST_MESSAGES}
    if not stream:

        def plain() -> None:
            for choice in _items(client.chat.completions.create(**args).choices):
                seen.complete += _chat_calls(getattr(choice, "message", None))
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
    for choice in _items(getattr(snapshot, "choices", None)):
        calls = list(_chat_calls(getattr(choice, "message", None)))
        seen.seen += calls
        if getattr(choice, "finish_reason", None):
            seen.complete += calls
    return seen


_RUN_LOCALLY = ("function_call", "custom_tool_call", "computer_call", "local_shell_call",
                "shell_call", "apply_patch_call")  # fmt: skip


def _response_calls(items: Any) -> Iterator[Call]:
    for item in _items(items):
        kind = getattr(item, "type", None)
        ident = _text(getattr(item, "call_id", None))
        if kind == "function_call":
            yield (
                ident,
                _text(getattr(item, "name", None)),
                _parsed(getattr(item, "arguments", None)),
            )
        elif kind in _RUN_LOCALLY:
            yield (ident, str(kind), getattr(item, "input", None))


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
