"""The QuorumGate client SDK (issue 6, item 1): submit signed transactions, await verdict
certificates, verify them offline.

Async first. `Client` holds one signing key (an agent's or the owner's), the
cluster file, and gRPC channels to every replica and every sidecar; it must be used from
one event loop (its channels are made on first use, in that loop). `SyncClient` is the
blocking wrapper: it runs its own event loop in a daemon thread and hands every call to
it (`run_coroutine_threadsafe`), so channels live as long as the client and a blocking
caller never needs a loop of its own.

    async with Client.from_files("run/c4", key_file="agent.key") as qg:
        decision = await qg.propose("files.read", "/docs/a.txt", run_id="run-1")
        if decision.allowed: ...

What it promises:

- **Nonces.** Started from the sidecars' `Account.next_nonce` (f+1 of them asked, the
  largest answer taken) and counted up in memory; nothing is persisted. A nonce refused on
  arrival is given back, so a client never drifts past the engine's window
  (`quorumgate.sdk.nonces`), and `submit_many` signs no further ahead than the window
  allows: it waits for the cluster to execute before it signs more. One key should be
  driven by one client at a time: two clients counting the same key's nonces collide, and
  a collision costs a fresh nonce (`RESIGN_ON_REPLAY_MAX`), never a wrong answer.
- **Idempotent delivery.** A transaction is signed once and its bytes are offered to the
  replicas in turn: on UNAVAILABLE or DEADLINE_EXCEEDED the *same bytes* go to the next
  replica (`SUBMIT_ROUNDS_MAX` rounds over all of them). Its id is
  `sha256(signer || nonce)`, so a copy that did land is the same proposal, and a later
  "replayed" answer to a copy of bytes that may have landed means they did.
  RESOURCE_EXHAUSTED (a full mempool) is retried with exponential back-off from
  `BACKOFF_S_MIN` to `BACKOFF_S_MAX`, at most `OVERLOAD_RETRIES_MAX` times.
- **Certificates.** `await_certificate` long-polls `GetReceipt` on every sidecar (each
  answers as soon as it has executed the verdict, or after `RECEIPT_WAIT_S`; one that does
  not wait is asked again with bounded back-off, `RECEIPT_POLL_S_MIN`..`RECEIPT_POLL_S_MAX`)
  until f+1 distinct sidecars return the same signed leaf, then assembles and checks the
  certificate with `quorumgate.sidecar.receipts.verify_certificate` against the cluster
  file's receipt keys.
  A receipt signed for another member's index or with a bad signature is dropped on arrival, so up
  to f lying sidecars can delay an answer but never change it.
- **What an agent may see.** Reason codes are for operators (DESIGN §4.2). They sit on
  attributes (`Decision.reason`, `QuorumGateError.reason`) and never in the `str()` or
  `repr()` of a decision or an exception. No argument value is ever logged or printed.

Refusals are typed: `Refused` (with `Replayed`, `Overloaded` and `ReadNotAuthorized`: a read
f+1 sidecars refused this key, PERMISSION_DENIED), `ClusterUnavailable`,
`CertificateTimeout`, `InvalidCertificate`, `TransactionRejected` (an administrative or
agent transaction the engine did not apply).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from nacl.public import PublicKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import codec
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto import tx as txlib
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, load_cluster, read_seed
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Argument,
    Confirm,
    Delegate,
    EnvelopeArg,
    Mandate,
    Outcome,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Resume,
    Revoke,
    RoleTarget,
    SealedValue,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetSettings,
    Suspend,
    TargetRule,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxBody,
    TxKind,
    TxPayload,
    canonical_tool_list,
)
from quorumgate.proto.runs import RunLabels, opened_run
from quorumgate.runtime.channels import Reader, aio_channel, sync_channel
from quorumgate.runtime.readauth import read_auth_metadata
from quorumgate.sdk.nonces import NonceLedger
from quorumgate.sdk.registry import Registry, registry_from_pb
from quorumgate.sidecar.engine.statements import (
    CardMismatch,
    ConfirmationCard,
    card_values,
    handle_for,
)
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    Receipt,
    assemble_certificate,
    verify_certificate,
)
from quorumgate.sidecar.wire import decode_certificate, encode_certificate, receipt_from_pb

__all__ = [
    "Argument",
    "CertificateTimeout",
    "Client",
    "ClusterUnavailable",
    "Decision",
    "EnvelopeArg",
    "Grant",
    "Handle",
    "InvalidCertificate",
    "Mandate",
    "OpenCard",
    "Overloaded",
    "QuorumGateError",
    "ReadNotAuthorized",
    "Refused",
    "Replayed",
    "Submitted",
    "SyncClient",
    "ToolMode",
    "ToolSpec",
    "TransactionRejected",
]

T = TypeVar("T")

# ---------------------------------------------------------------------------- limits

RPC_TIMEOUT_S = 2.0  # one unary call to one replica or sidecar
SUBMIT_ROUNDS_MAX = 3  # rounds over every replica on UNAVAILABLE / DEADLINE_EXCEEDED
OVERLOAD_RETRIES_MAX = 8  # RESOURCE_EXHAUSTED answers retried before `Overloaded`
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 1.0
RESIGN_ON_REPLAY_MAX = 4  # fresh nonces tried when a first delivery is refused as replayed
RECEIPT_POLL_S_MIN = 0.005
RECEIPT_POLL_S_MAX = 0.1  # the commit itself takes ~60 ms on loopback: poll well within that
RECEIPT_WAIT_S = 1.0  # one GetReceipt long poll (the sidecars cap it at 1 s too)
NEWER_VERDICT_WAIT_S = 2.0  # how long a newer verdict, not yet certified, is waited for
CERTIFICATE_DEADLINE_S = 10.0  # default wait for f+1 agreeing receipts
# Transactions `submit_many` keeps on one stream before reading replies; well below the
# engine's nonce window (1024), which refuses nonces further ahead of the executed ones.
SUBMIT_MANY_BATCH_MAX = 512
WINDOW_WAIT_S_DEFAULT = 30.0  # submit_many: longest wait for the nonce window to move
RECEIPTS_PER_PROPOSAL_MAX = 64  # receipts held while waiting (one per sidecar is enough)
RECEIPT_KEYS_REMEMBERED_MAX = 65_536  # (height, index) keys `certified_verdicts` holds
OWN_NONCES_REMEMBERED_MAX = 65_536  # proposal ids this client signed, with their nonces
METHOD_GET_RECEIPT = "/qgpb.Sidecar/GetReceipt"
METHOD_RECEIPTS = "/qgpb.Sidecar/Receipts"
METHOD_REGISTRY = "/qgpb.Sidecar/Registry"
METHOD_PENDING = "/qgpb.Sidecar/Pending"
METHOD_ACCOUNT = "/qgpb.Sidecar/Account"
DELEGATION_TTL_S_DEFAULT = 3600.0
# A SyncClient call never blocks longer than this, whatever the coroutine's own deadlines
# (they are all shorter); a safety net against a stuck channel, not a tuning knob.
SYNC_CALL_TIMEOUT_S = 300.0
NO_TARGET = ""  # what a tool that takes no target is proposed with

TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
REASON_TRAILER = "qg-reason"

log = logging.getLogger("quorumgate.client")


# ---------------------------------------------------------------------------- errors


class QuorumGateError(Exception):
    """Base of every client error. `str()` is a fixed sentence per class; what an operator
    needs (`reason`, `code`, `proposal_id`) is on attributes, never in the text."""

    message = "QuorumGate client error."

    def __init__(self, reason: str = "", *, proposal_id: bytes | None = None) -> None:
        super().__init__(self.message)
        self.reason = reason
        self.proposal_id = proposal_id

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class Refused(QuorumGateError):
    """A replica refused the transaction outright (`reason` is the `qg-reason` trailer,
    `code` the gRPC status name): malformed, unknown signer or tool, wrong chain..."""

    message = "The cluster refused the transaction."

    def __init__(self, reason: str, code: str = "", *, proposal_id: bytes | None = None) -> None:
        super().__init__(reason, proposal_id=proposal_id)
        self.code = code


class Replayed(Refused):
    """The nonce was already used (ALREADY_EXISTS), and fresh ones were too."""

    message = "The transaction's nonce was already used."


class Overloaded(Refused):
    """Every replica kept answering RESOURCE_EXHAUSTED through the bounded back-off."""

    message = "The cluster is overloaded; try again later."


class ReadNotAuthorized(Refused):
    """f+1 sidecars refused this key the read (gRPC PERMISSION_DENIED, or UNAUTHENTICATED
    for a read statement they could not verify: a clock far off): it is not the owner's, a
    member's or an auditor's, and what it asked is not its own
    (docs/security/reads-and-certificates.md). `code` is the status name."""

    message = "The cluster refused this key the read (PERMISSION_DENIED)."

    def __str__(self) -> str:
        return (
            self.message
            if self.code != "UNAUTHENTICATED"
            else ("The cluster could not verify this key's read statement (UNAUTHENTICATED).")
        )


READ_REFUSAL_CODES = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


class ClusterUnavailable(QuorumGateError):
    """Not enough replicas or sidecars answered in time."""

    message = "The cluster could not be reached."


class CertificateTimeout(QuorumGateError):
    """No f+1 agreeing receipts before the deadline. `receipts` is how many distinct
    sidecars had answered with a usable receipt."""

    message = "No verdict certificate before the deadline."

    def __init__(self, proposal_id: bytes, receipts: int, needed: int) -> None:
        super().__init__("certificate_timeout", proposal_id=proposal_id)
        self.receipts = receipts
        self.needed = needed


class InvalidCertificate(QuorumGateError):
    """A certificate that does not prove what it claims (`reason` from
    `quorumgate.sidecar.receipts.CertificateError`: too_few_receipts, non_member,
    bad_signature...)."""

    message = "The verdict certificate is not valid."


class TransactionRejected(QuorumGateError):
    """The engine executed the transaction and did not apply it (an admin operation, a
    delegation, an envelope...). `decision` holds the certified verdict."""

    message = "The transaction was not applied."

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.reason, proposal_id=decision.proposal_id)
        self.decision = decision


class _FreshReplay(Exception):
    """ALREADY_EXISTS for bytes no earlier attempt could have delivered."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------- values


class Handle(str):
    """An envelope handle (`h_<kind>_<16 hex>`): passed as a handle argument, not as text."""

    __slots__ = ()


@dataclass(frozen=True, repr=False)
class Submitted:
    """A transaction the cluster admitted. `tx` (the signed bytes) may hold argument
    values, so it is never printed."""

    proposal_id: bytes
    nonce: int
    kind: TxKind
    signer: bytes
    tx: bytes = field(repr=False)

    def __repr__(self) -> str:
        return (
            f"Submitted(proposal={self.proposal_id.hex()[:16]}, nonce={self.nonce}, "
            f"kind={self.kind.value})"
        )

    __str__ = __repr__


class Grant(bytes):
    """A grant id (the Delegate's transaction id, 32 bytes) that also carries the run id
    the grant is for: pass it as `grant=` and the client acts in that run, whatever run
    label it is given. A plain 32-byte id works too, with the grant's run id as `run_id`."""

    run_id: str

    def __new__(cls, grant_id: bytes, run_id: str) -> Grant:
        made = super().__new__(cls, grant_id)
        made.run_id = run_id
        return made

    def __repr__(self) -> str:
        return f"Grant({bytes(self).hex()[:16]}.., run={self.run_id!r})"


@dataclass(frozen=True, repr=False)
class OpenCard:
    """An open confirmation card the caller alone may answer (`Client.pending`): the card
    f+1 sidecars returned byte for byte, and every argument's value read from the signed
    proposal the card binds (`card_values`). `render()` is what a person should see."""

    card: ConfirmationCard
    values: tuple[tuple[str, str], ...]
    sidecars: tuple[int, ...]

    @property
    def proposal_id(self) -> bytes:
        return self.card.proposal_id

    def render(self) -> str:
        return self.card.render(self.values)

    def __repr__(self) -> str:
        return f"OpenCard(tool={self.card.tool!r}, proposal={self.proposal_id.hex()[:16]})"


@dataclass(frozen=True)
class Decision:
    """A certified verdict: f+1 sidecars signed it, and `verify_certificate` checked it
    against the cluster file. `card` is the confirmation card of a pending call (checked
    against the certified card digest). `reason` is for operators only: it is in neither
    `str()` nor `repr()`."""

    proposal_id: bytes
    certificate: Certificate
    card: ConfirmationCard | None = None

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.certificate.leaf.outcome)

    @property
    def reason(self) -> str:
        """Operator-only reason code (DESIGN §4.2); never show it to an agent."""
        return self.certificate.leaf.reason

    @property
    def allowed(self) -> bool:
        """The call may run: allow, or flag (an allow recorded as a finding)."""
        return self.certificate.leaf.allows

    @property
    def pending(self) -> bool:
        return self.outcome is Outcome.PENDING

    @property
    def kind(self) -> str:
        return self.certificate.leaf.kind

    @property
    def tx_id(self) -> bytes:
        """The transaction the verdict came from: a Confirm's, once a pending call is settled."""
        return self.certificate.leaf.tx_id

    @property
    def height(self) -> int:
        return self.certificate.leaf.height

    @property
    def signers(self) -> tuple[int, ...]:
        return self.certificate.signers

    @property
    def target_digest(self) -> bytes:
        return self.certificate.leaf.target_digest

    @property
    def mandate_version(self) -> int:
        return self.certificate.leaf.mandate_version

    @property
    def valid_until_ms(self) -> int | None:
        """The end of the window, in block time, after which executors refuse this
        certificate (None on a chain whose receipts do not expire):
        docs/security/reads-and-certificates.md."""
        validity = self.certificate.validity
        return None if validity is None else validity.valid_until_ms

    def certificate_bytes(self) -> bytes:
        """The certificate as a `qgpb.Certificate`, for an executor to verify offline."""
        return encode_certificate(self.certificate)

    def __repr__(self) -> str:
        return (
            f"Decision(proposal={self.proposal_id.hex()[:16]}, outcome={self.outcome.value}, "
            f"height={self.height}, signers={self.signers})"
        )

    __str__ = __repr__


async def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel every task and wait until each has finished (whatever it raised)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def decode_card(data: bytes) -> ConfirmationCard:
    """Confirmation card bytes (`ConfirmationCard.to_bytes()`) back to a card.

    Uses the engine state codec's card reader (the only decoder of these bytes today) and
    insists that re-encoding gives the same bytes, so the certified digest covers exactly
    what is returned."""
    from quorumgate.proto.canonical import Encoder
    from quorumgate.sidecar.engine.state import StateDecodeError, _dec_card, _Reader

    try:
        card = _dec_card(_Reader(bytes(Encoder().blob(data))))
    except (StateDecodeError, ValueError) as err:
        raise InvalidCertificate("bad_card") from err
    if card.to_bytes() != data:
        raise InvalidCertificate("bad_card")
    return card


def _agreed_cards(answers: Mapping[int, spb.PendingReply], needed: int) -> list[OpenCard]:
    """The cards `needed` sidecars returned byte for byte, with values from a transaction
    one of them returned that the card binds (a sidecar cannot show one call and have
    another confirmed: the card digest binds the body's digest)."""
    seen: dict[bytes, list[int]] = {}
    bodies: dict[bytes, list[bytes]] = {}
    for member, reply in sorted(answers.items()):
        for entry in reply.cards:
            seen.setdefault(entry.card, []).append(member)
            bodies.setdefault(entry.card, []).append(entry.transaction)
    out = []
    for data, members in seen.items():
        if len(set(members)) < needed:
            continue
        try:
            card = decode_card(data)
        except InvalidCertificate:
            continue
        for transaction in bodies[data]:
            try:
                values = card_values(card, transaction)
            except CardMismatch:
                continue
            out.append(OpenCard(card, values, tuple(sorted(set(members)))))
            break
    return sorted(out, key=lambda c: c.proposal_id)


def load_certificate(data: bytes) -> Certificate:
    """Certificate bytes (`Decision.certificate_bytes()`) back to a `Certificate`."""
    try:
        return decode_certificate(data)
    except CertificateError as err:
        raise InvalidCertificate(err.reason) from err


def verify(
    spec: ClusterSpec, certificate: Certificate, *, proposal_id: bytes | None = None
) -> Decision:
    """Check a certificate offline against the cluster file (f+1 distinct members'
    receipt keys, chain id, Merkle path) and return it as a `Decision`."""
    try:
        leaf = verify_certificate(
            certificate,
            spec.chain_id,
            spec.receipt_keys,
            receipts_expire=spec.receipts_expire,
            proposal_id=proposal_id,
        )
    except CertificateError as err:
        raise InvalidCertificate(err.reason, proposal_id=proposal_id) from err
    return Decision(leaf.proposal_id, certificate)


def _raise_if_refused(
    replies: Sequence[object],
    statuses: Mapping[int, spb.SidecarStatusReply],
    height: int,
    needed: int,
) -> None:
    """`ReadNotAuthorized` when f+1 sidecars that had executed `height` before they were
    asked refused the read: one of them is honest, and a key registered at or below the
    height asked (the f+1-th highest executed one) is known to every honest sidecar there,
    so the refusal is not a sidecar still behind the key's registration."""
    codes = [
        reply.code()
        for i, reply in enumerate(replies)
        if isinstance(reply, grpc.aio.AioRpcError)
        and reply.code() in READ_REFUSAL_CODES
        and i in statuses
        and statuses[i].executed_height >= height
    ]
    _raise_if_read_refused(codes, needed)


def _raise_if_read_refused(codes: Sequence[grpc.StatusCode], needed: int) -> None:
    """`ReadNotAuthorized` when `needed` (f+1) sidecars refused the read: PERMISSION_DENIED
    if any of them said so, else UNAUTHENTICATED (none could verify the statement)."""
    if len(codes) >= needed:
        denied = grpc.StatusCode.PERMISSION_DENIED in codes
        code = grpc.StatusCode.PERMISSION_DENIED if denied else grpc.StatusCode.UNAUTHENTICATED
        raise ReadNotAuthorized("read_not_authorized", code.name)


def _receipt_or_none(message: spb.Receipt) -> Receipt | None:
    """A receipt off the wire, or None for one that cannot be (a validity window that ends
    before it starts): dropped on arrival, as a badly signed one is."""
    try:
        return receipt_from_pb(message)
    except CertificateError:
        return None


def _receipt_signature_ok(spec: ClusterSpec, receipt: Receipt, asked: int) -> bool:
    """Drop a receipt on arrival unless sidecar `asked` signed it for itself, with a
    validity window exactly when the chain's receipts expire: a Byzantine sidecar can
    neither speak for another member nor poison an honest group."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    block = receipt.block
    if block.signer != asked or receipt.leaf.height != block.height:
        return False
    if (block.validity is not None) != spec.receipts_expire:
        return False
    message = block.statement(spec.chain_id)
    try:
        VerifyKey(spec.member(asked).receipt_public_key).verify(message, block.signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def _statement_key(receipt: Receipt) -> tuple[object, ...]:
    b = receipt.block
    return (
        receipt.leaf, receipt.path, b.height, b.verdict_root, b.state_root, b.leaf_count,
        b.validity,
    )  # fmt: skip


def _reason_of(err: grpc.aio.AioRpcError | grpc.RpcError) -> str:
    trailers: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == REASON_TRAILER:
            return str(value)
    return ""


def _never_connected(err: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE before any connection: the bytes certainly did not arrive."""
    details = (err.details() or "").lower()
    return err.code() is grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details or "connection refused" in details
    )


def _arguments(arguments: Sequence[Argument] | Mapping[str, str | Handle]) -> tuple[Argument, ...]:
    if isinstance(arguments, Mapping):
        out = []
        for name, value in arguments.items():
            if isinstance(value, Handle):
                out.append(Argument(name, handle=str(value)))
            else:
                out.append(Argument(name, text=value))
        return tuple(out)
    return tuple(arguments)


def proposal_body_digest(chain_id: str, nonce: int, payload: Proposal) -> bytes:
    """SHA-256 of the TxBody a proposal signed at `nonce` carries: what a confirmation
    card's `body_digest` binds (arguments included, values unseen)."""
    body = codec.encode_body(TxBody(chain_id=chain_id, nonce=nonce, payload=payload))
    return hashlib.sha256(body).digest()


# ---------------------------------------------------------------------------- client


def _required_key(key_file: str | Path | None, client: str) -> SigningKey:
    if key_file is None:
        raise ValueError(
            f"{client}.from_files needs the key file to sign with (an agent's, a "
            f"principal's...); to sign as the cluster owner, use {client}.as_owner(directory)"
        )
    return SigningKey(read_seed(Path(key_file)))


class _Channels:
    """One channel per replica and per sidecar."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.replica_channels = [aio_channel(spec, m.index) for m in spec.members]
        self.sidecar_channels = [aio_channel(spec, m.index, "sidecar") for m in spec.members]
        self.replicas = [cpb_grpc.ReplicaStub(c) for c in self.replica_channels]
        self.sidecars = [spb_grpc.SidecarStub(c) for c in self.sidecar_channels]

    async def close(self) -> None:
        for channel in (*self.replica_channels, *self.sidecar_channels):
            await channel.close()


class ChannelPool:
    """gRPC channels to every replica and sidecar of one cluster, made in the event loop
    that first needs them and usable from that loop only. Clients of many keys can share
    one pool (`Client(..., pool=pool)`, `Client.with_key`): an orchestrator with a hundred
    agents then holds 2n channels, not 200n. A client closes only a pool it made itself;
    whoever made a shared pool closes it."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._channels: _Channels | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> _Channels:
        loop = asyncio.get_running_loop()
        if self._channels is None:
            self._channels = _Channels(self.spec)
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "a Client (and its channel pool) is bound to the event loop that first used "
                "it; use one client per loop, or SyncClient from threads"
            )
        return self._channels

    async def close(self) -> None:
        if self._channels is not None:
            await self._channels.close()
            self._channels = None


class Client:
    """See the module docstring. One signing key, one event loop."""

    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        *,
        rpc_timeout_s: float = RPC_TIMEOUT_S,
        certificate_deadline_s: float = CERTIFICATE_DEADLINE_S,
        pool: ChannelPool | None = None,
    ) -> None:
        if pool is not None and pool.spec.chain_id != spec.chain_id:
            raise ValueError("the channel pool belongs to another cluster")
        self.spec = spec
        self.key = key
        self.public_key = bytes(key.verify_key)
        self.rpc_timeout_s = rpc_timeout_s
        self.certificate_deadline_s = certificate_deadline_s
        self.pool = pool if pool is not None else ChannelPool(spec)
        self._owns_pool = pool is None
        # proposal id -> nonce of what this client signed: proves "mine" to GetReceipt
        self._own_nonces: OrderedDict[bytes, int] = OrderedDict()
        self._run_labels = RunLabels()  # run label -> the run its first transaction opened
        # proposal id -> (tx id, nonce) of this client's Confirm of it: its verdict answers
        # for the proposal, and this proves it is ours to read
        self._confirmations: OrderedDict[bytes, tuple[bytes, int]] = OrderedDict()
        self._nonces = NonceLedger()
        self._nonce_lock: asyncio.Lock | None = None
        self._replica_cursor = 0

    @classmethod
    def from_files(
        cls, directory: str | Path, key_file: str | Path | None = None, **options: Any
    ) -> Client:
        """The cluster in `directory`, signing with the key in `key_file`. The key is not
        optional: a client that silently fell back to the owner's key would let a script
        that forgot its agent key administer the cluster. Sign as the owner only on
        purpose, with `as_owner`."""
        spec = load_cluster(Path(directory))
        return cls(spec, _required_key(key_file, "Client"), **options)

    @classmethod
    def as_owner(cls, directory: str | Path, **options: Any) -> Client:
        """The cluster in `directory`, signing as its owner (`DIR/owner.key`)."""
        spec = load_cluster(Path(directory))
        return cls(spec, SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)), **options)

    @property
    def is_owner(self) -> bool:
        return self.public_key == self.spec.owner_public_key

    def __repr__(self) -> str:
        return f"Client(chain={self.spec.chain_id}, signer={self.public_key.hex()[:16]})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def with_key(self, key: SigningKey) -> Client:
        """A client for another key (another agent, a principal...) sharing this one's
        channels and timeouts. Close this client last: it owns the channels."""
        return Client(
            self.spec,
            key,
            rpc_timeout_s=self.rpc_timeout_s,
            certificate_deadline_s=self.certificate_deadline_s,
            pool=self.pool,
        )

    async def close(self) -> None:
        if self._owns_pool:
            await self.pool.close()

    def _ch(self) -> _Channels:
        return self.pool.get()

    def _read_auth(self, method: str) -> tuple[tuple[str, str], ...]:
        """This client's signed read statement for one call (runtime/readauth.py)."""
        return read_auth_metadata(
            self.spec.chain_id,
            method,
            self.public_key,
            lambda message: bytes(self.key.sign(message).signature),
            int(time.time() * 1000),
        )

    def _remember_nonce(self, proposal_id: bytes, nonce: int) -> None:
        self._own_nonces[proposal_id] = nonce
        while len(self._own_nonces) > OWN_NONCES_REMEMBERED_MAX:
            self._own_nonces.popitem(last=False)

    # ------------------------------------------------------------------ reads

    async def _sidecar_calls(
        self,
        call: Callable[[spb_grpc.SidecarStub], Coroutine[Any, Any, T]],
        *,
        enough: int,
        refused: dict[int, grpc.StatusCode] | None = None,
    ) -> dict[int, T]:
        """Ask every sidecar at once; return as soon as `enough` answered (or all tried).
        `refused` collects the sidecars that refused the read (`READ_REFUSAL_CODES`)."""
        stubs = self._ch().sidecars
        tasks = {asyncio.ensure_future(call(stub)): i for i, stub in enumerate(stubs)}
        answers: dict[int, T] = {}
        try:
            pending = set(tasks)
            while pending and len(answers) < enough:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    err = task.exception()
                    if err is None:
                        answers[tasks[task]] = task.result()
                    elif (
                        refused is not None
                        and isinstance(err, grpc.aio.AioRpcError)
                        and err.code() in READ_REFUSAL_CODES
                    ):
                        refused[tasks[task]] = err.code()
        finally:
            await _cancel_all(tasks)
        return answers

    async def sync_nonce(self) -> int:
        """Ask f+1 sidecars for this key's next executed nonce (the largest answer; it never
        goes back) and return the nonce this client signs with next."""
        needed = self.spec.f + 1
        refused: dict[int, grpc.StatusCode] = {}
        answers = await self._sidecar_calls(
            lambda stub: stub.Account(
                spb.AccountRequest(signer=self.public_key),
                timeout=self.rpc_timeout_s,
                metadata=self._read_auth(METHOD_ACCOUNT),
            ),
            enough=needed,
            refused=refused,
        )
        if len(answers) < needed:
            _raise_if_read_refused(list(refused.values()), needed)
            raise ClusterUnavailable("sidecars_unreachable")
        self._nonces.sync(max(a.next_nonce for a in answers.values()))
        return self._nonces.next

    async def _take_nonce(self) -> int:
        if self._nonce_lock is None:
            self._nonce_lock = asyncio.Lock()
        async with self._nonce_lock:
            if not self._nonces.synced:
                await self.sync_nonce()
            return self._nonces.take()

    async def _wait_for_window(self, wanted: int, deadline_s: float) -> int:
        """Wait (polling the sidecars, bounded by `deadline_s`) until `wanted` more nonces
        fit in the engine's window; return how many fit then (0 if none by the deadline)."""
        if not self._nonces.synced:
            await self.sync_nonce()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        delay = RECEIPT_POLL_S_MIN
        while self._nonces.room() < wanted and loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)
            await self.sync_nonce()
        return min(wanted, self._nonces.room())

    async def replica_status(self) -> dict[int, cpb.StatusReply]:
        """Status of every replica that answers, by member index."""
        stubs = self._ch().replicas

        async def one(stub: cpb_grpc.ReplicaStub) -> cpb.StatusReply:
            reply: cpb.StatusReply = await stub.Status(
                cpb.StatusRequest(), timeout=self.rpc_timeout_s
            )
            return reply

        results = await asyncio.gather(*(one(s) for s in stubs), return_exceptions=True)
        return {i: r for i, r in enumerate(results) if isinstance(r, cpb.StatusReply)}

    async def sidecar_status(self) -> dict[int, spb.SidecarStatusReply]:
        """Status of every sidecar that answers, by member index."""
        stubs = self._ch().sidecars

        async def one(stub: spb_grpc.SidecarStub) -> spb.SidecarStatusReply:
            reply: spb.SidecarStatusReply = await stub.Status(
                spb.SidecarStatusRequest(), timeout=self.rpc_timeout_s
            )
            return reply

        results = await asyncio.gather(*(one(s) for s in stubs), return_exceptions=True)
        return {i: r for i, r in enumerate(results) if isinstance(r, spb.SidecarStatusReply)}

    async def registry(self, deadline_s: float | None = None) -> Registry:
        """Agents, mandates, tools and sinks as of one executed height, from the sidecars'
        `Registry` RPC: accepted when f+1 of them return the same content with the same
        height and state root (at least one of them honest). The height asked for is the
        highest that f+1 sidecars have executed; if the registry changes meanwhile, the
        client asks again, until `deadline_s` (then `ClusterUnavailable`). It holds what
        this key may read (`Registry.scope`); a key that may read none of it gets
        `ReadNotAuthorized` as soon as f+1 sidecars at that height refused it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.certificate_deadline_s if deadline_s is None else deadline_s)
        needed = self.spec.f + 1
        stubs = self._ch().sidecars
        delay = RECEIPT_POLL_S_MIN
        while True:
            statuses = await self.sidecar_status()
            heights = sorted((s.executed_height for s in statuses.values()), reverse=True)
            if len(heights) >= needed:
                height = max(1, heights[needed - 1])

                async def ask(stub: spb_grpc.SidecarStub, h: int = height) -> spb.RegistryReply:
                    reply: spb.RegistryReply = await stub.Registry(
                        spb.RegistryRequest(height=h),
                        timeout=self.rpc_timeout_s,
                        metadata=self._read_auth(METHOD_REGISTRY),
                    )
                    return reply

                replies = await asyncio.gather(*(ask(s) for s in stubs), return_exceptions=True)
                _raise_if_refused(replies, statuses, height, needed)
                groups: dict[tuple[int, bytes, str, bytes], list[int]] = {}
                for i, reply in enumerate(replies):
                    if isinstance(reply, spb.RegistryReply) and reply.height == height:
                        content = reply.content.SerializeToString(deterministic=True)
                        group = (reply.height, reply.state_root, reply.scope, content)
                        groups.setdefault(group, []).append(i)
                for members in groups.values():
                    if len(members) >= needed:
                        agreed = replies[members[0]]
                        assert isinstance(agreed, spb.RegistryReply)
                        try:
                            return registry_from_pb(agreed, tuple(members))
                        except ValueError as err:
                            raise InvalidCertificate("registry_undecodable") from err
            if loop.time() >= deadline:
                raise ClusterUnavailable("registry_no_agreement")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)

    # ------------------------------------------------------------------ submitting

    def _replica_order(self) -> list[int]:
        """Every replica once, starting one further each call (spreads the load)."""
        n = self.spec.n
        start = self._replica_cursor % n
        self._replica_cursor += 1
        return [(start + k) % n for k in range(n)]

    async def _deliver(self, data: bytes) -> None:
        """Offer the same bytes to replicas until one admits them (module docstring)."""
        stubs = self._ch().replicas
        uncertain = False  # an earlier attempt may have delivered these bytes
        overloads = 0
        backoff = BACKOFF_S_MIN
        replayed_by: set[int] = set()  # replicas that answered "replayed" for these bytes
        for _round in range(SUBMIT_ROUNDS_MAX):
            for index in self._replica_order():
                if index in replayed_by:
                    continue
                while True:
                    try:
                        await stubs[index].Submit(
                            cpb.SubmitRequest(tx=data), timeout=self.rpc_timeout_s
                        )
                        return
                    except grpc.aio.AioRpcError as err:
                        failure = err
                    code = failure.code()
                    reason = _reason_of(failure)
                    if code in TRANSPORT_CODES:
                        if not _never_connected(failure):
                            uncertain = True
                        log.debug("event=submit_retry replica=%d code=%s", index, code.name)
                        break  # the next replica
                    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                        overloads += 1
                        if overloads > OVERLOAD_RETRIES_MAX:
                            raise Overloaded(reason or "overloaded", code.name)
                        log.debug("event=submit_backoff replica=%d delay_s=%.3f", index, backoff)
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, BACKOFF_S_MAX)
                        continue  # the same replica again, after the pause
                    if code is grpc.StatusCode.ALREADY_EXISTS:
                        if uncertain and reason != "conflicting_nonce":
                            return  # our own earlier copy landed: the same transaction
                        if uncertain:
                            raise Replayed(reason, code.name)
                        if reason == "conflicting_nonce":
                            raise _FreshReplay(reason)  # another transaction holds it
                        # "replayed": spent, or only ahead of a replica that lags behind
                        # the cluster (its window has not moved yet): ask the others
                        replayed_by.add(index)
                        if len(replayed_by) == len(stubs):
                            raise _FreshReplay(reason)
                        break
                    raise Refused(reason or code.name.lower(), code.name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S_MAX)
        if replayed_by and not uncertain:
            raise _FreshReplay("replayed")
        raise ClusterUnavailable("replicas_unreachable" if not uncertain else "no_admission")

    def bind_run(self, payload: TxPayload, nonce: int) -> TxPayload:
        """Runs by label (issue 16, item 3): on chains of authority version 2 a run is named
        after the nonce of its owner's transaction that opened it (`quorumgate.proto.runs`),
        so a label this client has not used yet becomes the run this transaction opens,
        and one it has used stays in its run (`run_of`). Under a grant (a `Grant` from
        `delegate`), the grant's run; a run id `n<k>` passes as it is."""
        if self.spec.authority_version < 2 or not isinstance(payload, Proposal | Delegate):
            return payload
        grant = payload.grant if isinstance(payload, Proposal) else payload.parent_grant
        if grant is None:
            run = self._run_labels.bind(payload.run_id, nonce)
        else:
            run = getattr(grant, "run_id", None) or payload.run_id
        return payload if run == payload.run_id else replace(payload, run_id=run)

    def run_of(self, label: str) -> str | None:
        """The run id a label names for this client (the label itself on a chain of
        authority version 1; None before the label's first transaction)."""
        if self.spec.authority_version < 2:
            return label
        return label if opened_run(label) is not None else self._run_labels.get(label)

    async def submit(self, payload: TxPayload) -> Submitted:
        """Sign `payload` with the next nonce and deliver it; return once a replica admitted
        it. Use `await_certificate` (or `decide`) for the verdict."""
        kind = TxBody(chain_id=self.spec.chain_id, nonce=1, payload=payload).kind
        for _attempt in range(RESIGN_ON_REPLAY_MAX + 1):
            nonce = await self._take_nonce()
            bound = self.bind_run(payload, nonce)
            data = txlib.build(self.spec.chain_id, nonce, bound, self.key)
            proposal_id = txlib.tx_id(self.public_key, nonce)
            settled = False
            try:
                await self._deliver(data)
            except _FreshReplay:
                log.info("event=nonce_taken nonce=%d action=resign", nonce)
                await self.sync_nonce()
                self._nonces.held_elsewhere(nonce)
                settled = True
                continue
            except ClusterUnavailable as err:
                if err.reason == "replicas_unreachable":
                    self._nonces.refused(nonce)
                    settled = True
                err.proposal_id = proposal_id
                raise
            except Refused as err:
                if type(err) is Refused:
                    self._nonces.refused(nonce)  # refused on arrival: certainly not admitted
                    settled = True
                err.proposal_id = proposal_id
                raise
            finally:
                if not settled:  # admitted, or it may have been: the nonce is spent
                    self._nonces.delivered(nonce)
            log.debug(
                "event=submitted kind=%s proposal=%s nonce=%d",
                kind.value,
                proposal_id.hex()[:16],
                nonce,
            )
            self._remember_nonce(proposal_id, nonce)
            return Submitted(proposal_id, nonce, kind, self.public_key, data)
        raise Replayed("replayed", grpc.StatusCode.ALREADY_EXISTS.name)

    async def submit_many(
        self, payloads: Iterable[TxPayload], *, window_wait_s: float = WINDOW_WAIT_S_DEFAULT
    ) -> list[Submitted | QuorumGateError]:
        """Sign and stream many transactions (`SubmitStream`), in batches of at most
        `SUBMIT_MANY_BATCH_MAX`; one result per payload, in order: a `Submitted` or the
        error for that one. A batch whose stream breaks is delivered one by one, with the
        same bytes, through the retrying path.

        It never signs past the engine's nonce window (`NONCE_WINDOW` nonces above what
        the cluster executed): when the window is full it waits for execution to move it,
        up to `window_wait_s` at a time; payloads still waiting then are answered
        `Overloaded("nonce_window_full")`, unsigned, and cost no nonce.

        Order: the payloads are signed with ascending nonces and streamed in that order to
        one replica, and any one leader proposes a signer's transactions in nonce order,
        so they usually execute in order. The cluster does not promise it: the engine
        accepts nonces out of order within the window, and a leader may propose a later
        transaction before an earlier one reaches it (a retry through another replica).
        When one operation depends on another (register a tool, then call it), await the
        first one's certificate before submitting the second, as `OwnerSession` does."""
        items = list(payloads)
        results: list[Submitted | QuorumGateError] = []
        start = 0
        while start < len(items):
            wanted = min(SUBMIT_MANY_BATCH_MAX, len(items) - start)
            fits = await self._wait_for_window(wanted, window_wait_s)
            if fits == 0:
                for _ in items[start:]:
                    results.append(Overloaded("nonce_window_full", "RESOURCE_EXHAUSTED"))
                break
            batch = items[start : start + fits]
            results.extend(await self._submit_batch(batch))
            start += fits
        return results

    async def _submit_batch(self, batch: list[TxPayload]) -> list[Submitted | QuorumGateError]:
        signed: list[tuple[Submitted, cpb.SubmitRequest]] = []
        for k, payload in enumerate(batch):
            nonce = await self._take_nonce()
            bound = self.bind_run(payload, nonce)
            data = txlib.build(self.spec.chain_id, nonce, bound, self.key)
            kind = TxBody(chain_id=self.spec.chain_id, nonce=nonce, payload=payload).kind
            sub = Submitted(txlib.tx_id(self.public_key, nonce), nonce, kind, self.public_key, data)
            signed.append((sub, cpb.SubmitRequest(tx=data, request_id=k)))
        replies: dict[int, cpb.SubmitReply] = {}
        index = self._replica_order()[0]
        try:
            stream = (
                self._ch()
                .replicas[index]
                .SubmitStream(
                    iter([cpb.SubmitBatch(requests=[r for _, r in signed])]),
                    timeout=self.rpc_timeout_s + 0.01 * len(signed),
                )
            )
            async for reply_batch in stream:
                for reply in reply_batch.replies:
                    replies[reply.request_id] = reply
        except grpc.aio.AioRpcError as err:
            log.debug("event=submit_stream_broken replica=%d code=%s", index, err.code().name)
        out: list[Submitted | QuorumGateError] = []
        for k, (sub, _request) in enumerate(signed):
            reply = replies.get(k)
            if reply is not None and reply.accepted:
                self._nonces.delivered(sub.nonce)
                self._remember_nonce(sub.proposal_id, sub.nonce)
                out.append(sub)
                continue
            code = grpc.StatusCode.UNAVAILABLE
            if reply is not None:
                code = next((c for c in grpc.StatusCode if c.value[0] == reply.code), code)
            if reply is not None and code not in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.ALREADY_EXISTS,
            ):
                self._nonces.refused(sub.nonce)
                out.append(Refused(reply.reason, code.name, proposal_id=sub.proposal_id))
                continue
            # No answer, back-pressure, or "replayed" from one replica (which may only lag
            # behind the others): the same bytes through the retrying path.
            try:
                await self._deliver(sub.tx)
                self._nonces.delivered(sub.nonce)
                self._remember_nonce(sub.proposal_id, sub.nonce)
                out.append(sub)
            except _FreshReplay as err:
                await self.sync_nonce()
                self._nonces.held_elsewhere(sub.nonce)
                out.append(Replayed(err.reason, proposal_id=sub.proposal_id))
            except QuorumGateError as err:
                if isinstance(err, ClusterUnavailable) and err.reason == "replicas_unreachable":
                    self._nonces.refused(sub.nonce)
                else:
                    self._nonces.delivered(sub.nonce)
                err.proposal_id = sub.proposal_id
                out.append(err)
        return out

    # ------------------------------------------------------------------ certificates

    async def await_certificate(
        self,
        proposal_id: bytes,
        deadline_s: float | None = None,
        *,
        settled: bool = False,
        from_tx: bytes | None = None,
        nonce: int | None = None,
    ) -> Decision:
        """Poll every sidecar's `GetReceipt` until f+1 distinct sidecars return the same
        signed leaf for `proposal_id`; return it verified. `settled`: wait past a pending
        verdict (for a confirmed call). `from_tx`: only a verdict from that transaction.
        `nonce`: the proposal's, when this client signed it in an earlier life (a client
        remembers the nonces it signed; it proves the verdict is ours to read)."""
        deadline_s = self.certificate_deadline_s if deadline_s is None else deadline_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        needed = self.spec.f + 1
        stubs = self._ch().sidecars
        latest: dict[int, Receipt] = {}
        cards: dict[bytes, bytes] = {}
        answered: set[int] = set()
        refusing: set[int] = set()  # sidecars whose last answer was "not yours to read"
        changed = asyncio.Event()
        newer_deadline: float | None = None

        own_nonce = nonce if nonce is not None else self._own_nonces.get(proposal_id, 0)
        confirmed = self._confirmations.get(proposal_id)
        own = [spb.OwnTx(tx_id=confirmed[0], nonce=confirmed[1])] if confirmed else []

        async def follow(i: int) -> None:
            """Long-poll sidecar i (`GetReceipt` with `wait_ms`): each answer comes as soon
            as it has executed the verdict (or a newer one than the last it sent), so the
            certificate is noticed when it exists, not at the next poll. A sidecar that
            answers at once without waiting (an error, an older version) is asked again
            after a growing pause, as the poll did."""
            known = 0  # the height of the newest receipt this sidecar sent
            delay = RECEIPT_POLL_S_MIN
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                wait_ms = int(min(remaining, RECEIPT_WAIT_S) * 1000)
                request = spb.ReceiptRequest(
                    proposal_id=proposal_id,
                    nonce=own_nonce,
                    own=own,
                    wait_ms=wait_ms,
                    newer_than=known,
                )
                asked = loop.time()
                try:
                    reply: spb.ReceiptReply = await stubs[i].GetReceipt(
                        request,
                        timeout=max(0.05, min(self.rpc_timeout_s + wait_ms / 1000, remaining)),
                        metadata=self._read_auth(METHOD_GET_RECEIPT),
                    )
                except grpc.aio.AioRpcError as err:
                    if err.code() in READ_REFUSAL_CODES:
                        refusing.add(i)
                        changed.set()
                    await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
                    delay = min(delay * 2, RECEIPT_POLL_S_MAX)
                    continue
                refusing.discard(i)
                answered.add(i)
                found = self._absorb_receipt(i, reply, proposal_id, settled, from_tx, latest, cards)
                news = found is not None and found > known
                if found is not None:
                    known = max(known, found)
                changed.set()
                # an answer that brought nothing new without waiting (polling, or a sidecar
                # that does not long-poll): ask again only after a growing pause
                quick = wait_ms == 0 or loop.time() - asked < wait_ms / 2000
                if quick and not news:
                    await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
                    delay = min(delay * 2, RECEIPT_POLL_S_MAX)

        tasks = [asyncio.create_task(follow(i)) for i in range(self.spec.n)]
        try:
            while True:
                if len(refusing) >= needed and not (own_nonce or confirmed):
                    # f+1 sidecars say this key may not read this verdict, and it holds no
                    # proof that would let it once they have executed further
                    raise ReadNotAuthorized(
                        "read_not_authorized", "PERMISSION_DENIED", proposal_id=proposal_id
                    )
                decision = self._certify(proposal_id, list(latest.values()), cards)
                if decision is not None:
                    # Sidecars run at different heights: a newer verdict for this proposal
                    # (a confirmation after a pending one) may be certified by fewer of
                    # them yet. Wait a little for it rather than answer with the older one.
                    newest = max(r.leaf.height for r in latest.values())
                    if decision.height >= newest:
                        return decision
                    if newer_deadline is None:
                        newer_deadline = min(deadline, loop.time() + NEWER_VERDICT_WAIT_S)
                    if loop.time() >= newer_deadline:
                        return decision
                # the short wait for a newer verdict applies only while an older one is in
                # hand; without any, the caller's deadline
                until = newer_deadline if decision is not None and newer_deadline else deadline
                remaining = until - loop.time()
                if remaining <= 0:
                    if len(answered) < needed:
                        raise ClusterUnavailable("sidecars_unreachable", proposal_id=proposal_id)
                    raise CertificateTimeout(proposal_id, len(latest), needed)
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        finally:
            await _cancel_all(tasks)

    def _absorb_receipt(
        self,
        i: int,
        reply: spb.ReceiptReply,
        proposal_id: bytes,
        settled: bool,
        from_tx: bytes | None,
        latest: dict[int, Receipt],
        cards: dict[bytes, bytes],
    ) -> int | None:
        """Take sidecar i's answer into `latest` (when it is a verdict the caller waits
        for) and `cards`; returns the height of the receipt it carried, if any."""
        if not reply.found:
            return None
        receipt = _receipt_or_none(reply.receipt)
        if receipt is None:
            log.warning("event=receipt_dropped sidecar=%d why=bad_receipt", i)
            return None
        leaf = receipt.leaf
        if leaf.proposal_id != proposal_id or not _receipt_signature_ok(self.spec, receipt, i):
            log.warning("event=receipt_dropped sidecar=%d why=bad_receipt", i)
            return None
        if settled and leaf.outcome == Outcome.PENDING.value:
            return leaf.height  # wait for a newer one
        if from_tx is not None and leaf.tx_id != from_tx:
            return leaf.height
        latest[i] = receipt
        if reply.card and len(cards) < RECEIPTS_PER_PROPOSAL_MAX:
            cards[hashlib.sha256(reply.card).digest()] = bytes(reply.card)
        return leaf.height

    def _certify(
        self, proposal_id: bytes, receipts: Sequence[Receipt], cards: Mapping[bytes, bytes]
    ) -> Decision | None:
        groups: dict[tuple[object, ...], list[Receipt]] = {}
        for receipt in receipts:
            groups.setdefault(_statement_key(receipt), []).append(receipt)
        # The newest certifiable verdict first (a confirmed call's, over its pending one).
        ordered = sorted(groups.values(), key=lambda g: (g[0].leaf.height, g[0].leaf.index))
        for group in reversed(ordered):
            if len({r.block.signer for r in group}) < self.spec.f + 1:
                continue
            certificate = assemble_certificate(self.spec.chain_id, group)
            verify(self.spec, certificate, proposal_id=proposal_id)
            card = None
            digest = certificate.leaf.card_digest
            if digest:
                data = cards.get(digest)
                if data is not None:
                    card = decode_card(data)
            return Decision(proposal_id, certificate, card)
        return None

    async def await_transaction(
        self, tx_id: bytes, from_height: int, deadline_s: float | None = None
    ) -> Decision:
        """The certified verdict of transaction `tx_id`, read from the sidecars' `Receipts`
        streams from `from_height` on. For a Confirm: its verdict answers the proposal it
        names, and a refused Confirm never supersedes that proposal's own verdict, so it
        cannot be found by `GetReceipt`."""
        deadline_s = self.certificate_deadline_s if deadline_s is None else deadline_s
        needed = self.spec.f + 1
        found: dict[int, Receipt] = {}
        done = asyncio.Event()

        nonce = self._own_nonces.get(tx_id, 0)
        request = spb.ReceiptsRequest(
            from_height=from_height, own=[spb.OwnTx(tx_id=tx_id, nonce=nonce)] if nonce else []
        )

        async def follow(i: int, stub: spb_grpc.SidecarStub) -> None:
            stream = stub.Receipts(request, metadata=self._read_auth(METHOD_RECEIPTS))
            try:
                async for batch in stream:
                    for message in batch.receipts:
                        if message.leaf.tx_id != tx_id:
                            continue
                        receipt = _receipt_or_none(message)
                        if receipt is not None and _receipt_signature_ok(self.spec, receipt, i):
                            found[i] = receipt
                            if self._certify(receipt.leaf.proposal_id, list(found.values()), {}):
                                done.set()
                        return
            finally:
                stream.cancel()

        tasks = [asyncio.ensure_future(follow(i, s)) for i, s in enumerate(self._ch().sidecars)]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), deadline_s)
        finally:
            await _cancel_all(tasks)
        for receipt in found.values():
            decision = self._certify(receipt.leaf.proposal_id, list(found.values()), {})
            if decision is not None:
                return decision
        raise CertificateTimeout(tx_id, len(found), needed)

    async def decide(self, payload: TxPayload, deadline_s: float | None = None) -> Decision:
        """Submit and wait for the certified verdict."""
        submitted = await self.submit(payload)
        return await self.await_certificate(submitted.proposal_id, deadline_s)

    async def _applied(self, payload: TxPayload, deadline_s: float | None) -> Decision:
        decision = await self.decide(payload, deadline_s)
        if decision.outcome is not Outcome.APPLIED:
            raise TransactionRejected(decision)
        return decision

    # ------------------------------------------------------------------ agent calls

    async def propose(
        self,
        tool: str,
        target: str = NO_TARGET,
        arguments: Sequence[Argument] | Mapping[str, str | Handle] = (),
        *,
        run_id: str,
        grant: bytes | None = None,
        deadline_s: float | None = None,
        targets: Sequence[tuple[str, str]] = (),
    ) -> Decision:
        """Propose one tool call and return its certified verdict (allow / flag / deny /
        pending). A denial is a normal return here; `governed_tool` turns it into
        `ActionDenied`. `targets`: further (role, target) pairs, in roles the tool declares."""
        payload = Proposal(
            run_id=run_id,
            tool=tool,
            target=target,
            arguments=_arguments(arguments),
            grant=grant,
            targets=tuple(RoleTarget(role, value) for role, value in targets),
        )
        return await self.decide(payload, deadline_s)

    async def pending_card(
        self, proposal_id: bytes, deadline_s: float | None = None
    ) -> ConfirmationCard:
        """The certified confirmation card of a pending proposal."""
        decision = await self.await_certificate(proposal_id, deadline_s)
        if decision.card is None:
            raise TransactionRejected(decision)
        return decision.card

    async def pending(self, deadline_s: float | None = None) -> list[OpenCard]:
        """The open confirmation cards this key alone may answer (a principal's, or the
        owner's; issue 16), in proposal-id order: each card that f+1 sidecars return byte
        for byte, with its values read from the signed proposal it binds. Asks again while
        fewer than f+1 sidecars answer, until `deadline_s` (then `ClusterUnavailable`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.certificate_deadline_s if deadline_s is None else deadline_s)
        needed = self.spec.f + 1
        delay = RECEIPT_POLL_S_MIN
        while True:
            refused: dict[int, grpc.StatusCode] = {}
            answers = await self._sidecar_calls(
                lambda stub: stub.Pending(
                    spb.PendingRequest(),
                    timeout=self.rpc_timeout_s,
                    metadata=self._read_auth(METHOD_PENDING),
                ),
                enough=self.spec.n,
                refused=refused,
            )
            if len(answers) >= needed:
                return _agreed_cards(answers, needed)
            _raise_if_read_refused(list(refused.values()), needed)
            if loop.time() >= deadline:
                raise ClusterUnavailable("sidecars_unreachable")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)

    async def reject(
        self,
        proposal_id: bytes,
        card_digest: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Decision:
        """Decline a pending proposal (issue 16): the card leaves the state and the call is
        denied (`confirmation_rejected`); `TransactionRejected` if this key may not answer
        it, or the digest is wrong. Without `card_digest`, the open card is read first."""
        return await self.confirm(proposal_id, card_digest, deadline_s, reject=True)

    async def confirm(
        self,
        proposal_id: bytes,
        card_digest: bytes | None = None,
        deadline_s: float | None = None,
        *,
        reject: bool = False,
    ) -> Decision:
        """Sign a Confirm for a pending proposal (DESIGN §4.5) and return the verdict it
        produced: allow / flag / deny for the call, or `TransactionRejected` (wrong card,
        expired, not this confirmer's to confirm). Without `card_digest`, the card is
        fetched first (from this key's open cards, else the proposal's certificate):
        confirm only what you have shown the principal."""
        if card_digest is None:
            mine = [c for c in await self.pending(deadline_s) if c.proposal_id == proposal_id]
            if mine:
                card_digest = mine[0].card.digest
            else:
                card_digest = (await self.pending_card(proposal_id, deadline_s)).digest
        statuses = await self.sidecar_status()
        if len(statuses) < self.spec.f + 1:
            raise ClusterUnavailable("sidecars_unreachable", proposal_id=proposal_id)
        from_height = min(s.executed_height for s in statuses.values()) + 1
        answer = Confirm(proposal_id=proposal_id, card_digest=card_digest, reject=reject)
        submitted = await self.submit(answer)
        self._confirmations[proposal_id] = (submitted.proposal_id, submitted.nonce)
        while len(self._confirmations) > OWN_NONCES_REMEMBERED_MAX:
            self._confirmations.popitem(last=False)
        decision = await self.await_transaction(submitted.proposal_id, from_height, deadline_s)
        if decision.outcome is Outcome.REJECTED:
            raise TransactionRejected(decision)
        return decision

    async def delegate(
        self,
        child_public_key: bytes,
        run_id: str,
        tools: Sequence[str] | None = None,
        *,
        ttl_s: float = DELEGATION_TTL_S_DEFAULT,
        parent_grant: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Grant:
        """Grant a child agent an attenuated scope for one run (DESIGN §4.4); returns the
        grant id the child's proposals carry, a `Grant` (bytes) that also knows the run id
        the grant is for. `run_id` is a label of this client's runs (or, under
        `parent_grant`, the parent's run). Expiry is in block time, which tracks the
        replicas' clocks."""
        payload = Delegate(
            child=child_public_key,
            run_id=run_id,
            tools=None if tools is None else canonical_tool_list(list(tools)),
            expires_at_ms=int(time.time() * 1000 + ttl_s * 1000),
            parent_grant=parent_grant,
        )
        decision = await self._applied(payload, deadline_s)
        if parent_grant is not None:
            run = getattr(parent_grant, "run_id", None) or run_id
        else:
            run = self.run_of(run_id) or run_id
        return Grant(decision.proposal_id, run)

    async def revoke(self, grant: bytes, deadline_s: float | None = None) -> Decision:
        return await self._applied(Revoke(grant=grant), deadline_s)

    async def seal_envelope(
        self,
        kind: str,
        value: bytes | str,
        sinks: Mapping[str, bytes],
        *,
        owner_principal: str | None = None,
        deadline_s: float | None = None,
    ) -> Handle:
        """Seal `value` to each sink's X25519 public key (PyNaCl SealedBox) and register
        the handle (DESIGN §4.6). Agents seal for themselves (unverified kinds); the owner
        seals for `owner_principal` (verified). The value never leaves this process
        unsealed."""
        plaintext = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        sealed = tuple(
            SealedValue(sink=sink, ciphertext=SealedBox(PublicKey(key)).encrypt(plaintext))
            for sink, key in sorted(sinks.items())
        )
        payload = SealEnvelope(kind=kind, sealed=sealed, owner_principal=owner_principal)
        decision = await self._applied(payload, deadline_s)
        return Handle(handle_for(decision.proposal_id, kind))

    # ------------------------------------------------------------------ owner

    async def admin(self, op: AdminOp, deadline_s: float | None = None) -> Decision:
        """One owner operation; `TransactionRejected` unless it was applied."""
        return await self._applied(Admin(op=op), deadline_s)

    async def register_tool(self, spec: ToolSpec, deadline_s: float | None = None) -> Decision:
        return await self.admin(RegisterTool(spec=spec), deadline_s)

    async def register_agent(
        self,
        agent_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        principal: str = "",
    ) -> Decision:
        """Register an agent; `principal` names the person it acts for (who alone answers
        its cards); without one, the owner does."""
        op = RegisterAgent(agent_id=agent_id, public_key=public_key, principal=principal)
        return await self.admin(op, deadline_s)

    async def set_entries(
        self,
        agent_id: str,
        name: str,
        entries: Sequence[TargetRule],
        deadline_s: float | None = None,
    ) -> Decision:
        """Replace an agent's named set (`payees`, `allowed_domains`...; no entries deletes
        it), read by `set` rules. Signed by the owner, or by the principal the agent acts
        for (a principal keeps its agents' sets: after confirming a payment to a new payee
        it can add the payee, so the next payment runs directly)."""
        unique = {(e.kind.value, e.value): e for e in entries}
        op = SetEntries(
            principal=agent_id, name=name, entries=tuple(unique[k] for k in sorted(unique))
        )
        return await self._applied(Admin(op=op), deadline_s)

    async def set_settings(
        self,
        values: Mapping[str, int] | None = None,
        *,
        clear: Sequence[str] = (),
        deadline_s: float | None = None,
    ) -> Decision:
        """Set settings in the log (owner; `SETTING_NAMES`: latch thresholds, quotas, the
        confirmation and certificate TTLs, grant limits), or put the `clear`ed ones back to
        cluster.json's values. Applied or rejected as one operation."""
        op = SetSettings(values=tuple(sorted((values or {}).items())), clear=tuple(sorted(clear)))
        return await self._applied(Admin(op=op), deadline_s)

    async def register_principal(
        self,
        principal_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        deputies: Sequence[str] = (),
    ) -> Decision:
        """Register a principal: a person who answers the cards of the agents acting for
        them; its key is never an agent's, a sink's or the owner's. `deputies`: other
        principals who may answer its cards too (replaces the list). Signed by the owner,
        or by the principal itself (its own id and key) to name its deputies."""
        op = RegisterPrincipal(
            principal_id=principal_id,
            public_key=public_key,
            deputies=tuple(sorted(set(deputies))),
        )
        return await self._applied(Admin(op=op), deadline_s)

    async def register_sink(
        self, sink_id: str, public_key: bytes, deadline_s: float | None = None
    ) -> Decision:
        return await self.admin(RegisterSink(sink_id=sink_id, public_key=public_key), deadline_s)

    async def set_mandate(
        self, agent_id: str, mandate: Mandate, deadline_s: float | None = None
    ) -> Decision:
        return await self.admin(SetMandate(agent_id=agent_id, mandate=mandate), deadline_s)

    async def suspend(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return await self.admin(Suspend(agent_id=agent_id), deadline_s)

    async def resume(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return await self.admin(Resume(agent_id=agent_id), deadline_s)

    # ------------------------------------------------------------------ verdict stream

    async def certified_verdicts(
        self, from_height: int = 1, *, idle_s: float | None = None
    ) -> AsyncIterator[Decision]:
        """Every verdict from `from_height` on that f+1 sidecars certify, as it becomes
        certified. With `idle_s`, stop once no sidecar has sent anything for that long
        (what has been executed so far); without, follow forever."""
        queue: asyncio.Queue[tuple[int, Receipt] | None] = asyncio.Queue(
            maxsize=SUBMIT_MANY_BATCH_MAX
        )

        async def follow(i: int, stub: spb_grpc.SidecarStub) -> None:
            stream = stub.Receipts(
                spb.ReceiptsRequest(from_height=max(1, from_height)),
                metadata=self._read_auth(METHOD_RECEIPTS),
            )
            try:
                async for batch in stream:
                    for message in batch.receipts:
                        receipt = _receipt_or_none(message)
                        if receipt is not None:
                            await queue.put((i, receipt))
            except grpc.aio.AioRpcError as err:
                log.info("event=receipts_stream_closed sidecar=%d code=%s", i, err.code().name)
            finally:
                stream.cancel()

        tasks = [asyncio.ensure_future(follow(i, s)) for i, s in enumerate(self._ch().sidecars)]
        # (height, index) -> receipts by sidecar; emitted keys are remembered, bounded by
        # dropping keys far below the newest height seen
        waiting: OrderedDict[tuple[int, int], dict[int, Receipt]] = OrderedDict()
        emitted: OrderedDict[tuple[int, int], None] = OrderedDict()
        try:
            while True:
                try:
                    item = (
                        await asyncio.wait_for(queue.get(), idle_s) if idle_s else await queue.get()
                    )
                except TimeoutError:
                    return
                if item is None:
                    return
                i, receipt = item
                key = (receipt.leaf.height, receipt.leaf.index)
                if key in emitted or not _receipt_signature_ok(self.spec, receipt, i):
                    continue
                bucket = waiting.setdefault(key, {})
                bucket[i] = receipt
                decision = self._certify(receipt.leaf.proposal_id, list(bucket.values()), {})
                if decision is None:
                    continue
                del waiting[key]
                emitted[key] = None
                while len(emitted) > RECEIPT_KEYS_REMEMBERED_MAX:
                    emitted.popitem(last=False)
                while len(waiting) > RECEIPT_KEYS_REMEMBERED_MAX:
                    waiting.popitem(last=False)
                yield decision
        finally:
            await _cancel_all(tasks)


# ---------------------------------------------------------------------------- sync wrapper


class SyncClient:
    """Blocking wrapper around `Client`: one daemon thread runs one event loop
    for the client's whole life, and each method hands its coroutine to it and waits.
    Safe to call from any number of threads; never from inside the client's own loop.
    `aio` is the wrapped async client (bound to that loop); `bridge` awaits one of its
    coroutines from another event loop."""

    def __init__(self, spec: ClusterSpec, key: SigningKey, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="quorumgate-client", daemon=True
        )
        self._thread.start()
        self.aio = Client(spec, key, **options)
        self._closed = False
        self._parent: SyncClient | None = None

    def with_key(self, key: SigningKey) -> SyncClient:
        """A client for another key sharing this one's thread, event loop and channels
        (see `Client.with_key`). Closing it frees nothing; close this client last."""
        shared = object.__new__(SyncClient)
        shared._loop = self._loop
        shared._thread = self._thread
        shared.aio = self.aio.with_key(key)
        shared._closed = False
        shared._parent = self
        return shared

    @classmethod
    def from_files(
        cls, directory: str | Path, key_file: str | Path | None = None, **options: Any
    ) -> SyncClient:
        """As `Client.from_files`: the key file is required."""
        spec = load_cluster(Path(directory))
        return cls(spec, _required_key(key_file, "SyncClient"), **options)

    @classmethod
    def as_owner(cls, directory: str | Path, **options: Any) -> SyncClient:
        """The cluster in `directory`, signing as its owner (`DIR/owner.key`)."""
        spec = load_cluster(Path(directory))
        return cls(spec, SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)), **options)

    @property
    def spec(self) -> ClusterSpec:
        return self.aio.spec

    @property
    def public_key(self) -> bytes:
        return self.aio.public_key

    def __repr__(self) -> str:
        return f"SyncClient(chain={self.spec.chain_id}, signer={self.public_key.hex()[:16]})"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine of `aio` on the client's loop and wait for its result."""
        if self._closed or (self._parent is not None and self._parent._closed):
            coro.close()
            raise RuntimeError("SyncClient is closed")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("SyncClient called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=SYNC_CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClusterUnavailable("client_call_timeout") from None

    async def bridge(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await one coroutine of `aio` from another event loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        if self._closed:
            return
        if self._parent is not None:  # the loop and the channels are the parent's
            self._closed = True
            return
        asyncio.run_coroutine_threadsafe(self.aio.close(), self._loop).result()
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # one blocking method per async one; each is `run(self.aio.<method>(...))`

    def sync_nonce(self) -> int:
        return self.run(self.aio.sync_nonce())

    def submit(self, payload: TxPayload) -> Submitted:
        return self.run(self.aio.submit(payload))

    def submit_many(self, payloads: Iterable[TxPayload]) -> list[Submitted | QuorumGateError]:
        return self.run(self.aio.submit_many(list(payloads)))

    def await_certificate(
        self,
        proposal_id: bytes,
        deadline_s: float | None = None,
        *,
        settled: bool = False,
        nonce: int | None = None,
    ) -> Decision:
        return self.run(
            self.aio.await_certificate(proposal_id, deadline_s, settled=settled, nonce=nonce)
        )

    def decide(self, payload: TxPayload, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.decide(payload, deadline_s))

    def propose(
        self,
        tool: str,
        target: str = NO_TARGET,
        arguments: Sequence[Argument] | Mapping[str, str | Handle] = (),
        *,
        run_id: str,
        grant: bytes | None = None,
        deadline_s: float | None = None,
        targets: Sequence[tuple[str, str]] = (),
    ) -> Decision:
        return self.run(
            self.aio.propose(
                tool,
                target,
                arguments,
                run_id=run_id,
                grant=grant,
                deadline_s=deadline_s,
                targets=targets,
            )
        )

    def registry(self, deadline_s: float | None = None) -> Registry:
        return self.run(self.aio.registry(deadline_s))

    def pending_card(self, proposal_id: bytes, deadline_s: float | None = None) -> ConfirmationCard:
        return self.run(self.aio.pending_card(proposal_id, deadline_s))

    def confirm(
        self, proposal_id: bytes, card_digest: bytes | None = None, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.confirm(proposal_id, card_digest, deadline_s))

    def reject(
        self, proposal_id: bytes, card_digest: bytes | None = None, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.reject(proposal_id, card_digest, deadline_s))

    def pending(self, deadline_s: float | None = None) -> list[OpenCard]:
        return self.run(self.aio.pending(deadline_s))

    def delegate(
        self,
        child_public_key: bytes,
        run_id: str,
        tools: Sequence[str] | None = None,
        *,
        ttl_s: float = DELEGATION_TTL_S_DEFAULT,
        parent_grant: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Grant:
        return self.run(
            self.aio.delegate(
                child_public_key,
                run_id,
                tools,
                ttl_s=ttl_s,
                parent_grant=parent_grant,
                deadline_s=deadline_s,
            )
        )

    def revoke(self, grant: bytes, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.revoke(grant, deadline_s))

    def run_of(self, label: str) -> str | None:
        return self.aio.run_of(label)

    def seal_envelope(
        self,
        kind: str,
        value: bytes | str,
        sinks: Mapping[str, bytes],
        *,
        owner_principal: str | None = None,
        deadline_s: float | None = None,
    ) -> Handle:
        return self.run(
            self.aio.seal_envelope(
                kind, value, sinks, owner_principal=owner_principal, deadline_s=deadline_s
            )
        )

    def admin(self, op: AdminOp, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.admin(op, deadline_s))

    def register_tool(self, spec: ToolSpec, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.register_tool(spec, deadline_s))

    def register_agent(
        self,
        agent_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        principal: str = "",
    ) -> Decision:
        return self.run(
            self.aio.register_agent(agent_id, public_key, deadline_s, principal=principal)
        )

    def register_principal(
        self,
        principal_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        deputies: Sequence[str] = (),
    ) -> Decision:
        return self.run(
            self.aio.register_principal(principal_id, public_key, deadline_s, deputies=deputies)
        )

    def set_entries(
        self,
        agent_id: str,
        name: str,
        entries: Sequence[TargetRule],
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(self.aio.set_entries(agent_id, name, entries, deadline_s))

    def set_settings(
        self,
        values: Mapping[str, int] | None = None,
        *,
        clear: Sequence[str] = (),
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(self.aio.set_settings(values, clear=clear, deadline_s=deadline_s))

    def register_sink(
        self, sink_id: str, public_key: bytes, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.register_sink(sink_id, public_key, deadline_s))

    def set_mandate(
        self, agent_id: str, mandate: Mandate, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.set_mandate(agent_id, mandate, deadline_s))

    def suspend(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.suspend(agent_id, deadline_s))

    def resume(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.resume(agent_id, deadline_s))


# ---------------------------------------------------------------------------- the log


ROOTS_KEPT_MAX = 4096  # state roots by height a `CommittedLog` remembers
BLOCKS_STREAM_TIMEOUT_S = 60.0


class CommittedLog:
    """A local, read-only engine fed with the committed log of one replica (blocking gRPC).

    What the agents/tools listings and an executor's envelope lookup stand on until a
    read-only sidecar RPC exists. One replica is trusted for the blocks; `state_root_at`
    lets a caller compare the local state with a certified one (a certificate signs the
    state root after its height), which is what makes a lookup trustworthy: equal roots
    mean the local state is the state f+1 sidecars signed.
    """

    def __init__(self, spec: ClusterSpec, reader: SigningKey) -> None:
        """`reader`: a key allowed to read committed blocks — the owner's or an auditor's
        (runtime/readauth.py); the blocks hold every argument value."""
        from quorumgate.sidecar.engine.core import Engine, config_for_cluster

        self.reader = Reader.of(reader)
        self.spec = spec
        # the sidecars' configuration: versions and capacities are in the state's root
        self.engine = Engine(config_for_cluster(spec))
        self.height = 0
        self._roots: OrderedDict[int, bytes] = OrderedDict()

    def state_root_at(self, height: int) -> bytes | None:
        return self._roots.get(height)

    def committed_height(self) -> int:
        """The highest committed height any replica reports."""
        best = -1
        for member in self.spec.members:
            with sync_channel(self.spec, member.index) as channel:
                try:
                    reply = cpb_grpc.ReplicaStub(channel).Status(
                        cpb.StatusRequest(), timeout=RPC_TIMEOUT_S
                    )
                except grpc.RpcError:
                    continue
            best = max(best, reply.committed_height)
        if best < 0:
            raise ClusterUnavailable("replicas_unreachable")
        return best

    def advance(
        self,
        to_height: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Execute committed blocks up to `to_height` (default: the committed height now);
        try each replica in turn. Returns the height reached."""
        from quorumgate.replica.wire import decode_block

        target = self.committed_height() if to_height is None else to_height
        for member in self.spec.members:
            if self.height >= target:
                break
            with sync_channel(self.spec, member.index, reader=self.reader) as ch:
                stream = cpb_grpc.ReplicaStub(ch).CommittedBlocks(
                    cpb.BlocksRequest(from_height=self.height + 1),
                    timeout=BLOCKS_STREAM_TIMEOUT_S,
                )
                try:
                    for committed in stream:
                        if committed.height != self.height + 1:
                            break
                        block = decode_block(
                            self.spec.chain_id, committed.block.SerializeToString()
                        )
                        result = self.engine.execute_block(
                            block.height, block.timestamp_ms, list(block.payload), False
                        )
                        self.height = block.height
                        self._roots[block.height] = result.state_root
                        while len(self._roots) > ROOTS_KEPT_MAX:
                            self._roots.popitem(last=False)
                        if progress is not None:
                            progress(self.height, target)
                        if self.height >= target:
                            break
                except grpc.RpcError as err:
                    log.info("event=blocks_stream_closed code=%s", err.code().name)
                finally:
                    stream.cancel()
        if self.height < target:
            raise ClusterUnavailable("replicas_unreachable")
        return self.height


def tool_spec(
    name: str,
    mode: ToolMode | str = ToolMode.DIRECT,
    *,
    sink: str | None = None,
    schemes: Sequence[str] = (),
    envelopes: Sequence[EnvelopeArg] = (),
    min_tier: str | None = None,
    binds_caller: bool = False,
    arguments: Mapping[str, str] | None = None,
    direct_override: bool = False,
    roles: Mapping[str, tuple[Sequence[str], int]] | None = None,
    target_optional: bool = False,
) -> ToolSpec:
    """A `ToolSpec` from loose inputs: schemes and envelope arguments sorted for you.

    `min_tier` ("delegate" or "master") is what a confirm-gated tool must state (chains of
    authority version 2 refuse one without it, `tier_undeclared`); left out, it is
    `delegate`, undeclared. `arguments` declares the plain arguments by role (`{"to":
    "recipient", "amount": "amount", "note": "text"}`; roles identity, recipient, amount,
    credential, text): the engine then refuses any other argument and any identity sent;
    a `direct` tool with a recipient, amount or credential needs `direct_override=True`,
    which the ledger records. `roles` declares further targets by role, each with its
    schemes and how many one call may carry (`{"recipient": (["mailto"], 10)}`);
    `target_optional` lets a call leave the main target out."""
    from quorumgate.proto.model import ArgRole, ArgSpec, TargetSlot, Tier

    declared = tuple(ArgSpec(arg, ArgRole(role)) for arg, role in sorted((arguments or {}).items()))
    return ToolSpec(
        name=name,
        mode=ToolMode(mode),
        sink=sink,
        target_schemes=tuple(sorted(set(schemes))),
        envelope_args=tuple(sorted(envelopes, key=lambda e: e.name)),
        min_tier=Tier(min_tier or Tier.DELEGATE.value),
        binds_caller=binds_caller,
        arguments=declared,
        direct_override=direct_override,
        min_tier_declared=min_tier is not None,
        target_roles=tuple(
            TargetSlot(role, tuple(sorted(set(slot_schemes))), most)
            for role, (slot_schemes, most) in sorted((roles or {}).items())
        ),
        target_optional=target_optional,
    )


def mandate(
    tools: Sequence[str] | None,
    *,
    enforcement: str = "enforce",
    suspended: bool = False,
    delegation_policy: str = "none",
    max_delegation_depth: int | None = None,
    rules: Sequence[ToolRules] = (),
) -> Mandate:
    """A `Mandate` from loose inputs. `tools=None` is unrestricted and `[]` is nothing
    (DESIGN §4.2: branch on absence, never on truthiness); `rules`, the target and argument
    rules per allowed tool, in any order."""
    from quorumgate.proto.model import DelegationPolicy, Enforcement

    return Mandate(
        allowed_tools=None if tools is None else canonical_tool_list(list(tools)),
        enforcement=Enforcement(enforcement),
        suspended=suspended,
        delegation_policy=DelegationPolicy(delegation_policy),
        max_delegation_depth=max_delegation_depth,
        rules=tuple(sorted(rules, key=lambda entry: entry.tool)),
    )
