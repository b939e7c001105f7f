"""A fast stand-in for Ed25519, so that thousands of simulated scenarios fit in CI."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from quorumgate.proto.crypto import Signer


class FastKeys:
    """A keyed-hash stand-in for Ed25519 with the property that matters here: nobody can
    produce a member's signature without that member's secret. 50x cheaper, so thousands
    of scenarios fit in CI; some scenarios run real Ed25519 (`fast_crypto=False`)."""

    def __init__(self) -> None:
        self._secrets: dict[bytes, bytes] = {}

    def signer(self, seed: bytes) -> Signer:
        secret = hashlib.sha256(b"sim-secret" + seed).digest()
        public = hashlib.sha256(b"sim-public" + secret).digest()
        self._secrets[public] = secret
        return _FastSigner(secret, public)

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        secret = self._secrets.get(public_key)
        if secret is None:
            return False
        return hashlib.blake2b(message, key=secret, digest_size=64).digest() == signature


@dataclass(frozen=True)
class _FastSigner:
    secret: bytes
    public: bytes

    @property
    def public_key(self) -> bytes:
        return self.public

    def sign(self, message: bytes) -> bytes:
        return hashlib.blake2b(message, key=self.secret, digest_size=64).digest()
