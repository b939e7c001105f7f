"""Who a sidecar's `Account`, `Admit`, `AdmitBatch`, `GetReceipt` and `Registry` answer.

They answered anyone, with no read statement: `Account(signer)` told a stranger whether
any key it named is a registered agent and how many transactions it has made, and
`AdmitBatch` trusted the caller's word that the signatures were verified, so a stranger
could ask about transactions "signed" by any key it named (no signature needed), and have
4,096 admission checks a call run without one signature check. The registry answers the
owner, the members, the auditors and registered agents only; these now answer no more.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import tx
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    OWNER_KEY_FILE,
    read_seed,
)
from quorumgate.proto.model import (
    Admin,
    Mandate,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    RuleKind,
    SetEntries,
    SetMandate,
    TargetRule,
    ToolMode,
    ToolSpec,
)
from quorumgate.runtime.readwaits import CallerKind
from quorumgate.sidecar.node import (
    METHOD_ACCOUNT,
    METHOD_ADMIT,
    METHOD_ADMIT_BATCH,
    METHOD_GET_RECEIPT,
    METHOD_REGISTRY,
)
from tests.sidecar.standin import RPC_S, World, auth, own, poll, signed_call, world

__all__ = ["world"]  # the fixture, used by name


async def registered_agent(w: World) -> SigningKey:
    """An agent the owner registered: its admin transaction committed and executed."""
    owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
    agent = SigningKey.generate()
    op = RegisterAgent(agent_id="victim", public_key=bytes(agent.verify_key), principal="")
    top = await w.replica.commit((tx.build(w.spec.chain_id, 1, Admin(op=op), owner),))
    await poll(lambda: w.executed == top, "the registration executed")
    engine = w.sidecar.engine
    assert engine is not None
    assert engine.state.agent_by_key.get(bytes(agent.verify_key)) == "victim"
    return agent


def claimed_by(w: World, victim: SigningKey) -> bytes:
    """A transaction naming `victim` as its signer, which it never signed."""
    forger = SigningKey.generate()
    signed = tx.parse(signed_call(w.spec, forger), verify=False).signed
    return tx.encode_signed(replace(signed, signer=bytes(victim.verify_key)))


async def refused(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value.code()


async def test_an_account_answers_its_own_key_and_the_cluster_roles_only(world: World) -> None:
    w = world
    victim = await registered_agent(w)
    stranger = SigningKey.generate()
    owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
    asked = spb.AccountRequest(signer=bytes(victim.verify_key))
    stub = w.stub()
    unsigned = stub.Account(asked, timeout=RPC_S)
    assert await refused(unsigned) == grpc.StatusCode.UNAUTHENTICATED
    by_stranger = stub.Account(
        asked, timeout=RPC_S, metadata=auth(w.spec, stranger, METHOD_ACCOUNT)
    )
    assert await refused(by_stranger) == grpc.StatusCode.PERMISSION_DENIED
    for reader in (victim, owner):
        reply = await stub.Account(
            asked, timeout=RPC_S, metadata=auth(w.spec, reader, METHOD_ACCOUNT)
        )
        assert (reply.known, reply.next_nonce) == (True, 1)
    # a key asking about itself learns what it would learn by submitting: unknown
    mine = await stub.Account(
        spb.AccountRequest(signer=bytes(stranger.verify_key)),
        timeout=RPC_S,
        metadata=auth(w.spec, stranger, METHOD_ACCOUNT),
    )
    assert not mine.known


async def test_admission_answers_this_nodes_replica_only(world: World) -> None:
    w = world
    victim = await registered_agent(w)
    forged = claimed_by(w, victim)
    batch = spb.AdmitBatchRequest(txs=[forged], signatures_verified=True)
    stub = w.stub()
    stranger = SigningKey.generate()
    assert await refused(stub.AdmitBatch(batch, timeout=RPC_S)) == (grpc.StatusCode.UNAUTHENTICATED)
    for caller in (
        stranger,
        victim,
        SigningKey(read_seed(w.spec.node_dir(1) / CONSENSUS_KEY_FILE)),
    ):
        call = stub.AdmitBatch(
            batch, timeout=RPC_S, metadata=auth(w.spec, caller, METHOD_ADMIT_BATCH)
        )
        assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
        single = stub.Admit(
            spb.AdmitRequest(tx=forged), timeout=RPC_S, metadata=auth(w.spec, caller, METHOD_ADMIT)
        )
        assert await refused(single) == grpc.StatusCode.PERMISSION_DENIED
    own_replica = SigningKey(read_seed(w.spec.node_dir(0) / CONSENSUS_KEY_FILE))
    reply = await stub.AdmitBatch(
        batch, timeout=RPC_S, metadata=auth(w.spec, own_replica, METHOD_ADMIT_BATCH)
    )
    assert len(reply.replies) == 1  # its replica checked the signature before asking


async def owner_ops(w: World, *ops: object) -> None:
    """Commit one owner transaction per operation, and wait until the sidecar executed them."""
    owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
    engine = w.sidecar.engine
    assert engine is not None
    nonce = engine.next_nonce(bytes(owner.verify_key))
    assert nonce is not None
    txs = tuple(
        tx.build(w.spec.chain_id, nonce + i, Admin(op=op), owner)  # type: ignore[arg-type]
        for i, op in enumerate(ops)
    )
    top = await w.replica.commit(txs)
    await poll(lambda: w.executed == top, "the owner's operations executed")


async def test_an_account_tells_no_agent_or_principal_of_another_key(world: World) -> None:
    """The attack one step further than a stranger's: keys the cluster knows, an agent and
    the principal the victim acts for, ask about the victim's key. Neither is the signer or
    one of the cluster's roles, so neither learns anything; and a read statement signed for
    another method does not open `Account`."""
    w = world
    victim = await registered_agent(w)
    other, person = SigningKey.generate(), SigningKey.generate()
    await owner_ops(
        w,
        RegisterPrincipal(principal_id="victims-person", public_key=bytes(person.verify_key)),
        RegisterAgent(agent_id="other", public_key=bytes(other.verify_key), principal=""),
    )
    asked = spb.AccountRequest(signer=bytes(victim.verify_key))
    stub = w.stub()
    for caller in (other, person):
        call = stub.Account(asked, timeout=RPC_S, metadata=auth(w.spec, caller, METHOD_ACCOUNT))
        assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
    replayed = auth(w.spec, victim, METHOD_GET_RECEIPT)  # the victim's, for another method
    assert await refused(stub.Account(asked, timeout=RPC_S, metadata=replayed)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


async def test_a_long_poll_tells_a_stranger_nothing_of_a_verdict_it_may_not_read(
    world: World,
) -> None:
    """The `Account` hole through another door. A proposal id is sha256(signer || nonce),
    so whoever knows an agent's public key can name its proposals by nonce. A stranger who
    names one transaction of its own (`own`, proved by its nonce) passes the first gate and
    may long-poll; the sidecar used to wait only while it had no verdict for the id asked,
    and answer `PERMISSION_DENIED` at once when it had one. How fast the refusal came told
    the stranger which of the victim's nonces were used: how many transactions it made.
    Now a verdict the caller may not read is one the sidecar waits past, as if it had none."""
    w = world
    victim = await registered_agent(w)
    top = await w.replica.commit((signed_call(w.spec, victim, nonce=1),))
    await poll(lambda: w.executed == top, "the victim's call executed")
    stranger = SigningKey.generate()
    for nonce in (1, 2):  # the first was executed, the second never made
        asked = tx.tx_id(bytes(victim.verify_key), nonce)
        assert await stranger_waits_then_is_refused(w, stranger, asked), (
            f"nonce {nonce}: refused without the wait"
        )


async def stranger_waits_then_is_refused(w: World, stranger: SigningKey, asked: bytes) -> bool:
    """A one-second long poll for `asked`, by a stranger naming a transaction of its own:
    whether the sidecar held it waiting (before it was answered); it must end refused."""
    request = spb.ReceiptRequest(proposal_id=asked, own=[own(stranger)], wait_ms=1_000)
    metadata = auth(w.spec, stranger, METHOD_GET_RECEIPT)
    call = asyncio.ensure_future(w.stub().GetReceipt(request, timeout=RPC_S, metadata=metadata))

    def held() -> bool:
        return w.sidecar.waits.held(CallerKind.STRANGER) == 1

    await poll(lambda: held() or call.done(), "the long poll to wait or be answered")
    waited = held() and not call.done()
    assert await refused(call) == grpc.StatusCode.PERMISSION_DENIED
    return waited


async def registry_of(w: World, key: SigningKey) -> spb.RegistryReply:
    reply: spb.RegistryReply = await w.stub().Registry(
        spb.RegistryRequest(), timeout=RPC_S, metadata=auth(w.spec, key, METHOD_REGISTRY)
    )
    return reply


async def test_the_registry_tells_each_key_its_own_part(world: World) -> None:
    """An agent of one principal read the whole registry: every agent's mandate and rules,
    the other principals and their payee sets. Now an agent reads its own entry and what it
    needs to call tools (the tool specs, the sinks' public keys to seal to); a principal
    itself, its own agents and their sets; the owner, members and auditors everything;
    anyone else is refused."""
    w = world
    keys = {name: SigningKey.generate() for name in ("alice", "bob", "alice-bot", "bob-bot")}
    public = {name: bytes(k.verify_key) for name, k in keys.items()}
    payees = (TargetRule(RuleKind.EXACT, "https://payee.example/"),)
    await owner_ops(
        w,
        RegisterTool(ToolSpec(name="kb.search", mode=ToolMode.READ, target_schemes=("https",))),
        RegisterSink(sink_id="bank", public_key=bytes(PrivateKey.generate().public_key)),
        RegisterPrincipal(principal_id="alice", public_key=public["alice"]),
        RegisterPrincipal(principal_id="bob", public_key=public["bob"]),
        RegisterAgent(agent_id="alice-bot", public_key=public["alice-bot"], principal="alice"),
        RegisterAgent(agent_id="bob-bot", public_key=public["bob-bot"], principal="bob"),
        SetMandate(agent_id="alice-bot", mandate=Mandate(allowed_tools=("kb.search",))),
        SetMandate(agent_id="bob-bot", mandate=Mandate(allowed_tools=("kb.search",))),
        SetEntries(principal="alice-bot", name="payees", entries=payees),
        SetEntries(principal="bob-bot", name="payees", entries=payees),
    )

    def seen(reply: spb.RegistryReply) -> dict[str, list[str]]:
        c = reply.content
        return {
            "agents": [a.agent_id for a in c.agents],
            "principals": [p.principal_id for p in c.principals],
            "sets": [s.principal for s in c.sets],
            "tools": [t.name for t in c.tools],
            "sinks": [s.sink_id for s in c.sinks],
        }

    bot = await registry_of(w, keys["alice-bot"])
    assert seen(bot) == {
        "agents": ["alice-bot"], "principals": [], "sets": [], "tools": ["kb.search"],
        "sinks": ["bank"],
    }  # fmt: skip
    assert bot.content.agents[0].mandate.allowed_tools.tools == ["kb.search"]
    person = await registry_of(w, keys["alice"])
    assert seen(person) == {
        "agents": ["alice-bot"], "principals": ["alice"], "sets": ["alice-bot"],
        "tools": ["kb.search"], "sinks": ["bank"],
    }  # fmt: skip
    assert (bot.scope, person.scope) == ("agent:alice-bot", "principal:alice")
    owner = await registry_of(w, SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE)))
    assert seen(owner)["agents"] == ["alice-bot", "bob-bot"] and owner.scope == "all"
    assert seen(owner)["sets"] == ["alice-bot", "bob-bot"]
    assert (
        await refused(
            w.stub().Registry(
                spb.RegistryRequest(),
                timeout=RPC_S,
                metadata=auth(w.spec, SigningKey.generate(), METHOD_REGISTRY),
            )
        )
        == grpc.StatusCode.PERMISSION_DENIED
    )
