"""Live clusters for the SDK, proxy, gateway and console tests.

`cluster` is module-scoped: one real 4-node cluster (replicas and sidecars, loopback, the
free ports `init_cluster` picked) per test module, stopped in a finalizer whether the tests
passed or not. Tests that stop it (the posture tests) start it again before they end.
Every wait is a loop with a deadline (`wait_until`); nothing sleeps hoping a condition
became true. Agents are fresh per test (`new_agent`), so quotas, latches and nonces of one
test never reach another.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.ops.nodes import log_tail, start_cluster, stop_nodes
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.model import EnvelopeArg
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.sync import SyncClient
from tests import polling

T = TypeVar("T")

WAIT_S = 30.0
POLL_S = 0.02
PROCESS_EXIT_S = 15.0
SINK = "vault"
# Tools every live module registers (name, mode, extra ToolSpec fields).
TOOLS = (
    ("web.get", "read", {"schemes": ["https"]}),
    ("web.post", "direct", {"schemes": ["https"]}),
    ("pay", "user_confirm", {"schemes": ["https"], "min_tier": "delegate"}),
    ("owner.pay", "owner_confirm", {"schemes": ["https"], "min_tier": "delegate"}),
    (
        "vault.store",
        "direct",
        {"schemes": ["https"], "sink": SINK, "envelopes": [EnvelopeArg("secret", "card")]},
    ),
    ("vault.pay", "user_confirm", {"schemes": ["https"], "sink": SINK, "min_tier": "delegate"}),
    ("status", "read", {"binds_caller": True}),
)

_agent_numbers = itertools.count(1)


def wait_until(what: str, check: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    """`tests.polling.wait_until` with this suite's deadline and step."""
    return polling.wait_until(what, check, timeout_s, POLL_S)


def _wait_procs(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        try:
            proc.wait(timeout=PROCESS_EXIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LiveCluster:
    """The processes of one cluster directory, and what the tests do to them."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.procs: dict[int, list[subprocess.Popen[bytes]]] = {}

    def start(self, indexes: Sequence[int] | None = None) -> None:
        chosen = list(range(self.spec.n)) if indexes is None else list(indexes)
        for proc in start_cluster(self.spec, chosen):
            args = [str(a) for a in proc.args]  # type: ignore[union-attr]
            node = int(args[args.index("--node") + 1])
            self.procs.setdefault(node, []).append(proc)

    def stop(self, indexes: Sequence[int] | None = None) -> None:
        chosen = list(range(self.spec.n)) if indexes is None else list(indexes)
        stop_nodes(self.spec, chosen)
        for i in chosen:
            _wait_procs(self.procs.pop(i, []))

    def logs(self) -> str:
        return "\n".join(
            f"--- node {i} {kind}\n{log_tail(self.spec, i, kind=kind)}"
            for i in range(self.spec.n)
            for kind in ("replica", "sidecar")
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCluster]:
    spec = init_cluster(tmp_path_factory.mktemp("qg"), 4)
    cluster = LiveCluster(spec)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(live: LiveCluster) -> ClusterSpec:
    return live.spec


@pytest.fixture(scope="module")
def sink_key() -> PrivateKey:
    return PrivateKey.generate()


@pytest.fixture(scope="module")
def owner(cluster: ClusterSpec, sink_key: PrivateKey) -> Iterator[SyncClient]:
    """The owner's client, after registering the sink and the tools of `TOOLS`."""
    with SyncClient.as_owner(cluster.directory) as client:
        client.register_sink(SINK, bytes(sink_key.public_key))
        for name, mode, extra in TOOLS:
            client.register_tool(tool_spec(name, mode, **extra))
        yield client


def new_principal(owner: SyncClient, *, prefix: str = "person") -> tuple[str, SigningKey]:
    """Register a fresh principal (a person agents act for); returns (principal id, key)."""
    key = SigningKey.generate()
    principal_id = f"{prefix}-{next(_agent_numbers)}-{key.verify_key.encode().hex()[:6]}"
    owner.register_principal(principal_id, bytes(key.verify_key))
    return principal_id, key


def new_agent(
    owner: SyncClient,
    tools: Sequence[str] | None,
    *,
    prefix: str = "agent",
    principal: str = "",
    key: SigningKey | None = None,
    **mandate_fields: object,
) -> tuple[str, SigningKey]:
    """Register a fresh agent (with `key`, or a new one) with a mandate, acting for
    `principal` (default: the owner); returns (agent id, key)."""
    key = key or SigningKey.generate()
    agent_id = f"{prefix}-{next(_agent_numbers)}-{key.verify_key.encode().hex()[:6]}"
    owner.register_agent(agent_id, bytes(key.verify_key), principal=principal)
    owner.set_mandate(agent_id, mandate(tools, **mandate_fields))  # type: ignore[arg-type]
    return agent_id, key


def cluster_text(spec: ClusterSpec) -> str:
    """Everything the cluster's processes wrote to disk: logs, outputs, databases."""
    chunks = []
    for path in sorted(Path(spec.directory).rglob("*")):
        if path.is_file() and not path.name.endswith(".key"):
            chunks.append(path.read_bytes().decode("latin-1"))
    return "\n".join(chunks)
