"""The SDK as a new user meets it, without a cluster."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from quorumgate import SyncClient, generate_key, generate_sink_key, load_key
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, init_cluster
from quorumgate.sdk.client import Client


def test_from_files_without_a_key_refuses_instead_of_signing_as_the_owner(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    for cls in (Client, SyncClient):
        with pytest.raises(ValueError, match="as_owner"):
            cls.from_files(spec.directory)  # type: ignore[attr-defined]
    owner = Client.as_owner(spec.directory)
    assert owner.is_owner
    agent_path = tmp_path / "agent.key"
    generate_key(agent_path)
    agent = Client.from_files(spec.directory, agent_path)
    assert not agent.is_owner and agent.public_key != spec.owner_public_key
    assert (spec.directory / OWNER_KEY_FILE).exists()


def test_keys_are_generated_0600_never_overwritten_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    key = generate_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bytes(load_key(path).verify_key) == bytes(key.verify_key)
    with pytest.raises(FileExistsError):
        generate_key(path)
    sink = generate_sink_key(tmp_path / "sink.key")
    assert len(bytes(sink.public_key)) == 32
    assert generate_key() is not None  # in memory only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.key", "sink.key"]
