"""The `replace-member` drill (docs/drills.md): under load, a member's host is gone for
good (its replica and sidecar SIGKILLed, its node directory never used again); a new
machine is prepared with `quorumgate init --join` in a new directory inside the drill's
cluster directory, started (from genesis, as a non-member), and `quorumgate admin
replace-member` makes it member I from the next epoch on (docs/consensus/epochs.md,
"Replacing a member"). Another member each cycle, while `--seconds` last.

From the first replacement on the drill reads the cluster as it stands: `MovedSpec` is
the cluster file's description with each replaced member's entry swapped in (where the
new machine listens, its keys) and its node directory the new machine's. At the end the
checks take that description from the chain of epochs (`Client.epochs()`, each link
certified by a quorum of the epoch before), not from what the drill did, and read every
live member through it. Besides every check the other drills make, it checks that every
committed block's certificate verifies with the member set of its epoch
(`certificates_verify_by_epoch`), that each new machine voted in its first epoch and in
no epoch before (`new_members_vote`), that its sidecar executed the log from height 1
(`new_sidecars_from_height_1`), and that the gone members' keys open no stream any more
(`old_keys_refused`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from quorumgate.ops.drills.audit import read_replica, started_height
from quorumgate.ops.drills.bounds import POLL_S, RECOVERY_TIMEOUT_S, RESUME_TIMEOUT_S, poll
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.machines import (
    CLI_TIMEOUT_S,
    chain_of_epochs,
    change_height,
    check_certificates_by_epoch,
    cli,
    failed,
    join_machines,
    moved,
    new_machine_vote_problems,
    prepare_moved,
    stream_code,
    votes_sent,
)
from quorumgate.ops.drills.report import Abort, Fault
from quorumgate.ops.drills.rotation import epoch_now
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    JOIN_FILE,
    ClusterSpec,
    read_seed,
)
from quorumgate.replica.storage import StorageError
from quorumgate.sdk.epochs import Epochs

MACHINE_DIR = "new-machine-{k}"  # in the drill's cluster directory, one per replacement
# The command's own wait for 2f+1 replicas in the next epoch: on a 2-core machine at load
# average 20, starting it and its wait took up to 40 s together.
REPLACE_DEADLINE_S = 120.0


@dataclass
class Replacement:
    """One cycle: the member replaced, its old consensus key and where the new machine
    lives."""

    member: int
    old_key: bytes  # the gone machine's consensus seed, for the stream check (never shown)
    home: Path
    epoch_before: int
    fault: Fault


@dataclass
class ReplaceRun:
    cluster_file: ClusterSpec  # the trusted start of the chain of epochs
    homes: dict[int, Path] = field(default_factory=dict)
    done: list[Replacement] = field(default_factory=list)
    epochs: Epochs | None = None


def prepare_replace(d: Drill) -> None:
    """Refuse a directory drilled before (its chain already replaced members, whose old
    node directories `up` would start), and drive the cluster with a MovedCluster."""
    prepare_moved(d)


def victim(n: int, f: int, k: int) -> int:
    """The member cycle k replaces: the last, the one before, ... down to member f+1, then
    the last again. Members 0..f keep their cluster-file machines: `admin replace-member`
    reads the cluster through cluster.json's addresses and follows the chain of epochs
    only once f+1 replicas answer there (`Client.epochs`): once fewer do, an operator
    cannot run it (a limit, docs/drills.md)."""
    return n - 1 - k % (n - f - 1)


def replace_members(d: Drill) -> None:
    """Cycle k replaces member `victim(n, f, k)`: another member than the cycle before."""
    run = ReplaceRun(d.spec)
    d.before_checks.append(lambda: _follow_epochs(d, run))
    d.before_stop.append(lambda target: _before_stop(d, run, target))
    d.after_stop.append(lambda _target: _check_new_members(d, run))
    for k in d.cycles():
        replace_once(d, run, k, victim(d.n, d.spec.f, k))


def _move(d: Drill, current: ClusterSpec, homes: Mapping[int, Path]) -> None:
    spec = moved(current, homes)
    d.spec = d.cluster.spec = spec
    for i in homes:
        d.cluster.forget_channel(i)


def replace_once(d: Drill, run: ReplaceRun, k: int, member: int) -> None:
    epoch = epoch_now(d)
    old_key = read_seed(d.spec.node_dir(member) / CONSENSUS_KEY_FILE)
    height = d.top()
    d.scrape_equivocations([member])
    pids = d.cluster.pids(["replica", "sidecar"], [member])
    gone_at = time.monotonic()
    if d.load is not None:
        # Nothing to the gone host, nor to the new machine before it votes as the member.
        d.load.avoid([member])
    d.kill("sidecar", member)
    d.kill("replica", member)
    fault = d.fault(Fault("replace-member", member, gone_at - d.t0, "SIGKILL", pids, {}, height))
    d.say(f"cycle {k + 1}: member {member}'s host is gone (replica and sidecar SIGKILLed)")

    home = d.spec.directory / MACHINE_DIR.format(k=k)
    joined = join_machines(run.cluster_file, {member: home})[member]
    run.homes[member] = home
    # Where the new machine listens, so that the drill reaches it from now on.
    _move(d, d.spec.with_entries([joined]), run.homes)
    started = time.monotonic()
    d.start("replica", [member])
    d.start("sidecar", [member])
    status = d.cluster.probe(member)
    fault.pids_after = d.cluster.pids(["replica", "sidecar"], [member])
    fault.details.update(
        {
            "epoch_before": epoch,
            "new_machine": home.name,
            "new_machine_epoch_at_start": None if status is None else status.epoch,
        }
    )
    replace = run_replace(d, member, home / JOIN_FILE)
    answered = time.monotonic()
    fault.details.update(
        {
            "epoch_after": replace["next_epoch"],
            "public_key_prefix": str(replace["public_key"])[:16],
            "quorum_in_next_epoch_s": round(answered - started, 3),
        }
    )
    run.done.append(Replacement(member, old_key, home, epoch, fault))
    _await_voting(d, run, fault, epoch + 1, started)


def run_replace(d: Drill, member: int, entry: Path) -> dict[str, object]:
    done = cli(
        "admin", "replace-member", "--dir", str(d.spec.directory), "--member", str(member),
        "--entry", str(entry), "--json", "--deadline", str(REPLACE_DEADLINE_S),
        timeout_s=CLI_TIMEOUT_S + REPLACE_DEADLINE_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise failed(f"admin replace-member --member {member}", done)
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def _await_voting(d: Drill, run: ReplaceRun, fault: Fault, epoch: int, started: float) -> None:
    """Every replica in `epoch`, the new machine's first vote (a non-member votes in no
    epoch: its first is in `epoch`), and commits going on."""
    member = fault.node
    assert member is not None

    def everyone() -> float | None:
        statuses = d.statuses()
        if len(statuses) == d.n and all(s.epoch >= epoch for s in statuses.values()):
            return time.monotonic()
        return None

    at = poll(everyone, RECOVERY_TIMEOUT_S, POLL_S)
    if at is None:
        epochs = {i: s.epoch for i, s in d.statuses().items()}
        raise Abort(f"not every replica reached epoch {epoch}: {epochs}")
    fault.details["all_in_next_epoch_s"] = round(at - started, 3)
    voted = poll(
        lambda: time.monotonic() if votes_sent(d, member) > 0 else None, RECOVERY_TIMEOUT_S
    )
    if voted is None:
        raise Abort(f"the new machine of member {member} did not vote: {d.heights()}")
    fault.details["catch_up_s"] = round(voted - started, 3)
    if d.load is not None:
        d.load.avoid([])
    resumed = d.wait_commits(d.top(), list(range(d.n)), RESUME_TIMEOUT_S)
    if resumed is None:
        raise Abort(f"commits did not go on after epoch {epoch} began: {d.heights()}")
    fault.recovery_s = resumed - fault.at_s - d.t0
    back = d.wait_replica_back(member)
    fault.details["change_height"] = change_height(chain_of_epochs(d, run.cluster_file), epoch)
    d.say(
        f"member {member} replaced: epoch {epoch} on every replica after "
        f"{at - started:.2f} s, the new machine's first vote {voted - started:.2f} s after "
        f"its start, commits going on {fault.recovery_s:.2f} s after the host was gone"
        + ("" if back is not None else "; the new machine is not at the cluster's height")
    )


# ---------------------------------------------------------------------------- the checks


def _follow_epochs(d: Drill, run: ReplaceRun) -> None:
    """Before the checks: the cluster as the chain of epochs describes it, through which
    every check reads every member."""
    epochs = chain_of_epochs(d, run.cluster_file)
    run.epochs = epochs
    now = epochs.cluster(run.cluster_file)
    strangers = sorted(
        e.index for e in epochs.entries if e.index not in run.homes
    )  # a new machine the drill did not start
    mismatched = [
        f"member {r.member}: the chain of epochs names {now.member(r.member).replica_address}, "
        f"the new machine listens at {d.spec.member(r.member).replica_address}"
        for r in run.done
        if now.member(r.member) != d.spec.member(r.member)
    ]
    _move(d, now, run.homes)
    d.report.details["epochs"] = epochs.current.epoch
    d.check(
        "cluster_follows_epochs",
        mismatched
        + [f"member {i}: replaced by a machine the drill did not start" for i in strangers],
        f"{len(epochs.chain.epochs)} epochs checked from the cluster file; the last one's "
        f"members {sorted(e.index for e in epochs.entries)} at the new machines the drill started",
    )


def _before_stop(d: Drill, run: ReplaceRun, target: int) -> None:
    """While the cluster runs: the certificates of every epoch, the gone keys' streams."""
    epochs = run.epochs if run.epochs is not None else chain_of_epochs(d, run.cluster_file)
    check_certificates_by_epoch(d, epochs, target)
    _check_old_keys(d, run)


def _check_old_keys(d: Drill, run: ReplaceRun) -> None:
    problems = []
    for r in run.done:
        listener = next(i for i in range(d.n) if i != r.member)
        code = stream_code(d, r.member, listener, r.old_key)
        r.fault.details["old_key_stream"] = code.name
        if code != grpc.StatusCode.UNAUTHENTICATED:
            problems.append(f"member {r.member}'s old key: replica {listener} answered {code.name}")
    d.check(
        "old_keys_refused",
        problems if run.done else ["no member was replaced"],
        f"the old key of each of {len(run.done)} replaced members opens no stream "
        "(UNAUTHENTICATED)",
    )


def _check_new_members(d: Drill, run: ReplaceRun) -> None:
    """Once stopped: each live new machine's votes (its audit table) and its sidecar's
    start (height 0: the whole log executed from height 1)."""
    last = run.epochs.current.epoch if run.epochs is not None else 0
    votes: list[str] = []
    sidecars: list[str] = []
    live = [r for r in run.done if run.homes.get(r.member) == r.home]
    for r in live:  # a machine replaced again later is gone too, its tables with it
        epoch = r.epoch_before + 1
        try:
            audit = asyncio.run(read_replica(d.spec, r.member))
        except StorageError as err:
            votes.append(f"member {r.member}: {err}")
            continue
        mine = audit.votes
        found = new_machine_vote_problems(mine, epoch, last)
        votes += [f"member {r.member} ({r.home.name}): {p}" for p in found]
        first = min((k for k in mine if k[0] >= epoch), default=None)
        r.fault.details["first_vote"] = None if first is None else list(first)
        r.fault.details["votes_in_new_epochs"] = sum(1 for e, _ in mine if e >= epoch)
        began = started_height(d.spec, r.member, "sidecar")
        r.fault.details["sidecar_started_at_height"] = began
        if began != 0:
            sidecars.append(f"member {r.member}'s new sidecar started at height {began}")
    d.check(
        "new_members_vote",
        votes if run.done else ["no member was replaced"],
        f"each of the {len(live)} live new machines (of {len(run.done)}) voted from its "
        f"first epoch on, and in epoch {last}, and in no epoch before it was a member",
    )
    d.check(
        "new_sidecars_from_height_1",
        sidecars,
        f"each of the {len(live)} live new machines' sidecars started at height 0 and "
        "executed the log from height 1",
    )
    d.report.details["cycles"] = len(run.done)
    d.report.details["replaced"] = [
        {
            "member": r.member,
            "change_height": r.fault.details.get("change_height"),
            "catch_up_s": r.fault.details.get("catch_up_s"),
            "recovery_s": None if r.fault.recovery_s is None else round(r.fault.recovery_s, 3),
        }
        for r in run.done
    ]
