"""Baselines for `quorumgate bench --baselines`: other replicated logs measured in the same
run, with the same request size, in-flight window (or offered rate) and client logic.

- **PySyncObj** (Raft in pure Python, from PyPI; the `bench` extra): a 4-node local cluster,
  each node its own process holding a replicated register, with `appendEntriesUseBatch`
  on or off. PySyncObj has no client protocol, so each node also serves one gRPC
  bidirectional stream (`/qgbench.Baseline/Put`, raw bytes: an 8-byte request id and the
  256-byte value); a request's reply leaves when PySyncObj calls back that the command was
  committed and applied (commands sent to a follower are forwarded to the leader by
  PySyncObj itself). Its log is in memory (PySyncObj's default), where QuorumGate fsyncs.
- **etcd** (when an `etcd` binary is on PATH): a 4-member local cluster; clients call
  `etcdserverpb.KV/Put` over gRPC (the request encoded here, 256-byte values), W calls in
  flight; etcd fsyncs its WAL.

Clients are separate processes running `quorumgate.bench.load.LoadLoop` (the same windows, pacing
and accounting as QuorumGate's clients); CPU seconds and peak RSS are read from /proc for
every node process, as for QuorumGate.

    python -m quorumgate.bench.baselines pysyncobj-node --raft-port P --partners P1,P2,P3 \
        --rpc-port Q --batching on        (what the harness starts, one per node)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import grpc

from quorumgate.bench.harness import (
    READY_TIMEOUT_S,
    RESULT_TIMEOUT_S,
    START_DELAY_S,
    _expect,
    reap,
)
from quorumgate.bench.load import (
    DRAIN_S_MAX,
    LoadLoop,
    LoadResult,
    LoadShape,
    RunOptions,
    drive,
    queued_requests,
    wait_start,
)
from quorumgate.bench.procstats import cpu_delta, sample_cpu, sample_rss
from quorumgate.bench.report import _r, percentile
from quorumgate.bench.stopping import BenchError, sleep_until
from quorumgate.bench.workers import RETRY_BACKOFF_S
from quorumgate.proto.clusterfile import free_loopback_ports

VALUE_BYTES = 256  # the same request size as a QuorumGate bench proposal
NODES = 4
HOST = "127.0.0.1"
SERVICE = "qgbench.Baseline"
PUT_METHOD = f"/{SERVICE}/Put"
READY_METHOD = f"/{SERVICE}/Ready"
ETCD_PUT_METHOD = "/etcdserverpb.KV/Put"
CLUSTER_READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
RPC_TIMEOUT_S = 10.0
REQUEST_ID_BYTES = 8
ETCD_KEYS_PER_CLIENT = 4096  # keys are overwritten in a cycle: a bounded key space

# PySyncObj FAIL_REASON codes (pysyncobj/config.py) a client retries: back-pressure and
# leader changes. Others (REQUEST_DENIED, UNKNOWN_OUTCOME) are counted as failures.
PSO_SUCCESS = 0
PSO_RETRYABLE = {
    1: "queue_full",
    2: "missing_leader",
    3: "discarded",
    4: "not_leader",
    5: "leader_changed",
}
ETCD_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclass(frozen=True, slots=True)
class Baseline:
    system: str  # "pysyncobj" | "etcd"
    batching: bool | None = None  # PySyncObj's appendEntriesUseBatch

    @property
    def label(self) -> str:
        if self.system == "pysyncobj":
            return f"PySyncObj (batching {'on' if self.batching else 'off'})"
        return "etcd"

    @property
    def key(self) -> str:
        if self.system == "pysyncobj":
            return f"pysyncobj_batch_{'on' if self.batching else 'off'}"
        return self.system


def available_baselines() -> tuple[list[Baseline], list[str]]:
    """The baselines this machine can run, and a note for each it cannot."""
    found: list[Baseline] = []
    notes: list[str] = []
    try:
        import pysyncobj  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        notes.append("PySyncObj skipped: not installed (pip install 'quorumgate[bench]')")
    else:
        found += [Baseline("pysyncobj", True), Baseline("pysyncobj", False)]
    if shutil.which("etcd"):
        found.append(Baseline("etcd"))
    else:
        notes.append("etcd skipped: no `etcd` binary on PATH")
    return found, notes


def free_ports(count: int) -> list[int]:
    """Loopback ports free now, outside the range client sockets take."""
    return free_loopback_ports(count)


# ---------------------------------------------------------------------------- clusters


@dataclass
class BaselineCluster:
    baseline: Baseline
    procs: list[subprocess.Popen[bytes]]
    client_addresses: list[str]
    workdir: Path

    @property
    def pids(self) -> dict[str, int]:
        return {f"{self.baseline.system}-{i}": p.pid for i, p in enumerate(self.procs)}

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _start_pysyncobj(baseline: Baseline, workdir: Path) -> BaselineCluster:
    ports = free_ports(2 * NODES)
    raft, rpc = ports[:NODES], ports[NODES:]
    procs = []
    for i in range(NODES):
        partners = ",".join(str(p) for j, p in enumerate(raft) if j != i)
        cmd = [
            sys.executable,
            "-m",
            "quorumgate.bench.baselines",
            "pysyncobj-node",
            "--raft-port",
            str(raft[i]),
            "--partners",
            partners,
            "--rpc-port",
            str(rpc[i]),
            "--batching",
            "on" if baseline.batching else "off",
        ]
        procs.append(_spawn(cmd, workdir / f"pysyncobj-{i}.out"))
    return BaselineCluster(baseline, procs, [f"{HOST}:{p}" for p in rpc], workdir)


def _start_etcd(baseline: Baseline, workdir: Path) -> BaselineCluster:
    ports = free_ports(2 * NODES)
    client, peer = ports[:NODES], ports[NODES:]
    initial = ",".join(f"e{i}=http://{HOST}:{peer[i]}" for i in range(NODES))
    token = f"qgbench-{os.getpid()}-{time.time_ns()}"
    procs = []
    etcd = shutil.which("etcd")
    assert etcd is not None
    for i in range(NODES):
        cmd = [
            etcd,
            "--name",
            f"e{i}",
            "--data-dir",
            str(workdir / f"e{i}"),
            "--listen-client-urls",
            f"http://{HOST}:{client[i]}",
            "--advertise-client-urls",
            f"http://{HOST}:{client[i]}",
            "--listen-peer-urls",
            f"http://{HOST}:{peer[i]}",
            "--initial-advertise-peer-urls",
            f"http://{HOST}:{peer[i]}",
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            token,
        ]
        procs.append(_spawn(cmd, workdir / f"etcd-{i}.out"))
    return BaselineCluster(baseline, procs, [f"{HOST}:{p}" for p in client], workdir)


def _etcd_put_request(key: bytes, value: bytes) -> bytes:
    """etcdserverpb.PutRequest{key = 1; value = 2} in protobuf wire format."""

    def field(number: int, data: bytes) -> bytes:
        length, out = len(data), bytearray([(number << 3) | 2])
        while length >= 0x80:
            out.append((length & 0x7F) | 0x80)
            length >>= 7
        out.append(length)
        return bytes(out) + data

    return field(1, key) + field(2, value)


def _ready(cluster: BaselineCluster) -> bool:
    """Every node answers (PySyncObj: and knows a leader; etcd: a write succeeds)."""
    for i, address in enumerate(cluster.client_addresses):
        if cluster.procs[i].poll() is not None:
            raise BenchError(
                f"{cluster.baseline.label} node {i} exited {cluster.procs[i].returncode} "
                f"(log: {cluster.workdir})"
            )
        with grpc.insecure_channel(address) as channel:
            try:
                if cluster.baseline.system == "pysyncobj":
                    ready = channel.unary_unary(READY_METHOD)(b"", timeout=1.0)
                    if ready != b"1":
                        return False
                else:
                    put = channel.unary_unary(ETCD_PUT_METHOD)
                    put(_etcd_put_request(b"qgbench/ready", b"1"), timeout=2.0)
            except grpc.RpcError:
                return False
    return True


@contextlib.contextmanager
def baseline_cluster(baseline: Baseline) -> Iterator[BaselineCluster]:
    workdir = Path(tempfile.mkdtemp(prefix=f"qg-baseline-{baseline.key}-"))
    cluster: BaselineCluster | None = None
    try:
        start = _start_pysyncobj if baseline.system == "pysyncobj" else _start_etcd
        cluster = start(baseline, workdir)
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        while not _ready(cluster):
            if time.monotonic() > deadline:
                raise BenchError(f"{baseline.label} did not become ready (log: {workdir})")
            sleep_until(time.monotonic() + 0.2)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------- clients


@dataclass(frozen=True, slots=True)
class BaselineClientJob:
    client: int
    system: str
    address: str
    shape: LoadShape


# One coroutine on purpose, as `workers._client` is: its callbacks are closures over one
# client's state and event loop.
async def _baseline_client(
    job: BaselineClientJob,
    start_at: Synchronized,  # type: ignore[type-arg]
    ready: Any,
) -> LoadResult:
    value = (f"qgbench/{job.client}/".encode() + os.urandom(VALUE_BYTES))[:VALUE_BYTES]
    aio = asyncio.get_running_loop()
    wake = asyncio.Event()
    counter = 0
    async with grpc.aio.insecure_channel(job.address) as channel:
        ready()
        t_start = await wait_start(start_at)
        loop = LoadLoop(job.shape, t_start)

        def finish(rid: int, ok: bool, reason: str) -> None:
            if ok:
                now = time.monotonic()
                if loop.done(rid, now, now):
                    wake.set()
            elif reason:
                loop.failed(rid, reason)
                wake.set()

        if job.system == "pysyncobj":
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()

            stream = channel.stream_stream(PUT_METHOD)(queued_requests(queue))

            def send_pso(rid: int) -> None:
                queue.put_nowait(rid.to_bytes(REQUEST_ID_BYTES, "big") + value)

            async def read() -> None:
                async for reply in stream:
                    rid = int.from_bytes(reply[:REQUEST_ID_BYTES], "big")
                    code = reply[REQUEST_ID_BYTES]
                    if code == PSO_SUCCESS:
                        finish(rid, True, "")
                    elif code in PSO_RETRYABLE and time.monotonic() < loop.window_end:
                        loop.result.retries += 1
                        aio.call_later(RETRY_BACKOFF_S, send_pso, rid)
                    else:
                        finish(rid, False, PSO_RETRYABLE.get(code, f"fail_{code}"))

            reader = asyncio.create_task(read())

            def send(start: float) -> None:
                nonlocal counter
                counter += 1
                loop.sent(counter, start)
                send_pso(counter)

            try:
                await drive(loop, send, wake)
            finally:
                queue.put_nowait(None)
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await reader
        else:
            put = channel.unary_unary(ETCD_PUT_METHOD)
            prefix = f"qgbench/{job.client}/".encode()

            tasks: set[asyncio.Task[None]] = set()

            async def put_one(rid: int) -> None:
                key = prefix + str(rid % ETCD_KEYS_PER_CLIENT).encode()
                try:
                    await put(_etcd_put_request(key, value), timeout=RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError as err:
                    if err.code() in ETCD_RETRYABLE and time.monotonic() < loop.window_end:
                        loop.result.retries += 1
                        aio.call_later(RETRY_BACKOFF_S, send_etcd, rid)
                    else:
                        finish(rid, False, err.code().name.lower())
                    return
                finish(rid, True, "")

            def send_etcd(rid: int) -> None:
                task = asyncio.create_task(put_one(rid))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

            def send(start: float) -> None:
                nonlocal counter
                counter += 1
                loop.sent(counter, start)
                send_etcd(counter)

            await drive(loop, send, wake)
    return loop.result


def _baseline_client_process(
    job: BaselineClientJob,
    start_at: Synchronized,  # type: ignore[type-arg]
    out: mp.Queue,  # type: ignore[type-arg]
) -> None:
    try:
        result = asyncio.run(
            _baseline_client(job, start_at, lambda: out.put(("ready", job.client, None)))
        )
        out.put(("result", job.client, result))
    except Exception as err:
        out.put(("result", job.client, LoadResult(error=f"{type(err).__name__}: {err}")))


def measure_baseline(baseline: Baseline, options: RunOptions) -> dict[str, Any]:
    """One measured run of `baseline` with the load of `options` (closed or open loop,
    the same warm-up and window as QuorumGate's runs)."""
    shape = options.shape()
    with baseline_cluster(baseline) as cluster:
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        start_at = ctx.Value("d", 0.0)
        procs = []
        try:
            for c in range(options.clients):
                job = BaselineClientJob(
                    c, baseline.system, cluster.client_addresses[c % NODES], shape
                )
                proc = ctx.Process(
                    target=_baseline_client_process, args=(job, start_at, out), daemon=True
                )
                proc.start()
                procs.append(proc)
            _expect(out, "ready", options.clients, READY_TIMEOUT_S, procs)
            pids = cluster.pids
            t_start = time.monotonic() + START_DELAY_S
            start_at.value = t_start
            window_start = t_start + options.warmup_s
            window_end = window_start + options.seconds
            sleep_until(window_start)
            before = sample_cpu(pids)
            sleep_until(window_end)
            after = sample_cpu(pids)
            rss = sample_rss(pids)
            results: list[LoadResult] = _expect(
                out,
                "result",
                options.clients,
                DRAIN_S_MAX + options.seconds + RESULT_TIMEOUT_S,
                procs,
            )
        finally:
            reap(procs)
    errors = [r.error for r in results if r.error]
    if errors:
        raise BenchError(f"{baseline.label} client failed: {errors[0]}")
    completed = sum(r.completed for r in results)
    latencies = [x for r in results for x in r.done_ms]
    cpu = sum(cpu_delta(before, after).values())
    failed: dict[str, int] = {}
    for r in results:
        for k, v in r.failed.items():
            failed[k] = failed.get(k, 0) + v
    return {
        "system": baseline.key,
        "label": baseline.label,
        "nodes": NODES,
        "value_bytes": VALUE_BYTES,
        "inflight": shape.inflight * options.clients if not shape.open_loop else None,
        "rate_offered_per_s": options.rate_per_s if shape.open_loop else None,
        "seconds": options.seconds,
        "completed": completed,
        "throughput_per_s": round(completed / options.seconds, 1),
        "p50_ms": _r(percentile(latencies, 0.50)),
        "p99_ms": _r(percentile(latencies, 0.99)),
        "cpu_s_per_request": _r(cpu / completed, 6) if completed else None,
        "cpu_cores_busy": _r(cpu / options.seconds, 2),
        "rss_peak_mb": max(rss.values(), default=None),
        "retries": sum(r.retries for r in results),
        "failed": failed,
        "unfinished": sum(r.unfinished for r in results),
    }


def median_baseline(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["throughput_per_s"])
    report = dict(ordered[len(ordered) // 2])
    for key in ("throughput_per_s", "p50_ms", "p99_ms", "cpu_s_per_request", "cpu_cores_busy"):
        values = [r[key] for r in runs if r.get(key) is not None]
        report[key] = _r(statistics.median(values), 6 if "cpu_s" in key else 2) if values else None
    report["runs"] = len(runs)
    report["per_run"] = [
        {k: r.get(k) for k in ("throughput_per_s", "p50_ms", "p99_ms")} for r in runs
    ]
    return report


# ---------------------------------------------------------------------------- node


# Long because PySyncObj's replicated class must be defined where its module is imported
# (the package is optional); the rest is that node's small gRPC server.
def _pysyncobj_node(raft_port: int, partners: list[int], rpc_port: int, batching: bool) -> int:
    from pysyncobj import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        SyncObj,
        SyncObjConf,
        replicated,
    )

    class Register(SyncObj):  # type: ignore[misc]
        """The replicated state: how many values were applied, and the last one."""

        def __init__(self) -> None:
            conf = SyncObjConf(
                appendEntriesUseBatch=batching,
                # Log compaction in a thread, not a forked child, so that its CPU time is
                # this process's (the harness reads /proc/PID/stat).
                useFork=False,
            )
            super().__init__(f"{HOST}:{raft_port}", [f"{HOST}:{p}" for p in partners], conf)
            self.applied = 0
            self.last = b""

        @replicated  # type: ignore[untyped-decorator]
        def put(self, value: bytes) -> int:
            self.applied += 1
            self.last = value
            return self.applied

    node = Register()

    async def serve() -> None:
        loop = asyncio.get_running_loop()

        async def put_stream(requests: Any, context: Any) -> Any:
            replies: asyncio.Queue[bytes] = asyncio.Queue()

            def callback_for(rid: bytes) -> Any:
                def done(result: Any, error: int) -> None:
                    loop.call_soon_threadsafe(replies.put_nowait, rid + bytes([error]))

                return done

            async def pump() -> None:
                async for request in requests:
                    rid = request[:REQUEST_ID_BYTES]
                    node.put(request[REQUEST_ID_BYTES:], callback=callback_for(rid))

            task = asyncio.create_task(pump())
            try:
                while True:
                    yield await replies.get()
            finally:
                task.cancel()

        async def ready(request: bytes, context: Any) -> bytes:
            return b"1" if node._getLeader() is not None else b"0"

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Put": grpc.stream_stream_rpc_method_handler(put_stream),
                        "Ready": grpc.unary_unary_rpc_method_handler(ready),
                    },
                ),
            )
        )
        server.add_insecure_port(f"{HOST}:{rpc_port}")
        await server.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop(0.5)

    asyncio.run(serve())
    node.destroy()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quorumgate.bench.baselines")
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("pysyncobj-node", help="one PySyncObj node with a gRPC front")
    node.add_argument("--raft-port", type=int, required=True)
    node.add_argument("--partners", required=True, help="the other nodes' raft ports")
    node.add_argument("--rpc-port", type=int, required=True)
    node.add_argument("--batching", choices=("on", "off"), default="on")
    args = parser.parse_args(argv)
    partners = [int(p) for p in args.partners.split(",") if p]
    return _pysyncobj_node(args.raft_port, partners, args.rpc_port, args.batching == "on")


if __name__ == "__main__":
    sys.exit(main())
