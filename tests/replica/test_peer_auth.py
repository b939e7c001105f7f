"""Who a peer stream comes from (runtime/channels.py): the statement it opens with must be
signed by the sender's consensus key of the receiver's current epoch, so a key rotated out
(perhaps stolen: the reason for the rotation) opens no stream, while a member on either
side of a rotation's boundary gets in by signing with each key it holds."""

from __future__ import annotations

import os
import time
from pathlib import Path

from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    ClusterSpec,
    held_consensus_seeds,
    init_cluster,
    read_seed,
    rotated_key_file,
)
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.runtime.channels import (
    PEER_AUTH_METADATA,
    PEER_AUTH_SIGNATURES_MAX,
    check_peer_auth,
    peer_auth_metadata,
)

SENDER, RECEIVER = 2, 0


NEW_SEED = bytes(range(32))


def setup(tmp_path: Path) -> tuple[ClusterSpec, Ed25519Signer, Ed25519Signer]:
    spec = init_cluster(tmp_path / "c", 4)
    old = Ed25519Signer(read_seed(spec.node_dir(SENDER) / CONSENSUS_KEY_FILE))
    return spec, old, Ed25519Signer(NEW_SEED)


def now_ms() -> int:
    return int(time.time() * 1000)


def check(spec: ClusterSpec, metadata: tuple[tuple[str, str], ...], key: bytes) -> int | None:
    return check_peer_auth(spec, RECEIVER, metadata, now_ms(), lambda member: key)


def test_a_rotated_out_key_opens_no_stream(tmp_path: Path) -> None:
    spec, old, new = setup(tmp_path)
    as_old = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, now_ms(), old)
    assert check(spec, as_old, old.public_key) == SENDER  # before the boundary
    assert check(spec, as_old, new.public_key) is None  # after it


def test_the_new_key_opens_one(tmp_path: Path) -> None:
    spec, _, new = setup(tmp_path)
    as_new = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, now_ms(), new)
    assert check(spec, as_new, new.public_key) == SENDER


def test_a_member_signing_with_both_keys_gets_in_on_either_side(tmp_path: Path) -> None:
    spec, old, new = setup(tmp_path)
    both = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, now_ms(), old, new)
    assert check(spec, both, old.public_key) == SENDER
    assert check(spec, both, new.public_key) == SENDER
    stranger = Ed25519Signer(os.urandom(32))
    assert check(spec, both, stranger.public_key) is None


def test_without_an_epoch_the_cluster_files_key_counts(tmp_path: Path) -> None:
    spec, old, new = setup(tmp_path)
    as_old = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, now_ms(), old)
    assert check_peer_auth(spec, RECEIVER, as_old, now_ms()) == SENDER
    as_new = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, now_ms(), new)
    assert check_peer_auth(spec, RECEIVER, as_new, now_ms()) is None


def test_a_statement_with_too_many_or_malformed_signatures_is_refused(tmp_path: Path) -> None:
    spec, old, _ = setup(tmp_path)
    t = now_ms()
    one = peer_auth_metadata(spec.chain_id, SENDER, RECEIVER, t, old)[0][1]
    signature = one.split(":")[2]
    many = ",".join([signature] * (PEER_AUTH_SIGNATURES_MAX + 1))
    for value in (
        f"{SENDER}:{t}:{many}",
        f"{SENDER}:{t}:{signature},",
        f"{SENDER}:{t}:{signature},zz",
        f"{SENDER}:{t}:{signature[:-2]}",
        f"{SENDER}:{t}:",
    ):
        assert check(spec, ((PEER_AUTH_METADATA, value),), old.public_key) is None, value


def test_a_node_holds_its_cluster_file_key_and_its_rotated_ones(tmp_path: Path) -> None:
    spec, _, new = setup(tmp_path)
    node_dir = spec.node_dir(SENDER)
    path = node_dir / rotated_key_file(new.public_key)
    path.write_text(NEW_SEED.hex())
    path.chmod(0o600)
    (node_dir / "consensus-garbage.key").write_text("not a key")
    (node_dir / "consensus-garbage.key").chmod(0o600)
    seeds = held_consensus_seeds(node_dir)
    assert seeds[0] == read_seed(node_dir / CONSENSUS_KEY_FILE)
    assert seeds[1:] == [NEW_SEED]  # the file that is not a key is skipped
