"""The sync page (`sync_blocks_max`) in the cluster file: the blocks one catch-up answer
carries at most (docs/operating.md, "The sync page"). Written only when not the
default, read back, handed to the replica's limits, refused clearly outside its range."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import (
    SYNC_BLOCKS_DEFAULT,
    SYNC_BLOCKS_MAX,
    SYNC_BLOCKS_MIN,
    ClusterFileError,
    init_cluster,
    load_cluster,
    write_cluster_file,
)
from quorumgate.replica.config import Limits


def _doc(directory: Path) -> dict[str, object]:
    return json.loads((directory / "cluster.json").read_text())  # type: ignore[no-any-return]


def test_the_default_page_is_the_replicas_and_is_not_written(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.sync_blocks_max == SYNC_BLOCKS_DEFAULT == Limits().sync_blocks_max
    assert "sync_blocks_max" not in _doc(tmp_path / "c")
    assert load_cluster(tmp_path / "c").sync_blocks_max == SYNC_BLOCKS_DEFAULT


@pytest.mark.parametrize("page", [SYNC_BLOCKS_MIN, 8, SYNC_BLOCKS_MAX])
def test_a_page_in_range_is_written_and_read_back(tmp_path: Path, page: int) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    write_cluster_file(replace(spec, sync_blocks_max=page))
    assert _doc(tmp_path / "c")["sync_blocks_max"] == page
    assert load_cluster(tmp_path / "c").sync_blocks_max == page


@pytest.mark.parametrize("bad", [0, SYNC_BLOCKS_MIN - 1, SYNC_BLOCKS_MAX + 1, "8", 8.0, True])
def test_a_page_outside_the_range_is_refused_clearly(tmp_path: Path, bad: object) -> None:
    init_cluster(tmp_path / "c", 4)
    doc = _doc(tmp_path / "c")
    doc["sync_blocks_max"] = bad
    (tmp_path / "c" / "cluster.json").write_text(json.dumps(doc))
    with pytest.raises(ClusterFileError, match=r"sync_blocks_max must be an integer in 4\.\.4096"):
        load_cluster(tmp_path / "c")
