"""The state version in the cluster file: `init` writes 2 (the hash tree over
the state's entries), a file without one is a chain from before (1, SHA-256 over the whole
state), and the version reaches every engine built for the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import (
    STATE_VERSION_NEW,
    ClusterFileError,
    init_cluster,
    load_cluster,
)
from quorumgate.sidecar.engine.core import config_for_cluster


def _rewrite(directory: Path, **changes: object) -> None:
    path = directory / "cluster.json"
    doc = json.loads(path.read_text())
    for name, value in changes.items():
        if value is None:
            doc.pop(name, None)
        else:
            doc[name] = value
    path.write_text(json.dumps(doc))


def test_init_writes_the_newest_state_version_and_it_reaches_the_engine(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.state_version == STATE_VERSION_NEW == 2
    assert json.loads((tmp_path / "c" / "cluster.json").read_text())["state_version"] == 2
    assert load_cluster(tmp_path / "c").state_version == 2
    assert config_for_cluster(spec).state_version == 2


def test_a_file_from_before_is_version_1_and_fingerprints_apart(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", state_version=None)
    old = load_cluster(tmp_path / "c")
    assert old.state_version == 1
    assert config_for_cluster(old).state_version == 1
    assert config_for_cluster(old).fingerprint != config_for_cluster(spec).fingerprint


@pytest.mark.parametrize("bad", [0, 3, "2", True, 2.0])
def test_an_unknown_state_version_is_refused_by_name(tmp_path: Path, bad: object) -> None:
    init_cluster(tmp_path / "c", 4)
    _rewrite(tmp_path / "c", state_version=bad)
    with pytest.raises(ClusterFileError, match="state_version must be one of"):
        load_cluster(tmp_path / "c")
