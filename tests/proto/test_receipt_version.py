"""The receipt version in the cluster file: `init` writes 2 (certificates carry a signed
validity window), a file without one is a chain from before (1: its receipts sign what
they always did, so its log replays to the same bytes), and the version reaches every
engine built for the cluster through one named predicate, `receipts_expire`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorumgate.proto.chainversions import commits_arguments
from quorumgate.proto.clusterfile import (
    RECEIPT_VERSION_NEW,
    RECEIPT_VERSIONS,
    ClusterFileError,
    init_cluster,
    load_cluster,
    receipts_expire,
)
from quorumgate.sidecar.engine.core import config_for_cluster
from tests.proto.test_state_version import _rewrite


def test_init_writes_receipts_that_expire_and_it_reaches_the_engine(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.receipt_version == RECEIPT_VERSION_NEW == 3 and spec.receipts_expire
    assert json.loads((tmp_path / "c" / "cluster.json").read_text())["receipt_version"] == 3
    assert load_cluster(tmp_path / "c").receipts_expire
    assert config_for_cluster(spec).receipts_expire


def test_a_file_from_before_keeps_receipts_that_never_expire(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", receipt_version=None)
    old = load_cluster(tmp_path / "c")
    assert old.receipt_version == 1 and not old.receipts_expire
    config = config_for_cluster(old)
    assert not config.receipts_expire
    assert config.fingerprint != config_for_cluster(spec).fingerprint


def test_the_predicate_names_the_versions_and_compares_no_numbers() -> None:
    assert [receipts_expire(v) for v in RECEIPT_VERSIONS] == [False, True, True]
    assert not receipts_expire(4)  # a version this build does not know expires nothing
    assert [commits_arguments(v) for v in RECEIPT_VERSIONS] == [False, False, True]
    assert not commits_arguments(4)


@pytest.mark.parametrize("bad", [0, 4, "2", True, 2.0])
def test_an_unknown_receipt_version_is_refused_by_name(tmp_path: Path, bad: object) -> None:
    init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", receipt_version=bad)
    with pytest.raises(ClusterFileError, match="receipt_version must be one of"):
        load_cluster(tmp_path / "c")
