"""Cluster membership: who the members are and their consensus keys.

n = 3f+1 members come from one cluster file (docs/operating.md). 4 and 7 are the supported sizes;
any n >= 4 works, with f = (n-1)//3 and a quorum of floor((n+f)/2)+1, which is 2f+1 when
n = 3f+1 (any two quorums then share at least f+1 members, so at least one honest one).

It lives in the bottom layer because every layer needs it: the consensus core checks
votes against it, the cluster file builds it, and replay checks QCs with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from quorumgate.proto.crypto import ed25519_verify
from quorumgate.proto.domains import (
    RECONFIG_OWNER,
    RECONFIG_OWNER_KEY,
    RECONFIG_RECEIPT_KEY,
    RECONFIG_RECORD,
)

PUBLIC_KEY_BYTES = 32
CHAIN_ID_BYTES_MAX = 64
MEMBERS_MIN = 4
MEMBERS_MAX = 64


@dataclass(frozen=True, slots=True)
class Member:
    index: int
    public_key: bytes
    address: str = ""

    def __post_init__(self) -> None:
        if len(self.public_key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"member {self.index}: public key must be {PUBLIC_KEY_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Membership:
    chain_id: str
    members: tuple[Member, ...]
    # The consensus epoch this member set signs in (docs/consensus/epochs.md): 0 until the
    # first committed reconfiguration, then one more at each.
    epoch: int = 0
    # Derived from `members` once: the core asks for them on every message (properties
    # were about a million calls per twenty simulated clusters).
    n: int = field(default=0, init=False, compare=False)
    f: int = field(default=0, init=False, compare=False)
    quorum: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.chain_id or len(self.chain_id.encode()) > CHAIN_ID_BYTES_MAX:
            raise ValueError(f"chain id must be 1..{CHAIN_ID_BYTES_MAX} bytes")
        n = len(self.members)
        if not MEMBERS_MIN <= n <= MEMBERS_MAX:
            raise ValueError(f"a cluster needs {MEMBERS_MIN}..{MEMBERS_MAX} members, got {n}")
        if [m.index for m in self.members] != list(range(n)):
            raise ValueError("member indexes must be 0..n-1 in order")
        if len({m.public_key for m in self.members}) != n:
            raise ValueError("two members share a public key")
        f = (n - 1) // 3
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "f", f)
        object.__setattr__(self, "quorum", (n + f) // 2 + 1)

    def leader(self, view: int) -> int:
        """Round-robin leader of a view: the pacemaker's rotation (docs/consensus/protocol.md)."""
        return view % self.n

    def key(self, index: int) -> bytes:
        return self.members[index].public_key

    def is_member(self, index: int) -> bool:
        return 0 <= index < self.n

    @property
    def signing_id(self) -> str:
        """What every consensus signature of this epoch names as its chain: the chain id in
        epoch 0, so that a chain that never reconfigures signs the bytes it always signed,
        and the chain id with the epoch after, so that no vote, timeout or certificate of
        one epoch is valid in another (docs/consensus/epochs.md, "Signatures name their
        epoch")."""
        return self.chain_id if self.epoch == 0 else f"{self.chain_id}{EPOCH_SEPARATOR}{self.epoch}"

    def index_of(self, public_key: bytes) -> int | None:
        """The index of the member holding `public_key` in this epoch, if any."""
        return next((m.index for m in self.members if m.public_key == public_key), None)


# Separates the chain id from the epoch in `Membership.signing_id`. (A chain whose own id had
# that form would sign the same text in its epoch 0, but with its own members' keys: a
# signature is only ever checked against one chain's member set.)
EPOCH_SEPARATOR = "#epoch="

# The reconfiguration record: an owner operation the application commits as one transaction
# of the log, which the consensus core recognises by its tag (docs/consensus/epochs.md,
# "The record"). Layout: tag || u8 kind || u8 count || u32 index * count || u8 count ||
# 32-byte key * count, and for kinds `owner` and `receipt` only, the new key's 64-byte
# proof of possession after it (`owner_key_statement`, `receipt_key_statement`). Kinds are
# appended, never reordered, so that an encoding keeps its meaning.
RECONFIG_TAG = RECONFIG_RECORD + b"\x00"  # the NUL ends the tag
RECONFIG_KINDS = ("replace", "rotate", "add", "remove", "owner", "receipt")
OWNER_PROOF_BYTES = 64  # an `owner` or `receipt` record's proof of possession of the new key
PROOF_KINDS = ("owner", "receipt")  # the kinds whose record ends with that proof
RECONFIG_STEP_MEMBERS = 3  # n = 3f+1 at every epoch: members come and go three at a time
RECONFIG_SIZES = (4, 7)  # the cluster sizes a reconfiguration may lead to
RECONFIG_ITEMS_MAX = 3  # indexes or keys one record names
# A `replace` record on a live chain carries the new member's description (`MemberEntry`),
# one per key, each as u16 length || canonical JSON after the keys. The bound holds the
# largest TLS certificate a cluster file takes (proto/tls.py, 8 KiB) and the other fields.
ENTRY_LENGTH_BYTES = 2
MEMBER_ENTRY_BYTES_MAX = 12 * 1024
ENTRY_KINDS = ("replace", "add")  # the kinds whose record may carry member descriptions
ENTRY_HOST_CHARS_MAX = 253  # a DNS name's longest text form (RFC 1035, section 2.3.4)
ENTRY_PORT_FIELDS = ("replica_port", "metrics_port", "sidecar_port", "sidecar_metrics_port")
_ENTRY_FIELDS = frozenset(("index", "host", "public_key", "receipt_public_key", *ENTRY_PORT_FIELDS))


class MemberEntryError(ValueError):
    """A member description that does not parse exactly, or does not fit its record."""


@dataclass(frozen=True, slots=True)
class MemberEntry:
    """A member's public description: where it listens, its consensus and receipt keys and
    its TLS certificate (empty on a plaintext cluster). cluster.json lists one per member
    (proto/clusterfile.py, as `MemberSpec`), and a `replace` or `add` record carries one
    per new member, whose consensus key must be the record's key (docs/consensus/
    epochs.md, "The record")."""

    index: int
    host: str
    replica_port: int
    metrics_port: int
    sidecar_port: int
    sidecar_metrics_port: int
    public_key: bytes
    receipt_public_key: bytes
    tls_cert: bytes = b""  # PEM; empty in an insecure cluster

    @property
    def replica_address(self) -> str:
        return f"{self.host}:{self.replica_port}"

    @property
    def sidecar_address(self) -> str:
        return f"{self.host}:{self.sidecar_port}"

    def document(self) -> dict[str, object]:
        """The entry as cluster.json writes a member (public parts only)."""
        doc: dict[str, object] = {
            "index": self.index,
            "host": self.host,
            "replica_port": self.replica_port,
            "metrics_port": self.metrics_port,
            "sidecar_port": self.sidecar_port,
            "sidecar_metrics_port": self.sidecar_metrics_port,
            "public_key": self.public_key.hex(),
            "receipt_public_key": self.receipt_public_key.hex(),
        }
        if self.tls_cert:
            doc["tls_cert"] = self.tls_cert.decode()
        return doc

    def encode(self) -> bytes:
        """Canonical JSON: sorted keys, no spaces, ASCII; one encoding per entry."""
        return json.dumps(self.document(), sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_document(doc: object) -> MemberEntry:
        """The entry a cluster.json member object describes; `MemberEntryError` naming the
        first field that is missing, of the wrong type, or out of range."""
        if not isinstance(doc, dict):
            raise MemberEntryError("a member entry is a JSON object")
        fields = set(doc)
        extra = fields - _ENTRY_FIELDS - {"tls_cert"}
        if extra:
            raise MemberEntryError(f"unknown field {sorted(extra)[0]!r}")
        missing = _ENTRY_FIELDS - fields
        if missing:
            raise MemberEntryError(f"missing field {sorted(missing)[0]!r}")
        ints = {}
        for name in ("index", *ENTRY_PORT_FIELDS):
            value = doc[name]
            if type(value) is not int:
                raise MemberEntryError(f"{name} must be an integer")
            ints[name] = value
        if not 0 <= ints["index"] < MEMBERS_MAX:
            raise MemberEntryError("index out of range")
        if any(not 1 <= ints[name] <= 65535 for name in ENTRY_PORT_FIELDS):
            raise MemberEntryError("a port is out of range (1..65535)")
        host = doc["host"]
        if not isinstance(host, str) or not 0 < len(host) <= ENTRY_HOST_CHARS_MAX:
            raise MemberEntryError(f"host must be 1..{ENTRY_HOST_CHARS_MAX} characters")
        if any(c.isspace() or c in "/,[]" or not c.isprintable() for c in host):
            raise MemberEntryError("host must be an address or a host name")
        keys = []
        for name in ("public_key", "receipt_public_key"):
            text = doc[name]
            try:
                key = bytes.fromhex(text) if isinstance(text, str) else b""
            except ValueError:
                key = b""
            if len(key) != PUBLIC_KEY_BYTES or text != key.hex():
                raise MemberEntryError(f"{name} must be {PUBLIC_KEY_BYTES} bytes, lowercase hex")
            keys.append(key)
        tls_cert = b""
        if "tls_cert" in doc:
            if not isinstance(doc["tls_cert"], str) or not doc["tls_cert"].isascii():
                raise MemberEntryError("tls_cert must be PEM text")
            tls_cert = doc["tls_cert"].encode()
            _check_pem_shape(tls_cert)
        return MemberEntry(
            ints["index"],
            host,
            ints["replica_port"],
            ints["metrics_port"],
            ints["sidecar_port"],
            ints["sidecar_metrics_port"],
            keys[0],
            keys[1],
            tls_cert,
        )

    @staticmethod
    def parse(raw: bytes) -> MemberEntry:
        """The entry `raw` encodes, only if `raw` is exactly its canonical encoding (so that
        one entry has one signed form) and within `MEMBER_ENTRY_BYTES_MAX`."""
        if len(raw) > MEMBER_ENTRY_BYTES_MAX:
            raise MemberEntryError(f"a member entry is at most {MEMBER_ENTRY_BYTES_MAX} bytes")
        try:
            doc = json.loads(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError) as err:
            raise MemberEntryError("a member entry is canonical JSON") from err
        entry = MemberEntry.from_document(doc)
        if entry.encode() != raw:
            raise MemberEntryError("a member entry is canonical JSON (sorted keys, no spaces)")
        return entry


PEM_BEGIN = b"-----BEGIN CERTIFICATE-----\n"
PEM_END = b"-----END CERTIFICATE-----\n"


def _check_pem_shape(pem: bytes) -> None:
    """One PEM-armoured certificate (RFC 7468, section 2: the label, base64 lines, the end
    line), by its shape only. The consensus core parses no X.509: whether a record applies
    must not depend on a library's version, and the core imports no such library
    (docs/architecture/0006-sans-io-core-and-simulator.md). The certificate itself, and
    that it names the member, are checked at the doors: the mempool refuses a record
    whose certificate does not (proto/tls.py `certificate_problem`), and so do the commands
    that make one (proto/clusterfile.py `parse_member_entry`)."""
    if not (pem.startswith(PEM_BEGIN) and pem.endswith(PEM_END)):
        raise MemberEntryError("tls_cert must be one PEM certificate")
    body = pem[len(PEM_BEGIN) : -len(PEM_END)]
    lines = body.split(b"\n")
    if not body or lines[-1] != b"" or any(not line for line in lines[:-1]):
        raise MemberEntryError("tls_cert must be one PEM certificate")
    alphabet = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    text = b"".join(lines)
    if len(text) % 4 or any(c not in alphabet for c in text) or b"=" in text.rstrip(b"="):
        raise MemberEntryError("tls_cert must be one PEM certificate (base64 lines)")


def record_entries(record: Reconfiguration) -> tuple[MemberEntry, ...]:
    """The member descriptions of a `replace` record, checked against it: one per key,
    each parsing exactly, naming the record's index and key. `MemberEntryError` says what
    is wrong (a live replica then takes the record as no change)."""
    if len(record.entries) != len(record.keys):
        raise MemberEntryError(f"{len(record.entries)} member entries for {len(record.keys)} keys")
    out = []
    for i, raw in enumerate(record.entries):
        entry = MemberEntry.parse(raw)
        if entry.public_key != record.keys[i]:
            raise MemberEntryError("the entry's public_key is not the record's key")
        if i < len(record.indexes) and entry.index != record.indexes[i]:
            raise MemberEntryError("the entry's index is not the record's index")
        out.append(entry)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Reconfiguration:
    """One change of the member set, effective at the next epoch. `replace` gives member
    `indexes[0]` (a new machine) the key `keys[0]`; `rotate` does the same for a member
    that keeps its machine; `add` appends three members with `keys`; `remove` takes out the
    three members `indexes`, the others keeping their order. `owner` changes no member: it
    hands the record key to `keys[0]` from the next epoch on, `proof` being that key's
    signature over `owner_key_statement` (only `OwnerRecords` carries it out). `receipt`
    changes no member either: member `indexes[0]`'s sidecar signs its receipts with
    `keys[0]` from the next epoch on, `proof` being that key's signature over
    `receipt_key_statement` (only `OwnerRecords` carries it out too)."""

    kind: str
    indexes: tuple[int, ...] = ()
    keys: tuple[bytes, ...] = ()
    proof: bytes = b""
    # `replace` on a live chain: each new key's member description (`MemberEntry.encode`),
    # in the order of `keys`. None in the simulator's bare records, which encode as before.
    entries: tuple[bytes, ...] = ()

    def encode(self) -> bytes:
        out = bytearray(RECONFIG_TAG)
        out.append(RECONFIG_KINDS.index(self.kind))
        out.append(len(self.indexes))
        for index in self.indexes:
            out += index.to_bytes(4, "big")
        out.append(len(self.keys))
        for key in self.keys:
            out += key
        if self.kind in PROOF_KINDS:
            out += self.proof
        for entry in self.entries:
            out += len(entry).to_bytes(ENTRY_LENGTH_BYTES, "big") + entry
        return bytes(out)

    @staticmethod
    def parse(tx: bytes) -> Reconfiguration | None:
        """The record `tx` holds, or None if it is not one (any other transaction, or a
        record that does not parse exactly: it then changes nothing)."""
        if not tx.startswith(RECONFIG_TAG):
            return None
        body = tx[len(RECONFIG_TAG) :]
        if len(body) < 3 or body[0] >= len(RECONFIG_KINDS) or body[1] > RECONFIG_ITEMS_MAX:
            return None
        at = 2 + 4 * body[1]
        indexes = tuple(int.from_bytes(body[2 + 4 * i : 6 + 4 * i], "big") for i in range(body[1]))
        if len(body) <= at or body[at] > RECONFIG_ITEMS_MAX:
            return None
        keys_count = body[at]
        kind = RECONFIG_KINDS[body[0]]
        proof_bytes = OWNER_PROOF_BYTES if kind in PROOF_KINDS else 0
        end = at + 1 + PUBLIC_KEY_BYTES * keys_count
        if len(body) < end + proof_bytes:
            return None
        keys = tuple(
            body[at + 1 + PUBLIC_KEY_BYTES * i : at + 1 + PUBLIC_KEY_BYTES * (i + 1)]
            for i in range(keys_count)
        )
        proof = body[end : end + proof_bytes]
        entries = _split_entries(body[end + proof_bytes :], keys_count, kind)
        if entries is None:
            return None
        return Reconfiguration(kind, indexes, keys, proof, entries)

    def apply(self, current: Membership) -> Membership | None:
        """The member set of the next epoch, or None if this record does not apply to
        `current` (committed all the same, it then changes nothing). An `owner` record
        changes no member set here: whether it applies depends on the record key in force,
        which `OwnerRecords.step` knows (a bare one, as the simulator's, changes nothing);
        nor does a `receipt` record, whose checks need the epoch's receipt keys."""
        keys = [m.public_key for m in current.members]
        if self.kind in PROOF_KINDS:
            return None
        if self.kind in ("replace", "rotate"):
            if len(self.indexes) != 1 or len(self.keys) != 1:
                return None
            if not current.is_member(self.indexes[0]):
                return None
            keys[self.indexes[0]] = self.keys[0]
        elif self.kind == "add":
            if self.indexes or len(self.keys) != RECONFIG_STEP_MEMBERS:
                return None
            keys += self.keys
        else:
            gone = set(self.indexes)
            if self.keys or len(gone) != RECONFIG_STEP_MEMBERS:
                return None
            if not all(current.is_member(i) for i in gone):
                return None
            keys = [k for i, k in enumerate(keys) if i not in gone]
        if len(keys) not in RECONFIG_SIZES or any(len(k) != PUBLIC_KEY_BYTES for k in keys):
            return None
        if len(set(keys)) != len(keys):
            return None
        members = tuple(Member(i, k) for i, k in enumerate(keys))
        return replace(current, members=members, epoch=current.epoch + 1)


def _split_entries(rest: bytes, count: int, kind: str) -> tuple[bytes, ...] | None:
    """What follows a record's keys (and proof): nothing, or for a kind of `ENTRY_KINDS`
    exactly `count` length-prefixed entries of at most `MEMBER_ENTRY_BYTES_MAX` bytes.
    None if it is anything else (then the record does not parse)."""
    if not rest:
        return ()
    if kind not in ENTRY_KINDS:
        return None
    entries: list[bytes] = []
    at = 0
    while at < len(rest) and len(entries) < count:
        size = int.from_bytes(rest[at : at + ENTRY_LENGTH_BYTES], "big")
        at += ENTRY_LENGTH_BYTES
        if at > len(rest) or size > MEMBER_ENTRY_BYTES_MAX or at + size > len(rest):
            return None
        entries.append(rest[at : at + size])
        at += size
    if at != len(rest) or len(entries) != count:
        return None
    return tuple(entries)


# A record the owner signed (chains whose consensus version runs epochs: proto/
# chainversions.py `runs_epochs`): record || u64 epoch || 64-byte Ed25519 signature over
# `record_statement`. The epoch is the one the record ends, so a record committed once
# cannot be replayed to undo a later change (docs/consensus/epochs.md, "Who may change
# the member set").
RECORD_EPOCH_BYTES = 8
RECORD_SIGNATURE_BYTES = 64
RECORD_TRAILER_BYTES = RECORD_EPOCH_BYTES + RECORD_SIGNATURE_BYTES


def epoch_statement(domain: bytes, chain_id: str, epoch: int, *parts: bytes) -> bytes:
    """The framing every statement about the end of an epoch shares: its domain, the
    chain and the epoch it ends, so that a signature for one chain, epoch or purpose
    counts for no other; then `parts`, which have fixed lengths or come last."""
    head = (domain, b"\x00", chain_id.encode(), b"\x00", epoch.to_bytes(RECORD_EPOCH_BYTES, "big"))
    return b"".join((*head, *parts))


def record_statement(chain_id: str, epoch: int, record: bytes) -> bytes:
    """What the owner signs for `record` (its encoding) to end epoch `epoch` of `chain_id`."""
    return epoch_statement(RECONFIG_OWNER, chain_id, epoch, record)


def sign_record(
    record: Reconfiguration, chain_id: str, epoch: int, sign: Callable[[bytes], bytes]
) -> bytes:
    """The transaction that carries `record`, signed by the owner for epoch `epoch`."""
    body = record.encode()
    signature = sign(record_statement(chain_id, epoch, body))
    return body + epoch.to_bytes(RECORD_EPOCH_BYTES, "big") + signature


def owner_key_statement(chain_id: str, epoch: int, old_key: bytes, new_key: bytes) -> bytes:
    """What a new owner key signs in the `owner` record that hands it the record key of
    `chain_id` at the end of epoch `epoch`, taking over from `old_key`: its proof of
    possession, so that no record names a key nobody holds (or someone else's), as the
    engine's key rotations ask of a new key (proto/tx.py `rotation_statement`)."""
    return epoch_statement(RECONFIG_OWNER_KEY, chain_id, epoch, old_key, new_key)


def owner_record(
    chain_id: str, epoch: int, old_key: bytes, new_key: bytes, sign_new: Callable[[bytes], bytes]
) -> Reconfiguration:
    """The `owner` record that hands the record key from `old_key` to `new_key` at the
    end of epoch `epoch`, with `sign_new` (the new key's) proof of possession. The old
    key still signs the record itself (`sign_record`)."""
    proof = sign_new(owner_key_statement(chain_id, epoch, old_key, new_key))
    return Reconfiguration("owner", (), (new_key,), proof)


def receipt_key_statement(
    chain_id: str, epoch: int, index: int, old_key: bytes, new_key: bytes
) -> bytes:
    """What a member's new receipt key signs in the `receipt` record that makes it member
    `index`'s receipt key of `chain_id` from the end of epoch `epoch` on, taking over from
    `old_key`: its proof of possession (docs/consensus/epochs.md, "Receipt keys"), under a
    tag of its own so that no other statement can stand for it."""
    return (
        RECONFIG_RECEIPT_KEY
        + b"\x00"
        + chain_id.encode()
        + b"\x00"
        + epoch.to_bytes(RECORD_EPOCH_BYTES, "big")
        + index.to_bytes(4, "big")
        + old_key
        + new_key
    )


def receipt_record(
    chain_id: str,
    epoch: int,
    index: int,
    old_key: bytes,
    new_key: bytes,
    sign_new: Callable[[bytes], bytes],
) -> Reconfiguration:
    """The `receipt` record that gives member `index`'s sidecar the receipt key `new_key`
    in place of `old_key` at the end of epoch `epoch`, with `sign_new` (the new key's)
    proof of possession. The record key in force signs the record itself (`sign_record`)."""
    proof = sign_new(receipt_key_statement(chain_id, epoch, index, old_key, new_key))
    return Reconfiguration("receipt", (index,), (new_key,), proof)


def is_record(tx: bytes) -> bool:
    """Whether `tx` claims to be a reconfiguration record (signed or not)."""
    return tx.startswith(RECONFIG_TAG)


@dataclass(frozen=True, slots=True)
class OwnerRecords:
    """Reads records the way a chain that runs epochs does: only those the owner signed
    count, each for the one epoch it names. `owner_key` is the record key of one epoch:
    the cluster file's in epoch 0, and from an `owner` record's epoch on the key it names
    (`step`; docs/consensus/epochs.md, "The record key"). A reader serves one epoch: the
    next epoch's is `step`'s second half. `receipt_keys`: the members' receipt keys of
    the same epoch, in member order (the cluster file's in epoch 0, then as `receipt`
    records leave them): a `receipt` record is checked against them, and one that names
    no member, or a key in use, changes nothing. Every reader of one chain must be built
    with them (from the cluster file), or readers would disagree on such a record."""

    chain_id: str
    owner_key: bytes
    receipt_keys: tuple[bytes, ...] = ()
    # The kinds the live replica carries out (docs/consensus/epochs.md, "The live
    # replica"): a record of another kind is committed and changes nothing.
    kinds: tuple[str, ...] = ("replace", "rotate", "add", "remove", "owner", "receipt")
    # The simulator's reader (`general`): a `remove` may name any three members, the
    # others moving down to close the gap, and a `replace` or `add` needs no member
    # entries (its nodes have no addresses). A live replica's `remove` may name only the
    # three highest indexes: renumbering would move a running member's index, which its
    # processes, its node directory and every peer's links are keyed by (docs/consensus/
    # epochs.md, "Growing and shrinking"); any other `remove` commits and changes nothing.
    general: bool = False

    def read(self, tx: bytes) -> tuple[Reconfiguration, int] | None:
        """The record `tx` carries and the epoch it ends, if the owner signed it; None for
        anything else (another transaction, an unsigned or badly signed record)."""
        if not is_record(tx) or len(tx) <= RECORD_TRAILER_BYTES:
            return None
        body = tx[:-RECORD_TRAILER_BYTES]
        record = Reconfiguration.parse(body)
        if record is None:
            return None
        epoch = int.from_bytes(tx[-RECORD_TRAILER_BYTES:-RECORD_SIGNATURE_BYTES], "big")
        statement = record_statement(self.chain_id, epoch, body)
        if not ed25519_verify(self.owner_key, statement, tx[-RECORD_SIGNATURE_BYTES:]):
            return None
        return record, epoch

    def change(self, tx: bytes, current: Membership) -> Membership | None:
        """The next member set if `tx` is an owner-signed record for `current`'s epoch that
        applies to it."""
        step = self.step(tx, current)
        return None if step is None else step[0]

    def step(self, tx: bytes, current: Membership) -> tuple[Membership, OwnerRecords] | None:
        """If `tx` is a record signed with this epoch's record key for `current`'s epoch
        that applies to it: the next epoch's member set and the reader of its records. An
        `owner` record keeps the members and hands the record key to the key it names, if
        that key signed its proof of possession and is neither the key it replaces nor a
        member's consensus key; a `receipt` record keeps the members and gives one member
        the receipt key it names (`_receipt_step`); every other kind keeps the record key
        and the receipt keys."""
        read = self.read(tx)
        if read is None or read[1] != current.epoch or read[0].kind not in self.kinds:
            return None
        record = read[0]
        if record.kind == "receipt":
            return self._receipt_step(record, current)
        if record.kind in ENTRY_KINDS:
            return self._entries_step(record, current)
        if record.kind == "remove":
            return self._remove_step(record, current)
        if record.kind != "owner":
            nxt = record.apply(current)
            return None if nxt is None else (nxt, self)
        if record.indexes or len(record.keys) != 1 or len(record.proof) != OWNER_PROOF_BYTES:
            return None
        new_key = record.keys[0]
        if new_key == self.owner_key or current.index_of(new_key) is not None:
            return None
        statement = owner_key_statement(self.chain_id, current.epoch, self.owner_key, new_key)
        if not ed25519_verify(new_key, statement, record.proof):
            return None
        nxt = replace(current, epoch=current.epoch + 1)
        return nxt, replace(self, owner_key=new_key)

    def _entries_step(
        self, record: Reconfiguration, current: Membership
    ) -> tuple[Membership, OwnerRecords] | None:
        """A record that brings new machines (`replace`, or `add`, whose entries must name
        the indexes n, n+1 and n+2 the new members take): it applies only if each new
        machine's member entry checks (`record_entries`: a new member nobody could reach
        is no change) and the record applies to the members; the next epoch's reader
        gives each new machine's index the receipt key its entry names, as a `receipt`
        record would, so that certificates of the next epoch are checked with the new
        machine's key and no longer with the one that left (docs/consensus/epochs.md,
        "Receipt keys"). A receipt key in use elsewhere (another member's receipt or
        consensus key, the record key) is refused as `_receipt_step` refuses it."""
        if self.general and not record.entries:  # (the simulator's bare records)
            nxt = record.apply(current)
            return None if nxt is None else (nxt, self)
        try:
            entries = record_entries(record)
        except MemberEntryError:
            return None
        if record.kind == "add" and [e.index for e in entries] != list(
            range(current.n, current.n + len(entries))
        ):
            return None  # (the new members are n, n+1, n+2, in the order of the keys)
        nxt = record.apply(current)
        if nxt is None:
            return None
        if len(self.receipt_keys) != current.n:
            return nxt, self  # (a reader built without receipt keys: the simulator's)
        keys = list(self.receipt_keys)
        for entry in entries:
            if entry.index == len(keys) and record.kind == "add":
                keys.append(entry.receipt_public_key)
                continue
            if entry.index >= len(keys):
                return None
            keys[entry.index] = entry.receipt_public_key
        for entry in entries:
            new = entry.receipt_public_key
            if keys.count(new) != 1 or new == self.owner_key or nxt.index_of(new) is not None:
                return None
        return nxt, replace(self, receipt_keys=tuple(keys))

    def _remove_step(
        self, record: Reconfiguration, current: Membership
    ) -> tuple[Membership, OwnerRecords] | None:
        """A `remove` record: unless this reader is the simulator's (`general`), it
        applies only if it names the three highest indexes, so that every member that
        stays keeps its index; the next epoch's reader keeps the stayers' receipt keys."""
        highest = set(range(current.n - RECONFIG_STEP_MEMBERS, current.n))
        if not self.general and set(record.indexes) != highest:
            return None
        nxt = record.apply(current)
        if nxt is None:
            return None
        if len(self.receipt_keys) != current.n:
            return nxt, self  # (a reader built without receipt keys: the simulator's)
        gone = set(record.indexes)
        keys = tuple(k for i, k in enumerate(self.receipt_keys) if i not in gone)
        return nxt, replace(self, receipt_keys=keys)

    def _receipt_step(
        self, record: Reconfiguration, current: Membership
    ) -> tuple[Membership, OwnerRecords] | None:
        """A `receipt` record of `current`'s epoch, signed with the record key: it applies
        if it names one member of the epoch and one new key, that key is in use nowhere
        (no member's receipt or consensus key, not the record key), and it signed its proof
        of possession over the chain, the epoch, the index, the key it replaces and itself.
        The next epoch keeps the members and the record key."""
        if len(record.indexes) != 1 or len(record.keys) != 1:
            return None
        index, new_key = record.indexes[0], record.keys[0]
        if len(self.receipt_keys) != current.n or not current.is_member(index):
            return None
        if len(record.proof) != OWNER_PROOF_BYTES or len(new_key) != PUBLIC_KEY_BYTES:
            return None
        if new_key in self.receipt_keys or new_key == self.owner_key:
            return None
        if current.index_of(new_key) is not None:
            return None
        old_key = self.receipt_keys[index]
        statement = receipt_key_statement(self.chain_id, current.epoch, index, old_key, new_key)
        if not ed25519_verify(new_key, statement, record.proof):
            return None
        keys = list(self.receipt_keys)
        keys[index] = new_key
        nxt = replace(current, epoch=current.epoch + 1)
        return nxt, replace(self, receipt_keys=tuple(keys))
