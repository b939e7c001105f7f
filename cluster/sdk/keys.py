"""Key files for agents, principals, auditors and sinks: generated and read by the SDK.

An agent's, auditor's or sink's key file holds a 32-byte seed in hex, mode 0600, like the
cluster's own key files (`quorumgate.proto.clusterfile`). A principal's key — a person's,
the one that answers confirmation cards — is sealed with a passphrase instead
(`quorumgate.proto.sealedkey`: Argon2id and a SecretBox), so that a process which can
read the person's files cannot sign with it (docs/security/approvals.md). Every key file
is created exclusively, so an existing key is never overwritten, and refused on reading
when others may read it.
"""

from __future__ import annotations

import os
from pathlib import Path

from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import read_seed, write_seed
from quorumgate.proto.sealedkey import (
    KDF_COST_DEFAULT,
    KdfCost,
    check_new_passphrase,
    read_sealed,
    replace_sealed,
    seal,
    write_sealed,
)

PathLike = str | os.PathLike[str]


def generate_key(path: PathLike | None = None) -> SigningKey:
    """A new Ed25519 signing key (agent, owner, auditor); written to `path` (mode 0600,
    never overwriting a file) when one is given. A principal's key: `generate_principal_key`."""
    key = SigningKey.generate()
    if path is not None:
        write_seed(Path(path), bytes(key))
    return key


def generate_sink_key(path: PathLike | None = None) -> PrivateKey:
    """A new X25519 key for a tool executor (sink), written like `generate_key`."""
    key = PrivateKey.generate()
    if path is not None:
        write_seed(Path(path), bytes(key))
    return key


def load_key(path: PathLike) -> SigningKey:
    """An Ed25519 signing key from a key file (refused if others may read it, or if it is
    a principal's sealed key: `load_principal_key` opens that)."""
    return SigningKey(read_seed(Path(path)))


def load_sink_key(path: PathLike) -> PrivateKey:
    """A sink's X25519 key from a key file (refused if others may read it)."""
    return PrivateKey(read_seed(Path(path)))


def generate_principal_key(
    path: PathLike, passphrase: str, *, cost: KdfCost = KDF_COST_DEFAULT
) -> SigningKey:
    """A new principal's key, written to `path` sealed under `passphrase` (mode 0600,
    never overwriting a file); `cost` is the Argon2id level each guess costs."""
    key = SigningKey.generate()
    write_sealed(Path(path), seal(bytes(key), passphrase, cost))
    return key


def load_principal_key(path: PathLike, passphrase: str) -> SigningKey:
    """A principal's key from its sealed file (`WrongPassphrase` if it does not open)."""
    return SigningKey(read_sealed(Path(path)).open(passphrase))


def principal_public_key(path: PathLike) -> bytes:
    """The public key a sealed file names, read without the passphrase (to register it)."""
    return read_sealed(Path(path)).public_key


def seal_key_file(path: PathLike, passphrase: str, *, cost: KdfCost = KDF_COST_DEFAULT) -> bytes:
    """Seal a key file that holds a seed in the clear, in place; returns its public key.
    The file system may keep the old blocks: a key once in the clear is best replaced."""
    check_new_passphrase(passphrase)
    sealed = seal(read_seed(Path(path)), passphrase, cost)
    replace_sealed(Path(path), sealed)
    return sealed.public_key


def change_passphrase(
    path: PathLike, old: str, new: str, *, cost: KdfCost = KDF_COST_DEFAULT
) -> bytes:
    """Seal a principal's key again under a new passphrase (and a new salt), in place;
    `WrongPassphrase` if `old` does not open it. Returns its public key."""
    check_new_passphrase(new)
    sealed = seal(read_sealed(Path(path)).open(old), new, cost)
    replace_sealed(Path(path), sealed)
    return sealed.public_key


# A key file being rotated keeps its old key beside it, under this suffix, until the
# rotation is committed (docs/engine.md, "Rotating keys"): if the cluster never certifies
# the rotation, the old key is still the one that signs.
ROTATING_SUFFIX = ".old"


def rotating_path(path: PathLike) -> Path:
    """Where the old key of a key file waits while it is rotated: `<name>.old`."""
    return Path(str(path) + ROTATING_SUFFIX)


def stage_rotation(path: PathLike, passphrase: str | None = None) -> tuple[SigningKey, SigningKey]:
    """Move the key file at `path` to `<name>.old` and write a new key at `path` (mode
    0600; a sealed file sealed again under the same passphrase and Argon2id cost); return
    (old key, new key). Refused while a `<name>.old` exists: a rotation is unfinished."""
    path = Path(path)
    old_path = rotating_path(path)
    if old_path.exists():
        raise FileExistsError(f"{old_path} exists: a rotation of {path} is unfinished")
    sealed = None
    if passphrase is None:
        old = SigningKey(read_seed(path))
    else:
        sealed = read_sealed(path)
        old = SigningKey(sealed.open(passphrase))
    new = SigningKey.generate()
    os.link(path, old_path)  # the old key stays on disk under its new name first
    os.unlink(path)
    try:
        if sealed is not None:
            assert passphrase is not None
            cost = KdfCost("same as before", sealed.opslimit, sealed.memlimit)
            write_sealed(path, seal(bytes(new), passphrase, cost))
        else:
            write_seed(path, bytes(new))
    except BaseException:
        abandon_rotation(path)
        raise
    return old, new


def commit_rotation(path: PathLike) -> None:
    """The rotation is certified: the old key is retired, its file goes."""
    rotating_path(path).unlink()


def abandon_rotation(path: PathLike) -> None:
    """The rotation was refused: the old key is still the key, back at `path`."""
    path = Path(path)
    path.unlink(missing_ok=True)
    os.rename(rotating_path(path), path)
