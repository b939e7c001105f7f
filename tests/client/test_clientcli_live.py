"""The client commands (`quorumgate.ops.clientcli`) against a live cluster, run in-process."""

from __future__ import annotations

import json
import os
import pty
import select
import stat
import sys
import time
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.ops import clientcli
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster, read_seed
from quorumgate.proto.model import DENIAL_TEXT, Mandate, RuleKind, TargetRule, ToolRules
from quorumgate.proto.sealedkey import KDF_INTERACTIVE, read_sealed, seal, write_sealed
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.certificates import load_certificate, verify
from quorumgate.sdk.owner import owner_reader
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import SINK

SECRET = f"SECRET-{uuid.uuid4().hex}"
PASSPHRASE = "the principal's passphrase"
TERMINAL_WAIT_S = 60.0


@contextmanager
def given(*lines: str) -> Iterator[str]:
    """A descriptor to pass as `--passphrase-fd`: a pipe holding `lines`, as a script
    would open one; closed after the command."""
    read, write = os.pipe()
    os.write(write, "".join(line + "\n" for line in lines).encode())
    os.close(write)
    try:
        yield str(read)
    finally:
        os.close(read)


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
    """`cli-person`, a principal registered with `quorumgate admin register-principal`;
    its key sealed with PASSPHRASE (`interactive`: these tests open it many times)."""
    path = tmp_path_factory.mktemp("keys") / "person.key"
    with given(PASSPHRASE) as fd:
        argv = ["keygen", "--out", str(path), "--principal", "--kdf-cost", "interactive"]
        assert clientcli.main([*argv, "--passphrase-fd", fd]) == 0
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
    # registration checks: a confirm-gated tool states its tier; a direct tool
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
    tmp_path: Path,
) -> None:
    d = str(cluster.directory)
    base = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-run"]
    code, doc = run_json(
        capsys, *base, "--tool", "web.get", "--target", "https://e.x/a", "--arg", f"q={SECRET}"
    )
    assert (code, doc["outcome"]) == (0, "allow") and "reason" not in doc
    cert = load_certificate(bytes.fromhex(str(doc["certificate"])))
    assert verify(cluster, cert).proposal_id.hex() == doc["proposal_id"]
    # the label opened a run named after this transaction's nonce (docs/engine.md: runs
    # are opened by the cluster): later commands act in it by its id
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

    # the agent that proposed it holds no card to answer (split authority); its key, kept in the
    # clear as an agent's is, is not even used: answering needs a sealed key
    code, _, err = run(capsys, "confirm", "--dir", d, "--key", str(agent_key), proposal, "--yes")
    assert code == 2 and "in the clear" in err and "quorumgate passphrase" in err
    sealed_agent = tmp_path / "sealed-agent.key"
    write_sealed(sealed_agent, seal(read_seed(agent_key), PASSPHRASE, KDF_INTERACTIVE))
    with given(PASSPHRASE) as fd:
        agent_confirm = ["confirm", "--dir", d, "--key", str(sealed_agent), proposal, "--yes"]
        code, _, err = run(capsys, *agent_confirm, "--passphrase-fd", fd)
    assert code == 1 and "no open card" in err
    with given(PASSPHRASE) as fd:
        agent_pending = ["pending", "--dir", d, "--key", str(sealed_agent), "--passphrase-fd", fd]
        code, doc = run_json(capsys, *agent_pending)
    assert (code, doc) == (0, {"cards": []})
    # its principal sees the card with every value, and confirms it
    with given(PASSPHRASE) as fd:
        mine = ["pending", "--dir", d, "--key", str(principal_key), "--passphrase-fd", fd]
        code, doc = run_json(capsys, *mine)
    [card] = [c for c in doc["cards"] if c["proposal_id"] == proposal]
    assert card["values"] == {"amount": SECRET} and card["confirmer"] == "principal:cli-person"
    assert f'amount = "{SECRET}"' in card["text"] and "principal cli-person only" in card["text"]
    confirm = ["confirm", "--dir", d, "--key", str(principal_key), proposal]
    with given(PASSPHRASE) as fd:
        code, _, err = run(capsys, *confirm, "--passphrase-fd", fd)  # stdin: not a terminal
    assert code == 2 and "--yes" in err
    with given(PASSPHRASE) as fd:
        code, doc = run_json(capsys, *confirm, "--yes", "--passphrase-fd", fd)
    assert (code, doc["outcome"], doc["kind"]) == (0, "allow", "confirm")
    with given(PASSPHRASE) as fd:
        code, _, err = run(capsys, *confirm, "--yes", "--passphrase-fd", fd)
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


def test_pending_shows_combining_marks_escaped_on_the_terminal(
    cluster: ClusterSpec,
    agent_key: Path,
    principal_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A combining mark draws over the character before it: `1\u0336200` would print as
    a struck-through 1 and 200. `quorumgate pending` shows each mark as an escape."""
    d = str(cluster.directory)
    base = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-marks"]
    code, doc = run_json(
        capsys, *base, "--tool", "pay", "--target", "https://bank.example/m",
        "--arg", "amount=1\u0336200\u20dd",
    )  # fmt: skip
    assert (code, doc["outcome"]) == (3, "pending")
    with given(PASSPHRASE) as fd:
        mine = ["pending", "--dir", d, "--key", str(principal_key), "--passphrase-fd", fd]
        code, out, _ = run(capsys, *mine)
    assert code == 0 and doc["proposal_id"] in out
    assert '  amount = "1\\u{336}200\\u{20dd}"' in out.splitlines()
    assert not [ch for ch in out if unicodedata.category(ch).startswith("M")]


def test_confirm_and_reject_need_the_principals_passphrase(
    cluster: ClusterSpec,
    agent_key: Path,
    principal_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sealed key answers a card only once its passphrase opens it: without one (no
    terminal, no descriptor) the command says how to give it; a wrong one says so. Both
    exit 2 before anything is signed."""
    d = str(cluster.directory)
    submit = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-pass"]
    code, doc = run_json(capsys, *submit, "--tool", "pay", "--target", "https://b.example/p")
    assert (code, doc["outcome"]) == (3, "pending")
    proposal = doc["proposal_id"]
    for verb in ("confirm", "reject"):
        answer = [verb, "--dir", d, "--key", str(principal_key), proposal, "--yes"]
        code, out, err = run(capsys, *answer)
        assert code == 2 and out == ""
        assert "sealed with a passphrase" in err and "--passphrase-fd N" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        with given("not the passphrase") as fd:
            code, _, err = run(capsys, *answer, "--passphrase-fd", fd)
        assert code == 2 and "wrong passphrase" in err
    with given(PASSPHRASE) as fd:
        mine = ["pending", "--dir", d, "--key", str(principal_key), "--passphrase-fd", fd]
        code, cards = run_json(capsys, *mine)
    assert proposal in {c["proposal_id"] for c in cards["cards"]}  # still open
    with given(PASSPHRASE) as fd:
        reject = ["reject", "--dir", d, "--key", str(principal_key), proposal, "--yes"]
        code, doc = run_json(capsys, *reject, "--passphrase-fd", fd)
    assert (code, doc["outcome"]) == (0, "deny")


def _on_a_terminal(argv: list[str], answers: list[tuple[str, str]]) -> tuple[int, str]:
    """Run `python -m quorumgate ARGV` on a pseudo-terminal of its own (its controlling
    terminal, as a person's shell gives it), answering each prompt in `answers` when it
    appears; (exit status, everything the terminal showed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, on the terminal
        os.execv(sys.executable, [sys.executable, "-m", "quorumgate", *argv])
    shown, pending = b"", list(answers)
    deadline = time.monotonic() + TERMINAL_WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal: it has exited
                break
            if not chunk:
                break
            shown += chunk
        if pending and pending[0][0].encode() in shown:
            os.write(fd, pending.pop(0)[1].encode() + b"\n")
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


def test_confirm_on_a_terminal_asks_for_the_passphrase_without_echoing_it(
    cluster: ClusterSpec, agent_key: Path, principal_key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a person does: `quorumgate confirm` asks for the passphrase on the terminal
    (not echoed), shows the card, asks, and signs."""
    d = str(cluster.directory)
    submit = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-tty"]
    code, doc = run_json(capsys, *submit, "--tool", "pay", "--target", "https://b.example/t")
    assert (code, doc["outcome"]) == (3, "pending")
    confirm = ["confirm", "--dir", d, "--key", str(principal_key), doc["proposal_id"]]
    wrong, shown = _on_a_terminal(confirm, [("Passphrase for", "not the passphrase")])
    assert wrong == 2 and "wrong passphrase" in shown and "not the passphrase" not in shown
    code, shown = _on_a_terminal(
        confirm, [("Passphrase for", PASSPHRASE), ("Confirm exactly this call?", "y")]
    )
    assert code == 0, shown
    assert "Official confirmation form" in shown and "allow" in shown
    assert PASSPHRASE not in shown  # getpass did not echo it


def test_principal_keys_are_sealed_from_keygen_to_registration(
    cluster: ClusterSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quorumgate.cli import main as quorumgate

    d = str(cluster.directory)
    fresh = tmp_path / "new.key"
    code, _, err = run(capsys, "keygen", "--out", str(fresh), "--principal")
    assert code == 2 and "--passphrase-fd N" in err and not fresh.exists()
    with given("short") as fd:
        code, _, err = run(
            capsys, "keygen", "--out", str(fresh), "--principal", "--passphrase-fd", fd
        )
    assert code == 2 and "at least 8 characters" in err and not fresh.exists()
    # a key made in the clear is refused as a principal's, by registration and the console
    plain = tmp_path / "plain.key"
    assert run(capsys, "keygen", "--out", str(plain))[0] == 0
    register = ["admin", "register-principal", "cli-sealed", "--dir", d]
    code, _, err = run(capsys, *register, "--key-file", str(plain))
    assert code == 2 and "in the clear" in err and "quorumgate passphrase" in err
    code = quorumgate(["console", "--dir", d, "--principal", str(plain)])
    assert code == 2 and "not a sealed key file" in capsys.readouterr().err
    seed = read_seed(plain)
    public = bytes(SigningKey(seed).verify_key).hex()
    # `quorumgate passphrase` seals it in place; then it registers (its public key is in
    # the clear in the sealed file) without the passphrase
    with given(PASSPHRASE) as fd:
        sealing = ["passphrase", "--key", str(plain), "--kdf-cost", "interactive"]
        code, out, _ = run(capsys, *sealing, "--new-passphrase-fd", fd)
    assert code == 0 and out.startswith(f"sealed {plain}") and public in out
    assert seed.hex() not in plain.read_text() and read_sealed(plain).public_key.hex() == public
    code, doc = run_json(capsys, *register, "--key-file", str(plain))
    assert (code, doc["outcome"]) == (0, "applied")
    # a change of passphrase: the old one no longer opens it, the new one does
    with given(PASSPHRASE) as old, given("another passphrase") as new:
        change = ["passphrase", "--key", str(plain), "--kdf-cost", "interactive"]
        code, out, _ = run(capsys, *change, "--passphrase-fd", old, "--new-passphrase-fd", new)
    assert code == 0 and out.startswith(f"changed the passphrase of {plain}")
    pending = ["pending", "--dir", d, "--key", str(plain), "--json", "--passphrase-fd"]
    with given(PASSPHRASE) as fd:
        code, _, err = run(capsys, *pending, fd)
    assert code == 2 and "wrong passphrase" in err
    with given("another passphrase") as fd:
        code, out, _ = run(capsys, *pending, fd)
    assert (code, json.loads(out)) == (0, {"cards": []})


def test_the_registry_comes_from_f_plus_1_sidecars_at_one_height(
    cluster: ClusterSpec,
    owner: SyncClient,
    agent_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`agents` and `tools` read the sidecars' Registry RPC: the answer
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
    """`register-tool --role ROLE=SCHEMES[:MAX] --target-optional`, and
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
    """`admin set-settings NAME=VALUE... [--clear NAME]` and `settings`;
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


def test_a_principal_names_its_agents_run_targets_and_the_agent_cannot(
    cluster: ClusterSpec,
    owner: SyncClient,
    agent_key: Path,
    principal_key: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`quorumgate admin set-run-targets` (docs/provenance.md): signed with the principal's
    sealed key it applies; the agent's key (in the clear) is refused before anything is
    sent."""
    d = str(cluster.directory)
    submit = ["submit", "--dir", d, "--key", str(agent_key), "--run", "cli-intent"]
    code, doc = run_json(capsys, *submit, "--tool", "web.get", "--target", "https://e.x/i")
    assert code == 0
    intent = ["admin", "set-run-targets", "--dir", d, "--agent", "cli-agent", "--run"]
    intent += [doc["run_id"], "HTTPS://Docs.Example.com/report", "mailto:bob@corp.example"]
    code, _, err = run(capsys, *intent, "--key", str(agent_key))
    assert code == 2 and "in the clear" in err
    with given(PASSPHRASE) as fd:
        signed = [*intent, "--key", str(principal_key), "--passphrase-fd", fd]
        code, applied = run_json(capsys, *signed)
    assert (code, applied["outcome"], applied["subject"]) == (0, "applied", "cli-agent")
