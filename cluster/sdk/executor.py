"""The tool-executor side: run a call only with a certificate for it, at most once, and
open only the envelopes that call carries and that are sealed to this sink.

    executor = Executor(spec, "payments", sink_private_key,
                        CertifiedLogSource(spec, auditor_key), used="payments-used.db")
    call = executor.verify(certificate, proposal_id=pid, tool="pay",
                           target="https://bank.example/transfer", transaction=tx, card=card)
    card_number = executor.open_envelope(call, "card")

`verify` checks, offline and in this order: the certificate itself
(`quorumgate.sidecar.receipts.verify_certificate`: chain, Merkle path, f+1 distinct members' receipt
keys, the proposal id); that it certifies a tool call (a proposal, or the Confirm that
settled one); that the outcome is allow or flag; that the certified target digest is the
digest of `"<tool> <target>"` the executor is about to act on; that a confirmation card,
when the verdict names one, is given and is that card (digest); that the transaction, when
given, is signed, has the certified proposal id, names the same tool and is the body the
certificate binds; and last, that this executor has not run the proposal before. Anything
else is refused with a typed `ExecutorRefused`.

On a chain whose receipts expire (`ClusterSpec.receipts_expire`, every chain `init` makes
now) a certificate also carries the window in which it may be used, signed by the f+1
sidecars: from its block's time (the committed block's timestamp, which every sidecar
agrees on) to that time plus the chain's certificate TTL (an owner setting in the log,
`certificate_ttl_ms`, 5 minutes by default). Right after the certificate itself verifies,
`verify` checks the window against this executor's clock (`clock_ms`), with
`clock_skew_ms` allowed either way: `CertificateExpired` past it, or for a block time
further ahead of the clock than the skew (a clock that far behind would stretch every
window). `certificate_age_ms_max` lets one executor shorten the window for itself, never
lengthen it. So an executor that loses its record of used certificates accepts again
only what was certified within the last window: the window, not the record's lifetime,
bounds a replay (docs/security/reads-and-certificates.md).

Which envelopes a call may open is never taken from an unbound body. The handles come from
the card (bound by the certificate's card digest), or from the signed transaction when its
body hashes to a digest the certificate binds: the card's `body_digest` for a confirmed
call, the receipt leaf's `body_digest` for a direct one (a leaf for the proposal itself).
A certificate that names a card is refused without it (`card_required`): its leaf is the
Confirm's, whose body digest is not the proposal's. A transaction that neither binds is
refused (`arguments_not_bound`). So no agent can sign a second body under the same nonce
naming other handles, its own or another principal's: the certificate names the one body
that was committed and judged.

Each certificate runs once per executor: the proposal id is claimed in a `UsedProposals`
record as the last step of `verify`, after every other check passed, and a second
`verify` of the same proposal (with this certificate or another for it) is refused
(`CertificateReused`). `SqliteUsedProposals` keeps the record in a SQLite file that
survives restarts (pass its path as `used`); `MemoryUsedProposals` keeps it in memory,
for tests and in-process executors. Executors that share a record share the single use.

The sealed values come from the SealEnvelope transactions in the committed log. No sidecar
RPC serves them yet, so a `SealedValueSource` is pluggable:

- `CertifiedLogSource` replays the committed log locally (`quorumgate.sdk.log.CommittedLog`) up
  to the certificate's height and accepts the local state only if its state root equals
  the certified one: the ciphertext it returns is the one f+1 sidecars signed (handles are
  never changed once registered);
- `EngineSource` reads an `Engine` the caller runs (tests, in-process executors).
"""

from __future__ import annotations

import abc
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import names
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Outcome, Proposal
from quorumgate.proto.tx import TxRejected, parse
from quorumgate.sdk.certificates import certified_leaf, decode_card, load_certificate
from quorumgate.sdk.errors import ClusterUnavailable
from quorumgate.sdk.log import CommittedLog
from quorumgate.sdk.targets import certified_call
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.engine.targets import NO_TARGET
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    ReceiptEpochs,
    ReceiptLeaf,
    check_validity,
)

__all__ = [
    "AuthorizedCall",
    "CertificateExpired",
    "CertificateRejected",
    "CertificateReused",
    "CertifiedLogSource",
    "EngineSource",
    "EnvelopeUnopenable",
    "Executor",
    "ExecutorRefused",
    "HandleRefused",
    "MemoryUsedProposals",
    "NotAllowed",
    "SealedValueSource",
    "SqliteUsedProposals",
    "UsedProposals",
    "WrongCall",
]

CALL_KINDS = ("proposal", "confirm")
# How far this executor's clock may be from the block times the replicas agreed on, either
# way. Replicas vote only for a block time within a few seconds of their own clocks
# (replica/config.py `timestamp_skew_ms_max`), so with clocks kept by NTP half a minute is
# generous; it widens each window by as much.
CLOCK_SKEW_MS_DEFAULT = 30_000
CLOCK_SKEW_MS_MAX = 600_000


def wall_clock_ms() -> int:
    """This host's clock, in ms since the epoch: what an executor checks windows against."""
    return time.time_ns() // 1_000_000


class ExecutorRefused(Exception):
    """The executor will not run the call or open the envelope; `reason` says why. The
    text names the rule only, never an argument value or a plaintext."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"executor refused: {reason}")
        self.reason = reason


class CertificateRejected(ExecutorRefused):
    """The certificate does not verify against the cluster file."""


class NotAllowed(ExecutorRefused):
    """A valid certificate whose verdict is not allow or flag (deny, pending...)."""


class WrongCall(ExecutorRefused):
    """A valid certificate for something else: another proposal, tool, target or body."""


class HandleRefused(ExecutorRefused):
    """A handle the certified call does not carry, or not sealed to this sink."""


class EnvelopeUnopenable(ExecutorRefused):
    """The sealed value does not open with this sink's key."""


class CertificateReused(ExecutorRefused):
    """A valid certificate for a call this executor has already run."""

    def __init__(self, reason: str = "already_used") -> None:
        super().__init__(reason)


class CertificateExpired(CertificateRejected):
    """A valid certificate outside its validity window by this executor's clock:
    `expired`, or `not_yet_valid` (its block time is ahead of the clock by more than the
    skew allowed)."""


# ------------------------------------------------------------------ used certificates


class UsedProposals(Protocol):
    """The record of proposals an executor has run."""

    def claim(self, proposal_id: bytes) -> bool:
        """Mark `proposal_id` used: True the first time, atomically; False if it already
        was. Raises if the record cannot be read or written (the executor then refuses)."""
        ...


class MemoryUsedProposals:
    """Used proposals in memory: for tests and in-process executors (lost on exit)."""

    def __init__(self) -> None:
        self._used: set[bytes] = set()
        self._lock = threading.Lock()

    def claim(self, proposal_id: bytes) -> bool:
        key = bytes(proposal_id)
        with self._lock:
            if key in self._used:
                return False
            self._used.add(key)
            return True

    def __repr__(self) -> str:
        return f"MemoryUsedProposals(used={len(self._used)})"


class _ClosedOnExit(abc.ABC):
    """`with x:` closes x at the end."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class SqliteUsedProposals(_ClosedOnExit):
    """Used proposals in a SQLite file (WAL, one table keyed by the proposal id) that
    survives restarts and may be shared by executors in several processes: a claim is one
    `INSERT OR IGNORE`, committed (and synced) before `claim` returns. The file and its
    parent directory are created owner-only if missing."""

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        db = sqlite3.connect(
            self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS used_proposals "
                "(proposal_id BLOB PRIMARY KEY NOT NULL) WITHOUT ROWID"
            )
        except BaseException:
            db.close()
            raise
        self._db: sqlite3.Connection | None = db
        self._lock = threading.Lock()

    def claim(self, proposal_id: bytes) -> bool:
        with self._lock:
            if self._db is None:
                raise sqlite3.ProgrammingError("the used-proposals store is closed")
            cur = self._db.execute(
                "INSERT OR IGNORE INTO used_proposals (proposal_id) VALUES (?)",
                (bytes(proposal_id),),
            )
            return cur.rowcount == 1

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __repr__(self) -> str:
        return f"SqliteUsedProposals({str(self.path)!r})"


class SealedValueSource(Protocol):
    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        """The ciphertext of `handle` sealed to `sink`, as of the certified state."""
        ...


@dataclass(frozen=True, repr=False)
class AuthorizedCall:
    """A call the executor verified. `handles` maps argument name to handle."""

    proposal_id: bytes
    tool: str
    target: str
    outcome: Outcome
    certificate: Certificate
    handles: tuple[tuple[str, str], ...] = field(default=())
    bound_by: str = "none"  # "card", "leaf" or "none": what binds `handles`
    # the further targets, (role, canonical target), in the order `verify` was given them
    targets: tuple[tuple[str, str], ...] = field(default=())

    @property
    def flagged(self) -> bool:
        return self.outcome is Outcome.FLAG

    def __repr__(self) -> str:
        return (
            f"AuthorizedCall(tool={self.tool!r}, proposal={self.proposal_id.hex()[:16]}, "
            f"outcome={self.outcome.value}, envelopes={len(self.handles)})"
        )


class Executor(_ClosedOnExit):
    """One sink's executor: its id, its X25519 private key, where sealed values come from,
    and its record of the proposals it has run (`used`: a `UsedProposals`, or the path of a
    SQLite file, which the executor then opens and `close` closes). Holds no secret but
    the key; returns plaintexts to the caller only."""

    def __init__(
        self,
        spec: ClusterSpec,
        sink_id: str,
        private_key: PrivateKey,
        source: SealedValueSource,
        *,
        used: UsedProposals | str | os.PathLike[str],
        clock_ms: Callable[[], int] = wall_clock_ms,
        clock_skew_ms: int = CLOCK_SKEW_MS_DEFAULT,
        certificate_age_ms_max: int | None = None,
        epochs: ReceiptEpochs | None = None,
    ) -> None:
        """`clock_ms`, `clock_skew_ms` and `certificate_age_ms_max`: how certificates'
        validity windows are checked (the module docstring). `epochs`: each epoch's
        heights and receipt keys, from the chain of epochs (`Client.epochs()`'s
        `receipt_epochs`, or `load_receipt_epochs` of a `quorumgate epochs --json` file);
        without it, cluster.json's epoch 0 only. Set `receipt_epochs` again as the chain
        grows: a certificate of an epoch it does not hold is refused (`unknown_epoch`)."""
        if not names.is_agent_id(sink_id):
            raise ValueError("sink id must match " + names.AGENT_ID_RE.pattern)
        if not 0 <= clock_skew_ms <= CLOCK_SKEW_MS_MAX:
            raise ValueError(f"clock_skew_ms must be in 0..{CLOCK_SKEW_MS_MAX}")
        if certificate_age_ms_max is not None and not spec.receipts_expire:
            raise ValueError(
                "certificate_age_ms_max needs a chain whose receipts sign their block time "
                "(receipt version 2); this chain's certificates carry no window"
            )
        if certificate_age_ms_max is not None and certificate_age_ms_max <= 0:
            raise ValueError("certificate_age_ms_max must be a positive number of ms")
        self._clock_ms = clock_ms
        self.clock_skew_ms = clock_skew_ms
        self.certificate_age_ms_max = certificate_age_ms_max
        self.spec = spec
        self.receipt_epochs = epochs or ReceiptEpochs.genesis(spec.receipt_keys)
        self.sink_id = sink_id
        self._box = SealedBox(private_key)
        self.public_key = bytes(private_key.public_key)
        self.source = source
        self._owned: SqliteUsedProposals | None = None
        if isinstance(used, (str, os.PathLike)):
            self._owned = SqliteUsedProposals(used)
            used = self._owned
        self.used: UsedProposals = used

    def __repr__(self) -> str:
        return f"Executor(sink={self.sink_id!r})"

    def close(self) -> None:
        """Close the used-proposals store if the executor opened it (from a path)."""
        if self._owned is not None:
            self._owned.close()

    def verify(
        self,
        certificate: Certificate | bytes,
        *,
        proposal_id: bytes,
        tool: str,
        target: str,
        transaction: bytes | None = None,
        card: ConfirmationCard | bytes | None = None,
        targets: Sequence[tuple[str, str]] = (),
    ) -> AuthorizedCall:
        """The module docstring's checks. `target` is the target the executor acts on, in
        any spelling (`""` or `"-"` for a tool that takes none), and `targets` the further
        (role, target) pairs it acts on (every recipient, every grantee): they are
        canonicalized the chain's way by the helper governed tools use
        (`quorumgate.sdk.targets`), and the certificate must name exactly those canonical
        forms; `AuthorizedCall.target` and `.targets` are them."""
        if isinstance(certificate, bytes):
            try:
                certificate = load_certificate(certificate)
            except Exception as err:
                raise CertificateRejected("malformed") from err
        tool = names.canonical_tool_name(tool) or tool
        leaf = self._leaf(certificate, proposal_id)
        if leaf.kind not in CALL_KINDS:
            raise WrongCall("not_a_tool_call")
        if not leaf.allows:
            raise NotAllowed(leaf.outcome)
        # the one helper governed tools use too: the canonical form of `target` that the
        # certificate names, or a refusal (a raw spelling is canonicalized the chain's way)
        raw = "" if target == NO_TARGET else target
        found = certified_call(
            tool, raw, leaf.target_digest, version=self.spec.canonical_version, targets=targets
        )
        if found is None:
            raise WrongCall("target_mismatch")
        target = found[0] or NO_TARGET
        further = tuple(
            (role, canonical) for (role, _), canonical in zip(targets, found[1], strict=True)
        )
        bound_card = self._card(leaf, card, tool)
        handles: tuple[tuple[str, str], ...] = ()
        bound_by = "none"
        if transaction is not None:
            handles = self._transaction_handles(transaction, proposal_id, tool, bound_card, leaf)
            bound_by = "leaf"
        if bound_card is not None:
            handles = bound_card.handles
            bound_by = "card"
        self._claim(proposal_id)  # last: a refused call does not use the certificate up
        return AuthorizedCall(
            proposal_id=proposal_id,
            tool=tool,
            target=target,
            outcome=Outcome(leaf.outcome),
            certificate=certificate,
            handles=handles,
            bound_by=bound_by,
            targets=further,
        )

    def _leaf(self, certificate: Certificate, proposal_id: bytes) -> ReceiptLeaf:
        """The certified leaf, once the certificate verifies and, on a chain whose receipts
        expire, its window holds by this executor's clock."""
        try:
            leaf = certified_leaf(self.spec, certificate, proposal_id, self.receipt_epochs)
        except CertificateError as err:
            raise CertificateRejected(err.reason) from err
        if certificate.validity is not None:  # verified: present exactly when they expire
            try:
                check_validity(
                    certificate.validity,
                    self._clock_ms(),
                    self.clock_skew_ms,
                    age_ms_max=self.certificate_age_ms_max,
                )
            except CertificateError as err:
                raise CertificateExpired(err.reason) from err
        return leaf

    def _claim(self, proposal_id: bytes) -> None:
        try:
            fresh = self.used.claim(proposal_id)
        except (sqlite3.Error, OSError) as err:
            raise ExecutorRefused("used_store_unavailable") from err
        if not fresh:
            raise CertificateReused("already_used")

    def _card(
        self, leaf: ReceiptLeaf, card: ConfirmationCard | bytes | None, tool: str
    ) -> ConfirmationCard | None:
        if not leaf.card_digest:
            if card is not None:
                raise WrongCall("card_not_certified")
            return None
        if card is None:
            # the leaf is the Confirm's: only the card binds the call's arguments
            raise WrongCall("card_required")
        if isinstance(card, bytes):
            try:
                card = decode_card(card)
            except Exception as err:
                raise WrongCall("card_mismatch") from err
        if card.digest != leaf.card_digest or card.tool != tool:
            raise WrongCall("card_mismatch")
        if card.proposal_id != leaf.proposal_id or card.chain_id != self.spec.chain_id:
            raise WrongCall("card_mismatch")
        return card

    def _transaction_handles(
        self,
        transaction: bytes,
        proposal_id: bytes,
        tool: str,
        card: ConfirmationCard | None,
        leaf: ReceiptLeaf,
    ) -> tuple[tuple[str, str], ...]:
        """The handles of a signed transaction whose body the card or the leaf binds."""
        try:
            parsed = parse(transaction, verify=True)
        except TxRejected as err:
            raise WrongCall("transaction_invalid") from err
        if parsed.tx_id != proposal_id or parsed.body.chain_id != self.spec.chain_id:
            raise WrongCall("transaction_mismatch")
        payload = parsed.body.payload
        if not isinstance(payload, Proposal) or names.canonical_tool_name(payload.tool) != tool:
            raise WrongCall("transaction_mismatch")
        digest = hashlib.sha256(parsed.signed.body).digest()
        card_bound = card is not None
        if card is not None and digest != card.body_digest:
            raise WrongCall("transaction_mismatch")
        leaf_bound = leaf.tx_id == proposal_id and bool(leaf.body_digest)
        if leaf_bound and digest != leaf.body_digest:
            raise WrongCall("transaction_mismatch")
        if not (card_bound or leaf_bound):
            raise WrongCall("arguments_not_bound")
        out = []
        for arg in payload.arguments:
            name = names.canonical_argument_name(arg.name)
            if arg.handle is not None and name is not None:
                out.append((name, arg.handle))
        return tuple(sorted(out))

    def open_envelope(self, call: AuthorizedCall, argument: str) -> bytes:
        """The plaintext of the handle the certified call passes as `argument`."""
        name = names.canonical_argument_name(argument)
        handle = next((h for n, h in call.handles if n == name), None)
        if handle is None:
            raise HandleRefused("not_in_call")
        return self.open_handle(call, handle)

    def open_handle(self, call: AuthorizedCall, handle: str) -> bytes:
        """The plaintext of `handle`, if the certified call carries it and it is sealed to
        this sink."""
        if handle not in {h for _, h in call.handles}:
            raise HandleRefused("not_in_call")
        if call.bound_by not in ("card", "leaf"):
            raise HandleRefused("arguments_not_bound")
        ciphertext = self.source.sealed_value(handle, self.sink_id, call.certificate)
        if ciphertext is None:
            raise HandleRefused("not_sealed_to_sink")
        try:
            return bytes(self._box.decrypt(ciphertext))
        except CryptoError:
            raise EnvelopeUnopenable("does_not_open") from None

    def open_all(self, call: AuthorizedCall) -> dict[str, bytes]:
        """Every envelope of the call, by argument name."""
        return {name: self.open_handle(call, handle) for name, handle in call.handles}


class EngineSource:
    """Sealed values from an engine the caller runs and trusts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        return self.engine.sealed_value(handle, sink)


class CertifiedLogSource:
    """Sealed values from a local replay of the committed log, accepted only when the
    replayed state root at the certificate's height equals the certified state root."""

    def __init__(
        self,
        spec: ClusterSpec,
        reader: SigningKey | None = None,
        log: CommittedLog | None = None,
    ) -> None:
        """`reader`: a key allowed to read the committed log — an auditor's, whom the
        owner lists with `quorumgate admin add-auditor` (or pass a `log` built with one)."""
        if log is None:
            if reader is None:
                raise ValueError("a CertifiedLogSource needs a reader key (an auditor's) or a log")
            log = CommittedLog(spec, reader)
        self.log = log

    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        height = certificate.leaf.height
        if self.log.height < height:
            try:
                self.log.advance(to_height=height)
            except ClusterUnavailable as err:
                raise HandleRefused("log_unavailable") from err
        root = self.log.state_root_at(height)
        if root is None:
            raise HandleRefused("state_not_retained")
        if root != certificate.state_root:
            raise HandleRefused("state_root_mismatch")
        return self.log.engine.sealed_value(handle, sink)
