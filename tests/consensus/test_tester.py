"""The tester is tested (relab/hotstuff's twins tester; STYLE "the simulator must catch a
known-bad rule"): deliberately broken cores must make the seeded simulation fail, with a
message that names the violation and how to reproduce it, while the same scenarios pass
with the honest core.
"""

from __future__ import annotations

import pytest

import quorumgate.replica.sim as sim_module
from quorumgate.replica.core import Core
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim import UNSAFE_VARIANTS, SimOptions, Simulation, SimulationFailure

SEEDS = range(20)


def options(seed: int, unsafe: str | None) -> SimOptions:
    return SimOptions(
        seed=seed,
        n=4,
        byzantine=("fork_leader",),
        ticks=600,
        delay_ticks_max=2,
        victim_delay_ticks=60,
        unsafe=unsafe,
    )


def failure_of(opts: SimOptions) -> str | None:
    try:
        Simulation(opts).run()
    except SimulationFailure as failure:
        return str(failure)
    return None


@pytest.mark.parametrize("variant", UNSAFE_VARIANTS)
def test_the_simulation_catches_an_unsafe_variant_within_20_seeds(variant: str) -> None:
    """no_lock drops Rule 2 (HotStuff §4.3 safeNode); two_chain_commit commits on a
    2-chain without the matching lock (HotStuff §5 needs three). Both must be caught."""
    caught: list[tuple[int, str]] = []
    for seed in SEEDS:
        text = failure_of(options(seed, variant))
        if text is not None:
            caught.append((seed, text))
    assert caught, f"{variant} survived seeds {SEEDS.start}..{SEEDS.stop - 1}"
    for seed, text in caught:
        assert "SAFETY" in text, text
        assert f"seed={seed}" in text and f"unsafe={variant!r}" in text, text
    # The message reproduces the failure: the same options fail the same way again.
    seed, text = caught[0]
    assert failure_of(options(seed, variant)) == text


def test_the_same_scenarios_pass_with_the_honest_rules() -> None:
    """So it is the broken rule that fails, not the scenario."""
    failures = [text for seed in SEEDS if (text := failure_of(options(seed, None)))]
    assert failures == []


class NeverPersists(Core):
    """Broken on purpose: asks the shell to persist nothing, yet sends what it signs."""

    def _persist(self, state: SafetyState) -> None:
        pass


class NeverProposes(Core):
    """Broken on purpose: a leader that never proposes (safe, but no progress)."""

    def _maybe_propose(self) -> None:
        pass


def test_the_simulation_catches_a_send_before_its_safety_state_is_durable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sim_module.CORE_CLASSES, None, NeverPersists)
    text = failure_of(SimOptions(seed=3, ticks=200))
    assert text is not None and "durable" in text and "seed=3" in text, text


def test_the_simulation_catches_a_cluster_that_stops_committing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sim_module.CORE_CLASSES, None, NeverProposes)
    text = failure_of(SimOptions(seed=4, ticks=100, liveness_ticks_max=600))
    assert text is not None and "LIVENESS" in text and "seed=4" in text, text
