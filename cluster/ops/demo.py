"""The main job: a real local cluster, the multi-agent example through it, a live status
(`--vendored`: the variant with an unmodified agent governed by the proxy).

Starts every replica and sidecar of the cluster as its own process, runs the orchestrator
example (cluster/examples/multi_agent.py), prints each certified verdict with the sidecars
that signed it, checks that every replica holds the same chain, then keeps a live status
table until Ctrl-C (or stops at once with `--once`).
"""

from __future__ import annotations

import logging
import sys
import time

from quorumgate.examples.multi_agent import ExampleReport, run_example
from quorumgate.ops.nodes import query_status, start_cluster, stop_nodes
from quorumgate.ops.output import status_table, table
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.owner import owner_reader


def _status_lines(spec: ClusterSpec) -> str:
    return status_table([query_status(spec, i) for i in range(spec.n)])


def _print_report(report: ExampleReport) -> None:
    print()
    print("Certified verdicts (each signed by the sidecars listed; f+1 make a certificate):")
    print(
        table(
            ["agent", "tool", "target", "verdict", "reason (operator)", "height", "certified by"],
            [
                [s.agent, s.tool, s.target, s.outcome, s.reason, s.height,
                 "sidecars " + ",".join(map(str, s.signers))]
                for s in report.steps
            ],
        )
    )  # fmt: skip
    print()
    print("What the agents were told on refusal:", " | ".join(report.said_to_agent) or "-")
    payments = [f"#{pid} {amount} to {payee}, card ...{last4}" for pid, payee, amount, last4
                in report.payments]  # fmt: skip
    print("Payment ledger (SQLite):", ", ".join(payments) or "-")


def _same_chain(spec: ClusterSpec) -> tuple[int, int]:
    """(height, number of distinct block hashes at it across replicas)."""
    height = min(query_status(spec, i).height or 0 for i in range(spec.n))
    hashes = set()
    for m in spec.members:
        with sync_channel(spec, m.index, reader=owner_reader(spec)) as channel:
            stub = cpb_grpc.ReplicaStub(channel)
            for block in stub.CommittedBlocks(cpb.BlocksRequest(from_height=height), timeout=5):
                hashes.add(block.hash)
                break
    return height, len(hashes)


def run_demo(spec: ClusterSpec, *, once: bool, refresh_s: float, vendored: bool = False) -> int:
    indexes = list(range(spec.n))
    # The client library logs denials with their reasons for operators: into a file here,
    # so the console shows what the agents saw.
    handler = logging.FileHandler(spec.directory / "example.log")
    handler.setFormatter(logging.Formatter("%(asctime)s level=%(levelname)s %(message)s"))
    client_log = logging.getLogger("quorumgate")
    client_log.addHandler(handler)
    client_log.propagate = False
    print(f"Starting {spec.n} replicas and {spec.n} sidecars on loopback (f={spec.f})...")
    procs = start_cluster(spec, indexes)
    try:
        print(f"Serving; logs and databases in {spec.directory}/node-*/")
        started = time.perf_counter()
        if vendored:
            # the variant with an agent whose code we do not own, governed at its model API
            from quorumgate.examples.vendored_agent import run_vendored

            run_vendored(spec, say=lambda line: print(line, flush=True))
        else:
            _print_report(run_example(spec, say=lambda line: print(line, flush=True)))
        height, distinct = _same_chain(spec)
        verdict = "the same block" if distinct == 1 else f"{distinct} DIFFERENT blocks"
        print(f"\nAt height {height} every replica holds {verdict}. "
              f"The example took {time.perf_counter() - started:.1f} s.")  # fmt: skip
        print(_status_lines(spec))
        if once:
            return 0 if distinct == 1 else 1
        print("Live status below; Ctrl-C stops the cluster.")
        while True:
            time.sleep(refresh_s)
            if sys.stdout.isatty():
                print("\x1b[2J\x1b[H" + f"QuorumGate {spec.chain_id} (Ctrl-C stops)")
            print(_status_lines(spec), flush=True)
    except KeyboardInterrupt:
        print("\nstopping...")
        return 0
    finally:
        stop_nodes(spec, indexes)
        for proc in procs:
            proc.wait()
