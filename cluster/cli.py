"""The `quorumgate` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_simulate(args: argparse.Namespace) -> int:
    """Run one simulated cluster and print what it committed."""
    from cluster.sim import SimOptions, Simulation, SimulationFailure

    options = SimOptions(
        seed=args.seed,
        n=args.nodes,
        ticks=args.ticks,
        fast_crypto=False,
        byzantine=tuple(args.byzantine),
        loss_permille=args.loss_permille,
    )
    sim = Simulation(options)
    try:
        result = sim.run()
    except SimulationFailure as failure:
        print(f"simulation failed: {failure}", file=sys.stderr)
        return 1
    node = sim.nodes[sim.honest[0]][0]
    committed = node.disk.committed
    if args.json:
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "byzantine": {str(k): v for k, v in sim.byzantine.items()},
                    "committed_height": {str(k): v for k, v in result.committed_heights.items()},
                    "views": {str(k): v for k, v in result.views.items()},
                    "transactions_committed": sum(len(b.payload) for b in committed),
                    "messages": result.messages,
                    "dropped": dict(result.dropped),
                }
            )
        )
        return 0
    print(
        f"Simulated {args.nodes} replicas for {result.ticks} ticks "
        f"(Byzantine: {sim.byzantine or 'none'}), real Ed25519 votes."
    )
    print(f"{'height':>7} {'view':>6} {'proposer':>8} {'txs':>4}  block")
    for block in committed[-args.show :]:
        print(
            f"{block.height:>7} {block.view:>6} {block.proposer:>8} {len(block.payload):>4}  "
            f"{block.hash.hex()[:16]}"
        )
    heights = result.committed_heights
    print(
        f"Every honest replica committed the same chain: heights {heights}; "
        f"{sum(len(b.payload) for b in committed)} transactions; "
        f"{result.messages} messages; dropped {dict(result.dropped) or 'none'}."
    )
    return 0


def _cmd_policy_test(args: argparse.Namespace) -> int:
    from sidecar.policykit import run_policy_test

    return run_policy_test(args.file, json_output=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quorumgate",
        description="QuorumGate: a Byzantine-fault-tolerant judge for AI-agent tool calls.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate", help="run a simulated cluster of consensus cores and print its chain"
    )
    sim.add_argument("--nodes", type=int, default=4)
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--ticks", type=int, default=600)
    sim.add_argument("--byzantine", nargs="*", default=[], help="behaviours, at most f")
    sim.add_argument("--loss-permille", type=int, default=0)
    sim.add_argument("--show", type=int, default=10, help="last N committed blocks to print")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=_cmd_simulate)

    demo = sub.add_parser("demo", help="the main job (for now: a simulated 4-node cluster)")
    demo.add_argument("--nodes", type=int, default=4)
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--ticks", type=int, default=600)
    demo.add_argument("--byzantine", nargs="*", default=["equivocate"])
    demo.add_argument("--loss-permille", type=int, default=50)
    demo.add_argument("--show", type=int, default=10)
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_cmd_simulate)

    policy = sub.add_parser("policy", help="operator policy tools")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    ptest = policy_sub.add_parser("test", help="check a policy file's expected verdicts")
    ptest.add_argument("file")
    ptest.add_argument("--json", action="store_true")
    ptest.set_defaults(func=_cmd_policy_test)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
