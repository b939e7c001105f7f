"""A differential fuzzer for the proxy's door: the same generated upstream answer (status,
headers, SSE framing, line endings, Unicode separators, event kinds, key orders,
duplicate keys, chunk split points...) goes to the proxy's decision logic and to each
official SDK's own parser (`sdkview.py`: anthropic Messages, openai Chat Completions and
Responses, streamed and not). Seeded and deterministic: a case is its seed.

Two properties, for every case:

- *covered*: every call the SDK would complete from the upstream's bytes was decided by
  the proxy (released only with the arguments the SDK reads), unless the proxy refused
  the answer (or stopped reading it: the agent then gets nothing more);
- *safe*: every call the SDK reads from what the proxy sends on, finished or not, is one
  the proxy released, with the arguments it released.

    python scripts/fuzz_proxy.py --cases 100000 --seed 1     # at scale
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
from dataclasses import dataclass, field
from typing import Any

from quorumgate.proxy import chat, messages, responses
from quorumgate.proxy.door import Answer, answer, readable_encoding
from quorumgate.proxy.enforce import DenialBlock, Released, ToolCall, Unreadable, load_json
from quorumgate.proxy.fake import (
    anthropic_stream,
    completion,
    completion_stream,
    function_call,
    message,
    output_message,
    response,
    responses_stream,
    text,
    tool_use,
)
from quorumgate.proxy.sse import SseDecoder
from tests.proxy.sdkview import VIEWS, Call
from tests.proxy.sdkview import Answer as Wire

APIS = ("anthropic", "openai", "responses")
NAMES = ("web_fetch", "send_mail", "clock", "web", "_fetch", "send")
ARGS = ({"url": "https://docs.example.com/a"}, {"url": "https://evil.example/x"},
        {"to": "bob@example.com"}, {"to": "x@evil.example"}, {})  # fmt: skip
SEPARATORS = ("\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\ufeff", "\r", "\n")
ENDINGS = (b"\n", b"\r\n", b"\r")


def allowed(name: str, arguments: object) -> bool:
    if not isinstance(arguments, dict):
        return False
    if name in ("clock", "web"):
        return True
    value = arguments.get("url", arguments.get("to"))
    return isinstance(value, str) and (
        value.startswith("https://docs.example.com/") or value.endswith("@example.com")
    )


@dataclass
class Case:
    seed: int
    api: str
    stream: bool
    status: int
    headers: dict[str, str]
    chunks: list[bytes]


@dataclass
class Verdict:
    refused: bool = False
    decided: list[tuple[ToolCall, Released]] = field(default_factory=list)
    output: Wire | None = None


# ---------------------------------------------------------------------------- generating


def _calls(rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    return [(f"c{k}", rng.choice(NAMES), dict(rng.choice(ARGS))) for k in range(rng.randint(0, 3))]


def _base_stream(api: str, rng: random.Random) -> list[bytes]:
    calls = _calls(rng)
    if api == "anthropic":
        blocks = [text("Working on it.")] + [tool_use(n, i, **a) for i, n, a in calls]
        return anthropic_stream(*blocks)
    if api == "openai":
        return completion_stream(*[(i, n, a) for i, n, a in calls])
    items = [output_message("Working on it.")] + [function_call(n, i, **a) for i, n, a in calls]
    return responses_stream(*items)


def _base_body(api: str, rng: random.Random) -> dict[str, Any]:
    calls = _calls(rng)
    if api == "anthropic":
        return message(text("Hi."), *[tool_use(n, i, **a) for i, n, a in calls])
    if api == "openai":
        return completion(*calls)
    return response(output_message("Hi."), *[function_call(n, i, **a) for i, n, a in calls])


def _events(frames: list[bytes]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for event in SseDecoder().feed(b"".join(frames)):
        data: Any = event.data if event.data.startswith("[DONE]") else json.loads(event.data)
        out.append([event.event, data])
    return out


def _walk(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in a JSON value, for mutations to pick from."""
    spots: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        for key in list(value):
            spots.append((value, key))
            spots += _walk(value[key])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            spots.append((value, i))
            spots += _walk(item)
    return spots


def _mutate_value(data: Any, rng: random.Random) -> None:
    spots = _walk(data)
    if not spots:
        return
    container, key = rng.choice(spots)
    current = container[key]
    choice = rng.random()
    if isinstance(current, int) and not isinstance(current, bool):
        container[key] = rng.choice([current + 1, current - 1, -1, True, 5, str(current)])
    elif isinstance(current, str) and choice < 0.3:
        container[key] = rng.choice(
            [
                "tool_use",
                "text_delta",
                "input_json_delta",
                "function_call",
                "response.output_text.delta",
                "send_mail",
                "",
                current + "x",
            ]
        )
    elif isinstance(current, str) and choice < 0.5:
        cut = rng.randint(0, len(current))
        container[key] = current[:cut] + rng.choice(SEPARATORS) + current[cut:]
    elif isinstance(current, str) and current.startswith("{") and choice < 0.7:
        with contextlib.suppress(ValueError):
            container[key] = json.loads(current)  # arguments as an object
    elif choice < 0.8 and isinstance(container, dict):
        del container[key]
    else:
        container[key] = rng.choice([None, {}, [], "x", 0, {"to": "x@evil.example"}])


def _mutate_events(events: list[list[Any]], api: str, rng: random.Random) -> None:
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        if not events:
            return
        k = rng.randrange(len(events))
        roll = rng.random()
        if roll < 0.1:
            events[k][0] = rng.choice([None, "ping", "error", "message_start", "x", "thread.run"])
        elif roll < 0.2:
            events.insert(k, [events[k][0], json.loads(json.dumps(events[k][1]))])
        elif roll < 0.3:
            del events[k]
        elif roll < 0.4 and k + 1 < len(events):
            events[k], events[k + 1] = events[k + 1], events[k]
        elif roll < 0.45:
            events.insert(k, [None, rng.choice(["[DONE]", "[DONE]x", "", "{}"])])
        elif roll < 0.5 and isinstance(events[k][1], dict):
            events[k][1]["error"] = {"message": "e"}
        elif roll < 0.55:
            _smuggle(events, api, rng)
        elif isinstance(events[k][1], (dict, list)):
            _mutate_value(events[k][1], rng)


def _smuggle(events: list[list[Any]], api: str, rng: random.Random) -> None:
    """A call where the SDK reads one and the API sends none: message_start's content, a
    lifecycle response's output, a late fragment, a split name."""
    evil = tool_use("send_mail", "cx", to="x@evil.example")
    for event in events:
        data = event[1]
        if not isinstance(data, dict):
            continue
        holder = data.get("message" if api == "anthropic" else "response")
        if not isinstance(holder, dict):
            continue
        if api == "anthropic" and data.get("type") == "message_start":
            holder["content"] = [evil]
            return
        if api == "responses" and data.get("type") == "response.created":
            holder["output"] = [function_call("send_mail", "cx", to="x@evil.example")]
            return
    if api == "openai" and events:
        base = events[min(1, len(events) - 1)][1]
        fragment = {"name": rng.choice(["_mail", "x"]), "arguments": ""}
        entry = {"index": rng.choice([0, 1, -1]), "function": fragment}
        choice = {"index": 0, "finish_reason": None, "delta": {"tool_calls": [entry]}}
        late = {**(base if isinstance(base, dict) else {}), "choices": [choice]}
        events.insert(rng.randrange(len(events)), [None, late])


def _dump(value: Any, rng: random.Random, wild: bool) -> str:
    """JSON text with shuffled keys, sometimes a key twice, raw Unicode, newlines as
    whitespace (a JSON split over several data lines)."""
    if isinstance(value, dict):
        pairs = list(value.items())
        if wild and rng.random() < 0.3:
            rng.shuffle(pairs)
        if wild and pairs and rng.random() < 0.05:
            key, _ = rng.choice(pairs)
            pairs.insert(
                rng.randrange(len(pairs) + 1), (key, rng.choice(["send_mail", "tool_use", 0, {}]))
            )
        sep = "\n" if wild and rng.random() < 0.05 else ""
        body = ("," + sep).join(f"{json.dumps(k)}:{_dump(v, rng, wild)}" for k, v in pairs)
        return "{" + body + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, rng, wild) for v in value) + "]"
    return json.dumps(value, ensure_ascii=not (wild and rng.random() < 0.3))


def _serialize(events: list[list[Any]], rng: random.Random) -> bytes:
    wild = rng.random() < 0.5
    ending = rng.choice(ENDINGS)
    out = bytearray(b"\xef\xbb\xbf" if rng.random() < 0.02 else b"")
    for name, data in events:
        lines: list[str] = []
        if rng.random() < 0.03:
            lines.append(rng.choice([": keep-alive", "id: 7", "retry: 10", "data:", "event:"]))
        if name is not None:
            tail = rng.choice(SEPARATORS) if wild and rng.random() < 0.03 else ""
            lines.append(f"event: {name}{tail}")
        text = data if isinstance(data, str) else _dump(data, rng, wild)
        space = "" if wild and rng.random() < 0.3 else " "
        lines += [f"data:{space}{part}" for part in text.split("\n")]
        for line in lines:
            out += line.encode("utf-8", "surrogatepass") + (rng.choice(ENDINGS) if wild else ending)
        out += rng.choice(ENDINGS) if wild else ending
    return bytes(out)


def _chunks(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, max(2, len(data))), min(len(data) - 1, rng.randint(0, 8))))
    pieces, last = [], 0
    for cut in [*cuts, len(data)]:
        pieces.append(data[last:cut])
        last = cut
    return [p for p in pieces if p] or [b""]


def generate(seed: int) -> Case:
    rng = random.Random(seed)
    api, stream = rng.choice(APIS), rng.random() < 0.7
    status = rng.choice([200] * 12 + [201, 203, 206, 299, 302, 307, 400, 429, 500])
    headers = {"content-type": "text/event-stream" if stream else "application/json"}
    if rng.random() < 0.05:
        headers["content-type"] = rng.choice(["application/octet-stream", "text/plain"])
    if stream:
        events = _events(_base_stream(api, rng))
        _mutate_events(events, api, rng)
        return Case(seed, api, stream, status, headers, _chunks(_serialize(events, rng), rng))
    body = _base_body(api, rng)
    if rng.random() < 0.5:
        _mutate_value(body, rng)
    raw = _dump(body, rng, rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:
        raw = b"\xef\xbb\xbf" + raw
    if rng.random() < 0.05:
        raw, headers["content-encoding"] = gzip.compress(raw), "gzip"
    return Case(seed, api, stream, status, headers, _chunks(raw, rng))


# ---------------------------------------------------------------------------- running


def _decider(verdict: Verdict) -> Any:
    async def decide(call: ToolCall) -> Released:
        released = call.arguments if allowed(call.name, call.arguments) else None
        verdict.decided.append((call, released))
        return released

    return decide


async def _judge_body(case: Case, verdict: Verdict, data: bytes) -> Wire:
    decide = _decider(verdict)
    try:
        document = load_json(data)
        if case.api == "anthropic":
            await messages.enforce_message(document, decide, DenialBlock.TOOL_RESULT)
        elif case.api == "openai":
            await chat.enforce_completion(document, decide)
        else:
            await responses.enforce_response(document, decide)
    except Unreadable:
        verdict.refused = True
        return Wire(502, {"content-type": "application/json"}, [b'{"error":{"message":"no"}}'])
    body = json.dumps(document, separators=(",", ":")).encode()
    return Wire(200, {"content-type": "application/json"}, [body])


async def _judge_stream(case: Case, verdict: Verdict) -> Wire:
    decide = _decider(verdict)
    enforcer: Any
    if case.api == "anthropic":
        enforcer = messages.MessageStream(decide, DenialBlock.TOOL_RESULT)
    elif case.api == "openai":
        enforcer = chat.CompletionStream(decide)
    else:
        enforcer = responses.ResponseStream(decide)
    errors = {"anthropic": messages.stream_error_frame, "openai": chat.stream_error_frame,
              "responses": responses.stream_error_frame}  # fmt: skip
    decoder, out = SseDecoder(), []
    try:
        for k, chunk in enumerate(case.chunks):
            for event in decoder.feed(chunk):
                if enforcer.finished:
                    verdict.refused = True  # it stopped reading: the rest never reaches the agent
                    break
                out += await enforcer.feed(event)
            if enforcer.finished and k + 1 < len(case.chunks):
                verdict.refused = verdict.refused or any(
                    decoder.feed(b"".join(case.chunks[k + 1 :]))
                )
                break
    except Unreadable:
        verdict.refused = True
        out.append(errors[case.api]("no"))
    out += enforcer.close()
    return Wire(200, {"content-type": "text/event-stream"}, out or [b""])


async def judge(case: Case) -> Verdict:
    """What the proxy makes of the case: the shell's rules (`door.py`), then the API's."""
    verdict = Verdict()
    what = answer(case.status, governed=True)
    if what is Answer.REFUSE or not readable_encoding(case.headers.get("content-encoding")):
        verdict.refused = True
        verdict.output = Wire(502, {"content-type": "application/json"}, [b"{}"])
        return verdict
    if what is Answer.PASS:
        verdict.output = Wire(case.status, dict(case.headers), list(case.chunks))
        return verdict
    data = b"".join(case.chunks)
    if case.headers.get("content-encoding") == "gzip":
        data = gzip.decompress(data)  # as httpx undoes it for the proxy
    if case.stream:
        verdict.output = await _judge_stream(case, verdict)
    else:
        verdict.output = await _judge_body(case, verdict, data)
    return verdict


def _same(a: Call, b: tuple[ToolCall, Released], released_only: bool) -> bool:
    call, released = b
    if (a[0], a[1]) != (call.id, call.name):
        return False
    if released is None:
        return not released_only
    return a[2] == released or (a[2] == "" and released == {})  # "" is read as no arguments


def check(case: Case) -> list[str]:
    """The findings of one case (none: the proxy and every SDK agree)."""
    try:
        verdict = asyncio.run(judge(case))
    except Exception as err:  # the proxy would end the answer closed, but it is a bug
        return [f"crash: the proxy raised {type(err).__name__}: {err}"]
    view = VIEWS[case.api]
    findings = []
    upstream = view(Wire(case.status, case.headers, case.chunks), stream=case.stream)
    if not verdict.refused:
        for call in upstream.complete:
            if not any(_same(call, d, released_only=False) for d in verdict.decided):
                findings.append(f"covered: the SDK completes {call[1]!r} the proxy did not decide")
    assert verdict.output is not None
    passed = view(verdict.output, stream=case.stream)
    for call in passed.seen + passed.complete:
        if not any(_same(call, d, released_only=True) for d in verdict.decided):
            findings.append(f"safe: the SDK reads {call[1]!r} from the proxy, never released")
    return findings


def run(seeds: range) -> dict[int, list[str]]:
    """Findings by seed, for every seed that has any."""
    out = {}
    for seed in seeds:
        found = check(generate(seed))
        if found:
            out[seed] = found
    return out
