"""A sidecar's receipt key rotated on a live cluster (docs/consensus/epochs.md, "Receipt
keys"; docs/operating.md, "Rotating a sidecar's receipt key"): `quorumgate admin
rotate-key --receipt 1` ends the epoch with a `receipt` record; sidecar 1 signs the blocks
after the change block with its new key, and a verifier that follows the chain of epochs
refuses a statement its old key signs for a height past the boundary."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable

import grpc
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.ops.live import RPC_TIMEOUT_S
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    RECEIPT_KEY_FILE,
    ClusterSpec,
    read_seed,
    rotated_receipt_key_file,
)
from quorumgate.proto.reports import root_report_statement
from quorumgate.runtime.channels import Reader, sync_channel
from quorumgate.runtime.readauth import METHOD_GET_RECEIPT
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.certificates import receipt_signature_ok, verify
from quorumgate.sdk.client import Client
from quorumgate.sdk.epochs import load_receipt_epochs
from quorumgate.sdk.errors import InvalidCertificate
from quorumgate.sdk.executor import CertificateRejected, Executor, MemoryUsedProposals
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.receipts import Certificate, Receipt, ReceiptEpochs, sign_block
from quorumgate.sidecar.wire import receipt_from_pb
from tests.support.cluster import new_agent
from tests.support.live import WAIT_S, LiveCluster, Load, read_code, wait_until

N = 4
SIDECAR = 1  # whose receipt key is rotated
URL = "https://example.com/after-the-receipt-boundary"
CLI_TIMEOUT_S = 120.0


def _cli(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumgate", *args, "--dir", str(cluster.spec.directory)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip


def _epochs(cluster: LiveCluster) -> dict[int, int]:
    return {i: s.epoch for i, s in cluster.statuses(range(N)).items()}


def _forged(cluster: LiveCluster, genuine: Certificate) -> Certificate:
    """The genuine certificate's leaf and roots, signed for epoch 0 by sidecar 1's old key
    (the one the rotation retired, perhaps leaked) and sidecar 0's key (a faulty member
    joining in): f+1 signatures by keys of the cluster file."""
    signatures = []
    for signer in (0, SIDECAR):
        key = SigningKey(read_seed(cluster.spec.node_dir(signer) / RECEIPT_KEY_FILE))
        signed = sign_block(
            key, signer, genuine.chain_id, genuine.leaf.height, genuine.verdict_root,
            genuine.state_root, genuine.leaf_count, genuine.validity, 0,
        )  # fmt: skip
        signatures.append((signer, signed.signature))
    return Certificate(
        genuine.chain_id, genuine.leaf, genuine.path, genuine.leaf_count, genuine.verdict_root,
        genuine.state_root, tuple(signatures), genuine.validity, 0,
    )  # fmt: skip


def _report_code(cluster: LiveCluster, height: int, key: SigningKey) -> grpc.StatusCode:
    """What replica 1 answers a state-root report for `height` signed with `key` (a root
    nobody executed: the height was reported before, so the replica keeps its first)."""
    root = b"\x5a" * 32
    signature = key.sign(root_report_statement(cluster.chain_id, height, root)).signature
    report = spb.StateRootReport(height=height, state_root=root, signature=signature)
    try:
        cluster.replica(SIDECAR).ReportStateRoots(iter([report]), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


async def _sidecar_statuses(
    spec: ClusterSpec, owner_key: SigningKey
) -> list[spb.SidecarStatusReply]:
    async with Client(spec, owner_key) as client:
        return list((await client.sidecar_status()).values())


def _checked(executor: Executor, certificate: Certificate) -> None:
    executor._leaf(certificate, certificate.leaf.proposal_id)  # the executor's own check


def test_rotating_a_receipt_key_under_light_load(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """Under a trickle of proposals, `admin rotate-key --receipt 1`:

    - writes `node-1/receipt-<hex>.key` (0600) beside `receipt.key`, never printing it,
      and returns once a quorum is in epoch 1, naming the change block's height;
    - a tool call certified after it names epoch 1 and verifies, through the SDK and the
      executor, with epoch 1's keys from the chain of epochs: sidecar 1's new key;
    - sidecar 1, restarted, starts in epoch 1 from its replica's stored epoch ends and
      signs with the new key;
    - a certificate for the same later height signed with sidecar 1's old key (and
      sidecar 0's) claiming epoch 0 is refused by the SDK and the executor given the
      chain, and by the executor given `quorumgate epochs --json`'s file;
    - the old key loses its other powers from the boundary on: replica 1 refuses its
      state-root report for a height past the boundary (taking it for a height before),
      the replicas and sidecars refuse its reads, and a `CommittedBlocks` or `Receipts`
      stream it opened before the boundary is ended there; the new key has them.
    """
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
        _, agent_key = new_agent(owner, ["web.get"])
    load = Load(cluster, "receipt", agents=1, per_agent=200, batch=5, rate_per_s=5)
    cluster.register(load.agents)
    load.start()
    load.wait_acked(10)
    old_key = SigningKey(read_seed(spec.node_dir(SIDECAR) / RECEIPT_KEY_FILE))
    opened = sync_channel(spec, 0, reader=Reader.of(old_key))
    before_boundary = cpb_grpc.ReplicaStub(opened).CommittedBlocks(
        cpb.BlocksRequest(from_height=1), timeout=WAIT_S
    )
    next(iter(before_boundary))  # served: the old key reads as a member in epoch 0
    opened_sidecar = sync_channel(spec, 0, "sidecar", reader=Reader.of(old_key))
    verdicts_before = spb_grpc.SidecarStub(opened_sidecar).Receipts(
        spb.ReceiptsRequest(from_height=1), timeout=WAIT_S
    )
    next(iter(verdicts_before))

    done = _cli(cluster, "admin", "rotate-key", "--receipt", str(SIDECAR), "--json",
                "--deadline", str(WAIT_S))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["key"] == "receipt" and doc["member"] == SIDECAR, doc
    assert doc["epoch"] == 0 and doc["in_effect"] and isinstance(doc["change_height"], int)
    new_key = bytes.fromhex(doc["public_key"])
    path = spec.node_dir(SIDECAR) / rotated_receipt_key_file(new_key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().strip() not in done.stdout + done.stderr
    assert (spec.node_dir(SIDECAR) / RECEIPT_KEY_FILE).exists()  # the old one stays
    wait_until("every replica in epoch 1", lambda: all(e == 1 for e in _epochs(cluster).values()))

    async def chain() -> ReceiptEpochs:
        async with Client(spec, owner_key) as client:
            return (await client.epochs()).receipt_epochs

    epochs = asyncio.run(chain())
    assert [e.epoch for e in epochs.epochs] == [0, 1]
    assert epochs.epochs[0].last_height == doc["change_height"]
    assert epochs.epochs[1].keys[SIDECAR] == new_key
    assert epochs.epochs[0].keys == spec.receipt_keys

    # Sidecar 1 restarted once it has signed heights of epoch 1: it starts in epoch 1 from
    # its replica's stored epoch ends, and its self-audit checks each stored statement
    # with the key of its epoch (the new key above the change block).
    def sidecar_status() -> spb.SidecarStatusReply:
        async def ask() -> spb.SidecarStatusReply:
            async with Client(spec, owner_key) as client:
                return (await client.sidecar_status())[SIDECAR]

        return asyncio.run(ask())

    wait_until(
        "sidecar 1 executes heights of epoch 1",
        lambda: sidecar_status().executed_height > doc["change_height"] + 2,
    )
    # The old key's other powers end at the boundary; the new key has them.
    rotated = SigningKey(read_seed(path))
    boundary = doc["change_height"]
    assert _report_code(cluster, boundary + 1, old_key) == grpc.StatusCode.PERMISSION_DENIED
    assert _report_code(cluster, boundary + 1, rotated) == grpc.StatusCode.OK
    assert _report_code(cluster, boundary, old_key) == grpc.StatusCode.OK  # epoch 0's
    assert _report_code(cluster, boundary, rotated) == grpc.StatusCode.PERMISSION_DENIED
    wait_until(
        "every sidecar executes heights of epoch 1",
        lambda: all(
            s.executed_height > boundary for s in asyncio.run(_sidecar_statuses(spec, owner_key))
        ),
    )
    for index in (0, SIDECAR):
        for kind in ("replica", "sidecar"):
            code = read_code(cluster.spec, index, kind, Reader.of(old_key))
            assert code == grpc.StatusCode.PERMISSION_DENIED, (index, kind, code)
            code = read_code(cluster.spec, index, kind, Reader.of(rotated))
            assert code == grpc.StatusCode.OK, (index, kind, code)
    with pytest.raises(grpc.RpcError) as ended:
        for _ in before_boundary:
            pass
    assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED, ended.value
    opened.close()
    with pytest.raises(grpc.RpcError) as ended:
        for _ in verdicts_before:
            pass
    assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED, ended.value
    opened_sidecar.close()

    cluster.kill(SIDECAR, kind="sidecar")
    cluster.start([SIDECAR], "sidecar")

    with SyncClient(spec, agent_key) as agent:
        decision = agent.propose("web.get", URL, run_id="after-receipt-boundary")
    cert = decision.certificate
    assert decision.allowed and cert.epoch == 1 and decision.height > doc["change_height"]
    verify(spec, cert, epochs=epochs)
    executor = Executor(
        spec, "vault", PrivateKey.generate(), object(),  # type: ignore[arg-type]
        used=MemoryUsedProposals(), epochs=epochs,
    )  # fmt: skip
    _checked(executor, cert)

    # Sidecar 1's own receipt for that height of epoch 1: signed with its new key.
    async def own_receipt() -> Receipt | None:
        async with Client(spec, owner_key) as client:
            reply = (
                await client._ch()
                .sidecars[SIDECAR]
                .GetReceipt(
                    spb.ReceiptRequest(proposal_id=decision.proposal_id),
                    timeout=WAIT_S,
                    metadata=client._read_auth(METHOD_GET_RECEIPT),
                )
            )
        return receipt_from_pb(reply.receipt) if reply.found else None

    wait_until("sidecar 1 executes the call", lambda: asyncio.run(own_receipt()) is not None)
    receipt = asyncio.run(own_receipt())
    assert receipt is not None and receipt.block.epoch == 1
    assert receipt.block.signed_by(spec.chain_id, new_key)
    assert receipt_signature_ok(spec, receipt, SIDECAR, epochs)
    status = sidecar_status()
    assert not status.diverged, status.divergence

    forged = _forged(cluster, cert)
    with pytest.raises(InvalidCertificate) as refused:
        verify(spec, forged, epochs=epochs)
    assert refused.value.reason == "wrong_epoch"
    with pytest.raises(CertificateRejected) as rejected:
        _checked(executor, forged)
    assert rejected.value.reason == "wrong_epoch"
    shown = _cli(cluster, "epochs", "--json")
    assert shown.returncode == 0, shown.stderr
    epochs_file = spec.directory / "epochs.json"
    epochs_file.write_text(shown.stdout)
    from_file = load_receipt_epochs(epochs_file, spec.receipt_keys)
    assert from_file == epochs
    offline = Executor(
        spec, "vault", PrivateKey.generate(), object(),  # type: ignore[arg-type]
        used=MemoryUsedProposals(), epochs=from_file,
    )  # fmt: skip
    _checked(offline, cert)
    with pytest.raises(CertificateRejected):
        _checked(offline, forged)

    load.stop()
    load.assert_clean()
    cluster.assert_no_equivocation_seen()
