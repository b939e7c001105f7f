"""The `quorumgate ship` and `quorumgate audit verify` commands (docs/audit.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterFileError, load_cluster, read_seed

EXIT_USAGE = 2
NEEDS_EXTRA = "the audit copy needs PostgreSQL's driver: pip install 'quorumgate[audit]'"


def _has_driver() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print(f"error: {NEEDS_EXTRA}", file=sys.stderr)
        return False
    return True


def _key_file(args: argparse.Namespace, directory: Path) -> Path:
    return Path(args.key) if args.key else directory / OWNER_KEY_FILE


async def _ship(args: argparse.Namespace) -> int:
    from nacl.signing import SigningKey
    from prometheus_client import start_http_server

    from quorumgate.audit.shipper import ShipOptions, Shipper
    from quorumgate.sdk.delivery import Channels

    directory = Path(args.dir)
    spec = load_cluster(directory)
    key = SigningKey(read_seed(_key_file(args, directory)))
    channels = Channels(spec)
    shipper = Shipper(spec, key, channels.sidecars, ShipOptions(dsn=args.dsn))
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=shipper.metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.once:
            total = 0
            while shipped := await shipper.ship_once():
                total += shipped
            print(f"shipped {total} verdicts", flush=True)
        else:
            await shipper.run(stop)
    finally:
        shipper.close()
        await channels.close()
    return 0


def cmd_ship(args: argparse.Namespace) -> int:
    if not _has_driver():
        return EXIT_USAGE
    try:
        return asyncio.run(_ship(args))
    except ClusterFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


def cmd_audit_verify(args: argparse.Namespace) -> int:
    if not _has_driver():
        return EXIT_USAGE
    import psycopg

    from quorumgate.audit.verify import TrustedHead, check_copy, print_report

    try:
        spec = load_cluster(Path(args.dir))
        trusted = TrustedHead.parse(args.head) if args.head else TrustedHead()
    except (ClusterFileError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with contextlib.closing(psycopg.connect(args.dsn, autocommit=True)) as conn:
            report = check_copy(conn, spec, trusted)
    except psycopg.Error as err:
        # the message names the table or the server, never a row's values
        print(f"error: the copy cannot be read: {type(err).__name__}", file=sys.stderr)
        return EXIT_USAGE
    return print_report(report, sys.stdout)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ship = sub.add_parser("ship", help="copy certified verdicts into PostgreSQL (docs/audit.md)")
    ship.add_argument("--dir", required=True, help="the cluster directory (cluster.json)")
    ship.add_argument("--dsn", required=True, help="postgresql://... of the copy")
    ship.add_argument("--key", help="the reading key file (an auditor's; default owner.key)")
    ship.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on loopback")
    ship.add_argument("--once", action="store_true", help="ship what is certified now, then exit")
    ship.set_defaults(func=cmd_ship)
    audit = sub.add_parser("audit", help="check the PostgreSQL copy of the verdicts")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="chain, certificates, gaps, counts")
    verify.add_argument("--dir", required=True, help="the cluster directory (cluster.json)")
    verify.add_argument("--dsn", required=True, help="postgresql://... of the copy")
    verify.add_argument("--head", help="HEIGHT:HASH trusted (default: the chain's genesis)")
    verify.set_defaults(func=cmd_audit_verify)
