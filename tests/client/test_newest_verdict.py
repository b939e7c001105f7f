"""A reader is not handed a pending verdict the cluster has already superseded.

Sidecars execute at different heights: after a principal's reject is certified by f+1 of
them, the other f+1 may still hold the call's pending verdict, and they too make f+1. A
client that takes the first f+1 answers that agree (as `await_certificate` did) then
tells the agent the call still waits for its principal, after the principal said no. A
pending verdict is the one a later transaction can supersede, so it is returned only once
2f+1 sidecars have answered (bounded by `NEWER_VERDICT_WAIT_S`): any 2f+1 of them include
one that executed whatever f+1 certified. Fake sidecars here, answering from signed
receipts, make the order of the answers certain."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import RECEIPT_KEY_FILE, ClusterSpec, init_cluster, read_seed
from quorumgate.sdk import client as client_module
from quorumgate.sdk.client import _ReceiptWait
from quorumgate.sidecar.receipts import Receipt, ReceiptLeaf, Validity, merkle_root, sign_block
from quorumgate.sidecar.wire import receipt_to_pb

PROPOSAL = bytes(range(32))
REJECT_TX = bytes(range(1, 33))
PENDING_HEIGHT, DENY_HEIGHT = 5, 7
LAG_S = 0.3  # how much later the sidecars that executed the reject answer
READ_DEADLINE_S = 10.0  # the reader's deadline in these tests
WAIT_UNBOUNDED_S = 3600.0  # longer than the reader's deadline


def leaf(height: int, outcome: str, reason: str, tx_id: bytes) -> ReceiptLeaf:
    return ReceiptLeaf(height, 0, tx_id, PROPOSAL, "proposal", outcome, reason, bytes(32), b"", 1)


PENDING = leaf(PENDING_HEIGHT, "pending", "confirmation_required", PROPOSAL)
DENIED = leaf(DENY_HEIGHT, "deny", "confirmation_rejected", REJECT_TX)


# The block time every receipt's validity window starts at: one for all sidecars, as the
# block's own time is (receipts made each at its own clock reading would sign different
# statements, and no f+1 of them would agree).
BLOCK_TIME_MS = int(time.time() * 1000)
VALIDITY_MS = 600_000


def receipt(spec: ClusterSpec, signer: int, of: ReceiptLeaf) -> spb.Receipt:
    key = SigningKey(read_seed(spec.node_dir(signer) / RECEIPT_KEY_FILE))
    window = Validity(BLOCK_TIME_MS, BLOCK_TIME_MS + VALIDITY_MS)
    validity = window if spec.receipts_expire else None
    root = merkle_root([of.hash(spec.chain_id)])
    block = sign_block(key, signer, spec.chain_id, of.height, root, bytes(32), 1, validity)
    return receipt_to_pb(Receipt(of, (), block))


class FakeSidecar:
    """Answers `GetReceipt` with its newest receipt after `delay_s`, and a long poll for
    anything newer with nothing."""

    def __init__(self, answer: spb.Receipt, height: int, delay_s: float) -> None:
        self.answer, self.height, self.delay_s = answer, height, delay_s

    async def GetReceipt(
        self, request: spb.ReceiptRequest, timeout: float, metadata: object
    ) -> spb.ReceiptReply:
        if request.newer_than >= self.height:
            await asyncio.sleep(min(timeout, request.wait_ms / 1000))
            return spb.ReceiptReply(found=False)
        await asyncio.sleep(self.delay_s)
        return spb.ReceiptReply(found=True, receipt=self.answer)


async def read(spec: ClusterSpec, sidecars: list[FakeSidecar], deadline_s: float = READ_DEADLINE_S):  # type: ignore[no-untyped-def]
    wait = _ReceiptWait(
        spec,
        sidecars,  # type: ignore[arg-type]
        lambda: (),
        1.0,
        PROPOSAL,
        asyncio.get_running_loop().time() + deadline_s,
        settled=False,
        from_tx=None,
        own_nonce=0,
        own=[],
    )
    return await wait.certified()


def test_a_superseded_pending_verdict_is_not_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack's order: the two sidecars that lag answer first, both pending. The
    bound on the wait for more answers (a liveness fallback, tested below) is lifted, so
    that what decides is the rule, not how far apart a loaded machine spreads answers
    `LAG_S` apart."""
    monkeypatch.setattr(client_module, "NEWER_VERDICT_WAIT_S", WAIT_UNBOUNDED_S)
    spec = init_cluster(tmp_path / "c", 4)
    sidecars = [
        FakeSidecar(receipt(spec, 0, PENDING), PENDING_HEIGHT, 0.0),
        FakeSidecar(receipt(spec, 1, PENDING), PENDING_HEIGHT, 0.0),
        FakeSidecar(receipt(spec, 2, DENIED), DENY_HEIGHT, LAG_S),
        FakeSidecar(receipt(spec, 3, DENIED), DENY_HEIGHT, LAG_S),
    ]
    decision = asyncio.run(read(spec, sidecars))
    assert (decision.outcome.value, decision.reason) == ("deny", "confirmation_rejected")


def test_a_pending_verdict_nobody_superseded_is_returned(tmp_path: Path) -> None:
    """Every sidecar answers pending: it is the verdict, returned once 2f+1 answered."""
    spec = init_cluster(tmp_path / "c", 4)
    sidecars = [FakeSidecar(receipt(spec, i, PENDING), PENDING_HEIGHT, 0.0) for i in range(4)]
    decision = asyncio.run(read(spec, sidecars))
    assert decision.pending


def test_a_pending_verdict_is_returned_with_f_sidecars_down(tmp_path: Path) -> None:
    """f sidecars never answer: the 2f+1 others suffice, without waiting for the bound."""
    spec = init_cluster(tmp_path / "c", 4)
    sidecars = [FakeSidecar(receipt(spec, i, PENDING), PENDING_HEIGHT, 0.0) for i in range(3)]
    sidecars.append(FakeSidecar(receipt(spec, 3, PENDING), PENDING_HEIGHT, 3600.0))
    started = time.monotonic()
    decision = asyncio.run(read(spec, sidecars))
    assert decision.pending
    assert time.monotonic() - started < 60  # not the down sidecar's hour


def test_a_final_verdict_needs_only_f_plus_one(tmp_path: Path) -> None:
    """An allow or a deny is never superseded: f+1 matching answers are enough, and
    the sidecars still executing do not hold the reader up."""
    spec = init_cluster(tmp_path / "c", 4)
    sidecars = [
        FakeSidecar(receipt(spec, 0, DENIED), DENY_HEIGHT, 0.0),
        FakeSidecar(receipt(spec, 1, DENIED), DENY_HEIGHT, 0.0),
        FakeSidecar(receipt(spec, 2, DENIED), DENY_HEIGHT, 3600.0),
        FakeSidecar(receipt(spec, 3, DENIED), DENY_HEIGHT, 3600.0),
    ]
    started = time.monotonic()
    decision = asyncio.run(read(spec, sidecars))
    assert decision.outcome.value == "deny"
    assert time.monotonic() - started < 60


def test_the_wait_for_more_answers_is_bounded(tmp_path: Path) -> None:
    """Only f+1 sidecars answer (more than f are down or slow): the pending verdict they
    certified is returned once `NEWER_VERDICT_WAIT_S` passed, before the reader's own
    deadline, rather than a timeout."""
    spec = init_cluster(tmp_path / "c", 4)
    sidecars = [FakeSidecar(receipt(spec, i, PENDING), PENDING_HEIGHT, 0.0) for i in range(2)]
    sidecars += [FakeSidecar(receipt(spec, i, PENDING), PENDING_HEIGHT, 3600.0) for i in (2, 3)]
    assert client_module.NEWER_VERDICT_WAIT_S < READ_DEADLINE_S
    decision = asyncio.run(read(spec, sidecars, READ_DEADLINE_S))
    assert decision.pending
