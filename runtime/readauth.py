"""Who may read what a cluster committed (docs/security/reads-and-certificates.md).

`CommittedBlocks` carries every argument value of every tool call, and a sidecar's
`Receipts` stream every verdict. They answer only:

- the owner (`cluster.json`'s owner key);
- the members: a sidecar's receipt key of the epoch the server runs, and on a replica a
  replica's consensus key of that epoch (a sidecar answers no consensus key as a member);
- auditors: keys the owner listed in `cluster.json` (`quorumgate admin add-auditor`).

An agent reads its own verdicts: `GetReceipt` answers a proposal id to whoever proves it
is the id's signer, by sending the nonce (a proposal id is sha256(signer ‖ nonce)).

A caller proves its key per call: the call's metadata carries `qg-read-auth` = its public
key, the time and an Ed25519 signature over (chain, method, time). Inside TLS nobody else
sees it, and it names the method; a statement more than `READ_AUTH_SKEW_MS_MAX` away from
the server's clock is refused. Refusals are `PERMISSION_DENIED` (`UNAUTHENTICATED` when the
statement itself does not verify).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from enum import StrEnum
from pathlib import Path

import grpc

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.clusterfile import (
    CLUSTER_FILE,
    AuditorSpec,
    ClusterFileError,
    ClusterSpec,
    load_cluster,
)
from quorumgate.proto.crypto import ed25519_verify

TAG_READ = domains.READ
READ_AUTH_METADATA = "qg-read-auth"
READ_AUTH_SKEW_MS_MAX = 300_000
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64

# The calls that carry a read statement, by the full gRPC path the statement names. The
# servers check a call against these and the clients sign them, so both name one method by
# one string, and a statement signed for one method opens no other: an agent's `GetReceipt`
# statement does not open the `Receipts` stream, a replica's `Admit` one not the registry.
METHOD_COMMITTED_BLOCKS = "/qgpb.Replica/CommittedBlocks"
# The stored epoch ends hold change blocks, with their committed transactions.
METHOD_EPOCH_ENDS = "/qgpb.Replica/EpochEnds"
METHOD_GET_RECEIPT = "/qgpb.Sidecar/GetReceipt"
METHOD_RECEIPTS = "/qgpb.Sidecar/Receipts"
METHOD_ACCOUNT = "/qgpb.Sidecar/Account"
METHOD_REGISTRY = "/qgpb.Sidecar/Registry"
METHOD_PENDING = "/qgpb.Sidecar/Pending"
METHOD_ADMIT = "/qgpb.Sidecar/Admit"
METHOD_ADMIT_BATCH = "/qgpb.Sidecar/AdmitBatch"
METHOD_LEDGER = "/qgpb.Sidecar/Ledger"
# Snapshots (docs/snapshots.md) carry the whole governance state, every agent's record and
# every sealed envelope: they answer the members only (a replica's or a sidecar's key),
# the keys that already read every committed block.
METHOD_LIST_SNAPSHOTS = "/qgpb.Sidecar/ListSnapshots"
METHOD_SNAPSHOT_CHUNK = "/qgpb.Sidecar/SnapshotChunk"
READ_METHODS = (
    METHOD_COMMITTED_BLOCKS,
    METHOD_EPOCH_ENDS,
    METHOD_GET_RECEIPT,
    METHOD_RECEIPTS,
    METHOD_ACCOUNT,
    METHOD_REGISTRY,
    METHOD_PENDING,
    METHOD_ADMIT,
    METHOD_ADMIT_BATCH,
    METHOD_LEDGER,
    METHOD_LIST_SNAPSHOTS,
    METHOD_SNAPSHOT_CHUNK,
)
# Who may call each method that answers some roles only and no agent: a server checks
# the caller's role against this table (`may_call`).
MEMBERS_ONLY_METHODS = frozenset({METHOD_LIST_SNAPSHOTS, METHOD_SNAPSHOT_CHUNK})

Sign = Callable[[bytes], bytes]  # Ed25519 over the statement: the signature, 64 bytes


class Role(StrEnum):
    OWNER = "owner"
    REPLICA = "replica"
    SIDECAR = "sidecar"
    AUDITOR = "auditor"


def read_statement(chain_id: str, method: str, time_ms: int, public_key: bytes) -> bytes:
    return bytes(Encoder(TAG_READ).text(chain_id).text(method).u64(time_ms).raw(public_key))


def read_auth_metadata(
    chain_id: str, method: str, public_key: bytes, sign: Sign, now_ms: int
) -> tuple[tuple[str, str], ...]:
    """The metadata that proves `public_key` on one call of `method`."""
    signature = sign(read_statement(chain_id, method, now_ms, public_key))
    return ((READ_AUTH_METADATA, f"{public_key.hex()}:{now_ms}:{signature.hex()}"),)


def caller_key(
    chain_id: str,
    method: str,
    metadata: Sequence[tuple[str, str | bytes]] | None,
    now_ms: int,
) -> bytes | None:
    """The public key that signed this call's statement, or None (missing, stale, for
    another method or chain, or not verifying)."""
    value = next((v for k, v in metadata or () if k == READ_AUTH_METADATA), None)
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 3:
        return None
    try:
        public_key, time_ms, signature = (
            bytes.fromhex(parts[0]),
            int(parts[1]),
            bytes.fromhex(parts[2]),
        )
    except ValueError:
        return None
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return None
    if abs(now_ms - time_ms) > READ_AUTH_SKEW_MS_MAX:
        return None
    statement = read_statement(chain_id, method, time_ms, public_key)
    return public_key if ed25519_verify(public_key, statement, signature) else None


def role_of(
    spec: ClusterSpec,
    public_key: bytes,
    consensus_keys: Collection[bytes] | None = None,
    owner_key: bytes | None = None,
    receipt_keys: Collection[bytes] | None = None,
) -> Role | None:
    """`consensus_keys`: the replicas' consensus keys that read as members here (on a
    chain that runs epochs, those of the epoch this replica runs: a key rotated out, which
    may be stolen, reads nothing); None for the cluster file's. `owner_key`: the owner's
    key after a rotation in the log (docs/engine.md, "Rotating keys"), which then reads as
    the owner instead of the cluster file's. `receipt_keys`: likewise the sidecars'
    receipt keys that read as members here (those of the epoch the server runs: after a
    `receipt` record or a `replace`, the key rotated out reads nothing; docs/consensus/
    epochs.md, "Receipt keys"); None for the cluster file's."""
    if public_key == (spec.owner_public_key if owner_key is None else owner_key):
        return Role.OWNER
    if consensus_keys is None:
        consensus_keys = [m.public_key for m in spec.members]
    if public_key in consensus_keys:
        return Role.REPLICA
    if receipt_keys is None:
        receipt_keys = [m.receipt_public_key for m in spec.members]
    if public_key in receipt_keys:
        return Role.SIDECAR
    if spec.joined is not None and spec.joined.receipt_public_key == public_key:
        return Role.SIDECAR  # a new machine's own sidecar (`init --join`)
    if any(a.public_key == public_key for a in current_auditors(spec)):
        return Role.AUDITOR
    return None


def may_call(method: str, role: Role | None) -> bool:
    """Whether a caller of `role` may call `method` at all: the members-only methods
    answer a replica's or a sidecar's key, every other read method any known role."""
    if method in MEMBERS_ONLY_METHODS:
        return role in (Role.REPLICA, Role.SIDECAR)
    return role is not None


AUDITORS_RELOAD_S_MIN = 1.0  # the cluster file is looked at again at most this often
_auditors: dict[Path, tuple[float, float, tuple[AuditorSpec, ...]]] = {}


def current_auditors(spec: ClusterSpec) -> tuple[AuditorSpec, ...]:
    """The auditors the cluster file lists now: `quorumgate admin add-auditor` edits it,
    and a running node sees the change without a restart (it re-reads the file when its
    modification time moved, at most once a second)."""
    path = spec.directory / CLUSTER_FILE
    now = time.monotonic()
    cached = _auditors.get(path)
    if cached is not None and now - cached[0] < AUDITORS_RELOAD_S_MIN:
        return cached[2]
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return spec.auditors if cached is None else cached[2]
    if cached is not None and cached[1] == mtime:
        _auditors[path] = (now, mtime, cached[2])
        return cached[2]
    try:
        auditors = load_cluster(spec.directory).auditors
    except ClusterFileError:
        auditors = spec.auditors if cached is None else cached[2]  # keep what held
    _auditors[path] = (now, mtime, auditors)
    return auditors


async def require_reader(
    spec: ClusterSpec,
    context: grpc.aio.ServicerContext,
    method: str,
    now_ms: int,
    consensus_keys: Collection[bytes] | None = None,
    owner_key: bytes | None = None,
    receipt_keys: Collection[bytes] | None = None,
) -> tuple[bytes, Role]:
    """The caller's key and role (`role_of`), or the call is aborted (it never returns
    then)."""
    key = caller_key(spec.chain_id, method, context.invocation_metadata(), now_ms)
    if key is None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method} needs a signed read statement ({READ_AUTH_METADATA})",
        )
    assert key is not None
    role = role_of(spec, key, consensus_keys, owner_key, receipt_keys)
    if role is None:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} answers the owner, the members and auditors only",
        )
    assert role is not None
    return key, role


class _ReadAuth:
    """Signs every call of an asyncio channel with one key (operators, sidecars, replay).
    grpc.aio files an interceptor under one call kind only, hence one class per kind."""

    def __init__(self, chain_id: str, public_key: bytes, sign: Sign, clock_ms: Callable[[], int]):
        self._chain_id = chain_id
        self._public_key = public_key
        self._sign = sign
        self._clock_ms = clock_ms

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        extra = read_auth_metadata(
            self._chain_id, method, self._public_key, self._sign, self._clock_ms()
        )
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *extra)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnaryReadAuth(_ReadAuth, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _UnaryStreamReadAuth(_ReadAuth, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


def read_auth_interceptors(
    chain_id: str, public_key: bytes, sign: Sign, clock_ms: Callable[[], int]
) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors that sign the unary and server-streaming calls of a channel."""
    return [
        _UnaryUnaryReadAuth(chain_id, public_key, sign, clock_ms),
        _UnaryStreamReadAuth(chain_id, public_key, sign, clock_ms),
    ]


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class SyncReadAuthInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    """The blocking-channel twin of `ReadAuthInterceptor`."""

    def __init__(self, chain_id: str, public_key: bytes, sign: Sign, clock_ms: Callable[[], int]):
        self._chain_id = chain_id
        self._public_key = public_key
        self._sign = sign
        self._clock_ms = clock_ms

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        extra = read_auth_metadata(
            self._chain_id, method, self._public_key, self._sign, self._clock_ms()
        )
        return _CallDetails(details, [*(details.metadata or ()), *extra])

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)
