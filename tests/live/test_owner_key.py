"""The owner key rotated on a live cluster that runs epochs (docs/consensus/epochs.md, "The
record key"; docs/engine.md, "Rotating keys"): `quorumgate admin rotate-key --owner`
hands the records' key over too, so that whoever kept a copy of the old owner key (the
reason for the rotation) can no longer change the member set, and the new key can."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, read_seed, write_seed
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import Reconfiguration, sign_record
from quorumgate.sdk.client import Client
from quorumgate.sdk.errors import QuorumGateError
from quorumgate.sdk.sync import SyncClient
from tests.support.live import WAIT_S, LiveCluster, wait_until

N = 4
MEMBER = 2  # whose seat the old owner key tries to hand to a key of its holder's
RESTARTED = 1  # restarted in the epoch the owner record started
CLI_TIMEOUT_S = 120.0


def admin(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "quorumgate", "admin", "rotate-key", *args]
    where = ["--dir", str(cluster.spec.directory), "--json", "--deadline", str(WAIT_S)]
    return subprocess.run(
        [*command, *where], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def epochs(cluster: LiveCluster) -> dict[int, int]:
    return {i: s.epoch for i, s in cluster.statuses(range(N)).items()}


def offer(cluster: LiveCluster, data: bytes, reader: SigningKey) -> str | None:
    """Offer a record to the replicas: None if one took it, else why not."""

    async def go() -> None:
        async with Client(cluster.spec, reader) as client:
            await client.submit_record(data)

    try:
        asyncio.run(go())
    except QuorumGateError as err:
        return err.reason
    return None


def test_a_rotated_out_owner_key_changes_no_member(
    live_cluster: Callable[..., LiveCluster], tmp_path: Path
) -> None:
    """After `admin rotate-key --owner` (which returns once the epoch whose records the
    new key signs has started), a rotation of member 2 to a key of the thief's, signed by
    the old owner key, ends no epoch; a replica restarted then resumes with the new key;
    `admin rotate-key --member 2 --key <the old key>` is refused naming both keys, and
    `admin rotate-key --member 2`, which signs with DIR/owner.key (the new key), ends
    the epoch."""
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    old = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))

    done = admin(cluster, "--owner")
    assert done.returncode == 0, done.stdout + done.stderr
    new = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
    now = max(epochs(cluster).values())

    # The thief signs with the old key for the epoch the replicas are in.
    thief = Ed25519Signer(b"\x07" * 32).public_key
    record = Reconfiguration("rotate", (MEMBER,), (thief,))
    stolen = sign_record(record, spec.chain_id, now, lambda m: bytes(old.sign(m).signature))
    refused = offer(cluster, stolen, new)
    cluster.wait_progress(3)
    assert all(e == now for e in epochs(cluster).values()), (refused, epochs(cluster))
    assert refused is not None  # refused at admission: not the key in force

    doc = json.loads(done.stdout)
    assert doc["outcome"] == "applied" and doc["records_epoch"] == 1 == now, doc
    assert doc["record_key"] == bytes(new.verify_key).hex()[:16]

    # A replica restarted in the new epoch derives its record key from its stored change
    # block, as the others hold it.
    cluster.kill(RESTARTED)
    cluster.restart(RESTARTED)
    assert cluster.status(RESTARTED).epoch == 1

    # The member rotation refuses the old key, naming both keys (and writes nothing).
    old_file = tmp_path / "old-owner.key"
    write_seed(old_file, bytes(old))
    before = sorted(p.name for p in spec.node_dir(MEMBER).iterdir())
    refused_cli = admin(cluster, "--member", str(MEMBER), "--key", str(old_file))
    assert refused_cli.returncode == 2, refused_cli.stdout + refused_cli.stderr
    for key in (old, new):
        assert bytes(key.verify_key).hex()[:16] in refused_cli.stderr, refused_cli.stderr
    assert sorted(p.name for p in spec.node_dir(MEMBER).iterdir()) == before

    rotated = admin(cluster, "--member", str(MEMBER))
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    member_doc = json.loads(rotated.stdout)
    assert member_doc["epoch"] == 1 and member_doc["in_effect"], member_doc
    wait_until("every replica in epoch 2", lambda: all(e == 2 for e in epochs(cluster).values()))
    cluster.wait_progress(2)
    cluster.assert_no_equivocation_seen()
    shown = subprocess.run(
        [sys.executable, "-m", "quorumgate", "epochs", "--dir", str(spec.directory), "--json"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=True,
    )  # fmt: skip
    fingerprints = [bytes(k.verify_key).hex()[:16] for k in (old, new, new)]
    assert [e["record_key"] for e in json.loads(shown.stdout)["epochs"]] == fingerprints


def test_an_interrupted_hand_over_is_finished_by_running_the_command_again(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """The state `admin rotate-key --owner` leaves when it stops after the engine's
    rotation and before the records' (its deadline, the operator's Ctrl-C): the engine
    holds the new key, DIR/owner.key the new key and DIR/owner.key.old the old one, the
    records still the old key. Running the command again only hands the records' key
    over, then retires the old key file."""
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    path = spec.directory / OWNER_KEY_FILE
    old_path = spec.directory / (OWNER_KEY_FILE + ".old")
    new = SigningKey.generate()
    with SyncClient.as_owner(spec.directory) as owner:
        owner.rotate_key("owner", "", new, deadline_s=WAIT_S)
    path.rename(old_path)
    write_seed(path, bytes(new))
    assert all(e == 0 for e in epochs(cluster).values())

    done = admin(cluster, "--owner")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["records_epoch"] == 1 and doc["record_key"] == bytes(new.verify_key).hex()[:16]
    assert not old_path.exists() and read_seed(path) == bytes(new)
    wait_until("every replica in epoch 1", lambda: all(e == 1 for e in epochs(cluster).values()))
