"""Recovery drills against a live cluster under load, ending in a report a machine can
check (docs/drills.md); `quorumgate drill NAME` (quorumgate.ops.drill) runs one.

A drill starts every replica and sidecar of the cluster in `--dir` (made with `init` if
there is none), registers a tool and fresh agents with the owner key, and keeps an
open-loop load of signed ~256-byte proposals flowing into the replicas from background
threads, recording the id of every proposal a replica acknowledges. One proposal in
`DENY_EVERY` names an `http://` target, which the tool refuses, so the sidecars also write
rejection artifacts. While the load runs the drill injects its fault, again and again
until `--seconds` have passed (at least `FAULT_CYCLES_MIN[drill]` times):

- `leader-kill`: SIGKILL the replica leading the current view; wait until the survivors
  commit again; restart it; wait until it is back at the cluster's height.
- `wipe-replica`: stop one member (replica and sidecar), drop its replica's blocks with
  `ReplicaStore.wipe_blocks()` (its safety record and signed-vote audit stay), delete its
  sidecar's store, restart the replica (it fetches the chain from its peers from height 0).
  Even cycles rebuild the sidecar's store with `quorumgate.sidecar.replay.replay` (every certificate
  checked) before starting it; odd ones start the sidecar at once and let it re-execute
  from height 1. Either way the rebuilt store must equal, byte for byte, what it held.
- `full-restart`: stop every replica and sidecar at once (SIGKILL on even cycles, SIGTERM
  on odd ones) and start them all again.
- `sidecar-crash`: SIGKILL a sidecar while it has committed blocks left to execute and
  restart it: it resumes after the last height it recorded, none twice, none skipped.
- `stale-restore`: copy one replica's database files while it is stopped, restart it and
  let it vote under load, stop f other members so that the cluster cannot leave a view
  without it, SIGKILL it while it leads the current view, put the old copy back, declare
  the restore (docs/consensus/fencing.md) and restart it at once, in the views it signed
  in and forgot, then the f others (a restore fences only once 2f+1 others answered):
  safety Rule 6 (fencing, replica/safety.py) must keep it from signing anything twice.
- `ship`: with `quorumgate ship` running as its own process, in turn SIGKILL the
  shipper, stop and start the operator's database (`--db-stop-cmd`, `--db-start-cmd`),
  SIGKILL a replica; at the end the copy must hold the ledger complete, in order, without
  duplicates, and pass `quorumgate audit verify` (module `ship`).
- `rotate-members`: rotate every member's consensus key in turn with `quorumgate admin
  rotate-key --member I` (each rotation ends an epoch); after each one every replica must
  reach the new epoch and commits go on (module `rotation`).
- `stale-restore-epoch`: back up one member (stopped, as `quorumgate backup` does) in
  epoch e, rotate another member's key (ends e), let the first vote in e+1, SIGKILL it
  and put the backup back declared (as `quorumgate restore` does): it must fence in e+1
  and rejoin, no vote of it in any (epoch, view) contradicting one it forgot (module
  `boundary`).
- `replace-member`: a member's host is gone for good (replica and sidecar SIGKILLed, its
  node directory never used again); a new machine made with `quorumgate init --join` in
  a new directory of the cluster's is started and `quorumgate admin replace-member` makes
  it the member at the next epoch; the checks read the cluster through the chain of
  epochs, and the new machine must vote from its first epoch on (module `replace`).
- `grow-shrink`: three new machines made with `quorumgate init --join --index 4..6` are
  started as followers, `quorumgate admin add-member` makes the cluster of 4 one of 7,
  the load runs in the epoch of 7, and `quorumgate admin remove-member` shrinks it back
  (the removed replicas exit at the boundary); fresh machines each cycle, the checks read
  through the chain of epochs (module `grow`; what it shares with `replace` is in
  `machines`).

Then the load stops and the drill settles: it waits until every acknowledged proposal is
committed, offering again (the same signed bytes, as a client does when no certificate
comes) any the chain does not show after `REOFFER_AFTER_HEIGHTS` more heights; a replica
taking such an offer as new means the cluster had lost an acknowledged proposal
(`redelivered`). Then, each with a bounded deadline, it checks:

- every replica and every sidecar reaches the replicas' committed height T;
- every replica streams the same block hash at every height 1..T (`CommittedBlocks`, each
  block decoded and its hash recomputed);
- every acknowledged proposal is in exactly one committed block, has exactly one verdict
  in the ledger, and a certificate the client SDK verified (`await_certificate`: f+1
  agreeing receipts, `quorumgate.sidecar.receipts.verify_certificate`) at the height it committed,
  with the verdict its target calls for;
- every replica process's equivocation counters (`qg_replica_messages_dropped_total
  {reason=equivocating_vote|timeout|proposal}`) are 0, read before each kill and at the end;
- no sidecar raised its divergence alarm; and once the cluster is stopped, every sidecar's
  store has the same state root at T, the same ledger head at T (its hash chain verifying)
  and the same rejection artifacts up to T;
- across the replicas' signed-vote audit tables no view has votes for two blocks, and no
  vote a stale-restored replica signed after its restore contradicts one it forgot;
- every fault recovered within `RECOVERY_TIMEOUT_S`.

The report (`DrillReport.as_dict()`, printed by `--json`) holds the figures, one entry per
fault, and one entry per check (`name`, `ok`, `detail`, which names the node, height and
key where a check failed); `ok` is their conjunction and the command exits 1 unless it
holds. `recovery_s` is the time from the last fault until the faulted member was back at

The package's modules: `runner` (the run and its waits), `nemesis` (the fault
injectors), `load` (the open-loop load), `checker` (settling and the checks), `audit`
(what the checks read: chains, stores, certificates), `ship` (the audit shipper's
drill and its checks), `rotation` (the key-rotation drill), `boundary` (the stale
restore across an epoch boundary), `replace` (a member replaced by a new machine),
`grow` (the cluster grown to 7 and shrunk to 4), `machines` (new machines and the
cluster read through the chain of epochs, for `replace` and `grow`),
`report` (the report and its text
form) and `bounds` (names and deadlines). The cluster's processes are driven through the
controller the live tests share, `quorumgate.ops.live.LiveCluster`.
"""

from __future__ import annotations

from quorumgate.ops.drills.bounds import (
    BYZANTINE_CYCLES,
    DRILLS,
    FAULT_CYCLES_MIN,
    SECONDS_DEFAULT,
)
from quorumgate.ops.drills.checker import (
    majority,
    placements,
    refusals_since,
    rollback_conflicts,
    vote_splits,
)
from quorumgate.ops.drills.report import Check, DrillError, DrillReport, Fault
from quorumgate.ops.drills.runner import prepare_cluster, run_drill

__all__ = [
    "BYZANTINE_CYCLES",
    "DRILLS",
    "FAULT_CYCLES_MIN",
    "SECONDS_DEFAULT",
    "Check",
    "DrillError",
    "DrillReport",
    "Fault",
    "majority",
    "placements",
    "prepare_cluster",
    "refusals_since",
    "rollback_conflicts",
    "run_drill",
    "vote_splits",
]
