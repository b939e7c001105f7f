"""The client commands (`quorumgate.ops.clientcli`) against a live cluster, run in-process."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.ops import clientcli
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster, read_seed
from quorumgate.proto.model import DENIAL_TEXT, Mandate, RuleKind, TargetRule, ToolRules
from quorumgate.replica.channels import sync_channel
from quorumgate.sdk.client import SyncClient, load_certificate, verify
from quorumgate.sdk.owner import owner_reader
from tests.client.conftest import SINK

SECRET = f"SECRET-{uuid.uuid4().hex}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = clientcli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code, out, _ = run(capsys, *argv, "--json")
    return code, json.loads(out)


@pytest.fixture(scope="module")
def principal_key(
    cluster: ClusterSpec, owner: SyncClient, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`cli-person`, a principal registered with `quorumgate admin register-principal`."""
    path = tmp_path_factory.mktemp("keys") / "person.key"
    assert clientcli.main(["keygen", "--out", str(path)]) == 0
    argv = ["admin", "register-principal", "cli-person", "--dir", str(cluster.directory)]
    assert clientcli.main([*argv, "--key-file", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def agent_key(
    cluster: ClusterSpec,
    owner: SyncClient,
    principal_key: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """`cli-agent`, acting for `cli-person`, with the mandate [web.get, pay]."""
    path = tmp_path_factory.mktemp("keys") / "agent.key"
    assert clientcli.main(["keygen", "--out", str(path)]) == 0
    argv = ["admin", "register-agent", "cli-agent", "--dir", str(cluster.directory)]
    assert clientcli.main([*argv, "--key-file", str(path), "--principal", "cli-person"]) == 0
    owner.set_mandate("cli-agent", Mandate(allowed_tools=("pay", "web.get")))
    return path


def test_keygen_writes_0600_keys_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.key"
    code, doc = run_json(capsys, "keygen", "--out", str(path))
    assert code == 0 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert doc["public_key"] == bytes(SigningKey(read_seed(path)).verify_key).hex()
    code, _, err = run(capsys, "keygen", "--out", str(path))
    assert code == 2 and "never overwritten" in err
    sink = tmp_path / "s.key"
    code, doc = run_json(capsys, "keygen", "--out", str(sink), "--sink")
    assert doc["kind"] == "x25519"
    assert doc["public_key"] == bytes(PrivateKey(read_seed(sink)).public_key).hex()


def test_admin_commands_and_the_registry_listings(
    cluster: ClusterSpec, owner: SyncClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(cluster.directory)
    agent_key = tmp_path / "admin-agent.key"
    assert run(capsys, "keygen", "--out", str(agent_key))[0] == 0
    code, doc = run_json(
        capsys, "admin", "register-agent", "cli-admin", "--key-file", str(agent_key), "--dir", d
    )
    assert (code, doc["outcome"], doc["operation"]) == (0, "applied", "register-agent")
    code, out, _ = run(
        capsys, "admin", "set-mandate", "cli-admin", "--tools", "web.get,pay", "--dir", d
    )
    assert code == 0 and out.startswith("applied: set-mandate cli-admin at height")
    code, doc = run_json(capsys, "admin", "suspend", "cli-admin", "--dir", d)
    assert code == 0
    code, doc = run_json(capsys, "admin", "resume", "cli-admin", "--dir", d)
    assert code == 0
    code, doc = run_json(capsys, "admin", "set-mandate", "nobody", "--unrestricted", "--dir", d)
    assert (code, doc["outcome"], doc["reason"]) == (1, "rejected", "unknown_agent")
    code, _, err = run(
        capsys, "admin", "set-mandate", "cli-admin", "--tools", "a", "--no-tools", "--dir", d
    )
    assert code == 2 and "one of" in err
    code, _, err = run(capsys, "admin", "suspend", "cli-admin", "--dir", d, "--key", str(agent_key))
    assert code == 2 and "owner key" in err
    code, doc = run_json(
        capsys,
        "admin",
        "register-tool",
        "files.read",
        "--mode",
        "read",
        "--scheme",
        "file",
        "--arg",
        "limit=text",
        "--dir",
        d,
    )
    assert code == 0
    # registration checks (issue 15): a confirm-gated tool states its tier; a direct tool
    # taking an amount needs an override, which the verdict records
    base = ["admin", "register-tool", "cli.pay", "--scheme", "https", "--dir", d]
    code, doc = run_json(capsys, *base, "--mode", "user_confirm")
    assert (code, doc["reason"]) == (1, "tier_undeclared")
    code, doc = run_json(capsys, *base, "--mode", "direct", "--arg", "amount=amount")
    assert (code, doc["reason"]) == (1, "direct_needs_override")
    override = ["--mode", "direct", "--arg", "amount=amount", "--direct-override"]
    code, doc = run_json(capsys, *base, *override)
    assert (code, doc["outcome"], doc["reason"]) == (0, "applied", "direct_override")

    code, doc = run_json(capsys, "agents", "--dir", d)
    agents = {a["agent_id"]: a for a in doc["agents"]}
    mine = agents["cli-admin"]
    assert mine["mandate"]["allowed_tools"] == ["pay", "web.get"]
    assert (mine["mandate_version"], mine["suspended"]) == (1, False)
    assert len(doc["agreed_by"]) >= cluster.f + 1  # f+1 sidecars returned this content
    code, out, _ = run(capsys, "agents", "--dir", d)
    assert out.splitlines()[0].split() == [
        "agent",
        "key",
        "version",
        "suspended",
        "enforcement",
        "delegation",
        "tools",
    ]
    assert any(line.startswith("cli-admin ") for line in out.splitlines())
    code, doc = run_json(capsys, "tools", "--dir", d)
    tools = {t["name"]: t for t in doc["tools"]}
    assert tools["files.read"]["target_schemes"] == ["file"]
    assert tools["files.read"]["arguments"] == {"limit": "text"}
    assert tools["files.read"]["min_tier"] is None  # not stated (a read tool need not)
    assert (tools["cli.pay"]["arguments"], tools["cli.pay"]["direct_override"]) == (
        {"amount": "amount"},
        True,
    )
    assert tools["pay"]["min_tier"] == "delegate"
    assert tools["vault.store"]["envelope_args"] == [
        {"name": "secret", "kind": "card", "require_verified": False}
    ]
    assert SINK in {s["sink_id"] for s in doc["sinks"]}


def test_submit_confirm_and_verdicts(
    cluster: ClusterSpec,
    owner: SyncClient,
    agent_key: Path,
    principal_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = str(cluster.directory)
    base = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-run"]
    code, doc = run_json(
        capsys, *base, "--tool", "web.get", "--target", "https://e.x/a", "--arg", f"q={SECRET}"
    )
    assert (code, doc["outcome"]) == (0, "allow") and "reason" not in doc
    cert = load_certificate(bytes.fromhex(str(doc["certificate"])))
    assert verify(cluster, cert).proposal_id.hex() == doc["proposal_id"]
    # the label opened a run named after this transaction's nonce (issue 16): later
    # commands act in it by its id
    run_id = doc["run_id"]
    assert run_id.startswith("n") and run_id != "cli-run"
    base = ["submit", "--dir", d, "--key", str(agent_key), "--run", run_id]

    code, out, _ = run(
        capsys, *base, "--tool", "web.post", "--target", "https://e.x/a", "--arg", f"body={SECRET}"
    )
    assert code == 1 and DENIAL_TEXT in out and "out_of_scope" not in out
    code, out, _ = run(
        capsys, *base, "--tool", "web.post", "--target", "https://e.x/a", "--show-reason"
    )
    assert code == 1 and "repeat_denied" in out

    code, out, _ = run(
        capsys,
        *base,
        "--tool",
        "pay",
        "--target",
        "https://bank.example/a",
        "--arg",
        f"amount={SECRET}",
    )
    assert code == 3 and "Official confirmation form" in out and "quorumgate confirm" in out
    proposal = out.split("--key PRINCIPAL_KEY ")[1].split()[0]

    # the agent that proposed it holds no card to answer (issue 16)
    code, _, err = run(capsys, "confirm", "--dir", d, "--key", str(agent_key), proposal, "--yes")
    assert code == 1 and "no open card" in err
    code, doc = run_json(capsys, "pending", "--dir", d, "--key", str(agent_key))
    assert (code, doc) == (0, {"cards": []})
    # its principal sees the card with every value, and confirms it
    code, doc = run_json(capsys, "pending", "--dir", d, "--key", str(principal_key))
    [card] = [c for c in doc["cards"] if c["proposal_id"] == proposal]
    assert card["values"] == {"amount": SECRET} and card["confirmer"] == "principal:cli-person"
    assert f'amount = "{SECRET}"' in card["text"] and "principal cli-person only" in card["text"]
    confirm = ["confirm", "--dir", d, "--key", str(principal_key), proposal]
    code, _, err = run(capsys, *confirm)  # stdin is not a terminal under pytest
    assert code == 2 and "--yes" in err
    code, doc = run_json(capsys, *confirm, "--yes")
    assert (code, doc["outcome"], doc["kind"]) == (0, "allow", "confirm")
    code, _, err = run(capsys, *confirm, "--yes")
    assert code == 1 and "no open card" in err

    code, out, _ = run(capsys, "verdicts", "--dir", d, "--json", "--from-height", "1")
    lines = [json.loads(line) for line in out.splitlines()]
    assert proposal in {v["proposal_id"] for v in lines}
    assert {v["outcome"] for v in lines} >= {"allow", "deny", "pending", "applied"}
    assert all(len(v["certified_by"]) >= cluster.f + 1 for v in lines)
    code, out, _ = run(capsys, "verdicts", "--dir", d, "--from-height", "1", "--limit", "3")
    assert out.splitlines()[0].split()[:4] == ["height", "idx", "kind", "outcome"]
    assert "3 certified verdicts" in out
    for text in (out, *(json.dumps(v) for v in lines)):
        assert SECRET not in text


def test_the_registry_comes_from_f_plus_1_sidecars_at_one_height(
    cluster: ClusterSpec,
    owner: SyncClient,
    agent_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`agents` and `tools` read the sidecars' Registry RPC (issue 13, item 6): the answer
    names the height, the state root the sidecars signed for it, and the f+1 (or more)
    sidecars that returned exactly this content."""
    code, doc = run_json(capsys, "agents", "--dir", str(cluster.directory))
    assert code == 0
    assert len(doc["agreed_by"]) >= cluster.f + 1 and len(doc["state_root"]) == 64
    mine = next(a for a in doc["agents"] if a["agent_id"] == "cli-agent")
    assert mine["mandate"]["allowed_tools"] == ["pay", "web.get"]
    registry = owner.registry()
    assert registry.height >= doc["height"] and registry.tool("pay") is not None
    statuses = owner.run(owner.aio.sidecar_status())
    roots = {s.state_root for s in statuses.values() if s.executed_height == registry.height}
    assert not roots or roots == {registry.state_root}


def test_agents_shows_a_key_its_own_part_and_names_a_refusal(
    cluster: ClusterSpec,
    agent_key: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`agents --key K` reads what K may read: an agent its own entry (the scope says so);
    a key the cluster does not know is refused, and the message says PERMISSION_DENIED,
    not that the cluster could not be reached."""
    d = str(cluster.directory)
    code, doc = run_json(capsys, "agents", "--dir", d, "--key", str(agent_key))
    assert code == 0 and doc["scope"] == "agent:cli-agent"
    assert [a["agent_id"] for a in doc["agents"]] == ["cli-agent"]
    stranger = tmp_path / "stranger.key"
    assert run(capsys, "keygen", "--out", str(stranger))[0] == 0
    code, _, err = run(capsys, "agents", "--dir", d, "--key", str(stranger), "--deadline", "20")
    assert code == 2 and "PERMISSION_DENIED" in err and "could not be reached" not in err
    # the log's settings are no agent's to read: refused, not shown as cluster.json's
    code, _, err = run(capsys, "settings", "--dir", d, "--key", str(agent_key))
    assert code == 2 and "answer the owner, members and auditors" in err
    code, doc = run_json(capsys, "settings", "--dir", d)
    assert doc["settings"]["certificate_ttl_ms"] == {"value": 300_000, "source": "cluster.json"}


def test_the_registry_rpc_answers_for_one_height_or_says_why_not(cluster: ClusterSpec) -> None:
    """A height the registry changed after is FAILED_PRECONDITION; a height far ahead is
    UNAVAILABLE after a short wait; the current height is answered with its signed root."""
    import grpc

    from quorumgate.proto import sidecar_pb2 as spb
    from quorumgate.proto import sidecar_pb2_grpc as spb_grpc

    with sync_channel(cluster, 0, "sidecar", reader=owner_reader(cluster)) as channel:
        stub = spb_grpc.SidecarStub(channel)
        now = stub.Registry(spb.RegistryRequest(), timeout=5)
        status = stub.Status(spb.SidecarStatusRequest(), timeout=5)
        assert now.height >= 1 and now.registry_since <= now.height
        if now.height == status.executed_height:
            assert now.state_root == status.state_root
        with pytest.raises(grpc.RpcError) as before:
            stub.Registry(spb.RegistryRequest(height=1), timeout=5)
        assert before.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as ahead:
            stub.Registry(spb.RegistryRequest(height=now.height + 10**6), timeout=10)
        assert ahead.value.code() == grpc.StatusCode.UNAVAILABLE


def test_an_unreachable_cluster_and_missing_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = init_cluster(tmp_path / "dead", 4)
    d = str(dead.directory)
    code, _, err = run(capsys, "admin", "suspend", "x", "--dir", d, "--deadline", "0.5")
    assert code == 2 and "could not be reached" in err
    code, _, err = run(capsys, "agents", "--dir", d)
    assert code == 2 and "could not be reached" in err
    code, _, err = run(capsys, "submit", "--dir", d, "--run", "r", "--tool", "t")
    assert code == 2 and "--key FILE is required" in err
    code, _, err = run(capsys, "agents", "--dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no cluster file" in err


def test_confirming_an_unknown_proposal_is_one_line_not_a_traceback(
    cluster: ClusterSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "ab" * 32
    code, out, err = run(
        capsys, "confirm", "--dir", str(cluster.directory), "--deadline", "0.3", "--yes", unknown
    )
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "no open card" in lines[0] and "quorumgate pending" in lines[0]


def test_an_unexpected_error_is_one_line_naming_the_debug_switch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Whatever a command raises reaches the user as one line; the traceback only with
    QUORUMGATE_DEBUG=1."""
    from quorumgate import cli

    def broken(args: object) -> int:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "_cmd_status", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    code = cli.main(["status", "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "ZeroDivisionError" in err
    assert "QUORUMGATE_DEBUG=1" in err and "boom" not in err
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["status", "--dir", str(tmp_path)])


def test_a_tool_with_further_targets_from_the_command_line(
    cluster: ClusterSpec,
    owner: SyncClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 15, item 1: `register-tool --role ROLE=SCHEMES[:MAX] --target-optional`, and
    `submit --also ROLE=TARGET`; each further target is judged by the rules of its role."""
    d = str(cluster.directory)
    code, doc = run_json(
        capsys, "admin", "register-tool", "cli.mail", "--mode", "direct", "--scheme", "mailto",
        "--role", "recipient=mailto:3", "--target-optional", "--dir", d,
    )  # fmt: skip
    assert (code, doc["outcome"]) == (0, "applied")
    code, doc = run_json(capsys, "tools", "--dir", d)
    mail = {t["name"]: t for t in doc["tools"]}["cli.mail"]
    assert mail["target_roles"] == {"recipient": {"schemes": ["mailto"], "max": 3}}
    assert mail["target_optional"] is True
    code, out, _ = run(capsys, "tools", "--dir", d)
    assert "recipient=mailto:3" in out and "mailto (optional)" in out
    code, _, err = run(
        capsys, "admin", "register-tool", "x.y", "--mode", "read", "--role", "r", "--dir", d
    )
    assert code == 2 and "ROLE=SCHEME" in err

    key = tmp_path / "mailer.key"
    assert clientcli.main(["keygen", "--out", str(key)]) == 0
    register = ["admin", "register-agent", "cli-mailer", "--dir", d, "--key-file", str(key)]
    assert clientcli.main(register) == 0
    capsys.readouterr()
    rules = (
        ToolRules(
            "cli.mail",
            (
                TargetRule(RuleKind.ANY),
                TargetRule(RuleKind.HOST_SUFFIX, "example.com", role="recipient"),
            ),
        ),
    )
    owner.set_mandate("cli-mailer", Mandate(allowed_tools=("cli.mail",), rules=rules))
    base = ["submit", "--dir", d, "--key", str(key), "--tool", "cli.mail", "--show-reason"]
    also = ["--also", "recipient=mailto:ann@EXAMPLE.com", "--also"]
    code, doc = run_json(capsys, *base, "--run", "m1", *also, "recipient=mailto:bo@a.example.com")
    assert (code, doc["outcome"]) == (0, "allow")
    code, doc = run_json(capsys, *base, "--run", "m2", *also, "recipient=mailto:x@evil.example")
    assert (code, doc["outcome"], doc["reason"]) == (1, "deny", "out_of_scope")
    code, doc = run_json(capsys, *base, "--run", "m3", "--also", "grantee=mailto:a@example.com")
    assert (code, doc["reason"]) == (1, "target_scheme_not_allowed")


def test_settings_are_set_in_the_log_from_the_command_line(
    cluster: ClusterSpec, agent_key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15, item 5: `admin set-settings NAME=VALUE... [--clear NAME]` and `settings`;
    a quota set in the log takes effect on the next call."""
    d = str(cluster.directory)
    code, doc = run_json(capsys, "settings", "--dir", d)
    quota = doc["settings"]["quota_agent_per_minute"]
    assert code == 0 and quota["source"] == "cluster.json"
    code, doc = run_json(capsys, "admin", "set-settings", "quota_agent_per_minute=1", "--dir", d)
    assert (code, doc["outcome"]) == (0, "applied")
    code, doc = run_json(capsys, "settings", "--dir", d)
    assert doc["settings"]["quota_agent_per_minute"] == {"value": 1, "source": "log"}
    base = ["submit", "--dir", d, "--key", str(agent_key), "--tool", "web.get", "--show-reason"]
    code, first = run_json(capsys, *base, "--run", "quota-1", "--target", "https://e.x/1")
    code, second = run_json(capsys, *base, "--run", first["run_id"], "--target", "https://e.x/2")
    assert (first["outcome"], second["reason"]) == ("allow", "quota_exceeded")
    code, doc = run_json(
        capsys, "admin", "set-settings", "--clear", "quota_agent_per_minute", "--dir", d
    )
    assert (code, doc["outcome"]) == (0, "applied")
    code, _, err = run(capsys, "admin", "set-settings", "quota_per_day=5", "--dir", d)
    assert code == 2 and "unknown setting" in err
    code, doc = run_json(capsys, "admin", "set-settings", "latch_halt_threshold=0", "--dir", d)
    assert (code, doc["outcome"], doc["reason"]) == (1, "rejected", "invalid_spec")
