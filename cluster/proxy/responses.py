"""OpenAI Responses (`POST /v1/responses`, what the OpenAI Agents SDK calls by default),
read as the `openai` SDK and the Agents SDK read it: the calls an agent runs are the
`function_call` output items (a name and arguments as JSON text) and the other items
that run on the agent's side (`custom_tool_call`, `computer_call`, `local_shell_call`,
`shell_call`, `apply_patch_call`, `mcp_approval_request`).

A response's calls can be read in several places of a stream: the item an
`output_item.added` starts, its `function_call_arguments.delta` fragments and `.done`,
the item of its `output_item.done`, and the `output` of the response that `completed`
(`incomplete`, `failed`) carries, which is where the Agents SDK takes them from. The
proxy holds a call's events from its `added` to its `done`, requires every copy to say
the same (or refuses the stream: `Unreadable`), decides it, and then sends it whole with
the arguments `decide` returned (added, one delta, done), and rewrites the final
response's `output` to match; a call that is not released becomes a message item with
the fixed sentence, there and in the final response. `sequence_number` is renumbered as
the events leave. Items that ran at the provider already (web search, file search, code
interpreter, image generation, MCP calls) are passed on: there is nothing left to
withhold. An item of any other kind is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.proxy.enforce import (
    Decide,
    Outbox,
    Released,
    Slot,
    ToolCall,
    Unreadable,
    arguments_of,
    decide_all,
    is_index,
    load_json,
    need,
)
from quorumgate.proxy.sse import SseEvent, dumps, frame

FUNCTION_CALL = "function_call"
CUSTOM_CALL = "custom_tool_call"
# items that ran at the provider, or say something: no call for the agent to run
PASSED_ITEMS = frozenset(
    {
        "message", "reasoning", "web_search_call", "file_search_call", "code_interpreter_call",
        "image_generation_call", "mcp_call", "mcp_list_tools",
    }
)  # fmt: skip
LIFECYCLE = frozenset({"response.created", "response.queued", "response.in_progress"})
FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _call_of(item: dict[str, Any]) -> ToolCall:
    """The call of a function_call or custom_tool_call item (the latter never released)."""
    need(isinstance(item.get("call_id"), str), "a call item without a text call_id")
    need(isinstance(item.get("name"), str), "a call item without a text name")
    if item["type"] == CUSTOM_CALL:
        return ToolCall(item["call_id"], item["name"], None)
    need(isinstance(item.get("arguments"), str), "function_call arguments that are not text")
    return ToolCall(item["call_id"], item["name"], arguments_of(item["arguments"]))


def _item_kind(item: object) -> str:
    need(isinstance(item, dict) and isinstance(item.get("type"), str), "an item without a type")
    assert isinstance(item, dict)
    kind: str = item["type"]
    known = kind in PASSED_ITEMS or kind in (FUNCTION_CALL, CUSTOM_CALL)
    need(known, "an item of a kind the proxy does not pass")
    return kind


def denial_item(call_id: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_qg_{call_id}"[:128],
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": DENIAL_TEXT, "annotations": []}],
    }


def _released_item(item: dict[str, Any], arguments: Released) -> dict[str, Any]:
    if arguments is None:
        return denial_item(item["call_id"])
    return {**item, "arguments": dumps(arguments)}


async def enforce_response(body: object, decide: Decide) -> int:
    """Rewrite a Responses response in place; returns how many calls were withheld."""
    need(isinstance(body, dict), "a response that is not a JSON object")
    assert isinstance(body, dict)
    output = body.get("output")
    need(output is None or isinstance(output, list), "output that is not a list")
    spots = [
        (i, item) for i, item in enumerate(output or []) if _item_kind(item) not in PASSED_ITEMS
    ]
    released = await decide_all([_call_of(item) for _, item in spots], decide)
    for (i, item), arguments in zip(spots, released, strict=True):
        output[i] = _released_item(item, arguments)
    return released.count(None)


@dataclass
class _Held:
    item: dict[str, Any]  # as added
    slot: Slot
    parts: list[str] = field(default_factory=list)
    done_arguments: str | None = None
    final: dict[str, Any] | None = None  # the item as done
    released: Released = None


class ResponseStream:
    """Responses stream enforcement: `feed` each decoded event, send what it returns, in
    order; `finished` once a final event (or an error) came: the SDKs read no further."""

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.out = Outbox()
        self.items: dict[int, str] = {}  # output_index -> kind, as added
        self.held: dict[int, _Held] = {}  # function and custom calls, by output_index
        self.decided: dict[str, _Held] = {}  # by call_id, for the final response
        self.sequence = 0
        self.finished = False
        self.withheld = 0
        self.response_id: str | None = None

    def _send(self, kind: str, payload: dict[str, Any]) -> bytes:
        if "sequence_number" in payload:
            payload["sequence_number"] = self.sequence
        self.sequence += 1
        return frame(kind, payload)

    async def feed(self, event: SseEvent) -> list[bytes]:
        need(not (event.event or "").startswith("thread."), "an Assistants event")
        if event.data.startswith("[DONE]"):
            self.finished = True  # the SDK stops here: what is still held never completes
            return []
        payload = load_json(event.data)
        need(isinstance(payload, dict), "an event that is not a JSON object")
        if payload.get("error") or payload.get("type") in ("error", "response.error"):
            self.finished = True
            return [*self.out.flush(), self._send("error", payload)]
        kind = payload.get("type")
        need(isinstance(kind, str), "an event without a type")
        handler = self._handlers.get(kind)
        if handler is not None:
            await handler(self, payload)
        else:
            self._other(kind, payload)
        return self.out.flush()

    def _put(self, kind: str, payload: dict[str, Any]) -> None:
        self.out.put(lambda: [self._send(kind, payload)])

    async def _lifecycle(self, payload: dict[str, Any]) -> None:
        response = payload.get("response")
        need(isinstance(response, dict), "a lifecycle event without a response")
        # the SDK starts its snapshot from this response, items and all: none may come here
        need(response.get("output") in (None, []), "a lifecycle response that carries output")
        if isinstance(response.get("id"), str):
            self.response_id = response["id"]
        self._put(payload["type"], payload)

    async def _added(self, payload: dict[str, Any]) -> None:
        index, item = payload.get("output_index"), payload.get("item")
        need(is_index(index) and index not in self.items, "an item added twice or unnumbered")
        kind = _item_kind(item)
        self.items[index] = kind
        if kind in PASSED_ITEMS:
            self._put("response.output_item.added", payload)
            return
        _call_of({**item, "arguments": item.get("arguments", "")})  # its fields are checked
        held = _Held(item, Slot())
        self.held[index] = held
        self.out.put(held.slot)

    def _held_at(self, payload: dict[str, Any]) -> _Held:
        index = payload.get("output_index")
        held = self.held.get(index) if is_index(index) else None  # type: ignore[arg-type]
        need(held is not None and held.final is None, "an event for a call that is not open")
        assert held is not None
        return held

    async def _arguments_delta(self, payload: dict[str, Any]) -> None:
        held = self._held_at(payload)
        need(held.item["type"] == FUNCTION_CALL, "arguments for a call of another kind")
        delta = payload.get("delta")
        need(isinstance(delta, str), "an arguments delta that is not text")
        self.out.count(len(delta))
        held.parts.append(delta)

    async def _arguments_done(self, payload: dict[str, Any]) -> None:
        held = self._held_at(payload)
        need(held.item["type"] == FUNCTION_CALL, "arguments for a call of another kind")
        need(isinstance(payload.get("arguments"), str), "done arguments that are not text")
        held.done_arguments = payload["arguments"]

    async def _custom_input(self, payload: dict[str, Any]) -> None:
        held = self._held_at(payload)
        need(held.item["type"] == CUSTOM_CALL, "custom input for a call of another kind")

    async def _done(self, payload: dict[str, Any]) -> None:
        index, item = payload.get("output_index"), payload.get("item")
        need(is_index(index) and index in self.items, "an item done that was never added")
        kind = _item_kind(item)
        need(kind == self.items[index], "an item done as another kind than it was added")
        if kind in PASSED_ITEMS:
            self._put("response.output_item.done", payload)
            return
        held = self._held_at(payload)
        call = _call_of(item)
        same = (item["call_id"], item["name"]) == (held.item.get("call_id"), held.item.get("name"))
        need(same, "a call done with another call_id or name than it was added")
        if kind == FUNCTION_CALL:
            added = held.item.get("arguments", "")
            need(isinstance(added, str), "added arguments that are not text")
            streamed = added + "".join(held.parts)
            need(streamed in ("", item["arguments"]), "arguments done otherwise than streamed")
            need(held.done_arguments in (None, item["arguments"]), "arguments done twice otherwise")
        need(call.id not in self.decided, "two calls with one call_id")
        held.final = item
        held.released = (await decide_all([call], self.decide))[0]
        self.decided[call.id] = held
        self.withheld += held.released is None
        held.slot.frames = self._call_frames(index, held)

    def _call_frames(self, index: int, held: _Held) -> list[bytes]:
        assert held.final is not None
        item = _released_item(held.final, held.released)
        events: list[tuple[str, dict[str, Any]]] = []
        if held.released is None:
            empty = {**item, "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                ("response.output_item.added", {"output_index": index, "item": empty}),
                ("response.content_part.added", {**where, "part": part}),
                ("response.output_text.delta", {**where, "delta": DENIAL_TEXT, "logprobs": []}),
                ("response.output_text.done", {**where, "text": DENIAL_TEXT, "logprobs": []}),
                ("response.content_part.done", {**where, "part": {**part, "text": DENIAL_TEXT}}),
            ]
        else:
            where = {"item_id": item.get("id", ""), "output_index": index}
            opened = {**item, "status": "in_progress", "arguments": ""}
            events += [
                ("response.output_item.added", {"output_index": index, "item": opened}),
                ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**where, "arguments": item["arguments"],
                                                            "name": item["name"]}),
            ]  # fmt: skip
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
        out = []
        for kind, payload in events:
            out.append(self._send(kind, {"type": kind, "sequence_number": 0, **payload}))
        return out

    async def _final(self, payload: dict[str, Any]) -> None:
        response = payload.get("response")
        need(isinstance(response, dict), "a final event without a response")
        need(all(h.final is not None for h in self.held.values()), "a call never done")
        output = response.get("output")
        need(output is None or isinstance(output, list), "output that is not a list")
        for i, item in enumerate(output or []):
            if _item_kind(item) in PASSED_ITEMS:
                continue
            call_id = item.get("call_id")
            need(isinstance(call_id, str), "a final call without a text call_id")
            held = self.decided.get(call_id)
            # the Agents SDK runs the calls of this list: each must be one judged above
            need(held is not None and held.final == item, "a final call not the one streamed")
            assert held is not None
            output[i] = _released_item(item, held.released)
        self.finished = True
        self._put(payload["type"], payload)

    def _other(self, kind: str, payload: dict[str, Any]) -> None:
        """An event that carries no call: passed on, unless it concerns a held call or
        carries an item or a response the proxy has not read."""
        need(
            not any(k in payload for k in ("item", "response", "output")),
            "an event of another kind with content",
        )
        index = payload.get("output_index")
        need(not (is_index(index) and index in self.held), "an event of another kind for a call")
        self._put(kind, payload)

    _handlers: ClassVar[dict[str, Callable[[ResponseStream, dict[str, Any]], Awaitable[None]]]] = {
        **dict.fromkeys(LIFECYCLE, _lifecycle),
        **dict.fromkeys(FINAL, _final),
        "response.output_item.added": _added,
        "response.output_item.done": _done,
        "response.function_call_arguments.delta": _arguments_delta,
        "response.function_call_arguments.done": _arguments_done,
        "response.custom_tool_call_input.delta": _custom_input,
        "response.custom_tool_call_input.done": _custom_input,
    }

    def close(self) -> list[bytes]:
        """The stream ended: calls still held never completed, and are dropped."""
        self.out.drop()
        return []


def stream_error_frame(message: str) -> bytes:
    """An event both SDKs stop on: the openai SDK raises on `error`, the Agents SDK on the
    `error` type."""
    body = {"type": "error", "code": "api_error", "message": message, "param": None,
            "error": {"message": message, "type": "api_error", "code": None}}  # fmt: skip
    return frame("error", body)


__all__ = ["ResponseStream", "Unreadable", "enforce_response", "stream_error_frame"]
