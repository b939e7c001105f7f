"""The replica's link to its sidecar: a refusal only a lagging sidecar would give waits,
boundedly, for the sidecar to report executing the committed log (replica/client_api.py),
so an unknown signer is refused before ordering even just after a block commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    RECEIPT_KEY_FILE,
    init_cluster,
    read_seed,
)
from quorumgate.proto.reports import root_report_statement
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.sidecar_link import EXECUTED_WAITERS_MAX, ReportKeys, SidecarLink
from quorumgate.runtime.channels import Reader


def link_and_reporter(tmp_path: Path) -> tuple[SidecarLink, SigningKey]:
    spec = init_cluster(tmp_path / "c", 4)
    key = SigningKey(read_seed(spec.node_dir(0) / RECEIPT_KEY_FILE))
    replica = Reader.of(SigningKey(read_seed(spec.node_dir(0) / CONSENSUS_KEY_FILE)))
    return SidecarLink(spec, 0, ReplicaMetrics(0), lambda: None, replica), key


def report(link: SidecarLink, key: SigningKey, height: int) -> bool:
    root = bytes([height % 256]) * 32
    signature = key.sign(root_report_statement(link.chain_id, height, root)).signature
    return link.on_state_root(height, root, signature)


async def test_a_wait_ends_when_the_sidecar_reports_the_height(tmp_path: Path) -> None:
    link, key = link_and_reporter(tmp_path)
    assert report(link, key, 1)
    assert await link.wait_executed(1, 0.0)  # already there: no wait at all
    waiting = asyncio.ensure_future(link.wait_executed(3, 30.0))
    await asyncio.sleep(0)
    assert report(link, key, 2)
    await asyncio.sleep(0)
    assert not waiting.done()  # height 2 is not enough
    assert report(link, key, 3)
    assert await asyncio.wait_for(waiting, 5.0)
    assert link._waiters == []


async def test_a_wait_gives_up_after_its_bound_and_waiters_are_bounded(tmp_path: Path) -> None:
    link, key = link_and_reporter(tmp_path)
    assert not await link.wait_executed(1, 0.01)
    assert link._waiters == []
    held = [asyncio.ensure_future(link.wait_executed(5, 30.0)) for _ in range(EXECUTED_WAITERS_MAX)]
    await asyncio.sleep(0)
    assert not await link.wait_executed(5, 30.0)  # one more is not held: it answers at once
    assert report(link, key, 5)
    assert all(await asyncio.gather(*held))
    # a forged report releases nobody
    waiting = asyncio.ensure_future(link.wait_executed(6, 30.0))
    await asyncio.sleep(0)
    assert not link.on_state_root(6, b"\x00" * 32, b"\x00" * 64)
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()


def owner_report(link: SidecarLink, key: SigningKey, height: int, owner: bytes) -> bool:
    root = bytes([height % 256]) * 32
    statement = root_report_statement(link.chain_id, height, root, owner)
    return link.on_state_root(height, root, key.sign(statement).signature, owner)


def test_the_rotated_owner_key_is_taken_from_the_sidecars_signed_report(tmp_path: Path) -> None:
    """The replica answers the owner key its sidecar's state holds (docs/engine.md,
    "Rotating keys"): only as signed with the root, and the newest report's."""
    link, key = link_and_reporter(tmp_path)
    first, second = bytes([1]) * 32, bytes([2]) * 32
    assert report(link, key, 1) and link.owner_key is None
    # The attack: anyone may open the report stream; an owner key added to a report
    # whose signature covers the root alone is refused with it.
    root = bytes([2]) * 32
    signature = key.sign(root_report_statement(link.chain_id, 2, root)).signature
    assert not link.on_state_root(2, root, signature, first)
    assert link.owner_key is None
    assert owner_report(link, key, 3, first) and link.owner_key == first
    assert owner_report(link, key, 5, second) and link.owner_key == second
    assert owner_report(link, key, 4, first)  # an older report after a newer one
    assert link.owner_key == second


def test_a_report_is_checked_with_the_receipt_key_of_its_heights_epoch(tmp_path: Path) -> None:
    """The attack: member 0's receipt key is rotated by the change block at height 10
    (docs/consensus/epochs.md, "Receipt keys"). Whoever holds the old key reports a root
    for height 11, of epoch 1, and the replica took it (it checked the cluster file's key
    at every height), first come first kept. Now each height is checked with the key of
    its epoch, from the committed change blocks (`ReportKeys`), and a height above the
    replica's committed one with no key at all: its epoch is not settled here."""
    link, old = link_and_reporter(tmp_path)
    new = SigningKey(bytes([7]) * 32)
    committed = [12]
    link.follow_epochs(
        ReportKeys(((1, bytes(old.verify_key)), (11, bytes(new.verify_key))), lambda: committed[0]),
        (bytes(new.verify_key),),
    )
    assert not report(link, old, 11)  # past the boundary: the old key reports nothing
    assert link.roots.root_at(11) is None
    assert report(link, new, 11)
    assert report(link, old, 10)  # the change block is epoch 0's: the old key's
    assert not report(link, new, 9)
    assert not report(link, new, 13)  # not committed here yet: no key, whoever signs
    committed[0] = 13
    assert report(link, new, 13)
    # The rule is a function of the committed change blocks and the height alone: a link
    # that followed the same epochs decides every report the same way.
    twin = SidecarLink(link.spec, 0, ReplicaMetrics(0), lambda: None, link._reader)
    twin.follow_epochs(link.report_keys, link.readers)
    for height in range(1, 14):
        for key in (old, new):
            root = bytes([height % 256]) * 32
            signature = key.sign(root_report_statement(link.chain_id, height, root)).signature
            assert twin.report_keys.at(height) == link.report_keys.at(height)
            assert twin.on_state_root(height, root, signature) == (
                link.report_keys.at(height) == bytes(key.verify_key)
            )
