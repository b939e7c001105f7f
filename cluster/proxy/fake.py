"""A scripted model API: replays responses in each provider's wire format, for the proxy's
tests, its benchmark and the vendored-agent example (no model, no network); and a helper
that serves an ASGI app on a free loopback port in a thread.

Formats, from the providers' API references: Anthropic Messages (`message` objects;
streams of `message_start`, `content_block_start` / `content_block_delta` (`text_delta`,
`input_json_delta`) / `content_block_stop`, `message_delta`, `message_stop`, `ping`),
OpenAI Chat Completions (`chat.completion`; streams of `chat.completion.chunk` with
`delta.content` and `delta.tool_calls`, then `data: [DONE]`) and OpenAI Responses
(`response` objects with `message` and `function_call` output items; streams of
`response.created`, `response.output_item.added` / `.done`, `response.output_text.delta`,
`response.function_call_arguments.delta` / `.done`, `response.completed`).

Any other path answers too (a 404 unless a reply is scripted), so tests can show what
the proxy does with paths it does not govern; a `Reply` can also set the status, add
headers and send raw chunks exactly as given."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from quorumgate.proto.clusterfile import free_loopback_ports

START_S = 20.0
STOP_S = 20.0


def free_port() -> int:
    """A loopback port free now, outside the range client sockets take."""
    return free_loopback_ports(1)[0]


class ServerThread:
    """An ASGI app served by uvicorn in a thread, on 127.0.0.1 and a free port."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + START_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_S)


@dataclass
class Reply:
    """One scripted response: a JSON body, or SSE frames (a stream)."""

    body: dict[str, Any] | None = None
    frames: list[bytes] | None = None
    content_type: str | None = None  # instead of the usual one (a misbehaving upstream)
    raw: bytes | None = None  # a body sent as it is
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] | None = None  # a body sent in exactly these chunks


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeUpstream:
    script: deque[Reply] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/messages", self.handle, methods=["POST"]),
                Route("/v1/chat/completions", self.handle, methods=["POST"]),
                Route("/v1/responses", self.handle, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/{path:path}", self.handle, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    async def models(self, _: Request) -> Response:
        return JSONResponse({"data": [{"id": "claude-test", "type": "model"}]})

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(Received(request.url.path, dict(request.headers), body))
        if not self.script:
            return JSONResponse({"type": "error", "error": {"message": "no reply"}}, 500)
        reply = self.script.popleft()
        status, headers = reply.status, reply.headers
        parts = reply.frames if reply.frames is not None else reply.chunks
        if parts is not None:
            sent = list(parts)

            async def stream() -> AsyncIterator[bytes]:
                for part in sent:
                    yield part

            default = "text/event-stream" if reply.frames is not None else "application/json"
            return StreamingResponse(
                stream(), status, headers, media_type=reply.content_type or default
            )
        if reply.raw is not None:
            media = reply.content_type or "application/json"
            return Response(reply.raw, status, headers, media_type=media)
        media = reply.content_type or "application/json"
        return JSONResponse(reply.body, status, headers, media_type=media)


# ---------------------------------------------------------------------------- Anthropic


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def message(*blocks: dict[str, Any], stop: str | None = "tool_use") -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(blocks),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, tool_id: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}


def anthropic_stream(*blocks: dict[str, Any], cut_in_block: int | None = None) -> list[bytes]:
    """The SSE frames of a message with `blocks`; `cut_in_block`: the stream ends in the
    middle of that block's arguments."""
    start = message(stop=None)
    start["content"] = []
    frames = [sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            frames.append(
                sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for part in (block["text"][:5], block["text"][5:]):
                frames.append(
                    sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": part},
                        },
                    )
                )
        else:
            empty = {**block, "input": {}}
            frames.append(
                sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": empty},
                )
            )
            frames.append(sse("ping", {"type": "ping"}))
            raw = json.dumps(block["input"])
            half = len(raw) // 2
            for k, part in enumerate((raw[:half], raw[half:])):
                if cut_in_block == index and k == 1:
                    return frames
                frames.append(
                    sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        },
                    )
                )
        frames.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    frames.append(
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        )
    )
    frames.append(sse("message_stop", {"type": "message_stop"}))
    return frames  # fmt: skip


# ---------------------------------------------------------------------------- OpenAI


def completion(
    *calls: tuple[str, str, dict[str, Any]], content: str | None = None
) -> dict[str, Any]:
    tool_calls = [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}
        for call_id, name, arguments in calls
    ]  # fmt: skip
    message_body: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message_body["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": message_body,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
    }


def completion_stream(
    *calls: tuple[str, str, dict[str, Any]], content: str = "On it.", cut: bool = False
) -> list[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "gpt-test"}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(None, {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                               "finish_reason": finish}]})  # fmt: skip

    frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": content})]
    for n, (call_id, name, arguments) in enumerate(calls):
        raw = json.dumps(arguments)
        frames.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": n,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        frames.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": raw[:6]}}]}))
        if cut:
            return frames
        frames.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": raw[6:]}}]}))
    frames.append(chunk({}, "tool_calls" if calls else "stop"))
    frames.append(b"data: [DONE]\n\n")
    return frames  # fmt: skip


# ---------------------------------------------------------------------------- OpenAI Responses


def output_message(value: str, item_id: str = "msg_1") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": value, "annotations": []}],
    }


def function_call(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def response(*items: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "gpt-test",
        "output": list(items),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": {
            "input_tokens": 9,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 14,
        },
    }


def responses_stream(*items: dict[str, Any], cut_in_item: int | None = None) -> list[bytes]:
    """The SSE frames of a response with `items` (messages and function calls), each item
    added, its text or arguments in two deltas, done; `cut_in_item`: the stream ends in
    the middle of that item's arguments."""
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(sse(kind, {"type": kind, "sequence_number": len(frames), **fields}))

    emit("response.created", response=response(status="in_progress"))
    emit("response.in_progress", response=response(status="in_progress"))
    for index, item in enumerate(items):
        if item["type"] == "message":
            _message_frames(emit, index, item)
        elif _call_frames(emit, index, item, cut_in_item):
            return frames
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response(*items))
    return frames  # fmt: skip


def _message_frames(emit: Callable[..., None], index: int, item: dict[str, Any]) -> None:
    """A message item's frames: added, its text in two deltas, done."""
    words = item["content"][0]["text"]
    emit(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "content": []},
    )
    part = {"type": "output_text", "text": "", "annotations": []}
    emit(
        "response.content_part.added",
        item_id=item["id"],
        output_index=index,
        content_index=0,
        part=part,
    )
    for piece in (words[:5], words[5:]):
        emit(
            "response.output_text.delta",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            delta=piece,
            logprobs=[],
        )
    emit(
        "response.output_text.done",
        item_id=item["id"],
        output_index=index,
        content_index=0,
        text=words,
        logprobs=[],
    )
    emit(
        "response.content_part.done",
        item_id=item["id"],
        output_index=index,
        content_index=0,
        part={**part, "text": words},
    )


def _call_frames(
    emit: Callable[..., None], index: int, item: dict[str, Any], cut_in_item: int | None
) -> bool:
    """A function call item's frames: added, its arguments in two deltas, done; True when
    the stream is cut in this item's arguments (`cut_in_item`)."""
    raw = item["arguments"]
    emit(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "arguments": ""},
    )
    half = len(raw) // 2
    for k, piece in enumerate((raw[:half], raw[half:])):
        if cut_in_item == index and k == 1:
            return True
        emit(
            "response.function_call_arguments.delta",
            item_id=item["id"],
            output_index=index,
            delta=piece,
        )
    emit(
        "response.function_call_arguments.done",
        item_id=item["id"],
        output_index=index,
        arguments=raw,
        name=item["name"],
    )
    return False
