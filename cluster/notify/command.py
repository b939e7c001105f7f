"""`quorumgate notify --dir D --config FILE [--metrics-port N]` (docs/notifications.md)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, load_cluster, read_seed

EXIT_USAGE = 2


async def _notify(args: argparse.Namespace) -> int:
    from nacl.signing import SigningKey
    from prometheus_client import start_http_server

    from quorumgate.notify.config import load_config
    from quorumgate.notify.notifier import Notifier
    from quorumgate.sdk.client import Client

    directory = Path(args.dir)
    config = load_config(Path(args.config), directory)
    spec = load_cluster(directory)
    client = Client(spec, SigningKey(read_seed(config.reader_key)))
    notifier = Notifier(spec, client, config)
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=notifier.metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"quorumgate notify: {len(config.routes)} principals (Ctrl-C stops)", flush=True)
    try:
        await notifier.run(stop)
    finally:
        await client.close()
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    from quorumgate.notify.config import NotifyConfigError

    try:
        return asyncio.run(_notify(args))
    except (ClusterFileError, NotifyConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


def add_notify_command(sub: Any) -> None:
    notify = sub.add_parser(
        "notify", help="send open confirmation cards to their principals (docs/notifications.md)"
    )
    notify.add_argument("--dir", required=True, help="the cluster directory")
    notify.add_argument("--config", required=True, help="the notifier's TOML file")
    notify.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on loopback")
    notify.set_defaults(func=cmd_notify)
