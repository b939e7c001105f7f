"""`quorumgate replay` on a chain that ran an epoch change (docs/drills.md, "Replay across
epochs"; docs/consensus/epochs.md, "The live replica"): after a member's consensus key was
rotated, the blocks past the boundary carry certificates of the next member set, and a
replay follows the chain of epochs as the replicas do: from height 1, with the sidecar's
store in place (every height compared) and with it moved aside (every height rebuilt, and
the rebuilt store is what the sidecar had signed); interrupted past the boundary and
resumed from its checkpoint; from a snapshot past the boundary (it
starts in epoch 1, proved from genesis by the replica's stored epoch ends); and with the
replica stopped (its store read directly)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.membership import is_record
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar import replay as replay_module
from quorumgate.sidecar.snapshots import OPTIONS_FILE, SNAPSHOT_DIR
from quorumgate.sidecar.store import SidecarStore
from tests.live.test_epochs import epochs, rotate
from tests.support.cluster import new_agent
from tests.support.live import LiveCluster, Load, wait_until

N = 4
REPLAYED = 1  # whose sidecar is stopped and replayed
URL = "https://example.com/after-the-boundary"
PROPOSALS_AFTER = 3  # proposals decided after the boundary, beside the load's
CLI_TIMEOUT_S = 180.0
_SCRIPT = Path(sys.executable).parent / "quorumgate"
QUORUMGATE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "quorumgate.cli"]
SIDECAR_FILES = ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm")
INTERVAL_HEIGHTS = 4  # snapshots every 4 heights: some of them past the boundary


def snapshot_heights(spec: ClusterSpec, index: int) -> list[int]:
    manifests = (spec.node_dir(index) / SNAPSHOT_DIR).glob("*/manifest.json")
    # a snapshot being written sits in `<height>.tmp` until it is complete
    return sorted(int(p.parent.name) for p in manifests if p.parent.name.isdigit())


def executed(spec: ClusterSpec, index: int) -> int:
    status = sidecar_status(spec, index, timeout_s=2.0)
    return 0 if status is None else int(status.executed_height)


def replay(spec: ClusterSpec, *extra: str) -> dict[str, object]:
    result = subprocess.run(
        [*QUORUMGATE, "replay", "--dir", str(spec.directory), "--node", str(REPLAYED),
         "--quiet", *extra],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1) and result.stdout, result.stderr
    if "--json" not in extra:
        return {"text": result.stdout, "returncode": result.returncode}
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


async def _signed(path: Path, chain_id: str, top: int) -> list[tuple[object, ...]]:
    """What a sidecar store signed for heights 1..top: receipt leaves, the signed verdict
    and state roots, leaf count and validity."""
    store = await SidecarStore.open(path, chain_id, create=False, read_only=True)
    try:
        out: list[tuple[object, ...]] = []
        for height in range(1, top + 1):
            signed = await store.signed_block(height)
            assert signed is not None, f"{path}: nothing signed for height {height}"
            leaves = [r.leaf.hash(chain_id) for r in await store.receipts_at(height)]
            out.append(
                (leaves, signed.verdict_root, signed.state_root, signed.leaf_count, signed.validity)
            )
        assert await store.verify_ledger() is None
        return out
    finally:
        await store.close()


def test_replay_follows_a_key_rotation_across_the_epoch_boundary(
    live_cluster: Callable[..., LiveCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = live_cluster(N, start=False)
    spec = cluster.spec
    for i in range(N):
        (spec.node_dir(i) / OPTIONS_FILE).write_text(
            json.dumps({"interval_heights": INTERVAL_HEIGHTS, "kept": 2})
        )
    cluster.start()
    cluster.start_sidecars()
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
        _, agent_key = new_agent(owner, ["web.get"])
    load = Load(cluster, "replay", agents=1, per_agent=300, batch=5, rate_per_s=10)
    cluster.register(load.agents)
    load.start()
    load.wait_acked(10)
    done = rotate(cluster)
    assert done.returncode == 0, done.stderr
    wait_until("every replica in epoch 1", lambda: all(e == 1 for e in epochs(cluster).values()))
    with SyncClient(spec, agent_key) as agent:
        for run in range(PROPOSALS_AFTER):
            decision = agent.propose("web.get", URL, run_id=f"after-{run}")
            assert decision.allowed
    top = max(cluster.heights(range(N)).values())
    chain = cluster.chain(0, top)
    boundary = next(b.height for b in chain for tx in b.payload if is_record(tx))
    wait_until(
        f"every sidecar a snapshot past height {boundary}",
        lambda: all(max(snapshot_heights(spec, i), default=0) > boundary for i in range(N)),
    )
    load.stop()
    load.assert_clean()
    assert cluster.kill(REPLAYED, signal.SIGTERM, kind="sidecar") == 0

    # The store in place: every height it executed is compared, across the boundary.
    compared = replay(spec, "--json", "--no-resume")
    assert compared["mismatches"] == [], compared["mismatches"]
    assert compared["heights_compared"] > boundary + 1  # type: ignore[operator]
    crossed = compared["epochs"]
    assert isinstance(crossed, list) and len(crossed) == 1, crossed
    assert crossed[0]["epoch"] == 1 and crossed[0]["boundary_height"] == boundary, crossed
    assert crossed[0]["from_height"] == boundary + 1 and crossed[0]["rotated"] == [2], crossed

    # Moved aside: replay from height 1 rebuilds the store, which signs what it had signed.
    aside = spec.node_dir(REPLAYED) / "aside"
    aside.mkdir()
    for name in SIDECAR_FILES:
        if (spec.node_dir(REPLAYED) / name).exists():
            shutil.move(spec.node_dir(REPLAYED) / name, aside / name)
    rebuilt = replay(spec, "--json", "--no-resume")
    assert rebuilt["mismatches"] == [], rebuilt["mismatches"]
    assert rebuilt["heights_recorded"] == rebuilt["top_height"]
    assert [e["epoch"] for e in rebuilt["epochs"]] == [1]  # type: ignore[attr-defined]
    upto = int(compared["heights_compared"])  # type: ignore[call-overload]
    mine = asyncio.run(_signed(spec.node_dir(REPLAYED) / "sidecar.db", spec.chain_id, upto))
    theirs = asyncio.run(_signed(aside / "sidecar.db", spec.chain_id, upto))
    assert mine == theirs

    # The text report says where the epoch changed.
    again = replay(spec)
    assert again["returncode"] == 0, again
    text = str(again["text"])
    assert f"epoch 1 from height {boundary + 1}" in text and "no mismatches" in text, text

    # Interrupted past the boundary, a replay resumes from its checkpoint in epoch 1.
    monkeypatch.setattr(replay_module, "CHECKPOINT_HEIGHTS", 2)

    class Interrupted(Exception):
        """An operator's interrupt, three heights past the boundary."""

    def stop_past_the_boundary(height: int, top: int, seconds: float) -> None:
        if height == boundary + 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        asyncio.run(
            replay_module.replay(
                spec, REPLAYED, resume=False, progress=stop_past_the_boundary, workers=0
            )
        )
    resumed = asyncio.run(replay_module.replay(spec, REPLAYED, workers=0))
    assert resumed.ok, resumed.mismatches
    assert boundary < resumed.resumed_from <= boundary + 3 and resumed.start_epoch == 1

    # From a snapshot past the boundary: the replay starts in epoch 1.
    for name in SIDECAR_FILES:
        (spec.node_dir(REPLAYED) / name).unlink(missing_ok=True)
    shutil.rmtree(spec.node_dir(REPLAYED) / SNAPSHOT_DIR, ignore_errors=True)
    snapped = replay(spec, "--json", "--from-snapshot")
    assert snapped["mismatches"] == [], snapped["mismatches"]
    snapshot = snapped["snapshot"]
    assert isinstance(snapshot, dict) and snapshot["height"] > boundary, snapshot
    assert snapped["start_epoch"] == 1 and snapped["epochs"] == [], snapped

    # The replica stopped: its store is read directly, its epoch ends with it.
    cluster.kill(REPLAYED, signal.SIGTERM)
    offline = replay(spec, "--json", "--no-resume")
    assert offline["mismatches"] == [], offline["mismatches"]
    assert offline["start_epoch"] == 1 and offline["history_from"] == snapshot["height"]
    assert offline["heights_compared"] == snapped["top_height"] - snapshot["height"]
