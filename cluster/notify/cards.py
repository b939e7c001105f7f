"""Which cards have opened, as f+1 sidecars certify them (docs/notifications.md, "What
the notifier trusts").

The notifier reads with a key that answers no card: an auditor's (or the owner's), which
may read every verdict (docs/security/reads-and-certificates.md). A card is announced only
when (1) a `pending` verdict for its proposal carries a certificate of f+1 sidecars'
signed receipts, (2) the card's bytes hash to the digest that certificate names (read with
`GetReceipt`, checked by the SDK), and (3) the signed proposal read from a replica's
committed block verifies and hashes to the card's `body_digest` (`card_values`). One lying
sidecar or replica can withhold, never make the notifier announce a card f+1 do not show.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Outcome
from quorumgate.runtime.readauth import METHOD_COMMITTED_BLOCKS, read_auth_metadata
from quorumgate.sdk.client import Client, Decision, QuorumGateError
from quorumgate.sidecar.engine.statements import (
    HANDLE_VALUE_PREFIX,
    PRINCIPAL_PREFIX,
    CardMismatch,
    ConfirmationCard,
    card_values,
    quote_for_card,
)

log = logging.getLogger("quorumgate.notify")

BLOCK_READ_S = 5.0  # one replica's answer for one committed block
CARD_READ_S = 10.0  # f+1 sidecars' receipts and card for one pending proposal
CARD_LINK_PREFIX = "#card-"  # the console's anchor of a card: docs/console.md, "Deep links"
NOTICE_TYPE = "quorumgate.card.opened"


@dataclass(frozen=True, repr=False)
class Notice:
    """One open card, as the principal's console would show it. `values` are the call's
    arguments as the card shows them: a plain value quoted, an envelope's handle, never a
    sealed value (the notifier cannot open envelopes)."""

    chain_id: str
    card: ConfirmationCard
    values: tuple[tuple[str, str], ...]
    height: int  # where the pending verdict was certified: the resume point

    @property
    def digest(self) -> str:
        return self.card.digest.hex()

    @property
    def principal(self) -> str:
        """The principal the card waits for ('' for the owner's cards)."""
        confirmer = self.card.confirmer
        return (
            confirmer.removeprefix(PRINCIPAL_PREFIX)
            if confirmer.startswith(PRINCIPAL_PREFIX)
            else ""
        )

    def link(self, console_url: str) -> str:
        """The console, opened on this card: it only shows it; the answer is signed there."""
        return console_url + CARD_LINK_PREFIX + self.card.proposal_id.hex()

    def target(self) -> str:
        head = self.card.canonical_target.split("\n")[0]
        return quote_for_card(head.removeprefix(self.card.tool + " "))

    def document(self, console_url: str) -> dict[str, Any]:
        """The webhook's JSON body: what the card shows, and the console's link; nothing a
        confirmation could be made of (no key, signature, token or transaction)."""
        card = self.card
        shown = [
            {"name": n, "value": v if v.startswith(HANDLE_VALUE_PREFIX) else quote_for_card(v)}
            for n, v in self.values
        ]
        return {
            "type": NOTICE_TYPE,
            "chain": self.chain_id,
            "card_digest": self.digest,
            "proposal": card.proposal_id.hex(),
            "principal": self.principal,
            "tool": card.tool,
            "target": self.target(),
            "requested_by": card.principal,
            "arguments": shown,
            "expires_at_ms": card.expires_at_ms,
            "text": card.render(self.values),
            "console_url": self.link(console_url),
        }

    def body(self, console_url: str) -> bytes:
        return json.dumps(self.document(console_url), sort_keys=True, ensure_ascii=True).encode()

    def __repr__(self) -> str:
        return f"Notice(tool={self.card.tool!r}, digest={self.digest[:16]})"


class CardFollower:
    """Follows the certified verdict stream from a height and yields each card that is
    still open when it is read."""

    def __init__(self, spec: ClusterSpec, client: Client) -> None:
        self.spec = spec
        self.client = client

    async def start_height(self, back: int) -> int:
        """`back` heights below what f+1 sidecars have executed: where a first run begins."""
        statuses = await self.client.sidecar_status()
        heights = sorted((s.executed_height for s in statuses.values()), reverse=True)
        agreed = heights[self.spec.f] if len(heights) > self.spec.f else 0
        return max(1, agreed - back)

    async def follow(
        self, from_height: int, idle_s: float, known: Callable[[bytes], bool]
    ) -> AsyncIterator[tuple[int, Notice | None]]:
        """(height, notice) for every certified verdict from `from_height` on, until no
        sidecar sends anything for `idle_s`: the notice when it is a card that is open now
        and not `known` (by digest: already announced), else None (so the caller can
        advance)."""
        verdicts = self.client.certified_verdicts(from_height, idle_s=idle_s)
        async with contextlib.aclosing(verdicts):
            async for decision in verdicts:
                notice = None
                digest = decision.certificate.leaf.card_digest
                if decision.outcome is Outcome.PENDING and digest and not known(digest):
                    notice = await self.open_card(decision)
                yield decision.height, notice

    async def open_card(self, pending: Decision) -> Notice | None:
        """The card of a certified pending verdict, if it is still open and its proposal
        reads back; None otherwise (answered, expired, or not readable)."""
        leaf = pending.certificate.leaf
        try:
            newest = await self.client.await_certificate(pending.proposal_id, CARD_READ_S)
        except QuorumGateError as err:
            log.info("event=card_unreadable reason=%s", err.reason)
            return None
        card = newest.card
        if not newest.pending or card is None or card.digest != leaf.card_digest:
            return None  # answered meanwhile, or a newer card for the proposal follows
        if card.expires_at_ms <= int(time.time() * 1000):
            return None
        transaction = await self._transaction(leaf.height, leaf.index)
        if transaction is None:
            log.info("event=proposal_unreadable height=%d", leaf.height)
            return None
        try:
            values = card_values(card, transaction)
        except CardMismatch:
            log.warning("event=proposal_mismatch height=%d", leaf.height)
            return None
        return Notice(self.spec.chain_id, card, values, pending.height)

    def _auth(self, method: str) -> tuple[tuple[str, str], ...]:
        key = self.client.key
        return read_auth_metadata(
            self.spec.chain_id,
            method,
            bytes(key.verify_key),
            lambda message: bytes(key.sign(message).signature),
            int(time.time() * 1000),
        )

    async def _transaction(self, height: int, index: int) -> bytes | None:
        """Transaction `index` of the committed block at `height`, from the first replica
        that returns that block (`card_values` then checks it against the card)."""
        from quorumgate.replica.wire import decode_block

        for stub in self.client.pool.get().replicas:
            call = stub.CommittedBlocks(
                cpb.BlocksRequest(from_height=height),
                timeout=BLOCK_READ_S,
                metadata=self._auth(METHOD_COMMITTED_BLOCKS),
            )
            try:
                async for reply in call:
                    block = decode_block(self.spec.chain_id, reply.block.SerializeToString())
                    if block.height == height and block.hash == reply.hash:
                        payload = list(block.payload)
                        return payload[index] if 0 <= index < len(payload) else None
                    break
            except (grpc.RpcError, ValueError):
                continue
            finally:
                call.cancel()
        return None
