"""The `grow-shrink` drill (docs/drills.md): under load, a cluster of 4 grows to 7 and
shrinks back to 4, again and again, with the operator's commands (docs/consensus/
epochs.md, "Growing and shrinking"). Each cycle:

1. three new machines are prepared with `quorumgate init --join --index 4` (5, 6), in new
   directories inside the drill's cluster directory (`new-machine-K-I`; fresh machines
   every cycle), and started: each follows the chain from genesis as a non-member;
2. `quorumgate admin add-member` (their three `join.json` entries) makes the cluster 7
   from the next epoch on; the drill waits until all seven are in it, each new machine
   has sent its first vote, and the seven commit under the load for `GROWN_HEIGHTS`
   heights, so that calls are certified there (f+1 = 3 receipts of that epoch's keys);
3. `quorumgate admin remove-member` takes members 4, 5 and 6 out again: their replicas
   must exit by themselves at the boundary, and the four commit on in the next epoch.

The load goes to members 0..3, held from the add's start until the 7 commit (a new
machine replays the chain only after the change block, and the epoch of 7 waits for it).
New machines and the member set come and go; the checks read the cluster as the chain of
epochs describes it (`machines.chain_of_epochs`), not as the drill made it: the epochs
of 7 name the machines the drill started, the last epoch the cluster file's four
(`cluster_follows_epochs`); every committed block's certificate verifies with its
epoch's members, 2f+1 = 5 of 7 in an epoch of 7 (`certificates_verify_by_epoch`); every
certificate acknowledged in an epoch of 7 verifies offline with f+1 = 3 of that epoch's
receipt keys, and not with 2 (`certificates_of_seven_verify`); each new machine voted in
its epoch of 7 and in no other (`new_members_vote`), its sidecar executed the log from
height 1 (`new_sidecars_from_height_1`); no (epoch, view) holds votes for two blocks
across the four members' and every removed machine's tables
(`votes_consistent_with_removed`); the removed replicas exited at the boundary
(`removed_replicas_exited`), and their keys open no peer stream after the shrink
(`removed_keys_refused`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from quorumgate.ops.drills.audit import read_replica, started_height
from quorumgate.ops.drills.bounds import (
    POLL_S,
    RECOVERY_TIMEOUT_S,
    RESUME_TIMEOUT_S,
    poll,
)
from quorumgate.ops.drills.checker import vote_splits
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.machines import (
    CLI_TIMEOUT_S,
    chain_of_epochs,
    change_height,
    check_certificates_by_epoch,
    failed,
    join_machines,
    moved,
    new_machine_vote_problems,
    prepare_moved,
    stream_code,
    votes_sent,
)
from quorumgate.ops.drills.report import Abort, DrillError, Fault, short
from quorumgate.ops.drills.rotation import epoch_now
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    JOIN_FILE,
    ClusterSpec,
    load_cluster,
    read_seed,
)
from quorumgate.proto.membership import RECONFIG_SIZES, RECONFIG_STEP_MEMBERS
from quorumgate.replica.storage import StorageError
from quorumgate.sdk.certificates import verify
from quorumgate.sdk.epochs import Epochs
from quorumgate.sdk.errors import QuorumGateError
from quorumgate.sidecar.receipts import Certificate, ReceiptEpochs

MACHINE_DIR = "new-machine-{k}-{index}"  # cycle k's machine for member `index`
# The commands' own wait for 2f+1 of the next epoch's members (as `replace-member`'s).
CHANGE_DEADLINE_S = 120.0
GROWN_HEIGHTS = 8  # heights the cluster of 7 commits under load before the shrink
REMOVED_EXIT_MARK = "a remove record took it out"  # the removed replica's last log line


@dataclass
class Cycle:
    """One grow and its shrink: the new machines (index -> directory), their consensus
    seeds (for the stream check; never shown) and public keys, and the epoch of 7."""

    k: int
    homes: dict[int, Path]
    seeds: dict[int, bytes]
    public_keys: dict[int, bytes]
    grown_epoch: int
    grow: Fault
    shrink: Fault | None = None
    exit_codes: dict[int, int | None] = field(default_factory=dict)


@dataclass
class GrowRun:
    cluster_file: ClusterSpec  # the trusted start of the chain of epochs
    cycles: list[Cycle] = field(default_factory=list)
    epochs: Epochs | None = None


def prepare_grow(d: Drill) -> None:
    """Only a cluster of 4 grows (to 7: `RECONFIG_SIZES`); a directory with new machines
    of an earlier drill is refused; the cluster is driven with a MovedCluster."""
    if d.n != min(RECONFIG_SIZES):
        raise DrillError(
            f"grow-shrink grows a cluster of {min(RECONFIG_SIZES)} to {max(RECONFIG_SIZES)}: "
            f"{d.spec.directory} holds {d.n} members"
        )
    prepare_moved(d)
    d.certificates = {}  # kept by the certificate check, checked again offline


def grow_shrink(d: Drill) -> None:
    """Grow and shrink, with fresh machines each cycle, while `--seconds` last."""
    run = GrowRun(d.spec)
    d.before_checks.append(lambda: _follow_epochs(d, run))
    d.before_stop.append(lambda target: _before_stop(d, run, target))
    d.after_stop.append(lambda _target: _after_stop(d, run))
    for k in d.cycles():
        cycle = grow_once(d, run, k)
        shrink_once(d, cycle)


def _new_indexes(d: Drill) -> list[int]:
    return list(range(d.n, d.n + RECONFIG_STEP_MEMBERS))


def _admin(
    d: Drill, *args: str, watch: Mapping[int, subprocess.Popen[bytes] | None] | None = None
) -> tuple[dict[str, object], dict[int, float]]:
    """`quorumgate admin ...` with the drill's directory: its JSON answer (`Abort` unless
    the change took effect) and, for the processes in `watch`, when each was first seen
    to have exited while the command ran (a removed replica stops at the boundary, before
    the command has seen 2f+1 of the next epoch)."""
    command = [
        sys.executable, "-m", "quorumgate", "admin", *args, "--dir", str(d.spec.directory),
        "--json", "--deadline", str(CHANGE_DEADLINE_S),
    ]  # fmt: skip
    exited: dict[int, float] = {}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        deadline = time.monotonic() + CLI_TIMEOUT_S + CHANGE_DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline:
            for i, p in (watch or {}).items():
                if i not in exited and (p is None or p.poll() is not None):
                    exited[i] = time.monotonic()
            time.sleep(POLL_S)  # the command's end, or an exit, whichever comes first
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    done = subprocess.CompletedProcess(command, proc.returncode, out, err)
    if done.returncode != 0:
        raise failed(f"admin {args[0]}", done)
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc, exited


def _all_in(d: Drill, indexes: Sequence[int], epoch: int) -> float | None:
    statuses = d.statuses(indexes)
    if len(statuses) == len(indexes) and all(s.epoch >= epoch for s in statuses.values()):
        return time.monotonic()
    return None


def _commits_go_on(d: Drill, among: Sequence[int], quorum: int) -> float | None:
    """When `quorum` of `among` committed above the highest height they show now."""
    above = d.top(among)

    def done() -> float | None:
        heights = d.heights(among).values()
        return time.monotonic() if sum(h > above for h in heights) >= quorum else None

    return poll(done, RESUME_TIMEOUT_S)


def grow_once(d: Drill, run: GrowRun, k: int) -> Cycle:
    new = _new_indexes(d)
    seven = list(range(d.n + len(new)))
    epoch = epoch_now(d)
    height = d.top()
    homes = {i: d.spec.directory / MACHINE_DIR.format(k=k, index=i) for i in new}
    fault = d.fault(Fault("grow", None, time.monotonic() - d.t0, height_at_fault=height))
    d.say(f"cycle {k + 1}: preparing new machines {new} with init --join")
    joined = join_machines(run.cluster_file, homes)
    seeds = {i: read_seed(homes[i] / f"node-{i}" / CONSENSUS_KEY_FILE) for i in new}
    cycle = Cycle(k, homes, seeds, {i: joined[i].public_key for i in new}, epoch + 1, fault)
    run.cycles.append(cycle)
    # The drill reaches the new machines where they listen; the load stays on 0..3.
    d.cluster.spec = moved(d.spec.with_entries([joined[i] for i in new]), homes)
    for i in new:
        d.cluster.forget_channel(i)
    started = time.monotonic()
    d.start("replica", new)
    d.start("sidecar", new)
    fault.pids_after = d.cluster.pids(["replica", "sidecar"], new)
    at_start = {i: s.epoch for i, s in d.statuses(new).items()}
    fault.details.update(
        {
            "epoch_before": epoch,
            "new_machines": [homes[i].name for i in new],
            "new_machines_epoch_at_start": {str(i): e for i, e in sorted(at_start.items())},
        }
    )
    # A new machine takes no chain before the add commits (the members refuse its
    # streams in an epoch it is no member of) and replays it from genesis after the
    # change block; an epoch of 7 needs 5 voters, so from that block on the four cannot
    # commit until one new machine caught up. The load is held meanwhile: proposals
    # piled up during so long a stall commit together, past the engine's per-agent
    # quota in block time (docs/drills.md, "Growing to 7 and shrinking back to 4").
    if d.load is not None:
        d.load.avoid(range(d.n))
    asked = time.monotonic()
    entries = [a for i in new for a in ("--entry", str(homes[i] / JOIN_FILE))]
    doc, _ = _admin(d, "add-member", *entries)
    answered = time.monotonic()
    fault.details.update(
        {
            "epoch_after": doc["next_epoch"],
            "members_after": doc["members_after"],
            "started_to_add_s": round(asked - started, 3),
            "quorum_in_next_epoch_s": round(answered - asked, 3),
        }
    )
    everyone = poll(lambda: _all_in(d, seven, epoch + 1), RECOVERY_TIMEOUT_S, POLL_S)
    if everyone is None:
        epochs = {i: s.epoch for i, s in d.statuses(seven).items()}
        raise Abort(f"not all 7 replicas reached epoch {epoch + 1}: {epochs}")
    fault.details["all_in_next_epoch_s"] = round(everyone - asked, 3)
    catch_up: dict[str, float] = {}
    for i in new:
        voted = poll(
            lambda i=i: time.monotonic() if votes_sent(d, i) > 0 else None,  # type: ignore[misc]
            RECOVERY_TIMEOUT_S,
        )
        if voted is None:
            raise Abort(f"new member {i} did not vote in epoch {epoch + 1}: {d.heights(seven)}")
        catch_up[str(i)] = round(voted - started, 3)
    fault.details["catch_up_s"] = catch_up
    # The load again, now that the 7 vote: without proposals there is nothing to commit.
    if d.load is not None:
        d.load.avoid([])
    fault.details["load_held_s"] = round(time.monotonic() - asked, 3)
    resumed = _commits_go_on(d, seven, 5)  # 2f+1 of 7
    if resumed is None:
        raise Abort(f"the 7 did not commit in epoch {epoch + 1}: {d.heights(seven)}")
    fault.recovery_s = resumed - asked
    change = change_height(chain_of_epochs(d, run.cluster_file), epoch + 1)
    fault.details["change_height"] = change
    d.say(
        f"grown to 7 in epoch {epoch + 1} (change block at {change}): all 7 in it "
        f"{everyone - asked:.2f} s after add-member, first votes {catch_up} s after the new "
        f"machines started, commits going on {fault.recovery_s:.2f} s after add-member"
    )
    # Load in the epoch of 7, long enough that calls are certified there.
    goal = (change or d.top()) + GROWN_HEIGHTS
    if poll(lambda: time.monotonic() if d.top(seven) >= goal else None, RESUME_TIMEOUT_S) is None:
        raise Abort(f"the 7 did not reach height {goal}: {d.heights(seven)}")
    d.scrape_equivocations(new)  # before the shrink stops them
    return cycle


def shrink_once(d: Drill, cycle: Cycle) -> None:
    new = sorted(cycle.homes)
    four = list(range(d.n))
    epoch = epoch_now(d)
    pids = d.cluster.pids(["replica", "sidecar"], new)
    procs = {i: d.cluster.running.get(("replica", i)) for i in new}
    asked = time.monotonic()
    fault = d.fault(Fault("shrink", None, asked - d.t0, "", pids, {}, d.top()))
    cycle.shrink = fault
    doc, seen = _admin(d, "remove-member", watch=procs)
    answered = time.monotonic()
    fault.details.update(
        {
            "epoch_before": epoch,
            "epoch_after": doc["next_epoch"],
            "members_after": doc["members_after"],
            "quorum_in_next_epoch_s": round(answered - asked, 3),
        }
    )

    def exited() -> float | None:
        for i, p in procs.items():
            if i not in seen and (p is None or p.poll() is not None):
                seen[i] = time.monotonic()
        return max(seen.values()) if len(seen) == len(procs) else None

    out = poll(exited, RECOVERY_TIMEOUT_S)
    cycle.exit_codes = {i: None if p is None else p.poll() for i, p in procs.items()}
    fault.details["exit_codes"] = {str(i): c for i, c in sorted(cycle.exit_codes.items())}
    # From remove-member's start to the last removed replica seen gone (polled).
    fault.details["exited_s"] = None if out is None else round(out - asked, 3)
    # Their sidecars serve a member no more: stopped, as the operator retires the machine.
    d.cluster.stop([("sidecar", i) for i in new] + [("replica", i) for i in new])
    d.cluster.spec = d.spec
    for i in new:
        d.cluster.forget_channel(i)
    if out is None:
        raise Abort(f"removed replicas still running: {cycle.exit_codes}")
    everyone = poll(lambda: _all_in(d, four, epoch + 1), RECOVERY_TIMEOUT_S, POLL_S)
    if everyone is None:
        raise Abort(f"not all 4 replicas reached epoch {epoch + 1}: {d.heights()}")
    fault.details["all_in_next_epoch_s"] = round(everyone - asked, 3)
    resumed = d.wait_commits(d.top(), four, RESUME_TIMEOUT_S)
    if resumed is None:
        raise Abort(f"the 4 did not commit in epoch {epoch + 1}: {d.heights()}")
    fault.recovery_s = resumed - asked
    fault.details["change_height"] = change_height(chain_of_epochs(d, d.spec), epoch + 1)
    d.say(
        f"shrunk to 4 in epoch {epoch + 1} (change block at {fault.details['change_height']}):"
        f" members {new} exited {fault.details['exited_s']} s after remove-member, commits "
        f"going on {fault.recovery_s:.2f} s after it"
    )


# ---------------------------------------------------------------------------- the checks


def epoch_shape_problems(
    epochs: Epochs, cluster_file: ClusterSpec, cycles: Sequence[Cycle]
) -> list[str]:
    """The chain of epochs against the cluster file and the machines the drill started:
    each cycle's epoch of 7 has the four cluster-file keys and the three new machines'
    keys (at the addresses their entries give), the epoch after it the four again, and
    the last epoch is the cluster file's four at their addresses."""
    problems: list[str] = []
    chained = {e.epoch: e for e in epochs.chain.epochs}
    home_keys = [m.public_key for m in cluster_file.members]
    for c in cycles:
        grown = chained.get(c.grown_epoch)
        if grown is None:
            problems.append(f"cycle {c.k + 1}: no epoch {c.grown_epoch} in the chain")
            continue
        keys = list(grown.keys)
        want = home_keys + [c.public_keys[i] for i in sorted(c.public_keys)]
        if keys != want:
            problems.append(
                f"epoch {c.grown_epoch}: {len(keys)} members, keys "
                f"{[short(k)[:8] for k in keys]}, not the four and cycle {c.k + 1}'s machines"
            )
        shrunk = chained.get(c.grown_epoch + 1)
        if c.shrink is not None and (shrunk is None or list(shrunk.keys) != home_keys):
            problems.append(f"epoch {c.grown_epoch + 1}: not the cluster file's four members")
    now = epochs.cluster(cluster_file)
    if now.members != cluster_file.members:
        problems.append(
            f"the last epoch {epochs.current.epoch}: members "
            f"{[m.replica_address for m in now.members]}, not the cluster file's four"
        )
    expected = 1 + sum(1 + (c.shrink is not None) for c in cycles)
    if len(epochs.chain.epochs) != expected:
        problems.append(f"{len(epochs.chain.epochs)} epochs, {expected} expected")
    return problems


def _follow_epochs(d: Drill, run: GrowRun) -> None:
    """Before the checks: the chain of epochs, from the cluster file, read through the
    cluster as it stands; every check reads the members it names."""
    epochs = chain_of_epochs(d, run.cluster_file)
    run.epochs = epochs
    d.spec = d.cluster.spec = moved(epochs.cluster(run.cluster_file), {})
    d.report.details["epochs"] = epochs.current.epoch
    sizes = [e.membership.n for e in epochs.chain.epochs]
    d.check(
        "cluster_follows_epochs",
        epoch_shape_problems(epochs, run.cluster_file, run.cycles)
        + ([] if run.cycles else ["the cluster never grew"]),
        f"{len(sizes)} epochs checked from the cluster file, members by epoch {sizes}: each "
        "epoch of 7 the four and the three machines the drill started, the last the four",
    )


def seven_certificate_problems(
    spec: ClusterSpec,
    certificates: Mapping[bytes, Certificate],
    receipt_epochs: ReceiptEpochs,
    grown: Mapping[int, int],
) -> tuple[list[str], dict[int, int]]:
    """The certificates of the epochs of 7 (`grown`: epoch -> members), each verified
    offline with the chain's receipt keys (`sdk.certificates.verify`): f+1 = 3 distinct
    signers of its epoch; and the same certificate cut to f = 2 signers must be refused,
    so that the verifier is seen to count 7's f. The problems, and the certificates
    verified by epoch."""
    problems: list[str] = []
    per_epoch: dict[int, int] = {}
    for pid, cert in sorted(certificates.items()):
        if cert.epoch not in grown:
            continue
        need = (grown[cert.epoch] - 1) // 3 + 1
        try:
            verify(spec, cert, proposal_id=pid, epochs=receipt_epochs)
        except QuorumGateError as err:
            problems.append(f"{short(pid)} (epoch {cert.epoch}): refused offline: {err}")
            continue
        signers = len(set(cert.signers))
        if signers < need:
            problems.append(f"{short(pid)} (epoch {cert.epoch}): {signers} signers, {need} needed")
            continue
        cut = dataclasses.replace(cert, signatures=cert.signatures[: need - 1])
        try:
            verify(spec, cut, proposal_id=pid, epochs=receipt_epochs)
            problems.append(f"{short(pid)} (epoch {cert.epoch}): verified with {need - 1} signers")
        except QuorumGateError:
            pass
        per_epoch[cert.epoch] = per_epoch.get(cert.epoch, 0) + 1
    return problems, per_epoch


def _before_stop(d: Drill, run: GrowRun, target: int) -> None:
    """While the cluster runs: every block's certificate with its epoch's members, the
    certificates of the epochs of 7 offline, and the removed keys' streams."""
    epochs = run.epochs if run.epochs is not None else chain_of_epochs(d, run.cluster_file)
    check_certificates_by_epoch(d, epochs, target)
    grown = {e.epoch: e.membership.n for e in epochs.chain.epochs if e.membership.n > d.n}
    problems, per_epoch = seven_certificate_problems(
        run.cluster_file, d.certificates or {}, epochs.receipt_epochs, grown
    )
    if grown and not per_epoch:
        problems.append(f"no acknowledged call was certified in an epoch of 7 ({sorted(grown)})")
    d.report.details["certified_in_epochs_of_7"] = sum(per_epoch.values())
    d.check(
        "certificates_of_seven_verify",
        problems,
        f"{sum(per_epoch.values())} certificates of the epochs of 7 verified offline with "
        f"f+1 = 3 of their epoch's receipt keys (none with 2), by epoch "
        f"{dict(sorted(per_epoch.items()))}",
    )
    refused = []
    codes: dict[str, str] = {}
    for c in run.cycles:
        if c.shrink is None:
            continue
        for i, seed in sorted(c.seeds.items()):
            code = stream_code(d, i, 0, seed)
            codes[c.homes[i].name] = code.name
            if code != grpc.StatusCode.UNAUTHENTICATED:
                refused.append(f"{c.homes[i].name} (member {i}): replica 0 answered {code.name}")
        c.shrink.details["removed_key_streams"] = {
            str(i): codes[c.homes[i].name] for i in sorted(c.seeds)
        }
    d.check(
        "removed_keys_refused",
        refused if codes else ["no member was removed"],
        f"the key of each of {len(codes)} removed machines opens no stream (UNAUTHENTICATED)",
    )


def _after_stop(d: Drill, run: GrowRun) -> None:
    """Once stopped: the removed machines' own tables (their votes, their sidecars'
    start), every table's votes together, and the removed replicas' exits."""
    tables: dict[int, dict[tuple[int, int], bytes]] = {}
    votes: list[str] = []
    sidecars: list[str] = []
    exits: list[str] = []
    for i in range(d.n):
        try:
            tables[i] = asyncio.run(read_replica(d.spec, i)).votes
        except StorageError as err:
            votes.append(f"replica {i}: {err}")
    for c in run.cycles:
        for i, home in sorted(c.homes.items()):
            name = home.name
            spec = load_cluster(home)
            try:
                mine = asyncio.run(read_replica(spec, i)).votes
            except StorageError as err:
                votes.append(f"{name}: {err}")
                continue
            tables[1000 * (c.k + 1) + i] = mine  # (a label for the split report)
            found = new_machine_vote_problems(mine, c.grown_epoch, c.grown_epoch)
            votes += [f"{name}: {p}" for p in found]
            first = min(mine, default=None)
            c.grow.details.setdefault("first_votes", {})[str(i)] = (  # type: ignore[index]
                None if first is None else list(first)
            )
            began = started_height(spec, i, "sidecar")
            if began != 0:
                sidecars.append(f"{name}'s sidecar started at height {began}")
            if c.shrink is None:
                continue
            code = c.exit_codes.get(i)
            log = (spec.node_dir(i) / "replica.log").read_text(errors="replace")
            if code is None:
                exits.append(f"{name}: its replica did not exit by itself")
            elif REMOVED_EXIT_MARK not in log:
                exits.append(f"{name}: exited {code} without logging that a remove took it out")
    machines = sum(len(c.homes) for c in run.cycles)
    d.check(
        "new_members_vote",
        votes if machines else ["no machine was added"],
        f"each of {machines} new machines voted in its epoch of 7 and in no other",
    )
    d.check(
        "new_sidecars_from_height_1",
        sidecars,
        f"each of {machines} new machines' sidecars started at height 0 and executed the "
        "log from height 1",
    )
    splits = vote_splits(tables)
    d.check(
        "votes_consistent_with_removed",
        [
            f"epoch {e} view {v}: "
            + ", ".join(f"{short(h)} by {sorted(ns)}" for h, ns in hashes.items())
            for (e, v), hashes in splits.items()
        ],
        f"{sum(len(t) for t in tables.values())} votes of the {d.n} members and {machines} "
        f"removed machines in {len({k for t in tables.values() for k in t})} (epoch, view)s, "
        "one block per view",
    )
    removed = [c for c in run.cycles if c.shrink is not None]
    codes = sorted({x for c in removed for x in c.exit_codes.values() if x is not None})
    d.check(
        "removed_replicas_exited",
        exits if removed else ["no member was removed"],
        f"the {3 * len(removed)} removed replicas exited by themselves at the boundary "
        f"(exit codes {codes})",
    )
    d.report.details["cycles"] = len(run.cycles)
    d.report.details["grow_shrink"] = [
        {
            "cycle": c.k + 1,
            "grow_height": c.grow.details.get("change_height"),
            "shrink_height": None if c.shrink is None else c.shrink.details.get("change_height"),
            "epoch_of_7": c.grown_epoch,
            "catch_up_s": c.grow.details.get("catch_up_s"),
            "grow_recovery_s": None if c.grow.recovery_s is None else round(c.grow.recovery_s, 3),
            "shrink_recovery_s": None
            if c.shrink is None or c.shrink.recovery_s is None
            else round(c.shrink.recovery_s, 3),
        }
        for c in run.cycles
    ]
