"""Settings in the log (docs/engine.md): latch thresholds, quotas per agent, per tool and
per run (per minute and per hour), the confirmation TTL and grant limits are owner-signed
`SetSettings` operations, in the state and in the fingerprint of the configuration in
effect. Each test first shows the hard-wired value as it was, then the setting."""

from __future__ import annotations

import pytest

from quorumgate.proto import limits
from quorumgate.proto.model import (
    Admin,
    DelegationPolicy,
    Outcome,
    Reason,
    SetSettings,
    ToolMode,
)
from quorumgate.sidecar.engine.config import EngineConfig, effective_fingerprint
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import EngineState
from tests.engine.harness import World, replay

MINUTE = 60_000


def world(**overrides: int) -> World:
    w = World(overrides={"latch_cross_run_threshold": 1_000, **overrides})
    w.add_tool("http.get", mode=ToolMode.READ)
    w.add_tool("mail.send", schemes=("mailto",))
    return w


def settings(w: World, clear: tuple[str, ...] = (), **values: int) -> Reason:
    op = SetSettings(values=tuple(sorted(values.items())), clear=clear)
    return w.one(w.owner, Admin(op)).reason


def calls(
    w: World, agent: str, n: int, *, run: str = "run-1", tool: str = "http.get"
) -> list[Reason]:
    """`n` calls in one block each, 10 ms of block time apart."""
    return [w.propose(agent, tool, run=run, advance_ms=10).reason for _ in range(n)]


def test_an_orchestrator_over_120_calls_a_minute_is_no_longer_stuck_with_the_default() -> None:
    w = world()
    w.add_agent("orchestrator", ["http.get"])
    made = calls(w, "orchestrator", limits.QUOTA_PROPOSALS_MAX_DEFAULT + 1)
    assert made[-1] is Reason.QUOTA_EXCEEDED  # the hard-wired 120 per minute
    assert made[:-1] == [Reason.OK] * limits.QUOTA_PROPOSALS_MAX_DEFAULT
    w.advance(MINUTE)
    assert settings(w, quota_agent_per_minute=1_000) is Reason.OK
    made = calls(w, "orchestrator", 300)
    assert made == [Reason.OK] * 300


def test_quotas_per_agent_per_tool_and_per_run_per_minute_and_hour() -> None:
    w = world()
    w.add_agent("a", ["http.get", "mail.send"])
    assert settings(w, quota_tool_per_minute=3, quota_run_per_hour=5, quota_agent_per_hour=7) is (
        Reason.OK
    )
    # per (agent, tool) per minute: the 4th http.get is refused, mail.send still runs
    assert calls(w, "a", 4) == [Reason.OK] * 3 + [Reason.QUOTA_EXCEEDED]
    mail = w.propose("a", "mail.send", "mailto:b@example.com", advance_ms=10)
    assert mail.reason is Reason.OK
    # per run per hour: 5 in run-1 (3 + 1 + this one), then refused in it, not in run-2
    w.advance(MINUTE)
    assert calls(w, "a", 2) == [Reason.OK, Reason.QUOTA_EXCEEDED]
    assert calls(w, "a", 1, run="run-2") == [Reason.OK]
    # per agent per hour: 7 counted calls (refusals count nowhere), then refused everywhere
    assert calls(w, "a", 2, run="run-3") == [Reason.OK, Reason.QUOTA_EXCEEDED]
    # the next hour of block time starts every window again
    w.advance(3_600_000)
    assert calls(w, "a", 1) == [Reason.OK]


def test_a_quota_refusal_is_not_latched_and_does_not_count() -> None:
    w = world()
    w.add_agent("a", ["http.get"])
    settings(w, quota_agent_per_minute=2)
    assert calls(w, "a", 5) == [Reason.OK, Reason.OK] + [Reason.QUOTA_EXCEEDED] * 3
    w.advance(MINUTE)
    assert calls(w, "a", 2) == [Reason.OK, Reason.OK]  # nothing halted, nothing carried over


def test_the_latch_threshold_is_a_setting() -> None:
    w = world()
    w.add_agent("a", ["http.get"])

    def probe(run: str) -> list[Reason]:
        return [
            w.propose("a", "mail.send", "mailto:b@example.com", run=run).reason for _ in range(3)
        ]

    assert probe("run-1")[-1] is Reason.RUN_HALTED  # the default: 3 attempts halt the run
    assert settings(w, latch_halt_threshold=10) is Reason.OK
    assert probe("run-2") == [Reason.OUT_OF_SCOPE, Reason.REPEAT_DENIED, Reason.REPEAT_DENIED]


def test_the_confirmation_ttl_and_grant_limits_are_settings() -> None:
    w = world()
    w.add_tool("pay.send", mode=ToolMode.USER_CONFIRM)
    w.add_agent("boss", ["pay.send", "http.get"], policy=DelegationPolicy.ATTENUATED)
    w.add_agent("helper", None)
    assert settings(w, confirmation_ttl_ms=5_000) is Reason.OK
    first = w.propose("boss", "pay.send")
    second = w.propose("boss", "pay.send", advance_ms=0)
    assert first.card is not None and second.card is not None
    assert first.card.expires_at_ms == w.time_ms + 5_000  # not the default 300 s
    w.advance(3_000)
    assert w.confirm(w.owner, first.proposal_id, first.card.digest).outcome is Outcome.ALLOW
    w.advance(3_000)
    # past the TTL the card has left the state: nothing to confirm any more
    late = w.confirm(w.owner, second.proposal_id, second.card.digest)
    assert late.reason is Reason.UNKNOWN_PROPOSAL
    # a grant may last at most grant_ttl_ms_max
    assert settings(w, grant_ttl_ms_max=10_000) is Reason.OK
    assert w.delegate("boss", "helper", expires_in_ms=60_000).reason is (
        Reason.DELEGATION_EXPIRY_INVALID
    )
    assert w.delegate("boss", "helper", expires_in_ms=5_000).outcome is Outcome.APPLIED
    # grants per agent: at most cluster.json's (it sizes memory), lowered by the log
    assert settings(w, grants_per_agent_max=1) is Reason.OK
    refused = w.delegate("boss", "helper", run="run-2", expires_in_ms=5_000)
    assert refused.reason is Reason.CAPACITY_EXCEEDED
    assert settings(w, grants_per_agent_max=w.config.grants_per_agent_max + 1) is (
        Reason.INVALID_SPEC
    )
    assert settings(w, delegation_depth_max=w.config.delegation_depth_max + 1) is (
        Reason.INVALID_SPEC
    )


def test_values_out_of_range_and_unknown_names_are_refused() -> None:
    w = world()
    assert settings(w, latch_halt_threshold=0) is Reason.INVALID_SPEC
    assert settings(w, confirmation_ttl_ms=0) is Reason.INVALID_SPEC
    assert settings(w, quota_agent_per_minute=2**32) is Reason.INVALID_SPEC
    with pytest.raises(ValueError, match="unknown setting"):
        SetSettings(values=(("quota_per_day", 5),))
    with pytest.raises(ValueError, match="both set and cleared"):
        SetSettings(values=(("latch_halt_threshold", 5),), clear=("latch_halt_threshold",))
    # nothing of a refused operation is applied
    assert w.engine.state.settings == {}


def test_only_the_owner_sets_and_only_on_a_version_3_chain() -> None:
    w = world()
    key = w.add_agent("a", ["http.get"])
    verdict = w.one(key, Admin(SetSettings(values=(("latch_halt_threshold", 9),))))
    assert verdict.reason is Reason.NOT_OWNER
    old = World(overrides={"canonical_version": 2})
    assert settings(old, latch_halt_threshold=9) is Reason.INVALID_SPEC


def test_settings_are_in_the_fingerprint_the_state_and_a_replay() -> None:
    w = world()
    w.add_agent("a", ["http.get"])
    base = w.config.fingerprint
    assert w.engine.state.config_fingerprint == base
    settings(w, latch_halt_threshold=7, quota_tool_per_minute=50)
    calls(w, "a", 3)
    state = w.engine.state
    assert state.config_fingerprint == effective_fingerprint(w.config, state.settings) != base
    data = w.engine.state_bytes()
    decoded = EngineState.from_bytes(data)
    assert decoded.to_bytes() == data and decoded.settings == state.settings
    assert decoded.quota_counters == state.quota_counters and state.quota_counters
    engine, _ = replay(w)
    assert engine.state_bytes() == data
    # a sidecar whose cluster.json differs cannot load this state, settings or not
    other = EngineConfig(
        chain_id=w.config.chain_id,
        owner_public_key=w.config.owner_public_key,
        latch_halt_threshold=4,
    )
    with pytest.raises(ValueError, match="different EngineConfig"):
        Engine(other, EngineState.from_bytes(data))
    # clearing every setting gives back cluster.json's fingerprint (and drops the counters)
    settings(w, clear=("latch_halt_threshold", "quota_tool_per_minute"))
    assert w.engine.state.config_fingerprint == base and not w.engine.state.quota_counters


def test_the_counter_table_is_bounded_and_keeps_the_agents_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "QUOTA_COUNTERS_MAX", 4)
    w = world()
    w.add_agent("a", ["http.get"])
    settings(w, quota_agent_per_minute=100, quota_run_per_minute=100)
    for k in range(6):
        assert calls(w, "a", 1, run=f"run-{k}") == [Reason.OK]
    counters = w.engine.state.quota_counters
    assert len(counters) <= 4
    assert counters[("agent", "minute", "a")].count == 6  # never evicted
    engine, _ = replay(w)
    assert engine.state_bytes() == w.engine.state_bytes()


def test_the_certificate_ttl_is_a_setting_on_a_chain_whose_receipts_expire() -> None:
    """What the sidecars sign into each block's receipts as the end of its certificates'
    window (block time plus this TTL): minutes by default, the owner's setting in the log
    within its bounds, and no setting at all on a chain whose certificates carry no window
    (its receipts sign what they always did, so a replay of its log is unchanged)."""
    w = world()
    assert w.engine.certificate_ttl_ms() == limits.CERTIFICATE_TTL_MS_DEFAULT == 300_000
    assert settings(w, certificate_ttl_ms=20_000) is Reason.OK
    assert w.engine.certificate_ttl_ms() == 20_000
    for bad in (limits.CERTIFICATE_TTL_MS_MIN - 1, limits.CERTIFICATE_TTL_MS_MAX + 1):
        assert settings(w, certificate_ttl_ms=bad) is Reason.INVALID_SPEC
    assert w.engine.certificate_ttl_ms() == 20_000
    assert settings(w, clear=("certificate_ttl_ms",)) is Reason.OK
    assert w.engine.certificate_ttl_ms() == 300_000
    before = world(receipt_version=1)
    assert before.engine.certificate_ttl_ms() is None
    assert settings(before, certificate_ttl_ms=20_000) is Reason.INVALID_SPEC
    assert settings(before, clear=("certificate_ttl_ms",)) is Reason.INVALID_SPEC
    assert before.engine.certificate_ttl_ms() is None
