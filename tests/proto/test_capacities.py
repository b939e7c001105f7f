"""The engine's capacities in the cluster file (`init --capacity NAME=N`): fixed at init,
read back, handed to every sidecar's engine, and refused clearly when wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from quorumgate.cli import main as quorumgate
from quorumgate.proto import limits
from quorumgate.proto.clusterfile import (
    CAPACITY_VALUE_MAX,
    ClusterFileError,
    init_cluster,
    load_cluster,
)
from quorumgate.sidecar.engine.core import config_for_cluster


def test_capacities_are_written_read_back_and_reach_the_engine(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4, capacities={"grants_max": 9_000, "agents_max": 12_000})
    assert spec.capacities == (("agents_max", 12_000), ("grants_max", 9_000))
    assert load_cluster(tmp_path / "c").capacities == spec.capacities
    config = config_for_cluster(spec)
    assert (config.agents_max, config.grants_max) == (12_000, 9_000)
    assert config.pending_max == limits.PENDING_MAX_DEFAULT  # the rest at their defaults
    # part of the chain's configuration: the engine's fingerprint (in the state root) moves
    plain = config_for_cluster(init_cluster(tmp_path / "d", 4))
    assert config.fingerprint != plain.fingerprint


def test_a_file_without_capacities_has_the_defaults_and_writes_none(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.capacities == ()
    assert "capacities" not in json.loads((tmp_path / "c" / "cluster.json").read_text())


@pytest.mark.parametrize(
    ("capacities", "message"),
    [
        ({"agent_max": 10}, "unknown capacity 'agent_max' (one of agents_max, "),
        ({"agents_max": 0}, f"agents_max must be in 1..{CAPACITY_VALUE_MAX}"),
        ({"agents_max": CAPACITY_VALUE_MAX + 1}, "agents_max must be in"),
        ({"agents_max": True}, "agents_max must be an integer"),
        ({"agents_max": "100"}, "agents_max must be an integer"),
    ],
)
def test_bad_capacities_are_refused_at_init_and_in_a_hand_edited_file(
    tmp_path: Path, capacities: dict[str, object], message: str
) -> None:
    with pytest.raises(ClusterFileError, match="--capacity: .*" + _re(message)):
        init_cluster(tmp_path / "c", 4, capacities=capacities)  # type: ignore[arg-type]
    assert not (tmp_path / "c" / "cluster.json").exists()
    spec = init_cluster(tmp_path / "d", 4)
    path = tmp_path / "d" / "cluster.json"
    doc = json.loads(path.read_text())
    doc["capacities"] = capacities
    path.write_text(json.dumps(doc))
    with pytest.raises(ClusterFileError, match=_re(f"{path}: capacities: {message}")):
        load_cluster(spec.directory)


def _re(text: str) -> str:
    return re.escape(text)


def test_the_init_command_takes_capacities_and_names_a_malformed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path / "c")
    assert quorumgate(["init", "--dir", d, "--capacity", "grants_max=5000"]) == 0
    assert load_cluster(Path(d)).capacities == (("grants_max", 5_000),)
    capsys.readouterr()
    bad = str(tmp_path / "bad")
    assert quorumgate(["init", "--dir", bad, "--capacity", "grants_max"]) == 2
    assert "--capacity 'grants_max': expected NAME=NUMBER" in capsys.readouterr().err
