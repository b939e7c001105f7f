"""`quorumgate bench`: the benchmark harness; this module runs one measured run and many.

Load. Client processes (their own OS processes, so the load generator shares no interpreter
with what it measures) submit signed ~256-byte proposals (`quorumgate.ops.loadgen`) on one
`SubmitStream` each, either closed-loop (W proposals in flight in all: a new one as soon as
one completes) or open-loop (a fixed offered rate: proposal k of a client is *due* at
`start + k / rate`, and its latency is counted from that due time, so a client that falls
behind cannot hide the queueing it causes, i.e. no coordinated omission). Proposals are
signed before the clock starts where the expected count is known, so that the clients'
Ed25519 signing does not compete with the cluster for this machine's cores.

Completion. One observer process follows replica 0's `CommittedBlocks` stream (commit
time of each proposal) and, in full mode, every sidecar's `Receipts` stream. A block is
certified once f+1 sidecars have sent all their receipts of that block and agree on its
signed statement: one `verify_certificate` over one leaf checks the f+1 signatures and that
leaf's path, and recomputing the Merkle root over all the block's leaves puts every other
leaf under the same signed root; that is the certificate of every proposal in the block
(`BlockCertifier`). The observer tells each client which of its proposals completed, with
both times. Times are `time.monotonic()` (CLOCK_MONOTONIC, one clock for all processes).

Figures, over a measured window after a warm-up: committed and certified proposals per
second (a proposal counts in the window its commit / certificate falls in), submit-to-commit
and submit-to-certificate latency p50/p99, cluster CPU seconds per proposal (utime+stime of
every replica and sidecar process, read from /proc at the window's edges), and peak RSS per
process (VmHWM at the end: the peak over the process's whole life). `--ordering-only`
starts replicas only (with `--start`) and counts committed proposals.

Full mode uses a pool of governed agents (`bench-pool-I`, registered once per cluster with
the bench tool allowed); their next nonces come from the sidecars. The engine's quota (120
proposals per agent per minute of block time, docs/engine.md) turns proposals over it into
certified *denials*: still a certified verdict, reported under `outcomes`.

The parts, one job each: `load` (the load shape, the window bookkeeping, `RunOptions`),
`workers` (the client and observer processes), `certifier` (per-block certificates),
`agents` (the agent pool), `procstats` (/proc readers), `report` (the figures and the
median over runs) and `stopping` (the error and the stop signals).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

from quorumgate.bench.agents import AGENT_POOL_DEFAULT, fresh_agents, prepare_agent_pool
from quorumgate.bench.certifier import BlockCertifier
from quorumgate.bench.load import (
    DRAIN_S_MAX,
    WARMUP_S_DEFAULT,
    LoadLoop,
    LoadResult,
    LoadShape,
    RunOptions,
)
from quorumgate.bench.procstats import (
    cluster_pids,
    cpu_delta,
    cpu_seconds,
    rss_peak_mb,
    sample_cpu,
    sample_rss,
)
from quorumgate.bench.report import median_report, run_report
from quorumgate.bench.stopping import BenchError, BenchInterrupted, check_interrupted, sleep_until
from quorumgate.bench.workers import (
    ClientJob,
    ObserverJob,
    ObserverResult,
    client_process,
    observer_process,
)
from quorumgate.ops.loadgen import LoadAgent
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.receipts import ReceiptEpochs

START_DELAY_S = 0.3  # between "every client is ready" and the first submission
READY_TIMEOUT_S = 120.0  # client pre-signing and observer streams
RESULT_TIMEOUT_S = 60.0
AGENTS_PER_CLIENT_MIN = 4
PRESIGN_RATE_GUESS_PER_S = 3000.0  # first run of an invocation; later runs use the rate seen
PRESIGN_HEADROOM = 1.3
PRESIGN_PER_CLIENT_MAX = 200_000


def _split_agents(nonces: dict[str, int], clients: int) -> list[tuple[tuple[str, int], ...]]:
    names = sorted(nonces, key=lambda n: (len(n), n))
    groups: list[list[tuple[str, int]]] = [[] for _ in range(clients)]
    for i, name in enumerate(names):
        groups[i % clients].append((name, nonces[name]))
    return [tuple(g) for g in groups]


def _presign_count(options: RunOptions, rate_guess_per_s: float) -> int:
    total_s = options.warmup_s + options.seconds
    if options.rate_per_s > 0:
        expected = options.rate_per_s * total_s
    else:
        expected = rate_guess_per_s * PRESIGN_HEADROOM * total_s
    per_client = int(expected / options.clients) + 64
    return min(PRESIGN_PER_CLIENT_MAX, per_client)


# Long on purpose: one run's sequence (start the observer and clients, measure, stop)
# reads top to bottom; its steps share the processes and timers it starts.
def run_once(
    spec: ClusterSpec,
    options: RunOptions,
    nonces: dict[str, int],
    *,
    rate_guess_per_s: float = PRESIGN_RATE_GUESS_PER_S,
) -> dict[str, Any]:
    """One measured run against a serving cluster. `nonces` (agent name -> next nonce) is
    updated with what this run used."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    start_at = ctx.Value("d", 0.0)
    stop = ctx.Event()
    groups = _split_agents(nonces, options.clients)
    pipes = [ctx.Pipe(duplex=False) for _ in range(options.clients)]
    observer_job = _observer_job(spec, options, groups)
    observer = ctx.Process(
        target=observer_process,
        args=(observer_job, [w for _, w in pipes], stop, out),
        daemon=True,
    )
    shape = options.shape()
    presign = _presign_count(options, rate_guess_per_s)
    procs = []
    try:
        observer.start()
        _expect(out, "ready", 1, READY_TIMEOUT_S, [observer])
        for c in range(options.clients):
            job = ClientJob(
                client=c,
                spec=spec,
                replica=c % spec.n,
                chain_id=spec.chain_id,
                shape=shape,
                agents=groups[c],
                presign=presign,
            )
            proc = ctx.Process(
                target=client_process, args=(job, pipes[c][0], start_at, out), daemon=True
            )
            proc.start()
            procs.append(proc)
        _expect(out, "ready", options.clients, READY_TIMEOUT_S, [observer, *procs])
        window = _measure_window(spec, options, start_at, procs, observer)
        results = _expect(
            out,
            "result",
            options.clients,
            DRAIN_S_MAX + options.seconds + RESULT_TIMEOUT_S,
            [observer, *procs],
        )
        stop.set()
        observed = _expect(out, "observer", 1, RESULT_TIMEOUT_S, [observer])[0]
    finally:
        stop.set()
        reap([*procs, observer])
    errors = [r.error for r in results if r.error]
    if errors:
        raise BenchError(f"bench client failed: {errors[0]}")
    assert isinstance(observed, ObserverResult)
    if observed.error:
        raise BenchError(f"bench observer failed: {observed.error}")
    for r in results:
        for name, nxt in r.next_nonces.items():
            nonces[name] = max(nonces.get(name, 1), nxt)
    return run_report(
        spec,
        options,
        results,
        observed,
        window.cpu_before,
        window.cpu_after,
        window.rss,
        window.load_cpu,
    )


def _observer_job(
    spec: ClusterSpec, options: RunOptions, groups: Sequence[tuple[tuple[str, int], ...]]
) -> ObserverJob:
    """What the observer follows: the blocks from the next height on, whose bench
    transactions it tells apart by their signer's client (`groups`: each client's agents)."""
    client_of_signer = {
        LoadAgent.from_seed(spec.chain_id, name).public_key: c
        for c, group in enumerate(groups)
        for name, _ in group
    }
    return ObserverJob(
        chain_id=spec.chain_id,
        spec=spec,
        full=not options.ordering_only,
        receipt_keys=spec.receipt_keys,
        client_of_signer=client_of_signer,
        from_height=_next_height(spec),
        receipt_epochs=chain_receipt_epochs(spec),
    )


def chain_receipt_epochs(spec: ClusterSpec) -> ReceiptEpochs | None:
    """Each epoch's heights and receipt keys, read as the owner (the bench runs as the
    cluster's owner) and checked by `Client.epochs`, the verifier the SDK and `audit
    verify --epochs` use (docs/consensus/epochs.md, "Receipt keys"); None on a chain that
    runs no epochs. Read once per run: a run that crosses an epoch boundary certifies
    nothing of the epoch after it."""
    if not spec.runs_epochs:
        return None
    import asyncio

    from quorumgate.sdk.client import Client

    async def read() -> ReceiptEpochs:
        async with Client.as_owner(spec.directory) as client:
            return (await client.epochs()).receipt_epochs

    return asyncio.run(read())


def _next_height(spec: ClusterSpec) -> int:
    """The first height the run may commit: above the highest any serving replica holds."""
    from quorumgate.ops.nodes import query_status

    heights = [
        st.height
        for st in (query_status(spec, i) for i in range(spec.n))
        if st.alive and st.height is not None
    ]
    return max(heights, default=0) + 1


@dataclass(frozen=True)
class _Window:
    """What /proc showed over the measured window: the cluster's CPU seconds at its edges,
    its processes' peak RSS at its end, and the bench's own CPU seconds within it."""

    cpu_before: dict[str, float]
    cpu_after: dict[str, float]
    rss: dict[str, float]
    load_cpu: dict[str, float]


def _measure_window(
    spec: ClusterSpec,
    options: RunOptions,
    start_at: Synchronized,  # type: ignore[type-arg]
    procs: Sequence[BaseProcess],
    observer: BaseProcess,
) -> _Window:
    """Publish the common start time to the ready clients, then read /proc at the edges of
    the measured window (after the warm-up)."""
    pids = cluster_pids(spec)
    load_pids = {f"client-{i}": p.pid for i, p in enumerate(procs) if p.pid}
    if observer.pid:
        load_pids["observer"] = observer.pid
    t_start = time.monotonic() + START_DELAY_S
    start_at.value = t_start
    window_start = t_start + options.warmup_s
    window_end = window_start + options.seconds
    sleep_until(window_start)
    cpu_before, load_before = sample_cpu(pids), sample_cpu(load_pids)
    sleep_until(window_end)
    cpu_after, load_after = sample_cpu(pids), sample_cpu(load_pids)
    rss = sample_rss(pids)
    return _Window(cpu_before, cpu_after, rss, cpu_delta(load_before, load_after))


def reap(procs: Sequence[BaseProcess]) -> None:
    """Join the bench's own processes; after a failure or a stop signal, kill them at once
    (they would otherwise go on to the end of their window)."""
    failing = sys.exc_info()[0] is not None
    for proc in procs:
        if proc.pid is None:
            continue
        proc.join(timeout=0.1 if failing else 5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _expect(
    out: mp.Queue,  # type: ignore[type-arg]
    kind: str,
    count: int,
    timeout_s: float,
    watch: Sequence[BaseProcess] = (),
) -> list[Any]:
    """`count` messages of `kind` from the bench processes; raise at the deadline, on a
    process's reported error, or as soon as a watched process died without a word."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        check_interrupted()
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"timed out waiting for {count - len(got)} bench {kind} message(s)")
        try:
            what, _, payload = out.get(timeout=min(left, 0.5))
        except queue.Empty:
            dead = [p for p in watch if p.exitcode not in (None, 0)]
            if dead:
                raise BenchError(
                    f"bench process {dead[0].name} exited {dead[0].exitcode}"
                ) from None
            continue
        if what == kind:
            got.append(payload)
        elif isinstance(payload, LoadResult | ObserverResult) and payload.error:
            raise BenchError(f"bench {what} failed: {payload.error}")
    return got


@dataclass
class Cluster:
    """A cluster the harness measures: one the caller runs (`--dir`) or one it started
    (`--start`), which `close` stops and removes."""

    spec: ClusterSpec
    started: bool
    workdir: Path | None = None

    def close(self, keep: bool = False) -> None:
        if not self.started:
            return
        from quorumgate.ops.nodes import stop_nodes

        stop_nodes(self.spec)
        if self.workdir is not None and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_temporary_cluster(nodes: int, ordering_only: bool, parent: Path | None) -> Cluster:
    """Init a cluster in a fresh temporary directory and start it (replicas only for
    ordering-only); on failure, stop what started and remove the directory."""
    from quorumgate.ops.nodes import start_cluster, start_nodes, stop_nodes, wait_serving
    from quorumgate.proto.clusterfile import init_cluster

    workdir = Path(tempfile.mkdtemp(prefix=f"qg-bench-{nodes}-", dir=parent))
    spec = init_cluster(workdir / "cluster", nodes)
    try:
        if ordering_only:
            procs = start_nodes(spec, list(range(nodes)), "replica")
            wait_serving(spec, list(range(nodes)), procs)
        else:
            start_cluster(spec, list(range(nodes)))
    except BaseException:
        stop_nodes(spec)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Cluster(spec, True, workdir)


@contextlib.contextmanager
def open_cluster(
    directory: Path | None, start_nodes_count: int | None, ordering_only: bool, keep: bool = False
) -> Iterator[Cluster]:
    from quorumgate.proto.clusterfile import load_cluster

    if start_nodes_count is not None:
        cluster = start_temporary_cluster(start_nodes_count, ordering_only, None)
    else:
        assert directory is not None
        cluster = Cluster(load_cluster(directory), False)
    try:
        yield cluster
    finally:
        cluster.close(keep)


def check_serving(spec: ClusterSpec, full: bool) -> None:
    from quorumgate.ops.nodes import query_status, sidecar_status

    down = [i for i in range(spec.n) if not query_status(spec, i).alive]
    if len(down) > spec.f:
        raise BenchError(f"replicas {down} are not serving; start the cluster with `quorumgate up`")
    if full:
        missing = [i for i in range(spec.n) if sidecar_status(spec, i) is None]
        if len(missing) > spec.f:
            raise BenchError(
                f"sidecars {missing} are not serving: full mode needs f+1 of them "
                "(or use --ordering-only)"
            )


def agent_nonces(spec: ClusterSpec, options: RunOptions, agents: int) -> dict[str, int]:
    count = max(agents, AGENTS_PER_CLIENT_MIN * options.clients)
    if options.ordering_only:
        return fresh_agents(spec, count)
    return prepare_agent_pool(spec, count)


def run_bench(
    spec: ClusterSpec,
    seconds: float,
    inflight: int,
    clients: int,
    *,
    rate_per_s: float = 0.0,
    warmup_s: float = WARMUP_S_DEFAULT,
    ordering_only: bool = False,
    runs: int = 1,
    agents: int = AGENT_POOL_DEFAULT,
) -> dict[str, Any]:
    """Median report of `runs` runs of one load against a serving cluster."""
    options = RunOptions(seconds, warmup_s, inflight, rate_per_s, clients, ordering_only)
    check_serving(spec, not ordering_only)
    nonces = agent_nonces(spec, options, agents)
    reports = []
    guess = PRESIGN_RATE_GUESS_PER_S
    for _ in range(runs):
        report = run_once(spec, options, nonces, rate_guess_per_s=guess)
        guess = max(100.0, report["throughput_per_s"])
        reports.append(report)
    return median_report(reports)


def sweep_options(base: RunOptions, values: Sequence[float]) -> list[RunOptions]:
    """One RunOptions per sweep value: rates when `base` is open loop, else inflight."""
    if base.rate_per_s > 0:
        return [replace(base, rate_per_s=float(v)) for v in values]
    return [
        replace(base, inflight=max(1, int(v)), clients=min(base.clients, max(1, int(v))))
        for v in values
    ]


__all__ = [
    "BenchError",
    "BenchInterrupted",
    "BlockCertifier",
    "LoadLoop",
    "LoadShape",
    "RunOptions",
    "cpu_seconds",
    "rss_peak_mb",
    "run_bench",
    "run_once",
]
