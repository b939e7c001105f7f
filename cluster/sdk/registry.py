"""The registry as a client reads it: agents with their mandates and principals, tools,
sinks, principals, named sets and the settings made in the log, as of one executed height,
accepted only when f+1 sidecars return the same content with the same height and state
root (`Client.registry`; the sidecar side is its `Registry` RPC). The part the caller's
key may read: everything for the owner, members and auditors, an agent's or a principal's
own part for them (`Registry.scope`)."""

from __future__ import annotations

from dataclasses import dataclass

from quorumgate.proto import codec
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.model import Mandate, RegisterPrincipal, SetEntries, ToolSpec


@dataclass(frozen=True)
class AgentEntry:
    agent_id: str
    public_key: bytes
    mandate: Mandate | None
    mandate_version: int
    suspended: bool
    principal: str = ""  # the principal it acts for; "": the owner


@dataclass(frozen=True)
class Registry:
    height: int
    state_root: bytes
    agents: tuple[AgentEntry, ...]
    tools: tuple[ToolSpec, ...]
    sinks: tuple[tuple[str, bytes], ...]
    agreed_by: tuple[int, ...] = ()  # the sidecars whose answers matched
    principals: tuple[RegisterPrincipal, ...] = ()
    sets: tuple[SetEntries, ...] = ()  # by (agent, set name)
    settings: tuple[tuple[str, int], ...] = ()  # made in the log, by name
    # whom the sidecars answered: "all" (the owner, members, auditors), "agent:<id>" (its
    # own entry, the tools and sinks) or "principal:<id>" (itself, its agents and their
    # sets, the tools and sinks); docs/security/reads-and-certificates.md
    scope: str = "all"

    def agent(self, agent_id: str) -> AgentEntry | None:
        return next((a for a in self.agents if a.agent_id == agent_id), None)

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


def registry_from_pb(reply: spb.RegistryReply, agreed_by: tuple[int, ...] = ()) -> Registry:
    """Decode a Registry reply (raises ValueError on content that does not decode)."""
    content = reply.content
    agents = tuple(
        AgentEntry(
            agent_id=a.agent_id,
            public_key=bytes(a.public_key),
            mandate=codec.decode_mandate(a.mandate) if a.HasField("mandate") else None,
            mandate_version=a.mandate_version,
            suspended=a.suspended,
            principal=a.principal,
        )
        for a in content.agents
    )
    return Registry(
        height=reply.height,
        state_root=bytes(reply.state_root),
        agents=agents,
        tools=tuple(codec.decode_tool_spec(t) for t in content.tools),
        sinks=tuple((s.sink_id, bytes(s.public_key)) for s in content.sinks),
        agreed_by=agreed_by,
        principals=tuple(
            RegisterPrincipal(p.principal_id, bytes(p.public_key), tuple(p.deputies))
            for p in content.principals
        ),
        sets=tuple(codec.decode_set_entries(s) for s in content.sets),
        settings=tuple((s.name, int(s.value)) for s in content.settings),
        scope=reply.scope or "all",
    )
