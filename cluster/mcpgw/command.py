"""`quorumgate mcp-gateway` and `quorumgate mcp-pin` (`docs/mcp-gateway.md`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, load_cluster

EXTRA_HINT = "the MCP gateway needs the mcp extra: pip install 'quorumgate[mcp]'"


def _load(args: argparse.Namespace) -> tuple[Any, Any] | None:
    try:
        from quorumgate.mcpgw.gateway import GatewayConfigError, load_gateway_config
    except ImportError:
        sys.stderr.write(EXTRA_HINT + "\n")
        return None
    try:
        return load_gateway_config(args.config), load_cluster(Path(args.dir))
    except (GatewayConfigError, ClusterFileError) as err:
        sys.stderr.write(f"quorumgate: {err}\n")
        return None


def run_gateway(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if loaded is None:
        return 2
    config, spec = loaded
    from quorumgate.mcpgw.gateway import Gateway, run_until_cancelled, serve_http, serve_stdio

    gateway = Gateway(config, spec, args.agent, wait_for_approval_s=args.wait_for_approval)
    if args.metrics and not _serve_metrics(gateway, args.metrics):
        return 2
    if args.http:
        host, _, port = args.http.rpartition(":")
        if not port.isdigit():
            sys.stderr.write("quorumgate: --http takes HOST:PORT\n")
            return 2
        sys.stderr.write(f"quorumgate mcp-gateway on http://{host}:{port}/mcp\n")
        run_until_cancelled(serve_http(gateway, host or "127.0.0.1", int(port)))
    else:
        run_until_cancelled(serve_stdio(gateway))
    return 0


def _serve_metrics(gateway: Any, where: str) -> bool:
    """Prometheus text on http://HOST:PORT/ (a thread of prometheus_client's own)."""
    from prometheus_client import start_http_server

    host, _, port = where.rpartition(":")
    if not port.isdigit():
        sys.stderr.write("quorumgate: --metrics takes HOST:PORT\n")
        return False
    start_http_server(int(port), addr=host or "127.0.0.1", registry=gateway.metrics.registry)
    return True


def run_pin(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if loaded is None:
        return 2
    config, spec = loaded
    from quorumgate.mcpgw.gateway import pin

    for line in asyncio.run(pin(config, spec, check=args.check)):
        print(line)
    return 0


def add_mcp_commands(sub: Any) -> None:
    gateway = sub.add_parser(
        "mcp-gateway", help="an MCP server in front of MCP servers, its calls judged by the cluster"
    )
    gateway.add_argument("--dir", required=True, help="the cluster directory")
    gateway.add_argument("--agent", required=True, help="the agent id the gateway acts as")
    gateway.add_argument("--config", required=True, metavar="FILE")
    gateway.add_argument(
        "--http", metavar="HOST:PORT", help="serve Streamable HTTP (default stdio)"
    )
    gateway.add_argument(
        "--wait-for-approval",
        type=float,
        default=0.0,
        metavar="S",
        help="wait this long for the principal's answer to a pending call",
    )
    gateway.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics (tools hidden, ...)"
    )
    gateway.set_defaults(func=run_gateway)
    pin = sub.add_parser(
        "mcp-pin", help="owner: pin each mapped MCP tool's current definition in the log"
    )
    pin.add_argument("--dir", required=True)
    pin.add_argument("--config", required=True, metavar="FILE")
    pin.add_argument("--check", action="store_true", help="only report what changed")
    pin.set_defaults(func=run_pin)
