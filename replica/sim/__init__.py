"""A seeded simulator of whole clusters of consensus cores (TigerBeetle's VOPR, in spirit).

N cores run on a simulated network with delay, loss, duplication, reordering, partitions
and a heal; members crash (possibly half-way through one step's actions) and restart from
what they had made durable; up to f members are Byzantine. After every step the simulator
checks safety:

- no two honest replicas commit different blocks at one height, and each honest replica
  commits heights in order without gaps (so honest committed chains are prefixes of one
  another);
- every block an honest replica holds a QC for, certified in a view above the highest
  block an honest replica committed, extends that block (the lemma of replica/safety.py's
  argument: a broken rule fails here before, or instead of, forking a commit), and no two
  QCs honest replicas hold certify different blocks in one view of one epoch (any two
  quorums share an honest member, who votes once per view);
- no honest replica ever signs two different votes in one view, nor a vote in a view
  after a timeout for it, across restarts too (judged on what reaches peers);
- no `Send` leaves before the safety state it depends on is durable.

After the network heals it checks liveness: every honest replica commits a block proposed
after the heal within `liveness_views_max` views. Every failure raises `SimulationFailure`
whose message carries the seed and options that reproduce it.

Byzantine behaviours wrap honest cores and override one thing each (as relab/hotstuff's
twins and Byzantine wrappers do): an equivocating leader, twins (two honest instances with
one key), a voter that signs every block it sees (no safety rules), a silent leader,
invalid signatures, and forged certificates. One honest member (the victim) may be restored
from a backup (safety Rule 6): right after it proposed, voted or timed out, with what it
signed still in flight, from a backup taken on entering that view or some views earlier;
docs/consensus/fencing.md says what a restore may and may not do.

Nothing here is used by a production process; it ships because `quorumgate simulate` runs
it, beside `scripts/simulate.py` and the tests. Only honest rules ship: the deliberately
broken variants that test the tester live with the tests (tests/consensus/variants.py) and
plug in through `SimOptions.unsafe`, the core the honest members run instead of `Core`.

The modules, one job each: `options` (what a run is given), `crypto` (a fast stand-in for
Ed25519), `node` (a member, its disk and its stand-in mempool and sidecar), `network`
(what is in flight, partitions), `checks` (the safety checks), `byzantine` (the Byzantine
behaviours), `restores` (the aimed restores), `epochs` (member-set changes and the shell's
part at an epoch boundary: docs/consensus/epochs.md), `simulation` (the runner),
`scenarios` (a seed's faults), `boundary_restores` (a restore across an epoch boundary)
and `twins` (the enumerated adversary). With the member set
changing, `twins`, `equivocate` and `fork_leader` members act across the boundaries
(docs/consensus/epochs.md, "What the simulator checks").
"""

from quorumgate.replica.sim.boundary_restores import restore_across_boundary_scenario
from quorumgate.replica.sim.crypto import FastKeys
from quorumgate.replica.sim.node import Disk, SimExecution, SimMempool, SimNode, SimPool
from quorumgate.replica.sim.options import (
    BEHAVIOURS,
    SIM_LIMITS,
    WITHHOLDING_BEHAVIOURS,
    SimOptions,
    SimulationFailure,
)
from quorumgate.replica.sim.scenarios import (
    byzantine_reconfiguration_scenario,
    far_behind_scenario,
    reconfiguration_scenario,
    scenario,
)
from quorumgate.replica.sim.simulation import SimResult, Simulation
from quorumgate.replica.sim.twins import (
    TWINS_BEHAVIOURS,
    twins_epoch_scenarios,
    twins_scenarios,
    twins_splits,
)

__all__ = [
    "BEHAVIOURS",
    "SIM_LIMITS",
    "TWINS_BEHAVIOURS",
    "WITHHOLDING_BEHAVIOURS",
    "Disk",
    "FastKeys",
    "SimExecution",
    "SimMempool",
    "SimNode",
    "SimOptions",
    "SimPool",
    "SimResult",
    "Simulation",
    "SimulationFailure",
    "byzantine_reconfiguration_scenario",
    "far_behind_scenario",
    "reconfiguration_scenario",
    "restore_across_boundary_scenario",
    "scenario",
    "twins_epoch_scenarios",
    "twins_scenarios",
    "twins_splits",
]
