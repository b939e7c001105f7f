"""Where a block's CPU goes in each process: py-spy profiles of a running 4- or 7-node cluster
under `quorumgate bench` load, split into kinds of work (docs/benchmarks.md, "What a
block costs each process").

    python scripts/bench_profile.py --inflight 1 --clients 1 --agents 32 --out /tmp/w1
    python scripts/bench_profile.py --inflight 256 --out /tmp/w256
    python scripts/bench_profile.py --inflight 1 --clients 1 --agents 32 --profile all \
        --out /tmp/w1all

It initializes a cluster in a temporary directory, starts it, runs `quorumgate bench --dir`
on it for `--seconds` (so the figures of that run come with the profiles), and, while the
load runs, samples every replica and sidecar with `py-spy record --nonblocking --format raw`
(py-spy must be on PATH: `pip install py-spy`; it reads the processes' memory, so ptrace must
be allowed). The samples are of running Python threads only (py-spy leaves out idle
ones), so their proportions are the proportions of Python CPU; the CPU of threads that run
no Python (gRPC's own threads) is read per thread from /proc over the same stretch and
printed beside them. Each sample's kind of work is that of its innermost frame that names
one (`KINDS`, first match from the leaf).

The blocks committed over the sampled stretch are read from replica 0's metrics at its
edges, so each process's CPU comes out per block too (`per_block_ms`): its threads' CPU
over the stretch divided by those blocks, and that split by the kinds of its Python
samples. `--native` has py-spy unwind native frames too (dearer per sample and not
available with `--nonblocking`, so the process pauses for each sample: use it on one
replica and one sidecar), which names the C functions under the event loop's frame.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

SPY_RATE_HZ = 47  # py-spy's samples per second and process (a prime: no lockstep with timers)

# (kind, markers): a frame whose text holds any marker is of that kind. Checked in this
# order at each frame, frames checked from the innermost out; the first hit names the sample.
# gRPC's Cython core and uvloop run no Python frames: their CPU shows as the innermost
# Python frame that called into them, the event loop's `Runner.run` or a bare thread's
# `Thread.run` (gRPC's poller), hence those two markers.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("signing and checking", ("nacl/",)),
    (
        "storage: statements and COMMIT",
        ("replica/storage.py", "sidecar/store.py", "runtime/dbthread.py"),
    ),
    ("storage: thread hop (aiosqlite queue)", ("aiosqlite/",)),
    ("execution (engine)", ("sidecar/engine/",)),
    (
        "codec (protobuf, canonical, wire)",
        (
            "google/protobuf",
            "proto/codec",
            "proto/canonical",
            "proto/tx.py",
            "_pb2",
            "replica/wire.py",
            "sidecar/wire.py",
        ),
    ),
    ("messages: gRPC (Python)", ("grpc/",)),
)
# Frames that wrap every callback: a sample is theirs only when one is its innermost frame.
LEAF_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "messages: event loop and gRPC core (native)",
        ("Runner.run (", "Thread.run (", "asyncio/", "selectors.py", "runtime/grpcutil.py"),
    ),
)


# Work named by a caller anywhere on the stack, whatever it calls.
STACK_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ledger extras (second parse)", ("ledger_extras (",)),
)


def kind_of(stack: str) -> str:
    frames = stack.split(";")
    for kind, markers in STACK_KINDS:
        if any(m in stack for m in markers):
            return kind
    for kind, markers in LEAF_KINDS:
        if any(m in frames[-1] for m in markers):
            return kind
    for frame in reversed(frames):
        for kind, markers in KINDS:
            if any(m in frame for m in markers):
                return kind
    return "everything else"


def qg(*args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "quorumgate.cli", *args], check=True,
                         capture_output=True, text=True, env=env)  # fmt: skip
    return out.stdout


def pids_of(cluster: Path) -> dict[str, int]:
    pids = {}
    for node in sorted(cluster.glob("node-*")):
        for kind in ("replica", "sidecar"):
            pid_file = node / f"{kind}.pid"
            if pid_file.exists():
                pids[f"{kind}-{node.name.split('-')[1]}"] = int(pid_file.read_text().strip())
    return pids


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (utime + stime) per thread name of `pid` (proc(5))."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out["python (main)" if task.name == str(pid) else name] += (
            int(fields[11]) + int(fields[12])
        ) / ticks
    return dict(out)


def committed_height(cluster: Path) -> int:
    """Replica 0's committed height, from its Prometheus endpoint."""
    doc = json.loads((cluster / "cluster.json").read_text())
    port = doc["members"][0]["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("qg_replica_committed_height "):
                return int(float(line.split()[1]))
    raise RuntimeError("replica 0 reports no committed height")


def thread_switches(pid: int) -> dict[str, int]:
    """Context switches (voluntary + involuntary) per thread name of `pid` (proc(5)): a
    thread's every wake-up and every preemption."""
    out: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        switches = int(fields["voluntary_ctxt_switches"]) + int(
            fields["nonvoluntary_ctxt_switches"]
        )
        out["python (main)" if task.name == str(pid) else name] += switches
    return dict(out)


LOAD_CORES_MIN = 0.5  # the cluster's CPU rate that says the load runs, in cores
LOAD_WAIT_S_MAX = 120.0


def wait_for_load(pids: dict[str, int], settle_s: float) -> None:
    """Return `settle_s` after the cluster's CPU rate first stays above `LOAD_CORES_MIN`
    for two seconds in a row (the agents are registered and the load has begun)."""

    def total() -> float:
        return sum(sum(thread_cpu(pid).values()) for pid in pids.values())

    deadline = time.monotonic() + LOAD_WAIT_S_MAX
    busy, last = 0, total()
    while busy < 2 and time.monotonic() < deadline:
        time.sleep(1.0)
        now = total()
        busy = busy + 1 if now - last > LOAD_CORES_MIN else 0
        last = now
    time.sleep(settle_s)


def profile(args: argparse.Namespace, cluster: Path, out: Path) -> dict[str, object]:
    pids = pids_of(cluster)
    bench = subprocess.Popen(
        [sys.executable, "-m", "quorumgate.cli", "bench", "--dir", str(cluster), "--json",
         "--seconds", str(args.seconds), "--warmup", "2", "--inflight", str(args.inflight),
         "--clients", str(args.clients), "--agents", str(args.agents)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_load(pids, args.delay)
    before = {name: thread_cpu(pid) for name, pid in pids.items()}
    switched = {name: thread_switches(pid) for name, pid in pids.items()}
    height_before = committed_height(cluster)
    chosen = set(pids) if args.profile == "all" else set(args.profile.split(","))
    spies = {
        name: subprocess.Popen(
            [
                "py-spy",
                "record",
                *(["--native"] if args.native else ["--nonblocking"]),
                "--format",
                "raw",
                "--rate",
                str(SPY_RATE_HZ),
                "--duration",
                str(args.duration),
                "--pid",
                str(pid),
                "--output",
                str(out / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
        if name in chosen
    }
    for spy in spies.values():
        spy.wait()
    after = {name: thread_cpu(pid) for name, pid in pids.items()}
    blocks = committed_height(cluster) - height_before
    switches = {
        name: {t: n - switched[name].get(t, 0) for t, n in thread_switches(pid).items()}
        for name, pid in pids.items()
    }
    report = json.loads(bench.communicate()[0])
    threads = {
        name: {t: round(after[name][t] - before[name].get(t, 0.0), 3) for t in after[name]}
        for name in pids
    }
    per_block = max(1, blocks)
    return {
        "bench": report,
        "threads_cpu_s": threads,
        "blocks": blocks,
        "switches_per_block": {
            name: {t: round(n / per_block, 1) for t, n in by_thread.items() if n}
            for name, by_thread in switches.items()
        },
    }


def summarize(out: Path, result: dict[str, object]) -> dict[str, object]:
    kinds: dict[str, Counter[str]] = {"replica": Counter(), "sidecar": Counter()}
    funcs: dict[str, Counter[str]] = {"replica": Counter(), "sidecar": Counter()}
    rest: dict[str, Counter[str]] = {"replica": Counter(), "sidecar": Counter()}
    for path in sorted(out.glob("*-[0-9]*.txt")):
        role = path.name.split("-")[0]
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            kinds[role][kind_of(stack)] += int(count)
            funcs[role][stack.split(";")[-1]] += int(count)
            if kind_of(stack) == "everything else":
                rest[role][
                    " < ".join(f.split(" (")[1].rstrip(")") for f in stack.split(";")[-3:])
                ] += int(count)
    shares = {
        role: {k: round(v / max(1, sum(c.values())), 3) for k, v in c.most_common()}
        for role, c in kinds.items()
    }
    per_block = per_block_ms(out, result)
    top = {role: c.most_common(25) for role, c in funcs.items()}
    return {"shares": shares, "per_block_ms": per_block,
            "samples": {r: sum(c.values()) for r, c in kinds.items()},
            "top_leaf_frames": top,
            "everything_else_top": {r: c.most_common(15) for r, c in rest.items()}}  # fmt: skip


GRPC_THREADS = ("grpc", "event_engine", "default-executo", "resolver-executo", "timer_manager")


def per_block_ms(out: Path, result: dict[str, object]) -> dict[str, dict[str, float]]:
    """Each sampled process's CPU per block over the stretch, in ms: its threads (the main
    one, the store's, gRPC's own) and its Python threads' CPU split by the kinds of their
    samples."""
    blocks = max(1, int(result["blocks"]))  # type: ignore[call-overload]
    threads: dict[str, dict[str, float]] = result["threads_cpu_s"]  # type: ignore[assignment]
    table: dict[str, dict[str, float]] = {}
    for path in sorted(out.glob("*-[0-9]*.txt")):
        name = path.stem
        cpu = threads.get(name, {})
        native = sum(s for t, s in cpu.items() if t.startswith(GRPC_THREADS))
        python = sum(cpu.values()) - native
        counts: Counter[str] = Counter()
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack:
                counts[kind_of(stack)] += int(count)
        samples = max(1, sum(counts.values()))
        row = {"total": sum(cpu.values()), "gRPC core threads (counters)": native}
        row |= {kind: python * n / samples for kind, n in counts.most_common()}
        table[name] = {k: round(1000 * v / blocks, 3) for k, v in row.items()}
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, choices=(4, 7))
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=30.0, help="the bench window")
    parser.add_argument("--delay", type=float, default=3.0,
                        help="seconds between the load's start and the sampling")  # fmt: skip
    parser.add_argument("--duration", type=int, default=10, help="seconds sampled")
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile", default="replica-1,sidecar-1",
                        help="processes sampled, or `all` (each sampler costs CPU)")  # fmt: skip
    parser.add_argument("--native", action="store_true",
                        help="unwind native frames (pauses the process per sample)")  # fmt: skip
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = Path(tempfile.mkdtemp(prefix="qg-prof-")) / "c"
    qg("init", "--nodes", str(args.nodes), "--dir", str(cluster))
    qg("up", "--dir", str(cluster), "--detach")
    try:
        result = profile(args, cluster, out)
    finally:
        qg("down", "--dir", str(cluster))
    result.update(summarize(out, result))
    (out / "result.json").write_text(json.dumps(result, indent=2))
    shown = ("shares", "samples", "blocks", "per_block_ms", "switches_per_block", "threads_cpu_s")
    print(json.dumps({k: result[k] for k in shown}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
