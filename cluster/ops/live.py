"""A live cluster on this machine, driven from outside: the controller the recovery drills
(docs/drills.md) and the live tests share.

`LiveCluster` wraps one cluster directory and the replica and sidecar processes it started
for it, keyed by kind and member. It starts members and waits until each answers, signals
and reaps them (SIGKILL past a bound, so no stop hangs), reads Status and `/metrics`, and
its `close()` is a finalizer: nothing it started for the directory outlives it, nor any
server process found running for that directory afterwards (started through the CLI, or
before its handle was recorded).

A process that needed SIGKILL after another signal is remembered in `forced`, so that a
caller that must see clean exits (a test) can tell; a drill only reports exit statuses.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc
from prometheus_client.parser import text_string_to_metric_families

from quorumgate.ops.loadgen import BENCH_TOOL, LoadAgent
from quorumgate.ops.nodes import (
    OpsError,
    log_tail,
    start_nodes,
    wait_serving,
    wait_sidecars_serving,
)
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.owner import OwnerSession, agent_ops, owner_reader, tool_op

READY_TIMEOUT_S = 45.0  # a started process answering, on a loaded 2-core machine
STOP_GRACE_S = 10.0  # a signalled process exiting, before SIGKILL
RPC_TIMEOUT_S = 5.0
STATUS_PROBE_TIMEOUT_S = 1.0
METRICS_TIMEOUT_S = 5.0

DROPPED_METRIC = "qg_replica_messages_dropped_total"
EQUIVOCATION_REASONS = ("equivocating_vote", "equivocating_timeout", "equivocating_proposal")
# Every program a member's process may run: the two servers, and the drills' Byzantine
# replica (quorumgate.ops.byzantine) in a replica's place.
SERVER_MODULES = ("quorumgate.replica.node", "quorumgate.sidecar.node", "quorumgate.ops.byzantine")
KINDS = ("replica", "sidecar")


@dataclass(frozen=True)
class Metrics:
    """One scrape of a replica's `/metrics`: sample name and labels -> value."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @staticmethod
    def parse(text: str) -> Metrics:
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
        return Metrics(samples)

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 for a labelled counter that was never incremented (the
        client library creates a label set only at its first increment)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str) -> bool:
        return any(sample_name == name for sample_name, _ in self.samples)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {
            dict(labels)[label]: value
            for (sample_name, labels), value in self.samples.items()
            if sample_name == name and label in dict(labels)
        }


def proc_cmdlines() -> dict[int, list[str]]:
    """Every process's command line (pid -> argv), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
                out[int(entry)] = [p.decode(errors="replace") for p in raw.split(b"\0") if p]
    return out


def cluster_pids(directory: Path, modules: Sequence[str] = SERVER_MODULES) -> list[int]:
    """Pids of the server processes running for this cluster directory, whoever started
    them."""
    want = str(directory.resolve())
    return sorted(
        pid
        for pid, argv in proc_cmdlines().items()
        if any(module in argv for module in modules) and "--dir" in argv and want in argv
    )


class LiveCluster:
    """One cluster directory and the processes this controller started for it."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.spec = spec
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.running: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.started: list[subprocess.Popen[bytes]] = []
        self.forced: list[str] = []  # `kind i` of each process that needed SIGKILL
        self._channels: dict[int, grpc.Channel] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls, directory: Path, n: int) -> Self:
        return cls(init_cluster(directory, n))

    @property
    def n(self) -> int:
        return self.spec.n

    @property
    def chain_id(self) -> str:
        return self.spec.chain_id

    # ------------------------------------------------------------------ processes

    def spawn(
        self,
        kind: str,
        indexes: list[int],
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> dict[int, subprocess.Popen[bytes]]:
        """Start the processes (a subclass may start them elsewhere, in a namespace)."""
        return start_nodes(self.spec, indexes, kind, module=module, env=env)

    def start(
        self,
        indexes: Iterable[int] | None = None,
        kind: str = "replica",
        *,
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start members' `kind` processes (every member's by default) and return once each
        answers; `OpsError` when one cannot start or does not answer in time."""
        wanted = list(range(self.n)) if indexes is None else list(indexes)
        try:
            procs = self.spawn(kind, wanted, module, env)
        except OpsError as err:
            raise OpsError(f"cannot start {kind}s {wanted}: {err}") from err
        with self._lock:
            for i, proc in procs.items():
                self.running[(kind, i)] = proc
            self.started.extend(procs.values())
        wait = wait_serving if kind == "replica" else wait_sidecars_serving
        wait(self.spec, wanted, procs, self.ready_timeout_s)

    def start_sidecars(self, indexes: Iterable[int] | None = None) -> None:
        """Start members' execution sidecars beside their replicas, as `quorumgate up` does."""
        self.start(indexes, "sidecar")

    def restart(self, index: int) -> None:
        """Start a stopped replica again."""
        self.start([index])

    def pid(self, index: int, kind: str = "replica") -> int | None:
        """The pid of member `index`'s running `kind` process, if it runs."""
        proc = self.running.get((kind, index))
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self, kinds: Sequence[str], indexes: Iterable[int]) -> dict[str, int]:
        """Pids of the running processes: by kind for one member, by `kind-i` for several."""
        members = list(indexes)
        return {
            kind if len(members) == 1 else f"{kind}-{i}": pid
            for i in members
            for kind in kinds
            if (pid := self.pid(i, kind)) is not None
        }

    def alive(self, kind: str = "replica") -> list[int]:
        with self._lock:
            return sorted(i for (k, i), p in self.running.items() if k == kind and p.poll() is None)

    def kill(self, index: int, sig: signal.Signals = signal.SIGKILL, kind: str = "replica") -> int:
        """Signal one running process and reap it; return its exit status."""
        proc = self.running.get((kind, index))
        if proc is None or proc.poll() is not None:
            raise OpsError(f"{kind} {index} is not running")
        proc.send_signal(sig)
        code = self._reap(kind, index)
        assert code is not None
        return code

    def stop(
        self, targets: Iterable[tuple[str, int]], sig: signal.Signals = signal.SIGTERM
    ) -> dict[str, int | None]:
        """Signal every target at once, then reap each; exit statuses by `kind-i`."""
        wanted = list(targets)
        for kind, i in wanted:
            proc = self.running.get((kind, i))
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
        return {f"{kind}-{i}": self._reap(kind, i) for kind, i in wanted}

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every sidecar, then every replica, this controller started."""
        return self._stop_running()

    def _stop_running(self) -> dict[str, int | None]:
        # Not `stop_all`, which a subclass may make strict: a finalizer must not fail.
        codes = self.stop([k for k in self.running if k[0] == "sidecar"])
        codes.update(self.stop([k for k in self.running if k[0] != "sidecar"]))
        return codes

    def close(self) -> None:
        """The finalizer: nothing this controller started, and no server process running
        for its directory, outlives it."""
        self._stop_running()
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=self.stop_grace_s)
        for pid in cluster_pids(self.spec.directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with self._lock:
            channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()

    def _reap(self, kind: str, index: int) -> int | None:
        """Wait for a signalled process (SIGKILL past the grace); its exit status."""
        with self._lock:
            proc = self.running.pop((kind, index), None)
        if proc is None:
            return None
        try:
            code = proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            self.forced.append(f"{kind} {index}")
            proc.kill()
            code = proc.wait(timeout=self.stop_grace_s)
        # A killed process leaves its pid file behind.
        (self.spec.node_dir(index) / f"{kind}.pid").unlink(missing_ok=True)
        return code

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(
            f"--- node {i} ---\n{log_tail(self.spec, i, lines)}" for i in range(self.n)
        )

    # ------------------------------------------------------------------ gRPC

    def channel(self, index: int) -> grpc.Channel:
        """A channel kept open to member `index`, reading as the owner (CommittedBlocks
        answers only the owner, members and auditors)."""
        with self._lock:
            if index not in self._channels:
                self._channels[index] = sync_channel(
                    self.spec, index, reader=owner_reader(self.spec)
                )
            return self._channels[index]

    def forget_channel(self, index: int) -> None:
        """Close the kept channel to `index`; the next call dials afresh."""
        with self._lock:
            channel = self._channels.pop(index, None)
        if channel is not None:
            channel.close()

    def replica(self, index: int) -> cpb_grpc.ReplicaStub:
        return cpb_grpc.ReplicaStub(self.channel(index))

    def peer(self, index: int) -> pb_grpc.PeerStub:
        return pb_grpc.PeerStub(self.channel(index))

    def status(self, index: int) -> cpb.StatusReply:
        reply: cpb.StatusReply = self.replica(index).Status(
            cpb.StatusRequest(), timeout=RPC_TIMEOUT_S
        )
        return reply

    def probe(self, index: int) -> cpb.StatusReply | None:
        """One Status call on a fresh channel (None: no answer). A kept channel may sit in
        reconnect back-off after a restart and make a recovery look slower than it was."""
        with sync_channel(self.spec, index) as channel:
            try:
                reply: cpb.StatusReply = cpb_grpc.ReplicaStub(channel).Status(
                    cpb.StatusRequest(), timeout=STATUS_PROBE_TIMEOUT_S
                )
            except grpc.RpcError:
                return None
        return reply

    def statuses(self, indexes: Iterable[int] | None = None) -> dict[int, cpb.StatusReply]:
        return {i: self.status(i) for i in (self.alive() if indexes is None else indexes)}

    def heights(self, indexes: Iterable[int] | None = None) -> dict[int, int]:
        return {i: st.committed_height for i, st in self.statuses(indexes).items()}

    def describe(self, indexes: Iterable[int] | None = None) -> str:
        parts = []
        for i in self.alive() if indexes is None else indexes:
            try:
                st = self.status(i)
            except grpc.RpcError as err:
                parts.append(f"node {i}: {err.code().name}")
                continue
            parts.append(
                f"node {i}: height {st.committed_height} view {st.view} leader {st.leader} "
                f"peers {list(st.peers_connected)} mempool {st.mempool_txs} "
                f"sync target {st.sync_target_height}"
            )
        return "; ".join(parts)

    def submit(self, index: int, tx: bytes) -> cpb.SubmitReply:
        reply: cpb.SubmitReply = self.replica(index).Submit(
            cpb.SubmitRequest(tx=tx), timeout=RPC_TIMEOUT_S
        )
        return reply

    # ------------------------------------------------------------------ metrics

    def metrics(self, index: int, timeout_s: float = METRICS_TIMEOUT_S) -> Metrics:
        """One scrape of replica `index`'s `/metrics`; OSError when it does not answer."""
        m = self.spec.member(index)
        url = f"http://{m.host}:{m.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return Metrics.parse(response.read().decode())

    def dropped(self, index: int, timeout_s: float = METRICS_TIMEOUT_S) -> dict[str, float] | None:
        """Replica `index`'s counts of peer messages dropped, by reason (None: no answer)."""
        try:
            metrics = self.metrics(index, timeout_s)
        except OSError:
            return None
        return {r: v for r, v in metrics.by_label(DROPPED_METRIC, "reason").items() if r}

    # ------------------------------------------------------------------ agents

    def agent(self, name: str) -> LoadAgent:
        return LoadAgent.from_seed(self.chain_id, name)

    def register(self, agents: Iterable[LoadAgent]) -> None:
        """Register agents with the cluster's owner key, each allowed the load tool (with
        sidecars running, an unregistered agent is refused `unknown_signer`)."""
        ops = [tool_op(BENCH_TOOL)]
        for agent in agents:
            ops += agent_ops(f"agent-{agent.public_key.hex()[:16]}", agent.public_key, [BENCH_TOOL])
        OwnerSession(self.spec).submit(ops)
