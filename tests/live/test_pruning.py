"""A cluster with retention on prunes its history below a snapshot (docs/pruning.md):
`ledger verify` still passes and says where history starts, a replay from height 1 is
told the heights are pruned (and where to go instead), and a sidecar whose store was
deleted catches up from a snapshot and signs what its peers sign."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
from collections.abc import Callable

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import RECEIPT_KEY_FILE, ClusterSpec, read_seed
from quorumgate.replica.pruning import PruneFloor
from quorumgate.runtime.channels import Reader, aio_channel
from quorumgate.sidecar.snapshots import OPTIONS_FILE, SNAPSHOT_DIR
from tests.live.test_snapshot_catch_up import (
    CLI_TIMEOUT_S,
    HEIGHTS_AFTER,
    QUORUMGATE,
    SIDECAR_FILES,
    _heights,
    executed,
)
from tests.support.live import WAIT_S, LiveCluster, Load, wait_until

N = 4
WIPED = 3
OTHERS = [i for i in range(N) if i != WIPED]
INTERVAL_HEIGHTS = 8  # a snapshot every 8 heights
RETAIN_HEIGHTS = 8  # keep 8 heights below the executed one: prune at the snapshot below


def start_pruning(live_cluster: Callable[..., LiveCluster], name: str) -> tuple[LiveCluster, Load]:
    """A cluster whose sidecars snapshot every `INTERVAL_HEIGHTS` and keep
    `RETAIN_HEIGHTS`, its replicas and sidecars started, a trickle of proposals flowing to
    every member but `WIPED`."""
    cluster = live_cluster(N, start=False)
    spec = cluster.spec
    options = {"interval_heights": INTERVAL_HEIGHTS, "kept": 2, "retain_heights": RETAIN_HEIGHTS}
    for i in range(N):
        (spec.node_dir(i) / OPTIONS_FILE).write_text(json.dumps(options))
    cluster.start()
    load = Load(cluster, name, agents=3, per_agent=1000, batch=5, rate_per_s=5, targets=OTHERS)
    cluster.start_sidecars()
    cluster.register(load.agents)
    load.start()
    return cluster, load


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QUORUMGATE, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def ledger_verify(spec: ClusterSpec, index: int) -> subprocess.CompletedProcess[str]:
    return cli("ledger", "verify", "--dir", str(spec.directory), "--node", str(index))


def test_a_pruned_cluster_verifies_and_a_wiped_sidecar_catches_up_from_a_snapshot(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    cluster, load = start_pruning(live_cluster, "prune")
    spec = cluster.spec
    floor = 3 * INTERVAL_HEIGHTS
    wait_until(
        f"every replica told to keep from height {floor} or above",
        lambda: all(
            (f := PruneFloor.read(spec.node_dir(i))) is not None and f.keep_from_height >= floor
            for i in range(N)
        ),
        timeout_s=WAIT_S * 2,
        describe=lambda: f"executed {[executed(spec, i) for i in range(N)]}",
    )
    # Every sidecar's ledger verifies from its signed checkpoint, and says where it starts.
    for i in range(N):
        verified = ledger_verify(spec, i)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "(pruned below, checkpoint at height" in verified.stdout, verified.stdout
        assert f"signed by member {i}: signature good" in verified.stdout, verified.stdout

    # A replay of a pruned store starts at its checkpoint, from the snapshot it pinned.
    replayed = 1
    assert cluster.kill(replayed, signal.SIGTERM, kind="sidecar") == 0
    again = cli("replay", "--dir", str(spec.directory), "--node", str(replayed), "--no-resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "(pruned below, checkpoint at height" in again.stdout, again.stdout
    assert "no mismatches" in again.stdout, again.stdout
    cluster.start_sidecars([replayed])

    # The wiped sidecar: its store and snapshots gone.
    assert cluster.kill(WIPED, signal.SIGTERM, kind="sidecar") == 0
    node_dir = spec.node_dir(WIPED)
    for name in SIDECAR_FILES:
        (node_dir / name).unlink(missing_ok=True)
    shutil.rmtree(node_dir / SNAPSHOT_DIR, ignore_errors=True)

    # A reader asking the pruned replica for height 1 is told so, by name.
    wait_until(
        "the wiped member's replica to have pruned its log",
        lambda: asyncio.run(ask_height_one(spec, WIPED)) is not None,
    )
    refused = asyncio.run(ask_height_one(spec, WIPED))
    assert refused is not None and "is pruned on this replica" in refused, refused
    # A replay from height 1 stops there with the same words, and names the way out.
    from_one = cli_replay(spec)
    assert from_one.returncode != 0
    said = from_one.stdout + from_one.stderr
    assert "is pruned on this replica" in said and "--from-snapshot" in said, said
    for name in SIDECAR_FILES:  # what that attempt opened: the snapshot goes in an empty store
        (node_dir / name).unlink(missing_ok=True)

    # From the newest snapshot its peers attest, then only the blocks after it.
    result = cli_replay(spec, "--from-snapshot", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    snapshot = report["snapshot"]
    assert snapshot is not None and snapshot["height"] >= floor
    assert len(snapshot["attested_by"]) >= spec.f + 1 and WIPED not in snapshot["attested_by"]
    assert report["mismatches"] == []
    assert report["heights_replayed"] == report["top_height"] - snapshot["height"]

    cluster.start_sidecars([WIPED])
    start = snapshot["height"] + 1
    goal = max(executed(spec, i) for i in OTHERS) + HEIGHTS_AFTER
    wait_until(
        f"every sidecar past height {goal}",
        lambda: min(executed(spec, i) for i in range(N)) >= goal,
        timeout_s=WAIT_S * 2,
        describe=lambda: f"executed {[executed(spec, i) for i in range(N)]}",
    )
    load.stop()
    # Compare heights every sidecar still holds (the peers go on pruning meanwhile).
    low = max(start, goal - 2)
    mine = asyncio.run(_heights(spec, WIPED, low, goal))
    for peer in OTHERS:
        theirs = asyncio.run(_heights(spec, peer, low, goal))
        for height, (a, b) in enumerate(zip(mine, theirs, strict=True), low):
            assert a == b, f"height {height}: sidecar {WIPED} and sidecar {peer} differ"
    verified = ledger_verify(spec, WIPED)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def ask_height_one(spec: ClusterSpec, index: int) -> str | None:
    """What replica `index` answers a member reading from height 1: None while it still
    serves that height, else its OUT_OF_RANGE message."""
    key = SigningKey(read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE))
    async with aio_channel(spec, index, reader=Reader.of(key)) as channel:
        stream = cpb_grpc.ReplicaStub(channel).CommittedBlocks(cpb.BlocksRequest(from_height=1))
        try:
            async for _ in stream:
                stream.cancel()
                return None
        except grpc.aio.AioRpcError as err:
            assert err.code() is grpc.StatusCode.OUT_OF_RANGE, err
            return str(err.details())
    return None


def cli_replay(spec: ClusterSpec, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("replay", "--dir", str(spec.directory), "--node", str(WIPED), *extra)
