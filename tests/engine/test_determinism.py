"""Determinism: the same log in, the same bytes out, on every honest sidecar.

A hypothesis generator builds random logs of every transaction kind - sensible ones,
adversarial ones and garbage - against a small universe of agents, tools and runs, runs
them through one engine while drawing, then replays the log through a second engine and a
third one restored from state bytes half-way, and compares every byte.
"""

from __future__ import annotations

import hashlib
from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from quorumgate.proto import limits, tx
from quorumgate.proto.model import (
    Admin,
    Argument,
    Confirm,
    Delegate,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    KeyHolder,
    Mandate,
    Outcome,
    Proposal,
    RegisterTool,
    Resume,
    Revoke,
    RoleTarget,
    RotateKey,
    RuleKind,
    SealedValue,
    SealEnvelope,
    SetMandate,
    SetRunTargets,
    SetSettings,
    Suspend,
    TargetRule,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    TxPayload,
    canonical_tool_list,
)
from quorumgate.sidecar.engine import provenance
from quorumgate.sidecar.engine.core import Engine, StateCacheError
from quorumgate.sidecar.engine.state import SECTIONS, EngineState, Grant
from quorumgate.sidecar.engine.statements import BlockResult
from quorumgate.sidecar.engine.statetree import key_bytes
from tests.engine.harness import World, replay, signing_key

AGENTS = ("ann", "ben", "cyd")
PRINCIPALS = ("pia", "quo")  # split authority: the people who answer cards
TOOLS = ("kb.search", "tickets.open", "pay.refund", "post.publish", "crm.status", "card.use")
RUNS = ("r1", "r2", "run-3")
TARGETS = (
    "https://Example.com:443/a/./b", "https://example.com/a/b", "/srv/../srv/x", "CURRENT_USER",
    "principal:ann", "principal:ben", "", "https://u:p@example.com/", "rel", "https://h/?user_id=1",
    "file:///srv/x", "https://bücher.example/",
)  # fmt: skip
ARG_NAMES = ("q", "memo", "card", "chat_id", "password", "Q")
WATCHERS = (
    ("watcher", "mailto:a@example.com"), ("watcher", "mailto:a@EXAMPLE.com"),
    ("watcher", "principal:ben"), ("watcher", "CURRENT_USER"), ("cc", "mailto:b@example.com"),
    ("watcher", "tel:+4930123456"),
)  # fmt: skip
CHOICES = [
    *["propose"] * 8,
    *["confirm"] * 3,
    *["delegate"] * 2,
    "revoke",
    "seal",
    "mandate",
    "suspend",
    "settings",
    "intent",
    "rotate",
]
ROTATION_REASONS = ("not_key_holder", "bad_key_proof", "key_rotated", "key_in_use")
# every key a drawn rotation named, by public key: the world follows the engine to them
ROTATED: dict[bytes, SigningKey] = {}
# settings in the log: small values, so the draws reach them
SETTING_DRAWS = {
    "latch_halt_threshold": (1, 4),
    "quota_agent_per_minute": (0, 6),
    "quota_tool_per_minute": (0, 4),
    "quota_run_per_hour": (0, 8),
    "confirmation_ttl_ms": (1_000, 20_000),
    "grants_per_agent_max": (1, 3),
}
# rules that read a run's exposure, and run targets (some without a canonical form)
EXPOSED_RULES = (
    ToolRules("kb.search", (TargetRule(RuleKind.ANY, when_exposed=ToolMode.USER_CONFIRM),)),
    ToolRules(
        "pay.refund",
        (TargetRule(RuleKind.ANY, mode=ToolMode.DIRECT, when_exposed=ToolMode.OWNER_CONFIRM),),
    ),
)
INTENT_TARGETS = ("https://example.com/a", "HTTPS://Example.com/a", "/srv/x", "https://h/ x")
GOOD_TARGETS = {
    "kb.search": ("https://example.com/a", "/srv/x"),
    "tickets.open": ("CURRENT_USER", "https://example.com/t"),
    "pay.refund": ("https://pay.example/r/1", "https://pay.example/r/2"),
    "post.publish": ("",),
    "crm.status": ("", "CURRENT_USER"),
    "card.use": ("https://shop.example/",),
}


def _world() -> World:
    world = World(
        overrides={
            "latch_runs_max": 4,
            "latch_halt_threshold": 3,
            "quota_proposals_max": 12,
            "quota_window_ms": 20_000,
            "confirmation_ttl_ms": 15_000,
            "pending_per_principal_max": 3,
            "grants_per_agent_max": 3,
            "handles_per_principal_max": 3,
            "expired_retention_ms": 30_000,
        }
    )
    world.add_sink("vault")
    world.add_tool("kb.search", mode=ToolMode.READ, schemes=("https", "file"))
    world.add_tool(
        "tickets.open",
        schemes=("https", "principal"),
        target_roles=(TargetSlot("watcher", ("mailto", "principal"), max=2),),
    )
    world.add_tool("pay.refund", mode=ToolMode.USER_CONFIRM, min_tier=Tier.MASTER)
    world.add_tool("post.publish", mode=ToolMode.OWNER_CONFIRM, schemes=())
    world.add_tool("crm.status", schemes=(), sink="vault", binds_caller=True)
    world.add_tool("card.use", sink="vault", envelope_args=(EnvelopeArg(name="card", kind="card"),))
    # provenance (docs/provenance.md): a search's results are untrusted, so runs get exposed
    searching = world.engine.state.tools["kb.search"]
    world.admin(RegisterTool(spec=replace(searching, untrusted_results=True)))
    for person in PRINCIPALS:
        world.add_principal(person)
    for agent, person in zip(AGENTS, ("pia", "pia", ""), strict=True):  # cyd: the owner's
        world.add_agent(agent, None, policy=DelegationPolicy.ATTENUATED, depth=2, principal=person)
    return world


def _maybe(data: st.DataObject, items: list[bytes]) -> bool:
    """Draw whether to use one of `items` (never when there is none)."""
    return bool(items) and data.draw(st.booleans())


def _draw_payload(data: st.DataObject, world: World) -> tuple[str, TxPayload]:
    """One random transaction (signer name, payload), using ids from what already ran."""
    verdicts = [v for result in world.results for v in result.verdicts]
    grants = [
        v.tx_id for v in verdicts if v.kind.value == "delegate" and v.outcome is Outcome.APPLIED
    ]
    pendings = [v for v in verdicts if v.outcome is Outcome.PENDING]
    handles = [v.subject for v in verdicts if v.kind.value == "seal_envelope" and v.subject]
    choice = data.draw(st.sampled_from(CHOICES))
    signer = data.draw(st.sampled_from(AGENTS))
    if choice == "propose":
        args = tuple(
            Argument(name=name, handle=data.draw(st.sampled_from(handles)))
            if bool(handles) and data.draw(st.booleans())
            else Argument(name=name, text="v")
            for name in data.draw(st.lists(st.sampled_from(ARG_NAMES), max_size=2, unique=True))
        )
        grant = data.draw(st.sampled_from(grants)) if _maybe(data, grants) else None
        tool = data.draw(st.sampled_from((*TOOLS, "no.such", "KB.Search")))
        good = GOOD_TARGETS.get(tool.lower(), ("",))
        target = data.draw(st.sampled_from(good if data.draw(st.integers(0, 3)) else TARGETS))
        further = data.draw(
            st.lists(st.sampled_from(WATCHERS), max_size=3)
            if tool == "tickets.open"
            else st.just([])
        )
        payload: TxPayload = Proposal(
            run_id=data.draw(st.sampled_from(RUNS)),
            tool=tool,
            target=target,
            arguments=args,
            grant=grant,
            targets=tuple(RoleTarget(role, value) for role, value in further),
        )
        return signer, payload
    if choice == "confirm" and pendings:
        pending = data.draw(st.sampled_from(pendings))
        digest = pending.card_digest if data.draw(st.booleans()) else hashlib.sha256(b"x").digest()
        who = data.draw(st.sampled_from((*AGENTS, "owner", "principal:pia", "principal:quo")))
        reject = data.draw(st.booleans()) and data.draw(st.booleans())
        return who, Confirm(proposal_id=pending.proposal_id, card_digest=digest, reject=reject)
    if choice == "delegate":
        child = data.draw(st.sampled_from([a for a in AGENTS if a != signer]))
        tools = data.draw(st.none() | st.lists(st.sampled_from(TOOLS), max_size=3))
        return signer, Delegate(
            child=bytes(signing_key(child).verify_key),
            run_id=data.draw(st.sampled_from(RUNS)),
            tools=None if tools is None else canonical_tool_list(tools),
            expires_at_ms=world.time_ms + data.draw(st.integers(-5_000, 60_000)) or 1,
            parent_grant=data.draw(st.sampled_from(grants)) if _maybe(data, grants) else None,
        )
    if choice == "revoke" and grants:
        return data.draw(st.sampled_from((*AGENTS, "owner"))), Revoke(
            grant=data.draw(st.sampled_from(grants))
        )
    if choice == "seal":
        return signer, SealEnvelope(
            kind=data.draw(st.sampled_from(["card", "phone"])),
            sealed=(
                SealedValue(sink="vault", ciphertext=bytes(48 + data.draw(st.integers(0, 8)))),
            ),
        )
    if choice == "mandate":
        tools = data.draw(st.none() | st.lists(st.sampled_from(TOOLS), min_size=1, max_size=4))
        mandate = Mandate(
            allowed_tools=None if tools is None else canonical_tool_list(tools),
            enforcement=data.draw(st.sampled_from(Enforcement)),
            suspended=data.draw(st.booleans()) and data.draw(st.booleans()),
            delegation_policy=data.draw(st.sampled_from(DelegationPolicy)),
            max_delegation_depth=data.draw(st.none() | st.integers(0, 3)),
            rules=EXPOSED_RULES if tools is None and data.draw(st.booleans()) else (),
        )
        return "owner", Admin(op=SetMandate(agent_id=signer, mandate=mandate))
    if choice == "intent":
        # a run's own targets, named by anyone (only its principal or the owner applies)
        targets = data.draw(st.lists(st.sampled_from(INTENT_TARGETS), max_size=3, unique=True))
        run = f"n{data.draw(st.integers(1, 12))}"
        op = SetRunTargets(agent_id=signer, run_id=run, targets=tuple(sorted(targets)))
        who = data.draw(st.sampled_from(("owner", signer, "principal:pia", "principal:quo")))
        return who, Admin(op=op)
    if choice == "rotate":
        return _draw_rotation(data, world, signer)
    if choice == "suspend":
        op = Suspend(agent_id=signer) if data.draw(st.booleans()) else Resume(agent_id=signer)
        return "owner", Admin(op=op)
    if choice == "settings":
        names = data.draw(st.lists(st.sampled_from(sorted(SETTING_DRAWS)), max_size=3, unique=True))
        values = tuple(sorted((n, data.draw(st.integers(*SETTING_DRAWS[n]))) for n in names))
        clear = tuple(
            sorted(n for n in SETTING_DRAWS if n not in names and data.draw(st.booleans()))
        )
        return data.draw(st.sampled_from(("owner", signer))), Admin(SetSettings(values, clear[:2]))
    return signer, Proposal(run_id="r1", tool="kb.search", target="https://example.com/")


def _draw_rotation(data: st.DataObject, world: World, agent: str) -> tuple[str, TxPayload]:
    """A key rotation (docs/engine.md, "Rotating keys"), mostly well formed: signed by the
    holder, the owner or an agent, its proof by the new key or a stranger, to a new key or
    one in use."""
    holder = data.draw(st.sampled_from(KeyHolder))
    subject = {
        KeyHolder.AGENT: agent, KeyHolder.PRINCIPAL: data.draw(st.sampled_from(PRINCIPALS)),
        KeyHolder.OWNER: "",
    }[holder]  # fmt: skip
    name = {KeyHolder.AGENT: subject, KeyHolder.PRINCIPAL: "principal:" + subject}.get(
        holder, "owner"
    )
    new = signing_key(f"rotated/{name}/{world.height}/{data.draw(st.integers(0, 2))}")
    if data.draw(st.integers(0, 5)) == 0:
        new = _key(world, data.draw(st.sampled_from((*AGENTS, "owner"))))  # a key in use
    ROTATED[bytes(new.verify_key)] = new
    old = bytes(_key(world, name).verify_key)
    op = tx.rotate_key_op(world.config.chain_id, holder, subject, old, new)
    if data.draw(st.integers(0, 5)) == 0:  # a stranger's proof
        stranger = tx.rotate_key_op(world.config.chain_id, holder, subject, old, signing_key("x"))
        op = RotateKey(holder, subject, op.new_public_key, stranger.proof)
    return data.draw(st.sampled_from((name, name, "owner", agent))), Admin(op=op)


def _follow_rotations(world: World) -> None:
    """Sign with the keys the engine now holds: after an applied rotation the identity's
    nonces continue under its new key."""
    state = world.engine.state
    held = {agent: state.agents[agent].public_key for agent in AGENTS}
    held.update({"principal:" + p: state.principals[p].public_key for p in PRINCIPALS})
    held["owner"] = world.engine.owner_key()
    for name, key in held.items():
        if key != bytes(_key(world, name).verify_key):
            event(f"rotation applied: {name.split(':')[0]}")
            if name == "owner":
                world.owner = ROTATED[key]
            else:
                world.keys[name] = ROTATED[key]
            next_nonce = world.engine.next_nonce(key)
            assert next_nonce is not None
            world.nonces[key] = next_nonce - 1


def _key(world: World, name: str) -> SigningKey:
    return world.owner if name == "owner" else world.keys[name]


def _assert_same(a: BlockResult, b: BlockResult, chain_id: str) -> None:
    assert a.state_root == b.state_root
    assert [v.statement(chain_id, a.height) for v in a.verdicts] == [
        v.statement(chain_id, b.height) for v in b.verdicts
    ]
    assert [x.to_bytes() for x in a.artifacts] == [x.to_bytes() for x in b.artifacts]
    assert a == b


@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_logs_give_byte_identical_results_on_every_engine(data: st.DataObject) -> None:
    world = _world()
    setup_blocks = len(world.log)
    blocks = data.draw(st.integers(4, 16))
    for _ in range(blocks):
        txs: list[bytes] = []
        for _ in range(data.draw(st.integers(0, 8))):
            kind = data.draw(st.sampled_from(["tx"] * 8 + ["replay", "garbage"]))
            earlier = [t for _, _, logged in world.log[setup_blocks:] for t in logged]
            if kind == "replay" and earlier:
                txs.append(data.draw(st.sampled_from(earlier)))
            elif kind == "garbage":
                txs.append(data.draw(st.binary(max_size=40)))
            else:
                signer, payload = _draw_payload(data, world)
                txs.append(world.tx(_key(world, signer), payload))
        result = world.block(txs, advance_ms=data.draw(st.sampled_from([0, 1, 1_000, 9_000])))
        assert len(result.verdicts) == len(txs)
        for verdict in result.verdicts:
            if verdict.kind.value == "admin" and verdict.reason.value in ROTATION_REASONS:
                event(f"rotation: {verdict.reason.value}")  # --hypothesis-show-statistics
        _follow_rotations(world)
        # the root is the tree over the state's entries (state version 2, what a reload
        # gives too), and the bytes round-trip exactly
        state = world.engine.state_bytes()
        assert result.state_root == world.engine.state.fresh_tree_root()
        reloaded = Engine.from_state_bytes(world.config, state)
        assert reloaded.state_bytes() == state
        assert reloaded.state_root() == result.state_root
        _assert_bounded(world)

    second, results = replay(world)
    for a, b in zip(world.results, results, strict=True):
        _assert_same(a, b, world.config.chain_id)
    assert second.state_bytes() == world.engine.state_bytes()

    # a sidecar restored from state bytes half-way continues byte for byte
    half = len(world.log) // 2
    first_half = Engine(world.config)
    for height, time_ms, txs in world.log[:half]:
        first_half.execute_block(height, time_ms, txs)
    restored = Engine.from_state_bytes(world.config, first_half.state_bytes())
    for (height, time_ms, txs), original in zip(
        world.log[half:], world.results[half:], strict=True
    ):
        _assert_same(restored.execute_block(height, time_ms, txs), original, world.config.chain_id)


def _assert_bounded(world: World) -> None:
    state, config = world.engine.state, world.config
    assert len(state.latch_runs) <= config.latch_runs_max
    assert all(
        len(r.buckets) <= config.latch_buckets_per_run_max for r in state.latch_runs.values()
    )
    assert len(state.pending) <= config.pending_max
    assert len(state.runs) <= provenance.RUN_RECORDS_MAX
    for agent in state.agents.values():
        assert len(agent.nonces.executed) <= config.nonce_window
        assert len(agent.recent_proposals_ms) <= config.quota_proposals_max
        assert sum(p.principal == agent.agent_id for p in state.pending.values()) <= (
            config.pending_per_principal_max
        )
        assert sum(g.grantor == agent.agent_id for g in state.grants.values()) <= (
            config.grants_per_agent_max
        )
        assert state.handles_by_owner.get(agent.agent_id, 0) <= config.handles_per_principal_max


def test_two_engines_fed_one_log_agree_byte_for_byte() -> None:
    world = _world()
    world.propose("ann", "kb.search", "https://EXAMPLE.com:443/./a")
    world.propose("ben", "pay.refund")
    world.propose("ben", "no.such")
    world.propose("cyd", "tickets.open", "principal:ann")
    world.delegate("ann", "ben", tools=["kb.search"])
    second, results = replay(world)
    for a, b in zip(world.results, results, strict=True):
        _assert_same(a, b, world.config.chain_id)
    assert second.state_bytes() == world.engine.state_bytes()


def test_a_different_config_is_a_different_state_root_and_refuses_foreign_state() -> None:
    world = _world()
    other = World(overrides={"latch_runs_max": 5})
    assert world.engine.state_root() != other.engine.state_root()
    try:
        Engine.from_state_bytes(other.config, world.engine.state_bytes())
    except ValueError:
        pass
    else:
        raise AssertionError("state from another config must be refused")


def test_heights_must_follow_and_block_time_must_not_go_back() -> None:
    world = _world()
    for height, time_ms in (
        (world.height + 2, world.time_ms + 1),
        (world.height + 1, world.time_ms - 1),
    ):
        try:
            world.engine.execute_block(height, time_ms, [])
        except ValueError:
            continue
        raise AssertionError("out-of-order block accepted")


@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_transactions_never_raise_out_of_execute_block(data: st.DataObject) -> None:
    """Remote garbage is an answer, never an exception: flip, cut and splice the bytes of
    valid transactions and run them unverified (the deepest path a body can reach)."""
    world = _world()
    world.verify = False
    valid = [world.tx(_key(world, s), p) for s, p in (_draw_payload(data, world) for _ in range(4))]
    mutated: list[bytes] = []
    for original in valid:
        body = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(body) - 1))
            body[at] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(body)))
        mutated.append(bytes(body[:cut]) + data.draw(st.binary(max_size=8)) + bytes(body[cut:]))
    result = world.block(valid + mutated)
    assert len(result.verdicts) == len(valid) + len(mutated)
    assert all(len(v.tx_id) == 32 for v in result.verdicts)


def test_a_record_changed_without_marking_it_is_caught_and_stops_execution() -> None:
    """The per-entry caches are an optimization only: after every block the engine
    re-encodes `STATE_CHECK_ENTRIES_PER_BLOCK` entries of a rotation over the state, and
    refuses to go on when one no longer says what the state holds."""
    world = _world()
    engine = world.engine
    engine.verify_state_cache()  # consistent so far
    # a record changed behind the engine's back, past the map (an unmarked write)
    ann = dict.__getitem__(engine.state.agents, "ann")
    ann.suspended = not ann.suspended
    engine._state_bytes = engine._state_root = None  # as at the start of a block
    assert engine.state.to_bytes() != engine.state.fresh_bytes()
    with pytest.raises(StateCacheError, match="stale at height"):
        engine.verify_state_cache()
    # execute_block finds it within one rotation over the state
    entries = sum(len(getattr(engine.state, name)) for name in SECTIONS)
    blocks = entries // limits.STATE_CHECK_ENTRIES_PER_BLOCK + 1
    with pytest.raises(StateCacheError, match="an entry of agents changed unmarked"):
        for _ in range(blocks):
            world.block([])


def test_reading_a_mutable_record_through_its_map_marks_it() -> None:
    """A record read through its section's map may be changed in place: the read marks
    it, so the change reaches the root and the store without any call to remember."""
    world = _world()
    state = world.engine.state
    state.take_delta()  # what a store got so far
    record = state.agents["ben"]
    record.suspended = not record.suspended
    state.root()  # serializes the change first
    delta = state.take_delta()
    agents = SECTIONS.index("agents")
    assert [(s, k) for s, k, _ in delta.changes] == [(agents, key_bytes("ben"))]
    assert state.to_bytes() == state.fresh_bytes()
    assert state.tree_root() == state.fresh_tree_root()
    assert state.take_delta().changes == ()  # taken once
    state.agents.get("ann")  # only read: marked, re-encoded, found equal, not a change
    assert state.take_delta().changes == ()


def test_grant_changes_and_removals_reach_the_delta_and_the_root() -> None:
    """The incremental state: a block re-encodes only the grants (and pending calls) it changed.
    Entries are frozen, so a change is a new object written into the map, which marks
    it; a removed entry leaves the caches and the delta says so."""

    def grant(i: int) -> Grant:
        return Grant(bytes([i]) * 32, "ann", f"kid{i}", "ann", "run", None, 1, 1, None, 10, 1)

    state = EngineState(b"f" * 32)
    state.grants = {g.grant_id: g for g in map(grant, range(3))}
    first = state.take_delta()
    grants = SECTIONS.index("grants")
    assert first.full and len(first.changes) == 3
    root = state.tree_root()
    assert root == state.fresh_tree_root()
    with pytest.raises(FrozenInstanceError):
        state.grants[bytes([1]) * 32].revoked = True  # type: ignore[misc]
    key = bytes([1]) * 32
    state.grants[key] = replace(state.grants[key], revoked=True)
    second = state.take_delta()
    assert not second.full
    assert [(s, k) for s, k, d in second.changes] == [(grants, key_bytes(key))]
    assert state.to_bytes() == state.fresh_bytes()
    assert state.tree_root() == state.fresh_tree_root() != root
    del state.grants[key]
    assert state.take_delta().changes == ((grants, key_bytes(key), None),)
    assert state.to_bytes() == state.fresh_bytes()
    assert state.tree_root() == state.fresh_tree_root()
    # a section assigned whole marks what it had and what it has
    state.grants = {}
    assert [d for _, _, d in state.take_delta().changes] == [None, None]
    assert state.tree_root() == state.fresh_tree_root() == EngineState(b"f" * 32).tree_root()


def test_counting_in_the_middle_of_a_transaction_keeps_the_marks_of_records_read() -> None:
    """The caps' counters (`EngineState.count`) and the expiry lookup run in the middle of
    a transaction; a record read before them and changed after must still reach the root.
    (Had they flushed the caches, its mark would be gone and the change lost.)"""
    world = _world()
    state = world.engine.state
    state.take_delta()
    record = state.agents["ann"]  # read (marked) ...
    assert state.count("pending", "ann") == 0  # ... a count in between ...
    assert state.expired("grants", 0) == []
    record.suspended = not record.suspended  # ... changed after
    assert state.to_bytes() == state.fresh_bytes()
    assert state.tree_root() == state.fresh_tree_root()
    agents = SECTIONS.index("agents")
    assert [(s, k) for s, k, _ in state.take_delta().changes] == [(agents, key_bytes("ann"))]
