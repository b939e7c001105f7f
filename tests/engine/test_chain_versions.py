"""What each chain version turns on is one table (proto/chainversions.py), and no engine
module decides behaviour by comparing a version number
(docs/architecture/0004-chain-semantics-fixed-at-init.md)."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.proto import chainversions
from quorumgate.proto.chainversions import CHAIN_VERSIONS, Behaviour, turns_on
from quorumgate.proto.clusterfile import init_cluster
from quorumgate.sidecar.engine.config import EngineConfig, config_for_cluster

ROOT = Path(__file__).resolve().parents[2]
VERSION_FIELDS = ("canonical_version", "authority_version", "state_version", "receipt_version")
# The replicas' field: no engine module reads it (docs/consensus/epochs.md).
CONSENSUS_FIELD = "consensus_version"
PREDICATES = {
    behaviour: getattr(chainversions, behaviour.value) for behaviour in Behaviour
}  # each behaviour's predicate is named after it


def _field_of(behaviour: Behaviour) -> str:
    return next(
        field
        for field, versions in CHAIN_VERSIONS.items()
        if any(behaviour in added for added in versions.values())
    )


def test_every_behaviour_is_turned_on_by_exactly_one_version_of_one_field() -> None:
    owners = [
        (field, version)
        for behaviour in Behaviour
        for field, versions in CHAIN_VERSIONS.items()
        for version, added in versions.items()
        if behaviour in added
    ]
    assert len(owners) == len(Behaviour)
    assert set(CHAIN_VERSIONS) == {*VERSION_FIELDS, CONSENSUS_FIELD}
    for versions in CHAIN_VERSIONS.values():
        assert min(versions) == chainversions.VERSION_ABSENT and not versions[1]


@pytest.mark.parametrize("behaviour", list(Behaviour))
def test_a_version_keeps_what_the_versions_before_it_turned_on(behaviour: Behaviour) -> None:
    field = _field_of(behaviour)
    since = next(v for v, added in CHAIN_VERSIONS[field].items() if behaviour in added)
    predicate = PREDICATES[behaviour]
    for version in CHAIN_VERSIONS[field]:
        assert predicate(version) is (version >= since) is turns_on(field, version, behaviour)
    assert not predicate(max(CHAIN_VERSIONS[field]) + 1)  # unknown: nothing turned on
    assert not predicate(0)


def test_init_writes_every_field_at_its_latest_version_with_everything_on(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4, port_base=20000)
    config = config_for_cluster(spec)
    assert config == replace(
        EngineConfig(chain_id="c", owner_public_key=bytes(32)),
        chain_id=spec.chain_id,
        owner_public_key=spec.owner_public_key,
    )
    for behaviour, predicate in PREDICATES.items():
        field = _field_of(behaviour)
        source = spec if field == CONSENSUS_FIELD else config
        assert predicate(getattr(source, field)), behaviour


def _version_comparisons(source: str) -> list[int]:
    """The lines comparing a `version` name or a `*_version` field with a number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            (isinstance(s, ast.Name) and s.id in ("version", *VERSION_FIELDS))
            or (isinstance(s, ast.Attribute) and s.attr in VERSION_FIELDS)
            for s in sides
        )
        numbered = any(isinstance(s, ast.Constant) and isinstance(s.value, int) for s in sides)
        if named and numbered:
            found.append(node.lineno)
    return found


def test_no_engine_module_compares_a_version_number() -> None:
    files = sorted((ROOT / "sidecar" / "engine").glob("*.py"))
    files += [ROOT / "proto" / "clusterfile.py", ROOT / "proto" / "chainversions.py"]
    hits = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in _version_comparisons(path.read_text(encoding="utf-8"))
    ]
    assert hits == []


def test_the_check_sees_a_comparison_of_a_field_or_a_version_with_a_number() -> None:
    source = (
        "if config.canonical_version >= 2:\n    pass\n"
        "ok = version < 3\n"
        "fine = strict_forms(version) and config.mandate_version > 1\n"
    )
    assert _version_comparisons(source) == [1, 3]
