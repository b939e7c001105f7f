"""`quorumgate proxy --dir D --listen HOST:PORT --upstream URL --agents FILE` (docs/proxy.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, load_cluster
from quorumgate.proxy.config import ProxyConfigError, load_config

EXTRA_HINT = "quorumgate proxy needs the proxy extra: pip install 'quorumgate[proxy]'"


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError("--listen takes HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_proxy(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from quorumgate.proxy.app import Proxy
        from quorumgate.proxy.enforce import DenialBlock
    except ImportError:
        sys.stderr.write(EXTRA_HINT + "\n")
        return 2
    try:
        config = load_config(args.agents)
        spec = load_cluster(Path(args.dir))
        host, port = _listen(args.listen)
    except (ProxyConfigError, ClusterFileError, argparse.ArgumentTypeError) as err:
        sys.stderr.write(f"quorumgate: {err}\n")
        return 2
    for agent in config.agents.values():
        if not agent.key_file.is_file():
            sys.stderr.write(f"quorumgate: agents.{agent.agent_id}.key_file: no such file\n")
            return 2
    proxy = Proxy(config, spec, args.upstream, DenialBlock(args.denial_block))
    print(
        f"quorumgate proxy on http://{host}:{port} -> {args.upstream} "
        f"({len(config.agents)} agents; metrics at /-/metrics)",
        flush=True,
    )
    uvicorn.run(proxy.app(), host=host, port=port, log_level="warning", access_log=False)
    return 0


def add_proxy_command(sub: Any) -> None:
    proxy = sub.add_parser(
        "proxy", help="govern an agent at its model API (Anthropic Messages, OpenAI Chat)"
    )
    proxy.add_argument("--dir", required=True, help="the cluster directory")
    proxy.add_argument("--listen", default="127.0.0.1:8787", metavar="HOST:PORT")
    proxy.add_argument("--upstream", required=True, help="the model API's base URL")
    proxy.add_argument("--agents", required=True, metavar="FILE", help="the agents file (TOML)")
    proxy.add_argument(
        "--denial-block",
        choices=["tool_result", "text"],
        default="tool_result",
        help="what replaces a withheld Anthropic tool_use block (text: for strict SDKs)",
    )
    proxy.set_defaults(func=run_proxy)
