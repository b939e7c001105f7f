"""`quorumgate console --dir D --principal KEYFILE [--listen 127.0.0.1:PORT]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, load_cluster, read_seed

EXTRA_HINT = "the console needs the console extra: pip install 'quorumgate[console]'"


def run_console(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from nacl.signing import SigningKey

        from quorumgate.console.app import Console
    except ImportError:
        sys.stderr.write(EXTRA_HINT + "\n")
        return 2
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit() or not host:
        sys.stderr.write("quorumgate: --listen takes HOST:PORT\n")
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.stderr.write("quorumgate: the console holds a principal's key: loopback only\n")
        return 2
    try:
        spec = load_cluster(Path(args.dir))
        key = SigningKey(read_seed(Path(args.principal)))
    except ClusterFileError as err:
        sys.stderr.write(f"quorumgate: {err}\n")
        return 2
    console = Console(spec, key, (host, int(port)))
    print(f"quorumgate console on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    uvicorn.run(console.app(), host=host, port=int(port), log_level="warning", access_log=False)
    return 0


def add_console_command(sub: Any) -> None:
    console = sub.add_parser("console", help="the principal's approvals console (a web page)")
    console.add_argument("--dir", required=True, help="the cluster directory")
    console.add_argument("--principal", required=True, metavar="KEYFILE")
    console.add_argument("--listen", default="127.0.0.1:8788", metavar="HOST:PORT")
    console.set_defaults(func=run_console)
