"""A member's TLS key rotated in place on a live cluster with TLS (docs/consensus/epochs.md,
"TLS keys"; docs/operating.md, "Rotating a member's TLS key"): `quorumgate admin rotate-key
--tls 2 --prepare` makes the new key and certificate on member 2's machine, `admin
rotate-key --tls 2 --cert FILE` commits the certificate in a `replace` record that keeps
member 2's index, address and keys, and from the boundary on member 2's replica and
sidecar serve the new certificate (no restart) while every peer and every client that
follows the chain of epochs pins it and refuses the old one."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from dataclasses import replace

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.cli import main
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, TLS_KEY_FILE, ClusterSpec, read_seed
from quorumgate.runtime.channels import sync_channel
from quorumgate.runtime.links import SERVER_OPTIONS
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.client import Client
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent
from tests.support.live import WAIT_S, LiveCluster, Load, wait_until

N = 4
MEMBER = 2  # whose TLS key is rotated
PROBE_TIMEOUT_S = 3.0


def _replica_code(spec: ClusterSpec, index: int) -> grpc.StatusCode:
    """What a fresh channel pinned to `spec`'s certificate of member `index` gets from
    its replica's Status: OK, or UNAVAILABLE when the TLS handshake fails."""
    with sync_channel(spec, index) as channel:
        try:
            cpb_grpc.ReplicaStub(channel).Status(cpb.StatusRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _sidecar_code(spec: ClusterSpec, index: int) -> grpc.StatusCode:
    with sync_channel(spec, index, "sidecar") as channel:
        try:
            spb_grpc.SidecarStub(channel).Status(
                spb.SidecarStatusRequest(), timeout=PROBE_TIMEOUT_S
            )
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _status(spec: ClusterSpec, index: int) -> cpb.StatusReply:
    with sync_channel(spec, index) as channel:
        reply: cpb.StatusReply = cpb_grpc.ReplicaStub(channel).Status(
            cpb.StatusRequest(), timeout=PROBE_TIMEOUT_S
        )
    return reply


def _impostor_code(followed: ClusterSpec, old_key: bytes, old_cert: bytes) -> grpc.StatusCode:
    """A server holding member 2's old TLS key and certificate (a thief's), reached by a
    client that follows the chain (it pins the new certificate) at the thief's address."""

    async def main() -> grpc.StatusCode:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        cpb_grpc.add_ReplicaServicer_to_server(cpb_grpc.ReplicaServicer(), server)
        credentials = grpc.ssl_server_credentials([(old_key, old_cert)])
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        try:
            moved = followed.member(MEMBER)
            thief = followed.with_entries([replace(moved, host="127.0.0.1", replica_port=port)])
            return await asyncio.to_thread(_replica_code, thief, MEMBER)
        finally:
            await server.stop(None)

    return asyncio.run(main())


def test_rotating_a_members_tls_key_under_light_load(
    live_cluster: Callable[..., LiveCluster], capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a trickle of proposals, member 2's TLS key is rotated:

    - `--prepare` writes `node-2/tls-<hex>.key` (0600, never printed) and the
      certificate beside it; `--cert` commits it, and returns once a quorum is in epoch 1;
    - commits go on, and member 2 holds a stream from every peer after the boundary
      (each peer relinked to it under the new certificate);
    - a client that follows the chain reaches member 2's replica and sidecar; a channel
      pinned to the old certificate is refused by both (they serve the new one, with no
      restart), and a server presenting the old key and certificate is refused by a
      client following the chain;
    - member 2's replica restarted serves the new certificate again.
    """
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    assert not spec.insecure
    old_cert = spec.member(MEMBER).tls_cert
    old_key = (spec.node_dir(MEMBER) / TLS_KEY_FILE).read_bytes()
    owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
        new_agent(owner, ["web.get"])
    load = Load(cluster, "tls", agents=1, per_agent=400, batch=5, rate_per_s=5)
    cluster.register(load.agents)
    load.start()
    load.wait_acked(10)

    # On member 2's machine: the new key and certificate, beside the old ones.
    # (The commands run in this process: a second interpreter costs seconds.)
    capsys.readouterr()
    code = main(["admin", "rotate-key", "--tls", str(MEMBER), "--prepare", "--json",
                 "--dir", str(spec.directory)])  # fmt: skip
    prepared = capsys.readouterr()
    assert code == 0, prepared.out + prepared.err
    made = json.loads(prepared.out)
    key_file, cert_file = made["key_file"], made["certificate_file"]
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    with open(key_file) as f:
        assert f.read().strip() not in prepared.out + prepared.err
    with open(cert_file, "rb") as f:
        new_cert = f.read()
    assert new_cert != old_cert and (spec.node_dir(MEMBER) / TLS_KEY_FILE).exists()

    # Where the owner key is: the record, and the wait for the boundary.
    code = main(["admin", "rotate-key", "--tls", str(MEMBER), "--cert", cert_file, "--json",
                 "--deadline", str(WAIT_S), "--dir", str(spec.directory)])  # fmt: skip
    done = capsys.readouterr()
    assert code == 0, done.out + done.err
    doc = json.loads(done.out)
    assert doc["key"] == "tls" and doc["member"] == MEMBER and doc["epoch"] == 0, doc
    assert doc["in_effect"] and isinstance(doc["change_height"], int), doc

    async def follow() -> ClusterSpec:
        async with Client(spec, owner_key) as client:
            epochs = await client.epochs()
            assert epochs.current.epoch == 1
            answered = await client.replica_status()
            sidecars = await client.sidecar_status()
            assert MEMBER in answered and MEMBER in sidecars, (sorted(answered), sorted(sidecars))
            return epochs.cluster(spec)

    followed = asyncio.run(follow())
    cluster.spec = followed  # (the controller reaches member 2 as the chain says from here)
    cluster.forget_channel(MEMBER)
    assert followed.member(MEMBER).tls_cert == new_cert
    assert followed.member(MEMBER).public_key == spec.member(MEMBER).public_key
    wait_until(
        "every replica in epoch 1",
        lambda: all(_status(followed, i).epoch == 1 for i in range(N)),
    )
    # Served without a restart; a channel expecting the old certificate is refused.
    assert _replica_code(followed, MEMBER) == grpc.StatusCode.OK
    wait_until(
        "sidecar 2 serves the new certificate",
        lambda: _sidecar_code(followed, MEMBER) == grpc.StatusCode.OK,
    )
    assert _replica_code(spec, MEMBER) == grpc.StatusCode.UNAVAILABLE
    assert _sidecar_code(spec, MEMBER) == grpc.StatusCode.UNAVAILABLE
    # The thief's server with the old key: a client following the chain refuses it.
    assert _impostor_code(followed, old_key, old_cert) == grpc.StatusCode.UNAVAILABLE

    # Every peer linked to member 2 again under the new certificate, and commits go on.
    wait_until(
        "every peer streams to member 2",
        lambda: list(_status(followed, MEMBER).peers_connected) == [0, 1, 3],
    )
    for peer in (0, 1, 3):
        text = (spec.node_dir(peer) / "replica.log").read_text(errors="replace")
        assert "epoch=1" in text and f"relinked={MEMBER}" in text, peer
    acked = load.acked_count
    load.wait_acked(acked + 10)
    top = max(s.committed_height for s in (_status(followed, i) for i in (0, 1, 3)))
    wait_until(
        "member 2 commits what the others committed after the boundary",
        lambda: _status(followed, MEMBER).committed_height >= top,
    )

    # Restarted, member 2's replica serves the certificate of the epoch its store holds.
    cluster.kill(MEMBER)
    cluster.start([MEMBER])
    wait_until(
        "member 2's replica back with the new certificate",
        lambda: _replica_code(followed, MEMBER) == grpc.StatusCode.OK,
    )
    assert _replica_code(spec, MEMBER) == grpc.StatusCode.UNAVAILABLE

    load.stop()
    load.assert_clean()
    cluster.assert_no_equivocation_seen()
