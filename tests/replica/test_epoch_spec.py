"""The cluster as it stands in an epoch (docs/consensus/epochs.md, "The live replica"):
derived from the committed change blocks alone, the cluster file's entries with each
member a `replace` record describes swapped in; the peer network follows it at the
boundary, linking to the new member's address and leaving the old one."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from quorumgate.proto.clusterfile import ClusterSpec, MemberSpec, init_cluster
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import (
    Member,
    Membership,
    OwnerRecords,
    Reconfiguration,
    sign_record,
)
from quorumgate.proto.tls import make_node_certificate
from quorumgate.replica.epochs import change_in, entries_after, owner_after
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.peers import PeerNetwork
from quorumgate.replica.types import genesis_block
from tests.consensus.helpers import CHAIN, key_seed, make_block
from tests.consensus.test_member_entries import NEW, OWNER, RECEIPT

READER_KINDS = ("replace", "rotate", "owner")


def cluster(tmp_path: Path) -> tuple[ClusterSpec, OwnerRecords]:
    spec = init_cluster(tmp_path / "c", 4)
    # the test's chain and owner key, which the helpers' blocks and records use
    spec = replace(spec, chain_id=CHAIN, owner_public_key=OWNER.public_key)
    return spec, OwnerRecords(spec.chain_id, OWNER.public_key, kinds=READER_KINDS)


CERT = make_node_certificate(3, "127.0.0.9")[1]


def new_member(spec: ClusterSpec) -> MemberSpec:
    keys = NEW.public_key, RECEIPT.public_key
    return MemberSpec(3, "127.0.0.9", 7400, 7401, 7402, 7403, *keys, CERT)


def test_a_replace_swaps_the_member_entry(tmp_path: Path) -> None:
    spec, reader = cluster(tmp_path)
    entry = new_member(spec)
    record = Reconfiguration("replace", (3,), (NEW.public_key,), entries=(entry.encode(),))
    tx = sign_record(record, spec.chain_id, 0, OWNER.sign)
    members = spec.membership()
    block = make_block(genesis_block(spec.chain_id), 1, payload=(tx,))
    assert change_in(block, members, reader) is not None
    after = spec.with_entries(entries_after(block, members, reader))
    assert after.member(3) == new_member(spec)
    assert after.members[:3] == spec.members[:3]
    assert after.chain_id == spec.chain_id and after.owner_public_key == spec.owner_public_key
    assert owner_after(block, members, reader) == reader


def test_a_rotation_leaves_every_entry(tmp_path: Path) -> None:
    spec, reader = cluster(tmp_path)
    rotated = Ed25519Signer(key_seed(7, "rotated"))
    tx = sign_record(
        Reconfiguration("rotate", (2,), (rotated.public_key,)), spec.chain_id, 0, OWNER.sign
    )
    block = make_block(genesis_block(spec.chain_id), 1, payload=(tx,))
    assert entries_after(block, spec.membership(), reader) == ()


def test_the_peer_network_relinks_only_the_member_that_moved(tmp_path: Path) -> None:
    spec, _ = cluster(tmp_path)
    after = spec.with_entries((new_member(spec),))
    keys = Membership(spec.chain_id, tuple(Member(m.index, m.public_key) for m in spec.members))

    async def main() -> None:
        network = PeerNetwork(
            spec, 0, lambda: (), keys.key, ReplicaMetrics(0), lambda message: None
        )
        network.start()
        try:
            before = dict(network._links)
            assert await network.follow(spec) == []
            assert network._links == before
            assert await network.follow(after) == [3]
            assert network._links[1] is before[1] and network._links[2] is before[2]
            assert network._links[3] is not before[3]
            assert network.spec.member(3).host == "127.0.0.9"
        finally:
            await network.stop()

    asyncio.run(main())
