"""`quorumgate bench`: the points of a sweep, each run `runs` times, with the baselines run
on the same load between QuorumGate's runs; the report, its text form and its plot."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quorumgate.bench.agents import AGENT_POOL_DEFAULT
from quorumgate.bench.baselines import available_baselines, measure_baseline, median_baseline
from quorumgate.bench.harness import (
    PRESIGN_RATE_GUESS_PER_S,
    agent_nonces,
    check_serving,
    open_cluster,
    run_once,
    sweep_options,
)
from quorumgate.bench.load import RunOptions
from quorumgate.bench.report import (
    _r,
    machine_info,
    median_or_none,
    median_report,
    proposal_bytes,
)
from quorumgate.bench.stopping import BenchError, stop_signals_handled
from quorumgate.ops.loadgen import TX_BYTES_TARGET


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """What `quorumgate bench` was asked for."""

    directory: Path | None
    start_nodes: int | None  # --start: init and start a temporary cluster of this size
    base: RunOptions
    sweep: tuple[float, ...] = ()
    runs: int = 1
    agents: int = AGENT_POOL_DEFAULT
    baselines: bool = False

    def __post_init__(self) -> None:
        if (self.directory is None) == (self.start_nodes is None):
            raise ValueError("either a cluster directory or a size to start")
        if self.start_nodes is not None and (self.start_nodes < 4 or self.start_nodes % 3 != 1):
            raise ValueError("--nodes must be 3f+1 (4, 7, ...)")
        if self.runs < 1 or self.base.clients < 1:
            raise ValueError("at least one run and one client")


def _headline(report: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(throughput, p50, p99) QuorumGate is compared on: certified in full mode, committed
    in ordering-only mode."""
    if report.get("certified_per_s") is not None:
        return report["certified_per_s"], report["cert_p50_ms"], report["cert_p99_ms"]
    return report["throughput_per_s"], report["p50_ms"], report["p99_ms"]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def bench_command(
    request: BenchRequest, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Measure every point of the request (`runs` times each); with baselines, each run of
    QuorumGate is followed by one run of every baseline with the same load, and ratios are
    taken run by run before their median (this machine is shared: same-run ratios). A
    SIGINT or SIGTERM raises `BenchInterrupted` once what was started is stopped."""
    with stop_signals_handled():
        return _bench_command(request, progress)


def _bench_command(request: BenchRequest, progress: Callable[[str], None]) -> dict[str, Any]:
    base = request.base
    points = sweep_options(base, request.sweep) if request.sweep else [base]
    baselines, notes = available_baselines() if request.baselines else ([], [])
    machine = machine_info()
    point_reports: list[dict[str, Any]] = []
    with open_cluster(request.directory, request.start_nodes, base.ordering_only) as cluster:
        spec = cluster.spec
        check_serving(spec, not base.ordering_only)
        progress(f"cluster: {spec.n} replicas in {spec.directory}")
        clients_max = max(p.clients for p in points)
        nonces = agent_nonces(spec, replace(base, clients=clients_max), request.agents)
        guess = PRESIGN_RATE_GUESS_PER_S
        for options in points:
            qg_runs: list[dict[str, Any]] = []
            b_runs: dict[str, list[dict[str, Any]]] = {b.key: [] for b in baselines}
            ratios: dict[str, list[tuple[float | None, ...]]] = {b.key: [] for b in baselines}
            what = (
                f"rate {options.rate_per_s:g}/s"
                if options.rate_per_s > 0
                else f"inflight {options.inflight}"
            )
            for run in range(request.runs):
                report = run_once(spec, options, nonces, rate_guess_per_s=guess)
                guess = max(100.0, report["throughput_per_s"])
                qg_runs.append(report)
                tput, p50, p99 = _headline(report)
                progress(
                    f"{what} run {run + 1}/{request.runs}: QuorumGate {tput}/s "
                    f"p50 {p50} ms p99 {p99} ms"
                )
                for b in baselines:
                    measured = measure_baseline(b, options)
                    b_runs[b.key].append(measured)
                    ratios[b.key].append(
                        (
                            _ratio(tput, measured["throughput_per_s"]),
                            _ratio(p50, measured["p50_ms"]),
                            _ratio(p99, measured["p99_ms"]),
                        )
                    )
                    progress(
                        f"{what} run {run + 1}/{request.runs}: {b.label} "
                        f"{measured['throughput_per_s']}/s p50 {measured['p50_ms']} ms"
                    )
            point = median_report(qg_runs)
            if baselines:
                point["baselines"] = {k: median_baseline(v) for k, v in b_runs.items()}
                point["ratios"] = {
                    k: {
                        "throughput": _r(median_or_none([x[0] for x in v]), 3),
                        "p50": _r(median_or_none([x[1] for x in v]), 3),
                        "p99": _r(median_or_none([x[2] for x in v]), 3),
                    }
                    for k, v in ratios.items()
                }
            point_reports.append(point)
        report = dict(point_reports[-1])
        report["proposal_bytes"] = proposal_bytes(spec.chain_id)
        report["started_cluster"] = cluster.started
    if request.sweep:
        report["sweep"] = list(request.sweep)
        report["points"] = point_reports
    if request.baselines:
        report["baseline_notes"] = notes
    report["machine"] = machine
    return report


def format_report(report: dict[str, Any]) -> str:
    """The human-readable form of a `bench_command` report."""
    points = report.get("points") or [report]
    full = report["mode"] == "full"
    lines = [
        f"QuorumGate bench: {report['nodes']} replicas, "
        + ("full mode (verified f+1 certificates)" if full else "ordering only (committed)")
        + f", {report['load']} loop, {report['clients']} client processes, "
        f"{report['runs']} run(s) of {report['seconds']:g} s each (medians), "
        f"{report.get('proposal_bytes', TX_BYTES_TARGET)}-byte proposals",
    ]
    header = ["load", "committed/s", "commit p50/p99 ms"]
    if full:
        header += ["certified/s", "cert p50/p99 ms"]
    header += ["cpu ms/proposal", "cores busy", "rss max MB", "txs/block"]
    rows = []
    for p in points:
        row = [_load_label(p), p["throughput_per_s"], f"{p['p50_ms']}/{p['p99_ms']}"]
        if full:
            row += [p["certified_per_s"], f"{p['cert_p50_ms']}/{p['cert_p99_ms']}"]
        cpu = p["cpu_s_per_proposal"]
        row += [
            None if cpu is None else round(cpu * 1000, 3),
            p["cpu_cores_busy"],
            p["rss_peak_mb"]["max"],
            p["block_txs_mean"],
        ]
        rows.append(row)
    lines.append(_table(header, rows))
    if any(p.get("baselines") for p in points):
        lines.append("")
        lines.append(
            "Baselines, measured in the same runs (4 nodes, 256-byte requests, same load);"
            " ratio = QuorumGate / baseline:"
        )
        lines.append(_baselines_table(points))
    for note in report.get("baseline_notes", []):
        lines.append(f"note: {note}")
    extra = {k: report[k] for k in ("refused", "outcomes") if report.get(k)}
    if report.get("shed") or report.get("unfinished"):
        extra["shed"], extra["unfinished"] = report["shed"], report["unfinished"]
    if extra:
        lines.append(f"last point: {extra}")
    return "\n".join(lines)


def _load_label(point: dict[str, Any]) -> str:
    if point["load"] == "open":
        return f"rate {point['rate_offered_per_s']:g}/s"
    return f"W={point['inflight']}"


def _baselines_table(points: Sequence[dict[str, Any]]) -> str:
    """Each baseline of each point beside QuorumGate's figures at the same load."""
    rows = []
    for p in points:
        for key, b in p.get("baselines", {}).items():
            ratio = p["ratios"][key]
            cpu = b["cpu_s_per_request"]
            rows.append(
                [
                    _load_label(p),
                    b["label"],
                    b["throughput_per_s"],
                    f"{b['p50_ms']}/{b['p99_ms']}",
                    None if cpu is None else round(cpu * 1000, 3),
                    ratio["throughput"],
                    ratio["p50"],
                    ratio["p99"],
                ]
            )
    headers = [
        "load",
        "system",
        "req/s",
        "p50/p99 ms",
        "cpu ms/req",
        "ratio tput",
        "ratio p50",
        "ratio p99",
    ]
    return _table(headers, rows)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(out)


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Throughput (x) against latency p50 and p99 (y, log) for every point of a sweep:
    QuorumGate's certificates and commits, and each baseline."""
    try:
        import matplotlib
    except ImportError as err:
        raise BenchError("--plot needs matplotlib: pip install 'quorumgate[bench]'") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report.get("points") or [report]
    series: dict[str, list[tuple[float, float | None, float | None]]] = {}

    def add(name: str, x: float | None, p50: float | None, p99: float | None) -> None:
        if x is not None and x > 0:
            series.setdefault(name, []).append((x, p50, p99))

    for p in points:
        if p.get("certified_per_s") is not None:
            add("QuorumGate certificate", p["certified_per_s"], p["cert_p50_ms"], p["cert_p99_ms"])
        add("QuorumGate commit", p["throughput_per_s"], p["p50_ms"], p["p99_ms"])
        for b in p.get("baselines", {}).values():
            add(b["label"], b["throughput_per_s"], b["p50_ms"], b["p99_ms"])
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, (name, pts) in enumerate(series.items()):
        color = f"C{i}"
        xs = [x for x, _, _ in pts]
        p50s = [math.nan if p50 is None else p50 for _, p50, _ in pts]
        p99s = [math.nan if p99 is None else p99 for _, _, p99 in pts]
        ax.plot(xs, p50s, "o-", color=color, label=f"{name} p50")
        ax.plot(xs, p99s, "x--", color=color, alpha=0.6, label=f"{name} p99")
    load = "offered rate" if report["load"] == "open" else "in-flight window"
    sweep = ",".join(f"{v:g}" for v in report.get("sweep", []))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (proposals or requests per second)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(
        f"{report['nodes']} nodes, {report['mode']}, sweep of the {load} ({sweep or 'one point'}); "
        f"medians of {report['runs']} run(s)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
