"""The CPU a replica and a sidecar process spend from exec until they serve, before and
after a change, in interleaved runs.

    python scripts/bench_startup.py [--runs 5] [--nodes 4] [--code DIR ...]

Each run makes a fresh cluster directory (`init_cluster`, TLS as `quorumgate init`), starts
its replicas one after another, each waited for until it answers Status, then its sidecars
the same way, and reads each process's user + system CPU from `/proc/PID/stat` at the
moment it first answered (proc(5)): the CPU from exec to serving, imports included, with
little else (a replica started alone has no peer to talk to yet). `--code` names
directories whose `quorumgate` package is laid out as installed (`scripts/layout.py`
`link_tree`); the node processes of each run take them in turn on PYTHONPATH, so two
revisions interleave (A B A B ...) and the machine's drift falls on both. Without
`--code` every run uses the installed package. Prints the median per kind and code, in
milliseconds, over all runs and members.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from quorumgate.ops.nodes import (
    start_nodes,
    stop_nodes,
    wait_serving,
    wait_sidecars_serving,
)
from quorumgate.proto.clusterfile import init_cluster

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    """User + system CPU of `pid` so far (proc(5): fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS_PER_S


def one_run(directory: Path, nodes: int, env: dict[str, str]) -> dict[str, list[float]]:
    spec = init_cluster(directory, nodes)
    out: dict[str, list[float]] = {"replica": [], "sidecar": []}
    try:
        for kind, wait in (("replica", wait_serving), ("sidecar", wait_sidecars_serving)):
            for i in range(nodes):
                procs = start_nodes(spec, [i], kind, env=env)
                wait(spec, [i], procs, 60.0)
                out[kind].append(cpu_ms(procs[i].pid))
    finally:
        stop_nodes(spec)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--code", nargs="*", default=[], help="package directories to alternate")
    args = parser.parse_args()
    codes = args.code or [""]
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="qg-startup-") as tmp:
        for run in range(args.runs):
            for n, code in enumerate(codes):
                env = {"PYTHONPATH": code} if code else {}
                got = one_run(Path(tmp) / f"run-{run}-{n}", args.nodes, env)
                for kind, values in got.items():
                    figures.setdefault((kind, code or "installed"), []).extend(values)
    for (kind, code), values in sorted(figures.items()):
        print(
            f"{kind:8} {code:40} median {statistics.median(values):7.0f} ms CPU to serving"
            f"  (min {min(values):.0f}, max {max(values):.0f}, {len(values)} processes)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
