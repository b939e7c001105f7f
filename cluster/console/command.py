"""`quorumgate console --dir D --principal SEALED_KEYFILE [--listen 127.0.0.1:PORT]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, load_cluster
from quorumgate.proto.sealedkey import is_sealed_file, read_sealed

EXTRA_HINT = "the console needs the console extra: pip install 'quorumgate[console]'"


def run_console(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from quorumgate.console.app import Console
    except ImportError:
        sys.stderr.write(EXTRA_HINT + "\n")
        return 2
    host, _, port = args.listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not port.isdigit() or not host:
        sys.stderr.write("quorumgate: --listen takes HOST:PORT\n")
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.stderr.write("quorumgate: the console answers for a principal: loopback only\n")
        return 2
    path = Path(args.principal)
    try:
        spec = load_cluster(Path(args.dir))
        if not is_sealed_file(path):
            raise ClusterFileError(
                f"{path} is not a sealed key file: the console unlocks a principal's key "
                f"with its passphrase (seal it with `quorumgate passphrase --key {path}`)"
            )
        sealed = read_sealed(path)
    except ClusterFileError as err:
        sys.stderr.write(f"quorumgate: {err}\n")
        return 2
    console = Console(spec, sealed, (host, int(port)))
    print(f"quorumgate console on http://{args.listen}/ (locked; Ctrl-C stops)", flush=True)
    uvicorn.run(console.app(), host=host, port=int(port), log_level="warning", access_log=False)
    return 0


def add_console_command(sub: Any) -> None:
    console = sub.add_parser("console", help="the principal's approvals console (a web page)")
    console.add_argument("--dir", required=True, help="the cluster directory")
    console.add_argument(
        "--principal", required=True, metavar="KEYFILE", help="the principal's sealed key file"
    )
    console.add_argument("--listen", default="127.0.0.1:8788", metavar="HOST:PORT")
    console.set_defaults(func=run_console)
