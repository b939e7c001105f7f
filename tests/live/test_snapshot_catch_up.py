"""A sidecar whose store was deleted catches up from a snapshot its peers serve
(docs/snapshots.md), and then signs exactly what its peers sign."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.snapshots import OPTIONS_FILE, SNAPSHOT_DIR
from quorumgate.sidecar.store import SidecarStore
from tests.support.live import WAIT_S, LiveCluster, Load, wait_until

N = 4
WIPED = 3
OTHERS = [i for i in range(N) if i != WIPED]
INTERVAL_HEIGHTS = 8  # snapshots every 8 heights: several within the test's load
HEIGHTS_AFTER = 6  # heights the caught-up sidecar must execute beside its peers
CLI_TIMEOUT_S = 120.0
_SCRIPT = Path(sys.executable).parent / "quorumgate"
QUORUMGATE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "quorumgate.cli"]
SIDECAR_FILES = ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm")


def executed(spec: ClusterSpec, index: int) -> int:
    status = sidecar_status(spec, index, timeout_s=2.0)
    return 0 if status is None else int(status.executed_height)


async def _heights(spec: ClusterSpec, index: int, low: int, high: int) -> list[tuple[object, ...]]:
    """What sidecar `index` signed for each height: its receipt leaves and the signed
    (verdict root, state root, leaf count, validity), read beside the running sidecar."""
    path = spec.node_dir(index) / "sidecar.db"
    store = await SidecarStore.open(path, spec.chain_id, create=False, read_only=True)
    try:
        out: list[tuple[object, ...]] = []
        for height in range(low, high + 1):
            signed = await store.signed_block(height)
            assert signed is not None, f"sidecar {index} signed nothing for height {height}"
            assert signed.signed_by(spec.chain_id, spec.member(index).receipt_public_key)
            leaves = [r.leaf.hash(spec.chain_id) for r in await store.receipts_at(height)]
            out.append(
                (leaves, signed.verdict_root, signed.state_root, signed.leaf_count, signed.validity)
            )
        assert await store.verify_ledger() is None
        return out
    finally:
        await store.close()


def test_a_wiped_sidecar_catches_up_from_a_snapshot_and_signs_what_its_peers_sign(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    cluster = live_cluster(N, start=False)
    spec = cluster.spec
    for i in range(N):
        (spec.node_dir(i) / OPTIONS_FILE).write_text(
            json.dumps({"interval_heights": INTERVAL_HEIGHTS, "kept": 2})
        )
    cluster.start()
    load = Load(cluster, "snap", agents=3, per_agent=1000, batch=5, rate_per_s=5, targets=OTHERS)
    cluster.start_sidecars()
    cluster.register(load.agents)
    load.start()
    wait_until(
        f"every sidecar past height {3 * INTERVAL_HEIGHTS}",
        lambda: min(executed(spec, i) for i in range(N)) > 3 * INTERVAL_HEIGHTS,
    )
    snapshots = spec.node_dir(0) / SNAPSHOT_DIR
    wait_until("sidecar 0 to hold a snapshot", lambda: any(snapshots.glob("*/manifest.json")))

    assert cluster.kill(WIPED, signal.SIGTERM, kind="sidecar") == 0
    node_dir = spec.node_dir(WIPED)
    for name in SIDECAR_FILES:
        (node_dir / name).unlink(missing_ok=True)
    shutil.rmtree(node_dir / SNAPSHOT_DIR, ignore_errors=True)

    result = subprocess.run(
        [*QUORUMGATE, "replay", "--dir", str(spec.directory), "--node", str(WIPED),
         "--from-snapshot", "--json", "--quiet"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    snapshot = report["snapshot"]
    assert snapshot is not None and snapshot["height"] % INTERVAL_HEIGHTS == 0
    assert len(snapshot["attested_by"]) >= spec.f + 1 and WIPED not in snapshot["attested_by"]
    assert report["history_from"] == snapshot["height"]
    assert report["mismatches"] == []
    # only the blocks after the snapshot were replayed
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
    mine = asyncio.run(_heights(spec, WIPED, start, goal))
    for peer in OTHERS:
        theirs = asyncio.run(_heights(spec, peer, start, goal))
        for height, (a, b) in enumerate(zip(mine, theirs, strict=True), start):
            assert a == b, f"height {height}: sidecar {WIPED} and sidecar {peer} differ"
    assert sum(len(leaves) for leaves, *_ in mine) > 0, "no verdicts after the snapshot"
    status = sidecar_status(spec, WIPED, timeout_s=2.0)
    assert status is not None and not status.diverged, status
