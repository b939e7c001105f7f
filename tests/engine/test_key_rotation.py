"""Key rotation (docs/engine.md, "Rotating keys"; authority version 5): attacks first (a
stranger's rotation, the new key alone, a key in use, the old key after the rotation, a
replayed rotation), then what survives a rotation, then old chains deciding as before."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import limits, tx
from quorumgate.proto.model import (
    Admin,
    DelegationPolicy,
    KeyHolder,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    RegisterPrincipal,
    RegisterTool,
    RotateKey,
    Suspend,
    ToolMode,
)
from quorumgate.sidecar.engine.config import EngineConfig
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import Verdict
from tests.engine.harness import CHAIN, START_MS, World, replay, signing_key


def _world(**overrides: int) -> World:
    world = World(overrides=dict(overrides))
    world.add_tool("payments.send", mode=ToolMode.USER_CONFIRM)
    world.add_tool("kb.search", mode=ToolMode.READ)
    world.add_principal("pat")
    world.add_agent("planner", ["kb.search", "payments.send"], principal="pat")
    world.add_agent("other", ["kb.search"], principal="pat")
    return world


def _key_of(world: World, holder: KeyHolder, subject: str) -> SigningKey:
    if holder is KeyHolder.OWNER:
        return world.owner
    return world.keys[("principal:" if holder is KeyHolder.PRINCIPAL else "") + subject]


def _rotate(
    world: World,
    signer: SigningKey,
    holder: KeyHolder,
    subject: str,
    new: SigningKey,
    *,
    prover: SigningKey | None = None,
) -> Verdict:
    """A rotation of `subject`'s key to `new`, signed by `signer`; the proof is made by
    `prover` (the new key unless an attack says otherwise)."""
    old = bytes(_key_of(world, holder, subject).verify_key)
    op = tx.rotate_key_op(CHAIN, holder, subject, old, prover or new)
    if prover is not None:
        op = RotateKey(holder, subject, bytes(new.verify_key), op.proof)
    return world.one(signer, Admin(op=op))


def _switch(world: World, holder: KeyHolder, subject: str, new: SigningKey) -> None:
    """After an applied rotation: the identity's nonces continue under the new key."""
    old = _key_of(world, holder, subject)
    world.nonces[bytes(new.verify_key)] = world.nonces.get(bytes(old.verify_key), 0)
    labels = world.run_labels.get(bytes(old.verify_key))
    if labels is not None:
        world.run_labels[bytes(new.verify_key)] = labels
    if holder is KeyHolder.OWNER:
        world.owner = new
    else:
        world.keys[("principal:" if holder is KeyHolder.PRINCIPAL else "") + subject] = new


def _applied(world: World, signer: SigningKey, holder: KeyHolder, subject: str) -> SigningKey:
    new = signing_key(f"rotated/{holder.value}/{subject}/{world.height}")
    verdict = _rotate(world, signer, holder, subject, new)
    assert (verdict.outcome, verdict.reason) == (Outcome.APPLIED, Reason.OK), verdict
    _switch(world, holder, subject, new)
    return new


# ------------------------------------------------------------------ attacks


def test_a_rotation_signed_by_a_stranger_is_refused() -> None:
    world = _world()
    new = signing_key("attacker-new")
    before = world.engine.state.agents["planner"].public_key
    cases = [
        (world.keys["other"], KeyHolder.AGENT, "planner"),  # another agent
        (world.keys["planner"], KeyHolder.PRINCIPAL, "pat"),  # an agent of that principal
        (world.keys["principal:pat"], KeyHolder.AGENT, "planner"),  # its principal
        (world.keys["planner"], KeyHolder.OWNER, ""),  # an agent, for the owner
        (world.keys["principal:pat"], KeyHolder.OWNER, ""),  # a principal, for the owner
    ]
    for signer, holder, subject in cases:
        verdict = _rotate(world, signer, holder, subject, new)
        assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.NOT_KEY_HOLDER)
    assert world.engine.state.agents["planner"].public_key == before
    assert world.engine.owner_key() == bytes(signing_key("owner").verify_key)
    assert not world.engine.state.retired_keys


def test_the_new_key_alone_cannot_rotate_and_the_proof_must_be_the_new_keys() -> None:
    world = _world()
    new = signing_key("planner-new")
    # signed by the new key only: it is no one's key yet
    verdict = _rotate(world, new, KeyHolder.AGENT, "planner", new)
    assert verdict.reason is Reason.UNKNOWN_SIGNER
    # the holder signs, but the new key did not prove it is held: a stranger's proof
    stranger = signing_key("stranger")
    verdict = _rotate(
        world, world.keys["planner"], KeyHolder.AGENT, "planner", new, prover=stranger
    )
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.BAD_KEY_PROOF)
    # a proof the new key made for another subject does not carry over
    old = bytes(world.keys["other"].verify_key)
    op = tx.rotate_key_op(CHAIN, KeyHolder.AGENT, "other", old, new)
    moved = RotateKey(KeyHolder.AGENT, "planner", op.new_public_key, op.proof)
    verdict = world.one(world.keys["planner"], Admin(op=moved))
    assert verdict.reason is Reason.BAD_KEY_PROOF
    assert world.engine.state.agents["planner"].public_key == bytes(
        signing_key("planner").verify_key
    )


def test_a_rotation_to_a_key_in_use_is_refused() -> None:
    world = _world()
    planner = world.keys["planner"]
    for taken in (world.keys["other"], world.keys["principal:pat"], world.owner, planner):
        verdict = _rotate(world, planner, KeyHolder.AGENT, "planner", taken)
        assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.KEY_IN_USE)
    # a retired key is in use for the chain's life: not for a rotation, not to register
    _applied(world, world.keys["other"], KeyHolder.AGENT, "other")
    retired = signing_key("other")
    verdict = _rotate(world, planner, KeyHolder.AGENT, "planner", retired)
    assert verdict.reason is Reason.KEY_IN_USE
    for op in (
        RegisterAgent(agent_id="newcomer", public_key=bytes(retired.verify_key)),
        RegisterPrincipal(principal_id="newcomer", public_key=bytes(retired.verify_key)),
    ):
        refused = world.one(world.owner, Admin(op=op))
        assert (refused.outcome, refused.reason) == (Outcome.REJECTED, Reason.KEY_IN_USE)


def test_the_old_key_signs_nothing_after_the_rotation() -> None:
    world = _world()
    old = world.keys["planner"]
    allowed = world.propose("planner", "kb.search")
    assert allowed.outcome is Outcome.ALLOW
    _applied(world, old, KeyHolder.AGENT, "planner")
    before = world.engine.state_bytes()
    fresh = world.tx(old, Admin(op=Suspend(agent_id="other")))
    assert world.engine.admission_check(fresh).reason is Reason.KEY_ROTATED
    verdict = world.block([fresh]).verdicts[0]
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.KEY_ROTATED)
    after = Engine.from_state_bytes(world.config, world.engine.state_bytes()).state
    restored = Engine.from_state_bytes(world.config, before).state
    # only the height and block time moved: the refused key held and changed nothing
    assert after.agents == restored.agents and after.owner_nonces == restored.owner_nonces
    # the new key continues the identity: same run, same mandate
    assert world.propose("planner", "kb.search").outcome is Outcome.ALLOW


def test_a_replayed_rotation_and_replayed_old_transactions_stay_refused() -> None:
    world = _world()
    old = world.keys["planner"]
    first = world.tx(old, world_proposal(world))
    assert world.block([first]).verdicts[0].outcome is Outcome.ALLOW
    new = signing_key("planner-new")
    rotation = world.tx(
        old,
        Admin(op=tx.rotate_key_op(CHAIN, KeyHolder.AGENT, "planner", bytes(old.verify_key), new)),
    )
    assert world.block([rotation]).verdicts[0].reason is Reason.OK
    _switch(world, KeyHolder.AGENT, "planner", new)
    for again in (rotation, first):
        assert world.block([again]).verdicts[0].reason is Reason.KEY_ROTATED
    # the nonce window is the identity's: the new key cannot reuse an executed nonce
    reused = world.tx(new, world_proposal(world), nonce=1)
    assert world.block([reused]).verdicts[0].reason is Reason.REPLAYED
    # an owner-signed rotation replayed is a replayed owner nonce
    by_owner = world.tx(
        world.owner,
        Admin(
            op=tx.rotate_key_op(
                CHAIN, KeyHolder.AGENT, "other", bytes(world.keys["other"].verify_key),
                signing_key("other-new"),
            )
        ),
    )  # fmt: skip
    assert world.block([by_owner]).verdicts[0].reason is Reason.OK
    assert world.block([by_owner]).verdicts[0].reason is Reason.REPLAYED


def world_proposal(world: World) -> Proposal:
    """A read call in the planner's first run (bound to the run by the harness)."""
    del world
    return Proposal(run_id="run-1", tool="kb.search", target="https://example.com/x")


# ------------------------------------------------------------------ what survives


@pytest.mark.parametrize("by", ["principal", "owner"])
def test_a_card_opened_before_a_principals_rotation_is_answered_by_the_new_key(by: str) -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    assert pending.outcome is Outcome.PENDING
    old = world.keys["principal:pat"]
    new = _applied(world, old if by == "principal" else world.owner, KeyHolder.PRINCIPAL, "pat")
    assert world.engine.cards_for(bytes(old.verify_key)) == ()
    assert [c.proposal_id for c in world.engine.cards_for(bytes(new.verify_key))] == [
        pending.proposal_id
    ]
    by_old = world.confirm(old, pending.proposal_id, pending.card_digest)
    assert (by_old.outcome, by_old.reason) == (Outcome.REJECTED, Reason.KEY_ROTATED)
    assert pending.proposal_id in world.engine.state.pending
    by_new = world.confirm(new, pending.proposal_id, pending.card_digest)
    assert (by_new.outcome, by_new.reason) == (Outcome.ALLOW, Reason.OK)


def test_the_owner_rotates_a_lost_agent_key_and_its_grant_still_works() -> None:
    world = World()
    world.add_tool("kb.search", mode=ToolMode.READ)
    world.add_agent("planner", None, policy=DelegationPolicy.ATTENUATED)
    world.add_agent("helper", None)
    grant = world.delegate("planner", "helper", tools=["kb.search"]).tx_id
    _applied(world, world.owner, KeyHolder.AGENT, "helper")  # the helper lost its key
    verdict = world.propose("helper", "kb.search", grant=grant)
    assert (verdict.outcome, verdict.reason) == (Outcome.ALLOW, Reason.OK)


def test_a_grant_survives_its_grantors_rotation_and_runs_keep_their_records() -> None:
    world = World()
    world.add_tool("kb.search", mode=ToolMode.READ)
    searching = world.engine.state.tools["kb.search"]
    world.admin(RegisterTool(spec=replace(searching, untrusted_results=True)))
    world.add_agent("planner", None, policy=DelegationPolicy.ATTENUATED)
    world.add_agent("helper", None)
    grant = world.delegate("planner", "helper", tools=["kb.search"]).tx_id
    assert world.propose("planner", "kb.search").outcome is Outcome.ALLOW  # exposes run-1
    runs = dict(world.engine.state.runs)
    assert runs  # the run's provenance record (docs/provenance.md)
    _applied(world, world.keys["planner"], KeyHolder.AGENT, "planner")
    assert dict(world.engine.state.runs) == runs
    verdict = world.propose("helper", "kb.search", grant=grant)
    assert (verdict.outcome, verdict.reason) == (Outcome.ALLOW, Reason.OK)
    # the grantor goes on in its run, with the run's record, under its new key
    assert world.propose("planner", "kb.search").outcome is Outcome.ALLOW


def test_the_latch_survives_a_rotation() -> None:
    world = _world()
    for _ in range(world.config.latch_halt_threshold):
        world.propose("other", "payments.send")
    halted = world.propose("other", "payments.send")
    assert halted.reason is Reason.RUN_HALTED
    _applied(world, world.keys["other"], KeyHolder.AGENT, "other")
    assert world.propose("other", "kb.search").reason is Reason.RUN_HALTED


def test_the_owner_rotates_its_own_key_and_the_state_holds_it() -> None:
    world = _world()
    old = world.owner
    new = _applied(world, old, KeyHolder.OWNER, "")
    assert world.engine.owner_key() == bytes(new.verify_key)
    stale = world.one(old, Admin(op=Suspend(agent_id="other")))
    assert stale.reason is Reason.KEY_ROTATED
    world.admin(Suspend(agent_id="other"))  # the new owner key administers
    verdict = world.one(
        new, Admin(op=RegisterAgent(agent_id="newcomer", public_key=bytes(old.verify_key)))
    )
    assert verdict.reason is Reason.KEY_IN_USE
    # the owner (new key) rotates an agent; an agent never rotates the owner
    _applied(world, new, KeyHolder.AGENT, "planner")
    restored = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert restored.owner_key() == bytes(new.verify_key)
    assert restored.state_root() == world.engine.state_root()
    engine, results = replay(world)
    assert results == world.results and engine.state_bytes() == world.engine.state_bytes()


def test_rotations_are_bounded_by_the_retired_keys_the_chain_remembers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = _world()
    monkeypatch.setattr(limits, "RETIRED_KEYS_MAX", 1)
    _applied(world, world.keys["planner"], KeyHolder.AGENT, "planner")
    verdict = _rotate(world, world.keys["other"], KeyHolder.AGENT, "other", signing_key("o2"))
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.CAPACITY_EXCEEDED)


# ------------------------------------------------------------------ old chains

# Each authority version before 5: the digest of every verdict statement and state root of
# a two-block log (register an agent; then a rotation signed by the agent, one by the owner
# and the owner's own), as the engine before key rotation computed them.
BEFORE_ROTATION = {
    1: "f9a58c084a65a14774c1134d2c6df2e0a3aaba99cca2a9e4519006f4cd229167",
    2: "55de7fb32d85f7d9a7d2a4bc492322467d73d7073e925ae5c10b4d57e6a8a3c6",
    3: "2529e05520c36becea690c3fab37b4ec8d942f078e8db2f6ecf1466009472e63",
    4: "ff827bf8aaf55e417d65e48f6add4fabc21d93b94337cf184cd5d0fe7c2e6c8a",
}


@pytest.mark.parametrize("version", sorted(BEFORE_ROTATION))
def test_old_chains_decide_a_rotation_as_their_decoder_did(version: int) -> None:
    owner, agent = signing_key("owner"), signing_key("a")
    new, owner_new = signing_key("a-new"), signing_key("owner-new")
    old_agent, old_owner = bytes(agent.verify_key), bytes(owner.verify_key)
    blocks = [
        [tx.build(CHAIN, 1, Admin(op=RegisterAgent(agent_id="a", public_key=old_agent)), owner)],
        [
            tx.build(CHAIN, 1, Admin(op=tx.rotate_key_op(
                CHAIN, KeyHolder.AGENT, "a", old_agent, new)), agent),
            tx.build(CHAIN, 2, Admin(op=tx.rotate_key_op(
                CHAIN, KeyHolder.AGENT, "a", old_agent, new)), owner),
            tx.build(CHAIN, 3, Admin(op=tx.rotate_key_op(
                CHAIN, KeyHolder.OWNER, "", old_owner, owner_new)), owner),
        ],
    ]  # fmt: skip
    config = EngineConfig(chain_id=CHAIN, owner_public_key=old_owner, authority_version=version)
    engine = Engine(config)
    out = []
    for height, block in enumerate(blocks, start=1):
        assert all(engine.admission_check(t).reason is Reason.MALFORMED for t in block[1:])
        result = engine.execute_block(height, START_MS + height * 1000, block)
        out.append([v.statement(CHAIN, height).hex() for v in result.verdicts])
        out[-1].append(result.state_root.hex())
    digest = hashlib.sha256(json.dumps(out).encode()).hexdigest()
    assert digest == BEFORE_ROTATION[version]
    assert engine.owner_key() == old_owner and not engine.state.retired_keys
