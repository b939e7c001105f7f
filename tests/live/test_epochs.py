"""A member's consensus key rotated on a live cluster (docs/consensus/epochs.md, "The live
replica"; docs/operating.md, "Rotating a member's consensus key")."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import grpc
import pytest

from quorumgate.ops.live import RPC_TIMEOUT_S
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    read_seed,
    rotated_key_file,
    write_cluster_file,
)
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import is_record
from quorumgate.replica.types import Block, vote_bytes
from quorumgate.runtime.channels import Reader, peer_auth_metadata
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import cluster_text, new_agent
from tests.support.live import (
    DROPPED,
    WAIT_S,
    LiveCluster,
    Load,
    assert_each_committed_once,
    read_code,
    wait_until,
)

N = 4
MEMBER = 2  # whose key is rotated
RESTARTED = 1  # restarted after the boundary
URL = "https://example.com/after-the-boundary"
CLI_TIMEOUT_S = 120.0
LISTENER = 0  # the replica a stream is opened to as MEMBER
PAGE_BLOCKS = 8  # the far-behind test's sync page (cluster.json `sync_blocks_max`)


class HeldStream:
    """A peer stream to `LISTENER` opened as `MEMBER` with `signer`, held open from a
    thread: it first sends one message naming another sender (counted as spoofed, which
    shows the stream is open), then nothing until released."""

    def __init__(self, cluster: LiveCluster, signer: Ed25519Signer) -> None:
        self.release = threading.Event()
        self.code: grpc.StatusCode | None = None
        chain = cluster.chain_id
        auth = peer_auth_metadata(chain, MEMBER, LISTENER, int(time.time() * 1000), signer)
        before = cluster.metrics(LISTENER).by_label(DROPPED, "reason").get("spoofed_sender", 0)

        def messages() -> Iterator[pb.ConsensusMessage]:
            yield pb.ConsensusMessage(chain_id=chain, sender=MEMBER + 1)
            self.release.wait(WAIT_S * 4)

        def hold() -> None:
            try:
                cluster.peer(LISTENER).Stream(messages(), timeout=WAIT_S * 4, metadata=auth)
                self.code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                self.code = err.code()

        self.thread = threading.Thread(target=hold, daemon=True)
        self.thread.start()
        wait_until(
            "the held stream to be open",
            lambda: (
                cluster.metrics(LISTENER).by_label(DROPPED, "reason").get("spoofed_sender", 0)
                > before
            ),
        )

    def wait_ended(self) -> grpc.StatusCode | None:
        wait_until("the held stream to end", lambda: not self.thread.is_alive())
        return self.code


def stream_code(cluster: LiveCluster, signer: Ed25519Signer) -> grpc.StatusCode:
    """What `LISTENER` answers a stream opened as `MEMBER` with `signer`."""
    chain = cluster.chain_id
    auth = peer_auth_metadata(chain, MEMBER, LISTENER, int(time.time() * 1000), signer)
    try:
        cluster.peer(LISTENER).Stream(iter(()), timeout=RPC_TIMEOUT_S, metadata=auth)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def rotate(cluster: LiveCluster) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "quorumgate", "admin", "rotate-key"]
    args = ["--dir", str(cluster.spec.directory), "--member", str(MEMBER), "--json"]
    return subprocess.run(
        [*command, *args, "--deadline", str(WAIT_S)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def epochs(cluster: LiveCluster, indexes: list[int] | None = None) -> dict[int, int]:
    return {i: s.epoch for i, s in cluster.statuses(indexes or range(N)).items()}


def signed_by_new_key(chain: list[Block], boundary: int, chain_id: str, key: bytes) -> int:
    """How many certificates above the boundary carry a signature of `MEMBER` that checks
    with `key` over epoch 1's statement (and none that does not)."""
    from nacl.signing import VerifyKey

    checked = 0
    for block in chain[boundary + 2 :]:  # the first certificate of epoch 1 is in boundary+2
        qc = block.justify
        for signer, signature in qc.signatures:
            if signer == MEMBER:
                statement = vote_bytes(f"{chain_id}#epoch=1", qc.view, qc.height, qc.block_hash)
                VerifyKey(key).verify(statement, signature)
                checked += 1
    return checked


def rotate_then_bring_back(cluster: LiveCluster, late: int) -> None:
    """With `late` down: rotate a key, wait until the others are in epoch 1 and commit
    there, restart `late`, and wait until it is in epoch 1 on the others' chain."""
    others = [i for i in range(N) if i != late]
    done = rotate(cluster)
    assert done.returncode == 0, done.stderr
    wait_until(
        "the others in epoch 1", lambda: all(e == 1 for e in epochs(cluster, others).values())
    )
    cluster.wait_progress(2, others)
    cluster.restart(late)
    wait_until("the late member in epoch 1", lambda: cluster.status(late).epoch == 1)
    goal = max(cluster.heights(others).values()) + 2
    cluster.wait_height(goal, range(N))
    cluster.assert_same_chain(list(range(N)), goal)


def test_rotating_a_members_key_under_load_keeps_one_chain_and_certificates(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """Under a steady trickle of proposals, `quorumgate admin rotate-key --member 2`:

    - writes the new key beside the old one and never prints it, and returns once a
      quorum is in epoch 1; every replica then reaches epoch 1;
    - the chain goes on committing, and every replica commits the same block at every
      height, each acknowledged proposal once, the record once;
    - member 2 signs epoch 1's certificates with its new key;
    - a proposal after the boundary still gets its certificate of f+1 sidecar receipts;
    - a replica restarted after the boundary resumes in epoch 1 and catches up;
    - the new key is in no log, output or database of the cluster.
    """
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
        _, agent_key = new_agent(owner, ["web.get"])
    load = Load(cluster, "epochs", agents=2, per_agent=300, batch=5, rate_per_s=10)
    cluster.register(load.agents)
    load.start()
    load.wait_acked(20)
    # Whoever stole member 2's key (the reason for the rotation) holds a stream open as
    # member 2 across the boundary.
    old_key = Ed25519Signer(read_seed(spec.node_dir(MEMBER) / CONSENSUS_KEY_FILE))
    held = HeldStream(cluster, old_key)

    done = rotate(cluster)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    new_key = bytes.fromhex(doc["public_key"])
    assert doc["member"] == MEMBER and doc["epoch"] == 0 and doc["in_effect"]
    seed = (spec.node_dir(MEMBER) / rotated_key_file(new_key)).read_text().strip()
    assert seed not in done.stdout + done.stderr
    assert (spec.node_dir(MEMBER) / "consensus.key").exists()  # the old one stays
    wait_until("every replica in epoch 1", lambda: all(e == 1 for e in epochs(cluster).values()))
    cluster.wait_progress(3)
    # The boundary ended the stream the old key opened; the old key opens no new one,
    # and the new key does.
    assert held.wait_ended() == grpc.StatusCode.UNAUTHENTICATED
    held.release.set()
    assert stream_code(cluster, old_key) == grpc.StatusCode.UNAUTHENTICATED
    assert stream_code(cluster, Ed25519Signer(bytes.fromhex(seed))) == grpc.StatusCode.OK
    # Nor does it read what only the cluster's roles read: every argument value.
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert read_code(cluster.spec, LISTENER, "replica", Reader.of_signer(old_key)) == denied
    assert read_code(cluster.spec, LISTENER, "sidecar", Reader.of_signer(old_key)) == denied

    with SyncClient(spec, agent_key) as agent:
        decision = agent.propose("web.get", URL, run_id="after-boundary")
    assert decision.allowed and len(decision.signers) >= spec.f + 1

    others = [i for i in range(N) if i != RESTARTED]
    load.avoid([RESTARTED])
    load.drain(RESTARTED)
    cluster.kill(RESTARTED)
    cluster.wait_progress(2, others)
    cluster.restart(RESTARTED)
    assert cluster.status(RESTARTED).epoch == 1
    goal = max(cluster.heights(others).values())
    cluster.wait_height(goal, [RESTARTED])
    load.avoid([])

    load.stop()
    load.assert_clean()
    committed_at = cluster.wait_committed(load.acked, 0)
    top = cluster.wait_height(max(committed_at.values()), range(N))
    chain = cluster.assert_same_chain(list(range(N)), min(top.values()))
    assert_each_committed_once(load.acked, chain)
    records = [b.height for b in chain for tx in b.payload if is_record(tx)]
    assert len(records) == 1, records
    assert signed_by_new_key(chain, records[0], spec.chain_id, new_key) > 0
    cluster.assert_no_equivocation_seen()
    assert cluster.metrics(0).value("qg_replica_epoch") == 1
    cluster.stop_all()
    written = cluster_text(spec)  # logs, outputs, databases: everything but key files
    assert seed not in written and bytes.fromhex(seed).decode("latin-1") not in written


@pytest.mark.parametrize("late", [3, MEMBER], ids=["another-member", "the-rotated-member"])
def test_a_replica_down_across_the_boundary_catches_up_by_the_epoch_proof(
    live_cluster: Callable[..., LiveCluster], late: int
) -> None:
    """A member stopped before the rotation and started after it restarts in epoch 0,
    hears epoch 1's messages, asks a peer how epoch 0 ended, checks the proof it is
    handed with epoch 0's keys, commits through the change block and goes on in epoch 1
    with the others (docs/consensus/epochs.md, "Catching up"). The rotated member itself
    does too: its peers in epoch 1 take its streams only under its new key, which it
    signs with beside its epoch-0 key before it knows the epoch ended."""
    cluster = live_cluster(N)
    others = [i for i in range(N) if i != late]
    load = Load(cluster, "late", agents=1, per_agent=300, batch=5, rate_per_s=10).start()
    load.wait_acked(10)
    load.avoid([late])
    load.drain(late)
    cluster.kill(late)
    rotate_then_bring_back(cluster, late)
    refused = {
        i: cluster.metrics(i).by_label(DROPPED, "reason").get("unauthenticated_peer", 0)
        for i in others
    }
    assert refused == dict.fromkeys(others, 0)  # every stream the late member opened was taken
    load.stop()
    load.assert_clean()
    cluster.assert_no_equivocation_seen()


def test_a_replica_pages_behind_the_boundary_catches_up_by_itself(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """A member stopped while the others commit more than a sync page of blocks, rotate a
    key and go on in epoch 1 comes back too far behind for the epoch proof to fit in one
    answer: its peers hand it epoch 0's committed chain a page at a time, each page
    proven by epoch 0's certificates and ending below the change block, then the proof;
    it reaches epoch 1 and the others' chain by itself (docs/consensus/epochs.md,
    "Catching up"). The page is small (`sync_blocks_max` in cluster.json) so that a few
    seconds of load make it several pages."""
    late = 3
    cluster = live_cluster(N, start=False)
    cluster.spec = replace(cluster.spec, sync_blocks_max=PAGE_BLOCKS)
    write_cluster_file(cluster.spec)
    cluster.start()
    others = [i for i in range(N) if i != late]
    load = Load(cluster, "far", agents=1, per_agent=400, batch=2, rate_per_s=20).start()
    load.wait_acked(4)
    load.avoid([late])
    load.drain(late)
    cluster.kill(late)
    behind = max(cluster.heights(others).values())
    cluster.wait_height(behind + 3 * PAGE_BLOCKS, others)
    rotate_then_bring_back(cluster, late)
    load.stop()
    load.assert_clean()
    cluster.assert_no_equivocation_seen()
