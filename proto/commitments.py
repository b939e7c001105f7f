"""Commitments to argument values that only auditors can open (docs/audit.md, "Argument
commitments"; docs/security/threat-model.md).

A call on a chain whose receipt version commits arguments carries a salt: 32 random bytes
the proposer (the SDK) draws per proposal, and the public keys of the auditors it seals the
salt to. The sidecars see the plain values they judge, so they compute, each on its own
and byte for byte alike:

- per argument, `HMAC-SHA256(salt, tag | name | kind | value)` (RFC 2104): a pseudo-random
  function of the value under a key nobody outside the log holds, so a copy of the ledger
  cannot be searched with a dictionary of short values, and equal values in two proposals
  commit differently;
- per auditor, the salt sealed to that auditor's key: a libsodium sealed box (X25519 from
  the auditor's Ed25519 key) whose ephemeral key is derived from the salt and the auditor's
  key instead of drawn at random. A deterministic seal of a uniformly random message hides
  it as a randomized one does (Bellare, Boldyreva and O'Neill, "Deterministic and
  Efficiently Searchable Encryption", CRYPTO 2007, section 5), and it is what lets every
  honest sidecar write the same bytes: the proposer cannot seal one salt and commit with
  another, because it seals nothing; the sidecars do.

An auditor opens its sealed salt with its private key (`open_salt`) and checks a claimed
value against the commitment (`confirms`). The salt travels in the clear inside the signed
transaction, like the values themselves: whoever holds the committed log holds the values
already. Only the ledger and its copies drop the salt and keep the commitments.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass

from nacl.exceptions import CryptoError
from nacl.exceptions import RuntimeError as NaclRuntimeError
from nacl.public import Box, PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder, sha256

SALT_BYTES = 32
COMMITMENT_BYTES = 32
AUDITOR_KEY_BYTES = 32
# A sealed box: the ephemeral X25519 public key, then the salt and its 16-byte MAC.
SEALED_SALT_BYTES = 32 + SALT_BYTES + 16
# The most auditor keys one proposal seals its salt to: as many as a cluster file lists
# (`AUDITORS_MAX` in proto/clusterfile.py).
SEAL_TO_MAX = 64
_NONCE_BYTES = 24

KIND_TEXT = "text"
KIND_HANDLE = "handle"  # an envelope's handle: the commitment is to the handle, never a secret


class SaltError(ValueError):
    """A sealed salt that this key does not open, or that is not the seal of what it holds."""


@dataclass(frozen=True, slots=True)
class Committed:
    """One argument's commitment: its name and the HMAC of its value."""

    name: str
    commitment: bytes


@dataclass(frozen=True, slots=True)
class SealedSalt:
    """A proposal's salt sealed to one auditor's Ed25519 public key."""

    auditor_key: bytes
    sealed: bytes


def call_salt(proposer_seed: bytes, chain_id: str, nonce: int) -> bytes:
    """The salt of the call a proposer signs at `nonce`: HMAC-SHA256 under its own key
    seed, so that nobody without that key can predict it, and the proposer finds it again
    for the same nonce (a confirmed call is re-signed byte for byte) without keeping it;
    derived from the private key as RFC 6979, section 3.2, derives a signature's nonce."""
    message = bytes(Encoder(domains.COMMIT_SALT).text(chain_id).u64(nonce))
    return hmac.new(proposer_seed, message, hashlib.sha256).digest()


def commitment(salt: bytes, name: str, kind: str, value: str) -> bytes:
    """The commitment to one argument; `kind` is `text` or `handle` (a secret is never
    committed to, only the handle that stands for it)."""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"a salt is {SALT_BYTES} bytes")
    message = bytes(Encoder(domains.ARGUMENT_COMMITMENT).text(name).text(kind).text(value))
    return hmac.new(salt, message, hashlib.sha256).digest()


# Auditor keys converted to X25519, kept: a cluster has a few auditors and every call
# names them, and the conversion (a point decompression and subgroup check) costs more
# than the seal's own key agreement. A pure function of the key, so caching changes no
# byte any sidecar writes.
_CONVERTED_KEYS_MAX = 4 * SEAL_TO_MAX


@functools.lru_cache(maxsize=_CONVERTED_KEYS_MAX)
def _x25519_public(auditor_key: bytes) -> PublicKey:
    if len(auditor_key) != AUDITOR_KEY_BYTES:
        raise ValueError(f"an auditor key is {AUDITOR_KEY_BYTES} bytes")
    return VerifyKey(auditor_key).to_curve25519_public_key()


def seal_salt(salt: bytes, auditor_key: bytes) -> bytes:
    """`salt` sealed to `auditor_key` (Ed25519), deterministically: the bytes of a
    libsodium sealed box (ephemeral public key, then the box under the nonce
    BLAKE2b-192(ephemeral key | recipient key)), which `SealedBox.decrypt` opens."""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"a salt is {SALT_BYTES} bytes")
    recipient = _x25519_public(auditor_key)
    ephemeral = PrivateKey(sha256(bytes(Encoder(domains.SALT_SEAL).blob(salt).blob(auditor_key))))
    epk = bytes(ephemeral.public_key)
    nonce = hashlib.blake2b(epk + bytes(recipient), digest_size=_NONCE_BYTES).digest()
    boxed = Box(ephemeral, recipient).encrypt(salt, nonce)
    return epk + bytes(boxed.ciphertext)


def seal_or_none(salt: bytes, auditor_key: bytes) -> bytes | None:
    """`seal_salt`, or None for a key that is not an Ed25519 public key of a point X25519
    can seal to (libsodium refuses it). Deterministic: every sidecar drops the same keys,
    and a key a proposer made up stops no sidecar."""
    if len(auditor_key) != AUDITOR_KEY_BYTES:
        return None
    try:
        return seal_salt(salt, auditor_key)
    except (NaclRuntimeError, CryptoError, ValueError):
        return None


def open_salt(sealed: bytes, auditor_seed: bytes) -> bytes:
    """The salt inside `sealed`, opened with the auditor's Ed25519 seed; `SaltError` when
    this key does not open it or it is not the deterministic seal of what it holds."""
    signing = SigningKey(auditor_seed)
    try:
        salt = bytes(SealedBox(signing.to_curve25519_private_key()).decrypt(sealed))
    except CryptoError:
        raise SaltError("this key does not open the sealed salt") from None
    if len(salt) != SALT_BYTES or seal_salt(salt, bytes(signing.verify_key)) != sealed:
        raise SaltError("the sealed salt is not the seal of the salt it holds")
    return salt


def confirms(salt: bytes, committed: Committed, kind: str, value: str) -> bool:
    """Whether `value` (of `kind`) is the value `committed` was made from."""
    expected = commitment(salt, committed.name, kind, value)
    return hmac.compare_digest(expected, committed.commitment)
