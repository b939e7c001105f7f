"""The `quorumgate ship`, `quorumgate audit verify` and `quorumgate audit open` commands
(docs/audit.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterFileError, load_cluster, read_seed

if TYPE_CHECKING:
    from quorumgate.proto.clusterfile import ClusterSpec
    from quorumgate.sidecar.receipts import ReceiptEpochs

EXIT_USAGE = 2
SHIP_LOGGER = "quorumgate.ship"  # the shipper's loggers: shipper.py, otel.py, acked.py
NEEDS_EXTRA = "the audit copy needs PostgreSQL's driver: pip install 'quorumgate[audit]'"
EPOCHS_HELP = "a `quorumgate epochs --json` file: certificates checked with each epoch's keys"
NEEDS_OTEL = "--otlp needs the OpenTelemetry SDK: pip install 'quorumgate[otel]'"


def _has_driver() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print(f"error: {NEEDS_EXTRA}", file=sys.stderr)
        return False
    return True


def _has_otel() -> bool:
    try:
        import opentelemetry.exporter.otlp.proto.grpc
        import opentelemetry.sdk._logs  # noqa: F401
    except ImportError:
        print(f"error: {NEEDS_OTEL}", file=sys.stderr)
        return False
    return True


def _otlp_options(args: argparse.Namespace) -> Any:
    """The OTLP shipper's options from `--otlp` and `--otlp-cursor` (OtlpError when the
    endpoint is not one, docs/audit.md "OpenTelemetry")."""
    from quorumgate.audit.otel import OTLP_CURSOR_FILE, OtlpOptions, parse_endpoint

    endpoint, insecure = parse_endpoint(args.otlp)
    cursor = Path(args.otlp_cursor) if args.otlp_cursor else Path(args.dir) / OTLP_CURSOR_FILE
    return OtlpOptions(endpoint, insecure, cursor)


class _Registries:
    """Both shippers' registries behind one metrics port."""

    def __init__(self, *registries: Any) -> None:
        self.registries = registries

    def collect(self) -> Any:
        for registry in self.registries:
            yield from registry.collect()


def _key_file(args: argparse.Namespace, directory: Path) -> Path:
    return Path(args.key) if args.key else directory / OWNER_KEY_FILE


def _acked_files(args: argparse.Namespace, spec: Any) -> Any:
    """Where the copies' acknowledged height goes for pruning (docs/pruning.md): every
    member's node directory on this host, bounded by each copy asked for; None with
    `--no-acked-file`."""
    if args.no_acked_file:
        return None
    from quorumgate.audit import otel, shipper
    from quorumgate.audit.acked import AckedFiles, local_node_dirs

    copies = [c for c, on in ((shipper.ACKED_COPY, args.dsn), (otel.ACKED_COPY, args.otlp)) if on]
    return AckedFiles(local_node_dirs(spec), copies)


def _shippers(
    args: argparse.Namespace, spec: Any, key: Any, stubs: Any, acked: Any, learn: Any = None
) -> dict[str, Any]:
    """The shippers asked for, by where they copy to; `learn` reads the chain of epochs
    their certificates are checked against (None: a chain that runs no epochs)."""
    shippers: dict[str, Any] = {}
    if args.dsn:
        from quorumgate.audit.shipper import ShipOptions, Shipper

        options = ShipOptions(dsn=args.dsn)
        shippers["to PostgreSQL"] = Shipper(spec, key, stubs, options, acked, learn)
    if args.otlp:
        from quorumgate.audit.otel import OtlpShipper

        shippers["over OTLP"] = OtlpShipper(spec, key, stubs, args.otlp_options, acked, learn)
    return shippers


def _chain_reader(spec: ClusterSpec, key: Any) -> tuple[Any, Any]:
    """A client that follows the chain of epochs with the shipper's key (the owner's or
    an auditor's may read the epoch ends), and how the shippers ask it: each epoch's
    receipt keys and heights as `Client.epochs` checked them (docs/consensus/epochs.md,
    "Receipt keys"); None on a chain that runs no epochs. Its channels follow the
    members the chain moves, adds and removes, and the shippers read the sidecars there."""
    from quorumgate.sdk.client import Client

    client = Client(spec, key)

    async def learn() -> ReceiptEpochs:
        return (await client.epochs()).receipt_epochs

    return client, (learn if spec.runs_epochs else None)


async def _ship_all_once(shippers: dict[str, Any]) -> None:
    for where, shipper in shippers.items():
        total = 0
        while shipped := await shipper.ship_once():
            total += shipped
        print(f"shipped {total} verdicts {where}", flush=True)


async def _ship(args: argparse.Namespace) -> int:
    from nacl.signing import SigningKey
    from prometheus_client import CollectorRegistry, start_http_server

    directory = Path(args.dir)
    spec = load_cluster(directory)
    key = SigningKey(read_seed(_key_file(args, directory)))
    client, learn = _chain_reader(spec, key)
    acked = _acked_files(args, spec)
    shippers = _shippers(args, spec, key, client.pool.get().sidecars, acked, learn)
    if args.metrics_port is not None:
        registries = [s.metrics.registry for s in shippers.values()]
        registry = CollectorRegistry()
        registry.register(_Registries(*registries, *([acked.registry] if acked else [])))
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.once:
            await _ship_all_once(shippers)
        else:
            # each copy keeps its own cursor: a receiver that is down does not hold the
            # other copy back
            await asyncio.gather(*(s.run(stop) for s in shippers.values()))
    finally:
        for shipper in shippers.values():
            shipper.close()
        await client.close()
    return 0


def _log_to_stderr() -> None:
    """The shipper's own log lines (`event=acked_written`, a batch sent again, the
    database unavailable) on stderr, at INFO: a service unit's journal keeps them."""
    logger = logging.getLogger(SHIP_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s level=%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def cmd_ship(args: argparse.Namespace) -> int:
    if not args.dsn and not args.otlp:
        print("error: ship needs --dsn, --otlp or both", file=sys.stderr)
        return EXIT_USAGE
    _log_to_stderr()
    if args.dsn and not _has_driver():
        return EXIT_USAGE
    refused: tuple[type[Exception], ...] = (ClusterFileError,)
    failed: tuple[type[Exception], ...] = ()
    if args.otlp:
        if not _has_otel():
            return EXIT_USAGE
        from quorumgate.audit.otel import ExportFailed, OtlpError

        refused, failed = (ClusterFileError, OtlpError), (ExportFailed,)
        try:
            args.otlp_options = _otlp_options(args)
        except OtlpError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USAGE
    try:
        return asyncio.run(_ship(args))
    except refused as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except failed as err:
        print(f"error: the OTLP receiver did not take the records: {err}", file=sys.stderr)
        return 1


def cmd_audit_verify(args: argparse.Namespace) -> int:
    if not _has_driver():
        return EXIT_USAGE
    import psycopg

    from quorumgate.audit.verify import TrustedHead, check_copy, print_report

    try:
        spec = load_cluster(Path(args.dir))
        trusted = TrustedHead.parse(args.head) if args.head else TrustedHead()
        epochs = _epochs_file(args, spec)
    except (ClusterFileError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    from quorumgate.audit.store import CopyTooOld

    try:
        with contextlib.closing(psycopg.connect(args.dsn, autocommit=True)) as conn:
            report = check_copy(conn, spec, trusted, epochs)
    except CopyTooOld as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.Error as err:
        # the message names the table or the server, never a row's values
        print(f"error: the copy cannot be read: {type(err).__name__}", file=sys.stderr)
        return EXIT_USAGE
    return print_report(report, sys.stdout)


def _epochs_file(args: argparse.Namespace, spec: ClusterSpec) -> ReceiptEpochs | None:
    """The receipt epochs of `--epochs FILE` (`quorumgate epochs --json` output), or None:
    certificates then checked with cluster.json's receipt keys in every epoch
    (docs/consensus/epochs.md, "Receipt keys"). `ValueError` for a file that is not one."""
    if args.epochs is None:
        return None
    from quorumgate.sdk.epochs import load_receipt_epochs

    return load_receipt_epochs(args.epochs, spec.receipt_keys)


def _claimed_value(args: argparse.Namespace) -> str:
    """The value to check: `--value`, or the whole of `--value-file` as UTF-8 (exactly,
    a final newline included), so that a value need not sit in a shell's history."""
    if args.value_file is not None:
        return Path(args.value_file).read_text(encoding="utf-8")
    return str(args.value)


def cmd_audit_open(args: argparse.Namespace) -> int:
    if not _has_driver():
        return EXIT_USAGE
    import psycopg

    from quorumgate.audit.opening import Claim, open_claim
    from quorumgate.audit.store import CopyTooOld

    try:
        spec = load_cluster(Path(args.dir))
        seed = read_seed(Path(args.key))
        claim = Claim(args.height, args.index, args.argument, _claimed_value(args), args.handle)
        epochs = _epochs_file(args, spec)
    except (ClusterFileError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with contextlib.closing(psycopg.connect(args.dsn, autocommit=True)) as conn:
            answer = open_claim(conn, spec, seed, claim, epochs)
    except CopyTooOld as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.Error as err:
        print(f"error: the copy cannot be read: {type(err).__name__}", file=sys.stderr)
        return EXIT_USAGE
    print(answer.text, file=sys.stdout if answer.status.value < EXIT_USAGE else sys.stderr)
    return int(answer.status)


def _add_open_parser(audit_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    opener = audit_sub.add_parser(
        "open", help="check a claimed argument value against its commitment (auditors)"
    )
    opener.add_argument("--dir", required=True, help="the cluster directory (cluster.json)")
    opener.add_argument("--dsn", required=True, help="postgresql://... of the copy")
    opener.add_argument("--key", required=True, help="the auditor's key file")
    opener.add_argument("--height", required=True, type=int, help="the verdict's height")
    opener.add_argument("--index", required=True, type=int, help="its index in the height")
    opener.add_argument("--argument", required=True, help="the argument's name")
    opener.add_argument("--epochs", metavar="FILE", help=EPOCHS_HELP)
    value = opener.add_mutually_exclusive_group(required=True)
    value.add_argument("--value", help="the claimed value")
    value.add_argument("--value-file", help="a file holding exactly the claimed value")
    opener.add_argument(
        "--handle", action="store_true", help="the argument was an envelope: give its handle"
    )
    opener.set_defaults(func=cmd_audit_open)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ship = sub.add_parser(
        "ship", help="copy certified verdicts into PostgreSQL and/or OTLP (docs/audit.md)"
    )
    ship.add_argument("--dir", required=True, help="the cluster directory (cluster.json)")
    ship.add_argument("--dsn", help="postgresql://... of the copy")
    ship.add_argument("--otlp", help="http(s)://HOST:PORT of an OTLP/gRPC log receiver")
    ship.add_argument(
        "--otlp-cursor", help="the OTLP cursor file (default DIR/ship-otlp-cursor.json)"
    )
    ship.add_argument("--key", help="the reading key file (an auditor's; default owner.key)")
    ship.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on loopback")
    ship.add_argument("--once", action="store_true", help="ship what is certified now, then exit")
    ship.add_argument(
        "--no-acked-file",
        action="store_true",
        help="do not write the copy's acknowledged height into DIR/node-I/audit-acked.json "
        "for pruning (docs/pruning.md)",
    )
    ship.set_defaults(func=cmd_ship)
    audit = sub.add_parser("audit", help="check the PostgreSQL copy of the verdicts")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="chain, certificates, gaps, counts")
    verify.add_argument("--dir", required=True, help="the cluster directory (cluster.json)")
    verify.add_argument("--dsn", required=True, help="postgresql://... of the copy")
    verify.add_argument("--head", help="HEIGHT:HASH trusted (default: the chain's genesis)")
    verify.add_argument("--epochs", metavar="FILE", help=EPOCHS_HELP)
    verify.set_defaults(func=cmd_audit_verify)
    _add_open_parser(audit_sub)
