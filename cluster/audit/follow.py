"""Reading f+1 sidecars for the shipper (docs/audit.md): their status, a page of each one's
ledger, and the signed receipts that certify it. Every read is signed as the shipper's key
(an auditor's or the owner's: runtime/readauth.py); what any one sidecar says counts only
as one vote."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from nacl.signing import SigningKey

from quorumgate.audit.records import (
    SHIP_BATCH_VERDICTS_MAX,
    Cursor,
    ShippedVerdict,
    agreed_entries,
    leaf_matches,
    linked_prefix,
)
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.readauth import METHOD_LEDGER, METHOD_RECEIPTS, read_auth_metadata
from quorumgate.sdk.certificates import (
    certified_leaf,
    receipt_or_none,
    receipt_signature_ok,
    statement_key,
)
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.receipts import (
    PATH_HASHES_MAX,
    Certificate,
    CertificateError,
    Receipt,
    ReceiptEpochs,
    assemble_certificate,
    receipt_keys_at,
    root_from_path,
)

SIDECAR_READ_S = 5.0  # one sidecar's answer to one read, or its receipts for one page

# Asks the replicas for the chain of epochs and returns each epoch's heights and receipt
# keys as checked (`Client.epochs().receipt_epochs`); raises when it cannot.
LearnEpochs = Callable[[], Awaitable[ReceiptEpochs]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a sidecar's answer, or a verdict, was not taken."""

    sidecar: int  # -1: not one sidecar's fault (no f+1 agreement)
    reason: str  # one of a few fixed phrases: the metric's label
    detail: str = ""


@dataclass
class Round:
    """What one round of reads found: the certified verdicts to ship, in ledger order, and
    the refusals on the way."""

    verdicts: list[ShippedVerdict] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    executed: int = 0  # the height f+1 sidecars said they executed
    caught_up: bool = False  # these verdicts are all f+1 sidecars agreed on through it


class ShipEpochs:
    """The epochs the shipper checks receipts and certificates against: each epoch's
    heights and receipt keys, from the chain of epochs it checked (docs/consensus/
    epochs.md, "Receipt keys"; `Client.epochs`, the verifier the SDK and `audit verify
    --epochs` use). `through`: every epoch that ended at or below this height is known.

    Before a round certifies entries above `through` it asks the chain again (`learn`),
    after the entries were read: f+1 sidecars returned them, so at least one honest
    sidecar had executed their last height, and its replica had committed, and stored,
    every change block up to it. Entries above what the chain covers are not certified
    that round (a chain that cannot be read ships nothing new, it never falls back to the
    cluster file's keys). Without `learn` (a chain that runs no epochs) epoch 0, the
    cluster file's keys, covers every height."""

    def __init__(self, spec: ClusterSpec, learn: LearnEpochs | None = None) -> None:
        self.known = ReceiptEpochs.genesis(spec.receipt_keys)
        self.learn = learn
        self.through: int | None = None if learn is None else 0  # None: every height

    async def cover(
        self, entries: list[LedgerEntry], executed: int, refusals: list[Refusal]
    ) -> list[LedgerEntry]:
        """`entries` cut to the heights the known epochs cover, the chain asked again first
        when the last one lies above them."""
        if self.through is None or self.learn is None or not entries:
            return entries
        last = entries[-1].height
        if last > self.through:
            try:
                self.known = await self.learn()
            except Exception as error:
                # Whatever failed (fewer than f+1 answers, a refused read, no answer that
                # checks), the chain is unknown past `through`.
                refusals.append(Refusal(-1, "epochs unknown", type(error).__name__))
            else:
                self.through = max(self.through, last, executed)
        return [e for e in entries if e.height <= self.through]


class Reader:
    """Signed reads of every sidecar of one cluster. `stubs` are `SidecarStub`s by member
    index (the shipper's own channels; a test may put a stand-in in front of one). A list
    is kept as given, not copied: channels that follow the chain of epochs (a client's,
    `ChannelPool.follow`) change it in place when members move, join or leave.
    `learn`: how to read the chain of epochs (`ShipEpochs`); None on a chain that runs no
    epochs."""

    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        stubs: Sequence[Any],
        learn: LearnEpochs | None = None,
    ) -> None:
        self.spec = spec
        self.key = key
        self.stubs = stubs if isinstance(stubs, list) else list(stubs)
        self.epochs = ShipEpochs(spec, learn)

    @property
    def f(self) -> int:
        """f of the newest epoch the shipper knows (a grow to 7 makes it 2): what f+1
        agreeing sidecars count against; the cluster file's without a chain of epochs."""
        known = self.epochs.known
        return (len(known.current.keys) - 1) // 3 if known.chained else self.spec.f

    def auth(self, method: str) -> tuple[tuple[str, str], ...]:
        return read_auth_metadata(
            self.spec.chain_id,
            method,
            bytes(self.key.verify_key),
            lambda message: bytes(self.key.sign(message).signature),
            int(time.time() * 1000),
        )

    async def _each(
        self, call: Callable[[int, Any], Awaitable[Any]], refusals: list[Refusal]
    ) -> dict[int, Any]:
        async def one(i: int, stub: Any) -> tuple[int, Any]:
            try:
                return i, await asyncio.wait_for(call(i, stub), SIDECAR_READ_S)
            except (grpc.RpcError, TimeoutError, ValueError) as error:
                code = error.code().name if isinstance(error, grpc.RpcError) else "unanswered"
                refusals.append(Refusal(i, "read failed", code))
                return i, None

        done = await asyncio.gather(*(one(i, s) for i, s in enumerate(self.stubs)))
        return {i: answer for i, answer in done if answer is not None}

    async def executed_heights(self, refusals: list[Refusal]) -> dict[int, int]:
        async def status(i: int, stub: Any) -> int:
            reply = await stub.Status(spb.SidecarStatusRequest(), timeout=SIDECAR_READ_S)
            if reply.chain_id != self.spec.chain_id:
                raise ValueError("another chain")
            return int(reply.executed_height)

        return await self._each(status, refusals)

    async def ledger_pages(
        self, cursor: Cursor, refusals: list[Refusal]
    ) -> dict[int, list[LedgerEntry]]:
        """Each sidecar's entries after `cursor`, at most a batch's worth."""
        height, index = (cursor.height, cursor.index + 1) if cursor.started else (1, 0)
        # Honest sidecars send the same lines: each distinct line is parsed once, and a
        # line is the same entry only when it is the same bytes (docs/audit.md, "What the
        # shipper trusts", step 2).
        parsed: dict[str, LedgerEntry] = {}

        def entry(line: str) -> LedgerEntry:
            found = parsed.get(line)
            if found is None:
                found = parsed[line] = LedgerEntry.from_json(line)
            return found

        async def page(i: int, stub: Any) -> list[LedgerEntry]:
            request = spb.LedgerRequest(
                from_height=height, from_index=index, limit=SHIP_BATCH_VERDICTS_MAX
            )
            reply = await stub.Ledger(
                request, timeout=SIDECAR_READ_S, metadata=self.auth(METHOD_LEDGER)
            )
            return [entry(line) for line in reply.entries[:SHIP_BATCH_VERDICTS_MAX]]

        return await self._each(page, refusals)

    async def receipts(
        self, entries: Sequence[LedgerEntry], ready: set[int], refusals: list[Refusal]
    ) -> dict[int, list[Receipt]]:
        """The receipts for `entries`' places of each sidecar in `ready` (those that said
        they executed the last height: a stream to one that has not would wait), its own
        signature checked on arrival (a sidecar cannot speak for another)."""
        wanted = {(e.height, e.index) for e in entries}
        first, last = entries[0].height, entries[-1].height

        async def stream(i: int, stub: Any) -> list[Receipt]:
            found: list[Receipt] = []
            if i not in ready:
                return found
            seen: set[tuple[int, int]] = set()
            # Every leaf of a block carries the same signed statement: its signature is
            # checked once per block, not once per leaf.
            signed: set[tuple[object, ...]] = set()
            call = stub.Receipts(
                spb.ReceiptsRequest(from_height=first), metadata=self.auth(METHOD_RECEIPTS)
            )
            try:
                async for batch in call:
                    for message in batch.receipts:
                        receipt = receipt_or_none(message)
                        if receipt is None:
                            raise ValueError("a receipt that cannot be")
                        block = _block_key(receipt)
                        if block not in signed:
                            if not receipt_signature_ok(self.spec, receipt, i, self.epochs.known):
                                raise ValueError("a receipt it did not sign")
                            signed.add(block)
                        if receipt.leaf.height != receipt.block.height:
                            raise ValueError("a receipt for another height")
                        place = (receipt.leaf.height, receipt.leaf.index)
                        if place in wanted:
                            found.append(receipt)
                            seen.add(place)
                    if batch.height > last or seen == wanted:
                        break
            finally:
                call.cancel()
            return found

        return await self._each(stream, refusals)


def _block_key(receipt: Receipt) -> tuple[object, ...]:
    b = receipt.block
    return (b.signer, b.height, b.verdict_root, b.state_root, b.leaf_count, b.validity,
            b.epoch, b.signature)  # fmt: skip


def _verify(
    spec: ClusterSpec,
    cert: Certificate,
    done: set[tuple[object, ...]],
    epochs: ReceiptEpochs | None,
) -> bool:
    """`verify_certificate` against the epoch the certificate names (`epochs`), its
    signatures checked once per block statement: a further leaf under a statement already
    verified with the same signatures needs only its path."""
    statement = (cert.leaf.height, cert.verdict_root, cert.state_root, cert.leaf_count,
                 cert.validity, cert.epoch, cert.signatures)  # fmt: skip
    try:
        if statement in done:
            root = root_from_path(
                cert.leaf.hash(spec.chain_id), cert.leaf.index, cert.leaf_count, cert.path
            )
            return root == cert.verdict_root and len(cert.path) <= PATH_HASHES_MAX
        certified_leaf(spec, cert, epochs=epochs)
    except CertificateError:
        return False
    done.add(statement)
    return True


def _needed(spec: ClusterSpec, receipt: Receipt, epochs: ReceiptEpochs | None) -> int | None:
    """f+1 of the epoch `receipt`'s statement names (its receipt keys' count), None for an
    epoch, or a height, that `epochs` does not hold: such a statement certifies nothing."""
    if epochs is None:
        return spec.f + 1
    try:
        keys = receipt_keys_at(epochs, receipt.block.epoch, receipt.block.height)
    except CertificateError:
        return None
    return (len(keys) - 1) // 3 + 1


def certificates(
    spec: ClusterSpec,
    answers: dict[int, list[Receipt]],
    epochs: ReceiptEpochs | None = None,
) -> dict[tuple[int, int], Certificate]:
    """Per place, the statement f+1 distinct sidecars signed, as a certificate verified
    against its epoch's receipt keys and heights (`epochs`; without it the cluster file's
    keys in every epoch, the guarantee of a verifier without the chain)."""
    done: set[tuple[object, ...]] = set()
    groups: dict[tuple[object, ...], dict[int, Receipt]] = {}
    for signer, receipts in answers.items():
        for receipt in receipts:
            groups.setdefault(statement_key(receipt), {}).setdefault(signer, receipt)
    out: dict[tuple[int, int], Certificate] = {}
    for group in groups.values():
        needed = _needed(spec, next(iter(group.values())), epochs)
        if needed is None or len(group) < needed:
            continue
        certificate = assemble_certificate(spec.chain_id, list(group.values()))
        if _verify(spec, certificate, done, epochs):
            out[(certificate.leaf.height, certificate.leaf.index)] = certificate
    return out


def certified(
    entries: Sequence[LedgerEntry],
    certs: dict[tuple[int, int], Certificate],
    refusals: list[Refusal],
) -> list[ShippedVerdict]:
    """The entries, in order, up to the first without a certificate that says the same."""
    out: list[ShippedVerdict] = []
    for entry in entries:
        cert = certs.get((entry.height, entry.index))
        if cert is None or not leaf_matches(entry, cert.leaf):
            where = f"height {entry.height} index {entry.index}"
            refusals.append(Refusal(-1, "no certificate", where))
            break
        out.append(ShippedVerdict(entry, cert))
    return out


async def read_round(spec: ClusterSpec, reader: Reader, cursor: Cursor) -> Round:
    """The certified verdicts after `cursor` (at most a batch), and the refusals: one round
    as docs/audit.md ("What the shipper trusts") lists it, whatever the copy is (a
    PostgreSQL table or an OTLP receiver)."""
    found = Round()
    # Status and pages are asked together: one wait on the sidecars instead of two.
    heights, pages = await asyncio.gather(
        reader.executed_heights(found.refusals), reader.ledger_pages(cursor, found.refusals)
    )
    needed = reader.f + 1
    ranked = sorted(heights.values(), reverse=True)
    found.executed = ranked[needed - 1] if len(ranked) >= needed else 0
    agreed = agreed_entries(pages, needed)
    found.caught_up = len(agreed) < SHIP_BATCH_VERDICTS_MAX
    for i, page in pages.items():
        if page[: len(agreed)] != agreed[: len(page)]:
            found.refusals.append(Refusal(i, "ledger differs"))
    entries, why = linked_prefix(spec.chain_id, cursor, agreed)
    if why:
        found.refusals.append(Refusal(-1, "no link", why))
        found.caught_up = False
    linked = len(entries)
    entries = await reader.epochs.cover(entries, found.executed, found.refusals)
    if len(entries) < linked:
        found.caught_up = False
    if not entries:
        return found
    ready = {i for i, h in heights.items() if h >= entries[-1].height}
    found.verdicts = await certified_entries(spec, reader, entries, ready, pages, found.refusals)
    found.caught_up = found.caught_up and len(found.verdicts) == len(agreed)
    return found


async def certified_entries(
    spec: ClusterSpec,
    reader: Reader,
    entries: list[LedgerEntry],
    ready: set[int],
    pages: dict[int, list[LedgerEntry]],
    refusals: list[Refusal],
) -> list[ShippedVerdict]:
    """`entries`' certified prefix. The receipts of f+1 ready sidecars whose page held the
    entries are asked first; the other ready sidecars' only when those do not certify
    every entry (one silent or lying): a certificate needs f+1 signers whatever the
    order, so asking fewer trusts nothing more (docs/audit.md, "What the shipper
    trusts", step 4)."""
    held = [i for i in sorted(ready) if pages.get(i, [])[: len(entries)] == entries]
    first = set(held[: reader.f + 1]) if len(held) > reader.f else set(ready)
    epochs = reader.epochs.known
    answers = _answered(await reader.receipts(entries, first, refusals), first)
    certs = certificates(spec, answers, epochs)
    rest = ready - first
    if rest and len(certified(entries, certs, [])) < len(entries):
        answers.update(_answered(await reader.receipts(entries, rest, refusals), rest))
        certs = certificates(spec, answers, epochs)
    return certified(entries, certs, refusals)


def _answered(answers: dict[int, list[Receipt]], asked: set[int]) -> dict[int, list[Receipt]]:
    return {i: receipts for i, receipts in answers.items() if i in asked}
