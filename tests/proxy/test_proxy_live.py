"""The enforcing proxy against a live 4-node cluster, driven by the official `anthropic` and
`openai` SDKs. The model is a fake upstream that replays each
provider's wire format; every tool call the "model" asks for is proposed to the cluster,
and the SDK sees it only if f+1 sidecars certified that it may run."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec, write_seed
from quorumgate.proto.model import DENIAL_TEXT, RuleKind, TargetRule, ToolRules
from quorumgate.proxy.app import Proxy
from quorumgate.proxy.config import load_config
from quorumgate.proxy.enforce import DenialBlock
from quorumgate.proxy.fake import (
    FakeUpstream,
    Reply,
    ServerThread,
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
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.sync import SyncClient

API_KEY = "sk-ant-api03-test-key-never-logged-0123456789"
SELECTOR = "x-quorumgate-agent"
DOCS = "https://docs.example.com/guide"
EVIL = "x@evil.example"
NEW_IBAN = "GB82WEST12345698765432"
TOOLS = [
    {"name": "web_fetch", "description": "fetch", "input_schema": {"type": "object"}},
    {"name": "send_mail", "description": "mail", "input_schema": {"type": "object"}},
]
_conversations = itertools.count(1)

AGENTS_FILE = """
[agents.px-main]
key_file = "px-main.key"

[agents.px-other]
key_file = "px-other.key"

[agents.px-both]
key_file = "px-both.key"
session = "header:x-conversation"

[agents.px-main.tools.web_fetch]
tool = "http.get"
target = "url"

[agents.px-main.tools.send_mail]
tool = "mail.send"
target = "to"
scheme = "mailto"
targets = { recipient = "cc" }

[agents.px-main.tools.pay]
tool = "pay.send"
target = "iban"
scheme = "iban"

[agents.px-both.tools.send_mail]
tool = "mail.send"
target = "to"
scheme = "mailto"

[agents.px-idn]
key_file = "px-idn.key"

[agents.px-idn.tools.send_mail]
tool = "mail.send"
target = "to"
scheme = "mailto"
"""


@dataclass
class Stack:
    upstream: FakeUpstream
    proxy: Proxy
    url: str
    text_proxy: Proxy
    text_url: str
    person_key: SigningKey
    keys: dict[str, SigningKey]


@pytest.fixture(scope="module")
def stack(
    cluster: ClusterSpec, owner: SyncClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    owner.register_tool(tool_spec("http.get", "read", schemes=["https"]))
    owner.register_tool(
        tool_spec("mail.send", "direct", schemes=["mailto"], roles={"recipient": (["mailto"], 4)})
    )
    owner.register_tool(
        tool_spec("pay.send", "user_confirm", schemes=["iban"], min_tier="delegate")
    )
    person = SigningKey.generate()
    owner.register_principal("px-dana", bytes(person.verify_key))
    rules = [
        ToolRules(
            "http.get",
            (
                TargetRule(RuleKind.HOST_SUFFIX, "docs.example.com"),
                TargetRule(RuleKind.HOST_SUFFIX, "xn--fa-hia.example"),  # faß.example
            ),
        ),
        ToolRules(
            "mail.send",
            (
                TargetRule(RuleKind.HOST_SUFFIX, "example.com"),
                TargetRule(RuleKind.HOST_SUFFIX, "example.com", role="recipient"),
            ),
        ),
    ]
    directory = tmp_path_factory.mktemp("proxy")
    keys = {}
    for agent in ("px-main", "px-other", "px-both", "px-text", "px-idn"):
        key = SigningKey.generate()
        keys[agent] = key
        write_seed(directory / f"{agent}.key", bytes(key))
        owner.register_agent(agent, bytes(key.verify_key), principal="px-dana")
        owner.set_mandate(
            agent,
            mandate(["http.get", "mail.send", "pay.send"], rules=rules),  # type: ignore[arg-type]
        )
    (directory / "agents.toml").write_text(AGENTS_FILE)
    (directory / "text.toml").write_text(
        _only(AGENTS_FILE.replace("px-main", "px-text"), "px-text")
    )
    upstream = FakeUpstream()
    with ServerThread(upstream.app()) as up:
        proxy = Proxy(load_config(directory / "agents.toml"), cluster, up.url)
        text_proxy = Proxy(load_config(directory / "text.toml"), cluster, up.url, DenialBlock.TEXT)
        with ServerThread(proxy.app()) as px, ServerThread(text_proxy.app()) as tpx:
            yield Stack(upstream, proxy, px.url, text_proxy, tpx.url, person, keys)


def _only(agents_file: str, agent: str) -> str:
    """The sections of one agent of an agents file."""
    out, keep = [], False
    for line in agents_file.splitlines():
        if line.startswith("[agents."):
            keep = line.startswith(f"[agents.{agent}]") or line.startswith(f"[agents.{agent}.")
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def claude(url: str, agent: str | None = "px-main") -> anthropic.Anthropic:
    headers = {SELECTOR: agent} if agent else {}
    return anthropic.Anthropic(
        base_url=url, api_key=API_KEY, default_headers=headers, max_retries=0
    )


def gpt(url: str, agent: str = "px-main") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1", api_key=API_KEY, default_headers={SELECTOR: agent}, max_retries=0
    )


def ask(client: anthropic.Anthropic, first: str | None = None, **options: Any) -> Any:
    content = first or f"conversation {next(_conversations)}: do the task"
    return client.messages.create(
        model="claude-test",
        max_tokens=256,
        messages=[{"role": "user", "content": content}],
        tools=TOOLS,  # type: ignore[arg-type]
        **options,
    )


def tool_calls(stack: Stack, outcome: str, reason: str, proxy: Proxy | None = None) -> float:
    registry = (proxy or stack.proxy).metrics.registry
    value = registry.get_sample_value(
        "qg_proxy_tool_calls_total", {"outcome": outcome, "reason": reason}
    )
    return value or 0.0


# ------------------------------------------------------------------ Anthropic


def test_an_allowed_call_reaches_the_sdk_unchanged(stack: Stack) -> None:
    sent = message(text("Fetching the guide."), tool_use("web_fetch", "toolu_01", url=DOCS))
    stack.upstream.script.append(Reply(body=sent))
    raw = claude(stack.url).messages.with_raw_response.create(
        model="claude-test",
        max_tokens=256,
        messages=[{"role": "user", "content": f"conversation {next(_conversations)}"}],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert raw.http_response.json() == sent  # what upstream said, as it said it
    result = raw.parse()
    assert result.stop_reason == "tool_use"
    assert result.content[1].type == "tool_use" and result.content[1].input == {"url": DOCS}
    seen = stack.upstream.received[-1]
    # the API key passes through to the provider, in whichever header this SDK sends it
    sent_key = seen.headers.get("x-api-key") or seen.headers["authorization"].split()[-1]
    assert sent_key == API_KEY
    assert SELECTOR not in seen.headers  # the selector stays here


def test_a_denied_call_is_withheld_and_the_sdk_parses_the_fixed_sentence(stack: Stack) -> None:
    stack.upstream.script.append(
        Reply(body=message(text("Sending."), tool_use("send_mail", "toolu_02", to=EVIL)))
    )
    result = ask(claude(stack.url))
    assert [block.type for block in result.content] == ["text", "tool_result"]
    replaced = result.content[1].model_dump()
    assert replaced["tool_use_id"] == "toolu_02" and replaced["is_error"] is True
    assert replaced["content"] == [{"type": "text", "text": DENIAL_TEXT}]
    assert result.stop_reason == "end_turn"
    # the text mode, for strict SDKs: a plain text block
    stack.upstream.script.append(
        Reply(body=message(text("Sending."), tool_use("send_mail", "toolu_03", to=EVIL)))
    )
    result = ask(claude(stack.text_url, "px-text"))
    assert [(b.type, getattr(b, "text", None)) for b in result.content] == [
        ("text", "Sending."),
        ("text", DENIAL_TEXT),
    ]


def test_streams_release_text_at_once_and_only_allowed_calls(stack: Stack) -> None:
    stack.upstream.script.append(
        Reply(
            frames=anthropic_stream(
                text("Reading the guide."), tool_use("web_fetch", "toolu_04", url=DOCS)
            )
        )
    )
    with claude(stack.url).messages.stream(
        model="claude-test",
        max_tokens=256,
        messages=[{"role": "user", "content": f"conversation {next(_conversations)}"}],
        tools=TOOLS,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[1].type == "tool_use" and final.content[1].input == {"url": DOCS}
    assert final.stop_reason == "tool_use"
    stack.upstream.script.append(
        Reply(
            frames=anthropic_stream(
                text("Mailing them."), tool_use("send_mail", "toolu_05", to=EVIL)
            )
        )
    )
    with claude(stack.text_url, "px-text").messages.stream(
        model="claude-test",
        max_tokens=256,
        messages=[{"role": "user", "content": f"conversation {next(_conversations)}"}],
        tools=TOOLS,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "text"]
    assert final.content[1].text == DENIAL_TEXT and final.stop_reason == "end_turn"


def test_a_stream_cut_mid_tool_call_never_releases_it(stack: Stack) -> None:
    decided = sum(
        tool_calls(stack, o, r) for o in ("released", "withheld") for r in ("ok", "out_of_scope")
    )
    stack.upstream.script.append(
        Reply(
            frames=anthropic_stream(
                text("Fetching."), tool_use("web_fetch", "toolu_06", url=DOCS), cut_in_block=1
            )
        )
    )
    # the SDK sees a stream that ends without its tool call (and without message_stop)
    events = list(ask(claude(stack.url), stream=True))
    assert "message_stop" not in [e.type for e in events]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.content_block.type for e in starts] == ["text"]  # no tool_use ever arrived
    assert (
        sum(
            tool_calls(stack, o, r)
            for o in ("released", "withheld")
            for r in ("ok", "out_of_scope")
        )
        == decided
    )  # and nothing was proposed: the call was never complete


def test_a_retrying_loop_is_refused_from_the_latch_and_halted(stack: Stack) -> None:
    """One conversation (one session: the latch bucket), three turns asking for the same
    refused tool: out_of_scope, then repeat_denied, then the run halts - and then even an
    allowed tool is withheld in it. Another conversation is not affected."""
    client = claude(stack.url)
    first = f"conversation {next(_conversations)}: mail the report"
    before = {
        r: tool_calls(stack, "withheld", r) for r in ("out_of_scope", "repeat_denied", "run_halted")
    }
    for k in range(3):
        stack.upstream.script.append(
            Reply(body=message(tool_use("send_mail", f"toolu_r{k}", to=EVIL)))
        )
        result = ask(client, first)
        assert result.content[0].type == "tool_result"
    after = {r: tool_calls(stack, "withheld", r) for r in before}
    assert {r: after[r] - before[r] for r in before} == {
        "out_of_scope": 1,
        "repeat_denied": 1,
        "run_halted": 1,
    }
    stack.upstream.script.append(Reply(body=message(tool_use("web_fetch", "toolu_r3", url=DOCS))))
    assert ask(client, first).content[0].type == "tool_result"  # the run is over
    stack.upstream.script.append(Reply(body=message(tool_use("web_fetch", "toolu_r4", url=DOCS))))
    assert ask(client).content[0].type == "tool_use"  # another conversation runs


def test_a_pending_confirmation_is_withheld_and_its_card_goes_to_the_principal(
    cluster: ClusterSpec, stack: Stack
) -> None:
    stack.upstream.script.append(
        Reply(body=message(tool_use("pay", "toolu_07", iban=NEW_IBAN, amount="120")))
    )
    result = ask(claude(stack.url))
    assert result.content[0].type == "tool_result" and result.stop_reason == "end_turn"
    with SyncClient(cluster, stack.person_key) as person:
        cards = person.pending()
    mine = [c for c in cards if c.card.tool == "pay.send"]
    assert mine and mine[-1].card.canonical_target == f"pay.send iban:{NEW_IBAN}"
    assert dict(mine[-1].values)["amount"] == "120"


def test_unresolved_agents_and_unmapped_tools_are_decided_by_posture(stack: Stack) -> None:
    before = tool_calls(stack, "withheld", "agent_unresolved")
    for agent in (None, "mallory"):  # several agents configured: a selector is needed
        stack.upstream.script.append(Reply(body=message(tool_use("web_fetch", "t", url=DOCS))))
        assert ask(claude(stack.url, agent)).content[0].type == "tool_result"
    assert tool_calls(stack, "withheld", "agent_unresolved") == before + 2
    stack.upstream.script.append(Reply(body=message(tool_use("shell", "t2", cmd="rm -rf /"))))
    assert ask(claude(stack.url)).content[0].type == "tool_result"
    assert tool_calls(stack, "withheld", "unmapped_tool") >= 1


def test_api_keys_and_argument_values_are_never_logged(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="quorumgate")
    stack.upstream.script.append(
        Reply(body=message(tool_use("send_mail", "toolu_08", to=EVIL, body="SECRET-BODY")))
    )
    ask(claude(stack.url))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "event=decided" in logged
    assert API_KEY not in logged and "SECRET-BODY" not in logged and EVIL not in logged


# ------------------------------------------------------------------ OpenAI


def chat(client: openai.OpenAI, **options: Any) -> Any:
    return client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": f"conversation {next(_conversations)}"}],
        tools=[{"type": "function", "function": {"name": "web_fetch", "parameters": {}}}],
        **options,
    )


def test_openai_calls_are_released_or_removed(stack: Stack) -> None:
    stack.upstream.script.append(
        Reply(
            body=completion(
                ("call_1", "web_fetch", {"url": DOCS}), ("call_2", "send_mail", {"to": EVIL})
            )
        )
    )
    result = chat(gpt(stack.url))
    choice = result.choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["web_fetch"]
    assert choice.message.content == DENIAL_TEXT and choice.finish_reason == "tool_calls"
    stack.upstream.script.append(
        Reply(body=completion(("call_3", "send_mail", {"to": EVIL}), content="Sure."))
    )
    choice = chat(gpt(stack.url)).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == f"Sure.\n{DENIAL_TEXT}"


def test_openai_streams(stack: Stack) -> None:
    stack.upstream.script.append(
        Reply(
            frames=completion_stream(
                ("call_4", "web_fetch", {"url": DOCS}), ("call_5", "send_mail", {"to": EVIL})
            )
        )
    )
    chunks = list(chat(gpt(stack.url), stream=True))
    names = [
        tc.function.name
        for c in chunks
        for tc in (c.choices[0].delta.tool_calls or [])
        if c.choices and tc.function and tc.function.name
    ]
    text_out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert names == ["web_fetch"] and DENIAL_TEXT in text_out
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # cut in the middle of a call: it never arrives
    stack.upstream.script.append(
        Reply(frames=completion_stream(("call_6", "web_fetch", {"url": DOCS}), cut=True))
    )
    chunks = list(chat(gpt(stack.url), stream=True))
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


# ------------------------------------------------------------------ both seams, one run


def test_the_same_run_is_counted_once_whichever_seam_refused_it(
    cluster: ClusterSpec, stack: Stack
) -> None:
    """The agent's own code (the SDK, seam A) and the proxy (seam B) sign with the same
    key; the proxy's session names the run the SDK opened (`x-conversation: n<k>`), so the
    latch counts one run: SDK refused, proxy refused again (repeat), SDK halted."""
    with SyncClient(cluster, stack.keys["px-both"]) as qg:
        first = qg.propose("mail.send", f"mailto:{EVIL}", run_id="both-seams")
        assert first.reason == "out_of_scope"
        run = qg.run_of("both-seams")
        assert run is not None
        stack.upstream.script.append(Reply(body=message(tool_use("send_mail", "t", to=EVIL))))
        result = ask(claude(stack.url, "px-both"), extra_headers={"x-conversation": run})
        assert result.content[0].type == "tool_result"
        third = qg.propose("mail.send", f"mailto:{EVIL}", run_id=run)
        assert third.reason == "run_halted"  # the proxy's refusal was the second attempt


def test_a_misbehaving_upstream_cannot_slip_a_call_past(stack: Stack) -> None:
    """A stream the upstream labels as something else is still enforced as a stream (the
    SDK asked for one); a 200 the enforcer cannot read is not passed on (502)."""
    frames = anthropic_stream(text("Mailing."), tool_use("send_mail", "toolu_m1", to=EVIL))
    stack.upstream.script.append(Reply(frames=frames, content_type="application/octet-stream"))
    import httpx

    headers = {SELECTOR: "px-main", "x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    question = {"role": "user", "content": f"conversation {next(_conversations)}"}
    body = {"model": "claude-test", "max_tokens": 64, "stream": True, "messages": [question]}
    response = httpx.post(stack.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert b"send_mail" not in response.content and b"evil.example" not in response.content
    stack.upstream.script.append(Reply(raw=b'{"content": [{"type": "tool_use"'))
    with pytest.raises(anthropic.InternalServerError):
        ask(claude(stack.url))


def test_a_mail_domain_is_released_in_the_judged_form(stack: Stack) -> None:
    """mailto: the domain as the cluster judged it (A-label), without the scheme the
    proxy added to name the target. (An agent of its own: the other tests' refused mail
    counts towards px-main's cross-run latch.)"""
    stack.upstream.script.append(
        Reply(body=message(tool_use("send_mail", "toolu_m9", to="bob@faß.example.com")))
    )
    result = ask(claude(stack.url, "px-idn"))
    assert result.content[0].type == "tool_use"
    assert result.content[0].input == {"to": "bob@xn--fa-hia.example.com"}


# ------------------------------------------------------------------ OpenAI Responses

IDN_URL = "https://faß.example/a"  # UTS 46: xn--fa-hia.example; IDNA 2003: fass.example
IDN_JUDGED = "https://xn--fa-hia.example/a"


def test_responses_calls_are_judged_and_released_in_the_judged_form(stack: Stack) -> None:
    """The Responses API through the real `openai` SDK, whole and streamed: the allowed
    fetch reaches the SDK with the host the cluster judged (its A-label), the mail to a
    stranger is a message with the fixed sentence."""
    items = (
        function_call("web_fetch", "call_r1", url=IDN_URL),
        function_call("send_mail", "call_r2", to=EVIL),
    )
    stack.upstream.script.append(Reply(body=response(*items)))
    client = gpt(stack.url)
    question = f"conversation {next(_conversations)}"
    result = client.responses.create(model="gpt-test", input=question)
    calls = [(i.name, json.loads(i.arguments)) for i in result.output if i.type == "function_call"]
    assert calls == [("web_fetch", {"url": IDN_JUDGED})]
    assert result.output[1].type == "message" and result.output_text == DENIAL_TEXT
    stack.upstream.script.append(Reply(frames=responses_stream(output_message("On it."), *items)))
    with client.responses.stream(model="gpt-test", input=f"{question}, streamed") as events:
        final = events.get_final_response()
    calls = [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"]
    assert calls == [("web_fetch", {"url": IDN_JUDGED})]
    assert [i.type for i in final.output] == ["message", "function_call", "message"]


def test_the_openai_agents_sdk_runs_only_what_the_cluster_allowed(stack: Stack) -> None:
    """The OpenAI Agents SDK (Responses API by default), unchanged, through the proxy:
    its runner executes the allowed fetch on the judged URL and never the mail; both
    streamed and not."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    fetched: list[str] = []
    mailed: list[str] = []

    @function_tool
    def web_fetch(url: str) -> str:
        """Fetch a page."""
        fetched.append(url)
        return "the guide"

    @function_tool
    def send_mail(to: str) -> str:
        """Send a mail."""
        mailed.append(to)
        return "sent"

    def helper() -> Agent[Any]:  # one per event loop: the client's connections are its own
        client = openai.AsyncOpenAI(
            base_url=stack.url + "/v1",
            api_key=API_KEY,
            default_headers={SELECTOR: "px-main"},
            max_retries=0,
        )
        return Agent(
            name="helper",
            instructions="Help.",
            tools=[web_fetch, send_mail],
            model=OpenAIResponsesModel(model="gpt-test", openai_client=client),
        )

    items = (
        function_call("web_fetch", "call_a1", url=IDN_URL),
        function_call("send_mail", "call_a2", to=EVIL),
    )
    stack.upstream.script.extend(
        [Reply(body=response(*items)), Reply(body=response(output_message("Done.")))]
    )
    result = Runner.run_sync(helper(), f"conversation {next(_conversations)}: fetch and mail")
    assert result.final_output == "Done."
    assert fetched == [IDN_JUDGED] and mailed == []
    stack.upstream.script.extend(
        [
            Reply(frames=responses_stream(*items)),
            Reply(frames=responses_stream(output_message("Done again."))),
        ]
    )

    async def streamed() -> str:
        run = Runner.run_streamed(helper(), f"conversation {next(_conversations)}: streamed")
        async for _ in run.stream_events():
            pass
        return str(run.final_output)

    assert asyncio.run(streamed()) == "Done again."
    assert fetched == [IDN_JUDGED, IDN_JUDGED] and mailed == []
