"""Time to the first text byte through the enforcing proxy, against the same stream direct
(docs/proxy.md, "Latency", has the figures).

    python scripts/bench_proxy.py [--requests 200] [--runs 3]

A scripted upstream streams an Anthropic message of text; each request alternates direct
and through the proxy (same process, same moment, so the machine's noise hits both), and
the time from sending the request to the first `text_delta` byte is taken. Text never waits
for the cluster, so the cluster directory here is initialized but not started. Prints the
p50 / p90 of each per run, the median of the runs, and the difference and ratio."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import init_cluster, write_seed
from quorumgate.proxy.app import Proxy
from quorumgate.proxy.config import load_config
from quorumgate.proxy.fake import FakeUpstream, Reply, ServerThread, anthropic_stream, text

BODY = {
    "model": "claude-test",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "Say something."}],
}
REPLY_TEXT = "Here is a short answer that streams in two deltas."


async def first_text_byte(client: httpx.AsyncClient, url: str) -> float:
    started = time.perf_counter()
    elapsed = None
    async with client.stream("POST", url + "/v1/messages", json=BODY) as response:
        async for chunk in response.aiter_bytes():  # read to the end: the connection is reused
            if elapsed is None and b"text_delta" in chunk:
                elapsed = time.perf_counter() - started
    if elapsed is None:
        raise RuntimeError("no text in the stream")
    return elapsed


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_run(
    upstream: FakeUpstream, direct: str, proxied: str, n: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"direct": [], "proxy": []}
    headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as client:
        for k in range(n + 10):
            for name, url in (("direct", direct), ("proxy", proxied)):
                upstream.script.append(Reply(frames=anthropic_stream(text(REPLY_TEXT))))
                elapsed = await first_text_byte(client, url)
                if k >= 10:  # the first requests warm connections and caches
                    times[name].append(elapsed * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per path and run")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = init_cluster(Path(tmp) / "cluster", 4)
        write_seed(Path(tmp) / "bench.key", bytes(SigningKey.generate()))
        (Path(tmp) / "agents.toml").write_text('[agents.bench]\nkey_file = "bench.key"\n')
        upstream = FakeUpstream()
        with ServerThread(upstream.app()) as up:
            proxy = Proxy(load_config(Path(tmp) / "agents.toml"), spec, up.url)
            with ServerThread(proxy.app()) as px:
                p50s: dict[str, list[float]] = {"direct": [], "proxy": []}
                for run in range(args.runs):
                    times = asyncio.run(one_run(upstream, up.url, px.url, args.requests))
                    for name, values in times.items():
                        p50s[name].append(quantile(values, 0.5))
                        print(
                            f"run {run + 1}: {name:6s} first text byte p50 "
                            f"{quantile(values, 0.5):6.2f} ms  p90 {quantile(values, 0.9):6.2f} ms"
                        )
    direct = statistics.median(p50s["direct"])
    proxied = statistics.median(p50s["proxy"])
    print(
        f"median of {args.runs} runs: direct {direct:.2f} ms, through the proxy {proxied:.2f} ms; "
        f"the proxy adds {proxied - direct:.2f} ms at p50 ({proxied / direct:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
