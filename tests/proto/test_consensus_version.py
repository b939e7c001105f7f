"""The consensus version in the cluster file: `init` writes 2 (the replicas run epochs:
a committed record the owner signed changes a member's key at the next epoch), and a file
without one is a chain from before (1: one member set for good, a record is no
transaction), through one named predicate, `runs_epochs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorumgate.proto.chainversions import CONSENSUS_VERSION_NEW, CONSENSUS_VERSIONS, runs_epochs
from quorumgate.proto.clusterfile import ClusterFileError, init_cluster, load_cluster
from tests.proto.test_state_version import _rewrite


def test_init_writes_the_version_that_runs_epochs(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.consensus_version == CONSENSUS_VERSION_NEW == 2 and spec.runs_epochs
    assert json.loads((tmp_path / "c" / "cluster.json").read_text())["consensus_version"] == 2
    assert load_cluster(tmp_path / "c").runs_epochs


def test_a_file_from_before_keeps_its_member_set_for_good(tmp_path: Path) -> None:
    init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", consensus_version=None)
    old = load_cluster(tmp_path / "c")
    assert old.consensus_version == 1 and not old.runs_epochs
    assert "consensus_version" not in json.loads((tmp_path / "c" / "cluster.json").read_text())


def test_the_predicate_names_the_versions_and_compares_no_numbers() -> None:
    assert [runs_epochs(v) for v in CONSENSUS_VERSIONS] == [False, True]
    assert not runs_epochs(3)  # a version this build does not know turns nothing on


@pytest.mark.parametrize("bad", [0, 3, "2", True, 2.0])
def test_an_unknown_consensus_version_is_refused_by_name(tmp_path: Path, bad: object) -> None:
    init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", consensus_version=bad)
    with pytest.raises(ClusterFileError, match="consensus_version must be one of"):
        load_cluster(tmp_path / "c")
