"""`quorumgate status` names the cluster's epoch (docs/consensus/epochs.md, "The live
replica"): the newest one f+1 live replicas report, so that one lying replica cannot name
an epoch alone; and `admin rotate-key` refuses a chain whose member set is fixed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from quorumgate.ops.nodes import NodeStatus
from quorumgate.ops.output import cluster_epoch, epoch_line, status_table
from quorumgate.ops.rotate import EXIT_ERROR, cmd_rotate_key
from quorumgate.proto.clusterfile import init_cluster
from tests.proto.test_state_version import _rewrite


def node(index: int, epoch: int | None, alive: bool = True) -> NodeStatus:
    return NodeStatus(index, f"127.0.0.1:{7400 + index}", alive, None, epoch=epoch)


def test_the_cluster_epoch_is_the_newest_f_plus_1_agree_on() -> None:
    assert cluster_epoch(1, [node(0, 1), node(1, 1), node(2, 0), node(3, 0)]) == 1
    assert cluster_epoch(1, [node(0, 7), node(1, 1), node(2, 1), node(3, 1)]) == 1
    assert cluster_epoch(1, [node(0, 1), node(1, 1, alive=False), node(2, 0)]) is None
    assert epoch_line(1, True) == "epoch: 1 (changes at owner-signed records)"
    assert epoch_line(None, False).startswith("epoch: unknown")


def test_the_status_table_has_an_epoch_column() -> None:
    text = status_table([node(0, 2)])
    assert text.splitlines()[0].split()[:4] == ["node", "address", "alive", "epoch"]
    assert node(0, 2).as_dict()["epoch"] == 2


def test_rotate_key_refuses_a_chain_whose_keys_are_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    _rewrite(spec.directory, consensus_version=None)
    args = argparse.Namespace(
        dir=str(spec.directory), member=2, receipt=None, key=None, json=False
    )
    assert cmd_rotate_key(args) == EXIT_ERROR
    assert "fixed for good" in capsys.readouterr().err
    assert not list(spec.node_dir(2).glob("consensus-*.key"))
