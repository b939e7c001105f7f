"""A new machine's directory (`quorumgate init --join`, docs/operating.md, "Replacing a
member"): fresh keys (0600, never printed), free ports, the cluster file it trusts as it
is, and the member entry the owner signs into the `replace` record."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    JOIN_FILE,
    RECEIPT_KEY_FILE,
    TLS_KEY_FILE,
    ClusterFileError,
    init_cluster,
    init_join,
    load_cluster,
    parse_member_entry,
    public_key_of,
    read_seed,
)


def test_a_join_directory_is_the_new_machine_of_one_member(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    member = init_join(tmp_path / "c" / "cluster.json", 3, tmp_path / "new")
    joined = load_cluster(tmp_path / "new")
    assert joined.chain_id == spec.chain_id
    # epoch 0's keys stay the cluster file's; the node itself is the new machine
    assert joined.membership() == spec.membership()
    assert joined.member(3) == member and joined.member(2) == spec.member(2)
    node = tmp_path / "new" / "node-3"
    for name in (CONSENSUS_KEY_FILE, RECEIPT_KEY_FILE, TLS_KEY_FILE):
        assert stat.S_IMODE((node / name).stat().st_mode) == 0o600
    assert public_key_of(read_seed(node / CONSENSUS_KEY_FILE)) == member.public_key
    assert member.public_key != spec.member(3).public_key
    entry = (tmp_path / "new" / JOIN_FILE).read_text()
    assert read_seed(node / CONSENSUS_KEY_FILE).hex() not in entry
    assert "PRIVATE" not in entry
    assert parse_member_entry(json.loads(entry), spec, "entry") == member


def test_a_join_directory_is_never_written_over(tmp_path: Path) -> None:
    init_cluster(tmp_path / "c", 4)
    init_join(tmp_path / "c" / "cluster.json", 3, tmp_path / "new")
    with pytest.raises(ClusterFileError, match="exists"):
        init_join(tmp_path / "c" / "cluster.json", 3, tmp_path / "new")
    # An index an `add` brings (4..6) may join; none past the largest cluster size.
    with pytest.raises(ClusterFileError, match="no member of any cluster size"):
        init_join(tmp_path / "c" / "cluster.json", 7, tmp_path / "other")


def test_an_entry_for_another_cluster_is_refused(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    plain = init_cluster(tmp_path / "p", 4, insecure=True)
    member = init_join(tmp_path / "c" / "cluster.json", 3, tmp_path / "new")
    doc = member.document()
    with pytest.raises(ClusterFileError, match="plaintext"):
        parse_member_entry(doc, plain, "entry")
    stolen = dict(doc, public_key=spec.member(1).public_key.hex())
    with pytest.raises(ClusterFileError, match="already names"):
        parse_member_entry(stolen, spec, "entry")
    no_cert = {k: v for k, v in doc.items() if k != "tls_cert"}
    with pytest.raises(ClusterFileError, match="uses TLS"):
        parse_member_entry(no_cert, spec, "entry")


def test_replace_member_refuses_an_entry_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`admin replace-member` checks the entry against the cluster file first: another
    member's, a key the cluster already names, or no JSON is refused with exit 2, and no
    replica is asked anything (none runs here)."""
    import argparse

    from quorumgate.ops.rotate import cmd_replace_member

    spec = init_cluster(tmp_path / "c", 4)
    init_join(tmp_path / "c" / "cluster.json", 3, tmp_path / "new")
    entry = tmp_path / "new" / JOIN_FILE
    doc = json.loads(entry.read_text())
    stolen = tmp_path / "stolen.json"
    stolen.write_text(json.dumps(dict(doc, public_key=spec.member(1).public_key.hex())))
    broken = tmp_path / "broken.json"
    broken.write_text("{")

    def run(member: int, path: Path) -> str:
        args = argparse.Namespace(
            dir=str(tmp_path / "c"), member=member, entry=str(path), key=None, json=False,
            deadline=1.0,
        )  # fmt: skip
        assert cmd_replace_member(args) == 2
        return capsys.readouterr().err

    assert "describes member 3, not member 2" in run(2, entry)
    assert "already names" in run(3, stolen)
    assert "not JSON" in run(3, broken)


def test_a_new_host_takes_its_address_and_fixed_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On several hosts (docs/operating.md, "Several hosts") a new machine is reached at
    its own address, on the fixed ports the others use (`init --hosts` gives each member
    7400..7403 on its host): `init --join --host ADDR --port-base P` writes both into the
    entry. A `--port-base` that `--join` dropped would leave the new machine on whatever
    ports were free, which a firewall between the hosts does not expect."""
    from quorumgate.cli import main

    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    spec = init_cluster(tmp_path / "c", 4, hosts=hosts)
    assert {m.replica_port for m in spec.members} == {7400}
    code = main([
        "init", "--join", "--cluster", str(tmp_path / "c" / "cluster.json"), "--index", "3",
        "--dir", str(tmp_path / "new"), "--host", "10.0.0.9", "--port-base", "7400", "--json",
    ])  # fmt: skip
    assert code == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["host"] == "10.0.0.9"
    ports = ("replica_port", "metrics_port", "sidecar_port", "sidecar_metrics_port")
    assert [entry[name] for name in ports] == [7400, 7401, 7402, 7403]
    member = parse_member_entry(entry, spec, "entry")
    assert member.replica_address == "10.0.0.9:7400"
    assert load_cluster(tmp_path / "new").member(3) == member
    # Out of range, refused before anything is written.
    with pytest.raises(ClusterFileError, match="port-base"):
        init_join(tmp_path / "c" / "cluster.json", 4, tmp_path / "other", port_base=65534)
    assert not (tmp_path / "other").exists()
