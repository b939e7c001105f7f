"""Key files sealed with a passphrase: how a principal's key is kept on disk.

A principal is a person; its key answers confirmation cards, so a process that can read
the person's files (an agent running as the same OS user, a backup, a stolen laptop) must
not be able to sign with it. The file holds the 32-byte Ed25519 seed inside a
`nacl.secret.SecretBox` (XSalsa20-Poly1305) whose key is derived from the passphrase with
Argon2id (`nacl.pwhash.argon2id`, RFC 9106), and the public key in the clear, so that the
key can be registered and a console can name it without the passphrase:

    {"format": "quorumgate-sealed-key/1", "public_key": HEX, "kdf": "argon2id",
     "opslimit": N, "memlimit": BYTES, "salt": HEX, "box": HEX}

The box's MAC rejects a wrong passphrase; the seed it opens must give the public key the
file names, or the file is refused. The file is created exclusively with mode 0600 and is
only ever replaced whole (a passphrase change writes a new file and renames it over the
old). docs/security/approvals.md says what this protects against and what it does not.
"""

from __future__ import annotations

import json
import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import nacl.exceptions
import nacl.pwhash
import nacl.secret
import nacl.utils

from quorumgate.proto.clusterfile import KEY_FILE_MODE, ClusterFileError, public_key_of

SEALED_FORMAT = "quorumgate-sealed-key/1"
KDF_NAME = "argon2id"
SEED_BYTES = 32
SEALED_FILE_BYTES_MAX = 4096  # a sealed key file is a few hundred bytes
PASSPHRASE_CHARS_MIN = 8  # for a new passphrase; an old one is opened whatever its length
PASSPHRASE_BYTES_MAX = 1024  # UTF-8, after NFC
_ARGON2ID = nacl.pwhash.argon2id


@dataclass(frozen=True, slots=True)
class KdfCost:
    """How much work and memory one passphrase guess costs (libsodium's named levels)."""

    name: str
    opslimit: int
    memlimit: int


KDF_INTERACTIVE = KdfCost(
    "interactive", _ARGON2ID.OPSLIMIT_INTERACTIVE, _ARGON2ID.MEMLIMIT_INTERACTIVE
)
KDF_MODERATE = KdfCost("moderate", _ARGON2ID.OPSLIMIT_MODERATE, _ARGON2ID.MEMLIMIT_MODERATE)
KDF_SENSITIVE = KdfCost("sensitive", _ARGON2ID.OPSLIMIT_SENSITIVE, _ARGON2ID.MEMLIMIT_SENSITIVE)
KDF_COSTS = {c.name: c for c in (KDF_INTERACTIVE, KDF_MODERATE, KDF_SENSITIVE)}
# What `keygen --principal` uses: the file can be copied and guessed at offline by
# whoever reads it, so each guess should cost what a person can wait once (~0.7 s, 256 MiB
# here). `interactive` suits a generated passphrase, whose entropy is its protection.
KDF_COST_DEFAULT = KDF_MODERATE


class SealedKeyError(ClusterFileError):
    """A sealed key file that is unreadable, malformed, or not what it says it is."""


class WrongPassphrase(SealedKeyError):
    """The passphrase does not open the sealed key."""


def kdf_cost_acceptable(opslimit: int, memlimit: int) -> bool:
    """A file's Argon2id parameters are used only between libsodium's interactive and
    sensitive levels: below, a weakened file would make guessing cheap; above, opening it
    would make this process allocate more memory than any level asks for."""
    ops_ok = KDF_INTERACTIVE.opslimit <= opslimit <= KDF_SENSITIVE.opslimit
    return ops_ok and KDF_INTERACTIVE.memlimit <= memlimit <= KDF_SENSITIVE.memlimit


def passphrase_bytes(passphrase: str) -> bytes:
    """The bytes the KDF is given: NFC, then UTF-8 (RFC 8265 §4.2, OpaqueString), so the
    same passphrase typed on two keyboards that compose accents differently is one."""
    data = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    if len(data) > PASSPHRASE_BYTES_MAX:
        raise SealedKeyError(f"a passphrase is at most {PASSPHRASE_BYTES_MAX} bytes")
    return data


def check_new_passphrase(passphrase: str) -> None:
    """Refuse a passphrase too short to choose (an old one is opened whatever it is)."""
    if len(unicodedata.normalize("NFC", passphrase)) < PASSPHRASE_CHARS_MIN:
        raise SealedKeyError(f"a passphrase needs at least {PASSPHRASE_CHARS_MIN} characters")
    passphrase_bytes(passphrase)


def _box_key(passphrase: str, salt: bytes, opslimit: int, memlimit: int) -> bytes:
    key: bytes = _ARGON2ID.kdf(
        nacl.secret.SecretBox.KEY_SIZE,
        passphrase_bytes(passphrase),
        salt,
        opslimit=opslimit,
        memlimit=memlimit,
    )
    return key


@dataclass(frozen=True, slots=True)
class SealedKey:
    """A parsed sealed key file; `open` with the passphrase gives the seed."""

    public_key: bytes
    opslimit: int
    memlimit: int
    salt: bytes
    box: bytes
    where: str = "sealed key"

    def open(self, passphrase: str) -> bytes:
        """The 32-byte seed, or WrongPassphrase. Costs one Argon2id derivation."""
        key = _box_key(passphrase, self.salt, self.opslimit, self.memlimit)
        try:
            seed: bytes = nacl.secret.SecretBox(key).decrypt(self.box)
        except nacl.exceptions.CryptoError:
            raise WrongPassphrase(f"wrong passphrase for {self.where}") from None
        if len(seed) != SEED_BYTES or public_key_of(seed) != self.public_key:
            raise SealedKeyError(f"{self.where}: the sealed key is not the public key it names")
        return seed

    def to_bytes(self) -> bytes:
        doc = {
            "format": SEALED_FORMAT,
            "public_key": self.public_key.hex(),
            "kdf": KDF_NAME,
            "opslimit": self.opslimit,
            "memlimit": self.memlimit,
            "salt": self.salt.hex(),
            "box": self.box.hex(),
        }
        return (json.dumps(doc, indent=2) + "\n").encode()


def seal(seed: bytes, passphrase: str, cost: KdfCost = KDF_COST_DEFAULT) -> SealedKey:
    """`seed` sealed under `passphrase` with a fresh salt (and a fresh box nonce)."""
    if len(seed) != SEED_BYTES:
        raise SealedKeyError(f"a key seed is {SEED_BYTES} bytes")
    check_new_passphrase(passphrase)
    salt = nacl.utils.random(_ARGON2ID.SALTBYTES)
    box = nacl.secret.SecretBox(_box_key(passphrase, salt, cost.opslimit, cost.memlimit))
    sealed = bytes(box.encrypt(seed))
    return SealedKey(public_key_of(seed), cost.opslimit, cost.memlimit, salt, sealed)


def _hex(doc: dict[str, object], name: str, where: str) -> bytes:
    try:
        return bytes.fromhex(str(doc[name]))
    except (KeyError, ValueError):
        raise SealedKeyError(f"{where}: {name} must be hex") from None


def parse_sealed(data: bytes, where: str = "sealed key") -> SealedKey:
    """A sealed key file's bytes, checked field by field; SealedKeyError otherwise."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise SealedKeyError(f"{where}: not a sealed key file (JSON)") from None
    if not isinstance(doc, dict) or doc.get("format") != SEALED_FORMAT:
        raise SealedKeyError(f"{where}: format must be {SEALED_FORMAT!r}")
    if doc.get("kdf") != KDF_NAME:
        raise SealedKeyError(f"{where}: kdf must be {KDF_NAME!r}")
    unknown = set(doc) - {"format", "public_key", "kdf", "opslimit", "memlimit", "salt", "box"}
    if unknown:
        raise SealedKeyError(f"{where}: unknown fields {sorted(unknown)}")
    ops, mem = doc.get("opslimit"), doc.get("memlimit")
    if type(ops) is not int or type(mem) is not int or not kdf_cost_acceptable(ops, mem):
        raise SealedKeyError(
            f"{where}: opslimit and memlimit must lie between the {KDF_INTERACTIVE.name} "
            f"and {KDF_SENSITIVE.name} levels"
        )
    public_key, salt, box = (_hex(doc, n, where) for n in ("public_key", "salt", "box"))
    if len(public_key) != 32 or len(salt) != _ARGON2ID.SALTBYTES:
        raise SealedKeyError(f"{where}: a 32-byte public_key and a 16-byte salt")
    overhead = nacl.secret.SecretBox.NONCE_SIZE + nacl.secret.SecretBox.MACBYTES
    if len(box) != SEED_BYTES + overhead:
        raise SealedKeyError(f"{where}: box must seal a {SEED_BYTES}-byte seed")
    return SealedKey(public_key, ops, mem, salt, box, where)


def is_sealed_file(path: Path) -> bool:
    """Whether `path` holds a sealed key (a JSON object) rather than a hex seed; False
    when it cannot be read (the reader that follows says why)."""
    try:
        with path.open("rb") as handle:
            return handle.read(64).lstrip().startswith(b"{")
    except OSError:
        return False


def read_sealed(path: Path) -> SealedKey:
    """A sealed key file only its owner may read (the public key is in the clear; the
    seed is not, but the file can be guessed at offline by whoever copies it)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        with path.open("rb") as handle:
            data = handle.read(SEALED_FILE_BYTES_MAX + 1)
    except OSError as err:
        raise SealedKeyError(f"cannot read key file {path}: {err.strerror}") from err
    if mode & 0o077:
        raise SealedKeyError(f"key file {path} is readable by others (mode {mode:o}); chmod 600")
    if len(data) > SEALED_FILE_BYTES_MAX:
        raise SealedKeyError(f"key file {path} is larger than a sealed key file")
    return parse_sealed(data, str(path))


def write_sealed(path: Path, sealed: SealedKey) -> None:
    """Create a sealed key file readable by its owner only; never overwrite one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(sealed.to_bytes())
        handle.flush()
        os.fsync(handle.fileno())


def replace_sealed(path: Path, sealed: SealedKey) -> None:
    """Put `sealed` in place of the key file at `path` (a plain seed being sealed, or a
    passphrase changed): written beside it, synced, then renamed over it, so that the
    file is at every moment either the old key file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.sealing")
    tmp.unlink(missing_ok=True)  # what an interrupted change left; never the key itself
    write_sealed(tmp, sealed)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
