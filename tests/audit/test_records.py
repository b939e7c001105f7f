"""The shipper's decisions without a cluster (docs/audit.md, "What the shipper trusts"):
f+1 identical answers, hash links from the copy's head, one key per batch, at most
SHIP_BATCH_VERDICTS_MAX verdicts a page."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from nacl.signing import SigningKey

from quorumgate.audit.follow import Reader
from quorumgate.audit.records import (
    SHIP_BATCH_VERDICTS_MAX,
    Batch,
    Cursor,
    ShippedVerdict,
    agreed_entries,
    linked_prefix,
)
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.model import Outcome, Reason, TxKind
from quorumgate.sidecar.engine.statements import Verdict
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH, LedgerEntry
from quorumgate.sidecar.receipts import Certificate, ReceiptLeaf

CHAIN = "qg-test"
START = Cursor(0, 0, GENESIS_PREV_HASH, 0)


def ledger(count: int, outcome: Outcome = Outcome.ALLOW) -> list[LedgerEntry]:
    verdicts = [
        Verdict(bytes([i % 256]) * 32, TxKind.PROPOSAL, outcome, Reason.OK, principal="a")
        for i in range(count)
    ]
    return LedgerEntry.chain(CHAIN, 1, verdicts, GENESIS_PREV_HASH)


def test_f_plus_one_identical_answers_win_a_liar_and_a_laggard_do_not() -> None:
    honest = ledger(5)
    lie = ledger(5, Outcome.DENY)
    answers = {0: honest, 1: honest[:2], 2: honest, 3: lie}
    assert agreed_entries(answers, 2) == honest
    # with the laggard and the liar alone, nothing beyond what two agree on
    assert agreed_entries({1: honest[:2], 3: lie}, 2) == []
    assert agreed_entries({0: honest, 1: honest[:2]}, 2) == honest[:2]


def test_only_entries_that_link_to_the_copys_head_are_taken() -> None:
    entries = ledger(4)
    assert linked_prefix(CHAIN, START, entries) == (entries, "")
    edited = dataclasses.replace(entries[2], reason="denied")
    good, why = linked_prefix(CHAIN, START, [*entries[:2], edited, entries[3]])
    assert good == entries[:2] and "hash_mismatch" in why
    after_two = Cursor(1, 1, entries[1].hash, 2)
    assert linked_prefix(CHAIN, after_two, entries[2:]) == (entries[2:], "")
    good, why = linked_prefix(CHAIN, after_two, entries[3:])  # one missing between
    assert good == [] and why


def test_a_batch_has_one_key_and_moves_the_cursor_past_its_last_entry() -> None:
    entries = ledger(3)
    leaf = ReceiptLeaf(1, 0, b"", b"", "", "", "", b"", b"", 0)
    cert = Certificate(CHAIN, leaf, (), 1, b"", b"")
    batch = Batch(CHAIN, tuple(ShippedVerdict(e, cert) for e in entries))
    again = Batch(CHAIN, tuple(ShippedVerdict(e, cert) for e in entries))
    assert batch.key == again.key == f"{CHAIN}:1.0-1.2"
    assert batch.after(START) == Cursor(1, 2, entries[-1].hash, 3)


class Pages:
    """A sidecar that answers more entries than a batch holds."""

    def __init__(self, entries: list[LedgerEntry]) -> None:
        self.entries = entries

    async def Ledger(self, request: spb.LedgerRequest, **_: Any) -> spb.LedgerReply:
        reply = spb.LedgerReply(executed_height=1)
        reply.entries.extend(e.to_json() for e in self.entries)
        return reply


def test_a_page_is_at_most_a_batch(tmp_path: Any) -> None:
    spec: ClusterSpec = init_cluster(tmp_path, 4)
    entries = ledger(SHIP_BATCH_VERDICTS_MAX + 50)
    reader = Reader(spec, SigningKey.generate(), [Pages(entries)] * 4)
    pages = asyncio.run(reader.ledger_pages(START, []))
    assert all(len(p) == SHIP_BATCH_VERDICTS_MAX for p in pages.values())
