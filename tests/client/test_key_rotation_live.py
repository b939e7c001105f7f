"""Key rotation on a live 4-node cluster (docs/engine.md, "Rotating keys"), through the
CLI and the SDK: an agent's key and a principal's sealed key are rotated with a card open,
the old principal key can no longer answer it, the new one does; the agent goes on with
its new key; the owner rotates a lost agent key through `Client.rotate_key`, then its own
key (last: the module's owner client holds the old one)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.ops import clientcli
from quorumgate.ops.live import RPC_TIMEOUT_S
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, read_seed
from quorumgate.proto.model import Mandate
from quorumgate.proto.sealedkey import read_sealed
from quorumgate.runtime.channels import Reader, sync_channel
from quorumgate.sdk.client import QuorumGateError
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent
from tests.support.live import wait_until

PASSPHRASE = "the rotating principal's passphrase"


@contextmanager
def given(*lines: str) -> Iterator[str]:
    """A descriptor holding `lines`, for `--passphrase-fd`."""
    read, write = os.pipe()
    os.write(write, "".join(line + "\n" for line in lines).encode())
    os.close(write)
    try:
        yield str(read)
    finally:
        os.close(read)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = clientcli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, out + err


def test_rotating_agent_and_principal_keys_with_a_card_open(
    cluster: ClusterSpec, owner: SyncClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cluster.authority_version >= 5  # `init` writes the latest
    d = str(cluster.directory)
    person, agent = tmp_path / "person.key", tmp_path / "agent.key"
    with given(PASSPHRASE) as fd:
        argv = ["keygen", "--out", str(person), "--principal", "--kdf-cost", "interactive"]
        assert clientcli.main([*argv, "--passphrase-fd", fd]) == 0
    assert clientcli.main(["keygen", "--out", str(agent)]) == 0
    assert (
        clientcli.main(
            ["admin", "register-principal", "rot-person", "--dir", d, "--key-file", str(person)]
        )
        == 0
    )
    assert clientcli.main(
        ["admin", "register-agent", "rot-agent", "--dir", d, "--key-file", str(agent),
         "--principal", "rot-person"]
    ) == 0  # fmt: skip
    owner.set_mandate("rot-agent", Mandate(allowed_tools=("pay", "web.get")))
    capsys.readouterr()
    old_person = SigningKey(read_sealed(person).open(PASSPHRASE))
    old_agent_seed = read_seed(agent)

    # a card is open: the agent's payment waits for its principal
    submit = ["submit", "--dir", d, "--key", str(agent), "--run", "rot-run"]
    code, doc, _ = run_json(capsys, *submit, "--tool", "pay", "--target", "https://bank.example/r")
    assert code == 3 and doc["outcome"] == "pending"
    proposal = bytes.fromhex(doc["proposal_id"])
    run_id = doc["run_id"]

    # the agent rotates its key, then the principal its sealed key, with the card open
    code, doc, text = run_json(
        capsys, "admin", "rotate-key", "--agent", "rot-agent", "--key", str(agent), "--dir", d
    )
    assert (code, doc["outcome"]) == (0, "applied"), text
    new_agent_seed = read_seed(agent)
    assert new_agent_seed != old_agent_seed and not Path(str(agent) + ".old").exists()
    assert stat.S_IMODE(agent.stat().st_mode) == 0o600
    assert new_agent_seed.hex() not in text and old_agent_seed.hex() not in text
    with given(PASSPHRASE) as fd:
        code, doc, text = run_json(
            capsys, "admin", "rotate-key", "--principal", "rot-person", "--key", str(person),
            "--dir", d, "--passphrase-fd", fd,
        )  # fmt: skip
    assert (code, doc["outcome"]) == (0, "applied"), text
    new_person = SigningKey(read_sealed(person).open(PASSPHRASE))  # sealed as before
    assert bytes(new_person.verify_key) != bytes(old_person.verify_key)
    assert not Path(str(person) + ".old").exists()

    # the old principal key answers nothing; the card is still open for the new one
    with SyncClient(cluster, old_person) as stale, pytest.raises(QuorumGateError) as refused:
        stale.confirm(proposal, bytes(32))
    assert refused.value.reason == "key_rotated"
    with given(PASSPHRASE) as fd:
        code, doc, text = run_json(
            capsys, "pending", "--dir", d, "--key", str(person), "--passphrase-fd", fd
        )
    assert code == 0 and doc_lists(doc, proposal), text
    with given(PASSPHRASE) as fd:
        code, doc, text = run_json(
            capsys, "confirm", "--dir", d, "--key", str(person), proposal.hex(), "--yes",
            "--passphrase-fd", fd,
        )  # fmt: skip
    assert (code, doc["outcome"]) == (0, "allow"), text

    # the agent goes on with its new key in its run; its old key is refused
    code, doc, text = run_json(
        capsys, "submit", "--dir", d, "--key", str(agent), "--run", run_id,
        "--tool", "web.get", "--target", "https://e.x/after",
    )  # fmt: skip
    assert (code, doc["outcome"]) == (0, "allow"), text
    with SyncClient(cluster, SigningKey(old_agent_seed)) as stale:
        try:
            refused = stale.propose("web.get", "https://e.x/stale", run_id=run_id)
        except QuorumGateError as err:
            assert err.reason == "key_rotated", err.reason
        else:
            assert (refused.outcome.value, refused.reason) == ("rejected", "key_rotated")


def doc_lists(doc: Any, proposal: bytes) -> bool:
    """Whether a `pending --json` document lists the card of `proposal`."""
    return proposal.hex() in json.dumps(doc)


def test_the_owner_rotates_a_lost_agent_key_through_the_sdk(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    agent_id, lost = new_agent(owner, ["web.get"])
    replacement = SigningKey.generate()
    applied = owner.rotate_key(
        "agent", agent_id, replacement, old_public_key=bytes(lost.verify_key)
    )
    assert applied.outcome.value == "applied"
    assert owner.aio.is_owner  # the owner's own key is unchanged
    with SyncClient(cluster, replacement) as agent:
        allowed = agent.propose("web.get", "https://e.x/replaced", run_id="after-loss")
        assert allowed.outcome.value == "allow"


def test_the_owner_rotates_a_lost_key_from_the_command_line(
    cluster: ClusterSpec, owner: SyncClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = str(cluster.directory)
    agent_id, lost = new_agent(owner, ["web.get"])
    out = tmp_path / "replacement.key"
    argv = ["admin", "rotate-key", "--agent", agent_id, "--by-owner", "--out", str(out)]
    code, doc, text = run_json(capsys, *argv, "--dir", d)
    assert (code, doc["outcome"]) == (0, "applied"), text
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and read_seed(out).hex() not in text
    with SyncClient(cluster, SigningKey(read_seed(out))) as agent:
        assert agent.propose("web.get", "https://e.x/cli", run_id="r").outcome.value == "allow"
    # refused (an unknown agent): the new file goes again
    again = tmp_path / "nobody.key"
    argv = ["admin", "rotate-key", "--agent", "nobody-here", "--by-owner", "--out", str(again)]
    code, doc, text = run_json(capsys, *argv, "--dir", d)
    assert (code, doc["reason"]) == (1, "unknown_agent"), text
    assert not again.exists()
    del lost


def test_the_owner_rotates_its_own_key_last(
    cluster: ClusterSpec, owner: SyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(cluster.directory)
    owner_file = cluster.directory / "owner.key"
    before = read_seed(owner_file)
    code, doc, text = run_json(capsys, "admin", "rotate-key", "--owner", "--dir", d)
    assert (code, doc["outcome"]) == (0, "applied"), text
    assert read_seed(owner_file) != before and not Path(str(owner_file) + ".old").exists()
    # DIR/owner.key (the new key) administers and reads as the owner; the old key is refused
    agent_id, _ = new_agent_by(cluster)
    code, doc, text = run_json(capsys, "admin", "suspend", agent_id, "--dir", d)
    assert (code, doc["outcome"]) == (0, "applied"), text
    code, doc, text = run_json(capsys, "agents", "--dir", d)
    assert code == 0 and agent_id in text, text
    with pytest.raises(QuorumGateError) as refused:
        owner.suspend(agent_id)
    assert refused.value.reason == "key_rotated"
    # Nor does the old key read the committed blocks, every argument value of every call,
    # from any replica (each learns the owner's key from its own sidecar's reports), while
    # the new one does.
    old_key, new_key = SigningKey(before), SigningKey(read_seed(owner_file))
    for i in range(cluster.n):
        wait_until(
            f"replica {i} to refuse the old owner key",
            lambda i=i: blocks_read(cluster, i, old_key) == grpc.StatusCode.PERMISSION_DENIED,
        )
        assert blocks_read(cluster, i, new_key) == grpc.StatusCode.OK


def blocks_read(cluster: ClusterSpec, index: int, key: SigningKey) -> grpc.StatusCode:
    """What replica `index` answers a `CommittedBlocks` read signed with `key`."""
    channel = sync_channel(cluster, index, reader=Reader.of(key))
    try:
        stream = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
            cpb.BlocksRequest(from_height=1), timeout=RPC_TIMEOUT_S
        )
        next(iter(stream))
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    finally:
        channel.close()
    return grpc.StatusCode.OK


def new_agent_by(cluster: ClusterSpec) -> tuple[str, SigningKey]:
    """An agent registered by the owner's current key file."""
    with SyncClient.as_owner(cluster.directory) as current:
        return new_agent(current, ["web.get"])
