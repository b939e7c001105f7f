"""A member replaced live: its host is gone for good, a new machine with new keys takes its
place (docs/consensus/epochs.md, "The live replica"; docs/operating.md, "Replacing a
member"). `quorumgate init --join` prepares the new machine's directory, `quorumgate admin
replace-member` signs the `replace` record with its entry; the new node starts from
genesis as a non-member, catches up by the epoch proof and pages, and votes as the member
from the boundary on; its sidecar executes the whole log from height 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
from nacl.signing import SigningKey, VerifyKey

from quorumgate.ops.live import RPC_TIMEOUT_S
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    OWNER_KEY_FILE,
    RECEIPT_KEY_FILE,
    ClusterSpec,
    load_cluster,
    read_seed,
    write_cluster_file,
)
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import is_record
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.types import Block, vote_bytes
from quorumgate.runtime.channels import Reader, peer_auth_metadata
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.client import Client
from quorumgate.sdk.sync import SyncClient
from tests.support.live import (
    WAIT_S,
    LiveCluster,
    Load,
    assert_each_committed_once,
    read_code,
    wait_until,
)

N = 4
GONE = 3  # the member whose host is gone
LISTENER = 0
RESTARTED = 1  # restarted after the boundary
DOWN = 2  # then stopped for a while, so that the restarted member needs the new machine
CLI_TIMEOUT_S = 120.0
PAGE_BLOCKS = 4  # cluster.json `sync_blocks_max`: its least (proto/clusterfile.py)


def quorumgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumgate", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def stream_code(cluster: LiveCluster, signer: Ed25519Signer) -> grpc.StatusCode:
    """What `LISTENER` answers a stream opened as `GONE` with `signer`."""
    chain = cluster.chain_id
    auth = peer_auth_metadata(chain, GONE, LISTENER, int(time.time() * 1000), signer)
    try:
        cluster.peer(LISTENER).Stream(iter(()), timeout=RPC_TIMEOUT_S, metadata=auth)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def owner_reaches_the_new_machine(spec: ClusterSpec) -> tuple[int | None, int | None]:
    """Member 3's epoch as the owner's client sees it before and after it checks the chain
    of epochs (`Client.epochs`, which carries the new machine's entry)."""

    async def main() -> tuple[int | None, int | None]:
        owner = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        async with Client(spec, owner) as client:
            before = (await client.replica_status()).get(GONE)
            epochs = await client.epochs()
            assert epochs.current.epoch == 1 and len(epochs.entries) == 1
            after = (await client.replica_status()).get(GONE)
        return (
            None if before is None else int(before.epoch),
            None if after is None else int(after.epoch),
        )

    return asyncio.run(main())


def owner_sees_epoch(spec: ClusterSpec) -> int:
    """The newest epoch a fresh owner's client, from cluster.json, checks."""

    async def main() -> int:
        owner = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        async with Client(spec, owner) as client:
            return (await client.epochs()).current.epoch

    return asyncio.run(main())


def stored_votes(path: Path, chain_id: str) -> dict[tuple[int, int], bytes]:
    """(epoch, view) -> block hash of every vote a stopped replica's store recorded."""

    async def main() -> dict[tuple[int, int], bytes]:
        store = await ReplicaStore.open(path, chain_id)
        try:
            return await store.votes_of_every_epoch()
        finally:
            await store.close()

    return asyncio.run(main())


def votes_of_new_key(chain: list[Block], boundary: int, chain_id: str, key: bytes) -> int:
    """Signatures of `GONE` in epoch 1's certificates above the boundary, each checked
    with `key` over epoch 1's statement (one that does not check raises)."""
    checked = 0
    for block in chain[boundary + 2 :]:
        qc = block.justify
        for signer, signature in qc.signatures:
            if signer == GONE:
                statement = vote_bytes(f"{chain_id}#epoch=1", qc.view, qc.height, qc.block_hash)
                VerifyKey(key).verify(statement, signature)
                checked += 1
    return checked


def sidecars_agree(old: ClusterSpec, new: ClusterSpec, top: int) -> None:
    """Sidecar 0 and the new member's sidecar executed `top` with the same ledger."""

    def both() -> tuple[object, object] | None:
        a, b = sidecar_status(old, LISTENER), sidecar_status(new, GONE)
        if a is None or b is None or a.executed_height != top or b.executed_height != top:
            return None
        return a, b

    a, b = wait_until(f"both sidecars to execute height {top}", both)  # type: ignore[misc]
    assert not a.diverged and not b.diverged  # type: ignore[attr-defined]
    assert a.ledger_head == b.ledger_head  # type: ignore[attr-defined]
    assert a.state_root == b.state_root  # type: ignore[attr-defined]
    assert a.ledger_entries == b.ledger_entries > 0  # type: ignore[attr-defined]


def test_a_member_whose_host_is_gone_is_replaced_by_a_new_machine(
    live_cluster: Callable[..., LiveCluster], tmp_path: Path
) -> None:
    # A small sync page, so that the new machine, from genesis, needs several pages of
    # epoch 0's chain before the epoch proof (docs/consensus/epochs.md, "Catching up").
    cluster = live_cluster(N, start=False)
    cluster.spec = replace(cluster.spec, sync_blocks_max=PAGE_BLOCKS)
    write_cluster_file(cluster.spec)
    cluster.start()
    cluster.start_sidecars()
    spec = cluster.spec
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
    # 20 proposals/s for 400 s, longer than the test on a loaded machine: the steps below
    # need commits, and an idle cluster commits nothing (docs/consensus/protocol.md). Each
    # agent stays inside the nonce window (`AGENT_PROPOSALS_MAX`).
    load = Load(cluster, "replace", agents=8, per_agent=1000, batch=5, rate_per_s=2.5)
    cluster.register(load.agents)
    load.avoid([GONE])
    load.start()
    load.wait_acked(20)
    load.drain(GONE)
    old_key = Ed25519Signer(read_seed(spec.node_dir(GONE) / CONSENSUS_KEY_FILE))
    old_receipt_key = Ed25519Signer(read_seed(spec.node_dir(GONE) / RECEIPT_KEY_FILE))
    as_old_sidecar = Reader.of_signer(old_receipt_key)  # a member's sidecar, so far
    assert read_code(cluster.spec, LISTENER, "replica", as_old_sidecar) == grpc.StatusCode.OK
    assert read_code(cluster.spec, LISTENER, "sidecar", as_old_sidecar) == grpc.StatusCode.OK
    cluster.kill(GONE, kind="sidecar")
    cluster.kill(GONE)  # its host is gone for good
    others = [i for i in range(N) if i != GONE]
    cluster.wait_height(3 * PAGE_BLOCKS, others)

    # The new machine: its directory, its keys, and the entry the owner signs.
    join_dir = tmp_path / "new-machine"
    made = quorumgate(
        "init", "--join", "--cluster", str(spec.directory / "cluster.json"),
        "--index", str(GONE), "--dir", str(join_dir),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    entry = json.loads(made.stdout)
    seed = read_seed(join_dir / f"node-{GONE}" / CONSENSUS_KEY_FILE).hex()
    assert seed not in made.stdout + made.stderr
    entry_file = tmp_path / "entry.json"
    entry_file.write_text(made.stdout)
    joined = LiveCluster(load_cluster(join_dir))  # starts and stops the new machine
    # reads the new machine as the owner (the join directory holds no owner key); starts
    # and stops nothing
    view = LiveCluster(replace(spec, joined=joined.spec.member(GONE)))
    try:
        joined.start([GONE])
        joined.start_sidecars([GONE])
        assert view.status(GONE).epoch == 0  # a non-member, from genesis

        done = quorumgate(
            "admin", "replace-member", "--dir", str(spec.directory), "--member", str(GONE),
            "--entry", str(entry_file), "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["in_effect"] and doc["epoch"] == 0 and doc["member"] == GONE
        assert len(doc["nodes_in_next_epoch"]) >= N - 1  # 2f+1, the new machine counted too
        new_key = bytes.fromhex(entry["public_key"])
        assert doc["public_key"] == entry["public_key"]

        wait_until("the new machine in epoch 1", lambda: view.status(GONE).epoch == 1)
        cluster.wait_progress(3, others)
        # The old key opens no stream as member 3 any more.
        assert stream_code(cluster, old_key) == grpc.StatusCode.UNAUTHENTICATED
        # A client reaches the new machine once it has checked the chain of epochs.
        assert owner_reaches_the_new_machine(spec) == (None, 1)
        shown = quorumgate("epochs", "--dir", str(spec.directory), "--json")
        assert shown.returncode == 0, shown.stderr
        address = f"{entry['host']}:{entry['replica_port']}"
        assert json.loads(shown.stdout)["epochs"][1]["moved"] == {str(GONE): address}
        # Nor does the old machine's sidecar key read what only members read: at a replica
        # in epoch 1, nor at a sidecar executing epoch 1 (docs/consensus/epochs.md,
        # "Receipt keys").
        code = read_code(cluster.spec, LISTENER, "replica", as_old_sidecar)
        assert code == grpc.StatusCode.PERMISSION_DENIED, code
        # (in epoch 1, the replica has committed the change block: once its sidecar has
        # executed as far, the sidecar's next block is epoch 1's)
        boundary = cluster.status(LISTENER).committed_height
        wait_until(
            "the listener's sidecar executes the change block",
            lambda: (
                (sidecar_status(spec, LISTENER) or spb.SidecarStatusReply()).executed_height
                >= boundary
            ),
        )
        code = read_code(cluster.spec, LISTENER, "sidecar", as_old_sidecar)
        assert code == grpc.StatusCode.PERMISSION_DENIED, code

        # A member restarted after the boundary links to the new machine again (it rebuilds
        # the cluster of epoch 1 from its store): with member 2 down as well, members 0
        # and 1 and the new machine still commit, which needs each pair of them linked.
        load.avoid([GONE, RESTARTED, DOWN])
        load.drain(RESTARTED)
        load.drain(DOWN)
        cluster.kill(RESTARTED)
        cluster.restart(RESTARTED)
        wait_until(
            "the restarted member's stream to the new machine",
            lambda: RESTARTED in view.status(GONE).peers_connected,
        )
        cluster.kill(DOWN)
        live = [LISTENER, RESTARTED]  # with the new machine, the cluster from here on
        goal = max(cluster.heights(live).values()) + 3
        cluster.wait_height(goal, live)
        view.wait_height(goal, [GONE])
        load.avoid([GONE, DOWN])

        load.stop()
        load.assert_clean()
        committed_at = cluster.wait_committed(load.acked, LISTENER)
        top = cluster.wait_height(max(committed_at.values()) + 2, live)
        height = min(top.values())
        view.wait_height(height, [GONE])
        chain = cluster.assert_same_chain(live, height)
        assert [b.hash for b in view.chain(GONE, height)] == [b.hash for b in chain]
        assert_each_committed_once(load.acked, chain)
        records = [b.height for b in chain for tx in b.payload if is_record(tx)]
        assert len(records) == 1, records
        # From genesis the epoch proof (a page's reach) could not carry the new machine to
        # the change block: it came by pages first.
        assert records[0] > 2 * PAGE_BLOCKS
        # Member 3 votes in epoch 1 with the new machine's key.
        assert votes_of_new_key(chain, records[0], spec.chain_id, new_key) > 0
        settled = max(cluster.heights(live).values())
        sidecars_agree(spec, joined.spec, settled)
        cluster.assert_no_equivocation_seen(live)
        # With member 1 down too, only member 0 answers where cluster.json says the members
        # are: fewer than f+1. A client from cluster.json follows member 0's checked chain
        # to the new machine and asks f+1 again there (`Client.epochs`); before, it gave
        # up (replicas_unreachable), and so did `admin replace-member` for the next member.
        cluster.kill(RESTARTED)
        assert owner_sees_epoch(spec) == 1
        # The new machine's own audit table: the votes it signed are all of epoch 1, for
        # blocks of the common chain above the change block, and none of epoch 0.
        joined.stop_all()
        votes = stored_votes(joined.spec.node_dir(GONE) / "replica.db", spec.chain_id)
        assert votes and {epoch for epoch, _ in votes} == {1}, sorted(votes)
        hashes = {b.hash: b.height for b in chain}
        voted = [hashes[h] for h in votes.values() if h in hashes]
        assert voted and min(voted) > records[0]
    finally:
        view.forget_channel(GONE)
        joined.close()
