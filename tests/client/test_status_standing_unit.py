"""`quorumgate status` shows the cluster as it stands (docs/operating.md, "Status after a
reconfiguration"): the current epoch's members from the chain of epochs, what changed
each of them and in which epoch, and plainly when the chain could not be followed and
why (cluster.json's members are then shown as such)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from quorumgate.cli import _cmd_status
from quorumgate.ops.standing import (
    MemberNow,
    Standing,
    _changes,
    from_cluster_file,
    read_standing,
    standing_text,
)
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, init_cluster
from quorumgate.sdk.epochs import CheckedEpoch, key_fingerprint
from tests.proto.test_state_version import _rewrite


def key(byte: int) -> bytes:
    return bytes([byte]) * 32


def epoch(
    number: int,
    keys: list[bytes],
    receipts: list[bytes],
    moved: tuple[tuple[int, str], ...] = (),
) -> CheckedEpoch:
    return CheckedEpoch(number, number * 10, b"", tuple(keys), (0, 1), b"", moved, tuple(receipts))


def test_each_change_is_named_with_its_epoch() -> None:
    keys = [key(i) for i in range(1, 5)]
    receipts = [key(i) for i in range(11, 15)]
    at = ((3, "10.0.0.9:7000"),)
    new = [key(21), key(22), key(23)]
    chain = [
        epoch(0, keys, receipts),
        epoch(1, [*keys[:3], key(9)], [*receipts[:3], key(19)], at),  # member 3 replaced
        epoch(2, [*keys[:3], key(9)], [receipts[0], key(18), receipts[2], key(19)], at),
        epoch(
            3, [keys[0], key(8), keys[2], key(9)], [receipts[0], key(18), receipts[2], key(19)], at
        ),
    ]
    grown = chain[-1]
    adds = at + tuple((i, f"10.0.0.{i}:7000") for i in (4, 5, 6))
    chain.append(epoch(4, [*grown.keys, *new], [*grown.receipt_keys, *new], adds))
    chain.append(epoch(5, list(grown.keys), list(grown.receipt_keys), adds))
    changes, removed = _changes(chain)
    assert changes[3] == [(1, "replaced by a new machine at 10.0.0.9:7000")]
    assert changes[1] == [(2, "receipt key rotated"), (3, "consensus key rotated")]
    assert changes[0] == changes[2] == []
    assert removed == {4: 5, 5: 5, 6: 5}
    assert not set(changes) & {4, 5, 6}
    changes, removed = _changes(chain[:5])
    assert changes[5] == [(4, "added")] and removed == {}


def test_the_text_says_whose_members_it_shows(tmp_path: Path) -> None:
    member = MemberNow(3, "10.0.0.9:7000", "ab" * 8, "cd" * 8, ((1, "replaced"),))
    spec = init_cluster(tmp_path / "c", 4)
    followed = Standing(spec, True, 1, (member,), ((4, 2),), (0, 2))
    text = standing_text(followed)
    assert "members of epoch 1" in text and "replicas 0,2" in text
    assert "replaced in epoch 1" in text and "member 4: removed in epoch 2" in text
    assert followed.as_dict()["removed"] == [{"index": 4, "epoch": 2}]


def test_without_replicas_it_says_the_chain_could_not_be_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    standing = read_standing(spec)
    assert not standing.followed and standing.epoch is None
    assert "fewer than f+1 = 2 replicas answered" in standing.problem
    assert [m.key for m in standing.members] == [
        key_fingerprint(m.public_key) for m in spec.members
    ]
    assert "could not follow the chain of epochs" in standing_text(standing)
    assert _cmd_status(argparse.Namespace(dir=str(spec.directory), json=True, key=None)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"]["followed"] is False and doc["cluster"]["source"] == "cluster.json"
    assert "replicas answered" in doc["cluster"]["problem"]
    assert len(doc["cluster"]["members"]) == 4


def test_without_a_key_it_says_which_file_is_missing(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    (spec.directory / OWNER_KEY_FILE).unlink()
    standing = read_standing(spec)
    assert not standing.followed
    assert OWNER_KEY_FILE in standing.problem and "--key" in standing.problem


def test_a_chain_that_runs_no_epochs_shows_cluster_json_as_fixed(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    _rewrite(spec.directory, consensus_version=None)
    from quorumgate.proto.clusterfile import load_cluster

    standing = read_standing(load_cluster(spec.directory))
    assert standing == from_cluster_file(load_cluster(spec.directory))
    assert "member set is fixed" in standing_text(standing)


def test_ups_table_says_it_could_not_follow_and_tries_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up`'s table reads the chain once, says it could not follow it, and reads it again
    only after UP_CHAIN_RETRY_S, not at every refresh."""
    from quorumgate import cli
    from quorumgate.ops import standing

    spec = init_cluster(tmp_path / "c", 4)
    reads: list[int] = []
    real = standing.read_standing

    def counted(spec: ClusterSpec, key_path: Path | None = None) -> Standing:
        reads.append(1)
        return real(spec, key_path)

    monkeypatch.setattr(standing, "read_standing", counted)
    table = cli._UpTable(spec)
    assert "could not follow the chain of epochs" in table.text() and len(reads) == 1
    table.text()
    assert len(reads) == 1
    table.read_at -= cli.UP_CHAIN_RETRY_S
    table.text()
    assert len(reads) == 2
