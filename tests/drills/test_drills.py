"""Short forms of the recovery drills (docs/drills.md): each drill of `quorumgate.ops.drills`
against a live 4-node cluster (replicas and sidecars, real processes on loopback) for a
few seconds of faults under load.

Each test asserts the report's `ok`, the key checks one by one, and that the fault really
happened the way the drill says (new pids, a wiped replica starting at height 0, a stale
copy older than the votes it made its replica forget...). `run_drill` starts and stops
every process itself; the `drill_dir` fixture's finalizer also kills, by pid, anything
still running for the test's directory, whether the test passed or failed. Every wait in
the drill is a poll with a deadline.

The pure check functions are tested on their own below, so that checks which pass on a
healthy cluster are also seen to fail on a broken one.

These start real processes (about a minute for the file on a 2-core machine);
deselect them with `-m "not live"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from quorumgate.cli import main as quorumgate
from quorumgate.ops.drills import (
    BYZANTINE_CYCLES,
    DRILLS,
    FAULT_CYCLES_MIN,
    DrillError,
    DrillReport,
    Fault,
    majority,
    prepare_cluster,
    refusals_since,
    rollback_conflicts,
    run_drill,
    vote_splits,
)
from quorumgate.ops.drills.audit import ReplicaAudit, read_replica
from quorumgate.ops.drills.checker import epoch_rollback_conflicts
from quorumgate.ops.drills.context import StaleRun
from quorumgate.ops.drills.grow import seven_certificate_problems
from quorumgate.ops.drills.machines import certificate_problems, new_machine_vote_problems
from quorumgate.ops.drills.replace import victim
from quorumgate.ops.live import cluster_pids
from quorumgate.ops.nodes import start_nodes, stop_nodes, wait_serving
from quorumgate.proto.chainversions import VERSION_ABSENT
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.epochchain import ChainedEpoch
from quorumgate.replica.storage import ReplicaStore
from quorumgate.sidecar.receipts import (
    Certificate,
    Receipt,
    ReceiptEpoch,
    ReceiptEpochs,
    ReceiptLeaf,
    assemble_certificate,
    sign_block,
)
from tests.consensus.helpers import CHAIN, SIGNERS, chain_of, membership

pytestmark = pytest.mark.live

NODES = 4
SHORT_S = 2.0  # faults come for this long (each drill injects its minimum anyway)
# Checks every drill must pass, asserted one by one so a failure names its check.
KEY_CHECKS = (
    "acknowledged_committed",
    "acknowledged_certified",
    "committed_once",
    "verdicts_once",
    "verdicts_expected",
    "same_block_hashes",
    "same_state_roots",
    "same_ledger_heads",
    "same_artifacts",
    "ledgers_verify",
    "no_equivocation_counted",
    "no_divergence_alarm",
    "votes_consistent",
    "recovered",
    "drill_completed",
)


@pytest.fixture
def drill_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        for pid in cluster_pids(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _progress(line: str) -> None:
    print(line)  # shown by pytest when the test fails


def _assert_clean(report: DrillReport, directory: Path) -> None:
    failed = {c.name: c.detail for c in report.failed()}
    assert report.ok, f"drill {report.drill} failed: {failed}"
    for name in KEY_CHECKS:
        check = report.check(name)
        assert check.ok, f"{name}: {check.detail}"
    assert report.acknowledged > 0
    assert report.certified == report.acknowledged
    assert report.lost == report.duplicates == report.diverged == report.equivocations == 0
    assert report.verdicts.get("deny:target_scheme_not_allowed", 0) > 0, report.verdicts
    assert len(report.faults) >= FAULT_CYCLES_MIN[report.drill]
    assert all(f.recovery_s is not None for f in report.faults)
    assert report.recovery_s == report.faults[-1].recovery_s
    assert not cluster_pids(directory), "the drill left processes running"
    document = report.as_dict()
    for key in ("drill", "nodes", "acknowledged", "certified", "lost", "diverged"):
        assert key in document
    assert {"equivocations", "recovery_s", "checks", "ok"} <= set(document)
    json.dumps(document)  # the report is JSON as it stands


def _detail(fault: Fault, key: str) -> object:
    assert key in fault.details, f"{fault.kind} fault has no {key!r}: {fault.details}"
    return fault.details[key]


def test_leader_kill_kills_the_leader_of_the_moment_and_commits_resume(drill_dir: Path) -> None:
    report = run_drill("leader-kill", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress)
    _assert_clean(report, drill_dir)
    spec = prepare_cluster(drill_dir, NODES)
    for fault in report.faults:
        assert fault.kind == "sigkill-replica" and fault.signal == "SIGKILL"
        assert fault.node == spec.membership().leader(fault.view_at_fault), (
            f"replica {fault.node} killed, but view {fault.view_at_fault} is led by another"
        )
        assert fault.pids_after["replica"] != fault.pids_before["replica"]
        resumed_s = _detail(fault, "commits_resumed_s")
        assert isinstance(resumed_s, float) and 0 < resumed_s <= (fault.recovery_s or 0)
        view = _detail(fault, "survivor_view_at_resume")
        assert isinstance(view, int) and view > fault.view_at_fault


def test_wipe_replica_rebuilds_from_height_zero_by_replay_and_by_its_sidecar(
    drill_dir: Path,
) -> None:
    report = run_drill("wipe-replica", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress)
    _assert_clean(report, drill_dir)
    assert report.check("rebuilt_sidecar_identical").ok
    rebuilt_by = [_detail(f, "rebuilt_by") for f in report.faults]
    assert rebuilt_by[:2] == ["replay", "sidecar"]
    for fault in report.faults:
        assert fault.height_at_fault > 0
        assert _detail(fault, "height_after_wipe") == 0
        assert _detail(fault, "replica_started_at_height") == 0, "the replica did not start empty"
        kept = _detail(fault, "signed_votes_kept")
        assert kept == _detail(fault, "signed_votes_before") and isinstance(kept, int) and kept > 0
        assert set(fault.pids_after) == {"replica", "sidecar"}
        for kind in ("replica", "sidecar"):
            assert fault.pids_after[kind] != fault.pids_before[kind]
    replayed = _detail(report.faults[0], "replay")
    assert isinstance(replayed, dict)
    assert replayed["mismatches"] == []
    assert replayed["heights_recorded"] == replayed["heights_replayed"] > 0
    assert replayed["certificates_checked"] == replayed["heights_replayed"]
    assert replayed["heights_replayed"] >= report.faults[0].height_at_fault
    assert _detail(report.faults[1], "sidecar_started_at_height") == 0
    # the third rebuild starts from a snapshot its peers attest and replays only after it
    assert rebuilt_by[:3] == ["replay", "sidecar", "snapshot"]
    from_snapshot = _detail(report.faults[2], "replay")
    assert isinstance(from_snapshot, dict) and from_snapshot["mismatches"] == []
    snapshot = from_snapshot["snapshot"]
    assert isinstance(snapshot, dict) and snapshot["height"] > 0
    assert from_snapshot["history_from"] == snapshot["height"]
    assert from_snapshot["heights_replayed"] == from_snapshot["top_height"] - snapshot["height"]
    for fault in report.faults[:3]:
        assert isinstance(_detail(fault, "sidecar_rebuilt_s"), float)


def test_full_restart_through_the_command_line_with_a_json_report(
    drill_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = quorumgate(
        ["drill", "full-restart", "--dir", str(drill_dir), "--seconds", str(SHORT_S), "--json"]
    )
    out, err = capsys.readouterr()
    report = json.loads(out)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert code == 0 and report["ok"], f"failed checks: {failed}"
    assert "[drill full-restart" in err, "no progress lines on stderr"
    names = {c["name"] for c in report["checks"] if c["ok"]}
    assert set(KEY_CHECKS) <= names
    assert report["acknowledged"] == report["certified"] > 0
    assert report["lost"] == report["diverged"] == report["equivocations"] == 0
    assert not cluster_pids(drill_dir)
    fault = report["faults"][0]
    assert fault["kind"] == "stop-all" and fault["signal"] == "SIGKILL"
    expected = {f"{kind}-{i}" for kind in ("replica", "sidecar") for i in range(NODES)}
    assert set(fault["pids_before"]) == set(fault["pids_after"]) == expected
    assert all(fault["pids_before"][k] != fault["pids_after"][k] for k in expected)
    assert set(fault["exit_codes"].values()) == {-signal.SIGKILL}, "not every process was killed"
    assert 0 < fault["recovery_s"] <= fault["sidecars_resumed_s"]
    assert report["final_height"] > fault["height_at_fault"]


def test_sidecar_crash_resumes_after_the_last_recorded_height(drill_dir: Path) -> None:
    report = run_drill("sidecar-crash", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress)
    _assert_clean(report, drill_dir)
    for fault in report.faults:
        assert fault.kind == "sigkill-sidecar"
        assert fault.pids_after["sidecar"] != fault.pids_before["sidecar"]
        restarted_at = _detail(fault, "executed_height_at_restart")
        # Not from 0: it resumed from what it recorded (at least what it had executed when
        # its status was read just before the kill).
        assert isinstance(restarted_at, int) and restarted_at >= fault.height_at_fault > 0
    lags = [_detail(f, "lag_blocks_at_kill") for f in report.faults]
    assert any(isinstance(lag, int) and lag > 0 for lag in lags), (
        f"no sidecar was killed with committed blocks left to execute: {lags}"
    )


def test_rotate_members_rotates_every_members_keys_under_load(drill_dir: Path) -> None:
    """Each member's consensus key, then its receipt key, in turn, each rotation an epoch:
    every replica ends in epoch 2n with each member signing under its new keys, and the
    chain never forked."""
    report = run_drill(
        "rotate-members", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress
    )
    _assert_clean(report, drill_dir)
    assert report.check("every_replica_in_the_last_epoch").ok
    rotated = [(fault.node, fault.kind) for fault in report.faults]
    expected = [(m, kind) for m in range(NODES) for kind in ("rotate-member", "rotate-receipt")]
    assert rotated[: 2 * NODES] == expected, rotated
    for k, fault in enumerate(report.faults):
        assert (_detail(fault, "epoch_before"), _detail(fault, "epoch_after")) == (k, k + 1)
        assert (
            0
            < _detail(fault, "quorum_in_next_epoch_s")
            <= _detail(  # type: ignore[operator]
                fault, "all_in_next_epoch_s"
            )
        )
        assert fault.recovery_s is not None
    # Each epoch committed blocks (the next rotation's record, or the load after the
    # last), and the vote audit read every one of them, not only epoch 0's table.
    epochs = len(report.faults) + 1
    assert f"of {epochs} epochs" in report.check("votes_consistent").detail
    spec = prepare_cluster(drill_dir, NODES)
    for member in range(NODES):  # each member holds its key file of every rotation
        for pattern, kind in (
            ("consensus-*.key", "rotate-member"),
            ("receipt-*.key", "rotate-receipt"),
        ):
            held = list(spec.node_dir(member).glob(pattern))
            made = sum(f.node == member and f.kind == kind for f in report.faults)
            assert len(held) == made, (member, pattern, held)


def test_stale_restore_does_not_equivocate_in_the_views_it_forgot(drill_dir: Path) -> None:
    report = run_drill("stale-restore", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress)
    _assert_clean(report, drill_dir)
    (fault, *_) = report.faults
    stale_voted = _detail(fault, "stale_last_voted_view")
    voted = _detail(fault, "last_voted_view_before_rollback")
    forgotten = _detail(fault, "forgotten_votes")
    views = _detail(fault, "forgotten_views")
    assert isinstance(stale_voted, int) and isinstance(voted, int) and isinstance(views, list)
    assert isinstance(forgotten, int) and forgotten > 0
    # (`voted` also counts a timeout signed after the last vote: Rule 4.)
    assert stale_voted < views[0] <= views[1] <= voted, "the copy was not older than its votes"
    assert fault.node == prepare_cluster(drill_dir, NODES).membership().leader(fault.view_at_fault)
    stale_height = _detail(fault, "stale_committed_height")
    assert isinstance(stale_height, int) and stale_height < fault.height_at_fault
    assert _detail(fault, "restarted_at_height") == stale_height, "not restarted on the copy"
    # Restored while the cluster was still at most one view past its last signature...
    cluster_view = _detail(fault, "cluster_view_at_restore")
    assert isinstance(cluster_view, int) and cluster_view <= voted + 1
    # ...and it signed no vote again in a view it had forgotten (Rule 6).
    first = _detail(fault, "first_vote_view_after_restore")
    assert isinstance(first, int) and first > voted
    # Declared with the marker file, which the replica removed once its fence was behind it.
    assert _detail(fault, "restore_marker_removed") is True
    assert fault.pids_after["replica"] != fault.pids_before["replica"]


def test_stale_restore_epoch_fences_in_the_epoch_it_forgot_and_rejoins(drill_dir: Path) -> None:
    """A member backed up in epoch 0, another member's key rotated (epoch 1), the backup
    put back after the member voted in epoch 1: it fences in epoch 1, rejoins, and no vote
    of it in any (epoch, view) contradicts one it forgot."""
    report = run_drill(
        "stale-restore-epoch", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress
    )
    _assert_clean(report, drill_dir)
    assert report.check("restored_across_the_boundary").ok
    restores = [f for f in report.faults if f.kind == "stale-restore-epoch"]
    rotations = [f for f in report.faults if f.kind == "rotate-member"]
    assert restores and len(rotations) == len(restores)
    (fault, *_) = restores
    assert _detail(fault, "backup_epoch") == 0 and _detail(fault, "epoch_at_restore") == 1
    by_epoch = _detail(fault, "forgotten_votes_by_epoch")
    assert isinstance(by_epoch, dict) and by_epoch.get("1", 0) > 0, by_epoch
    stale_height = _detail(fault, "stale_committed_height")
    assert isinstance(stale_height, int) and stale_height < fault.height_at_fault
    assert _detail(fault, "restarted_at_height") == stale_height, "not restarted on the copy"
    fenced = _detail(fault, "fenced")
    assert isinstance(fenced, list) and any(f["epoch"] == 1 for f in fenced), fenced
    assert _detail(fault, "epoch_after") == 1 and _detail(fault, "restore_marker_removed")
    first = _detail(fault, "first_vote_after_restore")
    assert isinstance(first, list) and first[0] >= 1, first
    assert fault.pids_after["replica"] != fault.pids_before["replica"]
    assert "of 2 epochs" in report.check("votes_consistent").detail


def test_replace_member_gives_a_gone_members_place_to_a_new_machine(drill_dir: Path) -> None:
    """Member 3's host is gone for good; a new machine prepared with `init --join` in the
    drill's directory becomes member 3 at epoch 1 (`admin replace-member`): the checks read
    it through the chain of epochs, its sidecar executed the log from height 1, it voted
    in epoch 1 only, every certificate verifies with its epoch's members, and the old key
    opens no stream."""
    report = run_drill(
        "replace-member", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress
    )
    _assert_clean(report, drill_dir)
    for name in (
        "cluster_follows_epochs",
        "certificates_verify_by_epoch",
        "old_keys_refused",
        "new_members_vote",
        "new_sidecars_from_height_1",
    ):
        assert report.check(name).ok, f"{name}: {report.check(name).detail}"
    (fault, *_) = report.faults
    assert fault.kind == "replace-member" and fault.node == NODES - 1
    assert (_detail(fault, "epoch_before"), _detail(fault, "epoch_after")) == (0, 1)
    assert _detail(fault, "new_machine_epoch_at_start") == 0  # a non-member from genesis
    change = _detail(fault, "change_height")
    assert isinstance(change, int) and change > fault.height_at_fault
    catch_up = _detail(fault, "catch_up_s")
    assert isinstance(catch_up, float) and catch_up > 0
    first = _detail(fault, "first_vote")
    assert isinstance(first, list) and first[0] == 1, first
    assert _detail(fault, "sidecar_started_at_height") == 0
    assert _detail(fault, "old_key_stream") == "UNAUTHENTICATED"
    assert fault.pids_after["replica"] != fault.pids_before["replica"]
    assert report.details["cycles"] == len(report.faults)
    assert report.details["epochs"] == len(report.faults)
    assert "of 2 epochs" in report.check("votes_consistent").detail
    # The new machine lives in a new directory of the drill's; the old node directory
    # was never started again.
    home = drill_dir / "new-machine-0"
    assert (home / "join.json").exists() and (home / f"node-{NODES - 1}" / "replica.db").exists()


def test_replace_member_takes_another_member_each_cycle_and_keeps_f_plus_1_at_home() -> None:
    """Each cycle replaces another member than the one before, and never members 0..f,
    through whose cluster-file addresses `admin replace-member` follows the epochs."""
    assert [victim(4, 1, k) for k in range(5)] == [3, 2, 3, 2, 3]
    assert [victim(7, 2, k) for k in range(6)] == [6, 5, 4, 3, 6, 5]


def test_grow_shrink_grows_to_seven_with_new_machines_and_back_to_four(drill_dir: Path) -> None:
    """One cycle: three new machines prepared with `init --join --index 4..6` in the
    drill's directory follow epoch 0, `admin add-member` makes the cluster 7 in epoch 1,
    calls are certified there by 3 of epoch 1's seven receipt keys, and `admin
    remove-member` takes them out again in epoch 2: their replicas exit by themselves,
    their keys open no stream, and every check reads the cluster through the chain of
    epochs. (The slowest drill test: 78 s at load average 18, 129 s at 30 to 50; most of
    it starting processes and the new machines replaying the chain; `rate_per_s` is
    lowered to keep the certificate check of every call short.)"""
    report = run_drill(
        "grow-shrink", drill_dir, nodes=NODES, seconds=SHORT_S, rate_per_s=10, progress=_progress
    )
    _assert_clean(report, drill_dir)
    for name in (
        "cluster_follows_epochs",
        "certificates_verify_by_epoch",
        "certificates_of_seven_verify",
        "removed_keys_refused",
        "new_members_vote",
        "new_sidecars_from_height_1",
        "votes_consistent_with_removed",
        "removed_replicas_exited",
    ):
        assert report.check(name).ok, f"{name}: {report.check(name).detail}"
    grow, shrink = report.faults
    assert (grow.kind, shrink.kind) == ("grow", "shrink")
    assert (_detail(grow, "epoch_before"), _detail(grow, "epoch_after")) == (0, 1)
    assert (_detail(shrink, "epoch_before"), _detail(shrink, "epoch_after")) == (1, 2)
    assert _detail(grow, "members_after") == 7 and _detail(shrink, "members_after") == 4
    # Followers from genesis at their start, voting first in epoch 1.
    assert _detail(grow, "new_machines_epoch_at_start") == {"4": 0, "5": 0, "6": 0}
    first = _detail(grow, "first_votes")
    assert isinstance(first, dict) and {k: v[0] for k, v in first.items()} == {
        "4": 1,
        "5": 1,
        "6": 1,
    }
    catch_up = _detail(grow, "catch_up_s")
    assert isinstance(catch_up, dict) and all(s > 0 for s in catch_up.values())
    grown, shrunk = _detail(grow, "change_height"), _detail(shrink, "change_height")
    assert isinstance(grown, int) and isinstance(shrunk, int) and grown < shrunk
    refused = dict.fromkeys(("4", "5", "6"), "UNAUTHENTICATED")
    assert _detail(shrink, "removed_key_streams") == refused
    codes = _detail(shrink, "exit_codes")
    assert isinstance(codes, dict) and sorted(codes) == ["4", "5", "6"]
    assert all(c is not None and c != 0 for c in codes.values())
    assert report.details["cycles"] == 1 and report.details["epochs"] == 2
    certified_7 = report.details["certified_in_epochs_of_7"]
    assert isinstance(certified_7, int) and certified_7 > 0
    assert "members by epoch [4, 7, 4]" in report.check("cluster_follows_epochs").detail
    assert "{0: 4, 1: 7, 2: 4}" in report.check("certificates_verify_by_epoch").detail
    for index in (4, 5, 6):
        home = drill_dir / f"new-machine-0-{index}"
        assert (home / "join.json").exists() and (home / f"node-{index}" / "replica.db").exists()
    # A directory holding new machines is refused by both drills that bring them.
    with pytest.raises(DrillError, match="new machines"):
        run_drill("grow-shrink", drill_dir, nodes=NODES, seconds=SHORT_S)


def _seven_certificate(
    spec: ClusterSpec, keys: dict[int, SigningKey], height: int = 5, epoch: int = 1
) -> Certificate:
    pid = b"p" * 32
    leaf = ReceiptLeaf(height, 0, pid, pid, "proposal", "allow", "ok", b"", b"", 1)
    root = leaf.hash(spec.chain_id)
    receipts = [
        Receipt(leaf, (), sign_block(k, i, spec.chain_id, height, root, b"s" * 32, 1, None, epoch))
        for i, k in keys.items()
    ]
    return assemble_certificate(spec.chain_id, receipts)


def test_the_epoch_of_seven_certificate_check_counts_three_signers(tmp_path: Path) -> None:
    """A certificate of an epoch of 7 passes with 3 of its receipt keys (and is refused
    once cut to 2); with 2 signers, with a key of another epoch, or at a height outside
    its epoch it fails; certificates of an epoch of 4 are not this check's."""
    spec = dataclasses.replace(init_cluster(tmp_path / "c", 4), receipt_version=VERSION_ABSENT)
    seven = {i: SigningKey(bytes([i + 1]) * 32) for i in range(7)}
    epochs = ReceiptEpochs(
        (
            ReceiptEpoch(0, 1, 4, spec.receipt_keys),
            ReceiptEpoch(1, 5, 9, tuple(bytes(k.verify_key) for k in seven.values())),
            ReceiptEpoch(2, 10, None, spec.receipt_keys),
        )
    )
    pid = b"p" * 32
    grown = {1: 7}
    three = {i: seven[i] for i in (0, 4, 6)}
    passed = seven_certificate_problems(spec, {pid: _seven_certificate(spec, three)}, epochs, grown)
    assert passed == ([], {1: 1})
    two = {i: seven[i] for i in (0, 4)}
    problems, verified = seven_certificate_problems(
        spec, {pid: _seven_certificate(spec, two)}, epochs, grown
    )
    assert verified == {} and "refused offline" in problems[0]
    stranger = {0: seven[0], 4: seven[4], 6: SigningKey(b"x" * 32)}
    problems, _ = seven_certificate_problems(
        spec, {pid: _seven_certificate(spec, stranger)}, epochs, grown
    )
    assert "refused offline" in problems[0]
    problems, _ = seven_certificate_problems(
        spec, {pid: _seven_certificate(spec, three, height=10)}, epochs, grown
    )
    assert "refused offline" in problems[0]
    assert seven_certificate_problems(
        spec, {pid: _seven_certificate(spec, three, epoch=2)}, epochs, grown
    ) == ([], {})


def test_new_machine_vote_check_fails_on_a_vote_before_membership_or_none_after() -> None:
    """The check passes only for a table voting from its first epoch to the last."""
    h = b"\x01" * 32
    assert new_machine_vote_problems({(1, 5): h, (2, 9): h}, 1, 2) == []
    assert new_machine_vote_problems({}, 1, 2) == ["no vote recorded"]
    assert new_machine_vote_problems({(0, 3): h, (1, 5): h}, 1, 1) == [
        "a vote in epoch 0, before it was a member"
    ]
    assert new_machine_vote_problems({(1, 5): h}, 1, 2) == ["no vote in epoch 2, the last"]
    assert new_machine_vote_problems({(2, 9): h}, 1, 2) == ["no vote in epoch 1, its first"]
    # A removed member's table: its one epoch of 7, nothing after it.
    assert new_machine_vote_problems({(1, 5): h}, 1, 1) == []
    assert new_machine_vote_problems({(1, 5): h, (2, 3): h}, 1, 1) == [
        "a vote in epoch 2, after it was removed"
    ]


def test_certificate_check_by_epoch_refuses_old_members_after_a_boundary() -> None:
    """A chain of 4 blocks signed by one member set: all verify while it is epoch 0's;
    with an epoch 1 of other keys from the change block at height 2 on, the certificates
    above it (signed by the old set, not the start certificate) are refused."""
    blocks = chain_of([1, 2, 3, 4])[1:]
    genesis = ChainedEpoch(membership(), None)
    assert certificate_problems(blocks, [genesis], CHAIN) == ([], {0: 4})
    others = Membership(
        CHAIN, tuple(Member(i, SIGNERS[i + 3].public_key) for i in range(4)), epoch=1
    )
    problems, verified = certificate_problems(
        blocks, [genesis, ChainedEpoch(others, blocks[1])], CHAIN
    )
    assert verified == {0: 2}
    assert [p.split(":")[0] for p in problems] == ["height 3 (epoch 1)", "height 4 (epoch 1)"]


def test_replace_member_refuses_a_directory_drilled_before(drill_dir: Path) -> None:
    """Its chain moved members whose old node directories a new run would start."""
    init_cluster(drill_dir, NODES)
    (drill_dir / "new-machine-0").mkdir()
    with pytest.raises(DrillError, match="fresh --dir"):
        run_drill("replace-member", drill_dir, nodes=NODES, seconds=SHORT_S)
    assert not cluster_pids(drill_dir)


def test_grow_shrink_refuses_a_cluster_of_seven(drill_dir: Path) -> None:
    """Only 4 -> 7 -> 4 exists: a cluster of 7 is refused before anything starts."""
    init_cluster(drill_dir, 7)
    with pytest.raises(DrillError, match="grows a cluster of 4 to 7"):
        run_drill("grow-shrink", drill_dir, nodes=7, seconds=SHORT_S)
    assert not cluster_pids(drill_dir)


# What the honest members must have refused under each attack (docs/drills.md): the
# reasons their /metrics count, and for messages over the transport's limit, the stream
# the honest side reset.
REFUSED_UNDER = {
    "poison-sync": {"bad_sync_proof", "malformed"},
    "forged-hello": {"spoofed_sender", "bad_signature"},
    "oversized-sync": {"transport_resource_exhausted", "malformed"},
    "spoofed": {"spoofed_sender", "bad_signature", "wrong_chain", "future_view"},
}


def test_a_byzantine_member_neither_stops_nor_fools_the_honest_ones(drill_dir: Path) -> None:
    """A live 4-node cluster under load, one member restarted as the Byzantine replica of
    quorumgate.ops.byzantine with each attack in turn: the poison sync response (asked, by
    a replica catching up, and unasked), forged and spoofed hello replies while an honest
    replica restarts and fences, catch-up answers over the transport's limit, spoofed and
    forged votes. The three honest replicas stay up (same pids), refuse it all, and keep
    committing; nothing acknowledged is lost and nothing forks."""
    report = run_drill("byzantine", drill_dir, nodes=NODES, seconds=SHORT_S, progress=_progress)
    _assert_clean(report, drill_dir)
    assert report.check("byzantine_contained").ok
    names = [f.kind.removeprefix("byzantine-") for f in report.faults]
    assert names[: len(BYZANTINE_CYCLES)] == [name for name, _, _ in BYZANTINE_CYCLES]
    for fault in report.faults:
        name = fault.kind.removeprefix("byzantine-")
        refused = _detail(fault, "refused_by_honest")
        assert isinstance(refused, dict)
        assert REFUSED_UNDER[name] <= set(refused), f"{name}: honest refused only {refused}"
        assert fault.node == NODES - 1 and "replica" in fault.pids_after
    pids = [f.pids_after["replica"] for f in report.faults]
    assert len(set(pids)) == len(pids), "the Byzantine member was not restarted each cycle"


def test_a_drill_refuses_a_running_cluster_and_a_cluster_of_another_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c4"
    spec = init_cluster(directory, NODES)
    with pytest.raises(DrillError, match="4-node cluster, not 7"):
        prepare_cluster(directory, 7)
    procs = start_nodes(spec, [2])
    try:
        wait_serving(spec, [2], procs)
        with pytest.raises(DrillError, match=r"is running \(replica 2"):
            run_drill("leader-kill", directory, nodes=NODES)
        assert quorumgate(["drill", "sidecar-crash", "--dir", str(directory)]) == 2
        assert "is running" in capsys.readouterr().err
    finally:
        stop_nodes(spec)
        for proc in procs.values():
            proc.wait(timeout=10)
    with pytest.raises(DrillError, match="unknown drill"):
        run_drill("meteor-strike", directory)
    assert set(DRILLS) == set(FAULT_CYCLES_MIN)


# ---------------------------------------------------------------------------- pure checks


def test_majority_names_the_members_that_differ() -> None:
    assert majority({0: b"a", 1: b"a", 2: b"b", 3: b"a"}) == (b"a", [2])
    assert majority({0: b"a", 1: b"a", 2: b"a"}) == (b"a", [])
    assert majority({}) == (None, [])


def test_vote_splits_finds_a_view_with_votes_for_two_blocks() -> None:
    votes = {0: {5: b"x", 6: b"y"}, 1: {5: b"x", 6: b"z"}, 2: {6: b"y"}}
    assert vote_splits(votes) == {6: {b"y": [0, 2], b"z": [1]}}
    assert vote_splits({0: {5: b"x"}, 1: {5: b"x"}}) == {}


async def _created(path: Path, chain_id: str) -> None:
    store = await ReplicaStore.open(path, chain_id)  # the schema, as a replica makes it
    await store.close()


def test_the_vote_audit_reads_the_votes_of_every_epoch(tmp_path: Path) -> None:
    """Two members voted for different blocks in view 5 of epoch 1 (after a rotation
    views start again). The epoch-0 table alone (`signed_votes`) shows nothing; the
    audit the drills check names the split by epoch and view."""
    spec = prepare_cluster(tmp_path / "c4", NODES)
    same = bytes(32)
    for node, epoch_one_vote in ((0, b"\x01" * 32), (1, b"\x02" * 32)):
        path = spec.node_dir(node) / "replica.db"
        asyncio.run(_created(path, spec.chain_id))
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("INSERT INTO signed_votes (view, block_hash) VALUES (5, ?)", (same,))
            db.execute(
                "INSERT INTO epoch_votes (epoch, view, block_hash) VALUES (1, 5, ?)",
                (epoch_one_vote,),
            )
    audits = {node: asyncio.run(read_replica(spec, node)) for node in (0, 1)}
    assert vote_splits({n: a.signed_votes for n, a in audits.items()}) == {}
    assert vote_splits({n: a.votes for n, a in audits.items()}) == {
        (1, 5): {b"\x01" * 32: [0], b"\x02" * 32: [1]}
    }
    assert audits[0].votes == {(0, 5): same, (1, 5): b"\x01" * 32}


def test_rollback_conflicts_finds_a_forgotten_vote_contradicted_after_the_restore() -> None:
    stale = {1: b"a", 2: b"b"}
    forgotten = {3: b"c", 4: b"d"}
    assert rollback_conflicts(stale, forgotten, {**stale, 3: b"c", 5: b"e"}) == []
    assert rollback_conflicts(stale, forgotten, {**stale, 4: b"X"}) == [(4, b"d", b"X")]


def test_a_restore_across_epochs_is_checked_by_epoch_and_view() -> None:
    """Views start again in every epoch: the restored member's vote in view 5 of epoch 0
    says nothing about the one it forgot in view 5 of epoch 1, and a different vote there
    after the restore is a conflict (the epoch-0 table alone would not show it)."""
    fault = Fault("stale-restore-epoch", 1, 0.0)
    run = StaleRun(
        1, {}, {}, fault, stale_by_epoch={(0, 4): b"a"}, forgotten_by_epoch={(1, 5): b"d"}
    )
    kept = {(0, 4): b"a", (0, 5): b"X", (1, 5): b"d", (1, 9): b"e"}
    audit = ReplicaAudit(0, 0, 0, {4: b"a", 5: b"X"}, {}, kept)
    problems: list[str] = []
    assert epoch_rollback_conflicts(run, audit, problems) == 0 and not problems
    assert fault.details["first_vote_after_restore"] == [0, 5]
    audit = ReplicaAudit(0, 0, 0, {4: b"a"}, {}, {**kept, (1, 5): b"X"})
    assert epoch_rollback_conflicts(run, audit, problems) == 1
    assert "epoch 1 view 5" in problems[0]


def test_refusals_since_counts_a_restarted_replica_from_zero() -> None:
    from collections import Counter

    before = {
        0: (100, Counter(malformed=5, equivocating_vote=1)),
        1: (200, Counter(bad_signature=9)),
    }
    after = {
        0: (100, Counter(malformed=8, equivocating_vote=3)),  # same process: the difference
        1: (201, Counter(bad_signature=2)),  # restarted: all of it
        2: (300, Counter(wrong_chain=1)),  # not read before
    }
    assert refusals_since(before, after) == Counter(malformed=3, bad_signature=2, wrong_chain=1)
