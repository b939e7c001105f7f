"""Real executed heights for the sidecar store tests: a governed log driven through the real
engine with real signed transactions (tests/engine/harness.py), executed again by a fresh
engine per sidecar, and turned into `ExecutedHeight`s exactly as the sidecar process does
(receipt leaves, RFC 6962 paths, a block statement signed by that sidecar's receipt key).

Deterministic: keys come from names, block time from a fixed step; no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from quorumgate.proto.model import (
    Argument,
    DelegationPolicy,
    EnvelopeArg,
    Outcome,
    Proposal,
    Reason,
    Tier,
    ToolMode,
)
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import StateDelta
from quorumgate.sidecar.engine.statements import BlockResult
from quorumgate.sidecar.receipts import (
    Validity,
    all_paths,
    leaf_from_verdict,
    merkle_root,
    sign_block,
)
from quorumgate.sidecar.store import ExecutedHeight, SidecarStore
from tests.engine.harness import CHAIN, World

SEALED_SECRET = b"SEALED-PLAINTEXT-3c7a91-store-must-not-leak"
ARGUMENT_SECRET = "ARGUMENT-VALUE-e4d002-store-must-not-leak"
SIDECARS = 4  # receipt keys in the test cluster: f = 1, a certificate needs 2


def receipt_key(index: int) -> SigningKey:
    return SigningKey(hashlib.sha256(b"qg-test/receipt/" + bytes([index])).digest())


def receipt_public_keys() -> list[bytes]:
    return [bytes(receipt_key(i).verify_key) for i in range(SIDECARS)]


def block_hash(height: int) -> bytes:
    """Stands for the replica's committed block hash (the store only keeps it)."""
    return hashlib.sha256(b"qg-test/block/" + height.to_bytes(8, "big")).digest()


def executed_height(
    result: BlockResult,
    engine_state: bytes,
    signer: int,
    delta: StateDelta | None = None,
    ttl_ms: int | None = None,
) -> ExecutedHeight:
    """What the sidecar process records for one height (as sidecar/node.py builds it, with
    `delta`; without it the store records the whole state, as a version-2 store did).
    `engine_state` is kept either way, for the tests to compare with. `ttl_ms`: the
    certificate TTL of a chain whose receipts expire (`Engine.certificate_ttl_ms`), which
    puts the validity window in the signed statement as sidecar/execution.py does."""
    leaves = tuple(leaf_from_verdict(result.height, i, v) for i, v in enumerate(result.verdicts))
    hashes = [leaf.hash(CHAIN) for leaf in leaves]
    start = result.block_time_ms
    validity = None if ttl_ms is None else Validity(start, start + ttl_ms)
    signed = sign_block(
        receipt_key(signer),
        signer,
        CHAIN,
        result.height,
        merkle_root(hashes),
        result.state_root,
        len(leaves),
        validity,
    )
    return ExecutedHeight(
        height=result.height,
        block_hash=block_hash(result.height),
        block_time_ms=result.block_time_ms,
        result=result,
        leaves=leaves,
        paths=tuple(tuple(p) for p in all_paths(hashes)),
        signed=signed,
        engine_state=engine_state,
        state_delta=delta,
    )


def execute(world: World, signer: int = 0) -> list[ExecutedHeight]:
    """The world's whole log executed by a fresh engine, as sidecar `signer` would."""
    engine = Engine(world.config)
    out: list[ExecutedHeight] = []
    for height, time_ms, txs in world.log:
        result = engine.execute_block(height, time_ms, txs, world.verify)
        state, delta, ttl_ms = (
            engine.state_bytes(),
            engine.state_delta(),
            engine.certificate_ttl_ms(),
        )
        out.append(executed_height(result, state, signer, delta, ttl_ms))
    return out


@dataclass
class Story:
    """A busy governed log and the facts the tests check against."""

    world: World
    pending_id: bytes  # a user_confirm proposal, confirmed at `confirmed_height`
    bogus_height: int  # where mallory's rejected Confirm named it while still pending
    confirmed_height: int
    denial_heights: list[int]


def busy_world() -> Story:
    """Registrations, allows, flags, denials of several kinds (artifacts, two denials of
    one target in one block, the latch), a pending call confirmed, a Confirm that settles
    nothing, a sealed envelope with a known plaintext, and argument values planted as
    secrets."""
    world = World()
    world.add_sink("payments")
    world.add_tool(
        "payments.charge",
        mode=ToolMode.USER_CONFIRM,
        sink="payments",
        min_tier=Tier.MASTER,
        envelope_args=(EnvelopeArg(name="card", kind="card"),),
    )
    world.add_tool("kb.search")
    world.add_tool("wire.transfer")
    world.add_tool("notes.write", schemes=("file",))
    world.add_principal("ada")  # the person alice acts for: answers her cards
    world.add_agent("alice", None, policy=DelegationPolicy.ATTENUATED, principal="ada")
    world.add_agent("bob", ["kb.search"])
    world.add_agent("mallory", [])
    handle = world.seal(world.keys["alice"], "card", SEALED_SECRET, ["payments"]).subject
    secret = Argument(name="memo", text=ARGUMENT_SECRET)

    pending = world.propose(
        "alice", "payments.charge", args=[Argument(name="card", handle=handle), secret]
    )
    assert pending.outcome is Outcome.PENDING, pending
    assert world.propose("alice", "kb.search", args=[secret]).outcome is Outcome.ALLOW
    # mallory names alice's pending proposal with the right digest: not authorized
    bogus = world.confirm(world.keys["mallory"], pending.proposal_id, pending.card_digest)
    assert bogus.outcome is Outcome.REJECTED and bogus.proposal_id == pending.proposal_id
    bogus_height = world.height
    done = world.confirm(world.keys["principal:ada"], pending.proposal_id, pending.card_digest)
    assert done.outcome is Outcome.ALLOW, done
    confirmed_height = world.height
    # after the confirmation, a Confirm that settles nothing names it again
    late = world.confirm(world.keys["mallory"], pending.proposal_id, pending.card_digest)
    assert late.outcome is Outcome.REJECTED

    denial_heights: list[int] = []
    # one block: two denials of one canonical target (aliases), an allow, another target
    call = Proposal(run_id="r", tool="wire.transfer", target="https://bank.example/")
    alias = Proposal(run_id="r2", tool="WIRE.transfer", target="HTTPS://BANK.example:443")
    ambient = Proposal(
        run_id="r",
        tool="kb.search",
        target="https://kb.example/",
        arguments=(Argument(name="user_id", text=ARGUMENT_SECRET),),
    )
    allowed = Proposal(run_id="r", tool="kb.search", target="https://kb.example/")
    result = world.block(
        [
            world.tx(world.keys["mallory"], call),
            world.tx(world.keys["bob"], allowed),
            world.tx(world.keys["bob"], alias),
            world.tx(world.keys["bob"], ambient),
        ]
    )
    assert len(result.artifacts) == 2
    denial_heights.append(world.height)
    # the latch: out_of_scope, repeat_denied, run_halted at one target over three heights
    for _ in range(3):
        verdict = world.propose("mallory", "kb.search", args=[secret])
        assert verdict.outcome is Outcome.DENY
        denial_heights.append(world.height)
    # a denial whose argument name is itself refused, with the value planted as a secret
    verdict = world.propose(
        "bob", "kb.search", "https://kb.example/q", args=[Argument("chat_id", ARGUMENT_SECRET)]
    )
    assert verdict.reason is Reason.AMBIENT_IDENTITY_ARGUMENT
    denial_heights.append(world.height)
    world.propose("alice", "notes.write", "/tmp/x", args=[Argument("password", ARGUMENT_SECRET)])
    world.advance(5_000)  # an empty block: a height without verdicts
    world.propose("alice", "kb.search", args=[secret])
    return Story(world, pending.proposal_id, bogus_height, confirmed_height, denial_heights)


def big_block_world(verdicts: int = 500, agents: int = 5) -> World:
    """A world whose last block holds `verdicts` proposals from `agents` agents, most
    allowed, one in five denied (spread over 25 targets, so 25 artifacts)."""
    world = World(overrides={"quota_proposals_max": verdicts + 1, "latch_runs_max": 4096})
    world.add_tool("kb.search")
    world.add_tool("wire.transfer")
    names = [f"agent{i}" for i in range(agents)]
    for name in names:
        world.add_agent(name, ["kb.search"])
    txs: list[bytes] = []
    for i in range(verdicts):
        name = names[i % agents]
        if i % 5 == 4:
            proposal = Proposal(
                run_id=f"run-{i}",
                tool="wire.transfer",
                target=f"https://bank{(i // 5) % 25}.example/",
            )
        else:
            proposal = Proposal(
                run_id=f"run-{i}",
                tool="kb.search",
                target=f"https://kb.example/{i}",
                arguments=(Argument(name="q", text=f"question {i}"),),
            )
        txs.append(world.tx(world.keys[name], proposal))
    world.block(txs)
    return world


def write_around_the_store(path: Path, sql: str, params: tuple[object, ...] = ()) -> int:
    """Change the file as an outside tool would (the store must be closed: it holds the
    file's lock while open). Returns the number of rows changed."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(sql, params).rowcount
    finally:
        conn.close()


def read_around_the_store(
    path: Path, sql: str, params: tuple[object, ...] = ()
) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return list(conn.execute(sql, params))
    finally:
        conn.close()


async def record_all(store: SidecarStore, heights: list[ExecutedHeight]) -> None:
    for h in heights:
        await store.record(h)


async def recorded_file(path: Path, heights: list[ExecutedHeight]) -> Path:
    """A closed store file at `path` holding every height of `heights`."""
    store = await SidecarStore.open(path, CHAIN)
    await record_all(store, heights)
    await store.close()
    return path
