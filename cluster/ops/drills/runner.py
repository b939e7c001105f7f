"""The drill runner: start the cluster, register agents, start the load, warm up, inject
the drill's fault again and again while `--seconds` last, stop the load, settle and check
(docs/drills.md). Every process it started is stopped before `run_drill` returns.
"""

from __future__ import annotations

import time
from pathlib import Path

from quorumgate.ops.drills.bounds import (
    BATCH_TXS,
    DENY_EVERY,
    DRILLS,
    RATE_PER_S_DEFAULT,
    RATE_PER_S_OTHER,
    SECONDS_DEFAULT,
    SECONDS_MIN,
    SENDER_THREADS,
    ProgressFn,
)
from quorumgate.ops.drills.checker import settle_and_check
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.database import ShipTarget
from quorumgate.ops.drills.nemesis import FAULTS, PREPARE
from quorumgate.ops.drills.report import Abort, DrillError, DrillReport
from quorumgate.ops.load import PERSISTENT, Load
from quorumgate.ops.nodes import log_tail, running_pid
from quorumgate.proto.clusterfile import (
    CLUSTER_FILE,
    ClusterFileError,
    ClusterSpec,
    init_cluster,
    load_cluster,
)


def run(d: Drill) -> None:
    """Start, load, warm up, inject the drill's faults, stop the load, settle and check;
    a step that cannot be carried out still leaves the checks to say what it left."""
    try:
        if d.name in PREPARE:
            PREPARE[d.name](d)
        d.say(f"starting {d.n} replicas and {d.n} sidecars in {d.spec.directory}")
        d.start("replica", range(d.n))
        d.start("sidecar", range(d.n))
        agents = d.register_agents()
        d.load = Load(
            d.cluster,
            agents,
            delivery=PERSISTENT,
            batch=BATCH_TXS,
            rate_per_s=d.report.rate_per_s,
            threads=SENDER_THREADS,
            deny_every=DENY_EVERY,
        ).start()
        d.say(
            f"load: {d.report.rate_per_s:g} proposals/s from {len(agents)} agents, "
            f"1 in {DENY_EVERY} denied by the tool's schemes"
        )
        d.warm_up()
        FAULTS[d.name](d)
        remaining = d.fault_deadline - time.monotonic()
        if remaining > 0:
            d.say(f"load goes on for {remaining:.1f} s")
            time.sleep(remaining)  # pacing the drill's length, not waiting for a state
    except Abort as err:
        d.aborted = str(err)
        d.say(f"ABORTED: {err}")
    finally:
        if d.load is not None:
            d.load.stop()
    if d.load is not None:
        # After an aborted step too: the checks say what state it left behind.
        try:
            settle_and_check(d, d.load)
        except Abort as err:
            d.aborted = d.aborted or str(err)
            d.say(f"ABORTED: {err}")
    problems = [d.aborted] if d.aborted else []
    d.check("drill_completed", problems, "every step carried out")


def prepare_cluster(directory: Path, nodes: int) -> ClusterSpec:
    """The cluster in `directory`, made with `init_cluster` if it has no cluster file;
    `DrillError` for a cluster of another size or one with a process running."""
    if not (directory / CLUSTER_FILE).exists():
        try:
            return init_cluster(directory, nodes)
        except (ClusterFileError, OSError) as err:
            raise DrillError(str(err)) from err
    try:
        spec = load_cluster(directory)
    except ClusterFileError as err:
        raise DrillError(str(err)) from err
    if spec.n != nodes:
        raise DrillError(
            f"{directory} holds a {spec.n}-node cluster, not {nodes}: pass --nodes {spec.n} "
            "or use another --dir"
        )
    running = [
        f"{kind} {i} (pid {pid})"
        for i in range(spec.n)
        for kind in ("replica", "sidecar")
        if (pid := running_pid(spec, i, kind)) is not None
    ]
    if running:
        raise DrillError(
            f"the cluster in {directory} is running ({', '.join(running)}); a drill starts and "
            f"stops its own processes: `quorumgate down --dir {directory}` first"
        )
    return spec


def run_drill(
    name: str,
    directory: Path | str,
    *,
    nodes: int = 4,
    seconds: float = SECONDS_DEFAULT,
    rate_per_s: float | None = None,
    progress: ProgressFn | None = None,
    ship: ShipTarget | None = None,
) -> DrillReport:
    """Run drill `name` (one of DRILLS) against the cluster in `directory` and return its
    report. `DrillError` when it cannot run there. Every process it started is stopped
    before it returns or raises."""
    if name not in FAULTS:
        raise DrillError(f"unknown drill {name!r}; one of {', '.join(DRILLS)}")
    if (name == "ship") != (ship is not None):
        raise DrillError(
            "the ship drill needs --dsn, --db-stop-cmd and --db-start-cmd"
            if ship is None
            else f"--dsn and the database commands are for the ship drill, not {name}"
        )
    if seconds < SECONDS_MIN:
        raise DrillError(f"--seconds must be at least {SECONDS_MIN:g}")
    rate = RATE_PER_S_DEFAULT.get(nodes, RATE_PER_S_OTHER) if rate_per_s is None else rate_per_s
    if rate <= 0:
        raise DrillError("--rate must be positive")
    spec = prepare_cluster(Path(directory), nodes)
    drill = Drill(name, spec, seconds, rate, progress, ship)
    try:
        run(drill)
    finally:
        drill.close()
    report = drill.report
    report.duration_s = time.monotonic() - drill.t0
    if not report.ok:
        report.details["log_tails"] = {
            f"{kind}-{i}": log_tail(spec, i, 5, kind=kind)
            for i in range(spec.n)
            for kind in ("replica", "sidecar")
        }
    drill.say(f"done in {report.duration_s:.1f} s: {'ok' if report.ok else 'FAILED'}")
    return report
