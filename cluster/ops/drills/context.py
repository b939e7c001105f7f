"""One run of one drill, as the fault injectors (nemesis.py), the checks (checker.py) and
the runner share it: the cluster's controller, the load, the report, and the polled waits
every fault and check uses (each with a deadline from bounds.py).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from quorumgate.ops.drills.audit import SidecarView
from quorumgate.ops.drills.bounds import (
    AGENT_RATE_PER_S_MAX,
    AGENTS_MIN,
    FAULT_CYCLES_MAX,
    FAULT_CYCLES_MIN,
    METRICS_TIMEOUT_S,
    READY_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    RESUME_TIMEOUT_S,
    STOP_GRACE_S,
    WARMUP_ACKS_MIN,
    WARMUP_HEIGHTS,
    ProgressFn,
    poll,
)
from quorumgate.ops.drills.database import ShipTarget
from quorumgate.ops.drills.report import Abort, Check, DrillReport, Fault, listed
from quorumgate.ops.live import EQUIVOCATION_REASONS, LiveCluster
from quorumgate.ops.load import Load
from quorumgate.ops.loadgen import BENCH_TOOL, LoadAgent
from quorumgate.ops.nodes import OpsError, sidecar_status
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.owner import OwnerError, OwnerSession, agent_ops, tool_op
from quorumgate.sdk.owner import next_nonce as owner_next_nonce
from quorumgate.sidecar.receipts import Certificate
from quorumgate.sidecar.replay import ReplayReport


@dataclass(frozen=True)
class StaleRun:
    """A stale restore, for the vote check: what the old copy held and what was lost.
    A restore across an epoch boundary names its votes by (epoch, view), since views
    start again in every epoch (`stale_by_epoch`, `forgotten_by_epoch`)."""

    node: int
    stale_votes: dict[int, bytes]  # in the old copy (epoch 0: view -> block hash)
    forgotten: dict[int, bytes]  # signed after the copy, lost by the rollback
    fault: Fault
    stale_by_epoch: dict[tuple[int, int], bytes] = field(default_factory=dict)
    forgotten_by_epoch: dict[tuple[int, int], bytes] = field(default_factory=dict)

    @property
    def by_epoch(self) -> bool:
        return bool(self.forgotten_by_epoch)


@dataclass(frozen=True)
class Wiped:
    """A wiped member, for the rebuild check: its sidecar's store before, and the replay."""

    node: int
    before: SidecarView  # its sidecar's store just before the wipe
    replayed: ReplayReport | None
    # The rebuild check's findings, when taken just before the member's next wipe (which
    # deletes the store they are read from); None: checked at the drill's end.
    problems: tuple[str, ...] | None = None


class Drill:
    """One run of one drill (module docstring)."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        seconds: float,
        rate_per_s: float,
        progress: ProgressFn | None,
        ship: ShipTarget | None = None,
    ) -> None:
        self.name = name
        self.ship = ship  # the `ship` drill's database
        # What a drill adds to the checks, given the final height: run before the cluster
        # is stopped (while it still answers) and after (its stores readable); and what
        # it started that `close` must stop.
        self.before_stop: list[Callable[[int], None]] = []
        # Run before any check, once the load stopped: a drill that moved members gives
        # the checks the cluster as it stands (replace.py reads it from the chain of epochs).
        self.before_checks: list[Callable[[], None]] = []
        self.after_stop: list[Callable[[int], None]] = []
        self.closers: list[Callable[[], None]] = []
        self.spec = spec
        self.n = spec.n
        self.seconds = seconds
        self.progress = progress
        self.t0 = time.monotonic()
        self.cluster = LiveCluster(spec, ready_timeout_s=READY_TIMEOUT_S, stop_grace_s=STOP_GRACE_S)
        self.load: Load | None = None
        self.report = DrillReport(
            drill=name,
            nodes=spec.n,
            f=spec.f,
            directory=str(spec.directory),
            chain_id=spec.chain_id,
            seconds=seconds,
            rate_per_s=rate_per_s,
        )
        # (node, pid) -> reason -> the highest equivocation counter that process showed
        self.equivocations_seen: dict[tuple[int, int], dict[str, float]] = {}
        self.stale_runs: list[StaleRun] = []
        self.wiped: list[Wiped] = []
        self.placed: dict[bytes, list[int]] = {}  # tx id -> heights, from the chain checked
        # Each acknowledged proposal's certificate, kept by the certificate check for a
        # drill that checks them again offline (grow.py sets it); None: not kept.
        self.certificates: dict[bytes, Certificate] | None = None
        self.fault_deadline = math.inf
        self.aborted = ""

    # ------------------------------------------------------------------ plumbing

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(f"[drill {self.name} {time.monotonic() - self.t0:6.1f}s] {message}")

    def check(self, name: str, problems: Sequence[str], passed: str) -> None:
        """Record check `name`: it holds when there are no `problems` (each naming the
        node, height and key), and then says `passed`."""
        self.report.checks.append(
            Check(name, not problems, listed(problems) if problems else passed)
        )
        if problems:
            self.say(f"CHECK FAILED {name}: {listed(problems)}")

    def statuses(self, indexes: Iterable[int] | None = None) -> dict[int, cpb.StatusReply]:
        out = {}
        for i in range(self.n) if indexes is None else indexes:
            status = self.cluster.probe(i)
            if status is not None:
                out[i] = status
        return out

    def heights(self, indexes: Iterable[int] | None = None) -> dict[int, int]:
        return {i: s.committed_height for i, s in self.statuses(indexes).items()}

    def top(self, indexes: Iterable[int] | None = None) -> int:
        return max(self.heights(indexes).values(), default=0)

    def others(self, *nodes: int) -> list[int]:
        return [i for i in range(self.n) if i not in nodes]

    def scrape_equivocations(self, indexes: Iterable[int] | None = None) -> None:
        """Read live replicas' equivocation counters: before a kill, which resets them."""
        for i in range(self.n) if indexes is None else indexes:
            pid = self.cluster.pid(i, "replica")
            counters = self.cluster.dropped(i, METRICS_TIMEOUT_S) if pid is not None else None
            if pid is None or counters is None:
                continue
            seen = self.equivocations_seen.setdefault((i, pid), {})
            for reason in EQUIVOCATION_REASONS:
                seen[reason] = max(seen.get(reason, 0.0), counters.get(reason, 0.0))

    def start(
        self,
        kind: str,
        indexes: Iterable[int],
        *,
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start them and return once each answers; `Abort` if one does not."""
        try:
            self.cluster.start(indexes, kind, module=module, env=env)
        except OpsError as err:
            raise Abort(str(err)) from err

    def kill(self, kind: str, index: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one running process and reap it; return its pid."""
        pid = self.cluster.pid(index, kind)
        if pid is None:
            raise Abort(f"{kind} {index} is not running")
        self.cluster.kill(index, sig, kind)
        return pid

    # ------------------------------------------------------------------ waits (polled)

    def wait_commits(self, above: int, among: Sequence[int], timeout_s: float) -> float | None:
        """When 2f+1 of `among` (all, if fewer) committed above height `above`."""
        need = min(len(among), 2 * self.spec.f + 1)

        def done() -> float | None:
            heights = self.heights(among).values()
            return time.monotonic() if sum(h > above for h in heights) >= need else None

        return poll(done, timeout_s)

    def wait_replica_back(
        self,
        node: int,
        timeout_s: float = RECOVERY_TIMEOUT_S,
        among: Sequence[int] | None = None,
    ) -> float | None:
        """When replica `node` has committed the lowest height the other live replicas
        (or those `among`, leaving out others that are catching up too) have, read just
        before it: back at the cluster's height."""
        reference = self.others(node) if among is None else [i for i in among if i != node]

        def done() -> float | None:
            others = self.heights(reference)
            mine = self.cluster.probe(node)
            if not others or mine is None:
                return None
            return time.monotonic() if mine.committed_height >= min(others.values()) else None

        return poll(done, timeout_s)

    def wait_sidecar_back(self, node: int, timeout_s: float = RECOVERY_TIMEOUT_S) -> float | None:
        """When sidecar `node` has executed the lowest height the other sidecars have."""

        def done() -> float | None:
            others = [sidecar_status(self.spec, i) for i in self.others(node)]
            heights = [s.executed_height for s in others if s is not None]
            mine = sidecar_status(self.spec, node)
            if not heights or mine is None:
                return None
            return time.monotonic() if mine.executed_height >= min(heights) else None

        return poll(done, timeout_s)

    def reached(self, node: int, height: int) -> bool:
        return self.heights([node]).get(node, 0) >= height

    def all_at(self, height: int) -> bool:
        heights = self.heights()
        return len(heights) == self.n and min(heights.values()) >= height

    def sidecars_at(self, height: int, count: int) -> float | None:
        statuses = [sidecar_status(self.spec, i) for i in range(self.n)]
        at = sum(1 for s in statuses if s is not None and s.executed_height >= height)
        return time.monotonic() if at >= count else None

    def leading(self, node: int) -> int | None:
        """The view replica `node` is in, if it leads that view."""
        status = self.cluster.probe(node)
        return status.view if status is not None and status.leader == node else None

    def sidecar_lag(self, node: int) -> int | None:
        status, replica = sidecar_status(self.spec, node), self.cluster.probe(node)
        lag = (
            0
            if status is None or replica is None
            else replica.committed_height - status.executed_height
        )
        return lag if lag > 0 else None

    # ------------------------------------------------------------------ the run

    def register_agents(self) -> list[LoadAgent]:
        """The drill's agents: the same names every run, so that a directory drilled again
        and again does not fill the engine's agent registry. Those not registered yet are,
        with the owner key; then every agent's next nonce is asked of f+1 sidecars. That
        happens after the owner's transactions executed, so any block of an earlier run
        still pending at the restart has been committed (or dropped) by then, and no nonce
        of this run collides with one of it."""
        count = max(AGENTS_MIN, math.ceil(self.report.rate_per_s / AGENT_RATE_PER_S_MAX))
        names = [f"drill-agent-{k}" for k in range(count)]
        agents = [LoadAgent.from_seed(self.spec.chain_id, name) for name in names]
        ops = [tool_op(BENCH_TOOL)]
        try:
            for name, agent in zip(names, agents, strict=True):
                if not owner_next_nonce(self.spec, agent.public_key)[0]:
                    ops += agent_ops(name, agent.public_key, [BENCH_TOOL])
            OwnerSession(self.spec).submit(ops)
            for agent in agents:
                known, agent.next_nonce = owner_next_nonce(self.spec, agent.public_key)
                if not known:
                    raise Abort(f"agent {agent.public_key.hex()[:16]} is still not registered")
        except OwnerError as err:
            raise Abort(f"registering the drill's agents failed: {err}") from err
        self.report.agents = count
        return agents

    def warm_up(self) -> None:
        load = self.load
        assert load is not None
        goal = self.top() + WARMUP_HEIGHTS
        if not poll(
            lambda: load.acked_count >= WARMUP_ACKS_MIN and self.top() >= goal, RESUME_TIMEOUT_S
        ):
            raise Abort(
                f"warm-up: {load.acked_count} proposals acknowledged, heights {self.heights()}"
            )
        self.fault_deadline = time.monotonic() + self.seconds
        self.say(f"warmed up: {load.acked_count} acknowledged, heights {self.heights()}")

    def cycles(self) -> Iterable[int]:
        """Fault cycle numbers: the drill's minimum, then more while `--seconds` last."""
        for k in range(FAULT_CYCLES_MAX):
            if k >= FAULT_CYCLES_MIN[self.name] and time.monotonic() >= self.fault_deadline:
                return
            yield k

    def fault(self, fault: Fault) -> Fault:
        self.report.faults.append(fault)
        return fault

    # ------------------------------------------------------------------ faults

    def close(self) -> None:
        for closer in self.closers:
            closer()
        if self.load is not None:
            self.load.close()
        self.cluster.close()
