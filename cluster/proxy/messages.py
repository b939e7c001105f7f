"""Anthropic Messages, read as the `anthropic` SDK reads it (its `_streaming.py` and the
`accumulate_event` of its message stream): the tool calls it hands an agent are the
`tool_use` blocks, each with its `input` object, or in a stream the `input_json_delta`
fragments of the block a `content_block_delta` names *by its position* in the blocks
started so far (or the start's `input` when no fragment came).

A `tool_use` block that is not released is replaced by a `tool_result` block
(`is_error: true`) carrying only the fixed sentence, or, with `DenialBlock.TEXT`, by a text
block with it (for SDKs that refuse a `tool_result` in an assistant message); a released
one carries the arguments `decide` returned; when every `tool_use` was withheld,
`stop_reason: tool_use` becomes `end_turn`. Anything the SDK would read otherwise than
the proxy (see docs/proxy.md) is `Unreadable`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.proxy.enforce import (
    Decide,
    DenialBlock,
    Outbox,
    Slot,
    ToolCall,
    Unreadable,
    decide_all,
    is_index,
    load_json,
    need,
)
from quorumgate.proxy.sse import SseEvent, dumps, frame

TOOL_USE = "tool_use"


def denial_block(tool_use_id: str, mode: DenialBlock) -> dict[str, Any]:
    if mode is DenialBlock.TEXT:
        return {"type": "text", "text": DENIAL_TEXT}
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "is_error": True,
        "content": [{"type": "text", "text": DENIAL_TEXT}],
    }


def _tool_use(block: dict[str, Any], where: str) -> tuple[str, str]:
    need(isinstance(block.get("id"), str), f"{where}: a tool_use block without a text id")
    need(isinstance(block.get("name"), str), f"{where}: a tool_use block without a text name")
    return block["id"], block["name"]


async def enforce_message(body: object, decide: Decide, mode: DenialBlock) -> int:
    """Rewrite a Messages response in place; returns how many calls were withheld."""
    need(isinstance(body, dict), "a message that is not a JSON object")
    assert isinstance(body, dict)
    content = body.get("content")
    need(content is None or isinstance(content, list), "content that is not a list")
    spots: list[tuple[int, ToolCall]] = []
    for i, block in enumerate(content or []):
        need(isinstance(block, dict) and isinstance(block.get("type"), str), "a bad block")
        if block["type"] == TOOL_USE:
            tool_id, name = _tool_use(block, "content")
            need(isinstance(block.get("input"), dict), "a tool_use input that is not an object")
            spots.append((i, ToolCall(tool_id, name, block["input"])))
    released = await decide_all([call for _, call in spots], decide)
    withheld = 0
    for (i, call), arguments in zip(spots, released, strict=True):
        if arguments is None:
            content[i] = denial_block(call.id, mode)
            withheld += 1
        else:
            content[i] = {**content[i], "input": arguments}
    if spots and withheld == len(spots) and body.get("stop_reason") == TOOL_USE:
        body["stop_reason"] = "end_turn"
    return withheld


@dataclass
class _Block:
    kind: str
    tool: ToolCall | None = None  # a tool_use block: its id and name (arguments unset)
    start_input: dict[str, Any] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)
    slot: Slot | None = None
    stopped: bool = False


class MessageStream:
    """Messages stream enforcement: `feed` each decoded event, send what it returns, in
    order; `finished` once the stream is over for the SDK (nothing after it is read)."""

    def __init__(self, decide: Decide, mode: DenialBlock) -> None:
        self.decide = decide
        self.mode = mode
        self.out = Outbox()
        self.started = False
        self.finished = False
        self.blocks: list[_Block] = []
        self.tool_blocks = 0
        self.withheld = 0

    async def feed(self, event: SseEvent) -> list[bytes]:
        # the SDK skips events without a name, pings and events without data, raises on
        # `error`, and reads every other event by its data's `type`, whatever its name
        if event.event is None or not event.data:
            return []
        if event.event == "ping":
            return [frame("ping", {"type": "ping"})]  # a keep-alive: at once, never held
        if event.event == "error":
            self.finished = True
            return [*self.out.flush(), _error_frame(event.data)]
        payload = load_json(event.data)
        typed = isinstance(payload, dict) and isinstance(payload.get("type"), str)
        need(typed, "an event without a type")
        kind = payload["type"]
        need(self.started or kind == "message_start", "an event before message_start")
        handler = self._handlers.get(kind)
        if handler is None:
            return self.out.flush()  # a kind the SDK does not assemble: not passed on
        await handler(self, payload)
        return self.out.flush()

    async def _message_start(self, payload: dict[str, Any]) -> None:
        need(not self.started, "a second message_start")
        message = payload.get("message")
        need(isinstance(message, dict), "a message_start without a message")
        # the SDK starts its message from this one, blocks and all: none may come here
        need(message.get("content") in (None, []), "a message_start that carries content")
        self.started = True
        self.out.put(frame("message_start", payload))

    async def _block_start(self, payload: dict[str, Any]) -> None:
        index, block = payload.get("index"), payload.get("content_block")
        # the SDK appends each started block, whatever its index says
        need(is_index(index) and index == len(self.blocks), "a block started out of order")
        need(isinstance(block, dict) and isinstance(block.get("type"), str), "a bad block")
        if block["type"] != TOOL_USE:
            self.blocks.append(_Block(block["type"]))
            self.out.put(frame("content_block_start", payload))
            return
        tool_id, name = _tool_use(block, "content_block_start")
        start_input = block.get("input", {})
        need(isinstance(start_input, dict), "a tool_use input that is not an object")
        slot = Slot()
        self.blocks.append(_Block(TOOL_USE, ToolCall(tool_id, name, None), start_input, slot=slot))
        self.tool_blocks += 1
        self.out.put(slot)

    def _block_at(self, payload: dict[str, Any]) -> _Block:
        index = payload.get("index")
        need(is_index(index) and index < len(self.blocks), "an event for a block not started")
        return self.blocks[index]

    async def _block_delta(self, payload: dict[str, Any]) -> None:
        block, delta = self._block_at(payload), payload.get("delta")
        need(isinstance(delta, dict) and isinstance(delta.get("type"), str), "a bad delta")
        if block.kind != TOOL_USE:
            self.out.put(frame("content_block_delta", payload))
            return
        # a tool's input is built from input_json_delta fragments only: any other delta
        # for it, or one after its stop (the SDK would still add it), cannot be accounted for
        need(not block.stopped, "a delta for a tool_use block after its stop")
        need(delta["type"] == "input_json_delta", "a delta of another kind for a tool_use block")
        part = delta.get("partial_json")
        need(isinstance(part, str), "an input_json_delta without text")
        try:
            self.out.count(len(part.encode("utf-8")))  # the SDK encodes it: so must this
        except UnicodeEncodeError:
            raise Unreadable("an input_json_delta that is not Unicode text") from None
        block.parts.append(part)

    async def _block_stop(self, payload: dict[str, Any]) -> None:
        block = self._block_at(payload)
        if block.kind != TOOL_USE:
            self.out.put(frame("content_block_stop", payload))
            return
        need(not block.stopped, "a second stop for a tool_use block")
        block.stopped = True
        await self._settle(block, payload["index"])

    async def _settle(self, block: _Block, index: int) -> None:
        assert block.tool is not None and block.slot is not None
        text = "".join(block.parts)
        try:
            found = load_json(text) if text else block.start_input
        except Unreadable:
            found = None
        call = ToolCall(block.tool.id, block.tool.name, found if isinstance(found, dict) else None)
        arguments = (await decide_all([call], self.decide))[0]
        if arguments is None:
            self.withheld += 1
            block.slot.frames = self._denial_frames(call.id, index)
            return
        start = {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": TOOL_USE, "id": call.id, "name": call.name, "input": {}},
        }
        delta = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": dumps(arguments)},
        }
        block.slot.frames = [
            frame("content_block_start", start),
            frame("content_block_delta", delta),
            frame("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]  # fmt: skip

    def _denial_frames(self, tool_use_id: str, index: int) -> list[bytes]:
        stop = frame("content_block_stop", {"type": "content_block_stop", "index": index})
        if self.mode is DenialBlock.TEXT:
            start = {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
            delta = {"type": "content_block_delta", "index": index,
                     "delta": {"type": "text_delta", "text": DENIAL_TEXT}}  # fmt: skip
            return [frame("content_block_start", start), frame("content_block_delta", delta), stop]
        start = {"type": "content_block_start", "index": index,
                 "content_block": denial_block(tool_use_id, DenialBlock.TOOL_RESULT)}  # fmt: skip
        return [frame("content_block_start", start), stop]

    async def _message_delta(self, payload: dict[str, Any]) -> None:
        need(isinstance(payload.get("delta"), dict), "a message_delta without a delta")

        def written() -> list[bytes]:  # when it leaves, every call before it is decided
            delta = payload["delta"]
            all_withheld = self.tool_blocks and self.withheld == self.tool_blocks
            if all_withheld and delta.get("stop_reason") == TOOL_USE:
                delta["stop_reason"] = "end_turn"
            return [frame("message_delta", payload)]

        self.out.put(written)

    async def _message_stop(self, payload: dict[str, Any]) -> None:
        need(all(b.stopped for b in self.blocks if b.kind == TOOL_USE), "a tool_use never stopped")
        self.finished = True
        self.out.put(frame("message_stop", payload))

    _handlers: ClassVar[dict[str, Callable[[MessageStream, dict[str, Any]], Awaitable[None]]]] = {
        "message_start": _message_start,
        "content_block_start": _block_start,
        "content_block_delta": _block_delta,
        "content_block_stop": _block_stop,
        "message_delta": _message_delta,
        "message_stop": _message_stop,
    }

    def close(self) -> list[bytes]:
        """The stream ended: a call still held was never complete, and is dropped with
        everything queued behind it."""
        self.out.drop()
        return []


def _error_frame(data: str) -> bytes:
    """The upstream's stream error, passed on in its own words when it is a JSON object."""
    try:
        body = load_json(data)
    except Unreadable:
        body = None
    if not isinstance(body, dict):
        body = {"type": "error", "error": {"type": "api_error", "message": "stream error"}}
    return frame("error", body)


def stream_error_frame(message: str) -> bytes:
    return frame("error", {"type": "error", "error": {"type": "api_error", "message": message}})
