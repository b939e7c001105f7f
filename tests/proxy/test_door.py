"""Attacks on the proxy's door, driven by the official SDKs: an upstream answer (status,
headers, framing, event kinds, JSON shapes) that the proxy reads one way and the SDK
another must never hand the agent a call the cluster did not allow, nor one in another
form than the one it judged. The cluster is a stand-in here (`RuleCluster`: it allows
fetches under `docs.example.com` or `xn--fa-hia.example` and mail to `example.com`,
judging the canonical target as the sidecars do, and signs nothing), so these run in
seconds; `test_proxy_live.py` runs the same paths against real replicas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import anthropic
import httpx
import openai
import pytest
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import init_cluster, write_seed
from quorumgate.proto.model import Outcome
from quorumgate.proxy.app import Proxy
from quorumgate.proxy.config import load_config
from quorumgate.proxy.fake import (
    FakeUpstream,
    Reply,
    ServerThread,
    anthropic_stream,
    completion,
    completion_stream,
    function_call,
    message,
    response,
    responses_stream,
    sse,
    text,
    tool_use,
)
from quorumgate.sidecar.engine.statements import target_digest
from quorumgate.sidecar.engine.targets import TargetRefused, canonical_call, canonicalize_target

DOCS = "https://docs.example.com/guide"
EVIL_URL = "https://evil.example/steal"
EVIL_MAIL = "x@evil.example"
AGENTS_FILE = """
[proxy]
passthrough = ["GET /v1/files/*"]

[agents.door]
key_file = "door.key"

[agents.door.tools.web_fetch]
tool = "http.get"
target = "url"

[agents.door.tools.send_mail]
tool = "mail.send"
target = "to"
scheme = "mailto"

[agents.door.tools.clock]
tool = "clock.read"

[agents.door.tools.web]
tool = "clock.read"

[agents.door.tools.read_file]
tool = "files.read"
target = "path"
scheme = "file"

[agents.door.tools.call]
tool = "phone.call"
target = "number"
scheme = "tel"

[agents.door.tools.pay]
tool = "pay.send"
target = "iban"
scheme = "iban"
"""


class RuleCluster:
    """Stands in for the cluster: allows by canonical target, records what it judged."""

    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {
        "http.get": (".docs.example.com", ".xn--fa-hia.example"),
        "mail.send": ("@example.com", ".example.com"),
        "clock.read": ("-",),  # no target: always allowed, whatever its arguments
        "files.read": ("/srv/",),
        "phone.call": ("tel:+44",),
        "pay.send": ("iban:GB",),
    }

    def __init__(self, version: int) -> None:
        self.version = version
        self.judged: list[tuple[str, str, dict[str, str | None]]] = []

    async def decide(self, proposal: Any, _deadline_s: float | None = None) -> Any:
        head = proposal.target.split(":", 1)[0].lower()
        scheme = "file" if proposal.target.startswith("/") else head
        try:
            canonical = canonicalize_target(
                proposal.target, principal="door", schemes=(scheme, "principal"),
                version=self.version,
            )  # fmt: skip
        except TargetRefused:
            canonical = "!"
        if not proposal.target:
            canonical = "-"
        values = {a.name: a.text for a in proposal.arguments}
        self.judged.append((proposal.tool, canonical, values))
        host = canonical.split("/")[2] if canonical.startswith("https://") else canonical
        allowed = any(
            ("." + host).endswith(s) or host.endswith(s) or canonical.startswith(s)
            for s in self.ALLOWED.get(proposal.tool, ())
        )
        leaf = SimpleNamespace(
            target_digest=target_digest(canonical_call(proposal.tool, canonical))
        )
        return SimpleNamespace(
            allowed=allowed,
            proposal_id=bytes(32),
            outcome=Outcome.ALLOW if allowed else Outcome.DENY,
            reason="ok" if allowed else "out_of_scope",
            certificate=SimpleNamespace(leaf=leaf),
        )


@dataclass
class Door:
    upstream: FakeUpstream
    other: FakeUpstream  # where a redirect points: around the proxy
    other_url: str
    url: str
    cluster: RuleCluster


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    directory = tmp_path_factory.mktemp("door")
    spec = init_cluster(directory / "cluster", 4)
    write_seed(directory / "door.key", bytes(SigningKey.generate()))
    (directory / "agents.toml").write_text(AGENTS_FILE)
    upstream, other = FakeUpstream(), FakeUpstream()
    with ServerThread(upstream.app()) as up, ServerThread(other.app()) as away:
        proxy = Proxy(load_config(directory / "agents.toml"), spec, up.url)
        with ServerThread(proxy.app()) as px:
            cluster = RuleCluster(spec.canonical_version)
            proxy.clients["door"] = cluster  # type: ignore[assignment]
            yield Door(upstream, other, away.url, px.url, cluster)


@pytest.fixture(autouse=True)
def fresh(door: Door) -> Iterator[None]:
    """Each test scripts its own answers (a refused request leaves its answer unread)."""
    door.upstream.script.clear()
    door.other.script.clear()
    yield


def claude(door: Door) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=door.url, api_key="k", max_retries=0)


def gpt(door: Door) -> openai.OpenAI:
    return openai.OpenAI(base_url=door.url + "/v1", api_key="k", max_retries=0)


ASK = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "go"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}]}


def allowed(name: str, arguments: object) -> bool:
    """What the stand-in cluster allows, on the arguments as the agent will use them."""
    if not isinstance(arguments, dict):
        return False
    if name == "web_fetch":
        url = arguments.get("url")
        return isinstance(url, str) and url.startswith(
            ("https://docs.example.com/", "https://xn--fa-hia.example/")
        )
    if name == "send_mail":
        to = arguments.get("to")
        return isinstance(to, str) and to.endswith("@example.com")
    return False


def anthropic_calls(door: Door, *, stream: bool) -> list[tuple[str, object]]:
    """The tool calls the Anthropic SDK hands the agent (an SDK error hands none)."""
    client = claude(door)
    try:
        if stream:
            with client.messages.stream(**ASK) as events:
                final = events.get_final_message()
        else:
            final = client.messages.create(**ASK)
    except (anthropic.APIError, RuntimeError, AssertionError):
        return []
    return [(b.name, b.input) for b in final.content if b.type == "tool_use"]


def chat_calls(door: Door, *, stream: bool) -> list[tuple[str, object]]:
    client = gpt(door)
    try:
        if stream:
            with client.chat.completions.stream(**CHAT) as events:
                final = events.get_final_completion()
        else:
            final = client.chat.completions.create(**CHAT)
    except (openai.APIError, RuntimeError, AssertionError):
        return []
    out: list[tuple[str, object]] = []
    for choice in final.choices:
        for call in choice.message.tool_calls or []:
            try:
                out.append((call.function.name, json.loads(call.function.arguments)))
            except (TypeError, ValueError):
                out.append((call.function.name, call.function.arguments))
    return out


def responses_calls(door: Door, *, stream: bool) -> list[tuple[str, object]]:
    client = gpt(door)
    try:
        if stream:
            with client.responses.stream(model="m", input="go") as events:
                final = events.get_final_response()
        else:
            final = client.responses.create(model="m", input="go")
    except (openai.APIError, RuntimeError, AssertionError):
        return []
    return [
        (item.name, json.loads(item.arguments))
        for item in final.output
        if item.type == "function_call"
    ]


def only_allowed(calls: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The calls the cluster would not allow (the tests want none)."""
    return [(name, args) for name, args in calls if not allowed(name, args)]


# ------------------------------------------------------------------ status and path


@pytest.mark.parametrize("status", [201, 203, 206, 299])
def test_a_2xx_other_than_200_is_judged(door: Door, status: int) -> None:
    door.upstream.script.append(
        Reply(body=message(tool_use("send_mail", "t1", to=EVIL_MAIL)), status=status)
    )
    assert only_allowed(anthropic_calls(door, stream=False)) == []
    door.upstream.script.append(
        Reply(body=completion(("c1", "send_mail", {"to": EVIL_MAIL})), status=status)
    )
    assert only_allowed(chat_calls(door, stream=False)) == []


def test_a_redirect_never_sends_the_sdk_around_the_proxy(door: Door) -> None:
    door.other.script.append(Reply(body=message(tool_use("send_mail", "t1", to=EVIL_MAIL))))
    door.upstream.script.append(
        Reply(body={}, status=307, headers={"location": door.other_url + "/v1/messages"})
    )
    assert only_allowed(anthropic_calls(door, stream=False)) == []
    assert door.other.received == []  # the SDK never went there


def test_the_responses_api_is_judged(door: Door) -> None:
    door.upstream.script.append(
        Reply(body=response(function_call("send_mail", "c1", to=EVIL_MAIL)))
    )
    assert only_allowed(responses_calls(door, stream=False)) == []
    door.upstream.script.append(
        Reply(frames=responses_stream(function_call("send_mail", "c2", to=EVIL_MAIL)))
    )
    assert only_allowed(responses_calls(door, stream=True)) == []


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions/", "/v1//chat/completions", "/v1/responses/resp_1", "/v2/messages"],
)
def test_a_path_the_proxy_does_not_know_is_refused(door: Door, path: str) -> None:
    door.upstream.script.append(Reply(body=completion(("c1", "send_mail", {"to": EVIL_MAIL}))))
    seen = len(door.upstream.received)
    answer = httpx.post(door.url + path, json=CHAT, timeout=30)
    assert answer.status_code >= 400 and b"evil.example" not in answer.content
    assert len(door.upstream.received) == seen  # refused here, never sent upstream


def test_a_request_the_proxy_cannot_read_is_not_forwarded(door: Door) -> None:
    door.upstream.script.append(Reply(body=message(tool_use("send_mail", "t1", to=EVIL_MAIL))))
    answer = httpx.post(door.url + "/v1/messages", content=b"{not json", timeout=30)
    assert answer.status_code >= 400 and b"evil.example" not in answer.content


# ------------------------------------------------------------------ SSE framing


def _frames_of(stream_frames: list[bytes], ending: bytes) -> list[bytes]:
    """The same frames with every line ending replaced by `ending` (a blank line is two)."""
    return [frame.replace(b"\n", ending) for frame in stream_frames]


@pytest.mark.parametrize(
    "framing", [b"\r\n", b"\r", b"\n\r\n", b"\r\n\n"], ids=["crlf", "cr", "lf-crlf", "crlf-lf"]
)
def test_frames_delimited_as_the_sdk_accepts_are_judged(door: Door, framing: bytes) -> None:
    frames = anthropic_stream(text("Mailing."), tool_use("send_mail", "t1", to=EVIL_MAIL))
    if framing in (b"\r\n", b"\r"):
        chunks = _frames_of(frames, framing)
    else:  # mixed: each line ends with LF, each blank line with the other ending
        chunks = [
            f[:-1] + framing[1:] if framing == b"\n\r\n" else f[:-2] + framing for f in frames
        ]
        chunks[-1] = frames[-1]  # and the last frame as usual
    door.upstream.script.append(Reply(chunks=chunks, content_type="text/event-stream"))
    assert only_allowed(anthropic_calls(door, stream=True)) == []


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c"])
def test_characters_the_sdk_does_not_split_on_do_not_hide_a_call(
    door: Door, separator: str
) -> None:
    """Inside a JSON string a raw U+2028 (or NEL, VT, FF, FS...) is valid JSON and no line
    break to the SDK's decoder; str.splitlines breaks there."""
    block = {**tool_use("send_mail", "t1", to=EVIL_MAIL), "input": {}}
    start = {"type": "content_block_start", "index": 1, "content_block": block,
             "note": f"a{separator}data: x"}  # fmt: skip
    frames = anthropic_stream(text("Mailing."), tool_use("send_mail", "t1", to=EVIL_MAIL))
    frames[4] = (
        f"event: content_block_start\ndata: {json.dumps(start, ensure_ascii=False)}\n\n".encode()
    )
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(anthropic_calls(door, stream=True)) == []


# ------------------------------------------------------------------ event and delta kinds


def test_a_delta_the_sdk_does_not_assemble_does_not_change_what_is_judged(door: Door) -> None:
    """The SDK builds a tool's input from `input_json_delta` only; a `text_delta` carrying
    `partial_json` is ignored by it and must not be read by the proxy either."""
    frames = anthropic_stream(text("Fetching."), tool_use("web_fetch", "t1", url=DOCS))
    head = frames[:5]  # message_start, text block (start, 2 deltas, stop)
    block = {"type": "tool_use", "id": "t1", "name": "web_fetch", "input": {}}

    def delta(kind: str, part: str) -> bytes:
        payload = {"type": "content_block_delta", "index": 1,
                   "delta": {"type": kind, "partial_json": part}}  # fmt: skip
        return sse("content_block_delta", payload)

    frames = [
        *head,
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": block},
        ),
        delta("input_json_delta", json.dumps({"url": EVIL_URL})[:-1]),  # unfinished: partial
        delta("text_delta", f', "url": "{DOCS}"}}'),
        sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
        *frames[-2:],
    ]
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(anthropic_calls(door, stream=True)) == []


def test_a_tool_use_in_message_start_is_judged(door: Door) -> None:
    frames = anthropic_stream(text("Hello."))
    start = json.loads(frames[0].split(b"data: ", 1)[1])
    start["message"]["content"] = [tool_use("send_mail", "t1", to=EVIL_MAIL)]
    frames[0] = sse("message_start", start)
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(anthropic_calls(door, stream=True)) == []


def test_arguments_as_an_object_are_not_judged_as_empty(door: Door) -> None:
    """The API sends `arguments` as JSON text; an object there was judged as no arguments
    (which the cluster allows for `clock`) and handed on as the object."""
    body = completion(("c1", "clock", {}))
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"zone": "evil"}
    door.upstream.script.append(Reply(body=body))
    client = gpt(door)
    try:
        result = client.chat.completions.create(**CHAT)
    except openai.APIError:
        return  # refused: fine
    calls = result.choices[0].message.tool_calls or []
    assert all(isinstance(c.function.arguments, str) for c in calls)
    judged = [values for tool, _, values in door.cluster.judged[-len(calls) :]] if calls else []
    assert [json.loads(c.function.arguments) for c in calls] == judged


def _chat_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return sse(None, chunk)


def _call(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


def test_a_tool_name_split_over_chunks_is_judged_whole(door: Door) -> None:
    """The SDK concatenates every `function.name` fragment of a call, as it does its
    arguments: `web` (a harmless tool the cluster allows) + `_fetch` is `web_fetch`."""
    frames = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk(_call(0, id="c1", type="function", function={"name": "web", "arguments": ""})),
        _chat_chunk(
            _call(0, function={"name": "_fetch", "arguments": json.dumps({"url": EVIL_URL})})
        ),
        _chat_chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(chat_calls(door, stream=True)) == []


def test_arguments_after_a_choice_finished_are_not_added_to_a_released_call(door: Door) -> None:
    head = json.dumps({"url": DOCS})
    frames = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk(
            _call(
                0, id="c1", type="function", function={"name": "web_fetch", "arguments": head[:-1]}
            )
        ),
        _chat_chunk(_call(0, function={"arguments": "}"})),
        _chat_chunk({}, "tool_calls"),
        _chat_chunk(_call(0, function={"arguments": ""})),  # a late fragment for the same call
        b"data: [DONE]\n\n",
    ]
    door.upstream.script.append(Reply(frames=frames))
    calls = chat_calls(door, stream=True)
    assert only_allowed(calls) == []
    assert calls in ([], [("web_fetch", {"url": DOCS})])


@pytest.mark.parametrize("first", [3, 1])
def test_tool_call_indices_out_of_order_are_assembled_as_the_sdk_does(
    door: Door, first: int
) -> None:
    """The SDK puts a call at the end of its list whatever its index says, and merges an
    index it has: the proxy must read the list the same way (or refuse it)."""
    benign = json.dumps({"url": DOCS})
    frames = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk(
            _call(first, id="c1", type="function", function={"name": "web_fetch", "arguments": ""})
        ),
        _chat_chunk(
            _call(0, id="c2", type="function", function={"name": "send_mail", "arguments": ""})
        ),
        _chat_chunk(_call(first, function={"arguments": benign})),
        _chat_chunk(_call(0, function={"arguments": json.dumps({"to": EVIL_MAIL})})),
        _chat_chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(chat_calls(door, stream=True)) == []


def test_a_tool_call_at_index_minus_one_is_not_taken_for_the_legacy_function_call(
    door: Door,
) -> None:
    """The proxy kept a legacy `function_call` under index -1, where a `tool_calls` entry
    of index -1 (Python's last) landed too: the allowed fetch was judged, and the SDK
    also handed on a `send_mail` nobody judged."""
    frames = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk(
            {"function_call": {"name": "web_fetch", "arguments": json.dumps({"url": DOCS})}}
        ),
        _chat_chunk(
            _call(-1, id="c2", type="function", function={"name": "send_mail", "arguments": ""})
        ),
        _chat_chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    door.upstream.script.append(Reply(frames=frames))
    assert only_allowed(chat_calls(door, stream=True)) == []


# ------------------------------------------------------------------ what is released


def test_an_allowed_host_is_released_in_the_form_the_cluster_judged(door: Door) -> None:
    """`faß.example` is `xn--fa-hia.example` under UTS 46 (what the cluster judges) and
    `fass.example` under IDNA 2003: the agent must get the A-label."""
    door.upstream.script.append(
        Reply(body=message(tool_use("web_fetch", "t1", url="https://faß.example/a")))
    )
    assert anthropic_calls(door, stream=False) == [
        ("web_fetch", {"url": "https://xn--fa-hia.example/a"})
    ]
    door.upstream.script.append(
        Reply(body=completion(("c1", "web_fetch", {"url": "https://faß.example/b"})))
    )
    assert chat_calls(door, stream=False) == [
        ("web_fetch", {"url": "https://xn--fa-hia.example/b"})
    ]


@pytest.mark.parametrize(
    ("tool", "argument", "written", "judged"),
    [
        (
            "web_fetch",
            "url",
            "HTTPS://Docs.Example.COM:443/a/./b/../c",
            "https://docs.example.com/a/c",
        ),
        ("send_mail", "to", "bob@faß.example.com", "bob@xn--fa-hia.example.com"),
        ("send_mail", "to", "mailto:bob@faß.example.com", "mailto:bob@xn--fa-hia.example.com"),
        ("read_file", "path", "/srv/a/./b/../c", "/srv/a/c"),
        ("call", "number", "+44 20 7946 0958", "+442079460958"),
        ("pay", "iban", "GB82 WEST 1234 5698 7654 32", "GB82WEST12345698765432"),
    ],
    ids=["url", "mailto", "mailto-with-scheme", "path", "tel", "iban"],
)
def test_each_scheme_is_released_in_its_canonical_form(
    door: Door, tool: str, argument: str, written: str, judged: str
) -> None:
    """What the agent runs is the target the cluster judged: its canonical form, without
    the scheme the proxy added when the model wrote the value without one."""
    door.upstream.script.append(Reply(body=message(tool_use(tool, "t1", **{argument: written}))))
    assert anthropic_calls(door, stream=False) == [(tool, {argument: judged})]
    door.upstream.script.append(Reply(frames=completion_stream(("c1", tool, {argument: written}))))
    assert chat_calls(door, stream=True) == [(tool, {argument: judged})]


def test_a_stream_the_decoder_refuses_ends_with_an_error_event(door: Door) -> None:
    """A line that is not UTF-8 (the SDKs raise on it) ends the stream with an error in
    the API's shape, and nothing after it is sent."""
    frames = anthropic_stream(text("Mailing."), tool_use("send_mail", "t1", to=EVIL_MAIL))
    frames.insert(4, b"event: ping\ndata: \xff\n\n")
    door.upstream.script.append(Reply(frames=frames))
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    answer = httpx.post(door.url + "/v1/messages", json={**ASK, "stream": True}, headers=headers)
    assert answer.content.endswith(b"event: error\n" + answer.content.split(b"event: error\n")[-1])
    assert b"send_mail" not in answer.content and b"api_error" in answer.content


def test_a_passthrough_path_is_forwarded_and_only_that_one(door: Door) -> None:
    door.upstream.script.append(Reply(body={"id": "file-1", "object": "file"}))
    answer = httpx.get(door.url + "/v1/files/file-1", timeout=30)
    assert answer.status_code == 200 and answer.json() == {"id": "file-1", "object": "file"}
    for path in ("/v1/files/file-1/content", "/v1/files/a%2Fb", "/v1/files"):
        assert httpx.get(door.url + path, timeout=30).status_code == 403
    # a redirect is refused on a passed path too: it would take the SDK around the proxy
    door.upstream.script.append(Reply(body={}, status=302, headers={"location": door.other_url}))
    assert httpx.get(door.url + "/v1/files/file-2", timeout=30).status_code == 502


def test_a_finished_stream_ends_as_it_finished_and_the_upstream_connection_is_kept(
    door: Door,
) -> None:
    """After message_stop (or [DONE]) the SDK reads no further: the proxy sends nothing
    more (no error, nothing the upstream adds), reads the rest to keep the connection."""
    frames = [*anthropic_stream(text("Done.")), sse("ping", {"type": "ping"})]
    door.upstream.script.append(Reply(frames=frames))
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    answer = httpx.post(door.url + "/v1/messages", json={**ASK, "stream": True}, headers=headers)
    assert answer.content.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    door.upstream.script.append(Reply(frames=[*completion_stream(), b"data: {}\n\n"]))
    answer = httpx.post(door.url + "/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.content.endswith(b"data: [DONE]\n\n") and b"error" not in answer.content
