"""Key files for agents, principals, auditors and sinks: generated and read by the SDK.

A key file holds a 32-byte seed in hex, mode 0600, like the cluster's own key files
(`quorumgate.proto.clusterfile`); it is created exclusively, so an existing key is never
overwritten, and refused on reading when others may read it.
"""

from __future__ import annotations

import os
from pathlib import Path

from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import read_seed, write_seed


def generate_key(path: str | os.PathLike[str] | None = None) -> SigningKey:
    """A new Ed25519 signing key (agent, principal, owner, auditor); written to `path`
    (mode 0600, never overwriting a file) when one is given."""
    key = SigningKey.generate()
    if path is not None:
        write_seed(Path(path), bytes(key))
    return key


def generate_sink_key(path: str | os.PathLike[str] | None = None) -> PrivateKey:
    """A new X25519 key for a tool executor (sink), written like `generate_key`."""
    key = PrivateKey.generate()
    if path is not None:
        write_seed(Path(path), bytes(key))
    return key


def load_key(path: str | os.PathLike[str]) -> SigningKey:
    """An Ed25519 signing key from a key file (refused if others may read it)."""
    return SigningKey(read_seed(Path(path)))


def load_sink_key(path: str | os.PathLike[str]) -> PrivateKey:
    """A sink's X25519 key from a key file (refused if others may read it)."""
    return PrivateKey(read_seed(Path(path)))
