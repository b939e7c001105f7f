"""A scripted model API (issue 17): replays responses in each provider's wire format, for
the proxy's tests, its benchmark and the vendored-agent example (no model, no network);
and a helper that serves an ASGI app on a free loopback port in a thread.

Formats, from the providers' API references: Anthropic Messages (`message` objects;
streams of `message_start`, `content_block_start` / `content_block_delta` (`text_delta`,
`input_json_delta`) / `content_block_stop`, `message_delta`, `message_stop`, `ping`) and
OpenAI Chat Completions (`chat.completion`; streams of `chat.completion.chunk` with
`delta.content` and `delta.tool_calls`, then `data: [DONE]`)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

START_S = 20.0
STOP_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
                Route("/v1/models", self.models, methods=["GET"]),
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
        if reply.frames is not None:
            frames = reply.frames

            async def stream() -> AsyncIterator[bytes]:
                for frame in frames:
                    yield frame

            return StreamingResponse(stream(), media_type=reply.content_type or "text/event-stream")
        if reply.raw is not None:
            return Response(reply.raw, media_type=reply.content_type or "application/json")
        return JSONResponse(reply.body, media_type=reply.content_type or "application/json")


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
