"""The auditors' copy tells pruning what it acknowledged (docs/pruning.md, "Where a node
prunes"; docs/audit.md, "The acknowledged height"), against a live 4-node cluster whose
sidecars prune with `audit_copy` and a real PostgreSQL server.

Attacked first: a shipper that copies the ledger but leaves `audit-acked.json` unwritten
leaves every sidecar with `audit_copy` unable to prune, for ever. Then the bound: a
sidecar prunes up to the height the shipper wrote and not beyond while more heights go
by, and further once the copy moves; a batch that ends inside a height acknowledges only
the heights below it.

The tests run in file order on one cluster: the mid-height test ships into a copy of its
own from height 1, so it comes before anything is pruned; the others share one copy
(`copy_dsn`), shipped before the first pruning as docs/pruning.md asks.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nacl.signing import SigningKey

from quorumgate.audit.acked import AckedFiles
from quorumgate.audit.follow import Round
from quorumgate.audit.shipper import ACKED_COPY, ShipOptions, Shipper
from quorumgate.audit.store import read_cursor
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, init_cluster, read_seed
from quorumgate.proto.model import Proposal
from quorumgate.replica.pruning import PruneFloor
from quorumgate.sdk.delivery import Channels
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.values import Submitted
from quorumgate.sidecar.pruning import ACKED_FILE, read_acked
from quorumgate.sidecar.snapshots import OPTIONS_FILE, SNAPSHOT_DIR
from quorumgate.sidecar.store import SidecarStore
from tests.audit.test_ship_live import fresh_db
from tests.support.cluster import LiveCluster, new_agent
from tests.support.live import wait_until

INTERVAL_HEIGHTS = 4  # a snapshot every 4 heights
RETAIN_HEIGHTS = 2
OPTIONS = {
    "interval_heights": INTERVAL_HEIGHTS,
    "kept": 64,  # every snapshot of the test stays: the point is chosen among them
    "retain_heights": RETAIN_HEIGHTS,
    "audit_copy": True,
}
URL = "https://example.com/a"
RUN = "acked-run"
PRUNE_WAIT_S = 90.0
CLI_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCluster]:
    """The audit tests' cluster (tests.support.cluster), its sidecars pruning with an
    auditors' copy configured."""
    spec = init_cluster(tmp_path_factory.mktemp("qg-acked"), 4)
    for i in range(spec.n):
        (spec.node_dir(i) / OPTIONS_FILE).write_text(json.dumps(OPTIONS))
    cluster = LiveCluster(spec)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def copy_dsn(postgres_dsn: str) -> str:
    """The copy the pruning tests ship into, one for the module: once the sidecars pruned,
    a copy started afresh could not be shipped from height 1 any more."""
    return fresh_db(postgres_dsn, "acked")


@pytest.fixture(scope="module")
def agent(cluster: ClusterSpec, owner: SyncClient) -> Iterator[SyncClient]:
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as client:
        yield client


def executed(spec: ClusterSpec) -> int:
    """The lowest executed height among the sidecars (0 for one that does not answer)."""
    heights = []
    for i in range(spec.n):
        status = sidecar_status(spec, i, timeout_s=2.0)
        heights.append(0 if status is None else int(status.executed_height))
    return min(heights)


def drive_to(spec: ClusterSpec, agent: SyncClient, height: int) -> int:
    """Allowed proposals until every sidecar executed `height`; the height reached."""

    def reached() -> int | None:
        now = executed(spec)
        if now >= height:
            return now
        assert agent.propose("web.get", URL, {"q": str(now)}, run_id=RUN).allowed
        return None

    return wait_until(f"every sidecar at height {height}", reached, timeout_s=PRUNE_WAIT_S)


def ship_once(spec: ClusterSpec, dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    shipped = subprocess.run(
        [sys.executable, "-m", "quorumgate.cli", "ship", "--dir", str(spec.directory),
         "--dsn", dsn, "--once", *extra],
        check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert shipped.returncode == 0, shipped.stderr
    return shipped


def whole_through(spec: ClusterSpec, dsn: str) -> int:
    """The height through which every verdict is in the copy, counted independently of
    the shipper: the copy's last entry's height when sidecar 0's ledger has no entry after
    it at that height, else the height below."""
    with psycopg.connect(dsn) as conn:
        cursor = read_cursor(conn, spec.chain_id)

    async def entries_at(height: int) -> int:
        path = spec.node_dir(0) / "sidecar.db"
        store = await SidecarStore.open(path, spec.chain_id, create=False, read_only=True)
        try:
            return len(await store.ledger_at(height))
        finally:
            await store.close()

    if not cursor.started:
        return 0
    # The copy may hold a height sidecar 0 has not executed yet (the shipper reads f+1
    # sidecars, the fastest ones): count that height's entries once it has.
    wait_until(
        f"sidecar 0 to execute height {cursor.height}",
        lambda: (
            (status := sidecar_status(spec, 0, timeout_s=2.0)) is not None
            and int(status.executed_height) >= cursor.height
        ),
        timeout_s=PRUNE_WAIT_S,
    )
    whole = asyncio.run(entries_at(cursor.height)) == cursor.index + 1
    return cursor.height if whole else cursor.height - 1


def floors(spec: ClusterSpec) -> list[int]:
    return [
        0 if (f := PruneFloor.read(spec.node_dir(i))) is None else f.keep_from_height
        for i in range(spec.n)
    ]


def seen(spec: ClusterSpec) -> str:
    """What a wait on pruning saw: each node's floor, acknowledged height and last
    pruning lines."""
    out = [f"floors {floors(spec)}"]
    for i in range(spec.n):
        lines = (spec.node_dir(i) / "sidecar.log").read_text().splitlines()
        pruning = [line for line in lines if "prune" in line or "snapshot" in line][-4:]
        out.append(f"node {i}: acked {read_acked(spec.node_dir(i))}, {pruning}")
    return "; ".join(out)


def newest_snapshots(spec: ClusterSpec, at_most: int) -> list[int]:
    """Each node's newest snapshot height at or below `at_most` (0: none): where it prunes
    when that bounds it. A snapshot is written every INTERVAL_HEIGHTS heights unless the
    one before is still being written, so the heights are read, not assumed."""
    found = []
    for i in range(spec.n):
        root = spec.node_dir(i) / SNAPSHOT_DIR
        names = [e.name for e in root.iterdir()] if root.is_dir() else []
        found.append(max((int(n) for n in names if n.isdigit() and int(n) <= at_most), default=0))
    return found


# ---------------------------------------------------------------------------- mid-height


class EndsInsideAHeight:
    """The shipper's reads, its round cut so that the batch ends on the first entry of a
    height with two or more: a batch SHIP_BATCH_VERDICTS_MAX ends where it fills."""

    def __init__(self, shipper: Shipper) -> None:
        self.read = shipper.next_round
        self.cut_at: tuple[int, int] | None = None

    async def __call__(self, cursor: Any) -> Round:
        found = await self.read(cursor)
        for k, verdict in enumerate(found.verdicts[:-1]):
            after = found.verdicts[k + 1].entry
            if verdict.entry.index == 0 and after.height == verdict.entry.height:
                self.cut_at = (verdict.entry.height, verdict.entry.index)
                return replace(found, verdicts=found.verdicts[: k + 1], caught_up=False)
        return found


def several_in_one_height(agent: SyncClient) -> None:
    """Proposals sent together, so that a height holds more than one verdict; back once
    each is certified."""
    payloads = [Proposal(run_id=RUN, tool="web.get", target=f"{URL}/{k}") for k in range(8)]
    submitted = agent.submit_many(payloads)
    for one in submitted:
        assert isinstance(one, Submitted), one
        assert agent.await_certificate(one.proposal_id).allowed


async def nothing_new(cursor: Any) -> Round:
    return Round(caught_up=True)


async def test_a_batch_that_ends_inside_a_height_acknowledges_the_heights_below(
    cluster: ClusterSpec, agent: SyncClient, postgres_dsn: str, tmp_path: Path
) -> None:
    dsn = fresh_db(postgres_dsn, "acked_mid")
    await asyncio.to_thread(several_in_one_height, agent)
    node = tmp_path / "node-0"
    node.mkdir()
    channels = Channels(cluster)
    key = SigningKey(read_seed(cluster.directory / OWNER_KEY_FILE))
    shipper = Shipper(
        cluster, key, channels.sidecars, ShipOptions(dsn), AckedFiles([node], [ACKED_COPY])
    )
    cut = EndsInsideAHeight(shipper)
    shipper.next_round = cut  # type: ignore[method-assign]
    # A shipper started afresh that finds nothing new reads its cursor from the copy.
    again = Shipper(
        cluster, key, channels.sidecars, ShipOptions(dsn), AckedFiles([node], [ACKED_COPY])
    )
    again.next_round = nothing_new  # type: ignore[method-assign]
    try:
        while cut.cut_at is None:
            assert await shipper.ship_once(), "no height with two verdicts was shipped"
        height, _ = cut.cut_at
        with psycopg.connect(dsn) as conn:
            cursor = read_cursor(conn, cluster.chain_id)
        assert (cursor.height, cursor.index) == cut.cut_at  # the copy ends inside it
        assert read_acked(node) == height - 1
        (node / ACKED_FILE).unlink()
        assert await again.ship_once() == 0
        assert read_acked(node) == height - 1
        # The rest of the height shipped: that height is whole.
        shipper.next_round = cut.read  # type: ignore[method-assign]
        while await shipper.ship_once():
            pass
        assert read_acked(node) >= height
    finally:
        shipper.close()
        again.close()
        await channels.close()


# ---------------------------------------------------------------------------- the attack


def test_the_shipper_tells_every_node_what_the_copy_holds_and_pruning_follows(
    cluster: ClusterSpec, agent: SyncClient, copy_dsn: str
) -> None:
    """Without the file a sidecar with `audit_copy` prunes nothing however long it runs:
    `ship` must write it, into every member's directory, with the copy's whole height."""
    drive_to(cluster, agent, 3 * INTERVAL_HEIGHTS)
    ship_once(cluster, copy_dsn)
    acked = whole_through(cluster, copy_dsn)
    assert acked >= 2 * INTERVAL_HEIGHTS
    for i in range(cluster.n):
        path = cluster.node_dir(i) / ACKED_FILE
        assert path.exists(), f"the shipper left {path} unwritten: node {i} never prunes"
        assert json.loads(path.read_text()) == {"height": acked}
        assert path.stat().st_mode & 0o777 == 0o644
    # Snapshots written from now on prune, at most to what the copy holds.
    drive_to(cluster, agent, acked + 2 * INTERVAL_HEIGHTS + RETAIN_HEIGHTS)
    pruned = wait_until(
        "every sidecar to prune",
        lambda: f if min(f := floors(cluster)) > 0 else None,
        timeout_s=PRUNE_WAIT_S,
        describe=lambda: seen(cluster),
    )
    assert max(pruned) <= acked, (pruned, acked)


# ---------------------------------------------------------------------------- the bound


def test_a_sidecar_prunes_up_to_the_acknowledged_height_and_not_beyond(
    cluster: ClusterSpec, agent: SyncClient, copy_dsn: str
) -> None:
    before = read_acked(cluster.node_dir(0))
    drive_to(cluster, agent, executed(cluster) + INTERVAL_HEIGHTS)
    ship_once(cluster, copy_dsn)
    acked = read_acked(cluster.node_dir(0))
    assert acked == whole_through(cluster, copy_dsn) > before
    # Many snapshots past the acknowledged height: the point stops at the one below it.
    drive_to(cluster, agent, acked + 4 * INTERVAL_HEIGHTS)
    wait_until(
        f"every sidecar pruned at its newest snapshot at or below {acked}",
        lambda: floors(cluster) == newest_snapshots(cluster, acked),
        timeout_s=PRUNE_WAIT_S,
        describe=lambda: seen(cluster),
    )
    held = newest_snapshots(cluster, acked)
    top = drive_to(cluster, agent, executed(cluster) + 2 * INTERVAL_HEIGHTS)
    assert floors(cluster) == held, (floors(cluster), acked, top)
    newer = newest_snapshots(cluster, top)
    assert all(n > h for n, h in zip(newer, held, strict=True)), (newer, held)  # not taken
    # The copy moves on: so does the point, and only as far.
    ship_once(cluster, copy_dsn)
    later = read_acked(cluster.node_dir(0))
    assert later > acked
    drive_to(cluster, agent, later + 3 * INTERVAL_HEIGHTS)
    wait_until(
        f"every sidecar pruned at its newest snapshot at or below {later}",
        lambda: floors(cluster) == newest_snapshots(cluster, later),
        timeout_s=PRUNE_WAIT_S,
        describe=lambda: seen(cluster),
    )


def test_the_running_shipper_writes_each_new_height_once_and_pruning_follows(
    cluster: ClusterSpec, agent: SyncClient, copy_dsn: str, tmp_path: Path
) -> None:
    """`ship` as a service runs (pipelined rounds, docs/audit.md): the file follows the
    copy, each new height is logged once, and the sidecars prune behind it."""
    before = read_acked(cluster.node_dir(0))
    log_path = tmp_path / "ship.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quorumgate.cli", "ship", "--dir", str(cluster.directory),
             "--dsn", copy_dsn],
            stdout=log_file, stderr=log_file,
        )  # fmt: skip
    try:
        drive_to(cluster, agent, executed(cluster) + 2 * INTERVAL_HEIGHTS)

        def caught_up() -> int | None:
            acked = read_acked(cluster.node_dir(0))
            return acked if acked > before and acked == whole_through(cluster, copy_dsn) else None

        acked = wait_until("the file to follow the copy", caught_up, timeout_s=PRUNE_WAIT_S)
        drive_to(cluster, agent, acked + 3 * INTERVAL_HEIGHTS)
        wait_until(
            f"every sidecar pruned at its newest snapshot at or below {acked}, or above",
            lambda: all(
                f >= h > 0
                for f, h in zip(floors(cluster), newest_snapshots(cluster, acked), strict=True)
            ),
            timeout_s=PRUNE_WAIT_S,
            describe=lambda: seen(cluster),
        )
        assert max(floors(cluster)) <= read_acked(cluster.node_dir(0))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, log_path.read_text()
    heights = [
        int(line.split("event=acked_written height=")[1].split()[0])
        for line in log_path.read_text().splitlines()
        if "event=acked_written" in line
    ]
    assert heights and heights == sorted(set(heights)), heights  # once per new height
    assert heights[0] > before and heights[-1] >= acked


def test_with_the_option_off_nothing_is_written(
    cluster: ClusterSpec, agent: SyncClient, copy_dsn: str
) -> None:
    written = read_acked(cluster.node_dir(0))
    drive_to(cluster, agent, executed(cluster) + INTERVAL_HEIGHTS)
    ship_once(cluster, copy_dsn, "--no-acked-file")
    assert whole_through(cluster, copy_dsn) > written
    assert read_acked(cluster.node_dir(0)) == written
