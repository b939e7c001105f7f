"""The replicated denial latch (docs/engine.md, "Verdicts and reasons")."""

from __future__ import annotations

from quorumgate.proto.model import DelegationPolicy, Outcome, Proposal, Reason, Suspend
from quorumgate.sidecar.engine.core import Engine
from tests.engine.harness import World


def _world(**overrides: int) -> World:
    world = World(overrides=dict(overrides))
    for tool in ("kb.search", "tickets.open", "wire.transfer", "db.drop"):
        world.add_tool(tool)
    world.add_agent("alice", ["kb.search", "tickets.open"])
    return world


def test_first_denial_then_repeat_denied_then_the_third_attempt_halts_the_run() -> None:
    world = _world()
    reasons = [world.propose("alice", "wire.transfer").reason for _ in range(3)]
    assert reasons == [Reason.OUT_OF_SCOPE, Reason.REPEAT_DENIED, Reason.RUN_HALTED]


def test_a_halted_run_denies_in_scope_tools_too() -> None:
    world = _world()
    for _ in range(3):
        world.propose("alice", "wire.transfer")
    verdict = world.propose("alice", "kb.search")
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.RUN_HALTED)
    # the halt is per run: another run of the same agent is untouched
    assert world.propose("alice", "kb.search", run="run-2").outcome is Outcome.ALLOW


def test_threshold_is_configurable_and_counts_the_first_denial() -> None:
    world = _world(latch_halt_threshold=2)
    assert world.propose("alice", "wire.transfer").reason is Reason.OUT_OF_SCOPE
    assert world.propose("alice", "wire.transfer").reason is Reason.RUN_HALTED


def test_suspension_denials_are_not_latched() -> None:
    world = _world()
    world.admin(Suspend(agent_id="alice"))
    for _ in range(5):
        assert world.propose("alice", "kb.search").reason is Reason.SUSPENDED
    assert world.engine.state.latch_runs == {}


def test_quota_and_unknown_tool_denials_are_not_latched_on_version_1() -> None:
    world = _world(quota_proposals_max=2, canonical_version=1)
    world.propose("alice", "no.such.tool")
    world.propose("alice", "no.such.tool")
    assert world.propose("alice", "kb.search").reason is Reason.QUOTA_EXCEEDED
    assert world.engine.state.latch_runs == {}


def test_quota_denials_are_not_latched() -> None:
    world = _world(quota_proposals_max=1)
    world.propose("alice", "kb.search")
    assert world.propose("alice", "kb.search").reason is Reason.QUOTA_EXCEEDED
    assert world.engine.state.latch_runs == {}


def test_probes_count_toward_the_latch_on_version_2() -> None:
    """Where calls probe the latch: invented tools, another principal's targets and
    handles that are not the caller's are probes; a run that keeps probing is halted like
    one that keeps asking for a refused tool."""
    world = _world()
    first = world.propose("alice", "no.such.tool")
    assert (first.outcome, first.reason) == (Outcome.DENY, Reason.UNKNOWN_TOOL)
    assert world.propose("alice", "no.such.tool").reason is Reason.REPEAT_DENIED
    assert world.propose("alice", "no.such.tool").reason is Reason.RUN_HALTED
    assert world.propose("alice", "kb.search").reason is Reason.RUN_HALTED  # the whole run
    # many invented tools: each one a bucket, and too many buckets halt the run
    many = _world(latch_buckets_per_run_max=4)
    reasons = [many.propose("alice", f"invented.tool{k}", run="r2").reason for k in range(6)]
    assert reasons[:4] == [Reason.UNKNOWN_TOOL] * 4
    assert reasons[4:] == [Reason.RUN_HALTED] * 2


def test_new_mandate_version_clears_the_agents_buckets_and_halt() -> None:
    world = _world()
    for _ in range(3):
        world.propose("alice", "wire.transfer")
    assert world.propose("alice", "kb.search").reason is Reason.RUN_HALTED
    world.set_mandate("alice", ["kb.search", "tickets.open", "wire.transfer"])
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW
    assert world.propose("alice", "wire.transfer").outcome is Outcome.ALLOW


def test_new_mandate_version_of_one_agent_leaves_another_agents_buckets() -> None:
    world = _world()
    world.add_agent("bob", ["kb.search"])
    world.propose("alice", "wire.transfer")
    world.propose("bob", "wire.transfer")
    world.set_mandate("alice", ["kb.search"])
    assert world.propose("bob", "wire.transfer").reason is Reason.REPEAT_DENIED
    assert world.propose("alice", "wire.transfer").reason is Reason.OUT_OF_SCOPE


def test_same_run_id_of_different_agents_are_different_runs() -> None:
    """A run belongs to the agent that owns it: mallory cannot halt alice's run by naming
    its run id (a cross-principal effect)."""
    world = _world()
    world.add_agent("mallory", [])
    for _ in range(3):
        world.propose("mallory", "wire.transfer", run="alice-run")
    assert world.propose("mallory", "kb.search", run="alice-run").reason is Reason.RUN_HALTED
    assert world.propose("alice", "kb.search", run="alice-run").outcome is Outcome.ALLOW


def test_latch_holds_a_bounded_number_of_runs_and_evicts_the_least_recently_active() -> None:
    world = _world(latch_runs_max=3, latch_cross_run_threshold=1_000)  # runs, one by one
    for run in ("r1", "r2", "r3"):
        world.propose("alice", "wire.transfer", run=run)
    world.propose("alice", "kb.search", run="r1")  # r1 is active again; r2 is now oldest
    world.propose("alice", "wire.transfer", run="r4")  # evicts r2
    assert len(world.engine.state.latch_runs) == 3
    assert ("alice", "r2") not in world.engine.state.latch_runs
    # r2 starts counting again; r1 remembers
    assert world.propose("alice", "wire.transfer", run="r2").reason is Reason.OUT_OF_SCOPE
    assert world.propose("alice", "wire.transfer", run="r1").reason is Reason.REPEAT_DENIED


def test_latch_eviction_is_the_same_after_a_state_round_trip() -> None:
    world = _world(latch_runs_max=3)
    for run in ("r1", "r2", "r3"):
        world.propose("alice", "wire.transfer", run=run)
    world.propose("alice", "kb.search", run="r1")
    clone = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    data = world.tx(world.keys["alice"], _proposal("r4"))
    original = world.block([data])
    copied = clone.execute_block(world.height, world.time_ms, [data])
    assert copied.state_root == original.state_root
    assert set(clone.state.latch_runs) == set(world.engine.state.latch_runs)


def test_a_run_collecting_too_many_refused_tools_is_halted() -> None:
    world = _world(latch_buckets_per_run_max=2, latch_halt_threshold=10)
    assert world.propose("alice", "wire.transfer").reason is Reason.OUT_OF_SCOPE
    assert world.propose("alice", "db.drop").reason is Reason.OUT_OF_SCOPE
    world.add_tool("third.tool")
    assert world.propose("alice", "third.tool").reason is Reason.RUN_HALTED
    run = world.engine.state.latch_runs[("alice", world.run_of("alice", "run-1"))]
    assert len(run.buckets) == 2


def test_latch_survives_a_restart_from_state_bytes() -> None:
    world = _world()
    world.propose("alice", "wire.transfer")
    world.propose("alice", "wire.transfer")
    world.engine = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert world.propose("alice", "wire.transfer").reason is Reason.RUN_HALTED


def _proposal(run: str) -> Proposal:
    return Proposal(run_id=run, tool="wire.transfer", target="https://example.com/")


# ------------------------------------------------------------------ across runs


def test_a_fresh_run_id_does_not_reset_the_latch_for_a_refused_pair() -> None:
    """The attack: five fresh run ids gave five `out_of_scope` denials and no halt. Under
    authority version 2 a pair refused in `latch_cross_run_threshold` (3) runs is refused
    in every run, and counts toward that run's halt."""
    world = _world()
    reasons = [world.propose("alice", "wire.transfer", run=f"fresh-{k}").reason for k in range(5)]
    assert reasons == [Reason.OUT_OF_SCOPE] * 3 + [Reason.REPEAT_DENIED] * 2
    # the pair only: other tools, in scope, still run in a new run
    assert world.propose("alice", "kb.search", run="fresh-9").outcome is Outcome.ALLOW
    # inside one of those runs the refusal counted as its first: two more halt the run
    again = [world.propose("alice", "wire.transfer", run="fresh-4").reason for _ in range(2)]
    assert again == [Reason.REPEAT_DENIED, Reason.RUN_HALTED]


def test_the_cross_run_latch_is_cleared_by_a_new_mandate_and_keeps_its_own_threshold() -> None:
    world = _world(latch_cross_run_threshold=2)
    for k in range(2):
        assert world.propose("alice", "db.drop", run=f"a-{k}").reason is Reason.OUT_OF_SCOPE
    assert world.propose("alice", "db.drop", run="a-9").reason is Reason.REPEAT_DENIED
    world.set_mandate("alice", ["kb.search", "tickets.open", "db.drop"])
    assert world.propose("alice", "db.drop", run="a-10").outcome is Outcome.ALLOW
    assert world.engine.state.cross_run == {}


def test_chains_of_authority_version_1_keep_the_latch_per_run() -> None:
    world = _world(authority_version=1)
    reasons = [world.propose("alice", "wire.transfer", run=f"fresh-{k}").reason for k in range(5)]
    assert reasons == [Reason.OUT_OF_SCOPE] * 5
    assert world.engine.state.cross_run == {}


def test_the_cross_run_table_survives_the_state_bytes() -> None:
    world = _world()
    for k in range(2):
        world.propose("alice", "wire.transfer", run=f"r-{k}")
    assert world.engine.state.cross_run[("alice", "wire.transfer")].count == 2
    copy = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert copy.state.cross_run == world.engine.state.cross_run
    assert copy.state_bytes() == world.engine.state_bytes()


# ------------------------------------------------------------------ runs from committed data


def test_an_agent_cannot_name_its_run_only_open_one_with_a_transaction() -> None:
    """Where runs are opened by the chain, a run on the agent's own mandate is `n<k>`,
    k the nonce of the agent's transaction that opened it (proto/runs.py)."""
    world = World(raw_runs=True)
    world.add_tool("kb.search")
    world.add_agent("alice", ["kb.search"], policy=DelegationPolicy.ATTENUATED)
    world.add_agent("helper", ["kb.search"])
    key = world.keys["alice"]
    for invented in ("run-1", "ticket-42", "n0", "n999", "N3", "n03"):
        call = world.one(key, Proposal(run_id=invented, tool="kb.search", target="https://a.b/"))
        assert (call.outcome, call.reason) == (Outcome.DENY, Reason.RUN_NOT_OPENED), invented
    nonce = world.nonces[bytes(key.verify_key)] + 1
    opened = world.one(key, Proposal(run_id=f"n{nonce}", tool="kb.search", target="https://a.b/"))
    assert opened.outcome is Outcome.ALLOW  # this transaction opens run n<its nonce>
    later = world.one(key, Proposal(run_id=f"n{nonce}", tool="kb.search", target="https://a.b/"))
    assert later.outcome is Outcome.ALLOW  # and later ones act in it
    # a delegation chain starts in a run of its root's too
    bad = world.delegate("alice", "helper", run="made-up")
    assert (bad.outcome, bad.reason) == (Outcome.REJECTED, Reason.RUN_NOT_OPENED)
    grant = world.delegate("alice", "helper", run=f"n{nonce}")
    assert grant.outcome is Outcome.APPLIED
    under = world.propose("helper", "kb.search", run=f"n{nonce}", grant=grant.tx_id)
    assert under.outcome is Outcome.ALLOW  # a delegate acts in its grant's run


def test_chains_of_authority_version_1_keep_agent_named_runs() -> None:
    world = World(overrides={"authority_version": 1})
    world.add_tool("kb.search")
    world.add_agent("alice", ["kb.search"])
    assert world.propose("alice", "kb.search", run="ticket-42").outcome is Outcome.ALLOW
