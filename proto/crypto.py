"""Signatures behind two small interfaces, so the core never touches a key file.

`Ed25519Signer` wraps PyNaCl. `Verifier` checks signatures and remembers a bounded number
of positive answers, because the same certificate arrives many times (in proposals,
timeouts and TCs) and each check costs about 40 µs per signature.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey


class Signer(Protocol):
    @property
    def public_key(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


class Ed25519Signer:
    """Holds one Ed25519 private key. Its repr never shows the key."""

    __slots__ = ("_key", "_public")

    def __init__(self, seed: bytes) -> None:
        self._key = SigningKey(seed)
        self._public = bytes(self._key.verify_key)

    @staticmethod
    def generate() -> Ed25519Signer:
        return Ed25519Signer(bytes(SigningKey.generate()))

    @property
    def public_key(self) -> bytes:
        return self._public

    def sign(self, message: bytes) -> bytes:
        return bytes(self._key.sign(message).signature)

    def __repr__(self) -> str:
        return f"Ed25519Signer(public={self._public[:4].hex()}…)"


def ed25519_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        VerifyKey(public_key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


class VerifyFn(Protocol):
    def __call__(self, public_key: bytes, message: bytes, signature: bytes) -> bool: ...


class Verifier:
    """Signature checks with a bounded cache of statements already proven valid."""

    __slots__ = ("_cache", "_cache_max", "_verify", "checks", "hits")

    def __init__(self, cache_max: int, verify: VerifyFn = ed25519_verify) -> None:
        self._verify = verify
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_max = cache_max
        self.checks = 0
        self.hits = 0

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        self.checks += 1
        return self._verify(public_key, message, signature)

    def known(self, digest: bytes) -> bool:
        if digest in self._cache:
            self._cache.move_to_end(digest)
            self.hits += 1
            return True
        return False

    def remember(self, digest: bytes) -> None:
        self._cache[digest] = None
        if len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)
