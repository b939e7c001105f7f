"""Before/after figures of one change, from interleaved runs.

    python scripts/bench_ab.py BEFORE AFTER [--runs 3] -- BENCH ARGS...
    python scripts/bench_ab.py HEAD~1 HEAD --runs 3 -- --start --breakdown --calls 100
    python scripts/bench_ab.py HEAD HEAD --after-args "--nodes 7" -- --start --nodes 4

The second form compares two settings of one revision: `--after-args` is appended to the
AFTER side's bench arguments (a later option wins over an earlier one of the same name).

Each revision is checked out in its own git worktree, and each run imports that
worktree's code: a directory per revision holds a `quorumgate` package made of links to the
worktree's folders, laid out as its pyproject.toml maps them (`scripts/layout.py`), put
first on PYTHONPATH, ahead of the editable install. Runs
alternate in ABBA order (BEFORE AFTER, AFTER BEFORE, ...) so the machine's noise and any
drift fall on both. Every run's
JSON report is kept in the output directory; the medians are printed side by side (for
`--breakdown`, per stage; otherwise the headline figures)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from layout import link_tree  # scripts/layout.py, beside this file

ROOT = Path(__file__).resolve().parents[1]


def worktree(rev: str, into: Path, label: str = "") -> Path:
    """A detached worktree of `rev` under `into`; `label` tells two of one revision apart."""
    path = into / f"wt-{label}{rev.replace('/', '_').replace('~', '_')}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(path), rev],
                   check=True, capture_output=True)  # fmt: skip
    return path


def shim(tree: Path, into: Path) -> Path:
    """A directory whose `quorumgate` package is the worktree's code, laid out as installed
    (by the worktree's own pyproject.toml mapping)."""
    return link_tree(into / f"shim-{tree.name}", tree)


def run(top: Path, tree: Path, bench_args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(top)}
    out = subprocess.run(
        [sys.executable, "-m", "quorumgate.cli", "bench", *bench_args, "--json"],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def headline(report: dict[str, Any]) -> dict[str, float]:
    if "large_over_fresh_p50" in report:  # --breakdown --state large: both sides' call p50
        total = "submit -> certificate (total)"
        out = {
            f"{name}: call p50": next(
                r["p50_ms"] for r in report[name]["stages"] if r["stage"] == total
            )
            for name in ("fresh", "large state")
        }
        return {**out, "large / fresh": report["large_over_fresh_p50"]}
    if "stages" in report:
        return {row["stage"]: row["p50_ms"] for row in report["stages"]}
    keys = ("certified_per_s", "cert_p50_ms", "cert_p99_ms", "throughput_per_s", "p50_ms",
            "cpu_s_per_proposal", "block_txs_mean")  # fmt: skip
    out = {k: report[k] for k in keys if isinstance(report.get(k), int | float)}
    # the CPU by kind of process (replicas, sidecars): machine time per proposal, which a
    # busy machine disturbs far less than the rates and latencies
    for kind, value in (report.get("cpu_s_per_proposal_by_kind") or {}).items():
        if isinstance(value, int | float):
            out[f"cpu_s_per_proposal_{kind}"] = value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", help="where the per-run reports go (default: a temp dir)")
    parser.add_argument("--after-args", default="",
                        help="bench arguments added on the AFTER side only")  # fmt: skip
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    bench_args = argv[cut + 1 :]  # after "--": quorumgate bench's own arguments
    side_args = {"before": bench_args, "after": [*bench_args, *shlex.split(args.after_args)]}
    work = Path(tempfile.mkdtemp(prefix="qg-ab-"))
    out = Path(args.out) if args.out else work
    out.mkdir(parents=True, exist_ok=True)
    sides = (("before", args.before), ("after", args.after))
    trees = {label: worktree(rev, work, label) for label, rev in sides}
    shims = {label: shim(tree, work) for label, tree in trees.items()}
    figures: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    try:
        for k in range(args.runs):
            # ABBA: the order flips every run, so a drift over time (or a first-run effect)
            # falls on both sides alike
            order = ("before", "after") if k % 2 == 0 else ("after", "before")
            for label in order:
                report = run(shims[label], trees[label], side_args[label])
                (out / f"{label}-{k + 1}.json").write_text(json.dumps(report, indent=2))
                figures[label].append(headline(report))
                print(f"run {k + 1} {label}: {figures[label][-1]}", file=sys.stderr, flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)  # fmt: skip
    names = list(figures["before"][0])
    print(
        f"{'figure':45s} {'before':>10s} {'after':>10s} {'after/before':>13s} {'pair ratios':>12s}"
    )
    for name in names:
        b = statistics.median(f[name] for f in figures["before"] if name in f)
        a = statistics.median(f[name] for f in figures["after"] if name in f)
        ratio = f"{a / b:.3f}x" if b else "-"
        # each run's pair (run k's after over run k's before), taken within the pair before
        # the median, so a drift between pairs cancels (docs/benchmarks.md, "Method")
        pairs = [fa[name] / fb[name] for fa, fb in zip(figures["after"], figures["before"],
                                                      strict=True)
                 if fb.get(name) and name in fa]  # fmt: skip
        paired = f"{statistics.median(pairs):.3f}x" if pairs else "-"
        print(f"{name:45s} {b:10.4g} {a:10.4g} {ratio:>13s} {paired:>12s}")
    print(f"(medians of {args.runs} interleaved runs each; reports in {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
