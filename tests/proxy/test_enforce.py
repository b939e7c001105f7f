"""The proxy's enforcement core, with a scripted decider: which calls are withheld, what
replaces them, how streams are held and released (each released call whole, with the
arguments the decider returned), and that a stream cut mid-call never releases it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from quorumgate.proto.model import DENIAL_TEXT, RoleTarget
from quorumgate.proxy.chat import CompletionStream
from quorumgate.proxy.chat import enforce_completion as enforce_openai
from quorumgate.proxy.config import ProxyConfigError, parse_config
from quorumgate.proxy.enforce import (
    DenialBlock,
    MappingError,
    Released,
    ToolCall,
    build_proposal,
    session_label,
)
from quorumgate.proxy.fake import message, tool_use
from quorumgate.proxy.messages import MessageStream as AnthropicStream
from quorumgate.proxy.messages import enforce_message as enforce_anthropic
from quorumgate.proxy.sse import SseDecoder, SseEvent

OpenAIStream = CompletionStream


def parse_frame(frame: bytes) -> tuple[str, str]:
    """(event, data) of one SSE frame, as the SDKs' decoder reads it."""
    events = SseDecoder().feed(frame)
    assert len(events) == 1, frame
    return events[0].event or "", events[0].data


def events_of(frames: list[bytes]) -> list[tuple[str, Any]]:
    """(event, data as JSON) of every event in `frames`."""
    out = []
    for event in SseDecoder().feed(b"".join(frames)):
        data = event.data if event.data == "[DONE]" else json.loads(event.data)
        out.append((event.event or "", data))
    return out


AGENTS = """
[agents.support]
key_file = "support.key"
session = "first_message"

[agents.support.tools.web_fetch]
tool = "http.get"
target = "url"

[agents.support.tools.send_mail]
tool = "mail.send"
target = "to"
scheme = "mailto"
targets = { recipient = "cc" }
exclude = ["draft_note"]
"""


def config() -> Any:
    import tomllib

    return parse_config(tomllib.loads(AGENTS), Path("/etc/qg"))


class Decider:
    """Releases the calls whose tool name is in `allow`; records every call it saw."""

    def __init__(self, *allow: str) -> None:
        self.allow = set(allow)
        self.seen: list[ToolCall] = []

    async def __call__(self, call: ToolCall) -> Released:
        self.seen.append(call)
        return call.arguments if call.name in self.allow else None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------ mapping


def test_a_tool_call_becomes_a_proposal_through_its_mapping() -> None:
    mapping = config().agents["support"].tools["send_mail"]
    call = ToolCall(
        "toolu_1",
        "send_mail",
        {
            "to": "bob@example.com",
            "cc": ["ann@example.com", "mailto:cy@example.com"],
            "subject": "Q1",
            "priority": 2,
            "labels": {"b": 1, "a": [True, None]},
            "draft_note": "internal",
            "card": "h_card_0123456789abcdef",
        },
    )
    proposal = build_proposal(mapping, call, "s-abc")
    assert (proposal.tool, proposal.target, proposal.run_id) == (
        "mail.send",
        "mailto:bob@example.com",
        "s-abc",
    )
    assert proposal.targets == (
        RoleTarget("recipient", "ann@example.com"),
        RoleTarget("recipient", "mailto:cy@example.com"),
    )
    args = {a.name: (a.text, a.handle) for a in proposal.arguments}
    assert args == {
        "card": (None, "h_card_0123456789abcdef"),
        "labels": ('{"a":[true,null],"b":1}', None),
        "priority": ("2", None),
        "subject": ("Q1", None),
    }
    with pytest.raises(MappingError):
        build_proposal(mapping, ToolCall("t", "send_mail", None), "s-abc")
    with pytest.raises(MappingError):
        build_proposal(mapping, ToolCall("t", "send_mail", {"to": 5}), "s-abc")


def test_a_session_is_the_conversation_not_the_request() -> None:
    agent = config().agents["support"]
    first = {"system": "be good", "messages": [{"role": "user", "content": "pay the invoice"}]}
    later = {
        "system": "be good",
        "messages": [
            {"role": "user", "content": "pay the invoice"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "x"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
        ],
    }
    other = {"system": "be good", "messages": [{"role": "user", "content": "something else"}]}
    assert session_label(agent, first, {}) == session_label(agent, later, {})
    assert session_label(agent, first, {}) != session_label(agent, other, {})
    header = parse_config(
        {"agents": {"a": {"key_file": "k", "session": "header:X-Conversation"}}}, Path(".")
    ).agents["a"]
    assert session_label(header, first, {"x-conversation": "n42"}) == "n42"  # a run id
    assert session_label(header, first, {"x-conversation": "c1"}).startswith("s-")
    assert session_label(header, first, {}) == session_label(agent, first, {})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"agents": {}}, "at least one agent"),
        ({"agents": {"A B": {"key_file": "k"}}}, "not an agent id"),
        ({"agents": {"a": {}}}, "key_file: is required"),
        ({"agents": {"a": {"key_file": "k", "posture": "maybe"}}}, "fail_closed or fail_open"),
        ({"agents": {"a": {"key_file": "k", "session": "cookie"}}}, "header:NAME"),
        (
            {"agents": {"a": {"key_file": "k", "tools": {"t": {"tool": "Bad Name"}}}}},
            "not a QuorumGate tool",
        ),
        (
            {"agents": {"a": {"key_file": "k", "tools": {"t": {"targets": {"to": 3}}}}}},
            "mapped to an argument",
        ),
        ({"agents": {"a": {"key_file": "k", "extra": 1}}}, "unknown field 'extra'"),
        (
            {"proxy": {"passthrough": "GET /v1/files"}, "agents": {"a": {"key_file": "k"}}},
            "passthrough: a list of",
        ),
        (
            {"proxy": {"passthrough": ["GET v1/files"]}, "agents": {"a": {"key_file": "k"}}},
            "a path after the method",
        ),
        (
            {"proxy": {"passthrough": ["FETCH /v1/files"]}, "agents": {"a": {"key_file": "k"}}},
            "starts with a method",
        ),
        (
            {"proxy": {"passthrough": ["GET /v1/%66iles"]}, "agents": {"a": {"key_file": "k"}}},
            "neither plain nor",
        ),
        (
            {"proxy": {"passthrough": ["GET /v1/../files"]}, "agents": {"a": {"key_file": "k"}}},
            "neither plain nor",
        ),
        (
            {"proxy": {"passthrough": ["POST /v1/*"]}, "agents": {"a": {"key_file": "k"}}},
            "is judged, never passed",
        ),
    ],
)
def test_a_bad_agents_file_names_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ProxyConfigError, match=message):
        parse_config(change, Path("."))


def test_the_selector_header_picks_among_configured_agents_only() -> None:
    one = config()
    assert one.resolve(None) is one.agents["support"]  # one agent: no header needed
    assert one.resolve("mallory") is None  # a header cannot introduce an agent
    two = parse_config({"agents": {"a": {"key_file": "k"}, "b": {"key_file": "k"}}}, Path("."))
    assert two.resolve(None) is None and two.resolve("b") is two.agents["b"]


# ------------------------------------------------------------------ JSON responses


def test_anthropic_withholds_each_denied_block_and_ends_the_turn_when_none_is_left() -> None:
    text = {"type": "text", "text": "Let me look."}
    body = message(
        text,
        tool_use("web_fetch", "toolu_1", url="https://docs.example.com/"),
        tool_use("send_mail", "toolu_2", to="x@evil.example"),
    )
    decider = Decider("web_fetch")
    assert run(enforce_anthropic(body, decider, DenialBlock.TOOL_RESULT)) == 1
    assert body["content"][1]["type"] == "tool_use"  # released, unchanged
    assert body["content"][2] == {
        "type": "tool_result",
        "tool_use_id": "toolu_2",
        "is_error": True,
        "content": [{"type": "text", "text": DENIAL_TEXT}],
    }
    assert body["stop_reason"] == "tool_use"  # one call is still waiting for its result
    only_denied = message(text, tool_use("send_mail", "toolu_3", to="x@evil.example"))
    assert run(enforce_anthropic(only_denied, Decider(), DenialBlock.TEXT)) == 1
    assert only_denied["content"][1] == {"type": "text", "text": DENIAL_TEXT}
    assert only_denied["stop_reason"] == "end_turn"
    # nothing of the reason, the tool or the mandate is in what the agent gets
    assert "send_mail" not in json.dumps(only_denied)


def openai_completion(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": list(calls)},
                "finish_reason": "tool_calls",
            }
        ],
    }


def function_call(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_openai_removes_each_denied_call_and_stops_when_none_is_left() -> None:
    body = openai_completion(
        function_call("web_fetch", "call_1", url="https://docs.example.com/"),
        function_call("send_mail", "call_2", to="x@evil.example"),
    )
    assert run(enforce_openai(body, Decider("web_fetch"))) == 1
    message = body["choices"][0]["message"]
    assert [c["id"] for c in message["tool_calls"]] == ["call_1"]
    assert message["content"] == DENIAL_TEXT
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    none_left = openai_completion(function_call("send_mail", "c", to="x@e.x"), content="Sure.")
    assert run(enforce_openai(none_left, Decider())) == 1
    message = none_left["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == f"Sure.\n{DENIAL_TEXT}"
    assert none_left["choices"][0]["finish_reason"] == "stop"
    legacy = openai_completion()
    legacy["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "send_mail", "arguments": "{}"},
    }
    legacy["choices"][0]["finish_reason"] = "function_call"
    assert run(enforce_openai(legacy, Decider())) == 1
    assert "function_call" not in legacy["choices"][0]["message"]
    assert legacy["choices"][0]["finish_reason"] == "stop"


def test_every_choice_is_enforced_not_only_the_first() -> None:
    body = openai_completion(function_call("web_fetch", "a", url="https://docs.example.com/"))
    second = json.loads(json.dumps(body["choices"][0]))
    second["index"] = 1
    second["message"]["tool_calls"] = [function_call("send_mail", "b", to="x@evil.example")]
    body["choices"].append(second)
    assert run(enforce_openai(body, Decider("web_fetch"))) == 1
    assert "tool_calls" not in body["choices"][1]["message"]


# ------------------------------------------------------------------ streams


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    text = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {text}\n\n".encode()


def json_delta(part: str) -> bytes:
    delta = {"type": "input_json_delta", "partial_json": part}
    return sse("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta})


def anthropic_events(name: str, arguments: dict[str, Any], *, cut: bool = False) -> list[bytes]:
    raw = json.dumps(arguments)
    frames = [
        sse("message_start", {"type": "message_start", "message": message(stop="")}),
        sse("content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}),
        sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": "Working on it."}}),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("content_block_start", {"type": "content_block_start", "index": 1,
                                    "content_block": {"type": "tool_use", "id": "toolu_9",
                                                      "name": name, "input": {}}}),
        sse("ping", {"type": "ping"}),
        json_delta(raw[:7]),
        json_delta(raw[7:]),
    ]  # fmt: skip
    if cut:
        return frames
    return [
        *frames,
        sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
        sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                                 "stop_sequence": None},
                              "usage": {"output_tokens": 9}}),
        sse("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


async def through(
    stream: AnthropicStream | OpenAIStream, frames: list[bytes]
) -> list[tuple[int, bytes]]:
    """Feed frame by frame; returns (input position, output frame) for each output."""
    out: list[tuple[int, bytes]] = []
    decoder = SseDecoder()
    for k, frame in enumerate(frames):
        for event in decoder.feed(frame):
            out += [(k, o) for o in await stream.feed(event)]
    out += [(len(frames), o) for o in stream.close()]
    return out


def test_an_allowed_streamed_call_is_released_whole_and_text_is_not_delayed() -> None:
    """What leaves is the proxy's own writing of what it judged: the same events as the
    upstream's, except that the call, held until its stop, leaves whole (its start, one
    fragment with the released arguments, its stop)."""
    frames = anthropic_events("web_fetch", {"url": "https://docs.example.com/"})
    decider = Decider("web_fetch")
    out = run(through(AnthropicStream(decider, DenialBlock.TOOL_RESULT), frames))
    sent = events_of(frames)
    got = events_of([o for _, o in out])
    whole = ("content_block_delta", {"type": "content_block_delta", "index": 1,
             "delta": {"type": "input_json_delta",
                       "partial_json": '{"url":"https://docs.example.com/"}'}})  # fmt: skip
    # the ping passes while the call is held; the call's events follow its stop
    assert got == [*sent[:4], sent[5], sent[4], whole, *sent[8:]]
    # text frames leave as they arrive; the tool block's frames wait for its stop
    assert [k for k, _ in out][:5] == [0, 1, 2, 3, 5]
    assert {k for k, _ in out[5:8]} == {8}
    assert decider.seen == [ToolCall("toolu_9", "web_fetch", {"url": "https://docs.example.com/"})]


def test_a_denied_streamed_call_is_replaced_and_the_turn_ends() -> None:
    frames = anthropic_events("send_mail", {"to": "x@evil.example"})
    for mode in DenialBlock:
        out = [o for _, o in run(through(AnthropicStream(Decider(), mode), frames))]
        events = [parse_frame(o) for o in out]
        kinds = [e for e, _ in events]
        assert "input_json_delta" not in b"".join(out).decode()
        assert "x@evil.example" not in b"".join(out).decode()
        stops = [json.loads(d) for e, d in events if e == "message_delta"]
        assert stops[0]["delta"]["stop_reason"] == "end_turn"
        start = next(json.loads(d) for e, d in events if e == "content_block_start"
                     and json.loads(d)["index"] == 1)  # fmt: skip
        if mode is DenialBlock.TEXT:
            assert start["content_block"] == {"type": "text", "text": ""}
            assert DENIAL_TEXT in b"".join(out).decode()
        else:
            assert start["content_block"]["type"] == "tool_result"
            assert start["content_block"]["content"][0]["text"] == DENIAL_TEXT
        assert kinds.count("content_block_stop") == 2


def test_a_stream_cut_mid_call_never_releases_it() -> None:
    frames = anthropic_events("web_fetch", {"url": "https://docs.example.com/"}, cut=True)
    decider = Decider("web_fetch")
    out = [o for _, o in run(through(AnthropicStream(decider, DenialBlock.TOOL_RESULT), frames))]
    assert decider.seen == []  # never complete, never decided
    assert not any(b"tool_use" in o for o in out)
    assert events_of(out) == events_of([*frames[:4], frames[5]])  # the text and the ping only


def openai_chunks(*calls: tuple[str, dict[str, Any]], cut: bool = False) -> list[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "g"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": "On it."})]
    for n, (name, arguments) in enumerate(calls):
        raw = json.dumps(arguments)
        frames.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": n,
                            "id": f"call_{n}",
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        frames.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": raw[:5]}}]}))
        frames.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": raw[5:]}}]}))
    if cut:
        return frames
    return [*frames, chunk({}, "tool_calls"), b"data: [DONE]\n\n"]


def test_openai_streams_release_allowed_calls_and_drop_denied_ones() -> None:
    frames = openai_chunks(("web_fetch", {"url": "https://docs.example.com/"}),
                           ("send_mail", {"to": "x@evil.example"}))  # fmt: skip
    decider = Decider("web_fetch")
    out = run(through(OpenAIStream(decider), frames))
    positions = [k for k, _ in out]
    assert positions[:2] == [0, 1]  # text at once
    text = b"".join(o for _, o in out).decode()
    assert "send_mail" not in text and "evil.example" not in text
    assert DENIAL_TEXT in text
    chunks = [json.loads(parse_frame(o)[1]) for _, o in out if b"[DONE]" not in o]
    indices = {tc["index"] for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])}
    assert indices == {0}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # one call is left
    # every call denied: the turn stops
    out = run(through(OpenAIStream(Decider()), openai_chunks(("send_mail", {"to": "x@e.x"}))))
    chunks = [json.loads(parse_frame(o)[1]) for _, o in out if b"[DONE]" not in o]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks)
    # allowed and complete: the same chunks, the call whole in one of them
    frames = openai_chunks(("web_fetch", {"url": "https://docs.example.com/"}))
    got = events_of([o for _, o in run(through(OpenAIStream(Decider("web_fetch")), frames))])
    call = got[2][1]["choices"][0]["delta"]["tool_calls"]
    assert call == [{"index": 0, "id": "call_0", "type": "function",
                     "function": {"name": "web_fetch",
                                  "arguments": '{"url":"https://docs.example.com/"}'}}]  # fmt: skip
    rest = [c for _, c in got[3:-1]]
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in rest)
    assert rest[-1]["choices"][0]["finish_reason"] == "tool_calls" and got[-1][1] == "[DONE]"


def test_an_openai_stream_cut_mid_call_never_releases_it() -> None:
    frames = openai_chunks(("web_fetch", {"url": "https://docs.example.com/"}), cut=True)
    decider = Decider("web_fetch")
    out = [o for _, o in run(through(OpenAIStream(decider), frames))]
    assert decider.seen == [] and events_of(out) == events_of(frames[:2])


def test_the_decoder_reads_events_alike_however_the_bytes_are_cut() -> None:
    frames = [b"event: a\ndata: 1\n\n", b"data: 2\r\n\r\n", b'data: {"x": 3}\r\r',
              b": a comment\n\ndata:4\ndata: 5\n\n"]  # fmt: skip
    data = b"".join(frames)
    expected = [SseEvent("a", "1"), SseEvent(None, "2"), SseEvent(None, '{"x": 3}'),
                SseEvent(None, "4\n5")]  # fmt: skip
    for size in (1, 2, 5, 7, len(data)):
        decoder = SseDecoder()
        got: list[SseEvent] = []
        for k in range(0, len(data), size):
            got += decoder.feed(data[k : k + size])
        assert got == expected
    assert parse_frame(frames[0]) == ("a", "1")


def test_interleaved_tool_blocks_are_each_decided() -> None:
    """A second tool_use block that starts before the first stops (no provider does this;
    the enforcer must not rely on it) is decided too, never released with the first. (The
    SDK reads nothing before a message_start: the stream opens with one.)"""

    def start(index: int, name: str) -> bytes:
        block = {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
        payload = {"type": "content_block_start", "index": index, "content_block": block}
        return sse("content_block_start", payload)

    def part(index: int, raw: str) -> bytes:
        delta = {"type": "input_json_delta", "partial_json": raw}
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        return sse("content_block_delta", payload)

    def stop(index: int) -> bytes:
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})

    frames = [
        sse("message_start", {"type": "message_start", "message": message(stop="")}),
        start(0, "web_fetch"), start(1, "send_mail"),
        part(0, '{"url": "https://docs.example.com/"}'), part(1, '{"to": "x@evil.example"}'),
        stop(0), stop(1),
    ]  # fmt: skip
    decider = Decider("web_fetch")
    out = b"".join(o for _, o in run(through(AnthropicStream(decider, DenialBlock.TEXT), frames)))
    assert [c.name for c in decider.seen] == ["web_fetch", "send_mail"]
    assert b"send_mail" not in out and b"evil.example" not in out
    assert out.count(b'"type": "tool_use"') + out.count(b'"type":"tool_use"') == 1


def test_an_event_name_from_the_upstream_cannot_start_another_line() -> None:
    """The Responses enforcer names each event after its data's `type`: a type with a line
    break in it would write a field of the upstream's choosing (found by the fuzzer, as a
    NEL the proxy could not even write)."""
    from quorumgate.proxy.enforce import Unreadable
    from quorumgate.proxy.responses import ResponseStream

    for kind in ("response.note\ndata: {}", "response.note\r", "response.note\x85"):
        stream = ResponseStream(Decider())
        with pytest.raises(Unreadable):
            run(stream.feed(SseEvent(None, json.dumps({"type": kind, "sequence_number": 1}))))
