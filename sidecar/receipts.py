"""Receipts and verdict certificates (docs/sidecar.md, "Certificates"): pure, offline-verifiable.

Each sidecar signs one statement per executed block — `(chain id, height, verdict root,
state root, leaf count)` — where the verdict root is the Merkle root (RFC 6962 §2.1) of
that block's receipt leaves, one per transaction in block order. A receipt for one
proposal is that signature plus the leaf and its inclusion path. Honest sidecars execute
the same committed log deterministically, so they sign the same root: a **certificate** is
one leaf and path with signatures from f+1 distinct members' receipt keys, which guarantees
at least one honest witness. `verify_certificate` checks one against the receipt keys of
the epoch it names (the cluster file's in epoch 0; docs/consensus/epochs.md, "Receipt
keys"), with no network and no clock; the client SDK and tool executors call it.

On a chain whose receipts expire (proto/clusterfile.py `receipts_expire`) the statement also
signs a `Validity`: the block's time and the end of the window in which a certificate may
be used, that block time plus the chain's certificate TTL (an owner setting in the log).
Both come from the committed log, so honest sidecars sign the same bytes, and neither is a
sidecar's own clock. `check_validity` is the executor's side: the window against the
executor's clock, with a stated skew allowance (docs/security/reads-and-certificates.md).

Leaves carry the reason code for operators; the SDK never hands it to a model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.membership import PUBLIC_KEY_BYTES
from quorumgate.sidecar.engine.statements import Verdict

TAG_LEAF = domains.RECEIPT_LEAF
TAG_BLOCK = domains.RECEIPT
TAG_BLOCK_WITH_VALIDITY = domains.RECEIPT_WITH_VALIDITY  # a statement that also signs its Validity
TAG_BLOCK_IN_EPOCH = domains.RECEIPT_IN_EPOCH  # a statement of an epoch after 0, naming it
HASH_BYTES = 32
LEAVES_PER_BLOCK_MAX = 1 << 20
PATH_HASHES_MAX = 21  # ceil(log2(LEAVES_PER_BLOCK_MAX)) + 1
EMPTY_ROOT = hashlib.sha256(b"").digest()


class CertificateError(Exception):
    """A certificate that does not prove what it claims; `reason` names why."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ReceiptLeaf:
    height: int
    index: int
    tx_id: bytes
    proposal_id: bytes
    kind: str
    outcome: str
    reason: str
    target_digest: bytes
    card_digest: bytes
    mandate_version: int
    body_digest: bytes = b""  # sha256 of the signed TxBody: binds the call's arguments

    def to_bytes(self, chain_id: str) -> bytes:
        enc = Encoder(TAG_LEAF).text(chain_id).u64(self.height).u32(self.index)
        enc.blob(self.tx_id).blob(self.proposal_id).text(self.kind).text(self.outcome)
        enc.text(self.reason).blob(self.target_digest).blob(self.card_digest)
        enc.u64(self.mandate_version).blob(self.body_digest)
        return bytes(enc)

    def __repr__(self) -> str:
        # The reason code is for operators: it stays an attribute, out of every repr.
        return (
            f"ReceiptLeaf(height={self.height}, index={self.index}, "
            f"tx={self.tx_id[:4].hex()}, kind={self.kind}, outcome={self.outcome})"
        )

    def hash(self, chain_id: str) -> bytes:
        return _leaf_hash(self.to_bytes(chain_id))

    @property
    def allows(self) -> bool:
        """The call may run: allow, or flag (an allow recorded as a finding)."""
        return self.outcome in ("allow", "flag")


def leaf_from_verdict(height: int, index: int, verdict: Verdict) -> ReceiptLeaf:
    return ReceiptLeaf(
        height=height,
        index=index,
        tx_id=verdict.tx_id,
        proposal_id=verdict.proposal_id or verdict.tx_id,
        kind=verdict.kind.value,
        outcome=verdict.outcome.value,
        reason=verdict.reason.value,
        target_digest=verdict.target_digest,
        card_digest=verdict.card_digest,
        mandate_version=verdict.mandate_version,
        body_digest=verdict.body_digest,
    )


# ------------------------------------------------------------------ Merkle tree (RFC 6962)


def _leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def merkle_root(hashes: Sequence[bytes]) -> bytes:
    if not hashes:
        return EMPTY_ROOT
    if len(hashes) == 1:
        return hashes[0]
    k = _split(len(hashes))
    return _node_hash(merkle_root(hashes[:k]), merkle_root(hashes[k:]))


def merkle_path(hashes: Sequence[bytes], index: int) -> list[bytes]:
    """Sibling hashes from the leaf up to the root (RFC 6962 §2.1.1 audit path)."""
    assert 0 <= index < len(hashes), "leaf index out of range"
    if len(hashes) == 1:
        return []
    k = _split(len(hashes))
    if index < k:
        return [*merkle_path(hashes[:k], index), merkle_root(hashes[k:])]
    return [*merkle_path(hashes[k:], index - k), merkle_root(hashes[:k])]


def root_and_paths(hashes: Sequence[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """`merkle_root(hashes)` and every leaf's `merkle_path`, each subtree hashed once
    (n - 1 node hashes in all)."""
    n = len(hashes)
    if n == 0:
        return EMPTY_ROOT, []
    if n == 1:
        return hashes[0], [[]]
    k = _split(n)
    left_root, left_paths = root_and_paths(hashes[:k])
    right_root, right_paths = root_and_paths(hashes[k:])
    paths = [[*p, right_root] for p in left_paths] + [[*p, left_root] for p in right_paths]
    return _node_hash(left_root, right_root), paths


def all_paths(hashes: Sequence[bytes]) -> list[list[bytes]]:
    """The path of every leaf (`root_and_paths`)."""
    return root_and_paths(hashes)[1]


def root_from_path(leaf_hash: bytes, index: int, count: int, path: Sequence[bytes]) -> bytes:
    if not 0 <= index < count:
        raise CertificateError("bad_path", "leaf index outside the block")
    if count == 1:
        if path:
            raise CertificateError("bad_path", "path too long")
        return leaf_hash
    if not path:
        raise CertificateError("bad_path", "path too short")
    k = _split(count)
    if index < k:
        return _node_hash(root_from_path(leaf_hash, index, k, path[:-1]), path[-1])
    return _node_hash(path[-1], root_from_path(leaf_hash, index - k, count - k, path[:-1]))


# ------------------------------------------------------------------ validity


@dataclass(frozen=True, slots=True)
class Validity:
    """When a block's certificates may be used, in block time (ms since the epoch): from
    the block's time to `valid_until_ms`, its time plus the chain's certificate TTL."""

    block_time_ms: int
    valid_until_ms: int

    def __post_init__(self) -> None:
        if not 0 <= self.block_time_ms <= self.valid_until_ms < 2**64:
            raise CertificateError("bad_validity", "a window that ends before it starts")


def check_validity(
    validity: Validity, now_ms: int, skew_ms: int, *, age_ms_max: int | None = None
) -> None:
    """Raise `CertificateError` unless `now_ms` (the executor's clock) is inside the
    window, give or take `skew_ms` (how far that clock may be from the block times the
    replicas agreed on): `not_yet_valid` for a block time further ahead than the skew (this
    clock is behind, and would stretch every window), `expired` past the window's end or,
    with `age_ms_max`, past that long after the block time (an executor may only shorten
    the window the sidecars signed, never lengthen it)."""
    if now_ms + skew_ms < validity.block_time_ms:
        raise CertificateError("not_yet_valid", "the block time is ahead of this clock")
    end = validity.valid_until_ms
    if age_ms_max is not None:
        end = min(end, validity.block_time_ms + age_ms_max)
    if now_ms - skew_ms > end:
        raise CertificateError("expired", "past the certificate's validity window")


# ------------------------------------------------------------------ signed statements


def block_statement(
    chain_id: str,
    height: int,
    verdict_root: bytes,
    state_root: bytes,
    leaf_count: int,
    validity: Validity | None = None,
    epoch: int = 0,
) -> bytes:
    """The bytes a sidecar signs for one block: without `validity` exactly what chains of
    receipt version 1 signed; with it, under its own tag, the window too. A block of an
    epoch after 0 (docs/consensus/epochs.md, "Receipt keys") is signed under a third tag
    that names the epoch, the window after it when there is one, so that epoch 0's bytes
    stay those every chain signed so far and no statement of one epoch reads as one of
    another."""
    if epoch:
        enc = Encoder(TAG_BLOCK_IN_EPOCH).text(chain_id).u64(height).raw(verdict_root)
        enc.blob(state_root).u32(leaf_count).u64(epoch).boolean(validity is not None)
    else:
        tag = TAG_BLOCK if validity is None else TAG_BLOCK_WITH_VALIDITY
        enc = Encoder(tag).text(chain_id).u64(height).raw(verdict_root)
        enc.blob(state_root).u32(leaf_count)
    if validity is not None:
        enc.u64(validity.block_time_ms).u64(validity.valid_until_ms)
    return bytes(enc)


def _verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        VerifyKey(public_key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class SignedBlock:
    """One sidecar's signed statement over one executed block."""

    height: int
    verdict_root: bytes
    state_root: bytes
    leaf_count: int
    signer: int
    signature: bytes
    validity: Validity | None = None  # on chains whose receipts expire
    epoch: int = 0  # the consensus epoch of the block, whose receipt key signed

    def statement(self, chain_id: str) -> bytes:
        return block_statement(
            chain_id,
            self.height,
            self.verdict_root,
            self.state_root,
            self.leaf_count,
            self.validity,
            self.epoch,
        )

    def signed_by(self, chain_id: str, public_key: bytes) -> bool:
        """Whether `public_key` signed exactly this statement."""
        return _verify(public_key, self.statement(chain_id), self.signature)


def sign_block(
    key: SigningKey,
    signer: int,
    chain_id: str,
    height: int,
    verdict_root: bytes,
    state_root: bytes,
    leaf_count: int,
    validity: Validity | None = None,
    epoch: int = 0,
) -> SignedBlock:
    message = block_statement(
        chain_id, height, verdict_root, state_root, leaf_count, validity, epoch
    )
    signature = bytes(key.sign(message).signature)
    return SignedBlock(
        height, verdict_root, state_root, leaf_count, signer, signature, validity, epoch
    )


@dataclass(frozen=True, slots=True)
class Receipt:
    leaf: ReceiptLeaf
    path: tuple[bytes, ...]
    block: SignedBlock


@dataclass(frozen=True, slots=True)
class Certificate:
    chain_id: str
    leaf: ReceiptLeaf
    path: tuple[bytes, ...]
    leaf_count: int
    verdict_root: bytes
    state_root: bytes
    signatures: tuple[tuple[int, bytes], ...] = field(default=())
    validity: Validity | None = None  # on chains whose receipts expire
    epoch: int = 0  # the consensus epoch its statement names

    @property
    def signers(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.signatures)


def assemble_certificate(chain_id: str, receipts: Sequence[Receipt]) -> Certificate:
    """Combine receipts that agree on the leaf and the signed block statement. Receipts
    that disagree with the first are left out (the caller asked f+1 or more sidecars and
    checks the result with `verify_certificate`)."""
    if not receipts:
        raise CertificateError("no_receipts")
    first = receipts[0]
    agreeing: dict[int, bytes] = {}
    for r in receipts:
        b = r.block
        same = (
            r.leaf == first.leaf
            and b.verdict_root == first.block.verdict_root
            and b.state_root == first.block.state_root
            and b.leaf_count == first.block.leaf_count
            and b.height == first.block.height
            and b.validity == first.block.validity
            and b.epoch == first.block.epoch
        )
        if same:
            agreeing.setdefault(b.signer, b.signature)
    return Certificate(
        chain_id=chain_id,
        leaf=first.leaf,
        path=first.path,
        leaf_count=first.block.leaf_count,
        verdict_root=first.block.verdict_root,
        state_root=first.block.state_root,
        signatures=tuple(sorted(agreeing.items())),
        validity=first.block.validity,
        epoch=first.block.epoch,
    )


@dataclass(frozen=True, slots=True)
class ReceiptEpoch:
    """The heights of one consensus epoch and its members' receipt keys (docs/consensus/
    epochs.md, "Receipt keys"): from `first_height` (the height after the change block
    that started it; 1 for epoch 0) to `last_height`, the change block that ended it
    (None: not ended, as far as the verifier knows)."""

    epoch: int
    first_height: int
    last_height: int | None
    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        # No keys would make f+1 = 0: a certificate with no signature would count.
        if not self.keys or any(len(k) != PUBLIC_KEY_BYTES for k in self.keys):
            raise ValueError(f"epoch {self.epoch}: receipt keys are 32 bytes each, one or more")
        if self.last_height is not None and self.last_height < self.first_height - 1:
            raise ValueError(f"epoch {self.epoch}: it ends before it starts")

    def holds(self, height: int) -> bool:
        return self.first_height <= height and (
            self.last_height is None or height <= self.last_height
        )


@dataclass(frozen=True, slots=True)
class ReceiptEpochs:
    """Every epoch a verifier knows, from 0, in order: what a certificate is checked
    against. From the cluster file alone it is epoch 0 without an end (`genesis`); a
    chain of epochs checked from it (replica/epochchain.py) gives the rest.

    `chained`: whether these come from a chain of epochs (or a file of one). Without one
    (`genesis`: a verifier that holds the cluster file alone, such as an agent's client,
    which may not read the epoch ends) the verifier has the guarantee it always had: a
    statement of any epoch and height counts if f+1 of the cluster file's receipt keys
    signed it. Only a verifier that follows the chain refuses a rotated-out key's
    statement past its epoch."""

    epochs: tuple[ReceiptEpoch, ...]
    chained: bool = True

    def __post_init__(self) -> None:
        numbers = [e.epoch for e in self.epochs]
        if not numbers or numbers != list(range(len(numbers))):
            raise ValueError("receipt epochs are 0, 1, 2, ... in order")

    @staticmethod
    def genesis(keys: Sequence[bytes]) -> ReceiptEpochs:
        return ReceiptEpochs((ReceiptEpoch(0, 1, None, tuple(keys)),), chained=False)

    def of(self, epoch: int) -> ReceiptEpoch | None:
        return self.epochs[epoch] if 0 <= epoch < len(self.epochs) else None

    @property
    def current(self) -> ReceiptEpoch:
        return self.epochs[-1]


def receipt_keys_at(epochs: ReceiptEpochs, epoch: int, height: int) -> tuple[bytes, ...]:
    """The receipt keys that sign epoch `epoch`'s statement for `height`, or raise
    `CertificateError`: `unknown_epoch` for an epoch the verifier does not know,
    `wrong_epoch` for a height outside it (a key rotated out at the end of an epoch signs
    nothing above that end in its name). Without a chain (`ReceiptEpochs.chained` False):
    the cluster file's keys, whatever the epoch and height."""
    if not epochs.chained:
        return epochs.epochs[0].keys
    known = epochs.of(epoch)
    if known is None:
        raise CertificateError(
            "unknown_epoch",
            f"epoch {epoch}; this verifier knows epochs 0..{epochs.current.epoch}",
        )
    if not known.holds(height):
        raise CertificateError("wrong_epoch", f"height {height} is not in epoch {epoch}")
    return known.keys


def verify_certificate(
    cert: Certificate,
    chain_id: str,
    receipt_keys: Sequence[bytes],
    *,
    receipts_expire: bool,
    proposal_id: bytes | None = None,
    epochs: ReceiptEpochs | None = None,
) -> ReceiptLeaf:
    """Return the certified leaf, or raise `CertificateError` naming what is wrong.

    Checks: the chain id; the epoch the certificate names and the receipt keys of that
    epoch (`epochs`, `receipt_keys_at`: its height must lie in the epoch; without
    `epochs`, `receipt_keys`, the cluster file's, in any epoch); that the certificate
    carries a validity window exactly when the chain's receipts expire (`receipts_expire`,
    the cluster file's predicate); the leaf's inclusion under the verdict root; signatures
    from at least f+1 *distinct members* (by position in the epoch's receipt keys) over the
    same block statement, the window and the epoch included; and, when given, that it
    answers `proposal_id`. Whether the window holds *now* is the caller's to check
    (`check_validity`): this function reads no clock.
    """
    if cert.chain_id != chain_id:
        raise CertificateError("wrong_chain", "certificate for another chain")
    if epochs is None:
        if not receipt_keys:  # f+1 would be 0
            raise CertificateError("no_keys", "no receipt keys to check the certificate with")
        epochs = ReceiptEpochs.genesis(receipt_keys)
    receipt_keys = receipt_keys_at(epochs, cert.epoch, cert.leaf.height)
    n = len(receipt_keys)
    f = (n - 1) // 3
    if receipts_expire and cert.validity is None:
        raise CertificateError("no_validity", "this chain's certificates carry a window")
    if not receipts_expire and cert.validity is not None:
        raise CertificateError("unexpected_validity", "this chain's certificates carry none")
    if proposal_id is not None and cert.leaf.proposal_id != proposal_id:
        raise CertificateError("wrong_proposal", "certificate answers another proposal")
    if cert.leaf_count > LEAVES_PER_BLOCK_MAX or len(cert.path) > PATH_HASHES_MAX:
        raise CertificateError("bad_path", "more leaves or path hashes than a block holds")
    if cert.leaf.height == 0:
        raise CertificateError("bad_leaf", "height 0 holds no verdicts")
    root = root_from_path(cert.leaf.hash(chain_id), cert.leaf.index, cert.leaf_count, cert.path)
    if root != cert.verdict_root:
        raise CertificateError("bad_path", "the leaf is not under the signed verdict root")
    message = block_statement(
        chain_id,
        cert.leaf.height,
        cert.verdict_root,
        cert.state_root,
        cert.leaf_count,
        cert.validity,
        cert.epoch,
    )
    valid: set[int] = set()
    for signer, signature in cert.signatures:
        if not 0 <= signer < n:
            raise CertificateError("non_member", f"signer {signer} is not a member")
        if signer in valid:
            raise CertificateError("duplicate_signer", f"signer {signer} counted twice")
        if not _verify(receipt_keys[signer], message, signature):
            raise CertificateError("bad_signature", f"signature of sidecar {signer}")
        valid.add(signer)
    if len(valid) < f + 1:
        raise CertificateError(
            "too_few_receipts", f"{len(valid)} agreeing sidecars, {f + 1} needed (f={f})"
        )
    return cert.leaf
