"""The mempool: signed transactions waiting for a block (docs/sidecar.md on admission).

It is the replica's `PayloadSource` (replica/core.py) and the client API's admission
desk. Like the core it is pure: no asyncio, no clock, no randomness; the same calls in the
same order give the same answers and the same batches.

What it promises:

- **Verified once.** `admit` checks a transaction's Ed25519 signature exactly once, on
  entry. Resubmitting the identical bytes while they are pending is answered with the same
  transaction id and costs no verification. `check` skips verification for transactions
  it already holds or verified recently (a bounded cache of their SHA-256 digests).
- **Replays refused, by the engine's rule.** A transaction is `(signer, nonce)`, and its id
  is derived from exactly that (proto/tx.py). The governance engine refuses a
  nonce as `replayed` with `NonceWindow.is_fresh` (proto/nonces.py): at or below
  the signer's low-water mark, beyond `low_water + nonce_window`, or already executed.
  The mempool keeps the *same* `NonceWindow` per signer and feeds it the committed log the
  way the engine does (`on_commit`), so while it has seen every commit since genesis it
  refuses exactly the nonces the engine would refuse as replayed.
- **Bounded.** Pending transactions (count, bytes, per signer), replay windows (signers
  and nonces held), the verified cache and the cache of block transaction ids each have a
  named maximum in `MempoolLimits`.
- **Fair.** `take` serves signers round-robin, each signer's transactions in nonce order,
  and rotates the order between batches, so one busy signer cannot starve the others.
- **Remote garbage is an answer, not an exception.** `admit` and `check` never raise on
  bad bytes (a peer's garbage is counted, never trusted); a broken internal invariant is
  an assertion, our own bug.

The engine stays the authority on replays. The mempool's replay memory is an early,
cheap refusal, and it is bounded: windows are evicted least-recently-committed first. Once
a window has been evicted (or when the mempool starts without the history since genesis:
`complete_history=False`), it can no longer know a signer's low-water mark, so for
signers it meets afterwards it keeps a *partial* window that refuses only nonces it saw
committed. That is never stricter than the engine about a nonce that was never committed,
and may let through a replay that the engine then refuses at execution.

One deliberate difference from the engine: the engine keeps windows only for registered
signers (an unknown signer's transaction is refused `unknown_signer` without consuming its
nonce), while the mempool cannot see the registry and records every committed
`(signer, nonce)`. A signer whose transactions were committed before it was registered may
therefore find those nonces refused here as `replayed` although the engine would now run
them; their ids already have a verdict in the log, so a fresh nonce is the right answer.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from quorumgate.proto import limits as engine_limits
from quorumgate.proto.canonical import sha256
from quorumgate.proto.domains import RECONFIG_RECORD
from quorumgate.proto.membership import (
    ENTRY_KINDS,
    MemberEntryError,
    OwnerRecords,
    is_record,
    record_entries,
)
from quorumgate.proto.model import Reason
from quorumgate.proto.nonces import NonceWindow
from quorumgate.proto.tls import certificate_problem, tls_key_problem
from quorumgate.proto.tx import ParsedTx, TxRejected, parse
from quorumgate.replica.types import Block

# gRPC status names the client API answers with (grpc.StatusCode.<name>).
STATUS_OK = "OK"
STATUS_INVALID_ARGUMENT = "INVALID_ARGUMENT"
STATUS_FAILED_PRECONDITION = "FAILED_PRECONDITION"
STATUS_ALREADY_EXISTS = "ALREADY_EXISTS"
STATUS_RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

# Admission reasons. Those shared with the engine use the engine's spelling (model.Reason).
OK = "ok"
MALFORMED = str(Reason.MALFORMED)
BAD_SIGNATURE = str(Reason.BAD_SIGNATURE)
TOO_LARGE = "too_large"
WRONG_CHAIN = str(Reason.WRONG_CHAIN)
REPLAYED = str(Reason.REPLAYED)
CONFLICTING_NONCE = "conflicting_nonce"
MEMPOOL_FULL = "mempool_full"
SIGNER_FULL = "signer_full"
# A `replace` record the owner signed whose member entry does not check (docs/consensus/
# epochs.md, "The record"): committed, it would change nothing.
BAD_MEMBER_ENTRY = "bad_member_entry"

# Block-check reasons (besides too_large, malformed, bad_signature and wrong_chain).
DUPLICATE_TX = "duplicate_tx"

STATUS_OF_REASON: dict[str, str] = {
    OK: STATUS_OK,
    MALFORMED: STATUS_INVALID_ARGUMENT,
    BAD_SIGNATURE: STATUS_INVALID_ARGUMENT,
    TOO_LARGE: STATUS_INVALID_ARGUMENT,
    WRONG_CHAIN: STATUS_FAILED_PRECONDITION,
    REPLAYED: STATUS_ALREADY_EXISTS,
    # The id (signer, nonce) is taken by another pending transaction: it exists already.
    CONFLICTING_NONCE: STATUS_ALREADY_EXISTS,
    # Back-pressure: the client should retry later (or, for signer_full, slow down).
    MEMPOOL_FULL: STATUS_RESOURCE_EXHAUSTED,
    SIGNER_FULL: STATUS_RESOURCE_EXHAUSTED,
    BAD_MEMBER_ENTRY: STATUS_INVALID_ARGUMENT,
}

# Fixed texts: a detail never echoes anything from the transaction (arguments may be
# secrets until sealed, docs/security/threat-model.md), only which rule it broke.
_DETAIL_OF_REASON: dict[str, str] = {
    MALFORMED: "not a canonical SignedTx carrying a valid TxBody",
    BAD_SIGNATURE: "signature does not verify",
    TOO_LARGE: "transaction over tx_bytes_max",
    WRONG_CHAIN: "transaction is for another chain",
    REPLAYED: "nonce already executed or outside the signer's replay window",
    CONFLICTING_NONCE: "another transaction with this signer and nonce is pending",
    MEMPOOL_FULL: "mempool full, retry later",
    SIGNER_FULL: "too many pending transactions for this signer, retry later",
    BAD_MEMBER_ENTRY: "the replace record's member entry does not parse or does not name "
    "the record's member and key",
}

_REASON_OF_REJECTION: dict[Reason, str] = {
    Reason.MALFORMED: MALFORMED,
    Reason.BAD_SIGNATURE: BAD_SIGNATURE,
}


@dataclass(frozen=True, slots=True)
class MempoolLimits:
    """Every bound of the mempool, named (TIGER_STYLE: a limit on everything)."""

    # Pending transactions: in all, in bytes, and per signer.
    txs_max: int = 50_000
    bytes_max: int = 64 * 1024 * 1024
    per_signer_txs_max: int = 4_096
    # One transaction, whole SignedTx bytes: the same number as replica Limits.tx_bytes_max.
    tx_bytes_max: int = 64 * 1024
    # Must equal the engine's EngineConfig.nonce_window, or the two disagree on replays.
    nonce_window: int = engine_limits.NONCE_WINDOW
    # Replay windows kept (least recently committed evicted first), and the executed
    # nonces they may hold above their low-water marks, all windows together. Eviction
    # only makes the mempool more lenient: the engine stays the authority on replays.
    signers_tracked_max: int = 100_000
    window_nonces_max: int = 1_048_576
    # SHA-256 digests of transactions whose signatures `check` or `precheck` verified (LRU).
    verified_cache_max: int = 65_536
    # Transaction ids of blocks seen by `check` or `take`, so that `take` need not parse
    # the uncommitted chain at every proposal (FIFO; a miss costs a parse, not safety).
    block_ids_cached_max: int = 64

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"mempool limit {name} must be a positive integer")
        if self.tx_bytes_max > self.bytes_max:
            raise ValueError("tx_bytes_max must not exceed bytes_max")
        if self.tx_bytes_max > engine_limits.TX_BYTES_MAX:
            raise ValueError(f"tx_bytes_max must not exceed {engine_limits.TX_BYTES_MAX}")
        if self.per_signer_txs_max > self.txs_max:
            raise ValueError("per_signer_txs_max must not exceed txs_max")
        if self.window_nonces_max < self.nonce_window:
            raise ValueError("window_nonces_max must hold at least one full nonce_window")


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to one submission. `status` is the gRPC status name for the client API;
    `tx_id` is the transaction (proposal) id whenever the signer and nonce were learnt."""

    accepted: bool
    tx_id: bytes | None
    reason: str
    detail: str
    status: str


# The signer a pending reconfiguration record is filed under: not a 32-byte key, so no
# transaction's signer is ever it. A record's "nonce" is the epoch it ends, plus one
# (nonces start at 1), so one record per epoch is pending at a time.
RECORD_SIGNER = RECONFIG_RECORD


@dataclass(frozen=True, slots=True)
class RecordTx:
    """A reconfiguration record the owner signed, as the mempool files it: its id is the
    SHA-256 of its bytes (docs/consensus/epochs.md, "Who may change the member set")."""

    tx_id: bytes
    signer: bytes
    nonce: int


def _record_epoch(nonce: int) -> int:
    """The epoch a pending record ends, from the nonce it is filed under."""
    return nonce - 1


@dataclass(frozen=True, slots=True)
class _Entry:
    data: bytes
    tx_id: bytes
    signer: bytes
    nonce: int


class _SignerQueue:
    """One signer's pending transactions, in nonce order."""

    __slots__ = ("by_nonce", "nonces")

    def __init__(self) -> None:
        self.nonces: list[int] = []  # sorted
        self.by_nonce: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self.nonces)

    def add(self, entry: _Entry) -> None:
        assert entry.nonce not in self.by_nonce, "one pending transaction per (signer, nonce)"
        bisect.insort(self.nonces, entry.nonce)
        self.by_nonce[entry.nonce] = entry

    def remove(self, nonce: int) -> None:
        del self.by_nonce[nonce]
        index = bisect.bisect_left(self.nonces, nonce)
        assert self.nonces[index] == nonce, "queue nonces and entries disagree"
        del self.nonces[index]


class _AnchoredWindow:
    """A signer whose every commit this mempool saw: the engine's own `NonceWindow`."""

    __slots__ = ("nonces", "window")

    def __init__(self, window: int) -> None:
        self.nonces = NonceWindow()
        self.window = window

    def replayed(self, nonce: int) -> bool:
        return not self.nonces.is_fresh(nonce, self.window)

    def record(self, nonce: int) -> None:
        # Exactly the engine's step (sidecar/engine/core.py `_execute_tx`): a nonce that
        # is not fresh is refused there and changes nothing.
        if self.nonces.is_fresh(nonce, self.window):
            self.nonces.record(nonce, self.window)

    @property
    def held(self) -> int:
        return len(self.nonces.executed)


class _PartialWindow:
    """A signer met after history was lost: its low-water mark is unknown.

    It remembers only nonces it saw committed (the highest `window` of them), each of
    which already has a verdict in the log. It never refuses a nonce that was not
    committed, so it is never stricter than the engine about one.
    """

    __slots__ = ("committed", "window")

    def __init__(self, window: int) -> None:
        self.committed: list[int] = []  # sorted
        self.window = window

    def replayed(self, nonce: int) -> bool:
        index = bisect.bisect_left(self.committed, nonce)
        return index < len(self.committed) and self.committed[index] == nonce

    def record(self, nonce: int) -> None:
        if self.replayed(nonce):
            return
        bisect.insort(self.committed, nonce)
        if len(self.committed) > self.window:
            del self.committed[0]

    @property
    def held(self) -> int:
        return len(self.committed)


_Window = _AnchoredWindow | _PartialWindow


class Mempool:
    """Pending transactions of one chain; see the module docstring for the promises.

    `complete_history` says that every block committed since genesis will reach
    `on_commit` (a new chain, or a restart that replays its committed log into the
    mempool). Pass False otherwise: replay refusal then covers only what this mempool saw
    committed, and the engine refuses the rest at execution.
    """

    def __init__(
        self,
        chain_id: str,
        limits: MempoolLimits = MempoolLimits(),
        *,
        complete_history: bool = True,
        owner_records: OwnerRecords | None = None,
    ) -> None:
        """`owner_records`: the chain runs epochs, and records its owner signed are taken
        in and voted for (else a record is malformed, as any bytes that are not a tx)."""
        self.chain_id = chain_id
        self.owner_records = owner_records
        # The epoch the replica runs (`enter_epoch`): a record is proposed only in the
        # epoch it ends, and one for an epoch that ended is spent.
        self.epoch = 0
        # The TLS certificates of the epoch's members, in member order (the replica sets
        # them at each core start): a member entry's new certificate must not reuse their
        # keys. Empty: not checked (a mempool outside a replica).
        self.certificates: tuple[bytes, ...] = ()
        self.limits = limits
        self._complete_history = complete_history
        # Pending transactions: by id in arrival order (for `recent`), by exact bytes (for
        # idempotent resubmission and skipping verification), by signer in round-robin
        # order (for `take`).
        self._by_id: dict[bytes, _Entry] = {}
        self._by_data: dict[bytes, _Entry] = {}
        self._queues: dict[bytes, _SignerQueue] = {}
        self._bytes = 0
        # Replay windows, least recently committed first.
        self._windows: dict[bytes, _Window] = {}
        self._window_nonces = 0
        # Verified transaction digests (LRU) and block transaction ids (FIFO).
        self._verified: dict[bytes, None] = {}
        self._block_ids: dict[bytes, frozenset[bytes]] = {}
        # Metrics.
        self.accepted = 0
        self.resubmitted = 0
        self.signatures_verified = 0  # Ed25519 checks of transactions made here
        self.signatures_cached = 0  # checks skipped: these bytes were verified before
        self.refused: Counter[str] = Counter()
        self.blocks_refused: Counter[str] = Counter()
        self.windows_evicted = 0

    # ------------------------------------------------------------------ admission

    def admit(self, data: bytes) -> Admission:
        """Take one submitted transaction in, or say why not (never raises on bad bytes)."""
        checked = self.precheck(data)
        if isinstance(checked, Admission):
            return checked
        return self.admit_checked(data, checked)

    def precheck(self, data: bytes) -> Admission | ParsedTx | RecordTx:
        """Everything `admit` checks, the signature included, without taking it in: the
        parsed transaction if it may go on, else the answer. Identical bytes already
        pending are answered at once (their signature was verified on entry)."""
        data = bytes(data)
        if len(data) > self.limits.tx_bytes_max:
            return self._refuse(TOO_LARGE, None)
        known = self._by_data.get(data)
        if known is not None:
            self.resubmitted += 1
            return Admission(True, known.tx_id, OK, "already pending", STATUS_OK)
        if self.owner_records is not None and is_record(data):
            record = self._read_record(data)
            if record is None:
                return self._refuse(BAD_SIGNATURE, None)
            if not self._entries_check(data):
                return self._refuse(BAD_MEMBER_ENTRY, record.tx_id)
            return record
        try:
            parsed = self._parse_once(data)
        except TxRejected as exc:
            return self._refuse(_rejection_reason(exc), None)
        if parsed.body.chain_id != self.chain_id:
            return self._refuse(WRONG_CHAIN, parsed.tx_id)
        return parsed

    def _read_record(self, data: bytes) -> RecordTx | None:
        """`data` as a record the owner signed, or None (unsigned, badly signed, not a
        record that parses exactly)."""
        assert self.owner_records is not None, "records are read on chains with epochs only"
        read = self.owner_records.read(data)
        if read is None:
            return None
        return RecordTx(sha256(data), RECORD_SIGNER, read[1] + 1)

    def _entries_check(self, data: bytes) -> bool:
        """Whether an owner-signed record's member entries, if its kind carries them,
        parse and name its member and key (`record_entries`). Only the door checks this:
        a block carrying such a record is not refused, since it commits to no change."""
        assert self.owner_records is not None, "records are read on chains with epochs only"
        read = self.owner_records.read(data)
        if read is None or read[0].kind not in ENTRY_KINDS:
            return True
        try:
            entries = record_entries(read[0])
        except MemberEntryError:
            return False
        # The X.509 check the core does not make (proto/membership.py `_check_pem_shape`):
        # a certificate naming the member, whose key no member's certificate of the epoch
        # holds (another member's would let it serve as this one; the member's own is a
        # TLS rotation that rotates nothing). A `replace` whose entry keeps the member's
        # certificate (only its address moves) is taken as before.
        for e in entries:
            if not e.tls_cert:
                continue
            if certificate_problem(e.tls_cert, e.index) is not None:
                return False
            held = self.certificates
            if e.index < len(held) and held[e.index] == e.tls_cert:
                continue
            if tls_key_problem(e.tls_cert, e.index, held) is not None:
                return False
        return True

    def admit_checked(self, data: bytes, parsed: ParsedTx | RecordTx) -> Admission:
        """Take in a transaction `precheck` passed (its signature is not checked again).
        The pool may have changed since, so replay, conflict and room are checked here."""
        data = bytes(data)
        known = self._by_data.get(data)
        if known is not None:
            self.resubmitted += 1
            return Admission(True, known.tx_id, OK, "already pending", STATUS_OK)
        tx_id = parsed.tx_id
        signer, nonce = parsed.signer, parsed.nonce
        if isinstance(parsed, RecordTx) and _record_epoch(nonce) < self.epoch:
            # Its epoch ended (with it or with another record): a copy offered again, say
            # by a client whose acknowledgement was lost, would be committed for nothing.
            return self._refuse(REPLAYED, tx_id)
        if self.replayed(signer, nonce):
            return self._refuse(REPLAYED, tx_id)
        if tx_id in self._by_id:
            return self._refuse(CONFLICTING_NONCE, tx_id)
        queue = self._queues.get(signer)
        if queue is not None and len(queue) >= self.limits.per_signer_txs_max:
            return self._refuse(SIGNER_FULL, tx_id)
        if (
            len(self._by_id) >= self.limits.txs_max
            or self._bytes + len(data) > self.limits.bytes_max
        ):
            return self._refuse(MEMPOOL_FULL, tx_id)
        entry = _Entry(data, tx_id, signer, nonce)
        if queue is None:
            queue = self._queues[signer] = _SignerQueue()
        queue.add(entry)
        self._by_id[tx_id] = entry
        self._by_data[data] = entry
        self._bytes += len(data)
        self.accepted += 1
        return Admission(True, tx_id, OK, "", STATUS_OK)

    def enter_epoch(self, epoch: int, owner_records: OwnerRecords | None = None) -> None:
        """The replica runs `epoch` from now on: pending records of earlier epochs leave
        (they would change nothing), and only a record for `epoch` is proposed.
        `owner_records`: the epoch's reader of records, whose key may differ from the
        one before after an owner rotation (docs/consensus/epochs.md, "The record key");
        None keeps the reader."""
        assert epoch >= self.epoch, "epochs only advance"
        self.epoch = epoch
        if owner_records is not None:
            self.owner_records = owner_records
        queue = self._queues.get(RECORD_SIGNER)
        if queue is None:
            return
        for nonce in [n for n in queue.nonces if _record_epoch(n) < epoch]:
            self._remove(queue.by_nonce[nonce].tx_id)
        # A record signed with the key an owner rotation retired leaves too: voters of
        # this epoch refuse it as unsigned.
        reader = self.owner_records
        if reader is not None:
            for nonce in [n for n in queue.nonces if reader.read(queue.by_nonce[n].data) is None]:
                self._remove(queue.by_nonce[nonce].tx_id)

    def replayed(self, signer: bytes, nonce: int) -> bool:
        """Whether `admit` refuses `(signer, nonce)` as replayed (see the module docstring)."""
        window = self._windows.get(signer)
        if window is not None:
            return window.replayed(nonce)
        if self._complete_history:
            # Never committed: the engine's window for it is still the empty one.
            return not NonceWindow().is_fresh(nonce, self.limits.nonce_window)
        return False

    def _refuse(self, reason: str, tx_id: bytes | None) -> Admission:
        self.refused[reason] += 1
        return Admission(False, tx_id, reason, _DETAIL_OF_REASON[reason], STATUS_OF_REASON[reason])

    # ------------------------------------------------------------------ PayloadSource

    def pending(self) -> bool:
        return bool(self._by_id)

    def take(self, chain: Sequence[Block], txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        """A batch for a block extending `chain` (uncommitted ancestors, oldest first).

        Round-robin over signers, each signer's transactions in nonce order, leaving out
        what `chain` already carries. A signer whose next transaction does not fit the
        remaining bytes is done for this batch (a later nonce never jumps an earlier one).
        Nothing is removed: transactions leave on commit. The signers served in the last
        round move to the back of the order, so the next batch starts with the others.
        """
        assert txs_max >= 0 and bytes_max >= 0, "negative batch limits"
        in_chain = self._chain_ids(chain)
        batch: list[bytes] = []
        bytes_left = bytes_max
        positions = dict.fromkeys(self._queues, 0)
        active = list(self._queues)
        last_served: list[bytes] = []
        while active and len(batch) < txs_max:
            still_active: list[bytes] = []
            for signer in active:
                if len(batch) >= txs_max:
                    break
                queue = self._queues[signer]
                position = positions[signer]
                while (
                    position < len(queue.nonces)
                    and queue.by_nonce[queue.nonces[position]].tx_id in in_chain
                ):
                    position += 1
                if position == len(queue.nonces):
                    continue
                entry = queue.by_nonce[queue.nonces[position]]
                if len(entry.data) > bytes_left:
                    continue
                if signer == RECORD_SIGNER and _record_epoch(entry.nonce) != self.epoch:
                    continue  # a record for a later epoch waits for it
                batch.append(entry.data)
                bytes_left -= len(entry.data)
                positions[signer] = position + 1
                still_active.append(signer)
            if still_active:
                last_served = still_active
            active = still_active
        for signer in last_served:
            self._queues[signer] = self._queues.pop(signer)
        assert len(batch) <= txs_max and bytes_max - bytes_left == sum(map(len, batch))
        return tuple(batch)

    def check(self, block: Block) -> str | None:
        """None if every transaction of `block` may be voted for, else a short reason.

        Each must be within tx_bytes_max, parse, carry a valid signature (not re-checked
        for transactions pending here or verified recently) and be for this chain; no
        transaction id may appear twice. Replays across blocks are the engine's to refuse:
        replay windows differ between replicas, and a vote must not depend on them.
        """
        reason = self._check(block)
        if reason is not None:
            self.blocks_refused[reason] += 1
        return reason

    def _check(self, block: Block) -> str | None:
        seen: set[bytes] = set()
        for data in block.payload:
            if len(data) > self.limits.tx_bytes_max:
                return TOO_LARGE
            entry = self._by_data.get(data)
            if entry is not None:
                tx_id = entry.tx_id
            elif self.owner_records is not None and is_record(data):
                record = self._read_record(data)
                if record is None:
                    return BAD_SIGNATURE
                tx_id = record.tx_id
            else:
                try:
                    parsed = self._parse_once(data)
                except TxRejected as exc:
                    return _rejection_reason(exc)
                if parsed.body.chain_id != self.chain_id:
                    return WRONG_CHAIN
                tx_id = parsed.tx_id
            if tx_id in seen:
                return DUPLICATE_TX
            seen.add(tx_id)
        self._remember_block_ids(block.hash, frozenset(seen))
        return None

    # ------------------------------------------------------------------ commits

    def on_commit(self, blocks: Sequence[Block]) -> None:
        """Committed blocks, oldest first: their transactions leave, their nonces are spent.

        Each transaction goes through the engine's steps in block order (parse, chain,
        fresh nonce, record), so the windows end up as the engine's. Signatures are not
        checked again: a committed block carries a quorum certificate, so at least one
        honest replica checked every signature in it.
        """
        for block in blocks:
            self._block_ids.pop(block.hash, None)
            for data in block.payload:
                if self.owner_records is not None and is_record(data):
                    self._remove(sha256(data))  # a record spends no nonce
                    continue
                entry = self._by_data.get(data)
                if entry is not None:
                    tx_id, signer, nonce = entry.tx_id, entry.signer, entry.nonce
                else:
                    try:
                        parsed = parse(data, verify=False)
                    except TxRejected:
                        continue  # refused by the engine too, without spending a nonce
                    if parsed.body.chain_id != self.chain_id:
                        continue
                    tx_id, signer, nonce = parsed.tx_id, parsed.signer, parsed.nonce
                # Whatever its bytes, a pending transaction with this id is now spent.
                self._remove(tx_id)
                self._record(signer, nonce)

    def _remove(self, tx_id: bytes) -> None:
        entry = self._by_id.pop(tx_id, None)
        if entry is None:
            return
        del self._by_data[entry.data]
        queue = self._queues[entry.signer]
        queue.remove(entry.nonce)
        if not queue:
            del self._queues[entry.signer]
        self._bytes -= len(entry.data)
        assert self._bytes >= 0, "pending byte count went negative"

    def _record(self, signer: bytes, nonce: int) -> None:
        window = self._windows.pop(signer, None)
        if window is None:
            window = (
                _AnchoredWindow(self.limits.nonce_window)
                if self._complete_history
                else _PartialWindow(self.limits.nonce_window)
            )
        before = window.held
        window.record(nonce)
        self._window_nonces += window.held - before
        self._windows[signer] = window  # most recently committed last
        while (
            len(self._windows) > self.limits.signers_tracked_max
            or self._window_nonces > self.limits.window_nonces_max
        ):
            oldest = next(iter(self._windows))
            assert oldest != signer or len(self._windows) == 1
            self._window_nonces -= self._windows.pop(oldest).held
            self.windows_evicted += 1
            # From now on a signer without a window may be one that was evicted, whose
            # low-water mark is lost: new windows can only be partial.
            self._complete_history = False

    # ------------------------------------------------------------------ caches

    def _parse_once(self, data: bytes) -> ParsedTx:
        """`parse`, with the signature verified only for bytes this replica has not
        verified before (in a block it checked, or on admission: a copy gossiped again
        after it committed here is not checked twice). Raises TxRejected."""
        digest = sha256(data)
        verified = digest in self._verified
        parsed = parse(data, verify=not verified)
        if verified:
            self.signatures_cached += 1
            self._verified[digest] = self._verified.pop(digest)  # most recent
        else:
            self.signatures_verified += 1
            self._remember_verified(digest)
        return parsed

    def _remember_verified(self, digest: bytes) -> None:
        self._verified[digest] = None
        if len(self._verified) > self.limits.verified_cache_max:
            del self._verified[next(iter(self._verified))]

    def _remember_block_ids(self, block_hash: bytes, ids: frozenset[bytes]) -> None:
        self._block_ids.pop(block_hash, None)
        self._block_ids[block_hash] = ids
        if len(self._block_ids) > self.limits.block_ids_cached_max:
            del self._block_ids[next(iter(self._block_ids))]

    def _chain_ids(self, chain: Iterable[Block]) -> set[bytes]:
        ids: set[bytes] = set()
        for block in chain:
            cached = self._block_ids.get(block.hash)
            if cached is None:
                cached = frozenset(self._payload_ids(block.payload))
                self._remember_block_ids(block.hash, cached)
            ids |= cached
        return ids

    def _payload_ids(self, payload: Iterable[bytes]) -> Iterable[bytes]:
        for data in payload:
            entry = self._by_data.get(data)
            if entry is not None:
                yield entry.tx_id
                continue
            if self.owner_records is not None and is_record(data):
                yield sha256(data)
                continue
            try:
                yield parse(data, verify=False).tx_id
            except TxRejected:
                continue  # a transaction that never executes spends no id

    # ------------------------------------------------------------------ gossip, metrics

    def recent(self, limit: int) -> list[bytes]:
        """Up to `limit` pending transactions, oldest first, for gossip re-broadcast."""
        assert limit >= 0, "negative limit"
        return [entry.data for entry in islice(self._by_id.values(), limit)]

    @property
    def size(self) -> int:
        """Pending transactions."""
        return len(self._by_id)

    @property
    def signers_tracked(self) -> int:
        return len(self._windows)

    @property
    def window_nonces(self) -> int:
        return self._window_nonces

    @property
    def verified_cached(self) -> int:
        return len(self._verified)

    @property
    def blocks_cached(self) -> int:
        return len(self._block_ids)

    def forget_history(self) -> None:
        """The committed log now starts at a base taken from a peer (replica/base.py,
        docs/pruning.md): what committed below it never reached this mempool, so no
        window can claim a signer's low-water mark, and every window from here on is
        partial (the module docstring)."""
        self._windows.clear()
        self._window_nonces = 0
        self._complete_history = False

    @property
    def complete_history(self) -> bool:
        """Whether absent windows still mean "never committed" (no eviction, full log)."""
        return self._complete_history

    def assert_invariants(self) -> None:
        """Check every bound and cross-index (for tests; O(size))."""
        limits = self.limits
        assert len(self._by_id) <= limits.txs_max
        assert self._bytes <= limits.bytes_max
        assert len(self._windows) <= limits.signers_tracked_max
        assert self._window_nonces <= limits.window_nonces_max
        assert len(self._verified) <= limits.verified_cache_max
        assert len(self._block_ids) <= limits.block_ids_cached_max
        assert len(self._by_data) == len(self._by_id)
        assert self._bytes == sum(len(e.data) for e in self._by_id.values())
        assert self._window_nonces == sum(w.held for w in self._windows.values())
        assert sum(len(q) for q in self._queues.values()) == len(self._by_id)
        for signer, queue in self._queues.items():
            assert 0 < len(queue) <= limits.per_signer_txs_max
            assert queue.nonces == sorted(queue.by_nonce)
            for nonce, entry in queue.by_nonce.items():
                assert (entry.signer, entry.nonce) == (signer, nonce)
                assert self._by_id[entry.tx_id] is entry is self._by_data[entry.data]
                assert not self.replayed(signer, nonce), "a spent nonce is still pending"
        for window in self._windows.values():
            assert window.held <= limits.nonce_window

    # Last in the class body: a method named `bytes` would shadow the type in annotations.
    @property
    def bytes(self) -> int:
        """Bytes of pending transactions."""
        return self._bytes


def _rejection_reason(exc: TxRejected) -> str:
    reason = _REASON_OF_REJECTION.get(exc.reason)
    assert reason is not None, f"parse rejects only as malformed or bad_signature: {exc.reason}"
    return reason
