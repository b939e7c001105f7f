"""Six hundred seeded simulated clusters (docs/consensus/simulator.md) over n = 4 and n = 7
with up to f Byzantine members in every test run; `QG_SIM_SWEEP=full` runs the whole 2,000
of the sweep, and `scripts/simulate.py --seeds N` any number.

`quorumgate.replica.sim.scenario(seed, n)` draws faults and Byzantine behaviours from the seed; the
simulator checks safety after every step and liveness after the heal, and every failure
(`SimulationFailure`) carries the seed and the SimOptions that reproduce it. Seeds run in
chunks of 100 so progress is visible; a failing chunk reports every failing seed in it.

Besides passing, each chunk must show that the generator still generates: partitions,
crashes, loss and duplication happen, Byzantine members act, and their forgeries are seen
and dropped by honest members (while honest messages never are).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest

from quorumgate.proto.crypto import Ed25519Signer, ed25519_verify
from quorumgate.replica.sim import (
    BEHAVIOURS,
    SimNode,
    SimOptions,
    SimResult,
    Simulation,
    SimulationFailure,
    scenario,
)

CHUNK = 100
# Seeds per cluster size. The test job runs the first third of the sweep at n = 4 and a
# quarter at n = 7, where a scenario costs twice as much (the generator still draws every
# Byzantine behaviour at least 20 times in each: the coverage test below); the whole
# sweep is one variable away, for a change to the core or the simulator.
SWEEP_ENV = "QG_SIM_SWEEP"
FULL_SEEDS = {4: 1_200, 7: 800}
TEST_JOB_SEEDS = {4: 400, 7: 200}
SEEDS = FULL_SEEDS if os.environ.get(SWEEP_ENV) == "full" else TEST_JOB_SEEDS


class ObservedSimulation(Simulation):
    """Counts the faults that actually happened (hooks on the simulator's own steps)."""

    def __init__(self, options: SimOptions) -> None:
        super().__init__(options)
        self.crashes = 0
        self.partitions = 0

    def _maybe_crash(self, node: SimNode) -> int | None:
        down = super()._maybe_crash(node)
        self.crashes += down is not None
        return down

    def _repartition(self) -> None:
        before = self.partition
        super()._repartition()
        if self.partition is not None and self.partition is not before:
            self.partitions += 1


@dataclass
class ChunkReport:
    failures: list[str] = field(default_factory=list)
    behaviours: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    evidence: list[str] = field(default_factory=list)


def check_evidence(opts: SimOptions, result: SimResult) -> list[str]:
    """Byzantine forgeries reach honest members and are dropped; honest messages never
    are dropped as forged."""
    problems = []
    dropped = result.dropped
    forged_sigs = dropped["bad_signature"]
    forged_certs = dropped["bad_certificate"] + dropped["non_member"]
    # `malform` forges both signatures and certificates (among much else).
    forges_signatures = {"bad_signatures", "malform"} & set(opts.byzantine)
    forges_certificates = {"forge_certs", "malform"} & set(opts.byzantine)
    if bool(forges_signatures) != (forged_sigs > 0):
        problems.append(f"{opts.reproduce()}: bad_signature drops {forged_sigs}")
    if bool(forges_certificates) != (forged_certs > 0):
        problems.append(f"{opts.reproduce()}: forged certificate drops {forged_certs}")
    return problems


def run_chunk(n: int, start: int) -> ChunkReport:
    report = ChunkReport()
    for seed in range(start, start + CHUNK):
        opts = scenario(seed, n)
        assert opts.seed == seed and opts.n == n
        report.behaviours.update(opts.byzantine)
        sim = ObservedSimulation(opts)
        try:
            result = sim.run()
        except SimulationFailure as failure:
            report.failures.append(str(failure))
            continue
        report.evidence += check_evidence(opts, result)
        report.faults["crashes"] += sim.crashes
        report.faults["partitions"] += sim.partitions
        report.faults["lossy"] += opts.loss_permille > 0
        report.faults["duplicating"] += opts.dup_permille > 0
        report.faults["delayed_victim"] += opts.victim_delay_ticks > 0
        report.faults["byzantine"] += bool(opts.byzantine)
        report.faults["two_byzantine"] += len(opts.byzantine) == 2
        report.faults["committed"] += min(result.committed_heights.values()) > 0
    return report


def chunk_ids(n: int) -> list[str]:
    return [f"seeds{s:04d}-{s + CHUNK - 1:04d}" for s in range(0, SEEDS[n], CHUNK)]


# One class per cluster size. The test job hands each chunk out on its own (tests/conftest.py),
# so the chunks of the suite's longest module spread over both workers.
class TestFourMembers:
    @pytest.mark.parametrize("start", range(0, SEEDS[4], CHUNK), ids=chunk_ids(4))
    def test_seeded_scenarios_are_safe_and_live(self, start: int) -> None:
        check_chunk(4, start)


class TestSevenMembers:
    @pytest.mark.parametrize("start", range(0, SEEDS[7], CHUNK), ids=chunk_ids(7))
    def test_seeded_scenarios_are_safe_and_live(self, start: int) -> None:
        check_chunk(7, start)


def check_chunk(n: int, start: int) -> None:
    report = run_chunk(n, start)
    if report.failures:
        pytest.fail(
            f"{len(report.failures)} of {CHUNK} scenarios failed:\n\n"
            + "\n\n".join(report.failures),
            pytrace=False,
        )
    assert report.evidence == []
    faults = report.faults
    assert faults["committed"] == CHUNK
    assert faults["crashes"] > 0 and faults["partitions"] > 0, faults
    assert faults["lossy"] >= 10 and faults["duplicating"] >= 10, faults
    assert faults["byzantine"] >= CHUNK // 4, faults
    # Each seed draws at most f behaviours, so a chunk of 100 need not hold all eight
    # (seeds 1100-1199 at n = 4 have no double_vote); the whole run does (test below).
    assert len(report.behaviours) >= 5, report.behaviours
    if n == 7:
        assert faults["two_byzantine"] > 0, faults


@pytest.mark.parametrize("n", sorted(SEEDS))
def test_the_seeds_cover_every_byzantine_behaviour_and_fault(n: int) -> None:
    """The generator, over the seeds the chunks run, does not silently degrade."""
    drawn = [scenario(seed, n) for seed in range(SEEDS[n])]
    behaviours = Counter(b for opts in drawn for b in opts.byzantine)
    assert set(behaviours) == set(BEHAVIOURS)
    assert min(behaviours.values()) >= 20, behaviours
    f = (n - 1) // 3
    assert max(len(opts.byzantine) for opts in drawn) == f
    assert all(len(opts.byzantine) <= f for opts in drawn)
    for name in ("loss_permille", "dup_permille", "partition_ticks", "crash_permille"):
        with_fault = sum(getattr(opts, name) > 0 for opts in drawn)
        assert with_fault >= SEEDS[n] // 4, (name, with_fault)
    assert any(o.victim_delay_ticks > 0 for o in drawn if "fork_leader" in o.byzantine)


# Real signatures cost about ten times the stand-in's: 20 seeds at n = 4 and 10 at n = 7
# in the test job (where a run costs twice as much), 20 of each in the whole sweep.
REAL_CRYPTO_SEEDS = {4: range(20), 7: range(20 if os.environ.get(SWEEP_ENV) == "full" else 10)}


@pytest.mark.parametrize("n", [4, 7])
def test_seeded_scenarios_with_real_ed25519(n: int) -> None:
    failures = []
    for seed in REAL_CRYPTO_SEEDS[n]:
        opts = replace(scenario(seed, n), fast_crypto=False)
        sim = Simulation(opts)
        assert sim.verify_fn is ed25519_verify
        assert all(isinstance(s, Ed25519Signer) for s in sim.signers)
        try:
            result = sim.run()
        except SimulationFailure as failure:
            failures.append(str(failure))
            continue
        assert check_evidence(opts, result) == []
    assert failures == [], "\n\n".join(failures)
