"""What a drill verifies once its load stopped (docs/drills.md, "What every drill
checks"): it settles, offering again what the chain does not show, then checks heights,
chains, certificates and verdicts, counters and alarms while the cluster runs, and the
stores and signed-vote audits once it is stopped. Each check is recorded in the report
with what failed, naming the node, height and key; the pure checks are functions of what
was read, so that they can be seen to fail on a broken cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TypeVar

from quorumgate.ops.drills.audit import (
    ReplicaAudit,
    SidecarView,
    certify,
    committed_blocks,
    read_replica,
    read_sidecar,
)
from quorumgate.ops.drills.bounds import (
    CATCH_UP_TIMEOUT_S,
    EXPECTED_ALLOWED,
    EXPECTED_DENIED,
    POLL_S,
    REOFFER_AFTER_HEIGHTS,
    SETTLE_TIMEOUT_S,
    SIDECAR_DB_FILE,
    poll,
)
from quorumgate.ops.drills.context import Drill, StaleRun, Wiped
from quorumgate.ops.drills.report import Abort, short
from quorumgate.ops.live import EQUIVOCATION_REASONS, LiveCluster
from quorumgate.ops.load import Ack, Load
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.membership import is_record
from quorumgate.proto.tx import parse
from quorumgate.replica.storage import StorageError
from quorumgate.replica.types import Block
from quorumgate.sidecar.replay import ReplayReport
from quorumgate.sidecar.store import Checkpoint, SidecarStore, SidecarStoreError

V = TypeVar("V")
VoteKey = TypeVar("VoteKey", int, tuple[int, int])  # a view, or (epoch, view)

# ---------------------------------------------------------------------------- pure checks


# ---------------------------------------------------------------------------- pure checks


def majority(values: Mapping[int, V]) -> tuple[V | None, list[int]]:
    """The value most members hold, and the members (sorted) that hold another."""
    counts = Counter(values.values())
    if not counts:
        return None, []
    value = counts.most_common(1)[0][0]
    return value, sorted(i for i, v in values.items() if v != value)


def vote_splits(
    votes: Mapping[int, Mapping[VoteKey, bytes]],
) -> dict[VoteKey, dict[bytes, list[int]]]:
    """From each member's signed-vote table (view, or (epoch, view) once the member set
    may have changed, -> block hash): the views in which votes went to more than one
    block, with the members behind each. With honest leaders, who propose one block per
    view (Rule 5), there are none."""
    by_view: dict[VoteKey, dict[bytes, list[int]]] = {}
    for node, table in sorted(votes.items()):
        for view, block_hash in table.items():
            by_view.setdefault(view, {}).setdefault(block_hash, []).append(node)
    return {view: hashes for view, hashes in sorted(by_view.items()) if len(hashes) > 1}


VoteKey = TypeVar("VoteKey", int, tuple[int, int])


def rollback_conflicts(
    stale: Mapping[VoteKey, bytes], forgotten: Mapping[VoteKey, bytes], now: Mapping[VoteKey, bytes]
) -> list[tuple[VoteKey, bytes, bytes]]:
    """Votes a replica restored from an old copy (`stale`: the copy's votes) signed after
    the restore that contradict votes it had signed and forgotten (`forgotten`): (view, or
    (epoch, view) across epochs, forgotten hash, new hash). `now` is its vote table at the
    end. Safety Rule 6 keeps this empty."""
    return [
        (view, block_hash, now[view])
        for view, block_hash in sorted(forgotten.items())
        if view not in stale and view in now and now[view] != block_hash
    ]


def refusals_since(
    before: Mapping[int, tuple[int, Counter[str]]], after: Mapping[int, tuple[int, Counter[str]]]
) -> Counter[str]:
    """Messages the honest replicas dropped between two readings, by reason (a process
    restarted in between counts from zero; equivocations are another check's)."""
    total: Counter[str] = Counter()
    for i, (pid, counters) in after.items():
        prior = before.get(i)
        total.update(counters - prior[1] if prior is not None and prior[0] == pid else counters)
    for reason in EQUIVOCATION_REASONS:
        total.pop(reason, None)
    return total


def placements(blocks: Iterable[Block]) -> dict[bytes, list[int]]:
    """Transaction id -> the heights of every committed block that carries it."""
    placed: dict[bytes, list[int]] = {}
    for block in blocks:
        for tx in block.payload:
            placed.setdefault(committed_id(tx), []).append(block.height)
    return placed


def committed_id(tx: bytes) -> bytes:
    """A committed transaction's id. An owner's reconfiguration record carries no signer
    or nonce: its id is the SHA-256 of its bytes, as the replicas' mempools file it
    (replica/mempool.py `RecordTx`), so one committed twice shows at two heights."""
    return hashlib.sha256(tx).digest() if is_record(tx) else parse(tx, verify=False).tx_id


class ChainWatch:
    """The committed chain as far as read, from whichever member is highest: the heights
    at which each transaction id committed. Used while the drill settles."""

    def __init__(self, cluster: LiveCluster) -> None:
        self.cluster = cluster
        self.spec = cluster.spec
        self.top = 0
        self.heights: dict[bytes, list[int]] = {}

    def advance(self) -> int:
        heights = {}
        for i in range(self.spec.n):
            status = self.cluster.probe(i)
            if status is not None:
                heights[i] = status.committed_height
        if not heights:
            return self.top
        index = max(heights, key=lambda i: heights[i])
        if heights[index] > self.top:
            with contextlib.suppress(Abort):
                blocks = committed_blocks(self.spec, index, self.top + 1, heights[index])
                for tid, hs in placements(blocks).items():
                    self.heights.setdefault(tid, []).extend(hs)
                self.top = blocks[-1].height if blocks else self.top
        return self.top


def settle(d: Drill, load: Load, acked: Mapping[bytes, Ack]) -> None:
    """Wait until every acknowledged proposal is committed, offering again those the
    chain does not show after REOFFER_AFTER_HEIGHTS more heights."""
    report = d.report
    watch = ChainWatch(d.cluster)
    offered_at: dict[bytes, int] = {}
    lost_acks: list[Ack] = []
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        top = watch.advance()
        missing = [p for p in acked if p not in watch.heights]
        if not missing or time.monotonic() >= deadline:
            break
        due = [p for p in missing if top - offered_at.setdefault(p, top) >= REOFFER_AFTER_HEIGHTS]
        if due:
            offered, taken = load.reoffer(due)
            report.reoffered += offered
            report.redelivered += len(taken)
            lost_acks += [acked[p] for p in taken]
            offered_at.update(dict.fromkeys(due, top))
            d.say(f"offered {len(due)} uncommitted proposals again: {len(taken)} were lost")
        time.sleep(POLL_S)
    report.lost = len(missing)
    if lost_acks:
        # When and by whom the proposals the cluster lost had been acknowledged, to set
        # beside the faults' times.
        by_node = Counter(a.node for a in lost_acks)
        times = sorted(round(a.at - d.t0, 1) for a in lost_acks)
        report.details["redelivered_acknowledged_by"] = {
            str(k): v for k, v in sorted(by_node.items())
        }
        report.details["redelivered_acknowledged_at_s"] = sorted(set(times))
    d.check(
        "acknowledged_committed",
        [f"{short(p)} (acknowledged by replica {acked[p].node}) never committed" for p in missing],
        f"all {len(acked)} acknowledged proposals committed"
        + (f" ({report.redelivered} after being offered again)" if report.redelivered else ""),
    )


def settle_and_check(d: Drill, load: Load) -> None:
    """Once the load stopped: settle, then run every check, each with a bounded deadline;
    the stores are audited once the cluster is stopped."""
    report = d.report
    for follow in d.before_checks:
        follow()
    acked = load.snapshot()
    report.acknowledged = len(acked)
    report.refused = dict(load.refusals() + load.redirected)
    d.say(f"load stopped: {len(acked)} proposals acknowledged; settling")
    settle(d, load, acked)
    check_load(d, load)
    target = check_heights(d)
    check_chains(d, target, acked)
    check_certificates(d, acked)
    alarmed = check_live_counters(d)
    for before in d.before_stop:
        before(target)
    d.say("stopping the cluster; auditing its stores")
    report.details["exit_codes_at_stop"] = d.cluster.stop_all()
    check_sidecar_stores(d, target, acked, alarmed)
    check_votes(d)
    check_rebuilt(d)
    check_recovered(d)
    for after in d.after_stop:
        after(target)


def check_load(d: Drill, load: Load) -> None:
    redirected = f"; {dict(load.redirected)} refused by a member's own sidecar, taken by another"
    d.check(
        "load_clean",
        [f"refused {reason} x{count}" for reason, count in load.refusals().items()] + load.failures,
        "no valid proposal refused, no delivery failed" + (redirected if load.redirected else ""),
    )


def check_heights(d: Drill) -> int:
    """Every replica and every sidecar at one height T, which it returns; `Abort` when the
    replicas do not get there."""
    report = d.report
    target = d.top()
    report.final_height = target
    d.say(f"waiting for every replica and sidecar to reach height {target}")
    replicas_at = poll(functools.partial(d.all_at, target), CATCH_UP_TIMEOUT_S)
    d.check(
        "replicas_reached_height",
        []
        if replicas_at
        else [
            f"replica {i} at {'-' if h is None else h}"
            for i in range(d.n)
            if (h := d.heights([i]).get(i)) is None or h < target
        ],
        f"all {d.n} replicas committed height {target}",
    )
    sidecars_at = poll(functools.partial(d.sidecars_at, target, d.n), CATCH_UP_TIMEOUT_S)
    d.check(
        "sidecars_reached_height",
        []
        if sidecars_at
        else [
            f"sidecar {i} at {'-' if s is None else s.executed_height}"
            for i in range(d.n)
            if (s := sidecar_status(d.spec, i)) is None or s.executed_height < target
        ],
        f"all {d.n} sidecars executed height {target}",
    )
    if not replicas_at:
        raise Abort(f"replicas did not reach height {target}")
    return target


def check_live_counters(d: Drill) -> list[int]:
    """While everything still runs: divergence alarms and equivocation counters. Returns
    the sidecars that raised their alarm."""
    report = d.report
    alarms = {}
    for i in range(d.n):
        status = sidecar_status(d.spec, i)
        if status is not None and status.diverged:
            alarms[i] = status.divergence
    d.scrape_equivocations()
    counted = {
        f"replica {i} (pid {pid}) {reason} = {int(value)}": int(value)
        for (i, pid), seen in sorted(d.equivocations_seen.items())
        for reason, value in seen.items()
        if value
    }
    unread = [i for i in range(d.n) if not any(key[0] == i for key in d.equivocations_seen)]
    report.equivocations = sum(counted.values())
    d.check(
        "no_equivocation_counted",
        list(counted) + [f"replica {i}: metrics never read" for i in unread],
        f"0 on all {len(d.equivocations_seen)} replica processes (read before each "
        "kill and at the end)",
    )
    d.check(
        "no_divergence_alarm",
        [f"sidecar {i}: {what}" for i, what in alarms.items()],
        "no sidecar raised its divergence alarm",
    )
    return sorted(alarms)


def check_recovered(d: Drill) -> None:
    report = d.report
    recovered = [f.recovery_s for f in report.faults if f.recovery_s is not None]
    if report.faults:
        report.recovery_s = report.faults[-1].recovery_s
        report.recovery_s_max = max(recovered, default=None)
    d.check(
        "recovered",
        [
            f"{f.kind} of member {f.node} at {f.at_s:.1f} s did not recover"
            for f in report.faults
            if f.recovery_s is None
        ]
        or ([] if report.faults else ["no fault was injected"]),
        f"{len(report.faults)} faults, each recovered; the last in "
        f"{report.recovery_s or 0:.2f} s, the slowest in {report.recovery_s_max or 0:.2f} s",
    )


def check_chains(d: Drill, target: int, acked: Mapping[bytes, Ack]) -> None:
    """Identical block hashes at every height; each acknowledged proposal committed in
    exactly one block, no transaction in two."""
    d.say(f"comparing {d.n} committed chains, heights 1..{target}")
    chains = {i: committed_blocks(d.spec, i, 1, target) for i in range(d.n)}
    forks = []
    for i in range(1, d.n):
        for mine, theirs in zip(chains[0], chains[i], strict=True):
            if mine.hash != theirs.hash:
                forks.append(
                    f"replica {i} height {mine.height}: block {short(theirs.hash)}, replica 0 "
                    f"{short(mine.hash)}"
                )
                break
    d.check(
        "same_block_hashes",
        forks,
        f"{d.n} replicas, identical hashes at heights 1..{target}",
    )
    d.placed = placements(chains[0])
    twice = {p: hs for p, hs in d.placed.items() if len(hs) > 1}
    d.report.duplicates = len(twice)
    wrong = {p: d.placed.get(p, []) for p in acked if len(d.placed.get(p, [])) != 1}
    d.check(
        "committed_once",
        [f"transaction {short(p)} at heights {hs}" for p, hs in {**twice, **wrong}.items()],
        f"each of {len(acked)} acknowledged proposals in exactly one block, no transaction in two",
    )


def check_certificates(d: Drill, acked: Mapping[bytes, Ack]) -> None:
    d.say(f"asking the sidecars for {len(acked)} certificates (client SDK)")
    certs = asyncio.run(certify(d.spec, list(acked), d.certificates))
    problems = []
    unexpected = []
    verdicts: Counter[str] = Counter()
    for p, cert in certs.items():
        if isinstance(cert, str):
            problems.append(f"{short(p)}: {cert}")
            continue
        height, outcome, reason = cert
        if d.placed.get(p, [height])[0] != height:
            problems.append(f"{short(p)}: certified at height {height}, committed at {d.placed[p]}")
        verdicts[outcome if reason == "ok" else f"{outcome}:{reason}"] += 1
        expected = EXPECTED_DENIED if acked[p].denied else EXPECTED_ALLOWED
        if (outcome, reason) != expected:
            unexpected.append(
                f"{short(p)} at height {height}: {outcome}/{reason}, expected {expected}"
            )
    d.report.certified = sum(not isinstance(c, str) for c in certs.values())
    d.report.verdicts = dict(verdicts)
    d.check(
        "acknowledged_certified",
        problems,
        f"{d.report.certified} certificates verified, each of f+1 agreeing receipts of "
        "its epoch's keys (2 of 4 members, 3 of 7)",
    )
    d.check("verdicts_expected", unexpected, f"verdicts {dict(sorted(verdicts.items()))}")


def _artifact_majority(
    views: Mapping[int, SidecarView],
) -> tuple[tuple[tuple[tuple[int, str], bytes], ...] | None, list[int]]:
    """The artifact set most stores hold, and the stores off it. A store installed from a
    snapshot holds the artifacts above its checkpoint only: the set is the majority of the
    stores holding every height, and such a store must hold exactly that set's artifacts
    above its checkpoint."""
    whole = {i: v for i, v in views.items() if v.history_from == 1}
    arts, odd = majority({i: tuple(sorted(v.artifacts.items())) for i, v in whole.items()})
    for i, v in views.items():
        above = {k: a for k, a in arts or () if k[0] >= v.history_from}
        if i not in whole and v.artifacts != above:
            odd.append(i)
    return arts, odd


def check_sidecar_stores(
    d: Drill, target: int, acked: Mapping[bytes, Ack], alarmed: list[int]
) -> None:
    """Once stopped: one state root at T, one ledger head at T, one artifact set up to T;
    every ledger verifies; each acknowledged proposal has one verdict."""
    views: dict[int, SidecarView] = {}
    unreadable = []
    for i in range(d.n):
        try:
            views[i] = asyncio.run(read_sidecar(d.spec, i, target))
        except (SidecarStoreError, OSError) as err:
            unreadable.append(f"sidecar {i}: {err}")
    d.check("sidecar_stores_readable", unreadable, f"{len(views)} sidecar stores read")
    root, odd_roots = majority({i: v.state_root for i, v in views.items()})
    head, odd_heads = majority({i: v.ledger_head for i, v in views.items()})
    arts, odd_arts = _artifact_majority(views)
    d.report.diverged_nodes = sorted(set(odd_roots + odd_heads + odd_arts + alarmed))
    d.report.diverged = len(d.report.diverged_nodes)
    d.check(
        "same_state_roots",
        [
            f"sidecar {i} height {target}: state root {short(views[i].state_root)}, "
            f"the others {short(root)}"
            for i in odd_roots
        ]
        + ([] if root else [f"no state root at height {target}"]),
        f"state root {short(root)} at height {target} on every sidecar",
    )
    d.check(
        "same_ledger_heads",
        [
            f"sidecar {i} height {target}: ledger head {short(views[i].ledger_head)} after "
            f"{views[i].ledger_entries} entries, the others {short(head)}"
            for i in odd_heads
        ],
        f"ledger head {short(head)} at height {target} on every sidecar "
        f"({next(iter(views.values())).ledger_entries if views else 0} entries)",
    )
    reference = dict(arts or ())
    d.check(
        "same_artifacts",
        [
            _artifact_difference(
                i,
                views[i].artifacts,
                {k: a for k, a in reference.items() if k[0] >= views[i].history_from},
            )
            for i in odd_arts
        ],
        f"{len(reference)} rejection artifacts up to height {target}, the same bytes on "
        "every sidecar",
    )
    d.check(
        "ledgers_verify",
        [f"sidecar {i}: {v.ledger_problem}" for i, v in views.items() if v.ledger_problem],
        "every sidecar's ledger hash chain verifies",
    )
    if views:
        first = views[min(views)]
        counts = {p: first.verdicts_by_tx.get(p, 0) for p in acked}
        d.check(
            "verdicts_once",
            [
                f"{short(p)}: {c} verdicts in sidecar {first.node}'s ledger"
                for p, c in counts.items()
                if c != 1
            ],
            "each acknowledged proposal has exactly one verdict in the ledger",
        )


def rebuild_problems(d: Drill, wiped: Wiped) -> list[str]:
    """What the rebuilt store of one wiped member does not hold as it should (see
    `check_rebuilt`), read from its store as it is now."""
    node, before = wiped.node, wiped.before
    if wiped.replayed is not None and wiped.replayed.history_from:
        return _snapshot_rebuild_problems(d, node, before, wiped.replayed)
    problems = []
    after = asyncio.run(read_sidecar(d.spec, node, before.height))
    where = f"sidecar {node} height {before.height}"
    if after.state_root != before.state_root:
        problems.append(
            f"{where}: state root {short(after.state_root)}, before {short(before.state_root)}"
        )
    if after.ledger_head != before.ledger_head:
        problems.append(
            f"{where}: ledger head {short(after.ledger_head)}, before {short(before.ledger_head)}"
        )
    if after.artifacts != before.artifacts:
        problems.append(_artifact_difference(node, after.artifacts, before.artifacts))
    if wiped.replayed is not None and wiped.replayed.mismatches:
        problems += [f"sidecar {node} replay: {m}" for m in wiped.replayed.mismatches]
    return problems


def _rebuilt_by(replayed: ReplayReport | None) -> str:
    if replayed is None:
        return "its own re-execution"
    if replayed.history_from:
        return f"replay from the snapshot of height {replayed.history_from}"
    return "replay"


async def _head_at(spec: ClusterSpec, node: int, height: int) -> Checkpoint | None:
    """Where sidecar `node` stood after `height`: its checkpoint, or what it signed and
    recorded there (the ledger head and entry count); None when it holds neither."""
    path = spec.node_dir(node) / SIDECAR_DB_FILE
    try:
        store = await SidecarStore.open(path, spec.chain_id, create=False, read_only=True)
    except SidecarStoreError:
        # A read-only open needs the WAL index file, which a stopped store may lack.
        store = await SidecarStore.open(path, spec.chain_id, create=False)
    try:
        if store.checkpoint is not None and store.checkpoint.height == height:
            return store.checkpoint
        found = await store.attestation_at(height)
        return None if found is None else found[1]
    finally:
        await store.close()


def _snapshot_rebuild_problems(
    d: Drill, node: int, before: SidecarView, replayed: ReplayReport
) -> list[str]:
    base = replayed.history_from
    height = max(before.height, base)
    peer = d.others(node)[0]
    mine = asyncio.run(_head_at(d.spec, node, height))
    theirs = asyncio.run(_head_at(d.spec, peer, height))
    where = f"sidecar {node} (from the snapshot of height {base}) at height {height}"
    if mine is None or theirs is None:
        return [f"{where}: no head to compare (its own: {mine is not None}, peer {peer}'s: "
                f"{theirs is not None})"]  # fmt: skip
    problems = []
    fields = (mine.state_root, mine.ledger_head, mine.ledger_entries)
    if fields != (theirs.state_root, theirs.ledger_head, theirs.ledger_entries):
        problems.append(f"{where}: state root, ledger head or entry count differs from {peer}'s")
    if height == before.height and fields != (
        before.state_root, before.ledger_head, before.ledger_entries
    ):  # fmt: skip
        problems.append(f"{where}: state root, ledger head or entry count differs from before")
    after = asyncio.run(read_sidecar(d.spec, node, before.height))
    kept = {key: digest for key, digest in before.artifacts.items() if key[0] > base}
    if after.artifacts != kept:
        problems.append(_artifact_difference(node, after.artifacts, kept))
    problems += [f"sidecar {node} replay: {m}" for m in replayed.mismatches]
    return problems


def _artifact_difference(
    node: int, mine: Mapping[tuple[int, str], bytes], reference: Mapping[tuple[int, str], bytes]
) -> str:
    for key in sorted(set(mine) | set(reference)):
        if mine.get(key) != reference.get(key):
            what = (
                "missing"
                if key not in mine
                else "extra"
                if key not in reference
                else "different bytes"
            )
            return f"sidecar {node} artifact (height {key[0]}, {key[1]!r}): {what}"
    return f"sidecar {node}: artifacts differ"


def check_votes(d: Drill) -> None:
    """One block per view across every replica's signed-vote table (Rule 5 for
    leaders, Rule 1 for voters); for stale-restore, no vote after a restore
    contradicting a forgotten one (Rule 6)."""
    audits: dict[int, ReplicaAudit] = {}
    problems = []
    for i in range(d.n):
        try:
            audits[i] = asyncio.run(read_replica(d.spec, i))
        except StorageError as err:
            problems.append(f"replica {i}: {err}")
    # Every epoch's votes: a rotation starts the views again (docs/consensus/epochs.md),
    # and an equivocation in a later epoch is one all the same.
    splits = vote_splits({i: a.votes for i, a in audits.items()})
    problems += [
        f"epoch {epoch} view {view}: "
        + ", ".join(f"{short(h)} by replicas {ns}" for h, ns in hashes.items())
        for (epoch, view), hashes in splits.items()
    ]
    conflicts = 0
    for run in d.stale_runs:
        if run.by_epoch:
            conflicts += epoch_rollback_conflicts(run, audits.get(run.node), problems)
            continue
        now = audits[run.node].signed_votes if run.node in audits else {}
        for view, old, new in rollback_conflicts(run.stale_votes, run.forgotten, now):
            conflicts += 1
            problems.append(
                f"replica {run.node} view {view}: voted {short(old)} before the rollback and "
                f"{short(new)} after it"
            )
        after = sorted(v for v in now if v not in run.stale_votes and v not in run.forgotten)
        run.fault.details["first_vote_view_after_restore"] = after[0] if after else None
        run.fault.details["votes_after_restore"] = len(after)
    d.report.equivocations += conflicts + len(splits)
    votes = sum(len(a.votes) for a in audits.values())
    views = len({v for a in audits.values() for v in a.votes})
    epochs = len({e for a in audits.values() for e, _ in a.votes})
    passed = f"{votes} recorded votes in {views} views"
    passed += f" of {epochs} epochs" if epochs > 1 else ""
    passed += ", one block per view"
    if d.stale_runs:
        passed += f"; no vote after {len(d.stale_runs)} stale restores contradicts a forgotten one"
    d.check("votes_consistent", problems, passed)


def epoch_rollback_conflicts(run: StaleRun, audit: ReplicaAudit | None, problems: list[str]) -> int:
    """`rollback_conflicts` for a restore across an epoch boundary, by (epoch, view); the
    first vote after the restore goes into its fault's details."""
    now = audit.votes if audit is not None else {}
    found = rollback_conflicts(run.stale_by_epoch, run.forgotten_by_epoch, now)
    for (epoch, view), old, new in found:
        problems.append(
            f"replica {run.node} epoch {epoch} view {view}: voted {short(old)} before the "
            f"rollback and {short(new)} after it"
        )
    after = sorted(
        k for k in now if k not in run.stale_by_epoch and k not in run.forgotten_by_epoch
    )
    run.fault.details["first_vote_after_restore"] = list(after[0]) if after else None
    run.fault.details["votes_after_restore"] = len(after)
    return len(found)


def check_rebuilt(d: Drill) -> None:
    """A sidecar rebuilt from the committed log holds, byte for byte, the
    state root, ledger and artifacts it held before its store was deleted. One rebuilt
    from a snapshot holds no history below the snapshot's height: it holds, at the first
    height both it and the store before the wipe cover, the state root and ledger head a
    peer holds there (and the one before, when that is the height before the wipe), and
    every artifact above the snapshot. A member wiped again was checked just before its
    next wipe (`Wiped.problems`)."""
    if not d.wiped:
        return
    problems = []
    for wiped in d.wiped:
        found = wiped.problems if wiped.problems is not None else rebuild_problems(d, wiped)
        problems += found
    rebuilt = ", ".join(
        f"sidecar {w.node} at height {w.before.height} ({w.before.ledger_entries} verdicts, "
        f"{len(w.before.artifacts)} artifacts; "
        f"{_rebuilt_by(w.replayed)})"
        for w in d.wiped
    )
    d.check("rebuilt_sidecar_identical", problems, f"identical to before the wipe: {rebuilt}")
