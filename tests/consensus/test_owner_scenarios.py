"""The seeded reconfiguration scenarios draw `owner` records (docs/consensus/epochs.md,
"The record key"): in half the seeds the owner hands the record key to a new key before
one of the other changes, every record of the run is signed with the key in force for
the epoch it ends, and a thief holding each retired key offers records of its own for
every later epoch. The honest core must commit every change the owner signed and none of
the thief's; `owner_key_ignored` (a core that keeps reading records with epoch 0's key)
must be caught. `QG_SIM_SWEEP=full` runs bigger ranges."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from quorumgate.proto.membership import OwnerRecords
from quorumgate.replica.sim import Simulation, SimulationFailure, reconfiguration_scenario
from quorumgate.replica.sim.epochs import Reconfigurer
from quorumgate.replica.sim.options import SimOptions
from tests.consensus.variants import OWNER_VARIANTS

FULL = os.environ.get("QG_SIM_SWEEP") == "full"
# Seeds whose scenario draws an `owner` record, the first of a range of seeds. A run takes
# about a third of a second at n = 4 and twice that at n = 7.
HONEST_SEEDS = {4: 200 if FULL else 12, 7: 100 if FULL else 5}
VARIANT_SEEDS = 200 if FULL else 12  # at n = 4
OWNER_KEY_IGNORED = OWNER_VARIANTS["owner_key_ignored"]


def owner_scenarios(n: int, count: int) -> list[SimOptions]:
    """The first `count` reconfiguration scenarios at `n` that draw an `owner` record."""
    drawn = (reconfiguration_scenario(seed, n) for seed in range(8 * count))
    out = [options for options in drawn if "owner" in options.reconfigure][:count]
    assert len(out) == count, f"{len(out)} of the first {8 * count} seeds draw one"
    return out


def test_half_the_seeds_draw_an_owner_record_before_another_change() -> None:
    drawn = [reconfiguration_scenario(seed, n) for seed in range(100) for n in (4, 7)]
    with_owner = [o for o in drawn if "owner" in o.reconfigure]
    assert 60 <= len(with_owner) <= 140
    assert all(o.reconfigure[-1] != "owner" and o.signed_records for o in with_owner)
    assert not any(o.signed_records for o in drawn if o not in with_owner)


@pytest.mark.parametrize("n", [4, 7])
def test_the_honest_core_applies_every_signed_change_and_no_thiefs(n: int) -> None:
    for options in owner_scenarios(n, HONEST_SEEDS[n]):
        sim = Simulation(options)
        result = sim.run()  # raises SimulationFailure on any failed check
        reconfigurer = sim.reconfigurer
        assert reconfigurer is not None
        newest = max(sim.nodes[i][0].epoch for i in sim.honest)
        assert result.liveness_excused or newest == len(options.reconfigure), options.reproduce()
        assert reconfigurer.retired, "an owner record retired a key"
        thief = [tx for tx in sim.pool.txs if reconfigurer.thief_key in tx]
        assert thief, "the thief offered records signed with the retired key"
        committed = {tx for i in sim.honest for tx in sim.nodes[i][0].committed_txs}
        assert not committed & set(thief), options.reproduce()
        # The record key moved on: every member of the newest epoch reads with the new key.
        for i in sim.honest:
            node = sim.nodes[i][0]
            records = node.owner_records()
            assert isinstance(records, OwnerRecords)
            key = reconfigurer.owner_keys[node.epoch].public_key
            assert records.owner_key == key, options.reproduce()


def test_a_core_that_keeps_the_first_record_key_is_caught() -> None:
    caught: list[str] = []
    for options in owner_scenarios(4, VARIANT_SEEDS):
        try:
            Simulation(replace(options, unsafe=OWNER_KEY_IGNORED)).run()
        except SimulationFailure as failure:
            caught.append(str(failure))
    assert len(caught) == VARIANT_SEEDS, f"{VARIANT_SEEDS - len(caught)} runs not caught"
    assert all(text.startswith("SAFETY") for text in caught), caught[0]
    assert "OwnerKeyIgnoredCore" in caught[0]  # the failure names what reproduces it


def test_without_an_owner_record_the_variant_is_the_honest_core() -> None:
    """Only a run that hands the record key over shows the broken rule."""
    plain = [o for o in (reconfiguration_scenario(s, 4) for s in range(12)) if not o.signed_records]
    assert plain
    for options in plain[:4]:
        Simulation(replace(options, unsafe=OWNER_KEY_IGNORED)).run()


def test_the_thiefs_record_committed_is_caught_by_the_member_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tester is tested: without the check of each core's reader at its start, the
    variant's leaders propose the thief's record (its mempool reads with the core's key),
    its voters take it, and the member sets the chain then gives are not the owner's."""
    monkeypatch.setattr(Reconfigurer, "check_core", lambda self, core: None)
    options = SimOptions(seed=11, n=4, ticks=400, reconfigure=("owner", "rotate"))
    with pytest.raises(SimulationFailure) as caught:
        Simulation(replace(options, unsafe=OWNER_KEY_IGNORED)).run()
    assert str(caught.value).startswith("SAFETY: node"), caught.value
    assert "members the owner's records do not give" in str(caught.value)
    Simulation(options).run()


@pytest.mark.parametrize("seed", [0, 1])
def test_members_added_after_a_long_epoch_follow_it_by_pages_and_join(seed: int) -> None:
    """Nodes of members to come follow the epochs they are not in. Added late, the
    change block lies more than a sync page above what they hold: they take the pages of
    the epoch's chain as a member's core does (`follow_page`) and then its proof; before,
    they dropped every page and the added members never joined (LIVENESS)."""
    options = SimOptions(
        seed=seed,
        n=4,
        ticks=900,
        reconfigure=("add",),
        changes_from_percent=60,
        tx_per_tick_permille=900,
    )
    sim = Simulation(options)
    sim.run()
    boundary = sim.nodes[0][0].disk.ends[0].boundary
    assert boundary.height > options.limits.sync_blocks_max  # beyond one proof
    assert all(sim.nodes[i][0].epoch == 1 and sim.nodes[i][0].active for i in range(7))
    assert sim.epoch_pages > 0
