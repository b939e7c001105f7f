"""`Status` names one committed block: its height and hash read from the same place.

The core moves its tree's root at a commit before the shell has made that commit durable,
so a reply that took the height from the store and the hash from the core could name the
hash of height h+1 as height h's (seen in a live run under load: a Status hash that no
member's CommittedBlocks holds at that height)."""

from __future__ import annotations

from types import SimpleNamespace

from quorumgate.replica.node import ReplicaNode
from quorumgate.replica.types import genesis_block


def test_the_reply_names_the_durable_head_even_when_the_core_is_ahead() -> None:
    chain = "qg-status"
    durable = genesis_block(chain)
    ahead = SimpleNamespace(hash=b"\x07" * 32, height=durable.height + 1)
    node = SimpleNamespace(
        core=SimpleNamespace(
            tree=SimpleNamespace(root=ahead), view=3, leader=1, epoch=0,
            stats=SimpleNamespace(sync_target=0),
        ),
        store=SimpleNamespace(committed_height=durable.height, committed_head=durable),
        spec=SimpleNamespace(chain_id=chain, n=4, f=1),
        index=0,
        peers=SimpleNamespace(connected=lambda: [1, 2, 3]),
        mempool=SimpleNamespace(size=0, bytes=0),
    )  # fmt: skip
    reply = ReplicaNode.status(node)  # type: ignore[arg-type]
    assert reply.committed_height == durable.height
    assert reply.committed_hash == durable.hash
