"""Registering gRPC services so that undecodable request bytes get INVALID_ARGUMENT.

The generated `add_*Servicer_to_server` functions deserialize with `Message.FromString`,
and a decode error there reaches the client as UNKNOWN with Python's exception text. We
register the same handlers with a deserializer that turns undecodable bytes into a marker,
and wrap each method so the marker ends the call with INVALID_ARGUMENT and a fixed detail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

MALFORMED_DETAIL = "malformed request: the bytes do not decode as this method's message"


class _Malformed:
    __slots__ = ()


MALFORMED = _Malformed()


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError):
            return MALFORMED

    return parse


async def _checked_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if request is MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_DETAIL)
        yield request


def _wrap(handler: Any) -> Any:
    if handler.request_streaming:
        if handler.response_streaming:
            inner_ss = handler.stream_stream

            async def stream_stream(requests: AsyncIterator[Any], context: Any) -> Any:
                async for item in inner_ss(_checked_stream(requests, context), context):
                    yield item

            return handler._replace(
                request_deserializer=_tolerant(handler.request_deserializer),
                stream_stream=stream_stream,
            )
        inner_su = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: Any) -> Any:
            return await inner_su(_checked_stream(requests, context), context)

        return handler._replace(
            request_deserializer=_tolerant(handler.request_deserializer),
            stream_unary=stream_unary,
        )
    kind = "unary_stream" if handler.response_streaming else "unary_unary"
    inner = getattr(handler, kind)
    if handler.response_streaming:

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if request is MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_DETAIL)
            async for item in inner(request, context):
                yield item

        wrapped: Any = unary_stream
    else:

        async def unary_unary(request: Any, context: Any) -> Any:
            if request is MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_DETAIL)
            return await inner(request, context)

        wrapped = unary_unary
    return handler._replace(
        request_deserializer=_tolerant(handler.request_deserializer), **{kind: wrapped}
    )


class _Capture:
    """Stands in for the server while a generated `add_*_to_server` registers itself."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        self.name, self.handlers = name, handlers


def add_service(
    server: grpc.aio.Server, add_to_server: Callable[[Any, Any], None], servicer: Any
) -> None:
    capture = _Capture()
    add_to_server(servicer, capture)
    assert capture.name, "the generated code did not register its handlers"
    handlers = {name: _wrap(h) for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, handlers),))
