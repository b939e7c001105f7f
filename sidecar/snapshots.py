"""Snapshots of a sidecar's governance state (docs/snapshots.md).

Every `interval_heights` executed heights a sidecar writes the engine state after that
height (`EngineState.to_bytes()`, the canonical bytes the state root is computed over)
into `DIR/node-I/snapshots/<height>/`, with a manifest naming what a sidecar needs to go
on from there: the height, the state root it signed, the ledger head and entry count, the
replica's block hash and time, and the SHA-256 of each chunk. It keeps the newest `kept`
of them, and never the one its own local history starts from (`pinned`).

A sidecar whose store is empty fetches one from its peers (`fetch_snapshot`, run by
`quorumgate replay --from-snapshot`) and trusts no single peer: a height is taken only
when f+1 members other than itself attest it — each its own block statement for that
height, signed with its receipt key of the height's epoch (checked against the chain of
epochs its replica stored, as a certificate is: `receipt_keys_at`), and the same ledger
head, entry count and block —
every chunk must hash to its digest in a manifest agreeing with the attested values, and
the state the chunks make must decode to exactly those bytes and hash to the attested
root. A peer that lies is outvoted (its attestation counts for nothing the others do not
say) and its chunks are refused (another holder serves them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import aio_channel
from quorumgate.runtime.readauth import (
    METHOD_LIST_SNAPSHOTS,
    METHOD_SNAPSHOT_CHUNK,
    read_auth_metadata,
)
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.receipts import (
    CertificateError,
    ReceiptEpochs,
    SignedBlock,
    Validity,
    receipt_keys_at,
)
from quorumgate.sidecar.store import Checkpoint

# The format of a snapshot's manifest and state bytes; a reader refuses any other.
SNAPSHOT_FORMAT_VERSION = 1
SNAPSHOT_INTERVAL_HEIGHTS = 10_000  # a snapshot after every height that is a multiple of it
SNAPSHOTS_KEPT = 2  # the newest kept on disk (besides the one local history starts from)
SNAPSHOT_CHUNK_BYTES = 1 << 20  # one chunk, one gRPC message (runtime/links.py allows 32 MiB)
SNAPSHOT_BYTES_MAX = 1 << 30  # a larger state is not snapshotted, nor fetched
SNAPSHOT_CHUNKS_MAX = SNAPSHOT_BYTES_MAX // SNAPSHOT_CHUNK_BYTES
SNAPSHOTS_LISTED_MAX = 8  # manifests one ListSnapshots reply carries
SNAPSHOT_ATTEST_HEIGHTS_MAX = 4  # heights one ListSnapshots request may ask attested
SNAPSHOT_CANDIDATES_MAX = 4  # heights a fetch tries, newest first
SNAPSHOT_CALL_TIMEOUT_S = 10.0  # one list or chunk call to a peer
SNAPSHOT_DIR = "snapshots"
# The fewest heights a pruning sidecar keeps below its executed height: a retention of 0
# or less would drop the heights a lagging peer or reader is still reading.
RETAIN_HEIGHTS_MIN = 1
# The shortest retention by age, in seconds of block time: a shorter one would keep less
# than a lagging reader needs to catch up after a restart (docs/pruning.md).
RETAIN_AGE_S_MIN = 60
OPTIONS_FILE = "snapshots.json"  # in the node directory: this sidecar's interval and count
MANIFEST_FILE = "manifest.json"
STATE_FILE = "state"
HASH_BYTES = 32

log = logging.getLogger("quorumgate.sidecar.snapshots")

# Where a sidecar stands after one height: what a snapshot carries besides the state, and
# what f+1 attestations must agree on (the store's checkpoint has the same fields).
Head = Checkpoint


class SnapshotError(Exception):
    """No snapshot could be fetched and checked (the reasons, one per candidate)."""


@dataclass(frozen=True)
class SnapshotOptions:
    """How often this sidecar writes a snapshot (0: never) and how many it keeps; and,
    when set, how many heights of history it keeps below its executed height before it
    prunes (`retain_heights`), how many seconds of block time it keeps before its executed
    height's block time (`retain_age_s`; with neither it keeps everything), and whether an
    auditors' copy bounds the pruning (`audit_copy`: docs/pruning.md)."""

    interval_heights: int = SNAPSHOT_INTERVAL_HEIGHTS
    kept: int = SNAPSHOTS_KEPT
    retain_heights: int | None = None
    audit_copy: bool = False
    retain_age_s: int | None = None

    @property
    def prunes(self) -> bool:
        """Whether a retention is set: this sidecar prunes after each snapshot."""
        return self.retain_heights is not None or self.retain_age_s is not None

    @staticmethod
    def read(node_dir: Path) -> SnapshotOptions:
        """`node_dir/snapshots.json` ({"interval_heights": N, "kept": K, "retain_heights":
        R, "retain_age_s": S, "audit_copy": true}, all optional), or the defaults when
        there is none."""
        path = node_dir / OPTIONS_FILE
        if not path.exists():
            return SnapshotOptions()
        try:
            doc = json.loads(path.read_text())
            retain = _whole_or_none(doc, "retain_heights", "heights")
            retain_age_s = _whole_or_none(doc, "retain_age_s", "seconds")
            audit_copy = doc.get("audit_copy", False)
            if not isinstance(audit_copy, bool):
                raise ValueError("audit_copy must be true or false")
            options = SnapshotOptions(
                int(doc.get("interval_heights", SNAPSHOT_INTERVAL_HEIGHTS)),
                int(doc.get("kept", SNAPSHOTS_KEPT)),
                retain,
                audit_copy,
                retain_age_s,
            )
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: not a snapshot options file: {err}") from err
        problem = options.retention_problem()
        if problem:
            raise ValueError(f"{path}: {problem}")
        return options

    def retention_problem(self) -> str:
        """Why these options cannot be honoured ('' when they can)."""
        if self.interval_heights < 0 or self.kept < 1:
            return "interval_heights must be >= 0 and kept >= 1"
        if self.retain_heights is not None and self.retain_heights < RETAIN_HEIGHTS_MIN:
            return (
                f"retain_heights must be >= {RETAIN_HEIGHTS_MIN} (leave it out to keep every "
                "height)"
            )
        if self.retain_age_s is not None and self.retain_age_s < RETAIN_AGE_S_MIN:
            return (
                f"retain_age_s must be >= {RETAIN_AGE_S_MIN} (seconds of block time; leave it "
                "out to prune by height only)"
            )
        if self.prunes and not self.interval_heights:
            name = "retain_heights" if self.retain_heights is not None else "retain_age_s"
            return (
                f"{name} needs snapshots (interval_heights > 0): history is pruned only up to "
                "a snapshot"
            )
        return ""


def _whole_or_none(doc: Any, key: str, unit: str) -> int | None:
    """`doc[key]` when it is a whole number (not a bool, a float or a string), None when
    absent; ValueError otherwise."""
    value = doc.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} must be a whole number of {unit}")
    return None if value is None else int(value)


@dataclass(frozen=True)
class Manifest:
    """What a snapshot holds (the `SnapshotManifest` message, docs/snapshots.md)."""

    height: int
    state_root: bytes
    ledger_head: bytes
    ledger_entries: int
    block_hash: bytes
    block_time_ms: int
    total_bytes: int
    chunk_bytes: int
    chunk_digests: tuple[bytes, ...]
    format_version: int = SNAPSHOT_FORMAT_VERSION

    @staticmethod
    def of(head: Head, data: bytes, chunk_bytes: int = SNAPSHOT_CHUNK_BYTES) -> Manifest:
        digests = tuple(
            hashlib.sha256(data[start : start + chunk_bytes]).digest()
            for start in range(0, len(data), chunk_bytes)
        )
        return Manifest(
            head.height, head.state_root, head.ledger_head, head.ledger_entries,
            head.block_hash, head.block_time_ms, len(data), chunk_bytes, digests,
        )  # fmt: skip

    @property
    def head(self) -> Head:
        return Head(
            self.height, self.state_root, self.ledger_head, self.ledger_entries,
            self.block_hash, self.block_time_ms,
        )  # fmt: skip

    def problem(self) -> str | None:
        """Why this manifest cannot describe a snapshot this build reads, or None."""
        if self.format_version != SNAPSHOT_FORMAT_VERSION:
            version = self.format_version
            return f"format version {version}, this build reads {SNAPSHOT_FORMAT_VERSION}"
        if not 0 < self.chunk_bytes <= SNAPSHOT_CHUNK_BYTES:
            return f"chunks of {self.chunk_bytes} bytes (at most {SNAPSHOT_CHUNK_BYTES})"
        if not 0 < self.total_bytes <= SNAPSHOT_BYTES_MAX:
            return f"{self.total_bytes} bytes (at most {SNAPSHOT_BYTES_MAX})"
        chunks = -(-self.total_bytes // self.chunk_bytes)
        if len(self.chunk_digests) != chunks or any(
            len(d) != HASH_BYTES for d in self.chunk_digests
        ):
            return f"{len(self.chunk_digests)} chunk digests for {chunks} chunks"
        return None

    def chunk_size(self, index: int) -> int:
        return min(self.chunk_bytes, self.total_bytes - index * self.chunk_bytes)

    def to_pb(self) -> spb.SnapshotManifest:
        return spb.SnapshotManifest(
            format_version=self.format_version, height=self.height,
            state_root=self.state_root, ledger_head=self.ledger_head,
            ledger_entries=self.ledger_entries, block_hash=self.block_hash,
            block_time_ms=self.block_time_ms, total_bytes=self.total_bytes,
            chunk_bytes=self.chunk_bytes, chunk_digests=list(self.chunk_digests),
        )  # fmt: skip

    @staticmethod
    def from_pb(msg: spb.SnapshotManifest) -> Manifest:
        return Manifest(
            msg.height, bytes(msg.state_root), bytes(msg.ledger_head), msg.ledger_entries,
            bytes(msg.block_hash), msg.block_time_ms, msg.total_bytes, msg.chunk_bytes,
            tuple(bytes(d) for d in msg.chunk_digests), msg.format_version,
        )  # fmt: skip

    def to_json(self) -> str:
        doc = {
            "format_version": self.format_version, "height": self.height,
            "state_root": self.state_root.hex(), "ledger_head": self.ledger_head.hex(),
            "ledger_entries": self.ledger_entries, "block_hash": self.block_hash.hex(),
            "block_time_ms": self.block_time_ms, "total_bytes": self.total_bytes,
            "chunk_bytes": self.chunk_bytes,
            "chunk_digests": [d.hex() for d in self.chunk_digests],
        }  # fmt: skip
        return json.dumps(doc, indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        doc = json.loads(text)
        return Manifest(
            int(doc["height"]), bytes.fromhex(doc["state_root"]),
            bytes.fromhex(doc["ledger_head"]), int(doc["ledger_entries"]),
            bytes.fromhex(doc["block_hash"]), int(doc["block_time_ms"]),
            int(doc["total_bytes"]), int(doc["chunk_bytes"]),
            tuple(bytes.fromhex(d) for d in doc["chunk_digests"]), int(doc["format_version"]),
        )  # fmt: skip


@dataclass(frozen=True)
class Attestation:
    """One member's word on one height: its signed block statement and its head there."""

    signed: SignedBlock
    head: Head

    def to_pb(self) -> spb.SnapshotAttestation:
        s, h = self.signed, self.head
        msg = spb.SnapshotAttestation(
            height=s.height, verdict_root=s.verdict_root, state_root=s.state_root,
            leaf_count=s.leaf_count, signer=s.signer, signature=s.signature,
            ledger_head=h.ledger_head, ledger_entries=h.ledger_entries,
            block_hash=h.block_hash, block_time_ms=h.block_time_ms, epoch=s.epoch,
        )  # fmt: skip
        if s.validity is not None:
            msg.validity.block_time_ms = s.validity.block_time_ms
            msg.validity.valid_until_ms = s.validity.valid_until_ms
        return msg

    @staticmethod
    def from_pb(msg: spb.SnapshotAttestation) -> Attestation:
        validity = (
            Validity(msg.validity.block_time_ms, msg.validity.valid_until_ms)
            if msg.HasField("validity")
            else None
        )
        signed = SignedBlock(
            msg.height, bytes(msg.verdict_root), bytes(msg.state_root), msg.leaf_count,
            msg.signer, bytes(msg.signature), validity, msg.epoch,
        )  # fmt: skip
        head = Head(
            msg.height, bytes(msg.state_root), bytes(msg.ledger_head), msg.ledger_entries,
            bytes(msg.block_hash), msg.block_time_ms,
        )  # fmt: skip
        return Attestation(signed, head)


# ====================================================================== on disk


class SnapshotDir:
    """The snapshots one sidecar holds: `<dir>/<height>/manifest.json` and `state`.
    A snapshot is written into a temporary directory and renamed into place, so a crash
    leaves a whole snapshot or none."""

    def __init__(self, root: Path, kept: int = SNAPSHOTS_KEPT) -> None:
        self.root = root
        self.kept = kept
        self.pinned: int | None = None  # the height local history starts from: never removed
        self._manifests: dict[int, Manifest] = {}
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if not entry.name.isdigit():
                if entry.name.endswith(".tmp"):
                    shutil.rmtree(entry, ignore_errors=True)  # a write cut short
                continue
            try:
                manifest = Manifest.from_json((entry / MANIFEST_FILE).read_text())
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("event=snapshot_unreadable path=%s error=%s", entry, err)
                continue
            if manifest.height == int(entry.name) and manifest.problem() is None:
                self._manifests[manifest.height] = manifest

    def manifests(self) -> list[Manifest]:
        """The snapshots held, newest first."""
        self._load()
        return [self._manifests[h] for h in sorted(self._manifests, reverse=True)]

    def manifest(self, height: int) -> Manifest | None:
        self._load()
        return self._manifests.get(height)

    def write(self, head: Head, data: bytes) -> Manifest | None:
        """Write one snapshot (blocking: run it off the event loop) and drop the oldest
        beyond `kept`; None when the state is above `SNAPSHOT_BYTES_MAX`."""
        self._load()
        if len(data) > SNAPSHOT_BYTES_MAX or not data:
            log.warning("event=snapshot_skipped height=%d bytes=%d", head.height, len(data))
            return None
        manifest = Manifest.of(head, data)
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / str(head.height)
        tmp = self.root / f"{head.height}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, content in ((STATE_FILE, data), (MANIFEST_FILE, manifest.to_json().encode())):
            with open(tmp / name, "wb") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self._manifests[head.height] = manifest
        self._prune()
        return manifest

    def _prune(self) -> None:
        keep = set(sorted(self._manifests, reverse=True)[: self.kept])
        if self.pinned is not None:
            keep.add(self.pinned)
        for height in [h for h in self._manifests if h not in keep]:
            del self._manifests[height]
            shutil.rmtree(self.root / str(height), ignore_errors=True)

    def chunk(self, height: int, index: int) -> bytes | None:
        manifest = self.manifest(height)
        if manifest is None or not 0 <= index < len(manifest.chunk_digests):
            return None
        try:
            with open(self.root / str(height) / STATE_FILE, "rb") as source:
                source.seek(index * manifest.chunk_bytes)
                return source.read(manifest.chunk_size(index))
        except OSError:
            return None

    def state(self, height: int) -> bytes | None:
        """A held snapshot's state bytes, every chunk checked against its digest."""
        manifest = self.manifest(height)
        if manifest is None:
            return None
        try:
            data = (self.root / str(height) / STATE_FILE).read_bytes()
        except OSError:
            return None
        return data if Manifest.of(manifest.head, data, manifest.chunk_bytes) == manifest else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ====================================================================== fetching


ListFn = Callable[[Sequence[int]], Awaitable[spb.SnapshotListReply]]
ChunkFn = Callable[[int, int], Awaitable[bytes]]


@dataclass(frozen=True)
class Peer:
    """One member asked for snapshots: its index (the channel is pinned to its
    certificate, so what it answers is its own) and its two calls."""

    index: int
    list: ListFn
    chunk: ChunkFn


@dataclass
class Fetched:
    """A snapshot fetched and checked: its manifest, state bytes, who attested it."""

    manifest: Manifest
    data: bytes
    attested_by: tuple[int, ...]
    served_by: tuple[int, ...]
    chunks_refused: int = 0
    refusals: list[str] = field(default_factory=list)


def grpc_peers(
    spec: ClusterSpec, own: int, keys: Sequence[SigningKey]
) -> list[tuple[Peer, grpc.aio.Channel]]:
    """A `Peer` for every other member's sidecar, each call signed with one of our receipt
    keys `keys` (a member's key: the snapshot methods answer members only). A peer answers
    our member's key of the epoch it executes in (docs/consensus/epochs.md, "Receipt
    keys"), so a call it refuses is made again with the next key, each key once. The
    caller closes the channels."""
    out = []
    for index in range(spec.n):
        if index == own:
            continue
        channel = aio_channel(spec, index, "sidecar")
        stub = spb_grpc.SidecarStub(channel)
        signed = _SignedCalls(spec.chain_id, keys)

        async def listed(
            heights: Sequence[int],
            stub: spb_grpc.SidecarStub = stub,
            signed: _SignedCalls = signed,
        ) -> spb.SnapshotListReply:
            request = spb.SnapshotListRequest(attest_heights=list(heights))
            reply: spb.SnapshotListReply = await signed.call(
                METHOD_LIST_SNAPSHOTS,
                lambda metadata: stub.ListSnapshots(
                    request, timeout=SNAPSHOT_CALL_TIMEOUT_S, metadata=metadata
                ),
            )
            return reply

        async def chunk(
            height: int,
            index: int,
            stub: spb_grpc.SidecarStub = stub,
            signed: _SignedCalls = signed,
        ) -> bytes:
            request = spb.SnapshotChunkRequest(height=height, index=index)
            reply = await signed.call(
                METHOD_SNAPSHOT_CHUNK,
                lambda metadata: stub.SnapshotChunk(
                    request, timeout=SNAPSHOT_CALL_TIMEOUT_S, metadata=metadata
                ),
            )
            return bytes(reply.data)

        out.append((Peer(index, listed, chunk), channel))
    return out


class _SignedCalls:
    """Calls to one peer signed with the first of our keys it takes (module doc of
    sidecar/receiptkeys.py `ReadKeys`): a refused key is not tried again."""

    def __init__(self, chain_id: str, keys: Sequence[SigningKey]) -> None:
        self.chain_id = chain_id
        self.keys = list(keys)

    async def call(
        self, method: str, make: Callable[[tuple[tuple[str, str], ...]], Awaitable[Any]]
    ) -> Any:
        while True:
            key = self.keys[0]
            metadata = read_auth_metadata(
                self.chain_id,
                method,
                bytes(key.verify_key),
                lambda message, key=key: bytes(key.sign(message).signature),  # type: ignore[misc]
                int(time.time() * 1000),
            )
            try:
                return await make(metadata)
            except grpc.aio.AioRpcError as err:
                refused = err.code() in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                )
                if not refused or len(self.keys) == 1:
                    raise
                self.keys.pop(0)


async def _ask(peer: Peer, heights: Sequence[int]) -> spb.SnapshotListReply | None:
    try:
        return await peer.list(heights)
    except (grpc.aio.AioRpcError, TimeoutError, OSError) as err:
        log.info("event=snapshot_list_failed peer=%d cause=%s", peer.index, type(err).__name__)
        return None


def _attestations(
    spec: ClusterSpec,
    own: int,
    height: int,
    replies: dict[int, spb.SnapshotListReply],
    epochs: ReceiptEpochs,
) -> dict[Head, set[int]]:
    """For `height`: each head some peer attested, with the distinct members whose
    attestation of it verifies (signed by the member that answered, with its receipt key
    of the epoch the statement names, which must hold `height`: `receipt_keys_at`, as a
    certificate is checked; and not ourselves). So a receipt key rotated out at the end of
    an epoch, or a replaced machine's, attests no height after it."""
    heads: dict[Head, set[int]] = {}
    for index, reply in replies.items():
        for msg in reply.attestations:
            if msg.height != height or msg.signer != index or index == own:
                continue
            try:
                attestation = Attestation.from_pb(msg)
                keys = receipt_keys_at(epochs, attestation.signed.epoch, height)
            except (ValueError, CertificateError):
                continue
            if index < len(keys) and attestation.signed.signed_by(spec.chain_id, keys[index]):
                heads.setdefault(attestation.head, set()).add(index)
    return heads


def _agreed(f: int, heads: dict[Head, set[int]]) -> tuple[Head, set[int]] | None:
    """The head f+1 members attested, or None. Any f+1 members hold an honest one, and
    honest members attest one and the same head (execution is deterministic), so at most
    one head can have f+1 attestations."""
    for head, signers in sorted(heads.items(), key=lambda item: -len(item[1])):
        if len(signers) >= f + 1:
            return head, signers
    return None


def _f_at(spec: ClusterSpec, epochs: ReceiptEpochs, height: int) -> int:
    """The f of the epoch that holds `height` (its members' count, after a grow or a
    shrink); the cluster file's without a chain of epochs."""
    if epochs.chained:
        for epoch in epochs.epochs:
            if epoch.holds(height):
                return (len(epoch.keys) - 1) // 3
    return spec.f


def check_state(config: EngineConfig, manifest: Manifest, data: bytes) -> str | None:
    """Why `data` is not the state `manifest` names, or None: it must decode, encode back
    to exactly the same bytes, be the state after `manifest.height`, and hash to its root
    under the chain's state version."""
    try:
        engine = Engine.from_state_bytes(config, data)
    except ValueError as err:
        return f"the state does not decode: {err}"
    if engine.state.to_bytes() != data:
        return "the state is not in canonical form"
    if engine.state.last_height != manifest.height:
        return f"the state is after height {engine.state.last_height}, not {manifest.height}"
    if engine.state_root() != manifest.state_root:
        return "the state does not hash to the attested state root"
    return None


async def _download(manifest: Manifest, holders: list[Peer], fetched: Fetched) -> bytes | None:
    """Every chunk of `manifest`, each from the first holder whose chunk hashes to its
    digest (a chunk that does not is refused and asked of the next holder)."""
    parts: list[bytes] = []
    served: set[int] = set()
    for index, digest in enumerate(manifest.chunk_digests):
        good = None
        for peer in holders:
            try:
                data = await peer.chunk(manifest.height, index)
            except (grpc.aio.AioRpcError, TimeoutError, OSError):
                continue
            if len(data) == manifest.chunk_size(index) and hashlib.sha256(data).digest() == digest:
                good = data
                served.add(peer.index)
                break
            fetched.chunks_refused += 1
            fetched.refusals.append(
                f"height {manifest.height} chunk {index} from member {peer.index}: "
                "does not hash to its digest"
            )
        if good is None:
            return None
        parts.append(good)
    fetched.served_by = tuple(sorted(served))
    return b"".join(parts)


async def fetch_snapshot(
    spec: ClusterSpec,
    config: EngineConfig,
    own: int,
    peers: Sequence[Peer],
    epochs: ReceiptEpochs | None = None,
) -> Fetched:
    """The newest snapshot f+1 members attest, fetched and checked (module doc); raises
    `SnapshotError` with every candidate's reason when there is none. `epochs`: the chain
    of epochs the attestations are checked against (each member's receipt key of the
    height's epoch); without it, the cluster file's keys in any epoch, which only a chain
    that never rotated a receipt key may use."""
    if epochs is None:
        epochs = ReceiptEpochs.genesis([m.receipt_public_key for m in spec.members])
    listed = await asyncio.gather(*(_ask(peer, ()) for peer in peers))
    replies = {p.index: r for p, r in zip(peers, listed, strict=True) if r is not None}
    offers: dict[int, list[tuple[Peer, Manifest]]] = {}
    for peer in peers:
        reply = replies.get(peer.index)
        for msg in reply.snapshots[:SNAPSHOTS_LISTED_MAX] if reply else ():
            manifest = Manifest.from_pb(msg)
            if manifest.problem() is None:
                offers.setdefault(manifest.height, []).append((peer, manifest))
    reasons: list[str] = []
    fetched = Fetched(Manifest(0, b"", b"", 0, b"", 0, 0, 0, ()), b"", (), ())
    for height in sorted(offers, reverse=True)[:SNAPSHOT_CANDIDATES_MAX]:
        asked = await asyncio.gather(*(_ask(peer, (height,)) for peer in peers))
        attesting = {p.index: r for p, r in zip(peers, asked, strict=True) if r is not None}
        agreed = _agreed(
            _f_at(spec, epochs, height), _attestations(spec, own, height, attesting, epochs)
        )
        if agreed is None:
            reasons.append(f"height {height}: no state root that f+1 members signed")
            continue
        head, signers = agreed
        matching = [(p, m) for p, m in offers[height] if m.head == head]
        if not matching:
            reasons.append(f"height {height}: no holder's manifest agrees with the attested head")
            continue
        for peer, manifest in matching:
            holders = [peer] + [p for p, m in matching if m == manifest and p is not peer]
            data = await _download(manifest, holders, fetched)
            problem = (
                "a chunk no holder serves whole"
                if data is None
                else check_state(config, manifest, data)
            )
            if problem is None and data is not None:
                fetched.manifest, fetched.data = manifest, data
                fetched.attested_by = tuple(sorted(signers))
                return fetched
            reasons.append(f"height {height} from member {peer.index}: {problem}")
    if not offers:
        reasons.append("no peer answered with a snapshot")
    raise SnapshotError("; ".join(reasons + fetched.refusals))
