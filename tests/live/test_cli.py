"""The `quorumgate` command line against real processes: clear errors, and `down` stops only
what `up` started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from quorumgate.ops.live import cluster_pids
from quorumgate.ops.loadgen import BENCH_TOOL
from quorumgate.proto.clusterfile import load_cluster
from quorumgate.sdk.owner import OwnerSession, agent_ops, tool_op
from tests import polling
from tests.support import forkserver
from tests.support.live import STOP_GRACE_S, LiveCluster, wait_until

CLI_TIMEOUT_S = 60.0
_SCRIPT = Path(sys.executable).parent / "quorumgate"
QUORUMGATE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "quorumgate.cli"]


def quorumgate(*args: str | Path | int) -> subprocess.CompletedProcess[str]:
    """`quorumgate ARGS...` run to its end: exit status, stdout and stderr. It is forked
    from a fork server that imported the CLI once for the worker (tests/support/forkserver.py);
    the tests that signal a command, or watch it start, run the script itself."""
    words = [str(a) for a in args]
    result = subprocess.run(
        forkserver.quorumgate(*words),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    return subprocess.CompletedProcess(
        [*QUORUMGATE, *words], result.returncode, result.stdout, result.stderr
    )


def assert_clean_failure(
    result: subprocess.CompletedProcess[str], code: int, *fragments: str
) -> None:
    """Exit `code`, one `quorumgate: ...` line on stderr holding every fragment, no
    traceback."""
    where = f"`{' '.join(result.args[len(QUORUMGATE) :])}`"
    assert result.returncode == code, (
        f"{where} exited {result.returncode}, not {code}: {result.stderr}"
    )
    assert "Traceback" not in result.stderr, f"{where} crashed:\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quorumgate: "), f"{where}: {result.stderr!r}"
    for fragment in fragments:
        assert fragment in lines[0], f"{where}: {fragment!r} not in {lines[0]!r}"


@pytest.fixture
def cli_dirs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Cluster directories for the CLI; at teardown, `quorumgate down` each and SIGKILL
    any replica or sidecar still running for it."""
    made: list[Path] = []

    def make(name: str) -> Path:
        path = tmp_path / name
        made.append(path)
        return path

    try:
        yield make
    finally:
        for path in made:
            if (path / "cluster.json").exists():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    quorumgate("down", "--dir", path)
            for pid in cluster_pids(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def init(directory: Path, nodes: int = 4) -> None:
    result = quorumgate("init", "--nodes", nodes, "--dir", directory)
    assert result.returncode == 0, result.stderr


def wait_none_running(directory: Path) -> None:
    wait_until(
        f"no replica or sidecar left running for {directory}",
        lambda: not cluster_pids(directory),
        STOP_GRACE_S * 2,
        lambda: f"pids {cluster_pids(directory)}",
    )


def test_cli_missing_or_corrupt_cluster_file_exits_2_with_a_clear_message(
    cli_dirs: Callable[[str], Path],
) -> None:
    """`status`, `up` and `down` on a directory without a cluster file, and with corrupt
    ones (not JSON, not an object, another format, a missing field, a port out of range):
    exit status 2, one line on stderr naming the file and what is wrong, no traceback, and
    `up` starts nothing."""
    directory = cli_dirs("corrupt")
    directory.mkdir()
    path = directory / "cluster.json"
    for command in ("status", "up", "down"):
        result = quorumgate(command, "--dir", directory)
        assert_clean_failure(result, 2, f"no cluster file at {path}", "quorumgate init")

    init(directory)
    valid = json.loads(path.read_text())
    bad_port = json.loads(path.read_text())
    bad_port["members"][2]["replica_port"] = 70_000
    no_chain = {k: v for k, v in valid.items() if k != "chain_id"}
    corrupt = {
        "not JSON": ("{not json", "unreadable or not JSON"),
        "a list": ("[1, 2]", "expected a JSON object"),
        "another format": (json.dumps({**valid, "format": "other/9"}), "format must be"),
        "no chain id": (json.dumps(no_chain), "missing field 'chain_id'"),
        "a port out of range": (json.dumps(bad_port), "members[2]: replica_port out of range"),
    }
    for what, (text, message) in corrupt.items():
        path.write_text(text)
        for command in ("status", "up", "down"):
            result = quorumgate(command, "--dir", directory)
            assert_clean_failure(result, 2, str(path), message)
            assert not cluster_pids(directory), f"`up` with {what} started a process"


def test_cli_up_refuses_a_running_node_or_a_taken_port_and_starts_nothing(
    cli_dirs: Callable[[str], Path],
) -> None:
    """With node 1 already up (its replica and sidecar), `quorumgate up` names it and its
    pid, exits 2, and neither starts the other three nor stops node 1 — the processes of
    the directory are exactly those before. With a port of the cluster held by another
    listener (a replica port, a replica metrics port, a sidecar port), it names the port
    and its role, exits 2, and leaves nothing running."""
    directory = cli_dirs("busy")
    init(directory)
    spec = load_cluster(directory)

    assert quorumgate("up", "--dir", directory, "--node", 1, "--detach").returncode == 0
    running = cluster_pids(directory)
    replica_1 = int((spec.node_dir(1) / "replica.pid").read_text())
    assert replica_1 in running
    result = quorumgate("up", "--dir", directory, "--detach")
    assert_clean_failure(result, 2, "replica 1 is already running", f"pid {replica_1}")
    after = cluster_pids(directory)
    assert after == running, (
        f"a refused `up` changed the directory's processes from {running} to {after}: it "
        "must start nothing and stop nothing"
    )
    assert quorumgate("down", "--dir", directory).returncode == 0
    wait_none_running(directory)

    for node, role, port in (
        (0, "replica of node 0", spec.member(0).replica_port),
        (2, "replica metrics of node 2", spec.member(2).metrics_port),
        (1, "sidecar of node 1", spec.member(1).sidecar_port),
    ):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
            holder.bind((spec.member(node).host, port))
            holder.listen()
            result = quorumgate("up", "--dir", directory, "--detach")
        assert_clean_failure(result, 2, f"port {port} ({role})", "in use")
        left = cluster_pids(directory)
        assert not left, f"`up` with port {port} taken left processes {left} running"


def test_cli_down_stops_only_what_up_started(
    cli_dirs: Callable[[str], Path], live_cluster: Callable[..., LiveCluster]
) -> None:
    """Cluster A runs nodes 2 and 3 (0 and 1 were stopped with `down --node`). Node 0's
    replica and sidecar pid files then name a `sleep` process, node 1's name a replica of
    another cluster B. `quorumgate down --dir A` must stop A's two nodes (replica and
    sidecar each), report exactly those, and leave the `sleep` and B's replica running;
    B still answers Status."""
    a = cli_dirs("a")
    init(a)
    assert quorumgate("up", "--dir", a, "--detach").returncode == 0
    for node in (0, 1):
        result = quorumgate("down", "--dir", a, "--node", node)
        assert result.returncode == 0 and f"stopped nodes [{node}]" in result.stdout, result
    assert len(cluster_pids(a)) == 4, f"A should run nodes 2 and 3: {cluster_pids(a)}"

    b = live_cluster(4, start=False, name="b")
    b.start([0])
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        node_dir = load_cluster(a).node_dir
        for kind in ("replica", "sidecar"):
            (node_dir(0) / f"{kind}.pid").write_text(f"{sleeper.pid}\n")
            (node_dir(1) / f"{kind}.pid").write_text(f"{b.pid(0)}\n")

        result = quorumgate("down", "--dir", a)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "stopped nodes [2, 3]", result.stdout
        wait_none_running(a)
        assert sleeper.poll() is None, "`down` killed a process it did not start"
        assert b.alive() == [0], "`down` of cluster A stopped a replica of cluster B"
        assert b.status(0).node == 0
    finally:
        sleeper.kill()
        sleeper.wait(timeout=STOP_GRACE_S)


def test_cli_init_writes_private_keys_0600_and_no_private_key_reaches_cluster_file_or_logs(
    cli_dirs: Callable[[str], Path],
) -> None:
    """`quorumgate init` writes every private key file (owner, and per node consensus,
    receipt and TLS keys) with mode 0600 in 0700 node directories. After `init`, `up`, an agent
    registered by the owner, its proposals committed, `status` and `down`, no private key
    — as hex in either case, or as raw bytes — appears in cluster.json, in any log, pid or
    database file under the cluster directory, or in anything the CLI printed; while every
    public key does appear in cluster.json (so the search can find what it looks for)."""
    directory = cli_dirs("keys")
    printed = [quorumgate("init", "--nodes", 4, "--dir", directory)]
    assert printed[0].returncode == 0, printed[0].stderr
    spec = load_cluster(directory)

    key_files = [directory / "owner.key"]
    for i in range(spec.n):
        node_dir = spec.node_dir(i)
        assert stat.S_IMODE(node_dir.stat().st_mode) == 0o700, f"{node_dir} is not 0700"
        key_files += sorted(node_dir.glob("*.key"))
    assert len(key_files) == 1 + 3 * spec.n, [p.name for p in key_files]
    for path in key_files:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o600, f"{path} has mode {mode:o}, not 600"

    printed.append(quorumgate("up", "--dir", directory, "--detach"))
    assert printed[-1].returncode == 0, printed[-1].stderr
    # A client of the CLI's cluster (it started nothing; its close() only sweeps). With
    # sidecars running, an agent must be registered by the owner before it may propose.
    cluster = LiveCluster(spec)
    try:
        agent = cluster.agent("keys")
        OwnerSession(spec).submit(
            [tool_op(BENCH_TOOL), *agent_ops("keys", agent.public_key, [BENCH_TOOL])]
        )
        txs = [agent.proposal() for _ in range(20)]
        assert all(r.accepted for r in cluster.submit_stream(1, [tx for tx, _ in txs]))
        cluster.wait_committed([tx_id for _, tx_id in txs], 0)
        printed.append(quorumgate("status", "--dir", directory, "--json"))
        printed.append(quorumgate("down", "--dir", directory))
    finally:
        cluster.close()
    failed = [(p.args[len(QUORUMGATE)], p.returncode, p.stdout) for p in printed if p.returncode]
    assert not failed, failed
    wait_none_running(directory)

    seeds = {p: bytes.fromhex(p.read_text().strip()) for p in key_files if p.name != "tls.key"}
    needles = {}
    for path, seed in seeds.items():
        needles[f"{path.name} hex"] = seed.hex().encode()
        needles[f"{path.name} HEX"] = seed.hex().upper().encode()
        needles[f"{path.name} raw"] = seed
    tls_keys = [p for p in key_files if p.name == "tls.key"]
    for path in tls_keys:  # PEM: its base64 body lines, and the private scalar itself
        pem = path.read_bytes()
        body = [line for line in pem.splitlines() if line and not line.startswith(b"-----")]
        needles[f"{path.parent.name}/tls.key PEM"] = body[1]
        private = serialization.load_pem_private_key(pem, password=None)
        scalar = private.private_numbers().private_value  # type: ignore[union-attr]
        needles[f"{path.parent.name}/tls.key scalar"] = scalar.to_bytes(32, "big")
    haystacks = {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p not in key_files
    }
    for k, result in enumerate(printed):
        haystacks[f"CLI output {k}"] = (result.stdout + result.stderr).encode()
    assert any(name.endswith(".log") for name in haystacks), sorted(haystacks)
    assert any(name.endswith(".db") for name in haystacks), sorted(haystacks)
    leaks = [
        f"{needle} in {where}"
        for where, data in haystacks.items()
        for needle, secret in needles.items()
        if secret in data
    ]
    assert not leaks, f"private keys found: {leaks}"
    public = haystacks["cluster.json"]
    for m in spec.members:
        assert m.public_key.hex().encode() in public
        assert m.receipt_public_key.hex().encode() in public
        assert m.tls_cert.splitlines()[1] in public  # the certificate is public


def test_cli_init_refuses_a_folder_holding_a_key_and_writes_nothing(
    cli_dirs: Callable[[str], Path],
) -> None:
    """`init` into a folder holding a stray `owner.key` must not write node keys and then
    fail with a raw `[Errno 17]`, leaving a half-built folder: it refuses, writing
    nothing."""
    directory = cli_dirs("stray")
    directory.mkdir()
    (directory / "owner.key").write_text("not ours\n")
    assert_clean_failure(quorumgate("init", "--dir", directory), 2, "owner.key exists", "--dir")
    assert sorted(p.name for p in directory.iterdir()) == ["owner.key"]
    assert (directory / "owner.key").read_text() == "not ours\n"
    (directory / "owner.key").unlink()
    (directory / "node-2").mkdir()
    (directory / "node-2" / "receipt.key").write_text("not ours either\n")
    assert_clean_failure(quorumgate("init", "--dir", directory), 2, "node-2/receipt.key exists")
    assert sorted(p.name for p in directory.rglob("*")) == ["node-2", "receipt.key"]


def test_cli_up_with_a_damaged_sidecar_store_says_why_at_once(
    cli_dirs: Callable[[str], Path],
) -> None:
    """`up` with a damaged sidecar store must not wait 30 s and say only that the sidecar
    did not start: the sidecar exits at once, `up` shows its reason and what to do in one
    line, and leaves nothing running."""
    directory = cli_dirs("damaged")
    init(directory)
    (directory / "node-2" / "sidecar.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    result = quorumgate("up", "--dir", directory, "--detach")
    assert_clean_failure(
        result, 2, "sidecar 2 exited", "not a readable sidecar store", "quorumgate replay"
    )
    wait_none_running(directory)


def test_cli_init_for_several_hosts_names_each_address_with_fixed_ports(
    cli_dirs: Callable[[str], Path],
) -> None:
    """`init --hosts` (docs/operating.md, "Several hosts"): member I at the I-th address,
    its four ports from --port-base (7400 by default) on every host, the next four for a
    second member on one host, and its certificate naming that address; bad lists change
    nothing."""
    from quorumgate.proto.clusterfile import load_cluster

    directory = cli_dirs("hosts")
    hosts = "10.1.0.1,10.1.0.2,node-c.example,node-c.example"
    result = quorumgate("init", "--dir", directory, "--hosts", hosts)
    assert result.returncode == 0, result.stderr
    spec = load_cluster(directory)
    assert [m.host for m in spec.members] == hosts.split(",")
    assert [m.replica_port for m in spec.members] == [7400, 7400, 7400, 7404]
    assert [m.sidecar_metrics_port for m in spec.members] == [7403, 7403, 7403, 7407]
    assert spec.transport == "tls"
    from cryptography import x509

    for member in spec.members:
        cert = x509.load_pem_x509_certificate(member.tls_cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        listed = [str(v) for v in names.get_values_for_type(x509.IPAddress)]
        listed += names.get_values_for_type(x509.DNSName)
        assert member.host in listed and f"qg-node-{member.index}" in listed, listed
    for args, fragment in (
        (("--hosts", "10.1.0.1,10.1.0.2"), "names 2 addresses for 4 nodes"),
        (("--hosts", "a,,c,d"), "comma-separated"),
        (("--hosts", "a,b,c,d", "--port-base", "65534"), "above 65535"),
        (("--hosts", "a,b,c,d", "--port-base", "80"), "--port-base must be in"),
    ):
        bad = cli_dirs(f"bad-{len(args)}-{fragment[:6]}")
        assert_clean_failure(quorumgate("init", "--dir", bad, *args), 2, fragment)
        assert not bad.exists(), f"{args}: wrote {sorted(bad.rglob('*'))}"


# A foreground `up` or `demo` waits for the example (and the cluster's start) first.
FOREGROUND_READY_S = 180.0


@pytest.mark.parametrize(("command", "signals"), [("demo", 1), ("up", 1), ("up", 2)])
def test_cli_foreground_command_stops_its_cluster_on_sigterm(
    cli_dirs: Callable[[str], Path], command: str, signals: int
) -> None:
    """A supervisor (systemd, `timeout`, a container runtime) stops a foreground `up` or
    `demo` with SIGTERM, not Ctrl-C. The command must then stop every replica and sidecar
    it started, as on Ctrl-C, and exit 0; it used to die at once and leave all 2n
    processes running, holding the cluster's ports and store locks. A second SIGTERM
    while it stops them (`timeout` signals the whole process group, so a command run
    under `scripts/dev.py` gets one from each) used to cut the stop short, with the same
    result."""
    directory = cli_dirs(f"{command}-{signals}")
    if command == "up":
        init(directory)
        argv, ready = ["up", "--dir", directory, "--refresh", "0.2"], "Ctrl-C stops them"
    else:
        argv, ready = ["demo", "--dir", directory, "--refresh", "0.2"], "Ctrl-C stops the cluster"
    output = directory.parent / f"{command}.out"
    with output.open("w") as out:
        proc = subprocess.Popen([*QUORUMGATE, *map(str, argv)], stdout=out, stderr=out)
    try:
        wait_until(
            f"`quorumgate {command}` serving",
            lambda: True if ready in output.read_text() else None,
            timeout_s=FOREGROUND_READY_S,
            describe=lambda: output.read_text()[-2000:],
        )
        assert len(cluster_pids(directory)) == 8, cluster_pids(directory)
        proc.send_signal(signal.SIGTERM)
        if signals == 2:
            polling.wait_until(  # polled often: the stop must still be under way
                "`stopping...`",
                lambda: True if "stopping..." in output.read_text() else None,
                CLI_TIMEOUT_S,
                0.005,
            )
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=CLI_TIMEOUT_S)
        assert code == 0, output.read_text()[-2000:]
        assert "Traceback" not in output.read_text()
        wait_until(
            "every replica and sidecar stopped",
            lambda: True if not cluster_pids(directory) else None,
            timeout_s=STOP_GRACE_S,
            describe=lambda: f"still running: {cluster_pids(directory)}",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
