"""Rejection artifacts, and the state that carries everything a later verdict depends on."""

from __future__ import annotations

import hashlib

from quorumgate.proto.model import Argument, Outcome, Proposal, Reason
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import ArtifactDenial, RejectionArtifact, target_digest
from tests.engine.harness import World


def _world(**overrides: int) -> World:
    world = World(overrides=overrides)
    world.add_tool("kb.search")
    world.add_tool("wire.transfer")
    world.add_agent("alice", ["kb.search"])
    world.add_agent("bob", [])
    return world


def test_one_artifact_per_height_and_canonical_target_with_denials_in_block_order() -> None:
    world = _world()
    call = Proposal(run_id="r", tool="wire.transfer", target="https://bank.example/")
    alias = Proposal(run_id="r2", tool="WIRE.transfer", target="HTTPS://BANK.example:443")
    other = Proposal(run_id="r", tool="kb.search", target="https://kb.example/",
                     arguments=(Argument(name="user_id", text="v"),))  # fmt: skip
    allowed = Proposal(run_id="r", tool="kb.search", target="https://kb.example/")
    txs = [
        world.tx(world.keys["bob"], call),
        world.tx(world.keys["alice"], allowed),
        world.tx(world.keys["alice"], alias),
        world.tx(world.keys["alice"], other),
    ]
    result = world.block(txs)
    assert [v.outcome for v in result.verdicts] == [
        Outcome.DENY, Outcome.ALLOW, Outcome.DENY, Outcome.DENY,
    ]  # fmt: skip
    assert [a.canonical_target for a in result.artifacts] == [
        "wire.transfer https://bank.example/", "kb.search https://kb.example/",
    ]  # fmt: skip
    first = result.artifacts[0]
    assert first.key == (world.height, "wire.transfer https://bank.example/")
    assert [d.principal for d in first.denials] == ["bob", "alice"]  # block order
    assert [d.proposal_id for d in first.denials] == [
        result.verdicts[0].proposal_id, result.verdicts[2].proposal_id,
    ]  # fmt: skip
    assert result.artifacts[1].denials[0].argument_names == ("user_id",)
    assert result.artifacts[1].denials[0].reason is Reason.AMBIENT_IDENTITY_ARGUMENT


def test_a_block_without_denials_has_no_artifacts_and_allows_write_none() -> None:
    world = _world()
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW
    assert world.results[-1].artifacts == ()


def test_artifact_bytes_are_canonical_and_carry_only_argument_names() -> None:
    artifact = RejectionArtifact(
        chain_id="c",
        height=7,
        canonical_target="t x",
        denials=(ArtifactDenial(b"\x01" * 32, "alice", Reason.OUT_OF_SCOPE, 3, ("amount",)),),
    )
    data = artifact.to_bytes()
    assert data.startswith(b"qg/artifact/v1")
    assert target_digest("t x") in data and b"amount" in data
    assert data == RejectionArtifact("c", 7, "t x", artifact.denials).to_bytes()


def test_replaying_the_log_rebuilds_identical_artifacts() -> None:
    world = _world()
    world.propose("bob", "kb.search")
    world.propose("bob", "kb.search")
    world.propose("alice", "nope")
    rebuilt = Engine(world.config)
    compared = 0
    for (height, time_ms, txs), original in zip(world.log, world.results, strict=True):
        again = rebuilt.execute_block(height, time_ms, txs)
        assert [a.to_bytes() for a in again.artifacts] == [a.to_bytes() for a in original.artifacts]
        compared += len(original.artifacts)
    assert compared == 3  # bob's two scope denials and alice's unknown tool, one a height


def test_state_bytes_round_trip_exactly_and_the_root_is_their_hash() -> None:
    """A chain without the hash tree (state version 1): the root is the bytes' SHA-256."""
    world = _world(state_version=1)
    world.propose("alice", "kb.search")
    world.propose("bob", "kb.search")
    data = world.engine.state_bytes()
    clone = Engine.from_state_bytes(world.config, data)
    assert clone.state_bytes() == data
    assert world.results[-1].state_root == hashlib.sha256(data).digest() == clone.state_root()


def test_a_version_2_root_is_the_tree_over_the_entries_and_survives_a_reload() -> None:
    world = _world()
    world.propose("alice", "kb.search")
    world.propose("bob", "kb.search")
    data = world.engine.state_bytes()
    clone = Engine.from_state_bytes(world.config, data)
    assert clone.state_bytes() == data
    root = world.results[-1].state_root
    assert root == clone.state_root() == world.engine.state.fresh_tree_root()
    assert root != hashlib.sha256(data).digest()
    # the two versions are two chains: their configurations differ, so do their states
    assert World(overrides={"state_version": 1}).config.fingerprint != world.config.fingerprint


def test_truncated_or_padded_state_bytes_are_refused() -> None:
    world = _world()
    data = world.engine.state_bytes()
    for bad in (data[:-1], data + b"\x00", b"not state"):
        try:
            Engine.from_state_bytes(world.config, bad)
        except ValueError:
            continue
        raise AssertionError("corrupt state accepted")
