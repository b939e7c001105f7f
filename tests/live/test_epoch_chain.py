"""A client that holds only the first cluster file learns the member set of every epoch
by checking the chain of epoch ends (docs/consensus/epochs.md, "Followers: the chain of
epochs"): on a live cluster two members' consensus keys are rotated one after the other,
and `Client.epochs()` and `quorumgate epochs` report epoch 2 with both new keys; a
replica answering with a tampered chain is named and does not stop the client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto.clusterfile import load_cluster
from quorumgate.runtime.readauth import METHOD_EPOCH_ENDS
from quorumgate.sdk.client import Client
from quorumgate.sdk.epochs import Epochs, key_fingerprint
from quorumgate.sdk.errors import ReadNotAuthorized
from tests.consensus.helpers import OUTSIDER
from tests.support.live import WAIT_S, LiveCluster, wait_until

N = 4
ROTATED = (2, 1)  # members whose keys are rotated, in this order
LIAR = 3
CLI_TIMEOUT_S = 60.0


def _quorumgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumgate", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


class TamperingReplica:
    """Stands in for one replica's stub: it answers `EpochEnds` with the honest chain
    whose newest epoch names an outsider's key for member 1 (the epoch end is genuine, its
    claimed keys are not the change block's)."""

    def __init__(self, honest: cpb.EpochEndsReply) -> None:
        self.reply = cpb.EpochEndsReply()
        self.reply.CopyFrom(honest)
        last = self.reply.ends[-1]
        keys = bytearray(last.keys)
        keys[32:64] = OUTSIDER.public_key
        last.keys = bytes(keys)

    async def EpochEnds(self, request: Any, **_: Any) -> cpb.EpochEndsReply:  # gRPC's name
        return self.reply


def test_a_client_with_the_first_cluster_file_learns_epoch_2(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    cluster = live_cluster(N)
    directory = cluster.spec.directory
    first = load_cluster(directory)  # what a client was given before any rotation
    new_keys: dict[int, bytes] = {}
    for member in ROTATED:
        done = _quorumgate(
            "admin", "rotate-key", "--dir", str(directory), "--member", str(member),
            "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        new_keys[member] = bytes.fromhex(json.loads(done.stdout)["public_key"])
    wait_until(
        "every replica in epoch 2",
        lambda: all(s.epoch == 2 for s in cluster.statuses(range(N)).values()),
    )
    expected = [new_keys.get(i, first.membership().key(i)) for i in range(N)]

    async def ask(liar: bool) -> Epochs:
        async with Client.as_owner(directory) as client:
            assert client.spec == first
            if liar:
                stubs = client._ch().replicas
                honest = await stubs[0].EpochEnds(
                    cpb.EpochEndsRequest(), metadata=client._read_auth(METHOD_EPOCH_ENDS)
                )
                stubs[LIAR] = TamperingReplica(honest)  # type: ignore[call-overload]
            found = await client.epochs()
            # A second call checks only what is new: nothing, and still says epoch 2.
            assert (await client.epochs()).current.epoch == 2
            return found

    found = asyncio.run(ask(liar=False))
    assert [e.epoch for e in found.epochs] == [0, 1, 2]
    assert list(found.current.keys) == expected
    assert found.epochs[1].keys[2] == new_keys[2] and found.epochs[1].keys[1] != new_keys[1]
    assert found.current.checked_by == tuple(range(N)) and not found.refused
    assert 0 < found.epochs[1].boundary_height < found.epochs[2].boundary_height

    lied = asyncio.run(ask(liar=True))
    assert lied.current.epoch == 2 and list(lied.current.keys) == expected
    assert list(lied.refused) == [LIAR]
    assert "epoch 2" in lied.refused[LIAR] and "keys_differ" in lied.refused[LIAR]
    assert LIAR not in lied.current.checked_by

    async def as_stranger() -> None:
        async with Client(first, SigningKey.generate()) as client:
            await client.epochs()

    with pytest.raises(ReadNotAuthorized):  # the change blocks are committed transactions
        asyncio.run(as_stranger())

    shown = _quorumgate("epochs", "--dir", str(directory), "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["epoch"] == 2
    assert doc["epochs"][2]["keys"] == [key_fingerprint(k) for k in expected]
    assert doc["epochs"][2]["checked_by"] == list(range(N))
    human = _quorumgate("epochs", "--dir", str(directory))
    assert human.returncode == 0, human.stderr
    assert f"member 1: {key_fingerprint(new_keys[1])}" in human.stdout

    cluster.stop_all()
    down = _quorumgate("epochs", "--dir", str(directory))
    assert down.returncode == 1 and "replicas answered" in down.stderr
