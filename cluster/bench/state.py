"""`quorumgate bench --state large`: figures on a cluster holding state (docs/benchmarks.md).

Before measuring, the cluster is filled through its own front door, as a multi-agent
workload would leave it: `STATE_AGENTS` agents (acting for `STATE_PRINCIPALS` principals)
with mandates, `STATE_GRANTS` delegation grants from `STATE_PARENTS` parent agents to the
others, and `STATE_CARDS` confirmation cards left pending (calls of a `user_confirm` tool
nobody answers). The engine's capacities are raised for it in the cluster file
(`init --capacity`), since the defaults (4,096 agents, grants and cards) are below it.
Each stage waits until every sidecar executed everything before the next one starts, as
later stages depend on earlier ones (a mandate names a registered agent).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import (
    Admin,
    Delegate,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterTool,
    SetMandate,
    TxPayload,
)

STATE_AGENTS = 10_000  # children; the parents come on top
STATE_PARENTS = 100
STATE_GRANTS = 10_000  # STATE_GRANTS / STATE_PARENTS per parent
STATE_CARDS = 5_000  # STATE_CARDS / STATE_PARENTS per parent, one principal each
STATE_PRINCIPALS = STATE_PARENTS
STATE_CAPACITIES = {
    "agents_max": 12_000,
    "grants_max": 12_000,
    "grants_per_agent_max": 128,
    "pending_max": 6_000,
}
STATE_TOOL_CALL = "state.call"
STATE_TOOL_PAY = "state.pay"
STATE_RUN = "state-run"
GRANT_TTL_S = 3_600.0  # grants outlive the run
SETTLE_POLL_S = 0.2
SETTLE_TIMEOUT_S = 900.0  # a stage of 10,000 operations on a slow machine


class PresetError(RuntimeError):
    """The large state could not be built as specified (the bench says why and stops)."""


def _key(tag: str, i: int) -> SigningKey:
    return SigningKey(f"qg-bench-state/{tag}/{i}".encode().ljust(32, b".")[:32])


async def _ledger_entries(client: Any) -> int:
    """The fewest ledger entries any sidecar holds (each verdict is one entry)."""
    sidecars = await client.sidecar_status()
    return min((s.ledger_entries for s in sidecars.values()), default=0)


async def _settled(client: Any, entries: int) -> None:
    """Wait until every sidecar's ledger holds `entries` verdicts: everything submitted so
    far executed (an empty mempool is not enough: a block may still be on its way)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        sidecars = await client.sidecar_status()
        if len(sidecars) == client.spec.n and all(
            s.ledger_entries >= entries for s in sidecars.values()
        ):
            return
        await asyncio.sleep(SETTLE_POLL_S)
    raise PresetError(f"the cluster did not execute everything within {SETTLE_TIMEOUT_S:.0f} s")


async def _submit_all(client: Any, payloads: list[TxPayload], what: str) -> int:
    """Submit every payload; how many (each will add one ledger entry)."""
    results = await client.submit_many(payloads)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise PresetError(f"{what}: {len(failed)} of {len(payloads)} not submitted: {failed[0]}")
    return len(payloads)


def sidecar_metric(spec: ClusterSpec, prefix: str, node: int = 0) -> float:
    """The sum of a sidecar's exported samples whose line starts with `prefix`."""
    member = spec.members[node]
    url = f"http://{member.host}:{member.sidecar_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:  # our own sidecar, on loopback
        text = reply.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


@dataclass(frozen=True)
class StateKeys:
    """The preset's signing keys, derived from names (no randomness)."""

    parents: list[SigningKey]
    principals: list[SigningKey]
    children: list[SigningKey]

    @classmethod
    def make(cls, scale: float = 1.0) -> StateKeys:
        """`scale` shrinks the children (and so the grants and cards), for tests and the
        in-process benchmark; the parents and principals stay."""
        children = max(1, int(STATE_AGENTS * scale))
        return cls(
            [_key("parent", i) for i in range(STATE_PARENTS)],
            [_key("principal", i) for i in range(STATE_PRINCIPALS)],
            [_key("child", i) for i in range(children)],
        )

    def every(self) -> list[tuple[str, int, SigningKey]]:
        """(tag, index, key) of every agent: the parents, then the children."""
        out = [("parent", i, k) for i, k in enumerate(self.parents)]
        return out + [("child", i, k) for i, k in enumerate(self.children)]


def setup_payloads(keys: StateKeys) -> list[TxPayload]:
    """The owner's first stage: the two tools and the principals."""
    from quorumgate.sdk.builders import tool_spec

    pay = tool_spec(STATE_TOOL_PAY, "user_confirm", schemes=["https"], min_tier="delegate")
    ops: list[TxPayload] = [
        Admin(op=RegisterTool(spec=tool_spec(STATE_TOOL_CALL, "read", schemes=["https"]))),
        Admin(op=RegisterTool(spec=pay)),
    ]
    return ops + [
        Admin(op=RegisterPrincipal(principal_id=f"p{i}", public_key=bytes(k.verify_key)))
        for i, k in enumerate(keys.principals)
    ]


def agent_payloads(keys: StateKeys) -> list[TxPayload]:
    """The owner's second stage: every agent, acting for a principal."""
    return [
        Admin(
            op=RegisterAgent(
                agent_id=f"{tag}{i}",
                public_key=bytes(k.verify_key),
                principal=f"p{i % STATE_PRINCIPALS}",
            )
        )
        for tag, i, k in keys.every()
    ]


def mandate_payloads(keys: StateKeys) -> list[TxPayload]:
    """The owner's third stage: parents may delegate, children may not."""
    from quorumgate.sdk.builders import mandate

    tools = [STATE_TOOL_CALL, STATE_TOOL_PAY]
    parent_mandate = mandate(tools, delegation_policy="attenuated")
    child_mandate = mandate(tools)
    return [
        Admin(
            op=SetMandate(
                agent_id=f"{tag}{i}",
                mandate=parent_mandate if tag == "parent" else child_mandate,
            )
        )
        for tag, i, _ in keys.every()
    ]


def parent_payloads(keys: StateKeys, i: int, expires_at_ms: int) -> list[TxPayload]:
    """Parent `i`'s stage: a grant to each of its children, then calls of the gated tool
    that stay pending (one card each)."""
    per_grants = len(keys.children) * STATE_GRANTS // STATE_AGENTS // STATE_PARENTS
    per_cards = len(keys.children) * STATE_CARDS // STATE_AGENTS // STATE_PARENTS
    mine = keys.children[i * per_grants : (i + 1) * per_grants]
    payloads: list[TxPayload] = [
        Delegate(
            child=bytes(child.verify_key),
            run_id=f"{STATE_RUN}-{j}",
            tools=(STATE_TOOL_CALL,),
            expires_at_ms=expires_at_ms,
        )
        for j, child in enumerate(mine)
    ]
    return payloads + [
        Proposal(run_id=STATE_RUN, tool=STATE_TOOL_PAY, target=f"https://pay.x/{i}/{j}")
        for j in range(per_cards)
    ]


async def fill_large_state(spec: ClusterSpec, progress: Callable[[str], None]) -> dict[str, int]:
    from quorumgate.sdk.client import Client

    started = time.monotonic()
    keys = StateKeys.make()
    async with Client.as_owner(spec.directory) as owner:
        entries = await _ledger_entries(owner)
        progress(f"state: tools and {STATE_PRINCIPALS} principals")
        entries += await _submit_all(owner, setup_payloads(keys), "tools and principals")
        await _settled(owner, entries)
        progress(f"state: {len(keys.every())} agents")
        entries += await _submit_all(owner, agent_payloads(keys), "agents")
        await _settled(owner, entries)
        progress(f"state: {len(keys.every())} mandates")
        entries += await _submit_all(owner, mandate_payloads(keys), "mandates")
        await _settled(owner, entries)

        progress(f"state: {STATE_GRANTS} grants and {STATE_CARDS} pending cards")
        expires = int(time.time() * 1000 + GRANT_TTL_S * 1000)

        async def parent_work(i: int, key: SigningKey) -> int:
            async with Client(spec, key) as parent:
                payloads = parent_payloads(keys, i, expires)
                return await _submit_all(parent, payloads, f"parent {i}")

        for start in range(0, STATE_PARENTS, 10):  # ten parents' clients at a time
            batch = range(start, min(start + 10, STATE_PARENTS))
            entries += sum(await asyncio.gather(*(parent_work(i, keys.parents[i]) for i in batch)))
        await _settled(owner, entries)
        height = max(r.committed_height for r in (await owner.replica_status()).values())
    # What was built is what was asked for: every card pending, no operation refused.
    cards = int(sidecar_metric(spec, "qg_sidecar_pending_confirmations "))
    refused = sum(
        int(sidecar_metric(spec, f'qg_sidecar_verdicts_total{{outcome="{outcome}"'))
        for outcome in ("deny", "rejected")
    )
    if cards < STATE_CARDS or refused:
        raise PresetError(f"state preset: {cards} pending cards, {refused} denied or rejected")
    progress(f"state: filled to height {height} in {time.monotonic() - started:.0f} s")
    return {
        "agents": len(keys.every()),
        "grants": STATE_GRANTS,
        "pending_cards": cards,
        "height": height,
        "fill_s": round(time.monotonic() - started),
    }
