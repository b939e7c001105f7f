"""A principal's key file sealed with a passphrase (`proto/sealedkey.py`): the seed never
on disk in the clear, a wrong passphrase or an altered file refused, the KDF's cost taken
from the file only within bounds, and a passphrase change that replaces the file whole."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterFileError, read_seed, write_seed
from quorumgate.proto.sealedkey import (
    KDF_INTERACTIVE,
    KDF_SENSITIVE,
    PASSPHRASE_BYTES_MAX,
    PASSPHRASE_CHARS_MIN,
    SealedKeyError,
    WrongPassphrase,
    is_sealed_file,
    parse_sealed,
    read_sealed,
    seal,
    write_sealed,
)
from quorumgate.sdk.keys import (
    change_passphrase,
    generate_principal_key,
    load_key,
    load_principal_key,
    principal_public_key,
    seal_key_file,
)

PASSPHRASE = "a passphrase for tests"


def test_the_seed_is_sealed_and_opens_only_with_its_passphrase(tmp_path: Path) -> None:
    path = tmp_path / "dana.key"
    key = generate_principal_key(path, PASSPHRASE, cost=KDF_INTERACTIVE)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and is_sealed_file(path)
    text = path.read_text()
    assert bytes(key).hex() not in text and bytes(key).hex().upper() not in text
    assert principal_public_key(path) == bytes(key.verify_key)  # no passphrase needed
    assert bytes(load_principal_key(path, PASSPHRASE)) == bytes(key)
    with pytest.raises(WrongPassphrase):
        load_principal_key(path, PASSPHRASE + " ")
    with pytest.raises(WrongPassphrase):
        load_principal_key(path, "")
    with pytest.raises(FileExistsError):  # never overwritten
        generate_principal_key(path, PASSPHRASE, cost=KDF_INTERACTIVE)
    # a reader of plain key files says what the file is, not "not hex"
    with pytest.raises(ClusterFileError, match="sealed with a passphrase"):
        load_key(path)


def test_an_altered_file_is_refused(tmp_path: Path) -> None:
    sealed = seal(bytes(SigningKey.generate()), PASSPHRASE, KDF_INTERACTIVE)
    doc = json.loads(sealed.to_bytes())
    other = SigningKey.generate().verify_key
    # another public key in the clear: the sealed seed does not give it
    swapped = parse_sealed(json.dumps({**doc, "public_key": bytes(other).hex()}).encode())
    with pytest.raises(SealedKeyError, match="not the public key it names"):
        swapped.open(PASSPHRASE)
    flipped = bytearray.fromhex(doc["box"])
    flipped[-1] ^= 1
    with pytest.raises(WrongPassphrase):  # the MAC refuses it
        parse_sealed(json.dumps({**doc, "box": flipped.hex()}).encode()).open(PASSPHRASE)
    for bad in (
        {**doc, "format": "quorumgate-sealed-key/0"},
        {**doc, "kdf": "scrypt"},
        {**doc, "extra": 1},
        {**doc, "salt": "00"},
        {**doc, "box": doc["box"][:-2]},
        {**doc, "opslimit": "2"},
    ):
        with pytest.raises(SealedKeyError):
            parse_sealed(json.dumps(bad).encode())
    with pytest.raises(SealedKeyError):
        parse_sealed(b"\xff not json")


def test_the_kdf_cost_is_taken_from_the_file_only_within_its_bounds() -> None:
    doc = json.loads(seal(bytes(32), PASSPHRASE, KDF_INTERACTIVE).to_bytes())
    weak = {**doc, "opslimit": KDF_INTERACTIVE.opslimit - 1}
    weak_memory = {**doc, "memlimit": KDF_INTERACTIVE.memlimit // 2}
    huge = {**doc, "memlimit": KDF_SENSITIVE.memlimit * 2}
    for bad in (weak, weak_memory, huge):
        with pytest.raises(SealedKeyError, match="between the interactive and sensitive"):
            parse_sealed(json.dumps(bad).encode())


def test_passphrases_are_bounded_and_normalized() -> None:
    with pytest.raises(SealedKeyError, match=f"at least {PASSPHRASE_CHARS_MIN}"):
        seal(bytes(32), "short", KDF_INTERACTIVE)
    with pytest.raises(SealedKeyError, match=f"at most {PASSPHRASE_BYTES_MAX}"):
        seal(bytes(32), "x" * (PASSPHRASE_BYTES_MAX + 1), KDF_INTERACTIVE)
    # the same passphrase typed with a precomposed é or with e and a combining accent
    sealed = seal(bytes(32), "caf\u00e9 au lait", KDF_INTERACTIVE)
    assert sealed.open("cafe\u0301 au lait") == bytes(32)


def test_a_key_file_is_sealed_and_its_passphrase_changed_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.key"
    key = SigningKey.generate()
    write_seed(path, bytes(key))
    assert not is_sealed_file(path)
    assert seal_key_file(path, PASSPHRASE, cost=KDF_INTERACTIVE) == bytes(key.verify_key)
    assert bytes(key).hex() not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ClusterFileError):
        read_seed(path)
    with pytest.raises(WrongPassphrase):  # the old passphrase must open it to change it
        change_passphrase(path, "not the passphrase", "a new passphrase", cost=KDF_INTERACTIVE)
    before = read_sealed(path)
    change_passphrase(path, PASSPHRASE, "a new passphrase", cost=KDF_INTERACTIVE)
    after = read_sealed(path)
    assert after.salt != before.salt and after.public_key == before.public_key
    with pytest.raises(WrongPassphrase):
        load_principal_key(path, PASSPHRASE)
    assert bytes(load_principal_key(path, "a new passphrase")) == bytes(key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.key"]  # nothing left beside
    # a sealed file is refused when others may read it, like any key file
    path.chmod(0o644)
    with pytest.raises(SealedKeyError, match="readable by others"):
        read_sealed(path)


def test_write_sealed_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    sealed = seal(bytes(32), PASSPHRASE, KDF_INTERACTIVE)
    write_sealed(path, sealed)
    with pytest.raises(FileExistsError):
        write_sealed(path, sealed)
