#!/usr/bin/env python3
"""Fuzz the proxy's door against the official SDKs' parsers (tests/proxy/difffuzz.py).

    python scripts/fuzz_proxy.py --cases 100000 --first-seed 1 [--jobs 2]

Each case is one seed: a generated upstream answer, judged by the proxy and read by the
SDK (anthropic, openai Chat Completions, openai Responses; streamed and not). Prints the
cases run, the seconds, the cases per API and how often the proxy refused, and every
finding with the seed that reproduces it (`--seed N --show` prints that case). Exit 1 if
any case has a finding.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ is not installed


def _slice(bounds: tuple[int, int]) -> tuple[dict[int, list[str]], Counter[str]]:
    warnings.simplefilter("ignore")  # the SDKs warn about the shapes the fuzzer makes
    logging.disable(logging.WARNING)
    from tests.proxy.difffuzz import check, generate, judge

    findings: dict[int, list[str]] = {}
    kinds: Counter[str] = Counter()
    for seed in range(*bounds):
        case = generate(seed)
        kinds[f"{case.api} {'stream' if case.stream else 'whole'}"] += 1
        found = check(case)
        if found:
            findings[seed] = found
        if asyncio.run(judge(case)).refused:
            kinds["refused"] += 1
    return findings, kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--show", type=int, metavar="SEED", help="print one case and stop")
    args = parser.parse_args()
    if args.show is not None:
        from tests.proxy.difffuzz import check, generate

        case = generate(args.show)
        print(case.api, "stream" if case.stream else "whole", case.status, case.headers)
        print(repr(b"".join(case.chunks)))
        print(check(case))
        return 0
    started = time.perf_counter()
    step = -(-args.cases // args.jobs)
    bounds = [(s, min(s + step, args.first_seed + args.cases))
              for s in range(args.first_seed, args.first_seed + args.cases, step)]  # fmt: skip
    findings: dict[int, list[str]] = {}
    kinds: Counter[str] = Counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        for found, counted in pool.map(_slice, bounds):
            findings.update(found)
            kinds.update(counted)
    seconds = time.perf_counter() - started
    counts = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    last = args.first_seed + args.cases - 1
    print(f"{args.cases} cases (seeds {args.first_seed}..{last}) in {seconds:.0f} s: {counts}")
    for seed, found in sorted(findings.items()):
        print(f"FINDING seed={seed}: " + "; ".join(found))
    print(f"{len(findings)} cases with findings")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
