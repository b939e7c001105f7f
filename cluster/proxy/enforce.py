"""The proxy's enforcement core (issue 17, items 2-3): every tool call a model response asks
for goes through `decide`, and only the calls it releases reach the agent. Pure of I/O:
the caller supplies `decide` (which proposes the call to the cluster) and moves the bytes.

- **Anthropic Messages**: a `tool_use` block that is not released is replaced by a
  `tool_result` block (`is_error: true`) carrying only the fixed sentence, or, with
  `DenialBlock.TEXT`, by a text block with the sentence (for SDKs that refuse a
  `tool_result` in an assistant message); when every `tool_use` was withheld,
  `stop_reason: tool_use` becomes `end_turn`.
- **OpenAI Chat Completions**: a `tool_calls` entry (or a legacy `function_call`) that is
  not released is removed, the fixed sentence is added to the message's text, and when
  none is left, `finish_reason: tool_calls` becomes `stop`.
- **Streams** (server-sent events): frames pass through as they arrive; only the frames of
  an unfinished tool call are held (and, below this module, at most one partial frame).
  The decision is taken when the call's arguments are complete (`content_block_stop`;
  the chunk that finishes an OpenAI choice, or `[DONE]`), and a stream that ends before
  that drops the held call: it is never released.

Nothing of a denial's reason reaches the agent: the sentence is all there is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import rfc8785

from quorumgate.proto import limits, names
from quorumgate.proto.model import DENIAL_TEXT, Argument, Proposal, RoleTarget
from quorumgate.proxy.config import AgentConfig, ToolMapping

SESSION_LABEL_PREFIX = "s-"


class DenialBlock(StrEnum):
    TOOL_RESULT = "tool_result"
    TEXT = "text"


@dataclass(frozen=True, repr=False)
class ToolCall:
    """One tool call a response asks for. `arguments` None: not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] | None

    def __repr__(self) -> str:
        return f"ToolCall(id={self.id!r}, name={self.name!r})"  # never the arguments


Decide = Callable[[ToolCall], Awaitable[bool]]  # True: release the call


class MappingError(ValueError):
    """A tool call that cannot become a proposal (its message names no value)."""


# ---------------------------------------------------------------------------- proposals


def _argument_text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return rfc8785.dumps(value).decode()  # one spelling for equal values (RFC 8785)
    except (rfc8785.CanonicalizationError, TypeError, RecursionError):
        raise MappingError("an argument that is not a JSON value") from None


def _target(value: object, scheme: str | None, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MappingError(f"{what}: a target must be text")
    if scheme and scheme != "file" and not value.lower().startswith(scheme + ":"):
        return f"{scheme}:{value}"
    return value


def build_proposal(mapping: ToolMapping, call: ToolCall, run_label: str) -> Proposal:
    """The proposal of a tool call under its mapping: the main target from its argument
    (with the scheme prefixed where the model left it out), further targets by role, and
    every other argument as text (JSON values as RFC 8785 text; a capability handle as a
    handle). Raises MappingError."""
    if call.arguments is None:
        raise MappingError("the tool input is not a JSON object")
    values = dict(call.arguments)
    target = _target(values.pop(mapping.target, None) if mapping.target else None,
                     mapping.scheme, "target")  # fmt: skip
    further: list[RoleTarget] = []
    for role, argument in mapping.roles:
        value = values.pop(argument, None)
        items = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise MappingError(f"{role}: targets must be text or a list of text")
        for item in items:
            further.append(RoleTarget(role, _target(item, None, role)))
    arguments: list[Argument] = []
    for name in sorted(values):
        if name in mapping.exclude or values[name] is None:
            continue
        value = values[name]
        if isinstance(value, str) and names.HANDLE_RE.fullmatch(value):
            arguments.append(Argument(name, handle=value))
        else:
            arguments.append(Argument(name, text=_argument_text(value)))
    if len(arguments) > limits.ARGUMENTS_MAX or len(further) > limits.TARGETS_PER_CALL_MAX:
        raise MappingError("more arguments or targets than a proposal takes")
    try:
        return Proposal(
            run_id=run_label,
            tool=mapping.tool,
            target=target,
            arguments=tuple(arguments),
            targets=tuple(further),
        )
    except ValueError:
        raise MappingError("a name or value too large for a proposal") from None


def session_label(agent: AgentConfig, body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The run label of a request's conversation (the latch bucket is the session, not the
    request): see the agents file's `session`. A run id `n<k>` passes as it is."""
    rule = agent.session
    if rule.startswith("header:"):
        value = headers.get(rule[len("header:") :])
        if value:
            if names.is_run_id(value) and value.startswith("n") and value[1:].isdigit():
                return value
            return SESSION_LABEL_PREFIX + _digest(value)
    elif rule == "metadata":
        metadata = body.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, dict) else body.get("user")
        if isinstance(value, str) and value:
            return SESSION_LABEL_PREFIX + _digest(value)
    return SESSION_LABEL_PREFIX + _digest(_conversation_head(body))


def _conversation_head(body: Mapping[str, Any]) -> object:
    """The system prompt and the messages up to and including the first user message."""
    messages = body.get("messages")
    head: list[object] = []
    if isinstance(messages, list):
        for message in messages:
            head.append(message)
            if isinstance(message, dict) and message.get("role") == "user":
                break
    return {"system": body.get("system"), "head": head}


def _digest(value: object) -> str:
    try:
        data = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, RecursionError):
        data = repr(value).encode()
    return hashlib.sha256(data).hexdigest()[:24]


async def _decide_all(calls: Sequence[ToolCall], decide: Decide) -> list[bool]:
    """Every call decided, concurrently; a decider that fails withholds."""
    results = await asyncio.gather(*(decide(c) for c in calls), return_exceptions=True)
    return [r is True for r in results]


def _input_object(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


# ---------------------------------------------------------------------------- Anthropic


def denial_block_anthropic(tool_use_id: str, mode: DenialBlock) -> dict[str, Any]:
    if mode is DenialBlock.TEXT:
        return {"type": "text", "text": DENIAL_TEXT}
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "is_error": True,
        "content": [{"type": "text", "text": DENIAL_TEXT}],
    }


async def enforce_anthropic(body: dict[str, Any], decide: Decide, mode: DenialBlock) -> int:
    """Rewrite a Messages response in place; returns how many calls were withheld."""
    content = body.get("content")
    if not isinstance(content, list):
        return 0
    spots = [
        (i, block)
        for i, block in enumerate(content)
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    calls = [
        ToolCall(str(b.get("id", "")), str(b.get("name", "")), _input_object(b.get("input")))
        for _, b in spots
    ]
    released = await _decide_all(calls, decide)
    withheld = 0
    for (i, block), ok in zip(spots, released, strict=True):
        if not ok:
            content[i] = denial_block_anthropic(str(block.get("id", "")), mode)
            withheld += 1
    if spots and withheld == len(spots) and body.get("stop_reason") == "tool_use":
        body["stop_reason"] = "end_turn"
    return withheld


# ---------------------------------------------------------------------------- OpenAI


def _openai_calls(message: dict[str, Any]) -> list[tuple[str, ToolCall]]:
    out: list[tuple[str, ToolCall]] = []
    for entry in message.get("tool_calls") or []:
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict):
            out.append(("tool_calls", ToolCall("", "", None)))
            continue
        out.append(("tool_calls", _openai_call(str(entry.get("id", "")), function)))
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        out.append(("function_call", _openai_call("function_call", legacy)))
    return out


def _openai_call(call_id: str, function: Mapping[str, Any]) -> ToolCall:
    raw = function.get("arguments")
    try:
        arguments = _input_object(json.loads(raw)) if isinstance(raw, str) and raw else {}
    except ValueError:
        arguments = None
    return ToolCall(call_id, str(function.get("name", "")), arguments)


def _with_denial(text: object) -> str:
    return DENIAL_TEXT if not isinstance(text, str) or not text else f"{text}\n{DENIAL_TEXT}"


async def enforce_openai(body: dict[str, Any], decide: Decide) -> int:
    """Rewrite a Chat Completions response in place; returns how many calls were withheld."""
    withheld = 0
    for choice in body.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        found = _openai_calls(message)
        if not found:
            continue
        released = await _decide_all([call for _, call in found], decide)
        if all(released):
            continue
        withheld += released.count(False)
        entries = list(message.get("tool_calls") or [])
        kept = [entry for entry, ok in zip(entries, released[: len(entries)], strict=True) if ok]
        if entries:
            if kept:
                message["tool_calls"] = kept
            else:
                message.pop("tool_calls")
        if found[-1][0] == "function_call" and not released[-1]:
            message.pop("function_call", None)
        message["content"] = _with_denial(message.get("content"))
        nothing_left = not kept and "function_call" not in message
        if nothing_left and choice.get("finish_reason") in ("tool_calls", "function_call"):
            choice["finish_reason"] = "stop"
    return withheld


# ---------------------------------------------------------------------------- SSE


class SseSplitter:
    """Cuts a byte stream into server-sent-event frames (each ends with a blank line),
    keeping at most one partial frame; frames keep their bytes exactly."""

    TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames = []
        while True:
            cut = min(
                ((i, t) for t in self.TERMINATORS if (i := self._buffer.find(t)) >= 0),
                default=None,
            )
            if cut is None:
                return frames
            end = cut[0] + len(cut[1])
            frames.append(self._buffer[:end])
            self._buffer = self._buffer[end:]

    @property
    def partial(self) -> bytes:
        return self._buffer


def parse_frame(frame: bytes) -> tuple[str, str]:
    """(event, data) of one SSE frame; several data lines are joined by a line feed."""
    event = ""
    data: list[str] = []
    for line in frame.decode("utf-8", "replace").splitlines():
        field_name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field_name == "event":
            event = value
        elif field_name == "data":
            data.append(value)
    return event, "\n".join(data)


def sse_frame(event: str | None, data: object) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass
class _HeldBlock:
    index: int
    id: str
    name: str
    start_input: object
    frames: list[bytes] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)


class AnthropicStream:
    """Messages stream enforcement: `feed` each frame, send what it returns, in order."""

    def __init__(self, decide: Decide, mode: DenialBlock) -> None:
        self.decide = decide
        self.mode = mode
        self.held: _HeldBlock | None = None
        self.queued: list[bytes] = []  # other frames that arrived while a call was held
        self.tool_blocks = 0
        self.withheld = 0

    async def feed(self, frame: bytes) -> list[bytes]:
        event, data = parse_frame(frame)
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            payload = None
        kind = payload.get("type") if isinstance(payload, dict) else event
        held = self.held
        if held is not None:
            index = payload.get("index") if isinstance(payload, dict) else None
            if kind == "content_block_delta" and index == held.index:
                delta = payload.get("delta") if isinstance(payload, dict) else None
                if isinstance(delta, dict) and isinstance(delta.get("partial_json"), str):
                    held.parts.append(delta["partial_json"])
                held.frames.append(frame)
                return []
            if kind == "content_block_stop" and index == held.index:
                held.frames.append(frame)
                return await self._settle(held)
            if kind == "ping":
                return [frame]
            self.queued.append(frame)
            return []
        if kind == "content_block_start" and isinstance(payload, dict):
            block = payload.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self.tool_blocks += 1
                self.held = _HeldBlock(
                    index=payload.get("index", -1),
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    start_input=block.get("input"),
                    frames=[frame],
                )
                return []
        if kind == "message_delta" and isinstance(payload, dict):
            delta = payload.get("delta")
            all_withheld = self.tool_blocks and self.withheld == self.tool_blocks
            if all_withheld and isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                delta["stop_reason"] = "end_turn"
                return [sse_frame(event or "message_delta", payload)]
        return [frame]

    async def _settle(self, held: _HeldBlock) -> list[bytes]:
        self.held = None
        text = "".join(held.parts)
        try:
            arguments = _input_object(json.loads(text)) if text else _input_object(held.start_input)
        except ValueError:
            arguments = None
        released = (await _decide_all([ToolCall(held.id, held.name, arguments)], self.decide))[0]
        if released:
            out = list(held.frames)
        else:
            self.withheld += 1
            out = self._denial_frames(held)
        # what arrived meanwhile goes through the same rules (a second call that started
        # before this one stopped is held and decided in its turn, never passed along)
        queued, self.queued = self.queued, []
        for frame in queued:
            out += await self.feed(frame)
        return out

    def _denial_frames(self, held: _HeldBlock) -> list[bytes]:
        start: dict[str, Any] = {"type": "content_block_start", "index": held.index}
        stop = {"type": "content_block_stop", "index": held.index}
        if self.mode is DenialBlock.TEXT:
            start["content_block"] = {"type": "text", "text": ""}
            delta = {
                "type": "content_block_delta",
                "index": held.index,
                "delta": {"type": "text_delta", "text": DENIAL_TEXT},
            }
            return [
                sse_frame("content_block_start", start),
                sse_frame("content_block_delta", delta),
                sse_frame("content_block_stop", stop),
            ]
        start["content_block"] = denial_block_anthropic(held.id, DenialBlock.TOOL_RESULT)
        return [sse_frame("content_block_start", start), sse_frame("content_block_stop", stop)]

    def close(self) -> list[bytes]:
        """The stream ended: a call still held was never complete, and is dropped."""
        self.held = None
        self.queued = []
        return []


@dataclass
class _OpenAICall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIStream:
    """Chat Completions stream enforcement: from the first chunk that carries a tool call,
    chunks are held until every choice with calls has finished (or `[DONE]`); then the
    calls are decided and the held chunks released, without the withheld calls."""

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.held: list[tuple[bytes, dict[str, Any]]] = []
        self.calls: dict[tuple[int, int], _OpenAICall] = {}
        self.open_choices: set[int] = set()
        self.withheld = 0

    async def feed(self, frame: bytes) -> list[bytes]:
        _, data = parse_frame(frame)
        if data.strip() == "[DONE]":
            return [*(await self._release()), frame]
        try:
            chunk = json.loads(data) if data else None
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            if self.held:
                self.held.append((frame, {}))
                return []
            return [frame]
        choices = [c for c in chunk.get("choices") or [] if isinstance(c, dict)]
        carries = False
        for choice in choices:
            index = choice.get("index", 0)
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            entries = list(delta.get("tool_calls") or [])
            if isinstance(delta.get("function_call"), dict):
                entries.append(
                    {"index": -1, "id": "function_call", "function": delta["function_call"]}
                )
            for entry in entries:
                if not isinstance(entry, dict):
                    continue
                carries = True
                self.open_choices.add(index)
                call = self.calls.setdefault((index, entry.get("index", 0)), _OpenAICall())
                call.id = call.id or str(entry.get("id") or "")
                function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
                call.name = call.name or str(function.get("name") or "")
                if isinstance(function.get("arguments"), str):
                    call.arguments.append(function["arguments"])
        if not carries and not self.held:
            return [frame]
        self.held.append((frame, chunk))
        for choice in choices:
            if choice.get("finish_reason") is not None:
                self.open_choices.discard(choice.get("index", 0))
        if not self.open_choices:
            return await self._release()
        return []

    async def _release(self) -> list[bytes]:
        if not self.held:
            return []
        keys = sorted(self.calls)
        calls = []
        for key in keys:
            text = "".join(self.calls[key].arguments)
            try:
                arguments = _input_object(json.loads(text)) if text else {}
            except ValueError:
                arguments = None
            calls.append(ToolCall(self.calls[key].id, self.calls[key].name, arguments))
        released = dict(zip(keys, await _decide_all(calls, self.decide), strict=True))
        held, self.held, self.calls, self.open_choices = self.held, [], {}, set()
        denied = [key for key, ok in released.items() if not ok]
        if not denied:
            return [frame for frame, _ in held]
        self.withheld += len(denied)
        return self._rewritten(held, released)

    def _rewritten(
        self, held: list[tuple[bytes, dict[str, Any]]], released: dict[tuple[int, int], bool]
    ) -> list[bytes]:
        renumber: dict[tuple[int, int], int] = {}
        for choice_index in sorted({c for c, _ in released}):
            kept = [
                k for k in sorted(released) if k[0] == choice_index and released[k] and k[1] >= 0
            ]
            renumber.update({key: n for n, key in enumerate(kept)})
        withheld_choices = {c for (c, _), ok in released.items() if not ok}
        kept_choices = {c for (c, _), ok in released.items() if ok}
        told: set[int] = set()
        out: list[bytes] = []
        for frame, chunk in held:
            if not chunk:
                out.append(frame)
                continue
            for choice in chunk.get("choices") or []:
                index = choice.get("index", 0)
                delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                if "tool_calls" in delta:
                    entries = []
                    for entry in delta.get("tool_calls") or []:
                        key = (index, entry.get("index", 0))
                        if released.get(key, False):
                            entries.append({**entry, "index": renumber[key]})
                    if entries:
                        delta["tool_calls"] = entries
                    else:
                        delta.pop("tool_calls")
                if "function_call" in delta and not released.get((index, -1), True):
                    delta.pop("function_call")
                finished = choice.get("finish_reason")
                if finished is not None and index in withheld_choices and index not in told:
                    told.add(index)
                    out.append(self._text_chunk(chunk, index))
                    if index not in kept_choices and finished in ("tool_calls", "function_call"):
                        choice["finish_reason"] = "stop"
            out.append(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
        for index in sorted(withheld_choices - told):  # no finishing chunk seen: say it anyway
            out.append(self._text_chunk(held[-1][1] or {}, index))
        return out

    @staticmethod
    def _text_chunk(template: Mapping[str, Any], index: int) -> bytes:
        chunk = {
            key: template[key] for key in ("id", "object", "created", "model") if key in template
        }
        chunk["choices"] = [
            {"index": index, "delta": {"content": DENIAL_TEXT}, "finish_reason": None}
        ]
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()

    def close(self) -> list[bytes]:
        """The stream ended without finishing its calls: they are dropped, never sent."""
        self.held, self.calls, self.open_choices = [], {}, set()
        return []
