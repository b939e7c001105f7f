"""Byzantine members and Twins schedules across epoch boundaries (docs/consensus/epochs.md,
"What the simulator checks"): f Byzantine members per epoch (twins, equivocating and
forking leaders) while owner changes commit, a rotated twin whose old machine keeps its old
key, an adversary holding the keys honest members were rotated away from, and the Twins
enumeration with a rotation and an add committed during its partition phases. The honest
core passes them; `retired_key_counts`, a core that still counts a retired key, and
`epoch_on_certified` are caught. `QG_SIM_SWEEP=full` runs bigger ranges (as
tests/consensus/test_scenarios.py does)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest

from quorumgate.replica.sim import (
    SimOptions,
    SimResult,
    Simulation,
    SimulationFailure,
    byzantine_reconfiguration_scenario,
    reconfiguration_scenario,
    scenario,
    twins_epoch_scenarios,
)
from tests.consensus.variants import EPOCH_VARIANTS

FULL = os.environ.get("QG_SIM_SWEEP") == "full"
# Seeds of the Byzantine reconfiguration scenarios per cluster size (a run takes about a
# third of a second at n = 4, twice that at n = 7), and Twins scenarios per behaviour.
HONEST_SEEDS = {4: range(200 if FULL else 40), 7: range(100 if FULL else 16)}
VARIANT_SEEDS = range(200 if FULL else 40)
TWINS_PER_BEHAVIOUR = {4: 30 if FULL else 8, 7: 10 if FULL else 3}
VARIANT_TWINS_PER_BEHAVIOUR = 8  # at n = 4, in every run
RETIRED = EPOCH_VARIANTS["retired_key_counts"]


def outcome(options: SimOptions) -> tuple[Simulation, SimResult | str]:
    """The simulation and its result, or the failure's text."""
    sim = Simulation(options)
    try:
        return sim, sim.run()
    except SimulationFailure as failure:
        return sim, str(failure)


def newest_epoch(sim: Simulation) -> int:
    return max(sim.nodes[i][0].epoch for i in sim.honest)


# --------------------------------------------------------------------------- the budget


@pytest.mark.parametrize(
    ("n", "byzantine", "members", "reconfigure"),
    [
        (7, ("twins", "equivocate"), (0, 1), ("remove",)),  # two of the four left
        (4, ("twins", "equivocate"), (0, 1), ("add",)),  # two of the first four
        (4, ("malform",), (0,), ("rotate",)),  # knows one member set
        (4, ("twins",), (), ("rotate",)),  # not named
        (4, ("twins",), (7,), ("add",)),  # in no epoch
    ],
)
def test_byzantine_members_stay_within_f_of_every_epoch(
    n: int, byzantine: tuple[str, ...], members: tuple[int, ...], reconfigure: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError):
        SimOptions(
            seed=0, n=n, byzantine=byzantine, byzantine_members=members, reconfigure=reconfigure
        )


def test_a_member_added_may_be_byzantine_when_the_new_f_allows() -> None:
    options = SimOptions(
        seed=0,
        n=4,
        byzantine=("twins", "fork_leader"),
        byzantine_members=(0, 5),
        reconfigure=("add",),
    )
    assert options.epoch_sizes == (4, 7)


def test_restores_stay_out_of_reconfiguration_runs() -> None:
    with pytest.raises(ValueError):
        SimOptions(seed=0, n=4, reconfigure=("rotate",), restores_when_voting=1)


@pytest.mark.parametrize("n", [4, 7])
def test_the_drawn_byzantine_members_fill_every_epochs_budget(n: int) -> None:
    for seed in range(50):
        options = byzantine_reconfiguration_scenario(seed, n)
        sizes = options.epoch_sizes
        counts = [sum(m < size for m in options.byzantine_members) for size in sizes]
        assert all(c <= (size - 1) // 3 for c, size in zip(counts, sizes, strict=True))
        assert any(c == (size - 1) // 3 for c, size in zip(counts, sizes, strict=True))
        assert options.reconfigure == reconfiguration_scenario(seed, n).reconfigure


# --------------------------------------------------------------------------- seeded runs


@pytest.mark.parametrize("n", sorted(HONEST_SEEDS))
def test_the_honest_core_passes_byzantine_members_across_boundaries(n: int) -> None:
    """Agreement across epochs, the certified-block lemma and one certified block per view
    of each epoch, one vote per view per epoch, and liveness of the newest epoch's members,
    with f Byzantine members of every epoch acting on both sides of its boundaries."""
    behaviours: Counter[str] = Counter()
    retired_dropped = 0
    for seed in HONEST_SEEDS[n]:
        options = byzantine_reconfiguration_scenario(seed, n)
        sim, result = outcome(options)
        assert not isinstance(result, str), result
        assert newest_epoch(sim) >= 1, f"seed {seed}: no change committed"
        behaviours.update(options.byzantine)
        retired_dropped += result.dropped["bad_signature"]
    assert set(behaviours) == {"twins", "equivocate", "fork_leader"}, behaviours
    # The retired keys and the rotated twins' old keys were used, and refused.
    assert retired_dropped > 0


def test_the_same_seed_runs_the_same_across_boundaries() -> None:
    """Everything the adversary does across a boundary is drawn from the seed: two runs of
    one scenario give the same result, and a caught variant fails the same way again."""
    runs = [
        byzantine_reconfiguration_scenario(1, 4),
        twins_epoch_scenarios(4, per_behaviour=2)[0],
        replace(byzantine_reconfiguration_scenario(1, 4), unsafe=RETIRED),
    ]
    for options in runs:
        first, again = outcome(options)[1], outcome(options)[1]
        assert first == again, options.reproduce()


def test_a_rotated_twin_keeps_its_old_key_which_counts_nowhere() -> None:
    """Member 0 is Byzantine, as twins, and its key is rotated: instance 0 takes the new
    key, instance 1 (its old machine) signs with the old one, whose signatures the members
    of the new epoch drop."""
    for seed in range(40):
        options = SimOptions(
            seed=seed,
            n=4,
            ticks=300,
            byzantine=("twins",),
            byzantine_members=(0,),
            reconfigure=("rotate",),
        )
        sim, result = outcome(options)
        assert not isinstance(result, str), result
        reconfigurer = sim.reconfigurer
        assert reconfigurer is not None
        if reconfigurer.sent[0].indexes == (0,):
            break
    else:
        pytest.fail("no seed of 40 rotated member 0")
    new_key = reconfigurer.sent[0].keys[0]
    first, twin = sim.nodes[0]
    assert first.signer.public_key == new_key and first.core.membership.key(0) == new_key
    assert twin.first_key is not None and twin.first_key != new_key
    assert result.dropped["bad_signature"] > 0  # the old machine's votes, in epoch 1


def failures(scenarios: list[SimOptions]) -> list[str]:
    return [text for options in scenarios if isinstance(text := outcome(options)[1], str)]


def failures_until(scenarios: list[SimOptions], enough: Callable[[list[str]], bool]) -> list[str]:
    """The failures of `scenarios` in order, run only until `enough` holds of them: a
    variant is caught by the first schedules that show it, and the rest cost minutes."""
    found: list[str] = []
    for options in scenarios:
        if isinstance(text := outcome(options)[1], str):
            found.append(text)
            if enough(found):
                break
    return found


def a_safety_failure(found: list[str]) -> bool:
    return any(text.startswith("SAFETY: two blocks certified") for text in found)


def test_a_core_that_counts_a_retired_key_is_caught() -> None:
    """Only a Byzantine schedule across a boundary shows it: the same core passes the
    honest reconfiguration scenarios (no one signs with a retired key) and the Byzantine
    scenarios without a change (there is no retired key)."""
    variant = EPOCH_VARIANTS["retired_key_counts"]
    caught = failures_until(
        [replace(byzantine_reconfiguration_scenario(s, 4), unsafe=variant) for s in VARIANT_SEEDS],
        a_safety_failure,
    )
    safety = [text for text in caught if text.startswith("SAFETY: two blocks certified")]
    assert safety, f"retired_key_counts survived {len(VARIANT_SEEDS)} seeds"
    assert "RetiredKeyCountsCore" in safety[0]
    assert not failures([replace(reconfiguration_scenario(s, 4), unsafe=variant) for s in range(8)])
    assert not failures([replace(scenario(s, 4), unsafe=variant) for s in range(8)])


def test_a_core_that_starts_an_epoch_on_a_certified_block_is_caught_with_byzantine_members() -> (
    None
):
    variant = EPOCH_VARIANTS["epoch_on_certified"]
    caught = failures_until(
        [replace(byzantine_reconfiguration_scenario(s, 4), unsafe=variant) for s in range(20)],
        bool,
    )
    assert caught and "EpochOnCertifiedCore" in caught[0]


# --------------------------------------------------------------------------- Twins


@pytest.mark.parametrize("n", sorted(TWINS_PER_BEHAVIOUR))
def test_twins_schedules_across_a_boundary_pass_with_the_honest_core(n: int) -> None:
    scenarios = twins_epoch_scenarios(n, per_behaviour=TWINS_PER_BEHAVIOUR[n])
    assert len(scenarios) == 3 * TWINS_PER_BEHAVIOUR[n]
    for options in scenarios:
        sim, result = outcome(options)
        assert not isinstance(result, str), result
        # Every change committed, during the partition phases or after them.
        assert newest_epoch(sim) == len(options.reconfigure), options.reproduce()


@pytest.mark.parametrize("variant", sorted(EPOCH_VARIANTS))
def test_twins_schedules_across_a_boundary_catch_the_epoch_variants(variant: str) -> None:
    """A retired key that counts certifies two blocks in one view (a safety failure); an
    epoch started on a certified block mostly stalls the next epoch, which can never show
    how the old one ended (a liveness failure), and now and then forks a commit."""
    core = EPOCH_VARIANTS[variant]
    scenarios = twins_epoch_scenarios(4, per_behaviour=VARIANT_TWINS_PER_BEHAVIOUR)
    # retired_key_counts must show a safety failure among them, epoch_on_certified any.
    enough = a_safety_failure if variant == "retired_key_counts" else bool
    caught = failures_until([replace(options, unsafe=core) for options in scenarios], enough)
    assert caught, f"{variant} survived {len(scenarios)} Twins schedules"
    assert core.__qualname__ in caught[0]
    if variant == "retired_key_counts":
        assert a_safety_failure(caught)
