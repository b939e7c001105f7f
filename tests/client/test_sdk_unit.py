"""The SDK as a new user meets it, without a cluster."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from quorumgate import SyncClient, generate_key, generate_sink_key, load_key
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, init_cluster
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import AgentBinding
from quorumgate.sdk.values import Grant


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


def test_a_grant_names_its_run_and_calls_under_it_act_in_that_run(tmp_path: Path) -> None:
    """A `Grant` is a value (the grant id and its run), not bytes with a field bolted on:
    the id is there for whatever wants bytes, and a call under it carries its run on a
    chain that names runs by the nonce that opened them; a plain id leaves the label."""
    spec = init_cluster(tmp_path / "c", 4)
    assert spec.authority_version >= 2
    client = Client(spec, SigningKey.generate())
    grant = Grant(b"\x07" * 32, "n5")
    assert bytes(grant) == grant.grant_id == b"\x07" * 32
    assert "0707" in repr(grant) and "n5" in repr(grant)
    assert client.run_under(grant, "job-9") == "n5"
    assert client.run_under(grant.grant_id, "job-9") == "job-9"
    assert client.run_under(None, "job-9") == "job-9"
    binding = AgentBinding(client, "job-9", grant)
    assert (binding.proposal_run_id, binding.proposal_grant) == ("n5", grant.grant_id)
    assert AgentBinding(client, "job-9").proposal_grant is None
    with pytest.raises(AttributeError):
        grant.run_id = "n6"  # type: ignore[misc]


def test_a_sync_client_for_another_key_shares_the_thread_and_is_refused_once_closed(
    tmp_path: Path,
) -> None:
    """`with_key` goes through the constructor: the new client runs on the first one's
    loop with its channels, closing it frees nothing, and closing the first ends both."""
    spec = init_cluster(tmp_path / "c", 4)
    first = SyncClient(spec, SigningKey.generate())
    other = first.with_key(SigningKey.generate())
    assert other.aio.pool is first.aio.pool and other.public_key != first.public_key
    with pytest.raises(ValueError):
        SyncClient(spec, SigningKey.generate(), share=first, rpc_timeout_s=1.0)
    other.close()
    assert first.run_under(None, "job-1") == "job-1"
    assert first.run(_answer()) == 42  # still running
    first.close()
    with pytest.raises(RuntimeError, match="closed"):
        first.with_key(SigningKey.generate()).run(_answer())


async def _answer() -> int:
    return 42
