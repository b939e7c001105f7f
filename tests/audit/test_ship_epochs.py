"""The shipper checks every certificate against its epoch (docs/consensus/epochs.md,
"Receipt keys"; docs/audit.md): the receipt keys and heights of the chain of epochs it
read, with the verifier the SDK and `audit verify --epochs` use. Without a cluster: four
stand-in sidecars answer one round (`read_round`).

The chain (tests/consensus/test_receipt_key.py `follower_ends`): epoch 0 ends with the
rotation of member 1's receipt key at height 4, epoch 1 with member 2's at height 6.

- The attack: a faulty sidecar and whoever holds member 1's rotated-out key serve a
  ledger entry at height 5 and sign epoch 0's statement for it. Checked with the cluster
  file's keys, as the shipper did, it is certified and shipped; against the chain it is
  in no epoch (height 5 is epoch 1's) and is refused.
- The legitimate certificate of epoch 1, signed by member 0 and by member 1's new key,
  was refused (the new key is not the cluster file's); it is shipped now.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

from nacl.signing import SigningKey

from quorumgate.audit.follow import Reader, Round, read_round
from quorumgate.audit.records import Cursor
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.model import Outcome, Reason, TxKind
from quorumgate.replica.epochchain import EpochChain, extend_epoch_chain
from quorumgate.sdk.epochs import receipt_epochs_of
from quorumgate.sidecar.engine.statements import Verdict
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH, LedgerEntry
from quorumgate.sidecar.receipts import Receipt, ReceiptEpochs, ReceiptLeaf, sign_block
from quorumgate.sidecar.wire import receipt_to_pb
from tests.consensus.helpers import CHAIN, key_seed, membership
from tests.consensus.test_receipt_key import RECEIPT_KEYS, RECORDS, follower_ends

OLD = tuple(SigningKey(key_seed(i, "receipt")) for i in range(4))  # the cluster file's
NEW_1 = SigningKey(key_seed(1, "new-receipt"))  # member 1's from epoch 1
START = Cursor(0, 0, GENESIS_PREV_HASH, 0)
SPEC: Any = SimpleNamespace(chain_id=CHAIN, f=1, receipt_keys=RECEIPT_KEYS, receipts_expire=False)


def chain_epochs() -> ReceiptEpochs:
    ends, _ = follower_ends()
    chain = extend_epoch_chain(EpochChain.genesis(membership()), ends, RECORDS)
    return receipt_epochs_of(chain, RECEIPT_KEYS)


def entry_at(height: int) -> LedgerEntry:
    verdict = Verdict(b"v" * 32, TxKind.PROPOSAL, Outcome.ALLOW, Reason.OK, principal="a")
    return LedgerEntry.chain(CHAIN, height, [verdict], GENESIS_PREV_HASH)[0]


def receipt(entry: LedgerEntry, signer: int, key: SigningKey, epoch: int) -> spb.Receipt:
    leaf = ReceiptLeaf(
        entry.height, entry.index, entry.tx_id, entry.proposal_id or entry.tx_id, entry.kind,
        entry.outcome, entry.reason, entry.target_digest, entry.card_digest,
        entry.mandate_version,
    )  # fmt: skip
    root = leaf.hash(CHAIN)
    block = sign_block(key, signer, CHAIN, entry.height, root, b"s" * 32, 1, None, epoch)
    return receipt_to_pb(Receipt(leaf, (), block))


class Sidecar:
    """A stand-in sidecar: its executed height, its ledger page and its receipts."""

    def __init__(self, executed: int, entries: Sequence[LedgerEntry], receipts: Sequence[Any]):
        self.executed = executed
        self.entries = list(entries)
        self.receipts = list(receipts)

    async def Status(self, request: spb.SidecarStatusRequest, **_: Any) -> Any:
        return spb.SidecarStatusReply(chain_id=CHAIN, executed_height=self.executed)

    async def Ledger(self, request: spb.LedgerRequest, **_: Any) -> spb.LedgerReply:
        reply = spb.LedgerReply(executed_height=self.executed)
        reply.entries.extend(e.to_json() for e in self.entries)
        return reply

    def Receipts(self, request: spb.ReceiptsRequest, **_: Any) -> Any:
        receipts, executed = self.receipts, self.executed

        class Stream:
            def cancel(self) -> None:
                return None

            async def __aiter__(self) -> AsyncIterator[spb.ReceiptBatch]:
                yield spb.ReceiptBatch(height=executed, receipts=receipts)

        return Stream()


def ship_round(sidecars: Sequence[Sidecar], epochs: ReceiptEpochs | None) -> Round:
    """One shipper round; `epochs`: what reading the chain of epochs returns."""

    async def learn() -> ReceiptEpochs:
        assert epochs is not None
        return epochs

    reader = Reader(SPEC, SigningKey.generate(), list(sidecars), learn if epochs else None)
    return asyncio.run(read_round(SPEC, reader, START))


def forged_round(epochs: ReceiptEpochs | None) -> Round:
    """Sidecar 0 is faulty; sidecar 1's endpoint is the thief's, holding member 1's
    rotated-out key; sidecars 2 and 3 (honest) have executed height 4 only."""
    forged = entry_at(5)
    liars = [Sidecar(6, [forged], [receipt(forged, i, OLD[i], epoch=0)]) for i in (0, 1)]
    honest = [Sidecar(4, [], []) for _ in (2, 3)]
    return ship_round([*liars, *honest], epochs)


def legitimate_round(epochs: ReceiptEpochs | None) -> Round:
    """Height 5 (epoch 1) certified by member 0 and member 1's new receipt key; sidecars 2
    and 3 send no receipts (down, or slow)."""
    entry = entry_at(5)
    signers = [Sidecar(6, [entry], [receipt(entry, 0, OLD[0], 1)])]
    signers.append(Sidecar(6, [entry], [receipt(entry, 1, NEW_1, 1)]))
    silent = [Sidecar(6, [entry], []) for _ in (2, 3)]
    return ship_round([*signers, *silent], epochs)


def test_an_old_receipt_keys_certificate_past_the_rotation_is_not_shipped() -> None:
    found = forged_round(chain_epochs())
    assert found.verdicts == []
    assert any(r.reason == "no certificate" for r in found.refusals)


def test_a_certificate_of_epoch_1_with_the_new_receipt_key_is_shipped() -> None:
    found = legitimate_round(chain_epochs())
    assert [v.entry.height for v in found.verdicts] == [5]
    assert found.verdicts[0].certificate.epoch == 1


def test_a_chain_that_cannot_be_read_ships_nothing_new() -> None:
    """Reading the chain fails: nothing above what the known epochs cover (height 0 at
    first) is certified, rather than checked with the cluster file's keys."""

    async def fails() -> ReceiptEpochs:
        raise ConnectionError("no replica answers")

    entry = entry_at(1)
    sidecars = [Sidecar(1, [entry], [receipt(entry, i, OLD[i], 0)]) for i in range(4)]
    reader = Reader(SPEC, SigningKey.generate(), sidecars, fails)
    found = asyncio.run(read_round(SPEC, reader, START))
    assert found.verdicts == [] and not found.caught_up
    assert [r.detail for r in found.refusals if r.reason == "epochs unknown"] == ["ConnectionError"]


def test_without_a_chain_of_epochs_the_cluster_files_keys_count_as_before() -> None:
    """A chain that runs no epochs reads none: epoch 0 with the cluster file's keys."""
    entry = entry_at(1)
    sidecars = [Sidecar(1, [entry], [receipt(entry, i, OLD[i], 0)]) for i in range(4)]
    assert [v.entry.height for v in ship_round(sidecars, None).verdicts] == [1]
